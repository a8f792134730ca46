"""The port applied to a real Megatron-LM checkout: the shape of the whole series.

The ported tree is the pristine one with every patch of the series applied by
``git am`` (``conftest.py``); the one-step mode, in place, gives the same files.
The figures (lines, ``_otel`` references) are printed for the session's report.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path

import tomllib
from megatron_lm import copy_tree, port_checkout

from megatron.training import port_upstream

TRAINING = Path("megatron/training/training.py")
DEPENDENCY = "transitions>=0.9.2,<0.10"


def _files(root: Path) -> list[Path]:
    """The checkout's files, without git's own or Python's caches."""
    return [
        path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not {".git", "__pycache__"} & set(path.relative_to(root).parts)
        and path.suffix != ".so"
    ]


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if {".git", "__pycache__"} & set(path.relative_to(root).parts):
            continue
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _otel_lines(text: str) -> int:
    return sum("_otel" in line for line in text.splitlines())


def test_training_py_keeps_only_call_sites(trees):
    before = (trees.pristine / TRAINING).read_text()
    after = (trees.ported / TRAINING).read_text()
    removed = len(before.splitlines()) - len(after.splitlines())
    print(
        f"\ntraining.py: {len(before.splitlines())} -> {len(after.splitlines())} lines "
        f"({removed} fewer); lines naming _otel: {_otel_lines(before)} -> {_otel_lines(after)}"
    )
    assert removed >= 350
    assert not re.search(r"^\s*global\s+_otel", after, re.M)
    for name in port_upstream.DELETED:
        assert not re.search(rf"\b{name}\b", after), name
    # The lifecycle is driven only through SpanPhases triggers and install_exit_hooks.
    calls = re.findall(r"_otel_phases\.(\w+)\(", after)
    assert set(calls) == {
        "start_job",
        "record_phase",
        "start_train",
        "step",
        "end_train",
        "shutdown",
    }
    assert "install_exit_hooks(" in after and "signals=" not in after
    assert "_otel_phases.step(iteration)" in after
    assert "_otel_phases.shutdown(cause=_otel_exc)" in after
    # Nothing imported mid-module: only the lifecycle's own import is new.
    added = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    imports = [line for line in added if re.match(r"\+\s*(import|from) ", line)]
    assert imports == [
        "+from megatron.training.telemetry_spans import SpanPhases, install_exit_hooks, "
        "mark_goodput"
    ]


#: Words of this project that have no meaning inside Megatron-LM.
OUR_WORDS = re.compile(
    r"port_upstream|megatron[-_.]trace|trace_format|semconv|megatron-telemetry-spans", re.I
)


def test_the_added_files_are_megatron_lms_header_then_ours_byte_for_byte(trees):
    header = b"# Copyright (c) 2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.\n"
    for ours, dest in (
        (port_upstream.MODULE, port_upstream.MODULE_DEST),
        (port_upstream.TESTS, port_upstream.TESTS_DEST),
    ):
        theirs = (trees.ported / dest).read_bytes()
        first, rest = theirs.split(b"\n", 1)
        assert first + b"\n" == header, dest
        assert rest == Path(ours).read_bytes(), dest
        digest = hashlib.sha256(rest).hexdigest()
        print(f"\n{dest}: the header, then {len(rest)} bytes of ours, sha256 {digest}")


def test_what_the_port_writes_never_speaks_of_this_project(trees):
    """The lines it adds to training.py, and the two files it adds, name Megatron-LM's
    and OpenTelemetry's things only."""
    before = (trees.pristine / TRAINING).read_text().splitlines()
    after = (trees.ported / TRAINING).read_text().splitlines()
    added = [
        line[1:]
        for line in difflib.unified_diff(before, after, lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert added and [line for line in added if OUR_WORDS.search(line)] == []
    for dest in (port_upstream.MODULE_DEST, port_upstream.TESTS_DEST):
        text = (trees.ported / dest).read_text()
        assert [line for line in text.splitlines() if OUR_WORDS.search(line)] == [], dest


def test_transitions_joins_the_telemetry_extras_not_megatron_cores_dependencies(trees):
    """Beside nemo-lens[sdk] in ``otel`` (what telemetry users install) and in ``dev``
    (what Megatron-LM's CI tests with); megatron-core's own dependencies unchanged."""
    ported = tomllib.loads((trees.ported / "pyproject.toml").read_text())
    pristine = tomllib.loads((trees.pristine / "pyproject.toml").read_text())
    extras = ported["project"]["optional-dependencies"]
    for extra in ("otel", "dev"):
        assert extras[extra] == [*pristine["project"]["optional-dependencies"][extra], DEPENDENCY]
    assert ported["project"]["dependencies"] == pristine["project"]["dependencies"]
    assert all(
        "transitions" not in d
        for name, deps in extras.items()
        if name not in ("otel", "dev")
        for d in deps
    )
    for extra in ("otel", "dev"):
        pristine["project"]["optional-dependencies"][extra].append(DEPENDENCY)
    assert ported == pristine  # nothing else in the file changed


def test_a_second_run_says_applied_and_changes_nothing(trees, tmp_path):
    again = copy_tree(trees.ported, tmp_path / "again")
    before = _digest(again)
    result = port_checkout(again)
    assert result.returncode == 0
    assert result.stdout.strip() == f"port_upstream: {again}: already applied; nothing changed"
    assert _digest(again) == before


def test_an_unrecognised_training_py_leaves_the_checkout_untouched(trees, tmp_path):
    """A checkout whose lifecycle moved on (one function renamed): one line, nothing written."""
    changed = copy_tree(trees.pristine, tmp_path / "changed")
    training = changed / TRAINING
    training.write_text(
        training.read_text().replace("def _reroot_otel_interval(", "def _reroot_interval(")
    )
    before = _digest(changed)
    result = port_checkout(changed)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "port_upstream: megatron/training/training.py: could not find "
        "`def _reroot_otel_interval(`; nothing changed"
    ]
    assert _digest(changed) == before


def test_in_one_step_the_port_writes_what_the_whole_series_does(trees, tmp_path):
    in_place = copy_tree(trees.source, tmp_path / "in_place")
    result = port_checkout(in_place)
    assert result.returncode == 0, result.stdout + result.stderr
    ours = {p.relative_to(in_place): p.read_bytes() for p in _files(in_place)}
    series = {p.relative_to(trees.ported): p.read_bytes() for p in _files(trees.ported)}
    assert ours.keys() == series.keys()
    assert [name for name in ours if ours[name] != series[name]] == []


def test_the_diff_touches_only_what_the_port_names(trees):
    """Every file that differs between the two copies is one the port writes."""
    differ = set()
    for path in _files(trees.ported):
        relative = path.relative_to(trees.ported)
        twin = trees.pristine / relative
        if not twin.exists() or twin.read_bytes() != path.read_bytes():
            differ.add(relative)
    assert differ == {
        port_upstream.TRAINING,
        port_upstream.MODULE_DEST,
        port_upstream.TESTS_DEST,
        port_upstream.TESTS_INIT,  # the pinned tree keeps no other test of that folder
        port_upstream.PYPROJECT,
        port_upstream.GLOBAL_VARS,
    }
