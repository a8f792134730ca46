"""The goodput accounting: where each rank's wall-clock time went (goodput and badput).

The figures ``megatron-trace report`` prints, the timeline's summary draws, ``watch``
serves and the trainer's end-of-run summary quotes are computed here (per rank:
:func:`rank_accounting`), so they can never disagree; the report is assembled from
them in :mod:`megatron.trace.analysis.goodput`.

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from megatron.trace._store.record_log import extents
from megatron.trace._store.stretches import Stretches
from megatron.trace.analysis.hangs import find_hang
from megatron.trace.analysis.sightings import known_wasted
from megatron.trace.analysis.wasted import Waste, waste_of
from megatron.trace.model.incarnation import Incarnation
from megatron.trace_format.errors import TraceInputError
from megatron.trace_format.semconv import (
    SPAN_CATEGORY,
    Category,
)

__all__ = [
    "MAX_WINDOWS",
    "PRECEDENCE",
    "accounting_of",
    "category_stretches",
    "rank_accounting",
    "read_segments",
    "seconds",
    "sweep",
    "wall_bounds_ns",
    "window_cuts",
    "worked_out",
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


#: ``report --window`` cuts the wall clock into at most this many windows.
MAX_WINDOWS = 100_000


def seconds(ns: int) -> float:
    return round(ns / 1e9, 9)


def read_segments(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """(start, end, category) of structural spans as read, from their extents."""
    return [(start, end, SPAN_CATEGORY[name]) for start, end, name in spans]


def _worked_segments(inc: Incarnation) -> list[tuple[int, int, str]]:
    """The segments of the incarnation worked out rather than read from a span: a running
    one's open interval (or startup) so far, the startup phases of one killed before its
    ``megatron.startup`` was written, and its hang."""
    segments = read_segments(extents([inc.in_flight] if inc.in_flight is not None else []))
    if inc.startup is None:  # killed in its startup: the phases it exported were startup
        segments += [
            (start, end, Category.STARTUP) for start, end, _ in extents(inc.startup_phases)
        ]
    lost = _lost_interval(inc)
    if lost is not None:
        segments.append((*lost, Category.GOODPUT))
    hang = find_hang(inc)
    if hang is not None:
        segments.append((hang.start_ns, hang.end_ns, Category.HANG))
    return segments


def _lost_interval(inc: Incarnation) -> tuple[int, int] | None:
    """A killed incarnation's in-flight interval, which the kill kept from being written,
    as far as the file shows it: from the end of its last interval (or its startup) to
    its last span's end. Its iteration spans were written (children of that lost
    interval), and its time is the training loop's, as the interval would have counted
    it; the wasted window and any save or hang in it win over it as over an interval."""
    if inc.ended != "killed":
        return None
    ends = [record["end_ns"] for record in inc.intervals]
    if inc.startup is not None:
        ends.append(inc.startup["end_ns"])
    if not ends:
        return None
    start = max(ends)
    return (start, inc.end_ns) if inc.end_ns > start else None


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


def sweep(
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
    [{"horizon", "placed_horizon", "wasted_iterations", "wasted_window_ns"}]}``
    (``placed_horizon``: the horizon where the files place it, else None); with ``window_ns``
    also ``"windows_ns"``: ``[(start, end, totals_ns)]``, the wall clock cut
    every ``window_ns`` from its start (the last window ends with it), whose
    totals add up to ``totals_ns`` exactly.
    """
    start, end = wall_bounds_ns(incs)
    worked, waste = worked_out(incs, waste_of)
    segments = [seg for inc in incs for seg in read_segments(inc.extents())] + worked
    cuts = window_cuts(start, end, window_ns) if window_ns is not None else []
    # each incarnation's share (from its start to the next one's) is swept in the same pass
    starts = sorted({inc.start_ns for inc in incs[1:] if start < inc.start_ns < end})
    every = sorted({*cuts, *starts})
    pieces = sweep(segments, (start, end), category_stretches(incs), every)
    keys = list(pieces[0])
    windows = [dict.fromkeys(keys, 0) for _ in range(len(cuts) + 1)]
    shares = [dict.fromkeys(keys, 0) for _ in range(len(starts) + 1)]
    for lo, piece in zip([start, *every], pieces, strict=True):
        window = windows[bisect.bisect_right(cuts, lo)]
        share = shares[bisect.bisect_right(starts, lo)]
        for box in (window, share):
            for key, ns in piece.items():
                box[key] += ns
    totals = {key: sum(box[key] for box in shares) for key in keys}
    windowed = {}
    if window_ns is not None:
        bounds = [start, *cuts, end]
        windowed["windows_ns"] = [
            (lo, hi, box) for lo, hi, box in zip(bounds[:-1], bounds[1:], windows, strict=True)
        ]
    found = accounting_of(start, end, totals, incs, waste)
    # an incarnation's wasted time is the wasted_progress of its share, not its whole wasted
    # window (a hang, or a save, in that window is counted as such)
    share_of = {inc.start_ns: shares[bisect.bisect_right(starts, inc.start_ns)] for inc in incs}
    for inc, entry in zip(incs, found["per_incarnation"], strict=True):
        entry["wasted_progress_ns"] = share_of[inc.start_ns][Category.WASTED_PROGRESS]
    return {**windowed, **found}


def worked_out(
    incs: list[Incarnation], waste: Callable[[Incarnation, list[Incarnation]], Waste]
) -> tuple[list[tuple[int, int, str]], list[Waste]]:
    """The rank's segments worked out rather than read (each incarnation's in-flight
    stretch and hang, its wasted window, the restart gaps), and what ``waste`` (a
    :func:`waste_of`) gave of each incarnation."""
    segments: list[tuple[int, int, str]] = []
    wastes = []
    for position, inc in enumerate(incs):
        segments.extend(_worked_segments(inc))
        found = waste(inc, incs[position + 1 :])
        window_start = found[1][0]
        if window_start is not None and inc.end_ns > window_start:
            segments.append((window_start, inc.end_ns, Category.WASTED_PROGRESS))
        if position + 1 < len(incs):
            successor = incs[position + 1].start_ns
            segments.append((inc.end_ns, successor, Category.RESTART_GAP))
            # what its metric points show it redone after its last span (a kill lost it)
            redone = known_wasted(inc, found[2], successor)
            if redone is not None:
                segments.append((redone.start, redone.end, Category.WASTED_PROGRESS))
                if redone.save_end > redone.save_start:  # a save in flight at the kill
                    segments.append((redone.save_start, redone.save_end, Category.CHECKPOINT_SAVE))
        wastes.append(found)
    return segments, wastes


def category_stretches(incs: list[Incarnation]) -> list[tuple[Stretches, str]]:
    """The rank's unions of frequent spans' time, each with its category."""
    stretches = [(inc.checkpoint_time, Category.CHECKPOINT_SAVE) for inc in incs]
    # the training loop's time outside any interval (Megatron-LM without checkpointing)
    return stretches + [(inc.goodput_time, Category.GOODPUT) for inc in incs]


def accounting_of(
    start: int, end: int, totals: dict[str, int], incs: list[Incarnation], wastes: list[Waste]
) -> dict[str, Any]:
    """:func:`rank_accounting`'s answer (but the windows) from the sweep's totals and
    each incarnation's waste."""
    per_incarnation = []
    wasted_total, exact = 0, True
    for inc, (horizon, (window_start, count, count_exact), placed) in zip(
        incs, wastes, strict=True
    ):
        wasted_total += count or 0
        exact = exact and count_exact
        per_incarnation.append(
            {
                "horizon": horizon,
                "placed_horizon": placed,
                "wasted_iterations": count,
                "wasted_exact": count_exact,
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
