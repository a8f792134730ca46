"""An incarnation's interval facts kept between a growing trace's finishes (``watch``).

The batch model derives :attr:`~megatron.trace.model.incarnation.Incarnation.interval_facts`
from scratch (:func:`megatron.trace.model.intervals.derive`); :class:`FactsCaches`
sets each incarnation's facts of a finish from what the previous finish of the same
incarnation (:attr:`Revision.incarnation <megatron.trace.live.revision.Revision.incarnation>`)
derived, so only the intervals added since are derived.
"""

from __future__ import annotations

import bisect
from array import array
from typing import Any, cast

from megatron.trace._store.columns import Iterations
from megatron.trace._store.record_log import RecordList
from megatron.trace.live.growing import Finish
from megatron.trace.live.revision import Revision
from megatron.trace.model import intervals
from megatron.trace.model.incarnation import Incarnation
from megatron.trace.model.intervals import IntervalFacts

__all__ = ["FactsCaches"]


class FactsCaches:
    """One :class:`_FactsCache` per incarnation of a growing trace's finishes:
    :meth:`attach` each new finish before anything reads its incarnations' facts."""

    def __init__(self) -> None:
        self._caches: dict[tuple[Any, ...], _FactsCache] = {}

    def attach(self, finish: Finish) -> None:
        """Set the interval facts of every incarnation of ``finish`` from its cache (an
        incarnation placed anew, after a new startup, starts a cache of its own)."""
        caches = {}
        for inc in finish.trace.incarnations:
            revision = finish.revisions.of(inc)
            if revision is None:
                continue
            key = revision.incarnation
            cache = caches[key] = self._caches.get(key) or _FactsCache()
            inc.interval_facts = cache.derive(inc, revision)
        self._caches = caches


class _FactsCache:
    """An incarnation's :attr:`Incarnation.interval_facts` kept between finishes: what
    :func:`intervals.derive_each` gave, and what it was given, so that the next finish
    derives only the intervals added since (and reads only the iterations and saves
    that start inside them). It holds while the intervals derived before are still the
    first ones, in the same order, and nothing that derivation read has changed:
    for an interval derived from iterations or saves, no iteration or save came
    that starts before its end, and the iteration resumed from is the same; and the
    iterations are the rows they were and more (the same first row of their process's
    column, in start order: :attr:`Rows.first <megatron.trace.live.revision.Rows.first>`)."""

    __slots__ = ("derived_reach", "intervals", "lengths", "lineage", "mark", "raw", "reach",
                 "resumed", "rows", "saves", "sized", "unfilled")  # fmt: skip

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.lineage: Any = None  # which rows of its process the iterations were
        self.rows = 0  # ... how many rows those had
        self.intervals = array("q")  # the positions of the intervals derived, in order
        self.saves = array("q")  # ... of the saves there were
        self.resumed: int | None = None
        self.raw: list[IntervalFacts] = []  # derive_each's facts
        self.reach = -(2**63)  # the latest end of an interval derived
        self.derived_reach: int | None = None  # ... of one derived from iterations or saves
        self.mark = 0  # the rows of the iterations that start before ``reach`` (in order)
        self.sized = 0  # by_length's look at the first ``sized`` facts:
        self.lengths: set[int] = set()  # ... the lengths of those with a known range
        self.unfilled = False  # ... whether one has a last iteration but no first

    def derive(self, inc: Incarnation, revision: Revision) -> list[IntervalFacts]:
        """:func:`intervals.derive` of ``inc`` (its lists are views of one log)."""
        # (a Split's incarnations hold views of their process's log)
        iterations, saves = inc.iterations, cast(RecordList, inc.saves)
        listed = cast(RecordList, inc.intervals)
        positions, save_positions = listed.positions, saves.positions
        starts, ends = listed.log.starts, listed.log.ends
        resumed = inc.resumed_from
        count = len(iterations)
        lineage = revision.iterations.first  # its rows' lineage: their first row, or None
        if not self._holds(inc, lineage, count, positions, save_positions, starts, resumed):
            self._clear()  # (derived afresh)
        known = len(self.raw)
        new = positions[known:]
        if new:
            ordered = iterations.in_start_order()
            lowest = min(starts[p] for p in new)
            if known and ordered and lowest >= self.reach:  # only rows from the newest on
                rows: Iterations = iterations.slice(self.mark, count)
            else:
                rows = iterations
            part = saves.from_start(lowest) if known else saves
            self.raw = intervals.derive_each(inc.intervals, rows, part, resumed, self.raw)
            for position, facts in zip(new, self.raw[known:], strict=True):
                self.reach = max(self.reach, ends[position])
                if facts.derived:
                    reach = self.derived_reach
                    self.derived_reach = (
                        ends[position] if reach is None else max(reach, ends[position])
                    )
            if ordered:
                after = iterations.slice(self.mark, count).starts
                self.mark += bisect.bisect_left(after, self.reach)
        self.lineage, self.rows, self.resumed = lineage, count, resumed
        self.intervals, self.saves = array("q", positions), array("q", save_positions)
        return self._by_length(len(self.raw) if inc.last_closed_by_reroot else len(self.raw) - 1)

    def _holds(
        self,
        inc: Incarnation,
        lineage: int | None,
        count: int,
        positions: array,
        save_positions: array,
        starts: array,
        resumed: int | None,
    ) -> bool:
        """Whether the facts derived before still hold (the class docstring)."""
        if not self.raw:
            return True
        if lineage is None or lineage != self.lineage or count < self.rows:
            return False
        iterations = inc.iterations
        if positions[: len(self.intervals)] != self.intervals:
            return False
        reach = self.derived_reach
        if reach is None:
            return True  # every fact from the intervals' own attributes
        if resumed != self.resumed or save_positions[: len(self.saves)] != self.saves:
            return False
        if any(starts[p] < reach for p in save_positions[len(self.saves) :]):
            return False
        if count > self.rows:
            if not iterations.in_start_order():
                return False
            if iterations.slice(self.rows, self.rows + 1).starts[0] < reach:
                return False
        return True

    def _by_length(self, full_count: int) -> list[IntervalFacts]:
        """:func:`intervals.by_length`, looking at each fact once: the facts as they are
        (a copy) unless a first iteration can be filled in."""
        raw = self.raw
        if full_count < self.sized:
            self.sized, self.lengths, self.unfilled = 0, set(), False
        for facts in raw[self.sized : max(full_count, 0)]:
            first, last = facts.first_iteration, facts.last_iteration
            if first is not None and last is not None:
                self.lengths.add(last - first + 1)
            elif last is not None:
                self.unfilled = True
        self.sized = max(full_count, self.sized)
        if self.unfilled and len(self.lengths) == 1:
            return intervals.by_length(raw, full_count)
        return list(raw)
