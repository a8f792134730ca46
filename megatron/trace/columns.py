"""Finished iterations as compact integer columns, on disk once there are many.

The trace model keeps every finished ``megatron.train.iteration`` (and every
gradient all-reduce wait) as three int64 columns: number, start, end, 24 bytes
a row. A week of a many-rank job is tens of millions of rows, gigabytes if
they all stayed in memory while the readers want one incarnation's at a time.
So a column set holds its newest rows in memory and, from :data:`SPILL_ROWS`
rows on, writes them out as a *block* to an anonymous temporary file (deleted
as it is created: nothing is left behind, whatever ends the process) and
keeps only where the block lies. Reading a column (:attr:`Iterations.numbers`
and its siblings) returns a new array of it, blocks and tail together, which
the reader drops when done; a column set that never spilled returns its
arrays as they are, so a small trace costs no file and no copy.

Blocks are read with ``os.pread`` (no shared file offset), so processes
forked from the one that wrote them (the export's workers) read them too; a
process writes only to a file of its own (:func:`_store` checks the pid).
The file lives while a block of it does, so a long-lived process that reads
trace after trace does not pile them up on disk; where no temporary file can
be written (``TMPDIR`` read-only or full) the columns stay in memory.
A column set that crosses a pipe (a worker's summary, pickled) travels as
its columns in memory, and the receiving process spills them again itself.
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref
from array import array
from collections.abc import Iterator
from typing import Any

__all__ = ["SPILL_ROWS", "Iterations"]

#: From this many rows in memory on, a column set writes them to disk as a block
#: (1.5 MB: big enough that a block costs one read, small beside what it saves).
SPILL_ROWS = 1 << 16

_ROW = 8  # bytes per value (int64)


class _Store:
    """One process's temporary file of blocks, appended to and read by offset."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # open for the process's life (closed, and so freed, when it exits)
        self._file = tempfile.TemporaryFile(prefix="megatron-trace-columns-")  # noqa: SIM115
        self._end = 0
        self._lock = threading.Lock()  # readers on a thread pool share the store

    def write(self, columns: tuple[array, ...]) -> int:
        """Append the columns (the same length) one after another; returns where."""
        size = sum(len(column) for column in columns) * _ROW
        with self._lock:
            offset, self._end = self._end, self._end + size
        at, fd = offset, self._file.fileno()
        for column in columns:
            data = memoryview(column).cast("B")
            written = 0
            while written < len(data):  # (a short write is legal: go on where it stopped)
                written += os.pwrite(fd, data[written:], at + written)
            at += len(data)
        return offset

    def read_into(self, out: array, at: int, rows: int) -> None:
        """Append ``rows`` values stored at byte ``at`` to ``out``."""
        size = rows * _ROW
        data = os.pread(self._file.fileno(), size, at)
        if len(data) != size:  # the file is ours and was written whole: never expected
            raise OSError(f"column store: read {len(data)} of {size} bytes at {at}")
        out.frombytes(data)


# The store blocks are written to now: held weakly, so that once the last block of a
# read is dropped its file is closed (and its disk space freed), and the next read
# starts a file of its own.
_STORE: weakref.ref[_Store] | None = None
_STORE_LOCK = threading.Lock()
# Set when no temporary file could be written (TMPDIR unwritable or full), or where
# there is no positioned I/O (os.pread and os.pwrite are POSIX's): the columns then
# stay in memory, as they would for a small trace.
_UNWRITABLE: list[OSError] = (
    [] if hasattr(os, "pread") and hasattr(os, "pwrite") else [OSError("no os.pwrite")]
)


def _store() -> _Store:
    """This process's store (a forked child makes its own before writing)."""
    global _STORE
    with _STORE_LOCK:
        store = _STORE() if _STORE is not None else None
        if store is None or store.pid != os.getpid():
            store = _Store()
            _STORE = weakref.ref(store)
        return store


class _Block:
    """Rows ``lo`` up to ``hi`` of a block of ``rows`` rows written at ``offset``."""

    __slots__ = ("hi", "lo", "offset", "rows", "store")

    def __init__(self, store: _Store, offset: int, rows: int, lo: int, hi: int) -> None:
        self.store, self.offset, self.rows, self.lo, self.hi = store, offset, rows, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def read_into(self, out: array, column: int) -> None:
        at = self.offset + (column * self.rows + self.lo) * _ROW
        self.store.read_into(out, at, self.hi - self.lo)

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

    __slots__ = ("_blocks", "_tail")

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._tail = (array("q"), array("q"), array("q"))

    def __len__(self) -> int:
        return len(self._tail[0]) + sum(map(len, self._blocks))

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
                self._blocks.append(block)  # shared, not read
            else:  # another process wrote it, or rows stay in memory before it: read it
                for mine, column in zip(self._tail, range(3), strict=True):
                    block.read_into(mine, column)
        for mine, theirs in zip(self._tail, other._tail, strict=True):
            mine.extend(theirs)
        if len(self._tail[0]) >= SPILL_ROWS:
            self._spill()

    def _spill(self) -> None:
        rows = len(self._tail[0])
        if not rows or _UNWRITABLE:
            return
        try:
            store = _store()
            offset = store.write(self._tail)
        except OSError as error:  # no room for a temporary file: keep the rows here
            _UNWRITABLE.append(error)
            return
        self._blocks.append(_Block(store, offset, rows, 0, rows))
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

    def slice(self, lo: int, hi: int) -> Iterations:
        """Rows ``lo`` up to ``hi``: blocks are shared (nothing is read), the tail copied."""
        part = Iterations()
        at = 0
        for block in self._blocks:
            start, stop = max(lo - at, 0), min(hi - at, len(block))
            if start < stop:
                part._blocks.append(block.part(start, stop))
            at += len(block)
        start, stop = max(lo - at, 0), max(hi - at, 0)
        part._tail = tuple(column[start:stop] for column in self._tail)  # type: ignore[assignment]
        return part

    def start_of(self, number: int) -> int | None:
        """Start of the first finished iteration numbered ``number`` or higher."""
        found = [s for n, s in zip(self.numbers, self.starts, strict=True) if n >= number]
        return min(found) if found else None

    def count_from(self, number: int) -> int:
        """How many finished iterations are numbered ``number`` or higher."""
        return sum(1 for n in self.numbers if n >= number)

    def rows(self) -> Iterator[tuple[int, int, int]]:
        """(number, start, end) of every row, in order."""
        return zip(self.numbers, self.starts, self.ends, strict=True)

    def __getstate__(self) -> tuple[array, array, array]:
        return self.numbers, self.starts, self.ends  # in memory across a pipe

    def __setstate__(self, state: Any) -> None:
        self._blocks = []
        self._tail = tuple(state)
