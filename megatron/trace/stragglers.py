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
* ``straggler`` = ``score < 0.75`` (nvidia-resiliency-ext's default threshold);
* ``straggler_s``, the job time lost waiting for slower ranks: over every
  iteration that all compared ranks finished, the slowest rank's work minus
  the fastest rank's work, summed. It is what the job would have saved per
  iteration had every rank been as fast as that iteration's fastest: the
  waiting that slower ranks imposed, whoever was slow that time.

The first :data:`WARMUP_ITERATIONS` iterations each incarnation finished are
warm-up and left out of all three (the first pays for lazy initialisation,
the second for DDP rebuilding its gradient buckets, which waits for the other
ranks outside the timed all-reduce). Not computed (every figure ``None``, and
said why): with fewer than two ranks in the files, without the
per-iteration and gradient-sync spans, or with fewer than
:data:`MIN_ITERATIONS` iterations after the warm-up on two ranks (a median
of a handful of iterations is noise, not a verdict). Iterations are matched
across ranks by incarnation index and iteration number. Memory: one number per finished
iteration and rank while it runs.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median
from typing import Any

from megatron.core.telemetry.semconv import GRAD_SYNC_FINISH_SPAN, ITERATION_SPAN
from megatron.trace.model import Incarnation, Trace

__all__ = [
    "MIN_ITERATIONS",
    "SCORE_THRESHOLD",
    "STRAGGLER_RULE",
    "WARMUP_ITERATIONS",
    "RankWork",
    "Stragglers",
    "find_stragglers",
]

SCORE_THRESHOLD = 0.75
WARMUP_ITERATIONS = 2
MIN_ITERATIONS = 10
STRAGGLER_RULE = (
    f"score < {SCORE_THRESHOLD:g}; score = the fastest rank's median work per iteration / "
    "this rank's, work = iteration duration - its gradient all-reduce wait "
    f"({GRAD_SYNC_FINISH_SPAN}), over each incarnation's iterations after its first "
    f"{WARMUP_ITERATIONS}"
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

    def entry(self) -> dict[str, Any]:
        return {
            "work_ms_median": round(self.work_ms_median, 3),
            "wait_ms_median": round(self.wait_ms_median, 3),
            "score": round(self.score, 3),
            "straggler": self.straggler,
        }


@dataclass(frozen=True)
class Stragglers:
    """What :func:`find_stragglers` found (``ranks`` empty when not computed)."""

    ranks: dict[str, RankWork]
    straggler_s: float | None
    not_computed: list[str]

    @property
    def flagged(self) -> list[str]:
        return [rank for rank, work in self.ranks.items() if work.straggler]

    def rank_entry(self, rank: str) -> dict[str, Any]:
        """The per-rank fields of the report (all ``None`` when not computed)."""
        work = self.ranks.get(rank)
        if work is None:
            return dict.fromkeys(("work_ms_median", "wait_ms_median", "score", "straggler"))
        return work.entry()

    def summary(self) -> dict[str, Any] | None:
        """The report's top-level ``stragglers``: the rule and the ranks it flags."""
        if not self.ranks:
            return None
        return {"rule": STRAGGLER_RULE, "ranks": self.flagged}


def _split(incs: Iterable[Incarnation]) -> tuple[dict[tuple[int, int], int], array, array]:
    """{(incarnation, iteration): work ns}, and the work and wait ns arrays, of one rank."""
    work_by_key: dict[tuple[int, int], int] = {}
    works, waits = array("q"), array("q")
    for inc in incs:
        wait_of: dict[int, int] = {}
        for number, start, end in zip(
            inc.waits.numbers, inc.waits.starts, inc.waits.ends, strict=True
        ):
            wait_of[number] = wait_of.get(number, 0) + (end - start)
        finished = zip(
            inc.iterations.numbers, inc.iterations.starts, inc.iterations.ends, strict=True
        )
        for number, start, end in itertools.islice(finished, WARMUP_ITERATIONS, None):
            wait = wait_of.get(number)
            if wait is None:
                continue
            work = max(0, end - start - wait)
            work_by_key[(inc.index, number)] = work
            works.append(work)
            waits.append(wait)
    return work_by_key, works, waits


def find_stragglers(trace: Trace) -> Stragglers:
    """Per-rank work, wait and score, the flagged ranks and ``straggler_s`` (module doc)."""
    if len(trace.ranks) < 2:
        return Stragglers({}, None, ["stragglers: the files hold one rank (export every rank: "
                                     "MEGATRON_OTEL_RANK_STRATEGY=all_ranks)"])  # fmt: skip
    split = {rank: _split(incs) for rank, incs in trace.ranks.items()}
    timed = {rank: parts for rank, parts in split.items() if parts[1]}
    if len(timed) < 2:
        return Stragglers({}, None, ["stragglers: fewer than two ranks have both "
                                     f"{ITERATION_SPAN} and {GRAD_SYNC_FINISH_SPAN} "
                                     "spans (enable the per_step span groups)"])  # fmt: skip
    measured = {rank: parts for rank, parts in timed.items() if len(parts[1]) >= MIN_ITERATIONS}
    if len(measured) < 2:
        return Stragglers({}, None, [f"stragglers: fewer than {MIN_ITERATIONS} iterations after "
                                     f"the first {WARMUP_ITERATIONS} on two ranks, too few to "
                                     "compare"])  # fmt: skip
    medians = {rank: (median(works), median(waits)) for rank, (_, works, waits) in measured.items()}
    best = min(work for work, _ in medians.values())
    ranks = {}
    for rank, (work, wait) in medians.items():
        score = best / work if work > 0 else 1.0
        ranks[rank] = RankWork(
            rank, len(measured[rank][1]), work / 1e6, wait / 1e6, score, score < SCORE_THRESHOLD
        )
    return Stragglers(ranks, _lost_s([by_key for by_key, _, _ in measured.values()]), [])


def _lost_s(per_rank: list[dict[tuple[int, int], int]]) -> float:
    """Sum over iterations every rank finished of (slowest work - fastest work), in s."""
    first, *others = per_rank
    lost = 0
    for key, work in first.items():
        works = [work]
        for other in others:
            found = other.get(key)
            if found is None:
                break
            works.append(found)
        else:
            lost += max(works) - min(works)
    return round(lost / 1e9, 9)
