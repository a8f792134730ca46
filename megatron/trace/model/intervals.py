"""Each checkpoint interval's index and iteration range: from its attributes, else derived.

This project's ``megatron.train`` spans say which interval they are
(``megatron.interval.index``, ``.first_iteration``, ``.last_iteration``).
Megatron-LM's own carry none of that, so ``check``, ``report`` and the
pictures derive the same facts from what any trace has:

* **index**: the interval's position in start order within its incarnation;
* **first and last iteration**: the lowest and highest ``megatron.iteration``
  of the ``megatron.train.iteration`` spans that started inside it (the
  ``per_step`` groups); else the last iteration before the highest
  ``megatron.checkpoint.save`` inside it (a save at N follows iteration
  N - 1, and the lifecycle saves at the end of an interval); a first
  iteration also follows from the previous interval's last, the first
  interval starts where the checkpoint load put the incarnation (its
  ``megatron.iteration``, where the load span has one), and otherwise from
  the interval's length: the lifecycle reroots every ``save_interval``
  passes from the start of the loop, so every interval but an
  incarnation's last is as long as any other whose range is known.

A figure the spans cannot give stays ``None``: reported as not computed,
never guessed. An attribute, where present, wins over derivation.
"""

from __future__ import annotations

import bisect
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

from megatron.trace_format.semconv import (
    INTERVAL_FIRST_ITERATION,
    INTERVAL_INDEX,
    INTERVAL_LAST_ITERATION,
    ITERATION,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from megatron.trace._store.columns import Iterations
    from megatron.trace_format.records import SpanRecord

__all__ = ["IntervalFacts", "by_length", "derive", "derive_each"]


class IntervalFacts(NamedTuple):
    """What is known of one interval; ``derived`` when not from its own attributes.

    (A named tuple: a week's trace has tens of thousands of intervals, and a
    frozen dataclass took three times as long to build.)
    """

    index: int
    first_iteration: int | None
    last_iteration: int | None
    derived: bool


def derive(
    intervals: Sequence[SpanRecord],
    iterations: Iterations,
    saves: Sequence[SpanRecord],
    resumed_from: int | None,
    *,
    last_closed_by_reroot: bool = False,
) -> list[IntervalFacts]:
    """The facts of an incarnation's ``intervals`` (in start order), one per interval, from
    their attributes, else from its finished ``iterations``, its checkpoint ``saves`` and
    the iteration it ``resumed_from``.

    ``last_closed_by_reroot``: the last interval in the file was followed by
    another (lost to a kill), so it too is full length.
    """
    facts = derive_each(intervals, iterations, saves, resumed_from)
    return by_length(facts, len(facts) if last_closed_by_reroot else len(facts) - 1)


def derive_each(
    intervals: Sequence[SpanRecord],
    iterations: Iterations,
    saves: Sequence[SpanRecord],
    resumed_from: int | None,
    known: Sequence[IntervalFacts] = (),
) -> list[IntervalFacts]:
    """:func:`derive`'s facts before :func:`by_length` fills in first iterations from the
    intervals' length: each interval's on its own and from the one before it.

    ``known``: the facts of the first ``len(known)`` intervals, from an earlier call on the
    same intervals, iterations and saves, fewer of them then: only the
    intervals after them are read, which need only the iterations and saves that start
    inside them (so ``iterations`` and ``saves`` may then hold only those and later ones).
    """
    facts: list[IntervalFacts] = list(known)
    # read only for an interval without its range in its attributes (upstream's): the
    # iteration columns and the saves' starts, once
    numbers: Any = None
    starts: Any = None
    ordered = False
    save_starts: list[int] | None = None
    previous_last = known[-1].last_iteration if known else None
    rest = intervals[len(known) :] if known else intervals
    for position, interval in enumerate(rest, start=len(known)):
        attributes = interval["attributes"]
        first = attributes.get(INTERVAL_FIRST_ITERATION)
        last = attributes.get(INTERVAL_LAST_ITERATION)
        derived = first is None or last is None
        if derived:
            lo, hi = interval["start_ns"], interval["end_ns"]
            if numbers is None:
                ordered = iterations.in_start_order()
                numbers, starts = iterations.numbers, iterations.starts
            inside = _numbers_inside(numbers, starts, ordered, lo, hi)
            if first is None:
                if inside:
                    first = min(inside)
                elif position == 0:
                    first = resumed_from
                elif previous_last is not None:
                    first = previous_last + 1
            if last is None:
                if inside:
                    last = max(inside)
                else:
                    if save_starts is None:
                        save_starts = [save["start_ns"] for save in saves]
                    saved = _saved_inside(saves, save_starts, lo, hi)
                    if saved:
                        last = max(saved) - 1
        index = attributes.get(INTERVAL_INDEX)
        facts.append(
            IntervalFacts(
                index if isinstance(index, int) else position,
                first,
                last,
                derived,
            )
        )
        previous_last = last
    return facts


def by_length(facts: list[IntervalFacts], full_count: int) -> list[IntervalFacts]:
    """Fill a first iteration from the length of the full intervals (the first ``full_count``):
    ``facts`` as they are when there is none to fill."""
    full = facts[:full_count]
    lengths = {
        f.last_iteration - f.first_iteration + 1
        for f in full
        if f.first_iteration is not None and f.last_iteration is not None
    }
    if len(lengths) != 1:
        return facts  # none known, or they disagree: not the lifecycle's rule, do not guess
    (length,) = lengths
    return [
        f._replace(first_iteration=f.last_iteration - length + 1)
        if f.first_iteration is None and f.last_iteration is not None and position < len(full)
        else f
        for position, f in enumerate(facts)
    ]


def _numbers_inside(
    numbers: array, starts: array, ordered: bool, lo: int, hi: int
) -> Sequence[int]:
    """Iteration numbers whose span started in ``[lo, hi)``."""
    if ordered:
        return numbers[bisect.bisect_left(starts, lo) : bisect.bisect_left(starts, hi)]
    return [n for n, s in zip(numbers, starts, strict=True) if lo <= s < hi]


def _saved_inside(
    saves: Sequence[SpanRecord], save_starts: list[int], lo: int, hi: int
) -> list[int]:
    """The iterations of the saves that started in ``[lo, hi)`` (they are in start order:
    found by bisection, not by a scan of every save for every interval)."""
    within = saves[bisect.bisect_left(save_starts, lo) : bisect.bisect_left(save_starts, hi)]
    return [
        save["attributes"][ITERATION]
        for save in within
        if isinstance(save["attributes"].get(ITERATION), int)
    ]
