"""The port as a series of patches: first the move with no behaviour change, then each
change on its own, as a Megatron-LM maintainer merges them.

``parts/`` holds the series' parts, in the format ``git format-patch`` writes but
not a series to apply (hence ``.part``): each is one patch's description (what it
changes, why, every behaviour change, how it was tested) and its change to the
files the port adds, ``megatron/training/telemetry_spans.py`` and its tests
(``tests/unit_tests/training/``). What a patch does to Megatron-LM's own
``training.py``, ``pyproject.toml`` and ``global_vars.py`` depends on the checkout,
so it is worked out there (:data:`SITES` says what each patch's call sites pass;
``pyproject_toml`` adds the dependency in the first, ``global_vars_py`` makes
telemetry need it there too): :func:`write_series` joins
them into the series for a checkout, ready for ``git am``
(``python -m megatron.training.port_upstream --series OUT CHECKOUT``).

The series ends in this project's own module and tests (``telemetry_spans.py``,
``test_telemetry_spans.py``, each after Megatron-LM's copyright line): a test
applies every patch and fails when they differ. A change to the lifecycle
therefore reaches the series as an edit of the patch it belongs to (or a new
one), made with git in the repository ``edit_series.py`` writes. Writing the
series needs ``git`` on ``PATH``, as ``git am`` does.
"""

from __future__ import annotations

import email
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .global_vars_py import GLOBAL_VARS, needs_transitions
from .pyproject_toml import PYPROJECT, add_dependency
from .training_py import TRAINING, CallSites, NotRecognised, port_training

HERE = Path(__file__).resolve().parent
PARTS = HERE / "parts"
#: The first line of every file the port adds to Megatron-LM, as its own files begin.
HEADER = b"# Copyright (c) 2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.\n"
MODULE_DEST = Path("megatron/training/telemetry_spans.py")
TESTS_DEST = Path("tests/unit_tests/training/test_telemetry_spans.py")
#: The tests' package, added with them where the checkout has none (as its other test
#: folders, the copyright line alone).
TESTS_INIT = TESTS_DEST.parent / "__init__.py"
#: Megatron-LM's own files the port edits (the rest it adds).
EDITED = (TRAINING, PYPROJECT, GLOBAL_VARS)
#: Where the series ends: this project's module and the tests it ships.
MODULE = HERE.parent / "telemetry_spans.py"
TESTS = HERE / "test_telemetry_spans.py"

_MOVE = CallSites()
_ITERATIONS = CallSites(step_iteration=True)
_CAUSE = CallSites(step_iteration=True, shutdown_cause=True)

#: What the training.py call sites of each patch, in order, pass to the lifecycle:
#: ``step(iteration)`` from the seventh, ``shutdown(cause=...)`` from the eighth.
SITES: tuple[CallSites, ...] = (_MOVE,) * 6 + (_ITERATIONS,) + (_CAUSE,) * 2

#: The date of every commit of the stored series, so that it reads the same wherever it
#: is exported (a series written for a checkout has the day it is written).
_DATE = "2026-12-07T00:00:00+00:00"


@dataclass(frozen=True)
class Patch:
    """One patch of the series: its description and its change to the added files."""

    number: int
    name: str
    sites: CallSites
    author: str  # "Name <email>"
    subject: str
    body: str
    diff: str  # of the module and its tests, as `git apply` takes it

    @property
    def message(self) -> str:
        return f"{self.subject}\n\n{self.body}"


def _read(path: Path, number: int, sites: CallSites) -> Patch:
    text = path.read_text(encoding="utf-8")
    head, separator, diff = text.partition("\n---\n")
    if not separator:
        raise ValueError(f"{path}: no `---` line between the description and the diff")
    message = email.message_from_string(head)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(message["Subject"].split()))
    body = message.get_payload().strip() + "\n"
    diff = diff[diff.index("diff --git") :]  # after the diffstat
    return Patch(number, path.stem, sites, message["From"], subject, body, diff)


def patches() -> list[Patch]:
    """The series, in order (``parts/``' files by their numbers)."""
    files = sorted(PARTS.glob("[0-9][0-9][0-9][0-9]-*.part"))
    if len(files) != len(SITES):
        raise ValueError(f"{PARTS}: {len(files)} parts; SITES in {__file__} lists {len(SITES)}")
    numbered = enumerate(zip(files, SITES, strict=True), 1)
    return [_read(path, n, sites) for n, (path, sites) in numbered]


def run_git(repo: Path, *args: str, stdin: str | None = None, dated: bool = False) -> str:
    """``git ARGS`` in ``repo`` (``dated``: its commits on the stored series' date)."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    if dated:
        env.update({"GIT_AUTHOR_DATE": _DATE, "GIT_COMMITTER_DATE": _DATE})
    done = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _identity(repo: Path) -> list[str]:
    """``-c`` options naming a committer where git has none configured."""
    configured = subprocess.run(["git", "config", "user.email"], cwd=repo, capture_output=True,
                                text=True, check=False).stdout.strip()  # fmt: skip
    return [] if configured else ["-c", "user.name=Megatron-LM contributor",
                                  "-c", "user.email=contributor@localhost"]  # fmt: skip


def _new_repo(at: Path) -> list[str]:
    run_git(at, "init", "-q")
    return _identity(at)


def stages(each: Callable[[Path, Patch], None], work: Path) -> Path:
    """A repository in ``work`` with a commit per patch, as the patch's author wrote it:
    the patch's change to the added files applied, then ``each(repo, patch)`` (what else
    that patch changes), then the commit with the patch's description."""
    repo = work / "series"
    repo.mkdir(parents=True)
    identity = _new_repo(repo)
    run_git(repo, *identity, "commit", "-q", "--allow-empty", "-m", "before the series")
    for patch in patches():
        run_git(repo, "apply", "--whitespace=nowarn", "-", stdin=patch.diff)
        each(repo, patch)
        run_git(repo, "add", "-A")
        run_git(repo, *identity, "commit", "-q", f"--author={patch.author}", "-F", "-",
                stdin=patch.message, dated=True)  # fmt: skip
    return repo


def final_files() -> dict[Path, bytes]:
    """The module and its tests as the whole series leaves them."""
    with tempfile.TemporaryDirectory() as work:
        repo = stages(lambda repo, patch: None, Path(work))
        return {dest: (repo / dest).read_bytes() for dest in (MODULE_DEST, TESTS_DEST)}


def read_edited(checkout: Path) -> dict[Path, str]:
    """The checkout's files the port edits (:data:`EDITED`), by path; raises
    NotRecognised naming the first missing."""
    for relative in EDITED:
        if not (checkout / relative).is_file():
            raise NotRecognised(f"{checkout}: could not find {relative}")
    return {relative: (checkout / relative).read_text(encoding="utf-8") for relative in EDITED}


def write_series(checkout: Path, out: Path, signoff: bool = False) -> list[Path]:
    """The series for ``checkout`` (its :data:`EDITED` files as they are): ``git
    format-patch`` files in ``out``, each applying with ``git am`` on the one before,
    the first on the checkout, their author the one git has configured (who sends
    them; ``signoff``: with their Signed-off-by, the Developer Certificate of Origin).
    Raises NotRecognised for a checkout the port does not know; nothing is written
    then."""
    originals = read_edited(checkout)
    training = originals[TRAINING]
    ported = {patch.number: port_training(training, patch.sites) for patch in patches()}
    dependency = add_dependency(originals[PYPROJECT])
    setup = needs_transitions(originals[GLOBAL_VARS])
    package = not (checkout / TESTS_INIT).exists()
    with tempfile.TemporaryDirectory() as work:
        base = Path(work) / "series"
        for relative, text in originals.items():
            (base / relative).parent.mkdir(parents=True, exist_ok=True)
            (base / relative).write_text(text, encoding="utf-8")
        identity = _new_repo(base)
        run_git(base, "add", "-A")
        run_git(base, *identity, "commit", "-q", "-m", "the checkout")
        for patch in patches():
            run_git(base, "apply", "--whitespace=nowarn", "-", stdin=patch.diff)
            (base / TRAINING).write_text(ported[patch.number], encoding="utf-8")
            (base / PYPROJECT).write_text(dependency, encoding="utf-8")
            (base / GLOBAL_VARS).write_text(setup, encoding="utf-8")
            if package:
                (base / TESTS_INIT).write_bytes(HEADER)
            run_git(base, "add", "-A")
            sign = ["--signoff"] if signoff else []
            run_git(base, *identity, "commit", "-q", *sign, "-F", "-", stdin=patch.message)
        out.mkdir(parents=True, exist_ok=True)
        names = run_git(base, "format-patch", "--zero-commit", "--no-signature",
                     "-o", str(out), f"HEAD~{len(SITES)}")  # fmt: skip
    return [Path(name) for name in names.split()]
