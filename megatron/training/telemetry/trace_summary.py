"""Summarize what a run wrote, at the end of the run.

The summary is built from what the run counted as it went
(:class:`~megatron.core.telemetry.tally.SpanTally`), never by reading the file
back, so it costs the same whether the file holds one run or a week of them.
Reading a file is the base layer's job (:mod:`megatron.trace.otlp.reader`,
the one streaming reader ``megatron-trace`` and the tests share).
"""

from __future__ import annotations

import os
from collections.abc import Set
from pathlib import Path

from megatron.core.telemetry.span_groups import SpanGroup
from megatron.core.telemetry.tally import SpanTally
from megatron.trace.analysis.accounting import rank_accounting
from megatron.trace.model.builder import TraceBuilder
from megatron.trace_format.files import metrics_file_for
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    INTERVAL_SPAN,
    STARTUP_SPAN,
    Category,
)

__all__ = ["goodput_line", "summarize", "unaccounted"]

# Where spans went when no file holds them, by exporter.
_DESTINATIONS = {
    "console": "exported to the console (MEGATRON_OTEL_EXPORTER=console)",
    "otlp": "exported over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)",
}


def goodput_line(kept: list[SpanRecord]) -> str | None:
    """One line of this run's goodput accounting, from its structural spans.

    ``kept`` are flat span records (:attr:`SpanTally.kept`); the accounting is
    ``megatron-trace report``'s (:mod:`megatron.trace.analysis.goodput`), applied to
    this run alone (so a later restart's re-done iterations cannot be known
    yet: ``megatron/training/README.md``, "The end-of-run summary").
    """
    builder = TraceBuilder()
    for span in kept:
        builder.add(span)
    trace = builder.finish()
    if not trace.ranks:
        return None
    accounting = rank_accounting(next(iter(trace.ranks.values())))
    wall, totals = accounting["wall_ns"], accounting["totals_ns"]
    if wall <= 0:
        return None
    largest = sorted(
        ((ns, name) for name, ns in totals.items() if name in BADPUT_CATEGORIES and ns > 0),
        reverse=True,
    )[:3]
    badput = ", ".join(f"{name} {100 * ns / wall:.1f} %" for ns, name in largest) or "none"
    goodput = 100 * totals[Category.GOODPUT] / wall
    return (
        f"  goodput: {goodput:.1f} % of {wall / 1e9:.1f} s wall clock;   largest badput: {badput}"
    )


def unaccounted(tally: SpanTally, span_groups: Set[str] | None) -> str | None:
    """Why this run's goodput cannot be accounted from its spans, or None when it can."""
    if not tally.span_count:
        sampler = os.environ.get("OTEL_TRACES_SAMPLER")
        if sampler:
            return f"no span was recorded: the sampler (OTEL_TRACES_SAMPLER={sampler}) kept none"
        return "no span was recorded"
    if span_groups is not None and SpanGroup.JOB not in span_groups:
        return (
            "the job span group is off, so there is no megatron.startup or megatron.train "
            "span to account (only the other groups' spans are counted below)"
        )
    return None


def summarize(
    path: str | Path | None,
    tally: SpanTally,
    *,
    exporter: str = "jsonl",
    span_groups: Set[str] | None = None,
) -> str:
    """A few human-readable lines about what this run's telemetry wrote.

    Built from ``tally`` (counted as the spans ended), never by reading the
    file back: the cost is the same whether the file holds one run or a
    week of appended incarnations. ``path`` is the trace file (None when the
    ``exporter`` sends spans elsewhere); ``span_groups`` the groups the run
    enabled. What the goodput line cannot account (the ``job`` group off, no
    span sampled) it says in its place.
    """
    by_name = tally.by_name
    width = max((len(name) for name in by_name), default=0)
    where = (
        f"written to {path}"
        if path is not None
        else _DESTINATIONS.get(exporter, f"exported ({exporter})")
    )
    lines = [
        f"telemetry {where}",
        f"  runs (pretrain calls): {by_name.get(STARTUP_SPAN, 0)}   "
        f"traces: {len(tally.trace_ids)}   spans: {tally.span_count}   "
        f"intervals ({INTERVAL_SPAN}): {by_name.get(INTERVAL_SPAN, 0)}",
    ]
    if path is not None and (metrics := metrics_file_for(Path(path))).exists():
        lines.append(f"  metrics: {metrics}")
    reason = unaccounted(tally, span_groups)
    goodput = goodput_line(tally.kept) if reason is None else None
    if goodput is None and reason is None:
        reason = "no span covers any wall-clock time"
    lines.append(goodput if goodput is not None else f"  goodput: not computed: {reason}")
    if tally.cut_short or tally.errors:
        lines.append(
            f"  spans cut short: {tally.cut_short}   spans with ERROR status: {tally.errors}"
        )
    if tally.torn_lines_sealed:
        lines.append(
            f"  torn lines: {tally.torn_lines_sealed} (a killed run's last write, sealed and "
            "skipped by readers)"
        )
    lines.append("  spans by name:")
    lines.extend(f"    {name:<{width}}  {count:>6}" for name, count in sorted(by_name.items()))
    return "\n".join(lines)
