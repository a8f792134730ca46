"""``report`` of a long job history whose truth is known (section ``history``).

The ground truth's :func:`~ground_truth.long_history`: two weeks of an 8-rank job
killed 300 times at random points on random ranks (a slow rank, per-rank export
delays, the last batch of each kill lost), written as the sink would have. It times
``report --json --jobs 2`` as a whole process against the floor (``json.loads`` of
every line, a process of its own), records its peak RSS, and says how its goodput
compares with the truth (inside its bounds).

And the cost of the metrics beside a trace (issue 51): a week of a two-rank job with
the ``default`` span groups, SIGKILLed 40 times, its ``metrics.jsonl`` written as this
project's trainer writes it (every 10 s, about 320 MB); ``report`` reads the points
near each kill from the file's end, so it is timed with that file beside the trace
against the same trace without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, Run, interleaved
from trace_commands import FLOOR_SCRIPT, TRACE_SCRIPT, measure_process


def bench_long_history(repeats: int) -> dict[str, Any]:
    """Floor and report of the long history, interleaved; medians of wall time, peak RSS."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import ground_truth as gt

    py = sys.executable
    directory = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        simulated = gt.simulate(gt.long_history(days=14, ranks=8, kills=300))
        (path,) = gt.write(simulated, directory / "traces.jsonl")
        size_mb = path.stat().st_size / 2**20
        report_args = ["report", "--json", "--jobs", "2", str(path)]
        report_argv = [py, "-c", TRACE_SCRIPT, "msgspec", *report_args]
        commands = {"floor": [py, "-c", FLOOR_SCRIPT, str(path)], "report": report_argv}
        walls: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, argv in commands.items():
                wall, _, peak = measure_process(argv)
                walls[name].append(wall)
                peaks[name].append(peak)
        report = _report_json(report_argv)
    finally:
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    truth = simulated.truth
    return {
        "size_mb": size_mb,
        "wall": {name: statistics.median(values) for name, values in walls.items()},
        "peak_mb": {name: max(values) for name, values in peaks.items()},
        "goodput_s": report["goodput_s"],
        "goodput_bound": report["bounds"].get("goodput_s"),
        "true_goodput_s": truth.job.goodput_ns / 1e9,
        "wasted": report["wasted_iterations"],
        "true_wasted": truth.wasted_iterations,
        "failures": report["checkpoint_advice"]["failures"],
        "true_failures": truth.failures,
    }


def section_history(run: Run) -> None:
    figures = bench_long_history(1 if run.quick else 3)
    wall, peak = figures["wall"], figures["peak_mb"]
    bound = figures["goodput_bound"] or {"lower": figures["goodput_s"], "upper": None}
    base = f"floor {wall['floor']:.2f} s ({figures['size_mb']:.0f} MB: 14 days, 8 ranks, 300 kills)"
    upper = "" if bound["upper"] is None else f"{bound['upper']:.0f}"
    truth = (
        f"goodput {bound['lower']:.0f}–{upper} s, true {figures['true_goodput_s']:.0f}"
        f"; failures {figures['failures']} of {figures['true_failures']}"
    )
    run.record(
        "report_long_history_floor_ratio",
        wall["report"] / wall["floor"],
        f"{wall['report']:.2f} s ({truth})",
        base,
    )
    run.record(
        "report_long_history_peak_mb",
        peak["report"],
        f"{peak['report']:.1f} MB",
        f"the floor's {peak['floor']:.1f} MB",
    )
    section_metrics_week(run)


def _report_json(argv: list[str]) -> dict[str, Any]:
    """What ``report --json`` (``argv``, run once more, untimed) printed."""
    out = subprocess.run(
        argv, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    ).stdout  # fmt: skip
    return json.loads(out.splitlines()[-1])


def bench_metrics_week(repeats: int) -> dict[str, Any]:
    """``report --json`` of a week's trace with its metrics beside it over the same trace
    without them (:func:`~harness.interleaved`: the median of the repetitions' ratios,
    and each side's median wall time), and the wasted-iterations bound each gives."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import ground_truth as gt

    py = sys.executable
    directory = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    try:
        history = dataclasses.replace(
            gt.long_history(days=7, ranks=2, kills=40), groups="default", metrics="trainer"
        )
        simulated = gt.simulate(history)
        beside, alone = directory / "beside", directory / "alone"
        beside.mkdir()
        alone.mkdir()
        (path,) = gt.write(simulated, beside / "traces.jsonl")
        shutil.copy(path, alone / "traces.jsonl")
        metrics_mb = (beside / "metrics.jsonl").stat().st_size / 2**20
        os.sync()  # the 320 MB written back before the timing, not during it
        report = [py, "-c", TRACE_SCRIPT, "msgspec", "report", "--json"]
        argv = {
            name: [*report, str(folder / "traces.jsonl")]
            for name, folder in (("beside", beside), ("alone", alone))
        }
        ratio, with_metrics, without = interleaved(
            lambda: measure_process(argv["beside"])[0],
            lambda: measure_process(argv["alone"])[0],
            repeats,
        )
        lower = {
            name: _report_json(command)["bounds"]["wasted_iterations"]["lower"]
            for name, command in argv.items()
        }
    finally:
        shutil.rmtree(directory)
    return {
        "metrics_mb": metrics_mb,
        "ratio": ratio,
        "wall": {"beside": with_metrics, "alone": without},
        "wasted_lower": lower,
        "true_wasted": simulated.truth.wasted_iterations,
    }


def section_metrics_week(run: Run) -> None:
    figures = bench_metrics_week(3 if run.quick else 7)
    wall, lower = figures["wall"], figures["wasted_lower"]
    run.record(
        "report_metrics_week_ratio",
        figures["ratio"],
        f"{wall['beside']:.2f} s with its {figures['metrics_mb']:.0f} MB of metrics (wasted "
        f"iterations ≥ {lower['beside']}, true {figures['true_wasted']})",
        f"{wall['alone']:.2f} s without (≥ {lower['alone']})",
    )
