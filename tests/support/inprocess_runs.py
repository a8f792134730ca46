"""Real jobs under NVRx's in-process restart (``--inprocess-restart``), and their traces.

A job is the trainer on a tiny model, two torchrun ranks on gloo (or one process),
every rank exporting the ``per_step`` span groups into one file. A test hook set
for one rank only (through a ``torchrun --no-python`` wrapper script) injects the
fault; each hook fires once per process, so the restarted cycle goes past it.
NVRx's timeouts are short so a hung rank is caught in seconds. Used by
``tests/inprocess/`` and the restart-gap benchmark.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import TINY_MODEL, TORCHRUN_2, subprocess_env

from megatron.trace.otlp.reader import read_spans

#: NVRx's timeouts for these jobs (seconds): a hang is caught after SOFT_TIMEOUT_S.
SOFT_TIMEOUT_S = 6
INPROCESS = (
    "--inprocess-restart",
    "--inprocess-granularity", "rank",
    "--inprocess-soft-timeout", str(SOFT_TIMEOUT_S),
    # NVRx 0.4.1's monitor process checks the timeouts only when no progress timestamp came
    # within its interval; under the timestamps' period (1 s) it checks every interval
    "--inprocess-monitor-process-interval", "0.5",
    "--inprocess-hard-timeout", "30",
    "--inprocess-heartbeat-interval", "2",
    "--inprocess-heartbeat-timeout", "20",
    "--inprocess-barrier-timeout", "60",
    "--inprocess-completion-timeout", "60",
)  # fmt: skip
#: Checkpoints every 5 iterations; the per_step groups; a log line every iteration.
JOB = (
    *TINY_MODEL,
    "--log-interval", "1",
    "--otel-enabled", "--otel-span-groups", "per_step",
    "--save", "ck", "--save-interval", "5",
)  # fmt: skip
ENV = {
    "OMP_NUM_THREADS": "1",
    "MEGATRON_OTEL_RANK_STRATEGY": "all_ranks",
    "TORCH_CPP_LOG_LEVEL": "error",
}


@dataclass
class Job:
    """A finished job: its exit, its output, and its trace."""

    cwd: Path
    result: subprocess.CompletedProcess[str]

    @property
    def trace(self) -> Path:
        return self.cwd / "ck" / "telemetry" / "traces.jsonl"

    @property
    def metrics(self) -> Path:
        return self.trace.with_name("metrics.jsonl")

    def spans(self, rank: int | None = None) -> list[dict[str, Any]]:
        """The file's spans (of one rank's process, with ``rank``), in file order."""
        spans = list(read_spans([self.trace]))
        return [s for s in spans if rank is None or s["resource"].get("dl.rank") == rank]

    def logged_iterations(self) -> list[int]:
        """The iterations the log lines say finished, in order (rank 0 logs them)."""
        found = []
        for line in self.result.stdout.splitlines():
            if line.startswith(" [") and "| consumed samples:" in line:
                found.append(int(line.split("iteration", 1)[1].split("/", 1)[0]))
        return found

    def gauge(self, rank: int, name: str) -> list[float]:
        """The values one rank exported of the gauge ``name``, in order (each point's own)."""
        values = []
        for line in self.metrics.read_text().splitlines():
            for resource in json.loads(line)["resourceMetrics"]:
                ranks = [a for a in resource["resource"]["attributes"] if a["key"] == "dl.rank"]
                if not ranks or int(ranks[0]["value"]["intValue"]) != rank:
                    continue
                for scope in resource["scopeMetrics"]:
                    for metric in scope["metrics"]:
                        if metric["name"] == name:
                            points = metric["gauge"]["dataPoints"]
                            values += [p.get("asDouble", p.get("asInt")) for p in points]
        return [float(v) for v in values]

    def heartbeats(self, rank: int) -> list[float]:
        """The values the heartbeat gauge (``megatron.training.running``) exported, in order."""
        return self.gauge(rank, "megatron.training.running")

    def report(self) -> dict[str, Any]:
        """``megatron-trace report --json`` on the trace (exit 0 asserted)."""
        return json.loads(self.megatron_trace("report", "--json").stdout.splitlines()[-1])

    def megatron_trace(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "megatron.trace", args[0], str(self.trace), *args[1:]],
            cwd=self.cwd, env=subprocess_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done


def run_job(
    cwd: Path,
    *args: str,
    ranks: int = 2,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    env: Mapping[str, str] | None = None,
    inprocess: Sequence[str] = INPROCESS,
    timeout: float = 240,
) -> Job:
    """The job to its end in ``cwd``: ``args`` after :data:`JOB` and ``inprocess``;
    ``rank_env`` the variables set for one rank only."""
    script = cwd / "rank_wrapper.sh"
    exports = "".join(
        f'if [ "$RANK" = "{rank}" ]; then\n'
        + "".join(f"  export {name}={value}\n" for name, value in variables.items())
        + "fi\n"
        for rank, variables in (rank_env or {}).items()
    )
    script.write_text(f'#!/bin/sh\n{exports}exec "{sys.executable}" -m megatron.training "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    if ranks == 1:
        argv = [str(script)]
        extra_env = {"RANK": "0"}  # the wrapper reads it; the trainer needs no torchrun
    else:
        argv = [sys.executable, *TORCHRUN_2[:-1], str(ranks), "--no-python", str(script)]
        extra_env = {}
    result = subprocess.run(
        [*argv, *JOB, *inprocess, *args],
        cwd=cwd, env=subprocess_env({**ENV, **extra_env, **(env or {})}),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return Job(cwd, result)
