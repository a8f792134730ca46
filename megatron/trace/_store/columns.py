"""Finished iterations as compact integer columns, on disk once there are many.

The trace model keeps every finished ``megatron.train.iteration`` (and every
gradient all-reduce wait) as three int64 columns: number, start, end, 24 bytes
a row. A week of a many-rank job is tens of millions of rows, gigabytes if
they all stayed in memory while the readers want one incarnation's at a time.
So a column set holds its newest rows in memory and, from :data:`SPILL_ROWS`
rows on, writes them out as a *block* to the read's temporary file
(:mod:`megatron.trace._store.spill`: deleted as it is created, read by forked
workers too, kept in memory where it cannot be written) and keeps only where
the block lies. Reading a column (:attr:`Iterations.numbers` and its
siblings) returns a new array of it, blocks and tail together, which the
reader drops when done; a column set that never spilled returns its arrays as
they are, so a small trace costs no file and no copy.

A column set that crosses a pipe (a worker's summary, pickled) travels as
its columns in memory, and the receiving process spills them again itself.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import operator
import os
from array import array
from collections.abc import Iterator
from typing import Any

from megatron.trace._store import spill

__all__ = ["SPILL_ROWS", "Iterations"]

#: From this many rows in memory on, a column set writes them to disk as a block
#: (192 KB: a block costs one read; a read holds a column set per process, two with
#: the gradient waits, so a job of many ranks holds many of these tails at once).
SPILL_ROWS = 1 << 13

_ROW = 8  # bytes per value (int64)


class _Block:
    """Rows ``lo`` up to ``hi`` of a block of ``rows`` rows written at ``offset``."""

    __slots__ = ("hi", "lo", "offset", "rows", "store")

    def __init__(self, store: spill.Store, offset: int, rows: int, lo: int, hi: int) -> None:
        self.store, self.offset, self.rows, self.lo, self.hi = store, offset, rows, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def read_into(self, out: array, column: int) -> None:
        at = self.offset + (column * self.rows + self.lo) * _ROW
        out.frombytes(self.store.read(at, (self.hi - self.lo) * _ROW))

    def value(self, column: int) -> int:
        """The first row's value in ``column``."""
        one = array("q")
        self.part(0, 1).read_into(one, column)
        return one[0]

    def part(self, lo: int, hi: int) -> _Block:
        """Rows ``lo`` up to ``hi`` of this one (counted from its first)."""
        return _Block(self.store, self.offset, self.rows, self.lo + lo, self.lo + hi)


class Iterations:
    """Finished iterations as parallel columns (number, start, end: 24 bytes each), in
    the order added; on disk in blocks beyond :data:`SPILL_ROWS` (module docstring)."""

    __slots__ = ("_blocks", "_firsts", "_scan", "_spilled", "_tail")

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._firsts: list[int] = []  # the row each block starts at
        self._spilled = 0  # the rows the blocks hold
        self._tail = (array("q"), array("q"), array("q"))
        self._scan: _Scan | None = None

    def __len__(self) -> int:
        return len(self._tail[0]) + self._spilled

    @property
    def spilled(self) -> bool:
        """Whether some of its rows were written to the spill file (in blocks)."""
        return bool(self._blocks)

    @property
    def blocks(self) -> tuple[_Block, ...]:
        """Where its spilled rows lie, in row order (empty while none are): each block's
        ``store`` is the file it is in, whose ``pid`` says which process wrote it."""
        return tuple(self._blocks)

    def _add_block(self, block: _Block) -> None:
        self._firsts.append(self._spilled)
        self._blocks.append(block)
        self._spilled += len(block)

    def append(self, number: int, start_ns: int, end_ns: int) -> None:
        numbers, starts, ends = self._tail
        numbers.append(number)
        starts.append(start_ns)
        ends.append(end_ns)
        if len(numbers) >= SPILL_ROWS:
            self._spill()

    def arrays(self) -> tuple[array, array, array]:
        """The in-memory arrays to append rows to (numbers, starts, ends) in a hot loop;
        whatever they held before is written out first when they hold enough. Append
        at most a batch's worth before asking again."""
        if len(self._tail[0]) >= SPILL_ROWS:
            self._spill()
        return self._tail

    def extend(self, other: Iterations) -> None:
        """Add ``other``'s rows after these."""
        for block in other._blocks:
            ours = block.store.pid == os.getpid()
            if ours:
                self._spill()  # (keeps the order: what is in memory goes out first)
            if ours and not self._tail[0]:
                self._add_block(block)  # shared, not read
            else:  # another process wrote it, or rows stay in memory before it: read it
                for mine, column in zip(self._tail, range(3), strict=True):
                    block.read_into(mine, column)
        for mine, theirs in zip(self._tail, other._tail, strict=True):
            mine.extend(theirs)
        if len(self._tail[0]) >= SPILL_ROWS:
            self._spill()

    def _spill(self) -> None:
        rows = len(self._tail[0])
        written = spill.write(self._tail) if rows else None
        if written is None:  # nothing to write, or no room for it: the rows stay here
            return
        store, offset = written
        self._add_block(_Block(store, offset, rows, 0, rows))
        self._tail = (array("q"), array("q"), array("q"))

    def _column(self, column: int) -> array:
        if not self._blocks:
            return self._tail[column]  # never spilled: the array itself, no copy
        out = array("q")
        for block in self._blocks:
            block.read_into(out, column)
        out.extend(self._tail[column])
        return out

    @property
    def numbers(self) -> array:
        """Every number, in order (a new array once spilled: read it once, then drop it)."""
        return self._column(0)

    @property
    def starts(self) -> array:
        """Every start (ns), in order; as :attr:`numbers`."""
        return self._column(1)

    @property
    def ends(self) -> array:
        """Every end (ns), in order; as :attr:`numbers`."""
        return self._column(2)

    def first_number(self) -> int | None:
        """The first row's number, without reading the column (None: no rows)."""
        if self._blocks:
            return self._blocks[0].value(0)
        return self._tail[0][0] if self._tail[0] else None

    def last_number(self) -> int | None:
        """The last row's number, as :meth:`first_number`."""
        if self._tail[0]:
            return self._tail[0][-1]
        if self._blocks:
            last = self._blocks[-1]
            return last.part(len(last) - 1, len(last)).value(0)
        return None

    def slice(self, lo: int, hi: int, earlier: Iterations | None = None) -> Iterations:
        """Rows ``lo`` up to ``hi``: blocks are shared (nothing is read), the tail copied.
        ``earlier``: a slice of these rows from ``lo`` to no further than ``hi``, whose
        scan (:meth:`min_start` and its siblings) the new one goes on from."""
        part = Iterations()
        if earlier is not None and earlier._scan is not None:
            part._scan = copy.copy(earlier._scan)
        blocks, firsts = self._blocks, self._firsts
        # from the block row lo lies in (found by bisection: a week's column has many)
        for index in range(max(0, bisect.bisect_right(firsts, lo) - 1), len(blocks)):
            at, block = firsts[index], blocks[index]
            if at >= hi:
                break
            start, stop = max(lo - at, 0), min(hi - at, len(block))
            if start < stop:
                part._add_block(block.part(start, stop))
        at = self._spilled
        start, stop = max(lo - at, 0), max(hi - at, 0)
        part._tail = tuple(column[start:stop] for column in self._tail)  # type: ignore[assignment]
        return part

    def parts(self, rows: int | None = None) -> Iterator[Iterations]:
        """The rows in order, ``rows`` (default :data:`SPILL_ROWS`) at a time, each part a
        :meth:`slice`: a reader that goes part by part holds one part's columns, not all.
        Two column sets of as many rows give parts of the same row ranges."""
        rows = SPILL_ROWS if rows is None else rows
        for lo in range(0, len(self), rows):
            yield self.slice(lo, lo + rows)

    def start_of(self, number: int) -> int | None:
        """Start of the first finished iteration numbered ``number`` or higher."""
        found = (
            min(
                (s for n, s in zip(part.numbers, part.starts, strict=True) if n >= number),
                default=None,
            )
            for part in self.parts()
        )
        return min((start for start in found if start is not None), default=None)

    def end_before(self, number: int) -> int | None:
        """End of the last finished iteration numbered below ``number`` (None: none): where
        iteration ``number`` began, or would have."""
        found = (
            max(
                (e for n, e in zip(part.numbers, part.ends, strict=True) if n < number),
                default=None,
            )
            for part in self.parts()
        )
        return max((end for end in found if end is not None), default=None)

    def count_from(self, number: int) -> int:
        """How many finished iterations are numbered ``number`` or higher."""
        return sum(sum(1 for n in part.numbers if n >= number) for part in self.parts())

    def _scanned(self) -> _Scan:
        """:class:`_Scan` of every row: the rows added since the last call read, a part at a
        time, and folded into what the earlier ones gave (rows are only ever appended)."""
        scan = self._scan
        if scan is None:
            scan = self._scan = _Scan()
        count = len(self)
        if scan.rows < count:
            for part in self.slice(scan.rows, count).parts():
                scan.add(part.starts, part.ends)
            scan.rows = count
        return scan

    def min_start(self) -> int | None:
        """The earliest start (None: no rows); only rows not asked about before are read."""
        return self._scanned().min_start

    def max_start(self) -> int | None:
        """The latest start, as :meth:`min_start`."""
        return self._scanned().max_start

    def max_end(self) -> int | None:
        """The latest end, as :meth:`min_start`."""
        return self._scanned().max_end

    def in_start_order(self) -> bool:
        """Whether every row starts no earlier than the one before, as :meth:`min_start`."""
        return self._scanned().ordered

    def durations(self) -> Any:
        """Every row's end - start (ns), in order, as a new int64 numpy array."""
        import numpy as np  # here: the model builds columns without numpy

        starts = np.frombuffer(self.starts, dtype=np.int64)
        return np.frombuffer(self.ends, dtype=np.int64) - starts

    def rows(self) -> Iterator[tuple[int, int, int]]:
        """(number, start, end) of every row, in order."""
        return zip(self.numbers, self.starts, self.ends, strict=True)

    def __getstate__(self) -> tuple[array, array, array]:
        return self.numbers, self.starts, self.ends  # in memory across a pipe

    def __setstate__(self, state: Any) -> None:
        self._blocks, self._firsts, self._spilled = [], [], 0
        self._tail = tuple(state)
        self._scan = None


class _Scan:
    """What :meth:`Iterations.min_start` and its siblings need of the first ``rows`` rows.

    Kept with the column set, so a trace model finished again and again as its files
    grow (``watch``) reads each row once for them, not the whole history every time.
    """

    __slots__ = ("last_start", "max_end", "max_start", "min_start", "ordered", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self.ordered = True
        self.last_start: int | None = None
        self.min_start: int | None = None
        self.max_start: int | None = None
        self.max_end: int | None = None

    def add(self, starts: array, ends: array) -> None:
        """Fold in the next rows' starts and ends (one part: not empty)."""
        low, high, end = min(starts), max(starts), max(ends)
        if self.ordered:
            last = self.last_start
            self.ordered = (last is None or starts[0] >= last) and all(
                map(operator.le, starts, itertools.islice(starts, 1, None))
            )
        self.last_start = starts[-1]
        self.min_start = low if self.min_start is None else min(self.min_start, low)
        self.max_start = high if self.max_start is None else max(self.max_start, high)
        self.max_end = end if self.max_end is None else max(self.max_end, end)
