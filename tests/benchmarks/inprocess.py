"""An in-process restart against a relaunch after the same fault (section ``inprocess``).

The same two-rank job (``tests/support/inprocess_runs.py``: torchrun, gloo, a
checkpoint every 5 iterations, every rank exporting the ``per_step`` groups)
meets the same fault, an exception on rank 0 in iteration 7, twice:

* under ``--inprocess-restart``: NVRx interrupts both ranks and calls
  ``pretrain()`` again in the same processes;
* without it: the job ends (torchrun tears it down) and is launched again at
  once with ``--load``, a kill and a resume as a scheduler's retry makes them.

Both are read from their own traces by ``megatron-trace report --json`` on the
job rank: the *restart gap* (from the failed incarnation's last span to the next
one's first span: the fault's end to the new ``megatron.startup``) and the next
incarnation's startup (back to training: the gap and the startup together).
The figures are those traces' own; nothing here times anything.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from harness import REPO_ROOT, Run

FAULT = {0: {"MEGATRON_TEST_FAULT_AT_ITERATION": "7"}}
ITERATIONS = ("--train-iters", "12")


def _after_the_fault(report: dict) -> tuple[float, float]:
    """(restart gap after the first incarnation, the second one's startup), seconds."""
    failed, resumed = report["incarnations"][:2]
    return failed["restart_gap_s"], resumed["startup_s"]


def _in_process(folder: Path) -> tuple[float, float]:
    from inprocess_runs import run_job

    job = run_job(folder, *ITERATIONS, rank_env=FAULT)
    if job.result.returncode != 0:
        raise RuntimeError(f"the in-process restart failed:\n{job.result.stderr[-3000:]}")
    return _after_the_fault(job.report())


def _relaunched(folder: Path) -> tuple[float, float]:
    from inprocess_runs import run_job

    failed = run_job(folder, *ITERATIONS, rank_env=FAULT, inprocess=())
    if failed.result.returncode == 0:
        raise RuntimeError("the fault did not end the job")
    job = run_job(folder, *ITERATIONS, "--load", "ck", inprocess=())
    if job.result.returncode != 0:
        raise RuntimeError(f"the relaunch failed:\n{job.result.stderr[-3000:]}")
    return _after_the_fault(job.report())


def section_inprocess(run: Run) -> None:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    repeats = 1 if run.quick else 3
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):  # alternating which goes first, as interleaved() does
            folders = (Path(tmp) / f"inprocess{rep}", Path(tmp) / f"relaunch{rep}")
            for folder in folders:
                folder.mkdir()
            if rep % 2:
                theirs.append(_relaunched(folders[1]))
                ours.append(_in_process(folders[0]))
            else:
                ours.append(_in_process(folders[0]))
                theirs.append(_relaunched(folders[1]))
    gap = statistics.median(o[0] / t[0] for o, t in zip(ours, theirs, strict=True))
    back = statistics.median(sum(o) / sum(t) for o, t in zip(ours, theirs, strict=True))
    ip_gap, ip_start = (statistics.median(x[i] for x in ours) for i in (0, 1))
    rl_gap, rl_start = (statistics.median(x[i] for x in theirs) for i in (0, 1))
    run.record(
        "inprocess_restart_gap_ratio",
        gap,
        f"in-process {ip_gap:.2f} s",
        f"relaunch {rl_gap:.2f} s",
    )
    run.record(
        "inprocess_back_to_training_ratio",
        back,
        f"in-process {ip_gap:.2f} + {ip_start:.2f} s startup",
        f"relaunch {rl_gap:.2f} + {rl_start:.2f} s startup",
    )
