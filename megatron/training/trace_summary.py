"""Summarize what a run wrote (end of run), and group read-back spans by incarnation.

The summary is built from what the run counted as it went
(:class:`~megatron.core.telemetry.tally.SpanTally`), never by reading the file
back. Reading a file is the base layer's job
(:mod:`megatron.core.telemetry.reader`, re-exported here as ``read_spans`` for
the tests): one streaming reader shared by ``megatron-trace`` and the tests.
A torn write (a line a killed process left half written, possibly followed by
a later incarnation's lines) is skipped; other damage raises
``TraceFileDamaged`` naming the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron.core.telemetry.jsonl import metrics_file_for
from megatron.core.telemetry.reader import decode_any_value, read_spans
from megatron.core.telemetry.tally import SpanTally
from megatron.trace.model import TraceBuilder
from megatron.trace.report import BADPUT_CATEGORIES, rank_accounting

__all__ = [
    "ancestor_names",
    "decode_any_value",
    "goodput_line",
    "incarnations",
    "read_spans",
    "summarize",
]


def incarnations(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group spans by ``pretrain()`` call: each startup span and the intervals chained to it.

    Returns ``[{"startup": span or None, "intervals": [C0, C1, ...]}]``, one
    entry per ``megatron.startup`` in file order, following the links
    (C0 -> startup, C(k) -> C(k-1)). Intervals whose chain does not reach a
    startup in the file (its trace lost, or the ``job`` span group was off at
    startup) form entries of their own with ``startup`` None.
    """
    entries: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # span id -> its entry
    for span in spans:
        if span["name"] == "megatron.startup":
            entry = {"startup": span, "intervals": []}
            owner[span["span_id"]] = entry
            entries.append(entry)
    intervals = [span for span in spans if span["name"] == "megatron.train"]
    linked_to = {
        span["span_id"]: span["links"][0][1] if span["links"] else None for span in intervals
    }
    # In start-time order every interval comes after the span it links to.
    for interval in sorted(intervals, key=lambda span: span["start_ns"]):
        entry = owner.get(linked_to[interval["span_id"]])
        if entry is None:
            entry = {"startup": None, "intervals": []}
            entries.append(entry)
        entry["intervals"].append(interval)
        owner[interval["span_id"]] = entry
    return entries


def ancestor_names(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    """Names of ``span``'s parent, grandparent, ... up to its trace's root."""
    by_id = {s["span_id"]: s for s in spans}
    names = []
    while span["parent_id"] is not None and span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names


def goodput_line(kept: list[dict[str, Any]]) -> str | None:
    """One line of this run's goodput accounting, from its structural spans.

    ``kept`` are flat span dicts (:attr:`SpanTally.kept`); the accounting is
    ``megatron-trace report``'s, applied to this run alone (so a later
    restart's re-done iterations cannot be known yet: see the README).
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
    return (
        f"  goodput: {100 * totals['goodput'] / wall:.1f} % of {wall / 1e9:.1f} s wall clock;"
        f"   largest badput: {badput}"
    )


def summarize(path: str | Path, tally: SpanTally) -> str:
    """A few human-readable lines about what this run wrote to the trace file.

    Built from ``tally`` (counted as the spans ended), never by reading the
    file back: the cost is the same whether the file holds one run or a
    week of appended incarnations.
    """
    by_name = tally.by_name
    width = max((len(name) for name in by_name), default=0)
    lines = [
        f"telemetry written to {path}",
        f"  runs (pretrain calls): {by_name.get('megatron.startup', 0)}   "
        f"traces: {len(tally.trace_ids)}   spans: {tally.span_count}   "
        f"intervals (megatron.train): {by_name.get('megatron.train', 0)}",
    ]
    metrics = metrics_file_for(Path(path))
    if metrics.exists():
        lines.append(f"  metrics: {metrics}")
    goodput = goodput_line(tally.kept)
    if goodput:
        lines.append(goodput)
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
