"""The structural records a process wrote, each pickled on its own, on disk once there are many.

The trace model keeps a few records per checkpoint interval (the interval, its
save, an evaluation) and the hang watchdog's. As the reader's
:class:`~megatron.trace_format.records.SpanRecord` each costs about a
kilobyte of Python objects: a week of many ranks checkpointing often holds
hundreds of thousands of them, more memory than the rest of a read. So a
:class:`RecordLog` keeps each record as its pickle (a fifth of the size), and
from :data:`SPILL_RECORDS` records on writes them out as a *block* to the
read's temporary file (:mod:`megatron.trace._store.spill`), keeping in memory only
what sorting and locating them takes: a start, a line and a few small
indices a record, about 40 bytes.

The record's resource, file and line are not pickled with it: a process's records
share a handful of them (the log's *contexts*), held once. Reading a record
(``log[i]``, :meth:`RecordLog.records`) decodes a new dict, which the reader
drops when done; the incarnations of the trace model hold :class:`RecordList`
views (the log and the positions of their records in it), so every reader
streams through a rank's intervals without their dicts piling up.

A log that crosses a pipe (a worker's summary) travels as its pickles in
memory; the receiving process spills them again itself.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import os
import pickle
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

from megatron.trace._store import spill
from megatron.trace_format.records import SpanFields, SpanRecord, attributes_cut_short, span_record

__all__ = ["SPILL_RECORDS", "RecordList", "RecordLog", "extents", "extents_from", "latest"]

#: From this many records in memory on, a log writes them to disk as a block
#: (about 150 KB of pickles; a read holds a log per process).
SPILL_RECORDS = 512

# What a record's pickle holds: its SpanFields, as a plain tuple (the resource and the
# file are the log's contexts; the line is kept beside the starts).
_PICKLED = operator.itemgetter(*SpanFields._fields)
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class _Block:
    """Records written one after another at ``offset``; ``ends`` says where each ends."""

    __slots__ = ("ends", "offset", "store")

    def __init__(self, store: spill.Store, offset: int, ends: array) -> None:
        self.store, self.offset, self.ends = store, offset, ends

    def __len__(self) -> int:
        return len(self.ends)

    def data(self) -> bytes:
        """Every record's pickle, one after another (one read)."""
        return self.store.read(self.offset, self.ends[-1])

    def pickles(self) -> list[bytes]:
        data = self.data()
        return [data[lo:hi] for lo, hi in zip([0, *self.ends[:-1]], self.ends, strict=True)]


class RecordLog:
    """A process's structural records in the order added (module docstring)."""

    __slots__ = (
        "_blocks",
        "_context",
        "_contexts",
        "_cut",
        "_ends",
        "_firsts",
        "_last",
        "_line",
        "_name",
        "_names",
        "_spilled",
        "_starts",
        "_tail",
    )

    def __init__(self) -> None:
        self._tail: list[bytes] = []  # the pickles not written out yet
        self._blocks: list[_Block] = []
        self._firsts: list[int] = []  # the position of each block's first record
        self._spilled = 0  # how many records the blocks hold
        self._starts = array("q")  # every record's start_ns: the sort key
        self._line = array("q")  # every record's line in its file
        self._ends = array("q")  # ... its end_ns
        self._cut = bytearray()  # ... whether it is marked cut short (1) or not (0)
        self._contexts: list[tuple[dict[str, Any], Path | None]] = []
        self._context = array("I")  # every record's context (resource, file)
        self._names: list[str] = []
        self._name = array("I")  # every record's name, as its position in _names
        self._last: tuple[Any, Any, int] | None = None  # the context added last

    @property
    def spilled(self) -> bool:
        """Whether some of its records were written to the spill file (in blocks)."""
        return bool(self._blocks)

    @property
    def blocks(self) -> tuple[_Block, ...]:
        """Where its spilled records lie, in order (empty while none are): each block's
        ``store`` is the file it is in, whose ``pid`` says which process wrote it."""
        return tuple(self._blocks)

    def __len__(self) -> int:
        return len(self._starts)

    def append(self, record: SpanRecord) -> None:
        self.add(_PICKLED(record), record["resource"], record["file"], record["line"])

    def add(
        self, fields: tuple[Any, ...], resource: dict[str, Any], file: Path | None, line: int
    ) -> None:
        """:meth:`append` of the record :func:`span_record` would build of these (``fields``:
        its arguments up to ``kind``), without building it (the reader's hot path)."""
        last = self._last
        if last is None or last[0] is not resource or last[1] is not file:
            last = self._last = (resource, file, self._context_of(resource, file))
        self._context.append(last[2])
        self._name.append(self._name_of(fields[0]))
        self._starts.append(fields[4])
        self._ends.append(fields[5])
        self._cut.append(1 if fields[6] and attributes_cut_short(fields[6]) else 0)
        self._line.append(line)
        self._tail.append(pickle.dumps(tuple(fields), _PROTOCOL))
        if len(self._tail) >= SPILL_RECORDS:
            self._spill()

    def extend(self, other: RecordLog) -> None:
        """Add ``other``'s records after these."""
        contexts = [self._context_of(resource, file) for resource, file in other._contexts]
        names = [self._name_of(name) for name in other._names]
        for block in other._blocks:
            ours = block.store.pid == os.getpid()
            if ours:
                self._spill()  # (keeps the order: what is in memory goes out first)
            if ours and not self._tail:
                self._firsts.append(self._spilled)
                self._blocks.append(block)  # shared, not read
                self._spilled += len(block)
            else:  # another process wrote it, or records wait in memory before it
                self._tail.extend(block.pickles())
        self._tail.extend(other._tail)
        self._starts.extend(other._starts)
        self._ends.extend(other._ends)
        self._cut.extend(other._cut)
        self._line.extend(other._line)
        self._context.extend(contexts[i] for i in other._context)
        self._name.extend(names[i] for i in other._name)
        if len(self._tail) >= SPILL_RECORDS:
            self._spill()

    def _context_of(self, resource: dict[str, Any], file: Path | None) -> int:
        for index, (theirs, their_file) in enumerate(self._contexts):
            if (theirs is resource or theirs == resource) and their_file == file:
                return index
        self._contexts.append((resource, file))
        return len(self._contexts) - 1

    def _name_of(self, name: str) -> int:
        try:
            return self._names.index(name)  # (a handful of names)
        except ValueError:
            self._names.append(name)
            return len(self._names) - 1

    def _spill(self) -> None:
        if not self._tail:
            return
        ends = array("q", itertools.accumulate(map(len, self._tail)))
        written = spill.write([b"".join(self._tail)])
        if written is None:  # no room for a temporary file: the records stay here
            return
        store, offset = written
        self._firsts.append(self._spilled)
        self._blocks.append(_Block(store, offset, ends))
        self._spilled += len(self._tail)
        self._tail = []

    @property
    def starts(self) -> array:
        """Every record's start (ns), in order (the array itself: do not change it)."""
        return self._starts

    @property
    def ends(self) -> array:
        """Every record's end (ns), as :attr:`starts`."""
        return self._ends

    def name(self, position: int) -> str:
        """The name of the record at ``position``, without decoding it."""
        return self._names[self._name[position]]

    def cut_short(self, position: int) -> bool:
        """Whether the record at ``position`` is marked cut short, without decoding it."""
        return bool(self._cut[position])

    def __getitem__(self, position: int) -> SpanRecord:
        return next(self.records([position]))

    def __iter__(self) -> Iterator[SpanRecord]:
        return self.records(range(len(self)))

    def records(self, positions: Iterable[int]) -> Iterator[SpanRecord]:
        """The records at ``positions``, decoded one at a time (a block is read once for
        a run of its records)."""
        size, spilled, tail, loads = len(self), self._spilled, self._tail, pickle.loads
        contexts, context, lines = self._contexts, self._context, self._line
        lo = hi = 0  # the positions of the block read last
        pickles: list[bytes] = []
        for position in positions:
            if position >= spilled:
                if position >= size:
                    raise IndexError(f"record {position} of {size}")
                data = tail[position - spilled]
            else:
                if not lo <= position < hi:
                    if position < 0:
                        raise IndexError(f"record {position} of {size}")
                    block = bisect.bisect_right(self._firsts, position) - 1
                    lo, pickles = self._firsts[block], self._blocks[block].pickles()
                    hi = lo + len(pickles)
                data = pickles[position - lo]
            resource, file = contexts[context[position]]
            yield span_record(loads(data), resource, file, lines[position])

    def view(self, positions: array, ordered: bool = False) -> RecordList:
        """The records at ``positions`` as a sequence (read as it is iterated); ``ordered``:
        the positions are in start order (ties in log order), which finds the latest
        record by bisection."""
        return RecordList(self, positions, ordered)

    def __getstate__(self) -> tuple[Any, ...]:
        pickles = [data for block in self._blocks for data in block.pickles()]
        state = (self._starts, self._ends, self._cut, self._line, self._context, self._contexts)
        return (pickles + self._tail, *state, self._name, self._names)  # in memory across a pipe

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._tail, self._starts, self._ends, self._cut, self._line = state[:5]
        self._context, self._contexts, self._name, self._names = state[5:]
        self._blocks, self._firsts, self._spilled, self._last = [], [], 0, None


class RecordList(Sequence[SpanRecord]):
    """Some of a log's records (an incarnation's intervals, say), in the order given:
    a sequence of :class:`SpanRecord` decoded as it is read."""

    __slots__ = ("_log", "_ordered", "_positions")

    def __init__(self, log: RecordLog, positions: array, ordered: bool = False) -> None:
        self._log, self._positions, self._ordered = log, positions, ordered

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def log(self) -> RecordLog:
        """The log the records are in (its ``starts`` and ``ends`` columns, undecoded)."""
        return self._log

    @property
    def positions(self) -> array:
        """The records' positions in :attr:`log`, in this list's order."""
        return self._positions

    @overload
    def __getitem__(self, index: int) -> SpanRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[SpanRecord]: ...
    def __getitem__(self, index: int | slice) -> SpanRecord | list[SpanRecord]:
        if isinstance(index, slice):
            return list(self._log.records(self._positions[index]))
        return self._log[self._positions[index]]

    def __iter__(self) -> Iterator[SpanRecord]:
        return self._log.records(self._positions)

    def extents(self) -> Iterator[tuple[int, int, str]]:
        """(start, end, name) of each record, without decoding any."""
        log = self._log
        starts, ends = log.starts, log.ends
        return ((starts[i], ends[i], log.name(i)) for i in self._positions)

    def from_start(self, start_ns: int) -> RecordList:
        """The records that start at ``start_ns`` or later, as a view (of a list in start
        order: found by bisection, nothing decoded)."""
        starts, positions = self._log.starts, self._positions
        if self._ordered:
            first = bisect.bisect_left(positions, start_ns, key=starts.__getitem__)
            return RecordList(self._log, positions[first:], True)
        return RecordList(self._log, array("q", (p for p in positions if starts[p] >= start_ns)))

    def extents_from(self, start_ns: int) -> Iterator[tuple[int, int, str]]:
        """:meth:`extents` of the records that start at ``start_ns`` or later (found by
        bisection in a list in start order)."""
        log = self._log
        starts, ends, positions = log.starts, log.ends, self._positions
        if self._ordered:
            first = bisect.bisect_left(positions, start_ns, key=starts.__getitem__)
            positions = positions[first:]
        return ((starts[i], ends[i], log.name(i)) for i in positions if starts[i] >= start_ns)

    def latest(self) -> SpanRecord | None:
        """The first record of the latest start (None: none), decoding only it (found by
        bisection in a list in start order: ``watch`` asks at every scrape)."""
        starts = self._log.starts
        positions = self._positions
        if self._ordered:
            if not positions:
                return None
            first = bisect.bisect_left(positions, starts[positions[-1]], key=starts.__getitem__)
            return self._log[positions[first]]
        best = None
        for position in self._positions:
            if best is None or starts[position] > starts[best]:
                best = position
        return None if best is None else self._log[best]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # (equal to a list: unhashable as one is)

    def __repr__(self) -> str:
        return f"RecordList({list(self)!r})"


def extents(records: Iterable[SpanRecord]) -> Iterator[tuple[int, int, str]]:
    """(start, end, name) of each record: without decoding any of a :class:`RecordList`."""
    if isinstance(records, RecordList):
        return records.extents()
    return ((r["start_ns"], r["end_ns"], r["name"]) for r in records)


def extents_from(records: Iterable[SpanRecord], start_ns: int) -> Iterator[tuple[int, int, str]]:
    """:func:`extents` of the records that start at ``start_ns`` or later."""
    if isinstance(records, RecordList):
        return records.extents_from(start_ns)
    return (extent for extent in extents(records) if extent[0] >= start_ns)


def latest(records: Sequence[SpanRecord]) -> SpanRecord | None:
    """``max(records, key=start)``: the first record of the latest start, or None."""
    if isinstance(records, RecordList):
        return records.latest()
    return max(records, key=lambda record: record["start_ns"], default=None)
