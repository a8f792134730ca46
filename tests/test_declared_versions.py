"""The lowest versions ``tox -e mindeps`` installs are the ones pyproject.toml declares.

``.ci/constraints-lowest.txt`` is generated from pyproject.toml; a bound raised
without regenerating it would leave mindeps testing versions nobody declares.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
GENERATOR = REPO_ROOT / ".ci" / "lowest_constraints.py"
CHECKED_IN = REPO_ROOT / ".ci" / "constraints-lowest.txt"

pytest.importorskip("tomllib", reason="the generator reads pyproject.toml with tomllib (3.11+)")


def _generator():
    spec = importlib.util.spec_from_file_location("lowest_constraints", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_lowest_constraints_are_what_pyproject_declares() -> None:
    assert CHECKED_IN.read_text() == _generator().lowest_constraints(), (
        "stale: run python .ci/lowest_constraints.py .ci/constraints-lowest.txt"
    )


def test_lowest_constraints_pin_each_lower_bound_and_keep_the_machine_pins(
    tmp_path: Path,
) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[project]\n"
        'dependencies = ["transitions>=0.9.1,<0.10", "Foo_Bar[x]>=2.0; python_version>\'3\'",'
        ' "torch>=2.1"]\n'
        "[project.optional-dependencies]\n"
        'otlp = ["exp>=1.39"]\ntrace = ["plotly>=5"]\ndiagrams = ["graphviz~=0.20"]\n'
    )
    machine = tmp_path / "constraints.txt"
    machine.write_text("# the wheel on disk\ntorch==2.13.0\n")
    lines = _generator().lowest_constraints(pyproject, machine).splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "exp==1.39",
        "foo-bar==2.0",
        "graphviz==0.20",
        "plotly==5",
        "torch==2.13.0  # .ci/constraints.txt wins over the declared >=2.1",
        "transitions==0.9.1",
    ]


def test_a_dependency_without_a_lower_bound_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["numpy"]\n[project.optional-dependencies]\n'
        "otlp = []\ntrace = []\ndiagrams = []\n"
    )
    machine = tmp_path / "constraints.txt"
    machine.write_text("")
    with pytest.raises(SystemExit, match="'numpy' declares no lower bound"):
        _generator().lowest_constraints(pyproject, machine)


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "constraints-lowest.txt"
    stale.write_text("numpy==1.0\n")
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check", str(stale)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"{stale} is stale" in result.stdout
