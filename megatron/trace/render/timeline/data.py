"""What the timeline draws: bars and lanes, read from the spans through the trace model.

Kept apart from the drawing (:mod:`megatron.trace.render.timeline.page`) so what a
bar *means* (which spans, which extents, what counts as wasted) is testable
without plotly. The trace model (shared with ``check`` and ``report``)
decides incarnations and how each ended; wasted progress is the goodput
accounting's own (:mod:`megatron.trace.analysis.goodput`, as ``report`` prints it);
a bar's category is its span's report category, named for the picture;
only the startup phases, which the model does not keep, are gathered here
(a handful per incarnation). Per-step spans are never kept, nor are the
bars: :class:`Bars` makes them from the model each time it is iterated; the
per-rank iteration times come from the model's compact arrays
(:mod:`megatron.trace.render.timeline.ranks`). A hang (the accounting's own,
:mod:`megatron.trace.analysis.hangs`) is a bar from the last progress to the end.
The goodput line over the lanes is ``report --window``'s windows (:class:`GoodputWindow`),
their width chosen from the wall clock (:func:`line_window_ns`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.trace.analysis.accounting import rank_accounting, wall_bounds_ns
from megatron.trace.analysis.goodput import build_report
from megatron.trace.analysis.hangs import Hang, find_hang
from megatron.trace.analysis.liveness import Clock, judge, utc_text
from megatron.trace.model.builder import load_trace
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.intervals import IntervalFacts
from megatron.trace.model.jobs import one_job
from megatron.trace.otlp.spans import FileSpans, reading
from megatron.trace.render.lanes import Lane, LaneIndex
from megatron.trace.render.timeline.ranks import RankSeries, rank_series
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    HANG_FRAME,
    HANG_LAST_ITERATION,
    HANG_STALLED_S,
    HANG_STALLED_SPAN,
    HANG_WAITING,
    ITERATION,
    SPAN_CATEGORY,
    STARTUP_PHASE_PREFIX,
    STARTUP_SPAN,
    Category,
)
from megatron.trace_format.words import counted

__all__ = [
    "BAR_INTERVAL",
    "BAR_IN_FLIGHT",
    "BAR_STARTUP_PHASE",
    "BAR_WASTED",
    "ENDED_TEXT",
    "Bar",
    "Bars",
    "GoodputWindow",
    "LaneSummary",
    "Timeline",
    "collect",
    "group_alike",
    "line_window_ns",
]

ENDED_TEXT = {
    "shutdown": "shut down",
    "cut_short": "cut short",
    "killed": "killed",
    "running": "running",
    "failed": "failed",
    "interrupted": "interrupted",
    "restarted": "restarted in process",
}
# A bar's category is its span's report category (semconv's CATEGORY_*), or
# one of these, the picture's own:
BAR_INTERVAL = "interval"  # a training interval: the report's goodput
BAR_STARTUP_PHASE = "startup_phase"  # a child of startup that is no launch span
BAR_WASTED = "wasted"  # the wasted progress, drawn over the intervals it lost
BAR_IN_FLIGHT = "in_flight"  # a running incarnation's open interval (or startup) so far
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
    ended: str = "shutdown"  # the model's ending (ENDED_TEXT's keys)
    cut_short: list[str] = field(default_factory=list)  # names of the spans cut short
    as_of_ns: int | None = None  # running: the newest record seen
    #: The other ranks this lane stands for: their lanes look the same (:func:`group_alike`)
    alike: list[str] = field(default_factory=list)


#: The goodput line's window widths, in seconds: the shortest that cuts the wall clock into
#: at most LINE_WINDOWS windows (and the longest when none does).
WINDOW_STEPS_S = tuple(
    [1, 2, 5, 10, 15, 30]
    + [60 * m for m in (1, 2, 5, 10, 15, 30)]
    + [3600 * h for h in (1, 2, 3, 6, 12, 24, 48)]
    + [86400 * d for d in (7, 14, 30)]
)
LINE_WINDOWS = 50


def line_window_ns(wall_ns: int) -> int:
    """The goodput line's window: a round width (1 s, 2 s, 5 s, ... 30 min, 1 h, ...) that
    cuts ``wall_ns`` into at most :data:`LINE_WINDOWS` windows."""
    for step in WINDOW_STEPS_S:
        if step * 1_000_000_000 * LINE_WINDOWS >= wall_ns:
            return step * 1_000_000_000
    return WINDOW_STEPS_S[-1] * 1_000_000_000


@dataclass(frozen=True)
class GoodputWindow:
    """One window of the job rank's wall clock as ``report --window`` accounts it: its
    entry in the report's ``windows`` (``goodput_fraction``, ``badput_s``, ``top_badput``,
    ...) and where it lies."""

    start_ns: int
    end_ns: int
    entry: dict[str, Any]


@dataclass
class Timeline:
    """Everything the page draws, collected in one pass over the spans."""

    bars: Bars  # iterable, again and again; not held in memory
    lanes: list[LaneSummary]  # the lanes drawn: one per group of alike ranks
    several_ranks: bool
    spans: int
    files: list[str]
    report: dict[str, Any] | None = None  # build_report's dict: the summary at the top
    series: list[RankSeries] = field(default_factory=list)  # the per-rank iteration panel
    windows: list[GoodputWindow] = field(default_factory=list)  # the goodput line
    #: Every lane, drawn or stood for by an alike rank's (what the header counts)
    all_lanes: list[LaneSummary] = field(default_factory=list)

    @property
    def wall_ns(self) -> int:
        if not self.lanes:
            return 0
        return max(s.end_ns for s in self.lanes) - min(s.start_ns for s in self.lanes)

    @property
    def ranks(self) -> int:
        return len({s.lane.rank for s in self.all_lanes or self.lanes})


def collect(
    source: FileSpans,
    files: list[str] | None = None,
    clock: Clock | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
    job: str | None = None,
) -> Timeline:
    """Read the spans in one pass into the trace model, then into bars and lane summaries.

    The model (shared with ``check`` and ``report``, read as they read it: in
    pieces, in ``jobs`` processes or on ``executor``) decides incarnations and how each ended,
    and :func:`~megatron.trace.analysis.liveness.judge` which are still running
    (against ``clock``, default the system clock; the heartbeat is read
    beside ``files``).
    """
    trace = one_job(_read(source, jobs, executor), job)
    liveness = judge(trace, [Path(f) for f in files or []], clock or Clock.system())
    index = LaneIndex(trace)
    summaries = [
        LaneSummary(
            index.lane_of_incarnation(inc),
            inc.start_ns,
            inc.end_ns,
            inc.ended,
            [r["name"] for r in inc.cut_short],
            inc.as_of_ns,
        )
        for inc in trace.incarnations
    ]
    lanes = sorted(summaries, key=lambda s: (s.lane.incarnation, index.ranks.index(s.lane.rank)))
    drawn = group_alike(trace, lanes)
    report, windows = None, []
    if trace.ranks:
        start, end = wall_bounds_ns(next(iter(trace.ranks.values())))  # the job rank's
        report = build_report(trace, liveness, window_ns=line_window_ns(end - start))
        windows = _goodput_windows(start, report.pop("windows")["entries"])  # type: ignore[misc]
        # the rest is report's own (without --window): its windows' bounds go with them
        bounds = report["bounds"]
        report["bounds"] = {p: b for p, b in bounds.items() if not p.startswith("windows.")}
    return Timeline(
        Bars(trace, index, lanes),
        drawn,
        index.several_ranks,
        trace.span_count,
        list(files or []),
        report,
        rank_series(trace),
        windows,
        lanes,
    )


#: Two ranks are drawn as one lane when every time of theirs agrees to within this share of
#: the wall clock: a pixel of a page 1,000 pixels wide, so the lanes would look the same.
ALIKE_SHARE = 1 / 1000


def _rank_shape(incs: list[Incarnation]) -> tuple[list[Any], list[int]]:
    """What a rank's lanes draw, as (everything but the times, the times in order)."""
    shape: list[Any] = []
    times: list[int] = []
    for inc in incs:
        shape.append((inc.ended, len(inc.iterations), [r["name"] for r in inc.cut_short]))
        # a hung rank and the ranks waiting for it are told apart (the culprit stands out)
        shape.append([bool(r["attributes"].get(HANG_WAITING)) for r in inc.hangs])
        times += [inc.start_ns, inc.end_ns]
        if inc.as_of_ns is not None:
            times.append(inc.as_of_ns)
        for records in (
            [inc.startup] if inc.startup is not None else [],
            inc.pre_startup, inc.launch, inc.startup_phases, inc.intervals, inc.saves,
            inc.loads, inc.evaluations, inc.hangs, inc.recoveries,
        ):  # fmt: skip
            shape.append([record["name"] for record in records])
            for record in records:
                times += [record["start_ns"], record["end_ns"]]
    return shape, times


def group_alike(trace: Trace, lanes: list[LaneSummary]) -> list[LaneSummary]:
    """The lanes to draw: of ranks whose lanes would look the same (the same incarnations,
    endings, spans drawn and iteration counts; every time within :data:`ALIKE_SHARE` of the
    wall clock) only the first rank's, its ``alike`` naming the others; in ``lanes``' order.

    A data-parallel job's ranks usually run in step: 64 such ranks are one lane, and the
    one that was killed, restarted or hung stands out as a lane of its own.
    """
    if len(trace.ranks) < 2 or not lanes:
        return lanes
    wall = max(s.end_ns for s in lanes) - min(s.start_ns for s in lanes)
    tolerance = max(int(wall * ALIKE_SHARE), 1)
    groups: list[tuple[str, list[Any], list[int], list[str]]] = []
    leader: dict[str, str] = {}
    for rank, incs in trace.ranks.items():
        shape, times = _rank_shape(incs)
        for first, their_shape, their_times, members in groups:
            if (
                shape == their_shape
                and len(times) == len(their_times)
                and all(abs(a - b) <= tolerance for a, b in zip(times, their_times, strict=True))
            ):
                members.append(rank)
                leader[rank] = first
                break
        else:
            groups.append((rank, shape, times, []))
            leader[rank] = rank
    members_of = {first: members for first, _, _, members in groups}
    drawn = []
    for summary in lanes:
        if leader[summary.lane.rank] == summary.lane.rank:
            summary.alike = list(members_of[summary.lane.rank])
            drawn.append(summary)
    return drawn


def _goodput_windows(start_ns: int, entries: list[Any]) -> list[GoodputWindow]:
    """The report's windows placed on the wall clock (each starts where the one before
    ended: their exact walls in ns add up from the job rank's start)."""
    windows = []
    for entry in entries:
        end_ns = start_ns + entry["accounting_ns"]["wall"]
        windows.append(GoodputWindow(start_ns, end_ns, dict(entry)))
        start_ns = end_ns
    return windows


class Bars:
    """The timeline's bars, made afresh from the trace model each time they are iterated.

    A week of a job that checkpoints often is hundreds of thousands of bars: held
    as a list, they were what made the timeline's memory grow with the file. The
    model keeps its records on disk (:mod:`megatron.trace._store.record_log`), so going
    through them again costs decoding them, not holding them; what is kept here
    is a few values per incarnation. In order: each incarnation's spans, its
    wasted progress, hang and open interval, then the startup phases, then the
    restart gaps.
    """

    def __init__(self, trace: Trace, index: LaneIndex, lanes: list[LaneSummary]) -> None:
        self._trace, self._index, self._lanes = trace, index, lanes
        # the report's own accounting, per incarnation, with "resumed" added
        self._waste: dict[int, dict[str, Any]] = {}
        for incs in trace.ranks.values():
            per_incarnation = rank_accounting(incs)["per_incarnation"]
            for position, (inc, entry) in enumerate(zip(incs, per_incarnation, strict=True)):
                self._waste[id(inc)] = {**entry, "resumed": position + 1 < len(incs)}

    def __iter__(self) -> Iterator[Bar]:
        index = self._index
        for inc in self._trace.incarnations:
            yield from self._incarnation(index.lane_of_incarnation(inc), inc)
        for inc in self._trace.incarnations:
            for span in inc.startup_phases:
                yield _bar(index.lane(span), BAR_STARTUP_PHASE, span)
        yield from _restart_gaps(self._lanes)

    def _incarnation(self, lane: Lane, inc: Incarnation) -> Iterator[Bar]:
        for record, interval in inc.records_with_facts():
            bar = _bar(lane, _category(record["name"]) or Category.OTHER, record, with_status=False)
            if interval is not None:
                _label_interval(bar, interval)
            yield bar
        waste = self._waste[id(inc)]
        if waste["wasted_window_ns"] > 0:
            yield _wasted_bar(lane, inc, waste)
        hang = find_hang(inc)
        if hang is not None:
            yield _hang_bar(lane, hang)
        if inc.in_flight is not None:
            yield _in_flight_bar(lane, inc.in_flight)


def _read(source: FileSpans, jobs: int | None, executor: Executor | None = None) -> Trace:
    """The trace model of the files, their errors as :class:`TraceInputError` (exit 2)."""
    with reading():
        return load_trace(source.paths, jobs, executor)


def _category(name: str) -> str | None:
    """The bar category of a span: its report category (goodput drawn as ``interval``)."""
    category = SPAN_CATEGORY.get(name)
    if category is not None:
        return BAR_INTERVAL if category == Category.GOODPUT else category
    if name.startswith(STARTUP_PHASE_PREFIX):
        return BAR_STARTUP_PHASE
    return None


def _bar(lane: Lane, category: str, span: SpanRecord, with_status: bool = True) -> Bar:
    """The span's bar. The structural spans' bars have never listed their status (the
    model used to keep no status), so ``with_status=False`` keeps them as they were."""
    attributes = span["attributes"]
    text = ""
    details = []
    if category in (BAR_STARTUP_PHASE, Category.LAUNCH):
        text = span["name"].removeprefix(STARTUP_PHASE_PREFIX)
    elif ITERATION in attributes:
        details.append(f"at iteration {attributes[ITERATION]}")
    if with_status and span.get("status_code") == "ERROR":
        details.append(f"status ERROR {span.get('status_message', '')}".rstrip())
    for key, value in list(attributes.items())[:_MAX_ATTRIBUTES]:
        details.append(f"{key} = {value}")
    details.append(f"trace {span['trace_id'][:8]}… span {span['span_id']}")
    return Bar(lane, category, span["name"], span["start_ns"], span["end_ns"], text, details)


def _label_interval(bar: Bar, facts: IntervalFacts) -> None:
    """``C2 · 200–299``: the interval's index and iterations (its attributes, else derived)."""
    first, last = facts.first_iteration, facts.last_iteration
    if first is None and last is None:
        bar.text = f"C{facts.index}"
        return
    numbers = f"{'?' if first is None else first}–{'?' if last is None else last}"
    bar.text = f"C{facts.index} · {numbers}"
    derived = " (derived from the spans inside)" if facts.derived else ""
    bar.details.insert(0, f"iterations {numbers}{derived}")


def _wasted_bar(lane: Lane, inc: Incarnation, waste: dict[str, Any]) -> Bar:
    """The incarnation's wasted progress, exactly as ``report`` counts it.

    From the first iteration past the last progress that survived (the
    iteration the next incarnation resumed from, or the last save of a final
    incarnation that did not shut down) to the incarnation's last span.
    """
    horizon, count = waste["horizon"], waste["wasted_iterations"]
    last = inc.last_iteration
    numbers = f"{horizon}–{last}" if last is not None and last >= horizon else f"{horizon}–"
    details = [f"{counted(count, 'iteration')} ({numbers}) whose results were lost"]
    if inc.ended == "killed":
        details.append("killed: its interval in flight was never written (SIGKILL)")
    if waste["resumed"]:
        details.append(f"incarnation {inc.index + 1} resumed from iteration {horizon}")
    else:
        details.append(f"no later incarnation; the last checkpoint was at iteration {horizon}")
    text = f"wasted · {numbers}"
    return Bar(
        lane,
        BAR_WASTED,
        "wasted progress",
        inc.end_ns - waste["wasted_window_ns"],
        inc.end_ns,
        text,
        details,
    )


def _in_flight_bar(lane: Lane, record: SpanRecord) -> Bar:
    """A running incarnation's open interval (or startup) since the last span it wrote."""
    what = "startup" if record["name"] == STARTUP_SPAN else "the open checkpoint interval"
    details = [
        f"running: {what}, not in the file yet",
        f"as of {utc_text(record['end_ns'])}, the newest record seen",
    ]
    return Bar(
        lane, BAR_IN_FLIGHT, "in flight", record["start_ns"], record["end_ns"], "in flight", details
    )


def _hang_bar(lane: Lane, hang: Hang) -> Bar:
    """From the last progress to the end of an incarnation that never recovered."""
    attributes = hang.record["attributes"]
    last = attributes.get(HANG_LAST_ITERATION)
    details = [
        f"no progress after iteration {'(none)' if last is None else last}; "
        f"iteration {attributes.get(ITERATION)} in flight",
        f"stalled in {attributes.get(HANG_STALLED_SPAN) or '?'}",
        f"at {attributes.get(HANG_FRAME, '?')}",
        "waiting for other ranks" if hang.waiting else "stopped in its own work: the culprit",
        f"reported by the watchdog after {attributes.get(HANG_STALLED_S)} s",
    ]
    return Bar(lane, Category.HANG, "hang", hang.start_ns, hang.end_ns, "hang", details)


def _restart_gaps(lanes: list[LaneSummary]) -> Iterable[Bar]:
    """Between each rank's incarnation k and k+1: from the last span end to the next start."""
    previous: dict[int, LaneSummary] = {}
    for summary in lanes:
        before = previous.get(summary.lane.rank)
        previous[summary.lane.rank] = summary
        if before is not None and summary.start_ns > before.end_ns:
            yield Bar(
                summary.lane,
                Category.RESTART_GAP,
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
