"""The port applied to a real Megatron-LM checkout: the pull request's shape.

The figures (lines, ``_otel`` references) are printed for the session's report.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

from megatron_lm import copy_tree, job_env, port_checkout

from megatron.training import port_upstream

TRAINING = Path("megatron/training/training.py")


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
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
    assert "install_exit_hooks(" in after and "signals=(signal.SIGTERM,)" in after


def test_the_module_is_ours_byte_for_byte(trees):
    ours = Path(port_upstream.MODULE).read_bytes()
    theirs = (trees.ported / "megatron/training/telemetry_spans.py").read_bytes()
    assert theirs == ours
    print(f"\ntelemetry_spans.py: {len(ours)} bytes, sha256 {hashlib.sha256(ours).hexdigest()}")
    tests = trees.ported / "tests/unit_tests/training/test_telemetry_spans.py"
    assert tests.read_bytes() == Path(port_upstream.TESTS).read_bytes()


def test_transitions_is_a_dependency(trees):
    pyproject = (trees.ported / "pyproject.toml").read_text()
    (deps,) = re.findall(r"^dependencies\s*=\s*\[(.*?)\]", pyproject, re.M | re.S)
    assert '"transitions>=0.9.2,<0.10"' in deps
    pristine = (trees.pristine / "pyproject.toml").read_text()
    assert pyproject.replace(', "transitions>=0.9.2,<0.10"', "") == pristine


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


def test_megatron_lms_telemetry_tests_and_the_added_file_pass_in_the_ported_tree(trees, tmp_path):
    env = job_env(trees.ported, tmp_path, telemetry=False)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit_tests/telemetry",
            "tests/unit_tests/training/test_telemetry_spans.py",
        ],
        cwd=trees.ported,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"\nMegatron-LM's pytest in the ported tree: {summary}")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "failed" not in summary and "error" not in summary
    assert re.search(r"\b\d+ passed", summary)


def test_the_diff_touches_only_what_the_port_names(trees):
    """Every file that differs between the two copies is one the port writes."""
    differ = set()
    for path in trees.ported.rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".so":
            continue
        relative = path.relative_to(trees.ported)
        twin = trees.pristine / relative
        if not twin.exists() or twin.read_bytes() != path.read_bytes():
            differ.add(relative)
    assert differ == {
        port_upstream.TRAINING,
        port_upstream.MODULE_DEST,
        port_upstream.TESTS_DEST,
        port_upstream.PYPROJECT,
    }
