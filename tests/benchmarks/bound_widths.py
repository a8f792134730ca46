"""How narrow the report's bounds are after SIGKILLs, with and without metrics (issue 51).

A ground-truth history (:mod:`ground_truth`: a day of a 2-rank job, iterations of 2 s, a
save every 500, killed at random points on random ranks, and a quarter of those kills
followed by one to three restarts killed again in their startup or first step, some
before their first export) written with each span-group choice and each metrics choice
beside it; ``report`` (judged, so the metrics are read) against the truth. Per kill: how
far the wasted iterations' lower bound is below the truth (mean and worst incarnation),
and how much wider the widest time bound is than what no file can see (the restarts, the
lives of the restarts that left no record, and each killed incarnation's time after its
last record or metric point). ``python tests/benchmarks/bound_widths.py`` prints the
table the trace README quotes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TIME_PATHS = (
    "goodput_s",
    "badput_s.wasted_progress",
    "badput_s.checkpoint_save",
    "badput_s.restart_gap",
    "badput_s.startup",
)


def _clustered(plans: tuple[Any, ...], seed: int) -> tuple[Any, ...]:
    """Real faults cluster: after a kill, a quarter of the restarts are killed again in their
    startup (its imports, the checkpoint load, the model's initialization) or first step,
    one to three times, each a minute or two after the last; one killed in its imports dies
    before its first export and leaves nothing in any file."""
    import random

    import ground_truth as gt

    rng = random.Random(seed + 1)
    clustered = []
    for plan in plans:
        clustered.append(plan)
        if plan.ending != "killed" or rng.random() >= 0.25:
            continue
        for _ in range(rng.randint(1, 3)):
            phase = rng.choice(("imports", "load", "model_init", ""))
            into, victim, gap = rng.uniform(0.05, 0.95), rng.randrange(2), rng.uniform(10, 120)
            clustered.append(
                gt.Plan(0, "killed", into=into, in_startup=phase, victim=victim, gap_s=gap)
            )
    return tuple(clustered)


def _history(groups: str, metrics: str, period_s: float, kills: int, seed: int) -> Any:
    import ground_truth as gt

    base = gt.long_history(days=1, ranks=2, kills=kills, iteration_s=2.0, save_interval=500,
                           seed=seed)  # fmt: skip
    plans = (*_clustered(base.incarnations[:-1], seed), base.incarnations[-1])
    return gt.History(
        plans, ranks=base.ranks, work_s=base.work_s, sync_s=base.sync_s,
        factors=base.factors, save_interval=base.save_interval, save_s=base.save_s,
        startup_s=base.startup_s, load_s=base.load_s, export_delay_s=base.export_delay_s,
        export_phase_s=base.export_phase_s, groups=groups, metrics=metrics,
        metric_period_s=period_s, log_interval=10, log_interval_in_resource=True,
    )  # fmt: skip


def widths(groups: str, metrics: str, period_s: float, kills: int = 20, seed: int = 0) -> dict:
    """The widths of one history's bounds against its truth (module doc)."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import ground_truth as gt

    from megatron.trace import build_report, load_trace
    from megatron.trace.analysis.liveness import Clock, judge

    history = _history(groups, metrics, period_s, kills, seed)
    simulated = gt.simulate(history)
    with tempfile.TemporaryDirectory() as folder:
        paths = gt.write(simulated, Path(folder) / "traces.jsonl")
        trace = load_trace(paths, jobs=1)
        report = build_report(trace, judge(trace, paths, Clock.at(2e9)))
    truth = simulated.truth
    job = truth.ranks[report["rank"]]
    bounds = report["bounds"]
    short = []
    for inc, real in zip(report["incarnations"], job.seen, strict=True):
        bound = bounds.get(f"incarnations.{inc['index']}.wasted_iterations")
        if real.ended == "killed" and inc["index"] + 1 < len(job.seen):
            lower = bound["lower"] if bound else inc["wasted_iterations"]
            short.append(max(0, real.wasted_iterations - lower))
    restart = job.accounting_ns["restart_gap"] / 1e9
    # what no file shows: the restarts, the lives of the launches killed before their first
    # export, and each killed incarnation's time after its last record or metric point
    unseen = [inc for inc in job.incarnations if not inc.exported]
    unseen_s = sum(inc.end_ns - inc.start_ns for inc in unseen) / 1e9
    read = trace.ranks[str(report["rank"])]
    tails_s = (
        sum(
            max(0, real.end_ns - max(inc.end_ns, inc.sighting.seen_ns if inc.sighting else 0))
            for inc, real in zip(read, job.seen, strict=True)
            if real.ended == "killed"
        )
        / 1e9
    )
    widest = max(
        (b["upper"] - b["lower"] for p, b in bounds.items() if p in TIME_PATHS and b["upper"]),
        default=0.0,
    )
    failures = max(1, truth.failures)
    return {
        "kills": truth.failures,
        "unseen": len(unseen),
        "wasted_short_mean": sum(short) / max(1, len(short)),
        "wasted_short_max": max(short, default=0),
        "iterations_per_period": period_s / (history.work_s * 1.4 + history.sync_s),
        "time_beyond_restarts_per_kill_s": max(0.0, widest - restart - unseen_s) / failures,
        "time_excess_per_kill_s": max(0.0, widest - restart - unseen_s - tails_s) / failures,
        "restart_s": restart,
        "unseen_s": unseen_s,
        "tails_s": tails_s,
    }


def table(kills: int = 20) -> str:
    """The README's table: per groups and metrics choice, per kill."""
    rows = [
        "| span groups | metrics (export period) | wasted iterations: truth − lower bound, "
        "mean (worst) per kill | widest time bound − the restarts, per kill | − also the "
        "kills' time after their last record or point, per kill |",
        "|---|---|---|---|---|",
    ]
    for groups in ("default", "per_step"):
        for metrics, period in (("none", 10.0), ("trainer", 10.0), ("nemo_lens", 10.0),
                                ("trainer", 60.0)):  # fmt: skip
            found = widths(groups, metrics, period, kills)
            label = "none" if metrics == "none" else f"{metrics} ({period:g} s)"
            rows.append(
                f"| `{groups}` | {label} | {found['wasted_short_mean']:.1f} "
                f"({found['wasted_short_max']}) | {found['time_beyond_restarts_per_kill_s']:.1f} s "
                f"| {found['time_excess_per_kill_s']:.1f} s |"
            )
    rows.append(
        f"\n(per history: {found['kills']} kills, {found['unseen']} of them restarts killed "
        f"before their first export; what no file shows: {found['restart_s']:.0f} s of "
        f"restarts, {found['unseen_s']:.0f} s of those restarts' lives and "
        f"{found['tails_s']:.0f} s of the killed incarnations' after their last record or "
        "metric point)"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    print(table(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
