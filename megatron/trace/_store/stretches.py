"""The time a family of frequent spans covers, as a disjoint union in two compact arrays.

Megatron-LM writes checkpoint bookkeeping spans on every loop pass (the
fault-tolerance heartbeat and the non-blocking finalize of an async save),
so keeping them as records would cost per iteration what the trace model
spends per interval. The goodput accounting only needs the time they cover,
and within one category overlap does not matter, so they are folded into a
union of disjoint stretches as they are read: 16 bytes per stretch, and
nested or touching spans (``exposed_save`` around its ``save``) merge into
one.

Spans arrive in end order, nearly in time order, so a new span lands at or
near the tail and merging is amortised O(1); one that lands in the past is
spliced in with a binary search.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator

__all__ = ["Stretches"]


class Stretches:
    """A union of ``[start, end)`` stretches in integer nanoseconds, kept disjoint and sorted."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        starts, ends = self.starts, self.ends
        if not starts or start > ends[-1]:
            starts.append(start)
            ends.append(end)
            return
        # The stretches [lo, hi) overlap or touch [start, end): replace them by their union.
        lo = bisect.bisect_left(ends, start)
        hi = bisect.bisect_right(starts, end)
        if lo == hi:
            starts.insert(lo, start)
            ends.insert(lo, end)
            return
        merged_start, merged_end = min(start, starts[lo]), max(end, ends[hi - 1])
        del starts[lo + 1 : hi]
        del ends[lo + 1 : hi]
        starts[lo], ends[lo] = merged_start, merged_end

    def covered(self) -> int:
        """Total nanoseconds covered."""
        return sum(self.ends) - sum(self.starts)

    def clipped(self, lo: int, hi: int) -> Stretches:
        """The part of the union inside ``[lo, hi)`` (the stretches there copied whole, the
        first and last cut: ``watch`` clips an in-process restart's at every scrape)."""
        part = Stretches()
        first = bisect.bisect_right(self.ends, lo)
        last = max(first, bisect.bisect_left(self.starts, hi))
        part.starts, part.ends = self.starts[first:last], self.ends[first:last]
        if first < last:
            part.starts[0] = max(part.starts[0], lo)
            part.ends[-1] = min(part.ends[-1], hi)
        return part
