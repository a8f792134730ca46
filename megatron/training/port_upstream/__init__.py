"""Move Megatron-LM's job-level span lifecycle into ``telemetry_spans.py``.

    python -m megatron.training.port_upstream --series OUT MEGATRON_LM_DIR
    python -m megatron.training.port_upstream MEGATRON_LM_DIR

Megatron-LM's ``megatron/training/training.py`` keeps its job-level span
lifecycle as module globals and eleven ``_otel`` functions, plus an exit-hook
installer (an ``atexit`` hook and a SIGTERM handler with their flush helper)
written inline in ``pretrain()``. This program turns that into the pull
requests a Megatron-LM maintainer merges (``series.py``):

* ``--series OUT`` writes them as ``git format-patch`` files in ``OUT``, each
  applying with ``git am`` on the one before, the first on the checkout, which
  stays as it is. The first moves the lifecycle into
  ``megatron/training/telemetry_spans.py`` as a state machine, with its tests,
  and changes no behaviour; each later one makes one change, stated and
  tested in its description;
* without it, the whole series is applied in place in one step, so that
  ``git diff`` in the checkout is its sum.

Either way ``training.py`` keeps only call sites (``training_py.py``): the
lifecycle functions, their globals, the installer and the comments about them
are deleted, and each call site becomes one ``SpanPhases`` trigger or
``install_exit_hooks``; ``pyproject.toml`` gets ``transitions`` in its ``otel``
and ``dev`` extras (``pyproject_toml.py``), and ``global_vars.py`` sets telemetry up
only where it is installed, as only where nemo-lens is (``global_vars_py.py``).
The added files are Megatron-LM's copyright line, then this project's
``telemetry_spans.py`` and ``test_telemetry_spans.py`` (the tests run on a fake
tracer, with ``opentelemetry-api`` and no SDK, in Megatron-LM's CI), and the
tests' folder gets an ``__init__.py`` where it has none.

Every anchor is looked for before anything is written: a ``training.py`` it
does not recognise gets one line naming what it could not find, and nothing
changes. In place, a second run finds the call sites already rewritten, says
so and changes nothing. Exit status: 0 written (or already applied), 1 not
recognised, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .global_vars_py import GLOBAL_VARS, needs_transitions
from .pyproject_toml import DEPENDENCY, PYPROJECT, add_dependency
from .series import (
    HEADER,
    MODULE,
    MODULE_DEST,
    SITES,
    TESTS,
    TESTS_DEST,
    TESTS_INIT,
    read_edited,
    write_series,
)
from .training_py import DELETED, TRAINING, NotRecognised, is_ported, port_training

__all__ = [
    "DELETED",
    "DEPENDENCY",
    "GLOBAL_VARS",
    "HEADER",
    "MODULE",
    "MODULE_DEST",
    "PYPROJECT",
    "TESTS",
    "TESTS_DEST",
    "TESTS_INIT",
    "TRAINING",
    "NotRecognised",
    "add_dependency",
    "main",
    "needs_transitions",
    "plan",
]


def plan(checkout: Path) -> tuple[dict[Path, bytes], bool]:
    """Every file the whole series changes (path -> new bytes), and whether
    training.py was ported before."""
    originals = read_edited(checkout)
    training = originals[TRAINING]
    already = is_ported(training)
    files = {} if already else {TRAINING: port_training(training, SITES[-1]).encode()}
    files[MODULE_DEST] = HEADER + MODULE.read_bytes()
    files[TESTS_DEST] = HEADER + TESTS.read_bytes()
    if not (checkout / TESTS_INIT).exists():
        files[TESTS_INIT] = HEADER
    files[PYPROJECT] = add_dependency(originals[PYPROJECT]).encode()
    files[GLOBAL_VARS] = needs_transitions(originals[GLOBAL_VARS]).encode()
    changed = {}
    for relative, data in files.items():
        path = checkout / relative
        if not path.is_file() or path.read_bytes() != data:
            changed[relative] = data
    return changed, already


def _in_place(checkout: Path) -> int:
    changed, already = plan(checkout)
    if already and not changed:
        print(f"port_upstream: {checkout}: already applied; nothing changed")
        return 0
    for relative, data in changed.items():
        path = checkout / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    verb = "refreshed" if already else "applied"
    print(f"port_upstream: {checkout}: {verb}; wrote {', '.join(str(p) for p in changed)}")
    return 0


def _series(checkout: Path, out: Path, signoff: bool) -> int:
    if is_ported(read_edited(checkout)[TRAINING]):
        raise NotRecognised(f"{TRAINING} is ported already: the series applies to the original")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NotRecognised(f"--series {out}: not an empty folder; give an empty or a new one")
    written = write_series(checkout, out, signoff)
    print(f"port_upstream: {checkout}: {len(written)} patches in {out}:")
    for path in written:
        print(f"  {path.name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megatron.training.port_upstream",
        description="Move Megatron-LM's span lifecycle into telemetry_spans.py.",
    )
    parser.add_argument("checkout", type=Path, help="a Megatron-LM checkout (its top folder)")
    parser.add_argument(
        "--series",
        type=Path,
        metavar="OUT",
        help="write the pull requests as git format-patch files in OUT "
        "(the checkout is left as it is); without it, apply them all in place",
    )
    parser.add_argument(
        "--signoff",
        action="store_true",
        help="with --series: each patch Signed-off-by the author git has configured",
    )
    args = parser.parse_args(argv)
    checkout = args.checkout
    try:
        if args.series is not None:
            return _series(checkout, args.series, args.signoff)
        return _in_place(checkout)
    except (NotRecognised, RuntimeError) as err:  # RuntimeError: git refused
        print(f"port_upstream: {err}; nothing changed", file=sys.stderr)
        return 1
    except OSError as err:
        print(
            f"port_upstream: {checkout}: {err.strerror}: {err.filename}; nothing changed",
            file=sys.stderr,
        )
        return 1
