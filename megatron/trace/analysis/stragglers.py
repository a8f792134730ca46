"""Stragglers: the rank the others wait for, and the job time that waiting costs.

In a data-parallel job a slow rank does not look slow: every rank's
iteration lasts as long as the slowest one's, because each waits for the
others in the gradient all-reduce. So each iteration of each rank is split
into its *wait*, the ``megatron.grad_sync.finish`` span of that iteration
(from the dispatch of the last gradient bucket until ``backward()`` has all
of them back: the ``communication`` span group), and its *work*, the rest of
the ``megatron.train.iteration`` span. A rank's own speed is its median work.

* ``score`` = the best (lowest) median work of any rank / this rank's median
  work, so 1.0 for the fastest rank and about 1/k for a rank k times slower
  (the relative score nvidia-resiliency-ext's straggler detection uses);
* ``straggler``: ``score <`` :data:`SCORE_THRESHOLD` (0.9: its median work more
  than a ninth over the fastest's) **and** its difference stands out of the
  ranks' own spread: its work's lower quartile is above the fastest rank's
  upper quartile (the middle halves of their iterations' work do not
  overlap). A rank is slow when most of its iterations are, not when its
  median is: on a shared machine one rank's iterations can be delayed in
  bursts (a busier core, another process), which moves its median by a third
  and more while its iterations spread over the fastest rank's; a rank slowed
  by a quarter in each iteration clears the fastest's slower quarter. (The
  threshold is looser than nvidia-resiliency-ext's default 0.75, which a rank
  slowed by a quarter, score 0.8, would not reach: the spread keeps the noise
  out instead.) The ranks under the threshold but within the spread are listed
  as such;
* ``straggler_s``, the job time lost waiting for the stragglers: over every
  iteration that all compared ranks finished, the slowest straggler's work
  minus the slowest other rank's work, where positive, summed; 0 when no
  rank is a straggler. It is what the job would have saved had the
  stragglers been as fast as the slowest healthy rank. Ranks within the
  threshold of each other are noise, not waiting: two identical ranks take
  turns being the slower by a few percent every iteration, and those turns
  (which a faster rank's wait absorbs either way) are not time a straggler
  cost.

The first :data:`WARMUP_ITERATIONS` iterations each incarnation finished are
warm-up and left out of all three (the first pays for lazy initialisation,
the second for DDP rebuilding its gradient buckets, which waits for the other
ranks outside the timed all-reduce). Not computed (every figure ``None``, and
said why): with fewer than two ranks in the files, without the
per-iteration and gradient-sync spans, or with fewer than
:data:`MIN_ITERATIONS` iterations after the warm-up on two ranks (a median
of a handful of iterations is noise, not a verdict); where at least two ranks have
enough, a rank with too few (a kill kept its last iterations from its file) is left
out of the comparison, and said to be. Iterations are matched
across ranks by incarnation index and iteration number. Memory: int64 numpy
columns, no Python object per iteration, and none held for long: a rank's
work and waits live while its medians are taken, and the join reads each
rank's again one incarnation index at a time (twice the reading, so that
the ranks' iterations are never all in memory at once: with the model's
columns on disk, :mod:`megatron.trace._store.columns`, a 64-rank job's join holds
one incarnation of each rank at most).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from megatron.trace._store.selection import median, median_and_quartiles
from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace_format.semconv import GRAD_SYNC_FINISH_SPAN, ITERATION_SPAN

__all__ = [
    "MIN_ITERATIONS",
    "SCORE_THRESHOLD",
    "STRAGGLER_RULE",
    "WARMUP_ITERATIONS",
    "RankSplit",
    "RankWork",
    "Stragglers",
    "compared_ranks",
    "find_stragglers",
    "is_straggler",
    "iteration_work",
    "rank_split",
    "relative_score",
]

SCORE_THRESHOLD = 0.9
WARMUP_ITERATIONS = 2
MIN_ITERATIONS = 10
STRAGGLER_RULE = (
    f"score < {SCORE_THRESHOLD:g} and the rank's lower quartile of work above the fastest "
    "rank's upper quartile (the difference stands out of the ranks' own spread); "
    "score = the fastest rank's median work per iteration / this rank's, work = iteration "
    f"duration - its gradient all-reduce wait ({GRAD_SYNC_FINISH_SPAN}), over each "
    f"incarnation's iterations after its first {WARMUP_ITERATIONS}"
)


@dataclass(frozen=True)
class RankWork:
    """One rank's iterations split into own work and waiting, as medians."""

    rank: str
    iterations: int  # iterations with both spans
    work_ms_median: float
    wait_ms_median: float
    score: float
    straggler: bool
    work_ms_q1: float = 0.0  # the work's lower and upper quartiles (the spread the rule reads)
    work_ms_q3: float = 0.0

    def entry(self) -> dict[str, Any]:
        return {
            "work_ms_median": round(self.work_ms_median, 3),
            "work_ms_q1": round(self.work_ms_q1, 3),
            "work_ms_q3": round(self.work_ms_q3, 3),
            "wait_ms_median": round(self.wait_ms_median, 3),
            "score": round(self.score, 3),
            "straggler": self.straggler,
        }


_RANK_FIELDS = ("work_ms_median", "work_ms_q1", "work_ms_q3", "wait_ms_median", "score",
                "straggler")  # fmt: skip


@dataclass(frozen=True)
class Stragglers:
    """What :func:`find_stragglers` found (``ranks`` empty when not computed)."""

    ranks: dict[str, RankWork]
    straggler_s: float | None
    not_computed: list[str]
    fastest: str | None = None  # the rank of the lowest median work (the rule's reference)

    @property
    def flagged(self) -> list[str]:
        return [rank for rank, work in self.ranks.items() if work.straggler]

    @property
    def within_spread(self) -> list[str]:
        """The ranks whose score is under the threshold but whose work's middle half
        overlaps the fastest rank's: slower in median, not in most iterations."""
        return [
            rank
            for rank, work in self.ranks.items()
            if work.score < SCORE_THRESHOLD and not work.straggler
        ]

    def rank_entry(self, rank: str) -> dict[str, Any]:
        """The per-rank fields of the report (all ``None`` when not computed)."""
        work = self.ranks.get(rank)
        if work is None:
            return dict.fromkeys(_RANK_FIELDS)
        return work.entry()

    def summary(self) -> dict[str, Any] | None:
        """The report's top-level ``stragglers``: the rule (in words, and its figures: the
        score threshold, the fastest rank and its upper quartile of work, which a straggler's
        lower quartile must exceed), the ranks it names, and the ranks under the threshold
        that it does not name because their difference is within the spread."""
        if not self.ranks or self.fastest is None:
            return None
        return {
            "rule": STRAGGLER_RULE,
            "score_threshold": SCORE_THRESHOLD,
            "fastest_rank": rank_value(self.fastest),
            "fastest_work_ms_q3": round(self.ranks[self.fastest].work_ms_q3, 3),
            "ranks": [rank_value(rank) for rank in self.flagged],
            "within_spread": [rank_value(rank) for rank in self.within_spread],
        }


def iteration_work(inc: Incarnation) -> tuple[Any, Any, Any, Any]:
    """(numbers, durations, waits, work) of the incarnation's finished iterations, in its
    order, as int64 numpy arrays (ns); an iteration's wait is the sum of its
    ``megatron.grad_sync.finish`` spans, and its work the rest of it (at least 0).
    Where an iteration has no wait span, its wait and work are -1.

    Columns, not a dict of iteration -> wait: that was a Python object per
    iteration, a few hundred MB for a week of per-step spans.
    """
    import numpy as np  # here, not at import: the CLI starts faster for what needs none

    def column(values: array) -> Any:
        return np.frombuffer(values, dtype=np.int64)

    numbers = column(inc.iterations.numbers)
    durations = inc.iterations.durations()
    waited = column(inc.waits.numbers)
    lengths = inc.waits.durations()
    if np.array_equal(waited, numbers):  # the usual case: one wait per iteration, in step
        waits = lengths
    else:
        waits = np.full(len(numbers), -1, dtype=np.int64)
        if len(waited) and len(numbers):
            order = np.argsort(waited, kind="stable")
            waited, lengths = waited[order], lengths[order]
            firsts = np.flatnonzero(np.r_[True, waited[1:] != waited[:-1]])
            distinct, totals = waited[firsts], np.add.reduceat(lengths, firsts)
            at = np.minimum(np.searchsorted(distinct, numbers), len(distinct) - 1)
            found = distinct[at] == numbers
            waits[found] = totals[at[found]]
    work = durations - waits
    np.maximum(work, 0, out=work)
    work[waits < 0] = -1
    return numbers, durations, waits, work


@dataclass(frozen=True)
class RankSplit:
    """One rank's incarnations that have waits, by index, and whether each is in step
    (:func:`_in_step`); how many of its iterations have a wait (after each
    incarnation's warm-up), and the medians of their work and of their wait (ns)."""

    by_incarnation: dict[int, Incarnation]
    in_step: dict[int, bool]
    count: int
    work_median: float
    wait_median: float
    work_q1: int = (
        0  # the work's quartiles (:func:`~megatron.trace._store.selection.median_and_quartiles`)
    )
    work_q3: int = 0


def _timed(inc: Incarnation) -> tuple[Any, Any, Any]:
    """(numbers, waits, work) of the incarnation's iterations that have a wait, after
    its warm-up."""
    columns = iteration_work(inc)
    numbers, waited, work = (columns[i][WARMUP_ITERATIONS:] for i in (0, 2, 3))
    del columns  # the durations: not needed here
    timed = waited >= 0
    if not timed.all():
        numbers, waited, work = numbers[timed], waited[timed], work[timed]
    return numbers, waited, work


def _in_step(inc: Incarnation) -> bool:
    """Whether each iteration has one wait, in the same order (the usual case): then
    row ``i`` of the waits is iteration ``i``'s, and both are read a part at a time."""
    its, waits = inc.iterations, inc.waits
    return len(its) == len(waits) and all(
        mine.numbers == theirs.numbers
        for mine, theirs in zip(its.parts(), waits.parts(), strict=True)
    )


def _timed_parts(inc: Incarnation, in_step: bool) -> Iterator[tuple[Any, Any, Any]]:
    """:func:`_timed`'s arrays a part of the columns at a time when the incarnation is
    :func:`_in_step` (so what is held does not grow with the job); else whole."""
    import numpy as np

    if not in_step:
        yield _timed(inc)
        return
    skip = WARMUP_ITERATIONS
    for its, waits in zip(inc.iterations.parts(), inc.waits.parts(), strict=True):
        numbers = np.frombuffer(its.numbers, dtype=np.int64)
        work, waited = its.durations(), waits.durations()
        if skip:  # the warm-up: the first rows of the first part (or parts)
            cut = min(skip, len(numbers))
            numbers, work, waited, skip = numbers[cut:], work[cut:], waited[cut:], skip - cut
        work -= waited
        np.maximum(work, 0, out=work)
        timed = waited >= 0
        if not timed.all():
            numbers, waited, work = numbers[timed], waited[timed], work[timed]
        yield numbers, waited, work


def rank_split(incs: Iterable[Incarnation]) -> RankSplit:
    """A rank's figures, holding nothing per iteration when done: its medians are
    selected over its work and waits a part at a time (:mod:`megatron.trace._store.selection`),
    and the join reads them again, an incarnation index at a time."""
    by_incarnation = {inc.index: inc for inc in incs if inc.waits}  # (none: no grad_sync spans)
    in_step = {index: _in_step(inc) for index, inc in by_incarnation.items()}

    def column(field: int) -> Callable[[], Iterator[Any]]:
        def parts() -> Iterator[Any]:
            for index, inc in by_incarnation.items():
                for timed in _timed_parts(inc, in_step[index]):
                    yield timed[field]

        return parts

    work_median, work_q1, work_q3, count = median_and_quartiles(column(2))
    wait_median, _ = median(column(1))
    return RankSplit(by_incarnation, in_step, count, work_median, wait_median, work_q1, work_q3)


def find_stragglers(trace: Trace) -> Stragglers:
    """Per-rank work, wait and score, the flagged ranks and ``straggler_s`` (module doc)."""
    if len(trace.ranks) < 2:
        return Stragglers({}, None, [_ONE_RANK])
    split = {rank: rank_split(incs) for rank, incs in trace.ranks.items()}
    compared, reason = compared_ranks({rank: parts.count for rank, parts in split.items()})
    if reason is not None:
        return Stragglers({}, None, [reason])
    measured = {rank: split[rank] for rank in compared}
    fastest = min(measured, key=lambda rank: measured[rank].work_median)  # (first of a tie)
    best, bar = measured[fastest].work_median, measured[fastest].work_q3
    ranks = {}
    for rank, one in measured.items():
        score = relative_score(best, one.work_median)
        ranks[rank] = RankWork(
            rank,
            one.count,
            one.work_median / 1e6,
            one.wait_median / 1e6,
            score,
            is_straggler(score, one.work_q1, bar),
            one.work_q1 / 1e6,
            one.work_q3 / 1e6,
        )
    flagged = [ranks[rank].straggler for rank in measured]
    left_out = [rank_value(rank) for rank in trace.ranks if rank not in measured]
    notes = [_left_out(left_out)] if left_out else []
    return Stragglers(ranks, _lost_s(list(measured.values()), flagged), notes, fastest)


def is_straggler(score: float, work_q1: float, fastest_q3: float) -> bool:
    """The rule (module doc): a score under the threshold, and the rank's lower quartile of
    work above the fastest rank's upper quartile."""
    return score < SCORE_THRESHOLD and work_q1 > fastest_q3


def _left_out(ranks: list[Any]) -> str:
    """The note on ranks too short to compare beside ranks that were compared (a kill
    keeps a rank's unexported iterations from its file, so ranks can differ)."""
    return (
        f"stragglers: ranks {ranks}: fewer than {MIN_ITERATIONS} iterations after the first "
        f"{WARMUP_ITERATIONS}, not compared (their score and straggler are null; the flagged "
        "ranks and straggler_s are the compared ranks')"
    )


_ONE_RANK = (
    "stragglers: the files hold one rank (export every rank: MEGATRON_OTEL_RANK_STRATEGY=all_ranks)"
)


def compared_ranks(counts: dict[str, int]) -> tuple[list[str], str | None]:
    """The ranks compared, given how many iterations each has after the warm-up (``counts``,
    in rank order), or why none are."""
    if sum(1 for count in counts.values() if count) < 2:
        return [], (
            f"stragglers: fewer than two ranks have both {ITERATION_SPAN} and "
            f"{GRAD_SYNC_FINISH_SPAN} spans (enable the per_step span groups)"
        )
    measured = [rank for rank, count in counts.items() if count >= MIN_ITERATIONS]
    if len(measured) < 2:
        return [], (
            f"stragglers: fewer than {MIN_ITERATIONS} iterations after the first "
            f"{WARMUP_ITERATIONS} on two ranks, too few to compare"
        )
    return measured, None


def relative_score(best: float, work: float) -> float:
    """A rank's score: the fastest rank's median work over its own."""
    return best / work if work > 0 else 1.0


def _lost_s(per_rank: list[RankSplit], flagged: list[bool]) -> float:
    """Sum over iterations every rank finished of (the slowest straggler's work - the
    slowest other rank's work, where positive), in s; 0 without a straggler.

    An iteration is its incarnation index and number; one that a rank finished
    twice counts with its later work. The ranks are matched one incarnation index
    at a time: where all are in step and finished the same iterations in order
    (the usual case), a part of the columns at a time, every rank's side by side;
    otherwise each rank's iterations against those every rank before it had.
    """
    if not any(flagged) or all(flagged):
        return 0.0
    first, *others = per_rank
    lost = 0
    for index, inc in first.by_incarnation.items():
        theirs = [other.by_incarnation.get(index) for other in others]
        if any(one is None for one in theirs):
            continue  # not every rank ran this incarnation: nothing to compare
        incs = [inc, *theirs]
        steps = [split.in_step[index] for split in per_rank]
        together = _lost_side_by_side(incs, flagged) if all(steps) else None
        lost += together if together is not None else _lost_matched(incs, steps, flagged)
    return round(lost / 1e9, 9)


def _excess(straggling: Any, healthy: Any) -> int:
    """The ns by which the stragglers' slowest work exceeds the others' slowest."""
    import numpy as np

    return int(np.maximum(straggling - healthy, 0).sum())


def _lost_side_by_side(incs: list[Incarnation], flagged: list[bool]) -> int | None:
    """The ns lost over one incarnation index, the ranks' parts side by side; None
    when their iterations differ (then :func:`_lost_matched` matches them)."""
    import numpy as np

    if len({len(inc.iterations) for inc in incs}) != 1:
        return None
    lost, last = 0, None
    streams = [_timed_parts(inc, True) for inc in incs]
    for parts in zip(*streams, strict=True):
        numbers = parts[0][0]
        if any(not np.array_equal(numbers, their_numbers) for their_numbers, _, _ in parts[1:]):
            return None
        if len(numbers):
            if (last is not None and numbers[0] <= last) or not (numbers[1:] > numbers[:-1]).all():
                return None  # finished again or out of order: the later work counts
            last = numbers[-1]
        slowest = {True: None, False: None}
        for (_, _, work), straggler in zip(parts, flagged, strict=True):
            held = slowest[straggler]
            slowest[straggler] = work.copy() if held is None else np.maximum(held, work)
        lost += _excess(slowest[True], slowest[False])
    return lost


def _lost_matched(incs: list[Incarnation], steps: list[bool], flagged: list[bool]) -> int:
    """The ns lost over one incarnation index, each rank's iterations (whole) matched
    against those every rank before it had."""
    import numpy as np

    def whole(inc: Incarnation, in_step: bool) -> tuple[Any, Any]:
        parts = list(_timed_parts(inc, in_step))  # (the rare case: held whole)
        numbers = np.concatenate([numbers for numbers, _, _ in parts])
        return _last_by_number(numbers, np.concatenate([work for _, _, work in parts]))

    numbers, work = whole(incs[0], steps[0])
    none = np.full(len(work), -1, dtype=np.int64)  # (work is never negative)
    slowest = {flagged[0]: work, not flagged[0]: none}
    for inc, in_step, straggler in zip(incs[1:], steps[1:], flagged[1:], strict=True):
        their_numbers, their_works = whole(inc, in_step)
        numbers, mine, at = _matched(numbers, their_numbers)
        if mine is not None:
            slowest = {group: held[mine] for group, held in slowest.items()}
        if at is not None:
            their_works = their_works[at]
        slowest[straggler] = np.maximum(slowest[straggler], their_works)
    return _excess(slowest[True], slowest[False])


def _matched(numbers: Any, theirs: Any) -> tuple[Any, Any | None, Any | None]:
    """The numbers both sorted, distinct arrays hold, and where they are in each (None:
    all of that array, in order). The usual case, two ranks that finished the same
    iterations, costs one comparison and no index arrays; otherwise a binary search
    of ours in theirs (``np.intersect1d`` would sort a copy of both)."""
    import numpy as np

    if np.array_equal(numbers, theirs):
        return numbers, None, None
    if not len(theirs):
        return theirs, np.empty(0, dtype=np.intp), None
    at = np.searchsorted(theirs, numbers)
    np.minimum(at, len(theirs) - 1, out=at)
    mine = np.flatnonzero(theirs[at] == numbers)
    at = at[mine]
    return numbers[mine], mine, at


def _last_by_number(numbers: Any, works: Any) -> tuple[Any, Any]:
    """The distinct numbers in order, each with its last work (as they are, in the usual
    case: numbers already increasing)."""
    import numpy as np

    if len(numbers) < 2 or bool((numbers[1:] > numbers[:-1]).all()):
        return numbers, works
    order = np.argsort(numbers, kind="stable")
    numbers, works = numbers[order], works[order]
    last = np.r_[numbers[1:] != numbers[:-1], True]
    return numbers[last], works[last]
