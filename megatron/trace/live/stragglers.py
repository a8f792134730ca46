"""``watch``'s straggler scores, kept up to date as each rank's iterations come.

:class:`LiveStragglers` gives :func:`~megatron.trace.analysis.stragglers.find_stragglers`'s
scores again and again as the trace grows, following each incarnation by its
:class:`~megatron.trace.live.revision.Revision`; the rule and the batch figures are
:mod:`megatron.trace.analysis.stragglers`'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from megatron.trace._store.selection import quartile_ranks
from megatron.trace.analysis.stragglers import (
    WARMUP_ITERATIONS,
    compared_ranks,
    is_straggler,
    rank_split,
    relative_score,
)
from megatron.trace.live.growing import Finish
from megatron.trace.live.revision import Revisions
from megatron.trace.model.incarnation import Incarnation

__all__ = ["MEDIAN_WINDOW", "LiveStragglers"]


#: :class:`LiveStragglers` keeps this many of a rank's work values on each side of their
#: median (and at most eight times as many in all).
MEDIAN_WINDOW = 2048


class _Rebuild(Exception):
    """An incarnation's iterations or waits did not grow as :class:`_Timed` follows them."""


class _Timed:
    """The work values :func:`_timed` gives of one incarnation, followed as its iterations
    and waits grow: each row is read once, and a value given once it is final.

    That holds while the iteration numbers and the wait numbers each only increase
    (one wait per iteration, the usual case): an iteration's wait is then the one of
    its number, and an iteration numbered at most the newest wait's will get no
    other. Anything else raises :class:`_Rebuild` (the caller works the rank out
    again from the start)."""

    __slots__ = ("last_iteration", "last_wait", "pending", "rows", "wait_rows")

    def __init__(self) -> None:
        import numpy as np

        self.rows = 0  # the iteration rows given (or skipped) so far
        self.wait_rows = 0  # the wait rows read so far
        self.last_iteration: int | None = None  # the number of the last row given
        self.last_wait: int | None = None  # the newest wait's number
        # the waits read whose iteration has not come yet: (numbers, durations)
        self.pending = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))

    def update(self, inc: Incarnation) -> Iterator[Any]:
        """The work values (int64 arrays, ns) of the rows that became final since."""
        import numpy as np

        waits = inc.waits
        for part in waits.slice(self.wait_rows, len(waits)).parts():
            numbers = np.frombuffer(part.numbers, dtype=np.int64)
            self.last_wait = _increasing(numbers, self.last_wait)
            self.pending = (
                np.concatenate([self.pending[0], numbers]),
                np.concatenate([self.pending[1], part.durations()]),
            )
            self.wait_rows += len(numbers)
        if self.last_wait is None:
            return
        iterations = inc.iterations
        for part in iterations.slice(self.rows, len(iterations)).parts():
            numbers = np.frombuffer(part.numbers, dtype=np.int64)
            durations = part.durations()
            _increasing(numbers, self.last_iteration)
            final = int(np.searchsorted(numbers, self.last_wait, side="right"))
            if final:
                self.last_iteration = int(numbers[final - 1])
            skip = max(0, WARMUP_ITERATIONS - self.rows)
            self.rows += final
            yield self._work(numbers[skip:final], durations[skip:final])
            if final < len(numbers):
                return  # the rest wait for their waits

    def _work(self, numbers: Any, durations: Any) -> Any:
        """The work of the iterations ``numbers`` that have a wait (not negative), the waits
        of these and earlier iterations dropped."""
        import numpy as np

        waited, lengths = self.pending
        at = np.minimum(np.searchsorted(waited, numbers), max(len(waited) - 1, 0))
        found = (waited[at] == numbers) if len(waited) else np.zeros(len(numbers), dtype=bool)
        work, wait = durations[found], lengths[at[found]]
        keep = wait >= 0
        work = work[keep] - wait[keep]
        np.maximum(work, 0, out=work)
        if self.last_iteration is not None:
            later = waited > self.last_iteration
            self.pending = (waited[later], lengths[later])
        return work


def _increasing(numbers: Any, last: int | None) -> int | None:
    """The last of ``numbers`` (or ``last`` when none), which must each be greater than
    the one before it, ``last`` first; raises :class:`_Rebuild` if not."""
    if not len(numbers):
        return last
    if (last is not None and numbers[0] <= last) or not (numbers[1:] > numbers[:-1]).all():
        raise _Rebuild
    return int(numbers[-1])


def _middle(count: int) -> list[int]:
    """The ranks the median of ``count`` values takes (one, or the middle two)."""
    middle = count // 2
    return [middle] if count % 2 else [middle - 1, middle]


def _lower_quartile(count: int) -> list[int]:
    """The rank of the lower quartile (as report takes it: :func:`quartile_ranks`)."""
    return quartile_ranks(count)[:1]


def _upper_quartile(count: int) -> list[int]:
    """The rank of the upper quartile (as report takes it: :func:`quartile_ranks`)."""
    return quartile_ranks(count)[1:]


class _Window:
    """An exact order statistic of a growing multiset of int64 values (the median by
    default: the mean of the values at the ranks ``ranks_of(count)`` names), holding only
    the values near it: each distinct value in ``[low, high]`` (``None``: unbounded) with
    how often it came, in order, and how many values lie below."""

    __slots__ = ("below", "count", "counts", "high", "low", "ranks_of", "values")

    def __init__(self, ranks_of: Callable[[int], list[int]] = _middle) -> None:
        import numpy as np

        self.ranks_of = ranks_of
        self.values = np.empty(0, dtype=np.int64)  # distinct, increasing
        self.counts = np.empty(0, dtype=np.int64)
        self.below = self.count = 0
        self.low: int | None = None
        self.high: int | None = None

    def add(self, values: Any) -> None:
        import numpy as np

        self.count += len(values)
        inside = np.ones(len(values), dtype=bool)
        if self.low is not None:
            under = values < self.low
            self.below += int(under.sum())
            inside &= ~under
        if self.high is not None:
            inside &= values <= self.high
        new, times = np.unique(values[inside], return_counts=True)
        if not len(new):
            return
        at = np.searchsorted(self.values, new)
        known = at < len(self.values)
        known[known] = self.values[at[known]] == new[known]
        self.counts[at[known]] += times[known]
        self.values = np.insert(self.values, at[~known], new[~known])
        self.counts = np.insert(self.counts, at[~known], times[~known])

    def median(self) -> float | None:
        """The statistic (the median as :func:`~megatron.trace._store.selection.median`
        gives it, by default; 0.0 of none), or None when it lies outside the values held."""
        import numpy as np

        if not self.count:
            return 0.0
        ranks = self.ranks_of(self.count)
        ends = np.cumsum(self.counts)  # the rank (among those held) past each value
        held = int(ends[-1]) if len(ends) else 0
        at = [rank - self.below for rank in ranks]
        if at[0] < 0 or at[-1] >= held:
            return None
        index = [int(np.searchsorted(ends, rank, side="right")) for rank in at]
        found = [int(self.values[i]) for i in index]
        if len(self.values) > 8 * MEDIAN_WINDOW:  # keep what lies near the median only
            lo = int(np.searchsorted(ends, max(0, at[0] - MEDIAN_WINDOW), side="right"))
            hi = int(np.searchsorted(ends, min(held - 1, at[-1] + MEDIAN_WINDOW), "right")) + 1
            if lo:
                self.low, self.below = int(self.values[lo]), self.below + int(ends[lo - 1])
            if hi < len(self.values):
                self.high = int(self.values[hi - 1])
            self.values, self.counts = self.values[lo:hi].copy(), self.counts[lo:hi].copy()
        return float(found[0]) if len(found) == 1 else (found[0] + found[1]) / 2


#: The order statistics of a rank's work followed: its median, lower and upper quartile.
_STATISTICS = (_middle, _lower_quartile, _upper_quartile)


class _RankTimed:
    """One rank's count, median and quartiles of work after the warm-up, followed as it
    grows (a :class:`_Window` each)."""

    __slots__ = ("incarnations", "windows")

    def __init__(self) -> None:
        self.incarnations: dict[Any, _Timed] = {}
        self.windows = [_Window(ranks_of) for ranks_of in _STATISTICS]

    def update(
        self, incs: list[Incarnation], revisions: Revisions
    ) -> tuple[int, float, float, float] | None:
        """(count, median, lower and upper quartile of work in ns) of ``incs``, or None when
        it must be worked out again from the start (:class:`_Timed`, :meth:`_Window.median`)."""
        followed, timed = {}, []
        for inc in incs:
            if not inc.waits:
                continue
            revision = revisions.of(inc)
            if revision is None or not revision.rows_grow():
                return None  # (not of this finish, or its rows sorted anew each finish)
            key = revision.incarnation  # the same incarnation in every finish
            followed[key] = self.incarnations.get(key) or _Timed()
            timed.append((followed[key], inc))
        if not set(self.incarnations) <= set(followed):
            return None  # (an incarnation placed anew: its values would count twice)
        self.incarnations = followed
        try:
            for follower, inc in timed:
                for values in follower.update(inc):
                    for window in self.windows:
                        window.add(values)
        except _Rebuild:
            return None
        found = [window.median() for window in self.windows]
        if any(value is None for value in found):
            return None
        median, q1, q3 = found
        return self.windows[0].count, median, q1, q3

    def rebuild(
        self, incs: list[Incarnation], revisions: Revisions
    ) -> tuple[int, float, float, float] | None:
        """Follow ``incs`` from the start: the values near the median selected over them a
        part at a time (:mod:`megatron.trace._store.selection`), not held all at once."""
        from megatron.trace._store.selection import select

        def values() -> Iterator[Any]:
            timed = [(_Timed(), inc) for inc in incs if inc.waits]
            for follower, inc in timed:
                yield from follower.update(inc)

        self.incarnations = {}
        self.windows = [_Window(ranks_of) for ranks_of in _STATISTICS]
        try:
            count = sum(len(part) for part in values())
            if count > 2 * MEDIAN_WINDOW:
                # (each statistic's window: from its first rank's low bound to its last's high)
                bounds = [
                    bound
                    for ranks_of in _STATISTICS
                    for bound in (
                        max(0, ranks_of(count)[0] - MEDIAN_WINDOW),
                        min(count - 1, ranks_of(count)[-1] + MEDIAN_WINDOW),
                    )
                ]
                found = select(values, bounds)
                for index, window in enumerate(self.windows):
                    window.low, window.high = found[2 * index], found[2 * index + 1]
        except _Rebuild:
            return None
        return self.update(incs, revisions)


class LiveStragglers:
    """:func:`find_stragglers`'s scores again and again as the trace grows (``watch``),
    each rank's count and median work followed as its iterations come rather than
    selected over its whole history at every scrape: each row is read once, and the
    work values near the median are held (at most eight times :data:`MEDIAN_WINDOW`),
    the others counted. When a rank's iterations do not grow as that follows, or its
    median leaves the values held, its figures are worked out from the start again
    (by selection over its columns). Its quartiles are followed alike (a window each), so
    :attr:`flagged` says what report's rule names. ``straggler_s`` is not worked out:
    ``watch`` does not serve it."""

    def __init__(self) -> None:
        self._ranks: dict[str, _RankTimed] = {}
        #: whether the last call's rule names each compared rank (:func:`is_straggler`)
        self.flagged: dict[str, bool] = {}

    def __call__(self, finish: Finish) -> dict[str, float]:
        """Each compared rank's score (none when not computed, as :func:`find_stragglers`)."""
        trace, revisions = finish.trace, finish.revisions
        if len(trace.ranks) < 2:
            return {}
        figures = {}
        for rank, incs in trace.ranks.items():
            timed = self._ranks.setdefault(rank, _RankTimed())
            found = timed.update(incs, revisions) if timed.incarnations else None
            if found is None:
                found = timed.rebuild(incs, revisions)
            if found is None:  # (iterations or waits not each increasing: as report does)
                del self._ranks[rank]
                split = rank_split(incs)
                found = (split.count, split.work_median, split.work_q1, split.work_q3)
            figures[rank] = found
        self.flagged = {}
        compared, _ = compared_ranks({rank: found[0] for rank, found in figures.items()})
        if not compared:
            return {}
        fastest = min(compared, key=lambda rank: figures[rank][1])  # (first of a tie)
        best, bar = figures[fastest][1], figures[fastest][3]
        scores = {rank: relative_score(best, figures[rank][1]) for rank in compared}
        self.flagged = {
            rank: is_straggler(score, figures[rank][2], bar) for rank, score in scores.items()
        }
        return scores
