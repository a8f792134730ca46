"""``watch``'s goodput accounting, kept up to date at the cost of what changed.

:class:`LiveAccounting` gives :func:`~megatron.trace.analysis.accounting.rank_accounting`
of one rank again and again as its trace grows, from each
:class:`~megatron.trace.live.growing.Finish` (what changed since the one before) and the
model's public views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.trace._store.record_log import latest
from megatron.trace._store.stretches import Stretches
from megatron.trace.analysis.accounting import (
    accounting_of,
    category_stretches,
    read_segments,
    sweep,
    wall_bounds_ns,
    worked_out,
)
from megatron.trace.analysis.wasted import Waste, resumed_at, waste_of
from megatron.trace.live.growing import Finish
from megatron.trace.model.incarnation import Incarnation

__all__ = ["LiveAccounting"]


@dataclass
class _Kept:
    """What :class:`LiveAccounting` keeps of the time before ``cut`` (see there)."""

    generation: int  # the finish's it was worked out at
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
    before it (:attr:`~megatron.trace.live.growing.Finish.touched`), the wall clock
    starts where it did and ends past it, and the segments worked out rather than
    read (a running incarnation's open interval, a hang, a wasted window, a restart
    gap) cover the same time before it. Otherwise everything is swept again, and
    ``cut`` moves to where the rank's trace may still change: the end of its last
    incarnation's newest interval, where what is in flight began. An incarnation's
    horizon and wasted iterations are kept while its revision and ending are the same.
    """

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self._wastes: dict[tuple[Any, ...], Waste] = {}

    def __call__(self, incs: list[Incarnation], finish: Finish) -> dict[str, Any]:
        """The accounting of ``incs``, the rank's incarnations in ``finish`` (its growing
        trace's latest; the one before was the previous call's)."""
        start, end = wall_bounds_ns(incs)
        wastes: dict[tuple[Any, ...], Waste] = {}
        worked, waste = worked_out(
            incs, lambda inc, later: self._kept_waste(inc, later, finish, wastes)
        )
        self._wastes = wastes
        stretches = category_stretches(incs)
        cut = _settled_ns(incs, start, end)
        kept = self._kept
        touched = [finish.touched[inc.process] for inc in incs if inc.process in finish.touched]
        if (
            kept is None
            or finish.generation != kept.generation + 1
            or start != kept.start
            or end < kept.cut
            or min(touched, default=kept.cut) < kept.cut
            or _clipped(worked, start, kept.cut) != kept.worked
        ):
            read = [seg for inc in incs for seg in read_segments(inc.extents())]
            before, after = _swept(read + worked, start, end, stretches, cut)
            kept = _Kept(finish.generation, start, cut, before, [], [])
        else:
            read = [*kept.spanning]
            for inc in incs:
                if inc.end_ns >= kept.cut:  # (its records all end by its end)
                    read += read_segments(inc.extents_from(kept.cut))
            cut = max(cut, kept.cut)
            more, after = _swept(read + worked, kept.cut, end, stretches, cut)
            kept.before = {key: ns + more[key] for key, ns in kept.before.items()}
            kept.generation, kept.cut = finish.generation, cut
        kept.worked = _clipped(worked, start, cut)
        kept.spanning = [seg for seg in read if seg[0] < cut < seg[1]]
        self._kept = kept
        totals = {key: ns + after[key] for key, ns in kept.before.items()}
        return accounting_of(start, end, totals, incs, waste)

    def _kept_waste(
        self,
        inc: Incarnation,
        later: list[Incarnation],
        finish: Finish,
        wastes: dict[tuple[Any, ...], Waste],
    ) -> Waste:
        """:func:`waste_of`, kept by what it depends on: the incarnation's revision and
        ending, where the next incarnation resumed, and whether one follows at all."""
        revision = finish.revisions.of(inc)
        if revision is None:
            return waste_of(inc, later)
        resumed = resumed_at(later)
        key = (revision, inc.ended, inc.last_closed_by_reroot, resumed, bool(later))
        found = self._wastes.get(key)
        if found is None:
            found = waste_of(inc, later)
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
    """:func:`sweep`'s totals over ``[lo, cut)`` and ``[cut, hi]`` (``lo <= cut <= hi``)."""
    if lo < cut < hi:
        before, after = sweep(segments, (lo, hi), stretches, [cut])
        return before, after
    (totals,) = sweep(segments, (lo, hi), stretches)
    empty = dict.fromkeys(totals, 0)
    return (totals, empty) if cut >= hi else (empty, totals)
