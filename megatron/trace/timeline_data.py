"""What the timeline draws: bars and lanes, read from the spans through the trace model.

Kept apart from the drawing (:mod:`megatron.trace.timeline_page`) so what a
bar *means* (which spans, which extents, what counts as wasted) is testable
without plotly. The trace model (shared with ``check`` and ``report``)
decides incarnations and how each ended; wasted progress is ``report``'s own
accounting; only the startup phases, which the model does not keep, are
gathered here (a handful per incarnation). Per-step spans are never kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from megatron.trace.goodput import build_report, rank_accounting
from megatron.trace.lanes import Lane, LaneIndex
from megatron.trace.model import Incarnation, SpanRecord, TraceBuilder
from megatron.trace.spans import SpanSource

__all__ = ["ENDED_TEXT", "Bar", "LaneSummary", "Timeline", "collect"]

ENDED_TEXT = {"shutdown": "shut down", "cut_short": "cut short", "killed": "killed"}
_LAUNCH = {"megatron.startup.launch_script", "megatron.startup.container_load"}
_SIMPLE = {
    "pre_startup": "queue",
    "megatron.startup": "startup",
    "megatron.train": "interval",
    "megatron.checkpoint.load": "checkpoint_load",
    "megatron.checkpoint.save": "checkpoint_save",
    "megatron.evaluate": "evaluation",
}
_MAX_ATTRIBUTES = 16


@dataclass
class Bar:
    """One drawn span (or derived stretch: a restart gap, wasted progress)."""

    lane: Lane
    category: str
    name: str
    start_ns: int
    end_ns: int
    text: str = ""
    details: list[str] = field(default_factory=list)


@dataclass
class LaneSummary:
    """What the page says about one lane beside its bars."""

    lane: Lane
    start_ns: int
    end_ns: int
    ended: str = "shutdown"  # the model's: shutdown, cut_short, killed
    cut_short: list[str] = field(default_factory=list)  # names of the spans cut short


@dataclass
class Timeline:
    """Everything the page draws, collected in one pass over the spans."""

    bars: list[Bar]
    lanes: list[LaneSummary]
    several_ranks: bool
    spans: int
    files: list[str]
    report: dict[str, Any] | None = None  # build_report's dict: the summary at the top

    @property
    def wall_ns(self) -> int:
        if not self.lanes:
            return 0
        return max(s.end_ns for s in self.lanes) - min(s.start_ns for s in self.lanes)


def collect(source: SpanSource, files: list[str] | None = None) -> Timeline:
    """Read the spans in one pass into the trace model, then into bars and lane summaries.

    The model (shared with ``check`` and ``report``) decides incarnations and
    how each ended; the startup phases, which it does not keep, are kept here
    (a handful per incarnation).
    """
    builder = TraceBuilder()
    phases = []
    for span in source():
        builder.add(span)
        if _category(span["name"]) == "startup_phase":
            phases.append(span)
    index = LaneIndex(builder.finish())
    trace = index.trace
    bars: list[Bar] = []
    summaries = []
    waste = {}  # the report's own accounting, per incarnation, with "resumed" added
    for incs in trace.ranks.values():
        per_incarnation = rank_accounting(incs)["per_incarnation"]
        for position, (inc, entry) in enumerate(zip(incs, per_incarnation, strict=True)):
            waste[id(inc)] = {**entry, "resumed": position + 1 < len(incs)}
    for inc in trace.incarnations:
        lane = index.lane_of_incarnation(inc)
        records = [*inc.pre_startup, *([inc.startup] if inc.startup else []), *inc.launch,
                   *inc.intervals, *inc.loads, *inc.saves, *inc.evaluations]  # fmt: skip
        for record in records:
            bars.append(_bar(lane, _category(record.name) or "other", _as_span(record)))
        if waste[id(inc)]["wasted_window_ns"] > 0:
            bars.append(_wasted_bar(lane, inc, waste[id(inc)]))
        summaries.append(
            LaneSummary(lane, inc.start_ns, inc.end_ns, inc.ended, [r.name for r in inc.cut_short])
        )
    for span in phases:
        bars.append(_bar(index.lane(span), "startup_phase", span))
    lanes = sorted(summaries, key=lambda s: (s.lane.incarnation, index.ranks.index(s.lane.rank)))
    bars.extend(_restart_gaps(lanes))
    report = build_report(trace) if trace.ranks else None
    return Timeline(bars, lanes, index.several_ranks, trace.span_count, list(files or []), report)


def _as_span(record: SpanRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "trace_id": record.trace_id,
        "span_id": record.span_id,
        "start_ns": record.start_ns,
        "end_ns": record.end_ns,
        "attributes": record.attributes,
    }


def _category(name: str) -> str | None:
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name in _LAUNCH:
        return "launch"
    if name.startswith("megatron.startup."):
        return "startup_phase"
    return None


def _bar(lane: Lane, category: str, span: dict[str, Any]) -> Bar:
    attributes = span["attributes"]
    text = ""
    details = []
    if category == "interval":
        index = attributes.get("megatron.interval.index")
        first = attributes.get("megatron.interval.first_iteration")
        last = attributes.get("megatron.interval.last_iteration")
        text = f"C{index} · {first}–{last}" if index is not None else ""
        if first is not None:
            details.append(f"iterations {first}–{last}")
    elif category == "startup_phase" or category == "launch":
        text = span["name"].removeprefix("megatron.startup.")
    elif "megatron.iteration" in attributes:
        details.append(f"at iteration {attributes['megatron.iteration']}")
    if span.get("status_code") == "ERROR":
        details.append(f"status ERROR {span.get('status_message', '')}".rstrip())
    for key, value in list(attributes.items())[:_MAX_ATTRIBUTES]:
        details.append(f"{key} = {value}")
    details.append(f"trace {span['trace_id'][:8]}… span {span['span_id']}")
    return Bar(lane, category, span["name"], span["start_ns"], span["end_ns"], text, details)


def _wasted_bar(lane: Lane, inc: Incarnation, waste: dict[str, Any]) -> Bar:
    """The incarnation's wasted progress, exactly as ``report`` counts it.

    From the first iteration past the last progress that survived (the
    iteration the next incarnation resumed from, or the last save of a final
    incarnation that did not shut down) to the incarnation's last span.
    """
    horizon, count = waste["horizon"], waste["wasted_iterations"]
    last = inc.last_iteration
    numbers = f"{horizon}–{last}" if last is not None and last >= horizon else f"{horizon}–"
    details = [f"{count} iterations ({numbers}) whose results were lost"]
    if inc.ended == "killed":
        details.append("killed: its interval in flight was never written (SIGKILL)")
    if waste["resumed"]:
        details.append(f"incarnation {inc.index + 1} resumed from iteration {horizon}")
    else:
        details.append(f"no later incarnation; the last checkpoint was at iteration {horizon}")
    text = f"wasted · {numbers}"
    return Bar(
        lane,
        "wasted",
        "wasted progress",
        inc.end_ns - waste["wasted_window_ns"],
        inc.end_ns,
        text,
        details,
    )


def _restart_gaps(lanes: list[LaneSummary]) -> Iterable[Bar]:
    """Between each rank's incarnation k and k+1: from the last span end to the next start."""
    previous: dict[int, LaneSummary] = {}
    for summary in lanes:
        before = previous.get(summary.lane.rank)
        previous[summary.lane.rank] = summary
        if before is not None and summary.start_ns > before.end_ns:
            yield Bar(
                summary.lane,
                "restart_gap",
                "restart gap",
                before.end_ns,
                summary.start_ns,
                "gap",
                [
                    f"from the last span of incarnation {before.lane.incarnation} "
                    f"({ENDED_TEXT.get(before.ended, before.ended)}) "
                    f"to the first of incarnation {summary.lane.incarnation}"
                ],
            )
