"""Summarize the trace file a run wrote, and group its spans by incarnation.

Reading the file is the base layer's job (:mod:`megatron.core.telemetry.reader`,
re-exported here as ``read_spans`` for the tests): one streaming reader shared
by the end-of-run summary, ``megatron-trace`` and the tests, so none of them
can disagree about what is on disk. A torn write (a line a killed process left
half written, possibly followed by a later incarnation's lines) is skipped;
other damage raises ``TraceFileDamaged`` naming the line.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from megatron.core.telemetry.jsonl import metrics_file_for
from megatron.core.telemetry.reader import decode_any_value, read_spans

__all__ = ["ancestor_names", "decode_any_value", "incarnations", "read_spans", "summarize"]


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


def summarize(path: str | Path) -> str:
    """A few human-readable lines about the trace file: traces, spans by name, intervals."""
    spans = read_spans(path)
    by_name = Counter(span["name"] for span in spans)
    traces = {span["trace_id"] for span in spans}
    cut_short = sum(1 for span in spans if span["attributes"].get("megatron.span.cut_short"))
    errors = sum(1 for span in spans if span["status_code"] == "ERROR")
    width = max((len(name) for name in by_name), default=0)
    lines = [
        f"telemetry written to {path}",
        f"  runs (pretrain calls): {len(incarnations(spans))}   traces: {len(traces)}   "
        f"spans: {len(spans)}   intervals (megatron.train): {by_name.get('megatron.train', 0)}",
    ]
    metrics = metrics_file_for(Path(path))
    if metrics.exists():
        lines.append(f"  metrics: {metrics}")
    if cut_short or errors:
        lines.append(f"  spans cut short: {cut_short}   spans with ERROR status: {errors}")
    lines.append("  spans by name:")
    lines.extend(f"    {name:<{width}}  {count:>6}" for name, count in sorted(by_name.items()))
    return "\n".join(lines)
