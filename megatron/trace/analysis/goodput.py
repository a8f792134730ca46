"""The goodput report: :func:`build_report` assembles it from the analyses.

Each figure is computed in one place: the accounting in
:mod:`~megatron.trace.analysis.accounting`, wasted progress in
:mod:`~megatron.trace.analysis.wasted`, the iteration figures in
:mod:`~megatron.trace.analysis.iteration_stats`, the windows in
:mod:`~megatron.trace.analysis.windows`, stragglers, hangs and checkpoint advice in
their modules. The report's shape is stated once, by its types
(:mod:`megatron.trace.analysis.report`) and its JSON Schema (``report.schema.json``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from megatron.trace.analysis.accounting import rank_accounting, seconds
from megatron.trace.analysis.bounds import (
    advice_bounds,
    furthest_waste,
    report_bounds,
    restart_gap_bounds,
    window_bounds,
)
from megatron.trace.analysis.checkpoint_advice import checkpoint_advice
from megatron.trace.analysis.hangs import hang_entries, recovered_stalls
from megatron.trace.analysis.iteration_stats import ANOMALY_MAX_SHARE, iteration_stats
from megatron.trace.analysis.liveness import Clock, Liveness, judge, utc_text
from megatron.trace.analysis.report import IterationStats, Report
from megatron.trace.analysis.resumed import Resumed, job_resume_ranges, resumed_bounds
from megatron.trace.analysis.resumed import figure as resumed_figure
from megatron.trace.analysis.stragglers import Stragglers, find_stragglers
from megatron.trace.analysis.windows import window_entries, window_iterations
from megatron.trace.model.builder import load_trace
from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.jobs import one_job
from megatron.trace_format.errors import NoSpansError
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    CHECKPOINT_LOAD_SPAN,
    INTERVAL_SPAN,
    ITERATION_SPAN,
    STARTUP_SPAN,
    Category,
)

__all__ = ["build_report", "report_files"]


def _incarnation_entry(
    inc: Incarnation,
    following: Incarnation | None,
    wall_start: int,
    waste: dict[str, Any],
    resumed: Resumed,
) -> dict:
    startup = inc.startup
    # a killed one lived at least until its newest metric point: the gap begins no earlier
    alive_until = max(inc.end_ns, inc.sighting.seen_ns if inc.sighting is not None else 0)
    return {
        "rank": rank_value(inc.rank),
        "index": inc.index,
        "ended": inc.ended,
        "error_type": inc.error_type,
        "pid": inc.pid if isinstance(inc.pid, int) else None,
        "cycle": inc.cycle,
        "restart_gap_s": None
        if following is None
        else seconds(max(0, following.start_ns - alive_until)),
        "first_iteration": inc.first_iteration,
        "last_iteration": inc.last_iteration,
        "resumed_from": resumed_figure(resumed),
        "startup_s": seconds(startup["end_ns"] - startup["start_ns"]) if startup else None,
        "intervals": len(inc.intervals),
        "start_s": seconds(inc.start_ns - wall_start),
        "duration_s": seconds(inc.end_ns - inc.start_ns),
        "wasted_iterations": waste["wasted_iterations"],
        "wasted_s": seconds(waste["wasted_progress_ns"]),
        "as_of": utc_text(inc.as_of_ns) if inc.as_of_ns is not None else None,
        "in_flight_s": seconds(inc.in_flight["end_ns"] - inc.in_flight["start_ns"])
        if inc.in_flight is not None
        else 0.0,
    }


def _loop_unrecorded(inc: Incarnation) -> bool:
    """Whether the incarnation went past its startup but no span covers its training loop:
    no interval (Megatron-LM without checkpointing) and no iteration span. A killed one is
    not: its in-flight interval was lost, and its time is counted as that interval's (from
    the last interval or the startup to its last span, and bounded past that)."""
    if inc.intervals or inc.goodput_time or inc.in_flight is not None or inc.startup is None:
        return False
    if inc.ended == "killed" or inc.iterations:
        return False
    return inc.end_ns > inc.startup["end_ns"]


def _loads_unrecorded(incs: list[Incarnation]) -> bool:
    """Whether an incarnation resumed from a checkpoint whose load left no span."""
    return any(not inc.loads and (inc.first_iteration or 0) > 0 for inc in incs)


def build_report(
    trace: Trace,
    liveness: Liveness | None = None,
    *,
    window_ns: int | None = None,
    mtbf_s: float | None = None,
) -> Report:
    """The goodput report of ``trace``: a :class:`~megatron.trace.analysis.report.Report`,
    whose types (:mod:`megatron.trace.analysis.report`) and JSON Schema
    (``report.schema.json``) state its shape and what each figure means.

    ``liveness`` (:func:`megatron.trace.analysis.liveness.judge` applied to ``trace``)
    adds how fresh a running job's figures are; ``window_ns`` adds ``windows``
    (:mod:`~megatron.trace.analysis.windows`); ``mtbf_s`` (``--mtbf``) stands in for the
    observed mean time between failures in ``checkpoint_advice``.
    """
    if not trace.ranks:
        raise NoSpansError("the trace")
    ranks = {}
    job_rank = next(iter(trace.ranks))
    for rank, incs in trace.ranks.items():
        accounting = rank_accounting(incs, window_ns if rank == job_rank else None)
        ranks[rank] = (incs, accounting)
    incs, accounting = ranks[job_rank]
    totals = accounting["totals_ns"]
    wall = accounting["wall_ns"]
    iterations = iteration_stats(incs)
    stragglers = find_stragglers(trace)
    furthest = furthest_waste(ranks)
    not_computed = _not_computed(incs, accounting, iterations, stragglers)
    not_computed_categories = {reason.split(":")[0] for reason in not_computed}
    resumed = job_resume_ranges([rank_incs for rank_incs, _ in ranks.values()])
    report: Report = {
        "wall_s": seconds(wall),
        "goodput_s": seconds(totals[Category.GOODPUT]),
        "goodput_fraction": round(totals[Category.GOODPUT] / wall, 6) if wall else 0.0,
        "badput_s": {
            category: None if category in not_computed_categories else seconds(totals[category])
            for category in BADPUT_CATEGORIES
        },
        "accounting_ns": {
            "wall": wall,
            Category.GOODPUT: totals[Category.GOODPUT],
            **{category: totals[category] for category in BADPUT_CATEGORIES},
        },
        "wasted_iterations": furthest["job"],
        "incarnations": [
            {
                **_incarnation_entry(
                    inc,
                    incs[position + 1] if position + 1 < len(incs) else None,
                    accounting["start_ns"],
                    waste,
                    resumed[position],
                ),
                "wasted_iterations": furthest["incarnations"][position],
            }
            for position, (inc, waste) in enumerate(
                zip(incs, accounting["per_incarnation"], strict=True)
            )
        ],
        "iterations": iterations,
        "rank": rank_value(job_rank),
        "ranks": [
            {
                "rank": rank_value(rank),
                "wall_s": seconds(acc["wall_ns"]),
                "goodput_s": seconds(acc["totals_ns"][Category.GOODPUT]),
                "goodput_fraction": round(acc["totals_ns"][Category.GOODPUT] / acc["wall_ns"], 6)
                if acc["wall_ns"]
                else 0.0,
                "wasted_iterations": acc["wasted_iterations"],
                "incarnations": len(rank_incs),
                **stragglers.rank_entry(rank),
            }
            for rank, (rank_incs, acc) in ranks.items()
        ],
        "stragglers": stragglers.summary(),
        "straggler_s": stragglers.straggler_s,
        "hangs": hang_entries(trace),
        "recovered_stalls": recovered_stalls(trace),
        "spans": trace.span_count,
        "torn_lines": len(trace.stats.torn),
        "not_computed": not_computed,
        **_liveness_entry(incs, liveness),  # type: ignore[typeddict-item]
    }
    report["bounds"] = report_bounds(report, ranks, job_rank, furthest, not_computed_categories)
    report["bounds"].update(resumed_bounds(incs, resumed))
    report["bounds"].update(
        restart_gap_bounds(report["incarnations"], incs, accounting)  # type: ignore[arg-type]
    )
    report["checkpoint_advice"] = checkpoint_advice(
        incs,
        report["incarnations"],  # type: ignore[arg-type]
        iterations["median_ms"] if iterations is not None else None,
        mtbf_s,
    )
    report["bounds"].update(advice_bounds(report["checkpoint_advice"], incs, accounting))  # type: ignore[arg-type]
    if window_ns is not None:
        windows = accounting["windows_ns"]
        report["windows"] = {
            "window_s": seconds(window_ns),
            "entries": window_entries(
                windows, not_computed_categories, window_iterations(incs, windows)
            ),
        }
        report["bounds"].update(window_bounds(report["windows"]["entries"], *ranks[job_rank]))
    return report


def _not_computed(
    incs: list[Incarnation],
    accounting: dict[str, Any],
    iterations: IterationStats | None,
    stragglers: Stragglers,
) -> list[str]:
    """The report's ``not_computed``: each figure the job rank's trace cannot give, with
    the reason (a badput category named first is None in ``badput_s``)."""
    not_computed: list[str] = []
    if iterations is None:
        not_computed.append(
            f"iterations: no {ITERATION_SPAN} spans (enable the per_step span groups)"
        )
    elif iterations["anomalous"]["count"] is None:
        not_computed.append(
            f"anomalous iterations: over {100 * ANOMALY_MAX_SHARE:g} % of the iterations took "
            f"longer than {iterations['anomalous']['threshold_ms']} ms: that is their own spread "
            "(a loaded machine, or a lasting slowdown: see p90 and max), not a few slow ones"
        )
    for inc in incs:
        unknown = [
            f.index
            for f in inc.interval_facts
            if f.first_iteration is None or f.last_iteration is None
        ]
        if unknown:
            not_computed.append(
                f"interval iteration ranges: incarnation {inc.index} intervals {unknown}: no "
                "interval attributes, iteration spans or checkpoint saves to derive them from"
            )
    not_computed += stragglers.not_computed
    if not any(inc.startup or inc.intervals or inc.goodput_time for inc in incs):
        not_computed.append(
            f"{Category.GOODPUT}: no {STARTUP_SPAN} or {INTERVAL_SPAN} span (the job span group "
            "was off): only the other spans' time is accounted, the rest is other"
        )
    else:
        uncovered = [inc.index for inc in incs if _loop_unrecorded(inc)]
        if uncovered:
            not_computed.append(
                f"{Category.GOODPUT}: incarnations {uncovered} ended cleanly past their startup "
                f"with no {INTERVAL_SPAN} interval and no {ITERATION_SPAN} or goodput span: "
                "their training loop's time is other"
            )
    unsure = [inc.index for inc in incs if inc.ending_unsure]
    if unsure:
        not_computed.append(
            f"ended: incarnations {unsure} wrote their startup and nothing of a training loop, "
            "resumed where a clean end left off: each had nothing left to train (shutdown, as "
            "read) or a SIGKILL in its first iteration lost its interval; no file says which "
            "(this trainer's metrics.jsonl would: its last export says whether telemetry shut "
            "down)"
        )
    if _loads_unrecorded(incs):
        not_computed.append(
            f"{Category.CHECKPOINT_LOAD}: an incarnation resumed past iteration 0 but the trace "
            f"holds no {CHECKPOINT_LOAD_SPAN} span (the load_checkpoint span group is off, as in "
            "the default groups); its load time is counted in startup"
        )
    return not_computed


def _liveness_entry(incs: list[Incarnation], liveness: Liveness | None) -> dict[str, Any]:
    last = incs[-1]
    running = last.ended == "running" and last.as_of_ns is not None
    entry: dict[str, Any] = {
        "running": running,
        "as_of": utc_text(last.as_of_ns) if running else None,
    }
    if liveness is not None:
        clock = liveness.clock
        entry["liveness"] = {
            "rule": liveness.rule,
            "now": utc_text(clock.now_ns),
            "stale_after_s": clock.stale_after_ns / 1e9,
            "heartbeat_files": [str(path) for path in liveness.metrics_files],
            "notes": list(liveness.notes),
        }
        if running:
            entry["as_of_age_s"] = seconds(clock.now_ns - last.as_of_ns)
    return entry


def report_files(
    paths: Iterable[Path | str],
    clock: Clock | None = None,
    jobs: int | None = None,
    job: str | None = None,
) -> Report:
    """Stream the files (several in ``jobs`` parallel processes) and build the report.

    Raises ``TraceFileDamaged`` on damage, and
    :class:`~megatron.trace.model.jobs.SeveralJobsError` for files holding several jobs
    unless ``job`` names one. Whether the job is still running is judged against
    ``clock`` (default: the system clock and the default staleness bound).
    """
    paths = list(paths)
    trace = one_job(load_trace(paths, jobs), job)
    liveness = judge(trace, paths, clock or Clock.system())
    return build_report(trace, liveness)
