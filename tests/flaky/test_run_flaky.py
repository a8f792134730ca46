"""run_flaky.py and its plugin: the tests it picks, their order, and what it reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from processes import REPO_ROOT

FLAKY = REPO_ROOT / "tests" / "flaky"

SAMPLE = """
import pytest

@pytest.mark.slow
def test_fails():
    print("the output it captured")
    assert False, "boom"

@pytest.mark.slow
def test_passes():
    pass

def test_not_a_waiting_test():
    pass
"""


def _collected(path: Path, seed: int) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FLAKY), str(REPO_ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", f"--rootdir={REPO_ROOT}", "-p", "flaky_order",
         "--flaky-only", f"--flaky-seed={seed}", "-p", "no:cacheprovider",
         "--collect-only", "-q", str(path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.split("::", 1)[1] for line in result.stdout.splitlines() if "::" in line]


def test_only_the_slow_and_waiting_tests_in_an_order_fixed_by_the_seed(tmp_path: Path) -> None:
    sample = tmp_path / "test_many.py"
    sample.write_text(
        "import pytest\n"
        + "".join(f"@pytest.mark.slow\ndef test_{i}():\n    pass\n" for i in range(12))
        + "def test_quick():\n    pass\n"
    )
    first, again, other = _collected(sample, 1), _collected(sample, 1), _collected(sample, 2)
    assert sorted(first) == sorted(f"test_{i}" for i in range(12))  # test_quick left out
    assert first == again
    assert first != other and sorted(first) == sorted(other)


def test_a_failing_test_is_listed_with_its_seeds_and_output(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(FLAKY / "run_flaky.py"), "-n", "2", "--hog", "0", "--seed", "7",
         "--out", str(out), "--", str(tmp_path / "test_sample.py")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    said = result.stdout
    assert "repetitions: 2; CPU hog: 0 busy processes" in said
    assert "#0 seed 7:" in said and "#1 seed 8:" in said
    assert "1 tests failed at least once:" in said
    assert "test_fails: 2 failures, seeds [7, 8]" in said
    assert "AssertionError: boom" in said and "the output it captured" in said
    assert "test_passes" not in said.split("failed at least once:")[1]
    assert (out / "summary.txt").read_text() in said
