"""Real training runs for the Perfetto tests: one rank, two ranks, killed and resumed.

Each runs the trainer (``python -m megatron.training``, a tiny model on the
CPU) in a directory and returns the trace file it wrote, so the browser
tests check what a user's export of a real run looks like in Perfetto.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from processes import TELEMETRY_ON, TINY_MODEL, TORCHRUN_2, finished_iteration, subprocess_env

TINY = (*TINY_MODEL, "--log-interval", "5", *TELEMETRY_ON)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return subprocess_env({"OMP_NUM_THREADS": "1", **(extra or {})})


def _run(cwd: Path, args: tuple[str, ...], env: dict[str, str] | None = None, **kw) -> None:
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(env), capture_output=True, text=True,
        timeout=300, **kw,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def one_rank(cwd: Path) -> Path:
    """12 iterations, a checkpoint and an evaluation every 4: three intervals."""
    _run(cwd, ("-m", "megatron.training", *TINY, "--train-iters", "12", "--save", "ck",
               "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "1"))  # fmt: skip
    return cwd / "ck" / "telemetry" / "traces.jsonl"


def two_ranks(cwd: Path) -> Path:
    """The issue's run: torchrun, 2 ranks, ``all_ranks``, ``per_step``, 60 iterations."""
    torchrun = (*TORCHRUN_2, "-m", "megatron.training")
    _run(cwd, (*torchrun, *TINY, "--global-batch-size", "8", "--train-iters", "60",
               "--save", "ck", "--save-interval", "20", "--eval-interval", "20",
               "--eval-iters", "1"),
         env={"MEGATRON_OTEL_RANK_STRATEGY": "all_ranks"})  # fmt: skip
    return cwd / "ck" / "telemetry" / "traces.jsonl"


def killed_and_resumed(cwd: Path) -> Path:
    """Checkpoints every 5; SIGKILL once iteration 12 is on disk; then resume to 20."""
    args = ("-m", "megatron.training", *TINY, "--save", "ck", "--save-interval", "5")
    trace = cwd / "ck" / "telemetry" / "traces.jsonl"
    with open(cwd / "killed.log", "w") as log:
        trainer = subprocess.Popen(
            [sys.executable, *args, "--train-iters", "100"], cwd=cwd,
            env=_env({"MEGATRON_TEST_ITERATION_SLEEP": "0.2"}), stdout=log, stderr=log,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not finished_iteration(trace, 12):
            assert trainer.poll() is None, (cwd / "killed.log").read_text()
            assert time.monotonic() < deadline, "iteration 12 never reached the trace"
            time.sleep(0.1)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    _run(cwd, (*args, "--train-iters", "20", "--load", "ck"))
    return trace
