"""Launch timestamps as the launcher exports them, and the rules the startup tests use."""

from __future__ import annotations

import time
from collections.abc import Mapping


def ns(seconds: float) -> int:
    """Seconds since the epoch -> the SDK's integer nanoseconds (same rounding)."""
    return int(seconds * 1e9)


def launch_timestamps(now: float | None = None, **overrides: float | None) -> dict[str, float]:
    """A plausible, folded set of launch timestamps in epoch seconds, all in the past.
    ``overrides`` replace values; a value of None removes the key."""
    now = time.time() if now is None else now
    ts: dict[str, float | None] = {
        "slurm_job_start_time": now - 120.25,
        "launch_script_start": now - 60.5,
        "launch_script_presrun": now - 45.125,
        "program_start": now - 30.0625,
        "main_entry": now - 20.75,
        "pretrain_entry": now - 10.375,
    }
    ts.update(overrides)
    return {k: v for k, v in ts.items() if v is not None}


def is_folded(ts: Mapping[str, float]) -> bool:
    keys = ("launch_script_start", "launch_script_presrun", "program_start")
    if not all(k in ts for k in keys):
        return False
    return ts["launch_script_start"] <= ts["launch_script_presrun"] <= ts["program_start"]


def pre_startup_due(ts: Mapping[str, float]) -> bool:
    return (
        "slurm_job_start_time" in ts
        and "launch_script_start" in ts
        and ts["slurm_job_start_time"] < ts["launch_script_start"]
    )
