"""Exact order statistics (median, percentiles) of values read in chunks, in flat memory.

The report's iteration figures and the straggler medians are order
statistics of a value per iteration: a week of one rank is millions of them,
which the trace model keeps on disk (:mod:`megatron.trace._store.columns`). Sorting
or partitioning them takes them all in memory at once. :func:`select` instead
reads the chunks a few times, a radix digit of 16 bits per pass: each pass
counts, among the values that share the digits found so far, how many have
each next digit, and keeps the digit where the wanted rank falls. A range of
2**40 (18 minutes in ns) takes three passes, whatever the count, and memory
is a chunk and a table of 65,536 counts per rank asked for.

Values are int64; non-negative float64s order as their bits do, so
:func:`float_keys` and :func:`from_float_keys` select among those too. The
result is exact: the same values a sort would put at those ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "DIGIT_BITS",
    "IN_MEMORY",
    "float_keys",
    "from_float_keys",
    "median",
    "median_and_quartiles",
    "quartile_ranks",
    "select",
]

#: Bits of the value found per pass over the chunks.
DIGIT_BITS = 16
#: Up to this many values, they are gathered and partitioned in memory (8 bytes
#: each): one pass, and nothing left to save.
IN_MEMORY = 1 << 16


def select(chunks: Callable[[], Iterable[Any]], ranks: Sequence[int]) -> list[int]:
    """The values at the 0-based ``ranks`` in sorted order of all the int64 values the
    arrays ``chunks()`` yields (called once per pass, each time yielding the same).

    Raises :class:`IndexError` for a rank outside the values."""
    return _selected(chunks, lambda _count: ranks)[0]


def median(chunks: Callable[[], Iterable[Any]]) -> tuple[float, int]:
    """The median of the int64 values (as :func:`statistics.median` gives it) and their
    count; (0.0, 0) for none. (The count comes from the selection's first pass.)"""
    values, count = _selected(chunks, _middle)
    if not count:
        return 0.0, 0
    return (float(values[0]) if count % 2 else (values[0] + values[1]) / 2), count


def median_and_quartiles(chunks: Callable[[], Iterable[Any]]) -> tuple[float, int, int, int]:
    """(median, lower quartile, upper quartile, count) of the int64 values, in the same
    passes; (0.0, 0, 0, 0) for none. The quartiles are the values at the 0-based ranks
    ``floor((count - 1) / 4)`` and ``ceil(3 (count - 1) / 4)`` in sorted order: order
    statistics rounded outward (no interpolation), so the middle half they span is never
    narrower than the values' own."""
    values, count = _selected(chunks, lambda n: [*quartile_ranks(n), *_middle(n)])
    if not count:
        return 0.0, 0, 0, 0
    low, high, *middle = values
    mid = float(middle[0]) if count % 2 else (middle[0] + middle[1]) / 2
    return mid, low, high, count


def quartile_ranks(count: int) -> list[int]:
    """The ranks of the lower and upper quartile of ``count`` values (none of none)."""
    return [] if not count else [(count - 1) // 4, -(-3 * (count - 1) // 4)]


def _middle(count: int) -> list[int]:
    """The ranks a median of ``count`` values takes: the middle one, or the middle two."""
    middle = count // 2
    return [] if not count else [middle] if count % 2 else [middle - 1, middle]


def _selected(
    chunks: Callable[[], Iterable[Any]], ranks_of: Callable[[int], Sequence[int]]
) -> tuple[list[int], int]:
    """:func:`select` of the ranks ``ranks_of`` names once the values are counted, and
    the count."""
    import numpy as np

    count, low, high, kept = 0, None, None, []
    for chunk in chunks():
        if not len(chunk):
            continue
        count += len(chunk)
        low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
        high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
        if count <= IN_MEMORY:
            kept.append(np.array(chunk, dtype=np.int64))  # (a copy: the caller's may be reused)
        else:
            kept = []
    ranks = ranks_of(count)
    if not ranks:
        return [], count
    for rank in ranks:
        if not 0 <= rank < count:
            raise IndexError(f"rank {rank} of {count} values")
    if count <= IN_MEMORY:
        values = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
        values.partition(list(ranks))
        return [int(values[rank]) for rank in ranks], count
    assert low is not None and high is not None
    prefixes = [0] * len(ranks)  # per rank: the digits of its offset from low found so far
    below = [0] * len(ranks)  # ... and how many values lie below that prefix's range
    base = np.int64(low)
    remaining = (high - low).bit_length()  # the offsets' bits not known yet
    while remaining:
        step = min(DIGIT_BITS, remaining)
        shift = remaining - step
        counts = [np.zeros(1 << step, dtype=np.int64) for _ in ranks]
        for chunk in chunks():
            # (wrapping int64 arithmetic: the offset is right modulo 2**64)
            offsets = (np.asarray(chunk, dtype=np.int64) - base).view(np.uint64)
            digit = ((offsets >> np.uint64(shift)) & np.uint64((1 << step) - 1)).astype(np.intp)
            known = offsets >> np.uint64(remaining) if remaining < 64 else None
            for index, prefix in enumerate(prefixes):
                mine = digit if known is None else digit[known == np.uint64(prefix)]
                counts[index] += np.bincount(mine, minlength=1 << step)
        for index, rank in enumerate(ranks):
            cumulative = np.cumsum(counts[index])
            found = int(np.searchsorted(cumulative, rank - below[index], side="right"))
            below[index] += int(cumulative[found - 1]) if found else 0
            prefixes[index] = (prefixes[index] << step) | found
        remaining = shift
    return [low + prefix for prefix in prefixes], count


def float_keys(values: Any) -> Any:
    """Non-negative float64 values as int64 keys that order as the values do."""
    import numpy as np

    return np.ascontiguousarray(values, dtype=np.float64).view(np.int64)


def from_float_keys(keys: Sequence[int]) -> list[float]:
    """The float64 values of keys :func:`float_keys` made."""
    import numpy as np

    return [float(value) for value in np.array(keys, dtype=np.int64).view(np.float64)]
