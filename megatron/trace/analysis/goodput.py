"""The goodput accounting: where the job's wall-clock time went (goodput and badput).

The figures ``megatron-trace report`` prints (:mod:`megatron.trace.cli.report`
formats them), the timeline's summary draws and the trainer's end-of-run
summary quotes, computed in one place so the three can never disagree.

Every nanosecond of a rank's wall clock (first ``pre_startup`` or
``megatron.startup`` start to last span end) is attributed to exactly one
category by a sweep over time: where spans of several categories overlap,
the first in ``PRECEDENCE`` wins; time no category covers is ``other``. So
``goodput + sum(badput) == wall`` holds exactly, in integer nanoseconds
(``accounting_ns`` in the JSON; the ``*_s`` figures are those divided by 1e9).

Categories: a structural span's time counts as the category
:data:`~megatron.trace_format.semconv.SPAN_CATEGORY` gives its name (an
interval's is goodput; the queue, launch, startup, checkpoint loads and
saves and evaluations are badput); outside any interval (Megatron-LM with
``save_interval`` 0 opens none) the training loop's root spans, iterations
and spans marked ``is_goodput_span``, are goodput too
(:attr:`~megatron.trace.model.incarnation.Incarnation.goodput_time`); Megatron-LM's
other checkpoint spans
(``exposed_save``, ``save.finalize``, ``exit_finalize``, the bookkeeping ones,
kept by the model as the union of the time they cover) count as
``checkpoint_save``; the wasted window (below) is
``wasted_progress``; the time between one incarnation's last span and the
next one's first is ``restart_gap``; a hang (an unrecovered stall the
watchdog recorded, :mod:`megatron.trace.analysis.hangs`), from the last progress to
the incarnation's end, is ``hang``, first of all.

Wasted progress: an incarnation's progress survives up to its *horizon*, the
iteration the next incarnation of the rank resumed from (its checkpoint
load, else its first iteration; 0 when it started afresh). A final
incarnation that shut down normally loses nothing, nor does one still
running (:mod:`megatron.trace.analysis.liveness`: its figures are as of its newest
record, its open interval so far counted as goodput); a final one that was
killed, cut short, failed or interrupted keeps only what its last durable checkpoint save
recorded (nothing, without one; an async save is durable once a finalize
after it ended). Interval iteration ranges come from the intervals' own
attributes or are derived (:mod:`megatron.trace.model.intervals`); a range that
cannot be derived makes the figures that need it not computed. Iterations
at or past the horizon are
``wasted_iterations``; the time from the start of the first of them (or the
interval boundary where it would have started) to the incarnation's end is
the wasted window.

Several ranks: each rank is accounted on its own (``ranks`` in the JSON);
the job-level figures are those of the lowest rank, since every rank lives
through the same lifecycle. Each rank's own work and its wait for the others
name the stragglers (:mod:`megatron.trace.analysis.stragglers`); ``hangs`` lists each
hung incarnation of each rank and whether that rank was the culprit.

Memory: :func:`~megatron.trace.model.builder.load_trace` streams; iteration
durations are kept in compact columns (on disk once there are many), and the
median, MAD, p90 and maximum are exact order statistics selected a radix
digit at a time over them, a part at a time
(:mod:`megatron.trace._store.selection`), so the report's memory does not
grow with the job's length.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron.trace._store.record_log import extents, latest
from megatron.trace._store.selection import float_keys, from_float_keys, select
from megatron.trace._store.stretches import Stretches
from megatron.trace.analysis.checkpoint_advice import checkpoint_advice
from megatron.trace.analysis.hangs import find_hang, hang_entries, recovered_stalls
from megatron.trace.analysis.liveness import Clock, Liveness, judge, utc_text
from megatron.trace.analysis.report import IterationStats, Report, WindowEntry
from megatron.trace.analysis.stragglers import find_stragglers
from megatron.trace.model.builder import load_trace
from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace_format.errors import NoSpansError, TraceInputError
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    CHECKPOINT_LOAD_SPAN,
    INTERVAL_SPAN,
    ITERATION_SPAN,
    SPAN_CATEGORY,
    STARTUP_SPAN,
    Category,
)

__all__ = [
    "ANOMALY_MAD_FACTOR",
    "ANOMALY_MAD_FLOOR",
    "ANOMALY_MAX_SHARE",
    "ANOMALY_RULE",
    "BADPUT_CATEGORIES",
    "MAX_WINDOWS",
    "PRECEDENCE",
    "TOP_BADPUT",
    "LiveAccounting",
    "build_report",
    "rank_accounting",
    "report_files",
    "window_cuts",
]

# Highest first. Checkpoint loads nest in startup, saves and evaluations in
# intervals, so the nested category must win over its parent's. A hang wins
# over everything: whatever span it stalled in (a save, an iteration whose
# progress is also wasted), that time was lost to the hang.
PRECEDENCE = (
    Category.HANG,
    Category.CHECKPOINT_LOAD,
    Category.CHECKPOINT_SAVE,
    Category.EVALUATION,
    Category.LAUNCH,
    Category.QUEUE,
    Category.STARTUP,
    Category.WASTED_PROGRESS,
    Category.GOODPUT,
    Category.RESTART_GAP,
)
#: k of the anomaly rule: an iteration is anomalous when it took longer than
#: median + k * MAD of the iteration durations (ml-goodput-measurement's k).
ANOMALY_MAD_FACTOR = 3.0
#: The MAD is floored at this share of the median, so nothing within 45 % of the
#: median is anomalous: a steady run's jitter (lognormal, sigma 0.1: 95 % of the
#: iterations within 20 % of the median, as on a busy machine) flags none (the 1 %
#: floor flagged two of 60), while a 1.5 x slowdown is still found.
ANOMALY_MAD_FLOOR = 0.15
#: More iterations than this share of them (and more than one) over the threshold are
#: not anomalies but the run's own spread (a machine so loaded its iterations vary
#: several-fold, or a lasting slowdown): the count is then not computed.
ANOMALY_MAX_SHARE = 0.1
ANOMALY_RULE = (
    f"duration > median + {ANOMALY_MAD_FACTOR:g} x MAD "
    f"(median absolute deviation of the iteration durations, at least "
    f"{100 * ANOMALY_MAD_FLOOR:g} % of the median); not computed when over "
    f"{100 * ANOMALY_MAX_SHARE:g} % of the iterations (and more than one) are over it"
)
_LISTED_ANOMALIES = 20
#: ``report --window`` cuts the wall clock into at most this many windows.
MAX_WINDOWS = 100_000
#: The badput categories a window names (the largest first, time > 0).
TOP_BADPUT = 3


def _seconds(ns: int) -> float:
    return round(ns / 1e9, 9)


def _read_segments(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """(start, end, category) of structural spans as read, from their extents."""
    return [(start, end, SPAN_CATEGORY[name]) for start, end, name in spans]


def _worked_segments(inc: Incarnation) -> list[tuple[int, int, str]]:
    """The segments of the incarnation worked out rather than read from a span: a running
    one's open interval (or startup) so far, and its hang."""
    segments = _read_segments(extents([inc.in_flight] if inc.in_flight is not None else []))
    hang = find_hang(inc)
    if hang is not None:
        segments.append((hang.start_ns, hang.end_ns, Category.HANG))
    return segments


def _resumed_at(later: list[Incarnation]) -> int | None:
    """The iteration the first of the ``later`` incarnations that shows one resumed from
    (its checkpoint load, else its first iteration); None: none shows one."""
    for successor in later:
        resumed = successor.resumed_from
        if resumed is None:
            resumed = successor.first_iteration
        if resumed is not None:
            return resumed
    return None


def _horizon(inc: Incarnation, later: list[Incarnation]) -> int | None:
    """The first iteration whose progress this incarnation lost (None: nothing lost)."""
    resumed = _resumed_at(later)
    if resumed is not None:
        return resumed
    if inc.ended in ("shutdown", "running"):
        return None
    saved = inc.durable_saves()
    if saved:
        return max(saved)
    return inc.first_iteration if inc.first_iteration is not None else 0


def _wasted(inc: Incarnation, horizon: int | None) -> tuple[int | None, int | None, bool]:
    """(window start ns, wasted iterations, exact?) for one incarnation."""
    if horizon is None:
        return None, 0, True
    start = inc.iterations.start_of(horizon) if inc.iterations else None
    if start is None:
        # the interval boundary where iteration `horizon` began (or would have)
        before = [
            r["end_ns"]
            for r, facts in zip(inc.intervals, inc.interval_facts, strict=True)
            if facts.last_iteration is not None and facts.last_iteration < horizon
        ]
        if before:
            start = max(before)
        elif inc.intervals:
            start = inc.intervals[0]["start_ns"]
        elif inc.iterations and inc.iterations.end_before(horizon) is not None:
            # no interval (Megatron-LM without checkpointing): where the last iteration
            # before the horizon ended
            start = inc.iterations.end_before(horizon)
        elif inc.startup is not None:
            start = inc.startup["end_ns"]
    if inc.iterations:
        return start, inc.iterations.count_from(horizon), True
    last = inc.last_iteration
    first = inc.first_iteration if inc.first_iteration is not None else horizon
    count = max(0, (last if last is not None else horizon - 1) + 1 - max(horizon, first))
    # without per-iteration spans a killed in-flight interval's iterations are unknown,
    # and so is any range the intervals could not give (see megatron.trace.model.intervals)
    known = last is not None and all(
        f.first_iteration is not None and f.last_iteration is not None for f in inc.interval_facts
    )
    return start, count, inc.ended != "killed" and known


def _stretch_events(
    stretches: Stretches, index: int, lo: int, hi: int
) -> Iterator[tuple[int, int, int]]:
    """A disjoint, sorted union's sweep events, in order, without materialising them (from
    the first stretch that ends past ``lo``: the sweep of a late window reads no more)."""
    starts, ends = stretches.starts, stretches.ends
    for at in range(bisect.bisect_right(ends, lo), len(starts)):
        start, end = max(starts[at], lo), min(ends[at], hi)
        if start >= hi:
            return
        if end > start:
            yield (start, 1, index)
            yield (end, -1, index)


def _sweep(
    segments: list[tuple[int, int, str]],
    wall: tuple[int, int],
    stretches: Iterable[tuple[Stretches, str]] = (),
    cuts: Sequence[int] = (),
) -> list[dict[str, int]]:
    """Nanoseconds per category; the highest-precedence covering category wins.

    ``stretches`` are disjoint sorted unions (Megatron-LM writes some spans on
    every loop pass, so possibly many): merged into the sweep as streams, not
    sorted with the rest. ``cuts`` (sorted, inside the wall clock) split it
    into windows: one dict per window, ``len(cuts) + 1`` of them, each
    stretch of time counted in the window it falls in (cut where it crosses
    one), so the windows add up to the whole exactly.
    """
    rank = {category: i for i, category in enumerate(PRECEDENCE)}
    events: list[tuple[int, int, int]] = []
    lo, hi = wall
    for start, end, category in segments:
        start, end = max(start, lo), min(end, hi)
        if end > start:
            events.append((start, 1, rank[category]))
            events.append((end, -1, rank[category]))
    events.sort()
    streams = [_stretch_events(s, rank[category], lo, hi) for s, category in stretches if s]
    boxes = [dict.fromkeys((*PRECEDENCE, Category.OTHER), 0) for _ in range(len(cuts) + 1)]
    totals = boxes[0]
    # the next cut, past every time when there is none (one comparison an event)
    upcoming = iter([*cuts, hi + 1])
    cut = next(upcoming)
    box = 0
    # The winner is the lowest category index covering the time: with bit i of `covered`
    # set while category i is active, that is its lowest set bit (a scan of the
    # categories at every event was half of a many-interval report's time).
    winners = (Category.OTHER, *PRECEDENCE)  # by (lowest set bit).bit_length()
    active = [0] * len(PRECEDENCE)
    covered = 0
    cursor = lo
    for time, delta, index in heapq.merge(events, *streams) if streams else events:
        if time > cursor:
            winner = winners[(covered & -covered).bit_length()]
            while time > cut:  # a window ends inside (cursor, time]: cut there
                totals[winner] += cut - cursor
                cursor, box = cut, box + 1
                totals, cut = boxes[box], next(upcoming)
            totals[winner] += time - cursor
            cursor = time
        count = active[index] = active[index] + delta
        if count:
            covered |= 1 << index
        else:
            covered &= ~(1 << index)
    while hi > cut:
        totals[Category.OTHER] += cut - cursor
        cursor, box = cut, box + 1
        totals, cut = boxes[box], next(upcoming)
    totals[Category.OTHER] += hi - cursor
    return boxes


def _wall_start(inc: Incarnation) -> int:
    """Where an incarnation's wall clock starts: its queue or startup, else its first span."""
    records = [*extents(inc.pre_startup), *extents([inc.startup] if inc.startup else [])]
    return min(start for start, _, _ in records) if records else inc.start_ns


def wall_bounds_ns(incs: list[Incarnation]) -> tuple[int, int]:
    """(start, end) of one rank's wall clock, the accounting's: its windows start there."""
    start = min(_wall_start(inc) for inc in incs)
    return start, max(max(inc.end_ns for inc in incs), start)


def window_cuts(start_ns: int, end_ns: int, window_ns: int) -> list[int]:
    """Where windows of ``window_ns`` from ``start_ns`` end inside ``(start_ns, end_ns)``."""
    if window_ns <= 0:
        raise TraceInputError(f"a window must be longer than 0 ns, got {window_ns}")
    count = max(0, -(-(end_ns - start_ns) // window_ns) - 1)  # windows, less the last
    if count >= MAX_WINDOWS:
        raise TraceInputError(
            f"--window {window_ns / 1e9:g} s cuts the {(end_ns - start_ns) / 1e9:g} s wall "
            f"clock into {count + 1} windows, over {MAX_WINDOWS}: choose a longer window"
        )
    return [start_ns + window_ns * (k + 1) for k in range(count)]


def rank_accounting(incs: list[Incarnation], window_ns: int | None = None) -> dict[str, Any]:
    """The accounting of one rank's incarnations (in time order).

    Returns ``{"wall_ns", "start_ns", "totals_ns": {category: ns, "goodput": ns},
    "wasted_iterations": int, "wasted_exact": bool, "per_incarnation":
    [{"horizon", "wasted_iterations", "wasted_window_ns"}]}``; with ``window_ns``
    also ``"windows_ns"``: ``[(start, end, totals_ns)]``, the wall clock cut
    every ``window_ns`` from its start (the last window ends with it), whose
    totals add up to ``totals_ns`` exactly.
    """
    start, end = wall_bounds_ns(incs)
    worked, waste = _worked_out(incs, _waste)
    segments = [seg for inc in incs for seg in _read_segments(inc.extents())] + worked
    cuts = window_cuts(start, end, window_ns) if window_ns is not None else []
    boxes = _sweep(segments, (start, end), _stretches(incs), cuts)
    totals = boxes[0]
    if cuts:
        totals = {key: sum(box[key] for box in boxes) for key in totals}
    windowed = {}
    if window_ns is not None:
        bounds = [start, *cuts, end]
        windowed["windows_ns"] = [
            (lo, hi, box) for lo, hi, box in zip(bounds[:-1], bounds[1:], boxes, strict=True)
        ]
    return {**windowed, **_accounting(start, end, totals, incs, waste)}


# What _waste gives of one incarnation: its horizon, and _wasted's (window start,
# wasted iterations, exact?) at that horizon.
_Waste = tuple[int | None, tuple[int | None, int | None, bool]]


def _waste(inc: Incarnation, later: list[Incarnation]) -> _Waste:
    """The progress ``inc`` lost: its horizon (the incarnations ``later`` of its rank tell
    where the next resumed) and what :func:`_wasted` makes of it."""
    horizon = _horizon(inc, later)
    return horizon, _wasted(inc, horizon)


def _worked_out(
    incs: list[Incarnation], waste: Callable[[Incarnation, list[Incarnation]], _Waste]
) -> tuple[list[tuple[int, int, str]], list[_Waste]]:
    """The rank's segments worked out rather than read (each incarnation's in-flight
    stretch and hang, its wasted window, the restart gaps), and what ``waste`` (a
    :func:`_waste`) gave of each incarnation."""
    segments: list[tuple[int, int, str]] = []
    wastes = []
    for position, inc in enumerate(incs):
        segments.extend(_worked_segments(inc))
        found = waste(inc, incs[position + 1 :])
        window_start = found[1][0]
        if window_start is not None and inc.end_ns > window_start:
            segments.append((window_start, inc.end_ns, Category.WASTED_PROGRESS))
        if position + 1 < len(incs):
            segments.append((inc.end_ns, incs[position + 1].start_ns, Category.RESTART_GAP))
        wastes.append(found)
    return segments, wastes


def _stretches(incs: list[Incarnation]) -> list[tuple[Stretches, str]]:
    """The rank's unions of frequent spans' time, each with its category."""
    stretches = [(inc.checkpoint_time, Category.CHECKPOINT_SAVE) for inc in incs]
    # the training loop's time outside any interval (Megatron-LM without checkpointing)
    return stretches + [(inc.goodput_time, Category.GOODPUT) for inc in incs]


def _accounting(
    start: int, end: int, totals: dict[str, int], incs: list[Incarnation], wastes: list[_Waste]
) -> dict[str, Any]:
    """:func:`rank_accounting`'s answer (but the windows) from the sweep's totals and
    each incarnation's waste."""
    per_incarnation = []
    wasted_total, exact = 0, True
    for inc, (horizon, (window_start, count, count_exact)) in zip(incs, wastes, strict=True):
        wasted_total += count or 0
        exact = exact and count_exact
        per_incarnation.append(
            {
                "horizon": horizon,
                "wasted_iterations": count,
                "wasted_window_ns": max(0, inc.end_ns - window_start)
                if window_start is not None
                else 0,
            }
        )
    return {
        "start_ns": start,
        "wall_ns": end - start,
        "totals_ns": totals,
        "wasted_iterations": wasted_total,
        "wasted_exact": exact,
        "per_incarnation": per_incarnation,
    }


@dataclass
class _Kept:
    """What :class:`LiveAccounting` keeps of the time before ``cut`` (see there)."""

    generation: int  # the trace's it was worked out at
    start: int  # the rank's wall clock started here
    cut: int
    before: dict[str, int]  # the sweep's totals over [start, cut)
    worked: list[tuple[int, int, str]]  # the worked-out segments, clipped to [start, cut)
    spanning: list[tuple[int, int, str]]  # the read segments that start before cut, end after


class LiveAccounting:
    """:func:`rank_accounting` of one rank (without windows) again and again as its trace
    grows (``watch`` asks at every scrape), at the cost of what changed since the last
    time rather than of the rank's history.

    The accounting is a sweep over the rank's wall clock, and a sweep cut at a time
    ``cut`` gives the time before it and after it apart, adding up to the whole exactly
    (as ``report --window``'s windows do). So the totals before ``cut`` are kept, and
    only what lies after it is swept again, for as long as nothing that decides the
    time before it has changed: no span added to the rank's processes since starts
    before it (:attr:`~megatron.trace.model.incarnation.Trace.touched`), the wall clock
    starts where it did and ends past it, and the segments worked out rather than
    read (a running incarnation's open interval, a hang, a wasted window, a restart
    gap) cover the same time before it. Otherwise everything is swept again, and
    ``cut`` moves to where the rank's trace may still change: the end of its last
    incarnation's newest interval, where what is in flight began. An incarnation's
    horizon and wasted iterations are kept while its revision and ending are the same.
    """

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._wastes: dict[tuple[Any, ...], _Waste] = {}

    def __call__(self, incs: list[Incarnation], trace: Trace) -> dict[str, Any]:
        """The accounting of ``incs``, the rank's incarnations in ``trace`` (its builder's
        latest finish; the one before was the previous call's)."""
        start, end = wall_bounds_ns(incs)
        wastes: dict[tuple[Any, ...], _Waste] = {}
        worked, waste = _worked_out(incs, lambda inc, later: self._waste(inc, later, wastes))
        self._wastes = wastes
        stretches = _stretches(incs)
        cut = _settled_ns(incs, start, end)
        kept = self._kept
        touched = [trace.touched[inc.process] for inc in incs if inc.process in trace.touched]
        if (
            kept is None
            or trace.generation != kept.generation + 1
            or start != kept.start
            or end < kept.cut
            or min(touched, default=kept.cut) < kept.cut
            or _clipped(worked, start, kept.cut) != kept.worked
        ):
            read = [seg for inc in incs for seg in _read_segments(inc.extents())]
            before, after = _swept(read + worked, start, end, stretches, cut)
            kept = _Kept(trace.generation, start, cut, before, [], [])
        else:
            read = [*kept.spanning]
            for inc in incs:
                if inc.end_ns >= kept.cut:  # (its records all end by its end)
                    read += _read_segments(inc.extents_from(kept.cut))
            cut = max(cut, kept.cut)
            more, after = _swept(read + worked, kept.cut, end, stretches, cut)
            kept.before = {key: ns + more[key] for key, ns in kept.before.items()}
            kept.generation, kept.cut = trace.generation, cut
        kept.worked = _clipped(worked, start, cut)
        kept.spanning = [seg for seg in read if seg[0] < cut < seg[1]]
        self._kept = kept
        totals = {key: ns + after[key] for key, ns in kept.before.items()}
        return _accounting(start, end, totals, incs, waste)

    def _waste(
        self, inc: Incarnation, later: list[Incarnation], wastes: dict[tuple[Any, ...], _Waste]
    ) -> _Waste:
        """:func:`_waste`, kept by what it depends on: the incarnation's revision and
        ending, and where the next incarnation resumed."""
        if inc.revision is None:
            return _waste(inc, later)
        resumed = _resumed_at(later)
        key = (inc.revision, inc.ended, inc.last_closed_by_reroot, resumed)
        found = self._wastes.get(key)
        if found is None:
            found = _waste(inc, later)
        wastes[key] = found
        return found


def _settled_ns(incs: list[Incarnation], start: int, end: int) -> int:
    """Where the rank's trace may still change from (:class:`LiveAccounting`): the end of
    its last incarnation's newest interval (what is in flight began there); without one,
    where its training loop's latest span outside intervals, or its startup, ended."""
    last = incs[-1]
    newest = latest(last.intervals)
    if newest is not None:
        at = newest["end_ns"]
    elif last.goodput_time:
        at = last.goodput_time.ends[-1]
    elif last.startup is not None:
        at = last.startup["end_ns"]
    else:
        at = start
    return min(max(at, start), end)


def _clipped(segments: list[tuple[int, int, str]], lo: int, hi: int) -> list[tuple[int, int, str]]:
    """The segments' parts inside ``[lo, hi)``, in order."""
    parts = [(max(s, lo), min(e, hi), category) for s, e, category in segments]
    return sorted(part for part in parts if part[1] > part[0])


def _swept(
    segments: list[tuple[int, int, str]],
    lo: int,
    hi: int,
    stretches: list[tuple[Stretches, str]],
    cut: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """:func:`_sweep`'s totals over ``[lo, cut)`` and ``[cut, hi]`` (``lo <= cut <= hi``)."""
    if lo < cut < hi:
        before, after = _sweep(segments, (lo, hi), stretches, [cut])
        return before, after
    (totals,) = _sweep(segments, (lo, hi), stretches)
    empty = dict.fromkeys(totals, 0)
    return (totals, empty) if cut >= hi else (empty, totals)


#: From this many iterations on, their statistics are selected with numpy over the
#: columns a part at a time (:mod:`megatron.trace._store.selection`: flat in memory); below
#: it, taken from a sorted list (32 bytes an iteration), which costs less than
#: importing numpy (a tenth of a small report). Both give the same.
def _duration_parts(incs: list[Incarnation]) -> Iterator[tuple[Incarnation, Any, Any]]:
    """(incarnation, numbers, durations in ns) of every iteration, a part of the columns at
    a time (the durations an int64 numpy array)."""
    for inc in incs:
        for part in inc.iterations.parts():
            yield inc, part.numbers, part.durations()


def _in_ms(ns: Any) -> Any:
    """Durations in ns as float64 ms, each as ``(end - start) / 1e6`` gives it (a new
    array): what the figures are made of, with numpy or without."""
    import numpy as np

    ms = ns.astype(np.float64)
    ms /= 1e6
    return ms


def _sorted_figures(incs: list[Incarnation], count: int) -> tuple[float, float, float, float]:
    """(median, MAD, p90, max) of every iteration's duration (ms), as a sort of them all
    would give them, by selection over the columns a part at a time
    (:mod:`megatron.trace._store.selection`): flat in memory however long the job."""
    import numpy as np

    def durations() -> Iterator[Any]:
        return (ns for _, _, ns in _duration_parts(incs))

    middle = count // 2
    halves = [middle] if count % 2 else [middle - 1, middle]
    p90_rank = max(0, math.ceil(0.9 * count) - 1)  # nearest rank
    *median_ns, p90_ns, longest_ns = select(durations, [*halves, p90_rank, count - 1])
    # ns -> ms as the figures always were: each value / 1e6, then the mean of the halves
    median = sum(ns / 1e6 for ns in median_ns) / len(median_ns)

    def deviations() -> Iterator[Any]:  # |duration - median|, the MAD's values (ms)
        for ns in durations():
            ms = _in_ms(ns)
            ms -= median
            yield float_keys(np.abs(ms, out=ms))

    mad_halves = from_float_keys(select(deviations, halves))
    return median, sum(mad_halves) / len(mad_halves), p90_ns / 1e6, longest_ns / 1e6


def _slowest_of(incs: list[Incarnation], threshold: float) -> tuple[int, list[tuple]]:
    """How many iterations last over ``threshold`` ms, and the longest of them as
    (duration ms, incarnation index, iteration), longest first."""
    import numpy as np

    count, slowest = 0, []
    for inc, numbers, ns in _duration_parts(incs):
        ms = _in_ms(ns)
        over = np.flatnonzero(ms > threshold).tolist()
        count += len(over)
        found = [(float(ms[at]), inc.index, numbers[at]) for at in over]
        slowest = heapq.nlargest(_LISTED_ANOMALIES, [*slowest, *found])
    return count, slowest


def _iteration_stats(incs: list[Incarnation]) -> IterationStats | None:
    """The iteration figures of ``incs``: exact order statistics selected over the columns a
    part at a time (:func:`_sorted_figures`), then the anomalies against them."""
    count = sum(len(inc.iterations) for inc in incs)
    if not count:
        return None
    median, mad, p90, longest = _sorted_figures(incs, count)
    mad = max(mad, ANOMALY_MAD_FLOOR * median)
    threshold = median + ANOMALY_MAD_FACTOR * mad
    slow_count, slow = _slowest_of(incs, threshold)
    steady = slow_count <= max(1, ANOMALY_MAX_SHARE * count)
    return {
        "count": count,
        "median_ms": round(median, 3),
        "p90_ms": round(float(p90), 3),
        "max_ms": round(float(longest), 3),
        "anomalous": {
            "rule": ANOMALY_RULE,
            "mad_ms": round(mad, 3),
            "threshold_ms": round(threshold, 3),
            "count": slow_count if steady else None,
            "slowest": [
                {"incarnation": index, "iteration": number, "duration_ms": round(dur, 3)}
                for dur, index, number in slow[:_LISTED_ANOMALIES]
            ]
            if steady
            else [],
        },
    }


def _incarnation_entry(inc: Incarnation, wall_start: int, waste: dict[str, Any]) -> dict:
    startup = inc.startup
    return {
        "rank": rank_value(inc.rank),
        "index": inc.index,
        "ended": inc.ended,
        "error_type": inc.error_type,
        "first_iteration": inc.first_iteration,
        "last_iteration": inc.last_iteration,
        "resumed_from": inc.resumed_from,
        "startup_s": _seconds(startup["end_ns"] - startup["start_ns"]) if startup else None,
        "intervals": len(inc.intervals),
        "start_s": _seconds(inc.start_ns - wall_start),
        "duration_s": _seconds(inc.end_ns - inc.start_ns),
        "wasted_iterations": waste["wasted_iterations"],
        "wasted_s": _seconds(waste["wasted_window_ns"]),
        "as_of": utc_text(inc.as_of_ns) if inc.as_of_ns is not None else None,
        "in_flight_s": _seconds(inc.in_flight["end_ns"] - inc.in_flight["start_ns"])
        if inc.in_flight is not None
        else 0.0,
    }


def _loop_unrecorded(inc: Incarnation) -> bool:
    """Whether the incarnation went past its startup but no span covers its training loop:
    no interval (Megatron-LM without checkpointing) and no iteration span."""
    if inc.intervals or inc.goodput_time or inc.in_flight is not None or inc.startup is None:
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
    """The goodput report as one JSON-able dict: a :class:`~megatron.trace.analysis.report.Report`
    (its JSON Schema is ``report.schema.json``); see the module docstring.

    Keys: ``wall_s``, ``goodput_s``, ``goodput_fraction``, ``badput_s``
    (category -> s), ``accounting_ns`` (the same in exact integer ns, with
    ``wall`` and ``goodput``), ``wasted_iterations`` (int, or None when
    unknown), ``incarnations`` (list of dicts: ``rank``, ``index``, ``ended``,
    ``error_type``,
    ``first_iteration``, ``last_iteration``, ``resumed_from``, ``startup_s``,
    ``intervals``, ``start_s``, ``duration_s``, ``wasted_iterations``,
    ``wasted_s``), ``iterations`` (``count``, ``median_ms``, ``p90_ms``,
    ``max_ms``, ``anomalous``; None without per-iteration spans), ``rank``
    (the rank the job figures come from), ``ranks`` (per-rank summaries),
    ``spans``, ``torn_lines``, ``not_computed`` (figures the trace could not
    give, with the reason); ``running`` (whether the job rank's last
    incarnation is still running) and ``as_of`` (then: the time of its newest
    record, which the figures are as of); with ``liveness``
    (:func:`megatron.trace.analysis.liveness.judge` applied to ``trace``) also
    ``as_of_age_s`` and ``liveness`` (``rule``, ``now``, ``stale_after_s``,
    ``heartbeat_files``, ``notes``);
    ``stragglers`` (``rule``, ``ranks``: the ranks
    flagged; None when not computed) and ``straggler_s`` (see
    :mod:`~megatron.trace.analysis.stragglers`; each ``ranks`` entry adds
    ``work_ms_median``, ``wait_ms_median``, ``score`` and ``straggler``);
    ``hangs`` (per hung incarnation and rank: ``rank``, ``incarnation``,
    ``ended``, ``last_iteration``, ``iteration``, ``span``, ``frame``,
    ``stalled_s``, ``detected_after_s``, ``waiting``, ``culprit``) and
    ``recovered_stalls`` (``rank``, ``incarnation``, ``iteration``,
    ``stalled_s``). A badput
    category named in ``not_computed`` is None in ``badput_s``
    (``checkpoint_load`` of a resume without load spans); its time is in
    another category of ``accounting_ns``, which still adds up. With
    ``window_ns``, also ``windows`` (``window_s``, ``entries``): the job
    rank's accounting per window of its wall clock (:func:`_window_entries`).
    ``checkpoint_advice``: how often to checkpoint
    (:mod:`~megatron.trace.analysis.checkpoint_advice`; ``mtbf_s``, ``--mtbf``,
    stands in for the observed mean time between failures).
    """
    not_computed: list[str] = []
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
    iterations = _iteration_stats(incs)
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
    stragglers = find_stragglers(trace)
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
                f"{Category.GOODPUT}: incarnations {uncovered} have no {INTERVAL_SPAN} interval "
                f"(save_interval 0) and no {ITERATION_SPAN} spans (the step span group is off): "
                "their training loop's time is other"
            )
    if _loads_unrecorded(incs):
        not_computed.append(
            f"{Category.CHECKPOINT_LOAD}: an incarnation resumed past iteration 0 but the trace "
            f"holds no {CHECKPOINT_LOAD_SPAN} span (the load_checkpoint span group is off, as in "
            "the default groups); its load time is counted in startup"
        )
    if not accounting["wasted_exact"]:
        not_computed.append(
            "wasted_iterations: a killed incarnation's in-flight interval is missing and there "
            "are no per-iteration spans, or an interval's iteration range is not known, so the "
            "figure is a lower bound"
        )
    not_computed_categories = {reason.split(":")[0] for reason in not_computed}
    report: Report = {
        "wall_s": _seconds(wall),
        "goodput_s": _seconds(totals[Category.GOODPUT]),
        "goodput_fraction": round(totals[Category.GOODPUT] / wall, 6) if wall else 0.0,
        "badput_s": {
            category: None if category in not_computed_categories else _seconds(totals[category])
            for category in BADPUT_CATEGORIES
        },
        "accounting_ns": {
            "wall": wall,
            Category.GOODPUT: totals[Category.GOODPUT],
            **{category: totals[category] for category in BADPUT_CATEGORIES},
        },
        "wasted_iterations": accounting["wasted_iterations"],
        "incarnations": [
            _incarnation_entry(inc, accounting["start_ns"], waste)
            for inc, waste in zip(incs, accounting["per_incarnation"], strict=True)
        ],
        "iterations": iterations,
        "rank": rank_value(job_rank),
        "ranks": [
            {
                "rank": rank_value(rank),
                "wall_s": _seconds(acc["wall_ns"]),
                "goodput_s": _seconds(acc["totals_ns"][Category.GOODPUT]),
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
    report["checkpoint_advice"] = checkpoint_advice(
        incs,
        report["incarnations"],  # type: ignore[arg-type]
        iterations["median_ms"] if iterations is not None else None,
        mtbf_s,
    )
    if window_ns is not None:
        windows = accounting["windows_ns"]
        report["windows"] = {
            "window_s": _seconds(window_ns),
            "entries": _window_entries(
                windows, not_computed_categories, _window_iterations(incs, windows)
            ),
        }
    return report


def _window_iterations(
    incs: list[Incarnation], windows: list[tuple[int, int, dict[str, int]]]
) -> list[tuple[int, int]] | None:
    """(iterations that ended in it, the sum of their durations in ns) per window, a part of
    the columns at a time (None without iteration spans). An iteration ending on a cut is
    the earlier window's."""
    if not any(inc.iterations for inc in incs):
        return None
    import numpy as np

    cuts = np.array([end for _, end, _ in windows[:-1]], dtype=np.int64)
    counts = np.zeros(len(windows), dtype=np.int64)
    sums = np.zeros(len(windows), dtype=np.float64)
    for inc in incs:
        for part in inc.iterations.parts():
            where = np.searchsorted(cuts, np.frombuffer(part.ends, dtype=np.int64), "left")
            counts += np.bincount(where, minlength=len(windows))
            sums += np.bincount(where, weights=part.durations(), minlength=len(windows))
    return [(int(count), int(total)) for count, total in zip(counts, sums, strict=True)]


def _window_entries(
    windows: list[tuple[int, int, dict[str, int]]],
    not_computed: set[str],
    iterations: list[tuple[int, int]] | None,
) -> list[WindowEntry]:
    """Each window's accounting, as the whole report's (a category not computed for the
    whole is None in each window's ``badput_s``, its time still in ``accounting_ns``), its
    largest badput categories, ``top_badput``, and the iterations that ended in it (their
    count and mean duration: a slowdown shows there, as slower iterations are still
    goodput)."""
    first = windows[0][0]
    entries: list[WindowEntry] = []
    for index, (start, end, totals) in enumerate(windows):
        count, total_ns = iterations[index] if iterations is not None else (None, 0)
        wall = end - start
        largest = sorted(
            (c for c in BADPUT_CATEGORIES if totals[c] and c not in not_computed),
            key=lambda c: -totals[c],
        )
        entries.append(
            {
                "index": index,
                "start": utc_text(start),
                "start_s": _seconds(start - first),
                "end_s": _seconds(end - first),
                "wall_s": _seconds(wall),
                "goodput_s": _seconds(totals[Category.GOODPUT]),
                "goodput_fraction": round(totals[Category.GOODPUT] / wall, 6) if wall else 0.0,
                "badput_s": {
                    c: None if c in not_computed else _seconds(totals[c]) for c in BADPUT_CATEGORIES
                },
                "accounting_ns": {
                    "wall": wall,
                    Category.GOODPUT: totals[Category.GOODPUT],
                    **{c: totals[c] for c in BADPUT_CATEGORIES},
                },
                "top_badput": largest[:TOP_BADPUT],
                "iterations": count,
                "iteration_mean_ms": round(total_ns / count / 1e6, 3) if count else None,
            }
        )
    return entries


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
            entry["as_of_age_s"] = _seconds(clock.now_ns - last.as_of_ns)
    return entry


def report_files(
    paths: Iterable[Path | str], clock: Clock | None = None, jobs: int | None = None
) -> Report:
    """Stream the files (several in ``jobs`` parallel processes) and build the report.

    Raises ``TraceFileDamaged`` on damage. Whether the job is still running
    is judged against ``clock`` (default: the system clock and the default
    staleness bound).
    """
    paths = list(paths)
    trace = load_trace(paths, jobs)
    liveness = judge(trace, paths, clock or Clock.system())
    return build_report(trace, liveness)
