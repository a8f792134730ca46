"""``report --window`` and ``diff`` against plain ``report``, each a whole process on the
``trace`` section's 1M-span file (section ``goodput``)."""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import Run, synthetic_trace_file
from trace_commands import TRACE_SCRIPT, measure_process


def bench_goodput_commands(repeats: int, spans: int = 1_000_000) -> dict[str, Any]:
    """``report``, ``report --window 1h`` and ``diff`` of two such files, interleaved.

    The files are the ``trace`` section's first: a synthetic two-rank ``per_step``
    trace of ``spans`` spans (a SIGKILL and a resume on each rank); the second
    file for ``diff`` is another of the same shape. Medians of wall time."""
    py = sys.executable
    directory = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    try:
        shape = {"ranks": 2, "spans": spans, "incarnations": 2}
        path, count, size_mb = synthetic_trace_file(directory, "a.jsonl", **shape)
        other, _, _ = synthetic_trace_file(directory, "b.jsonl", **shape)

        def trace(*args: str) -> list[str]:
            return [py, "-c", TRACE_SCRIPT, "msgspec", *args]

        commands = {
            "report": trace("report", str(path)),
            "report_window": trace("report", "--window", "1h", str(path)),
            "diff": trace("diff", str(path), str(other)),
        }
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, argv in commands.items():
                walls[name].append(measure_process(argv)[0])
    finally:
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    return {
        "spans": count,
        "size_mb": size_mb,
        "wall": {name: statistics.median(values) for name, values in walls.items()},
    }


def section_goodput(run: Run) -> None:
    figures = bench_goodput_commands(3 if run.quick else 7)
    wall = figures["wall"]
    base = f"report {wall['report']:.2f} s ({figures['spans']} spans, {figures['size_mb']:.0f} MB)"
    window = wall["report_window"]
    run.record("report_window_ratio", window / wall["report"], f"{window:.2f} s", base)
    run.record("diff_ratio", wall["diff"] / wall["report"], f"{wall['diff']:.2f} s", base)
