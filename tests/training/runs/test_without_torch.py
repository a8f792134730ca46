"""Installed without the ``train`` extra: the reader, ``watch`` and the lifecycle need no torch.

Each check runs in a child interpreter where ``import torch`` fails as it does
when torch is not installed (``sys.modules["torch"] = None`` before anything
else runs), so what is proven is what a user without torch gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tracegen as g

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Runs the rest of argv as ``python -m MODULE ARGS...`` with torch unimportable.
WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def test_report_and_check_read_a_trace_without_torch(tmp_path: Path) -> None:
    trace = g.write(tmp_path / "traces.jsonl", g.lifecycle(0.0))
    report = _run("megatron.trace", "report", "--json", trace, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout.splitlines()[-1])["goodput_s"] == 6.0
    check = _run("megatron.trace", "check", trace, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_lifecycle_module_imports_without_torch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from megatron.training.telemetry_spans import SpanPhases\n"
        "from megatron.trace.cli import watch\n"
        "assert sys.modules['torch'] is None\n"
        "print(SpanPhases.__name__)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['torch'] = None; "
            f"runpy.run_path({str(probe)!r}, run_name='__main__')",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SpanPhases"


def test_the_trainer_without_torch_names_the_extra_in_one_line(tmp_path: Path) -> None:
    result = _run("megatron.training", "--demo", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "megatron-pretrain: error: the trainer needs torch, which is not installed: "
        "pip install 'megatron-telemetry-spans[train]' (reading traces and megatron-trace "
        "need no torch)"
    ]
    assert not (tmp_path / "runs").exists()  # it stopped before writing anything
