"""``python -m megatron.training.port_upstream``, on checkouts it must refuse.

The port applied to the real Megatron-LM tree (lines removed, a second run,
the byte-for-byte copy, Megatron-LM's own tests in the ported tree) is checked
by ``tox -e upstream`` (``tests/upstream``), which has that tree. Here: what
it does with a checkout it does not recognise (one line naming what it could
not find, nothing changed), and the lifecycle tests it adds to Megatron-LM
pass in this project too.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.training import port_upstream

REPO = Path(__file__).resolve().parents[2]


def _port(checkout: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron.training.port_upstream", str(checkout)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _checkout(tmp_path: Path, training: str) -> Path:
    root = tmp_path / "Megatron-LM"
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "training.py").write_text(training)
    (root / "pyproject.toml").write_text('[project]\ndependencies = ["torch>=2.6.0"]\n')
    return root


@pytest.mark.parametrize(
    ("training", "named"),
    [
        ("def pretrain():\n    pass\n", "`def _otel_telemetry_active(`"),
        ("def broken(:\n", "does not parse"),
    ],
    ids=["no_lifecycle", "syntax_error"],
)
def test_an_unrecognised_training_py_is_named_and_left_untouched(tmp_path, training, named):
    root = _checkout(tmp_path, training)
    before = _digest(root)
    result = _port(root)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0] and "nothing changed" in lines[0]
    assert "megatron/training/training.py" in lines[0]
    assert result.stdout == ""
    assert _digest(root) == before


def test_a_folder_that_is_no_checkout_is_named(tmp_path):
    result = _port(tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"port_upstream: {tmp_path}: could not find megatron/training/training.py; nothing changed"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            '[project]\ndependencies = ["torch>=2.6.0", "numpy"]\n',
            '[project]\ndependencies = ["torch>=2.6.0", "numpy", "transitions>=0.9.2,<0.10"]\n',
        ),
        (
            '[project]\ndependencies = [\n    "torch>=2.6.0",\n    "numpy"\n]\n',
            '[project]\ndependencies = [\n    "torch>=2.6.0",\n    "numpy",\n'
            '    "transitions>=0.9.2,<0.10",\n]\n',
        ),
        ('[project]\ndependencies = ["transitions>=0.9"]\n', None),
    ],
    ids=["one_line", "multi_line", "already_there"],
)
def test_transitions_joins_the_dependencies(before, after):
    assert port_upstream.add_dependency(before) == (before if after is None else after)


def test_the_lifecycle_tests_it_adds_pass_here_too(tmp_path):
    """The file Megatron-LM gets as tests/unit_tests/training/test_telemetry_spans.py."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(port_upstream.TESTS),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "failed" not in result.stdout
