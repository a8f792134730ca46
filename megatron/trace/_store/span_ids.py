"""Every span id of a trace, as 64-bit integers: duplicates and missing parents, exactly.

``check`` must find a span id that appears twice and a parent that appears
nowhere, over every span of every file. A Python ``set`` of ids costs about
70 bytes a span (the int and the set slot) and an object allocation each;
here the ids of a file are appended, 8 bytes each, to one growing
``array('Q')`` straight from their hex (``bytes.fromhex`` of a line's ids
joined: one C call a line), and the ids of all files are sorted once, with
numpy, when all are in. Sorted, a
duplicate is two equal neighbours and a parent's presence is a binary
search: exact, with no hashing and no false positives.

Parents need less: most are in the same line as their children (the batch
processor writes a subtree together), so only the parents a line does not
hold itself are kept, once per line, with that line's number, and looked up
in the piece's own ids when the piece ends. The rest are looked up in all
the ids at the end; the few that no file holds are the missing parents, and
:func:`check` re-reads just their lines for the details it prints (name,
trace, line).

A file's (or piece's) :class:`IdSet` is its summary in a parallel read:
:meth:`IdSet.merge` is associative (the ids appended, the parents still
looked for appended), so files can be mapped anywhere and folded in file
order.
"""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from megatron.trace._store import spill
from megatron.trace_format.errors import SpillError

__all__ = ["SPILL_FROM_IDS", "IdCollector", "IdSet", "SpillError", "parse_span_ids"]

_ID_HEX = 16  # an OTLP span id: 8 bytes, 16 hex digits


def parse_span_ids(hex_ids: Sequence[str]) -> bytes:
    """The ids' 8 bytes each, in order; ``ValueError`` unless each is 16 hex digits."""
    joined = "".join(hex_ids)
    raw = bytes.fromhex(joined)  # ValueError on a non-hex digit
    if len(joined) != _ID_HEX * len(hex_ids) or len(raw) != 8 * len(hex_ids):
        bad = next(i for i in hex_ids if len(i) != _ID_HEX or len(bytes.fromhex(i)) != 8)
        raise ValueError(f"span id {bad!r} is not 16 hex digits")
    return raw


def _as_ints(raw: bytes | array) -> np.ndarray:
    # Big-endian hex bytes read as native integers: byte-swapped on x86, but a
    # bijection, so equality and order-based lookups stay exact. ids_hex()
    # turns them back.
    return np.frombuffer(raw, dtype=np.uint64)


def ids_hex(values: np.ndarray | Sequence[int]) -> list[str]:
    """The hex spelling of ids as :class:`IdCollector` stores them."""
    return np.asarray(values, dtype=np.uint64).tobytes().hex(" ", 8).split() if len(values) else []


class IdCollector:
    """Gathers one file's span ids and its lines' outside parents as it is read.

    A piece holds a few hundred thousand ids; a file read whole (compressed, or
    with ``--jobs 1``) may hold tens of millions, so from :data:`SPILL_FROM_IDS`
    on they go to disk as they come (an :class:`IdSet` that spills)."""

    def __init__(self) -> None:
        self._ids = array("Q")
        self._spilled: IdSet | None = None  # the ids so far, once there were many
        self._parents = array("Q")
        self._parent_lines = array("q")

    def add(self, line: int, spans: Sequence[Any]) -> None:
        """The spans of one line (``span_id``, ``parent_span_id``)."""
        hex_ids = [span.span_id for span in spans]
        self._ids.frombytes(parse_span_ids(hex_ids))
        if len(self._ids) >= SPILL_FROM_IDS:
            self._spill()
        local = set(hex_ids)
        outside = {
            span.parent_span_id
            for span in spans
            if span.parent_span_id and span.parent_span_id not in local
        }
        if outside:
            self._parents.frombytes(parse_span_ids(list(outside)))
            self._parent_lines.extend([line] * len(outside))

    def _spill(self) -> None:
        """The ids so far merged into a set that holds them on disk (a merge spills them)."""
        spilled = IdSet(array("Q"), {}) if self._spilled is None else self._spilled
        self._spilled = spilled.merge(IdSet(self._ids, {}))
        self._ids = array("Q")

    def finish(self, path: Path) -> IdSet:
        """The file's (or piece's) :class:`IdSet`: its ids, and the outside parents that
        none of them is (looked up here, in the piece's own ids sorted once; all of them
        left to the whole when the ids went to disk)."""
        parents = np.array(_as_ints(self._parents))
        lines = np.array(self._parent_lines, dtype=np.int64)
        if self._spilled is not None:
            unresolved = {path: [(parents, lines)]} if len(parents) else {}
            return self._spilled.merge(IdSet(self._ids, unresolved))
        ids = _as_ints(self._ids)  # a view: sorted in place, no copy
        ids.sort()
        missing = ~_contains(ids, parents)
        del ids  # the view: the array may grow again in a merge
        unresolved = {path: [(parents[missing], lines[missing])]} if missing.any() else {}
        return IdSet(self._ids, unresolved)


#: Values looked up at once in :func:`_contains`: its temporaries (8 + 1 bytes a
#: value) stay a few MB however many ids a trace holds.
_LOOKUP_CHUNK = 1 << 20


def _contains(sorted_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, whether it is in ``sorted_ids``."""
    found = np.zeros(len(values), dtype=bool)
    if not len(sorted_ids) or not len(values):
        return found
    last = len(sorted_ids) - 1
    for start in range(0, len(values), _LOOKUP_CHUNK):
        chunk = values[start : start + _LOOKUP_CHUNK]
        at = np.searchsorted(sorted_ids, chunk)
        found[start : start + len(chunk)] = sorted_ids[np.minimum(at, last, out=at)] == chunk
    return found


#: From this many ids on (2 MB of them), a merged :class:`IdSet` keeps them on disk:
#: low enough that ``check``'s peak stays flat as the file grows (the bench's
#: ``check_peak_growth_4x_spans``), and spilling costs it no time.
SPILL_FROM_IDS = 1 << 18
#: The spilled ids' partitions (files): at ten million ids, 1.2 MB each.
_PARTITION_BITS = 6
_SPREAD = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: sequential ids spread too


def _partition_of(ids: np.ndarray) -> np.ndarray:
    """Which partition each id goes to: the top bits of a multiplicative hash of it (as
    bytes, which numpy's stable sort orders by radix, in linear time)."""
    return ((ids * _SPREAD) >> np.uint64(64 - _PARTITION_BITS)).astype(np.uint8)


#: Ids spread over the partitions at a time: the temporaries stay a few MB.
_SPILL_CHUNK = 1 << 19


class _Spill:
    """Ids spread by :func:`_partition_of` over anonymous temporary files, one per
    partition: a duplicate or a parent always falls in the same partition as the id
    it equals, so each partition is answered on its own, read whole (a few MB),
    while the rest stays on disk. The files have no name (``TemporaryFile``): even a
    killed ``check`` leaves nothing behind."""

    def __init__(self) -> None:
        self.files: list[Any] = []  # closed by close(), or when the set is dropped
        self.counts = [0] * (1 << _PARTITION_BITS)  # ids each file holds from whole adds
        for _ in range(1 << _PARTITION_BITS):  # (an OSError: the caller keeps them in memory)
            file = tempfile.TemporaryFile(prefix="megatron-trace-ids-")  # noqa: SIM115
            self.files.append(file)

    def add(self, ids: np.ndarray) -> None:
        """Spread ``ids`` over the files, all or none: on an ``OSError`` none of them
        counts as held (what was written of them is never read back)."""
        held = list(self.counts)
        for start in range(0, len(ids), _SPILL_CHUNK):
            chunk = ids[start : start + _SPILL_CHUNK]
            partitions = _partition_of(chunk)
            spread = chunk[np.argsort(partitions, kind="stable")]
            counts = np.bincount(partitions, minlength=len(self.files)).tolist()
            at = 0
            for file, count in zip(self.files, counts, strict=True):
                if count:
                    file.write(spread[at : at + count])  # its bytes, not a copy
                    at += count
            held = [before + count for before, count in zip(held, counts, strict=True)]
        for file in self.files:
            file.flush()  # (a full disk says so here, not at a later read)
        self.counts = held

    def partitions(self) -> Iterator[np.ndarray]:
        """Each partition's ids, sorted (read one at a time)."""
        for file, count in zip(self.files, self.counts, strict=True):
            if not count:
                yield np.empty(0, dtype=np.uint64)
                continue
            file.flush()
            file.seek(0)
            ids = np.fromfile(file, dtype=np.uint64, count=count)
            file.seek(0, 2)  # appending again, should more be merged
            ids.sort()
            yield ids

    def close(self) -> None:
        for file in self.files:
            file.close()

    def __del__(self) -> None:  # a set dropped unclosed (sent away, say) closes its files
        self.close()


class IdSet:
    """The span ids of some files (or pieces of files), every occurrence, and the parents
    each piece looked for and did not hold: ``unresolved`` until the whole is known.

    A merge appends the other's ids to this one's buffer (a copy of 8 bytes an id
    into memory that grows in place) and its unresolved parents to the list; nothing
    is looked up then. The first question (:attr:`dups`, :attr:`unresolved`) sorts
    the whole buffer once, in place, and answers from it: the duplicates are equal
    neighbours, a parent is found by binary search. Looking each new piece up in
    every piece before it would cost the pieces times the pieces; sorting them all
    once costs one sort.

    From :data:`SPILL_FROM_IDS` ids on, a merge moves them to disk instead
    (:class:`_Spill`), and the answers are found partition by partition: what the
    ids cost in memory stops growing with the trace. (An :class:`IdSet` that has
    spilled stays in the process that merged it: it holds open files.)
    """

    __slots__ = ("_answers", "_ids", "_spill", "_unresolved")

    def __init__(
        self, ids: array, unresolved: dict[Path, list[tuple[np.ndarray, np.ndarray]]]
    ) -> None:
        self._ids = ids  # array("Q"): the ids in memory, as read (each piece's sorted)
        self._spill: _Spill | None = None  # the ids on disk, once there are many
        self._unresolved = unresolved  # file -> [(parent ids, line numbers)], piece by piece
        self._answers: tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]] | None
        self._answers = None

    @property
    def spilled(self) -> bool:
        """Whether its ids were written to the spill file (there were many)."""
        return self._spill is not None

    def merge(self, other: IdSet) -> IdSet:
        """Add ``other``'s ids, as if its files were read after these; returns self
        (associative: any grouping of files gives the same answers)."""
        self._answers = None
        self._take(other._ids)
        if other._spill is not None:  # a right side that spilled: its ids join these
            for ids in other._spill.partitions():
                self._take(ids)
            other.close()
        for path, found in other._unresolved.items():
            self._unresolved.setdefault(path, []).extend(found)
        return self

    def __getstate__(self) -> tuple[array, dict[Path, list[tuple[np.ndarray, np.ndarray]]]]:
        ids = self._ids
        if self._spill is not None:  # its files stay here: the ids travel in memory
            ids = array("Q")
            for spilled in self._spill.partitions():
                ids.frombytes(memoryview(spilled).cast("B"))
        return ids, self._unresolved

    def __setstate__(self, state: tuple[array, dict[Path, Any]]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    def _take(self, ids: array | np.ndarray) -> None:
        if self._spill is None and (
            len(self._ids) + len(ids) < SPILL_FROM_IDS or not spill.writable()
        ):
            self._ids.frombytes(memoryview(ids).cast("B"))  # either's bytes, copied once
            return
        try:
            if self._spill is None:
                self._spill = _Spill()
            if len(self._ids):
                self._spill.add(_as_ints(self._ids))
                self._ids = array("Q")
            self._spill.add(_as_ints(ids))
        except OSError as error:  # the one spill policy (spill.py): go on in memory
            spill.unwritable(error)
            self._unspill()
            self._ids.frombytes(memoryview(ids).cast("B"))

    def _unspill(self) -> None:
        """Bring what was spilled back into memory (what a failed write left is read back:
        the ids written so far and not yet taken out are still in the buffer)."""
        if self._spill is None:
            return
        try:
            for spilled in self._spill.partitions():
                self._ids.frombytes(memoryview(spilled).cast("B"))
        except OSError as error:  # not even read back: the answers cannot be exact
            raise SpillError(
                f"cannot read back the span ids spilled to {tempfile.gettempdir()}: "
                f"{error.strerror or error}; set TMPDIR to a directory with room for 8 "
                "bytes a span"
            ) from error
        finally:
            self._spill.close()
            self._spill = None

    def close(self) -> None:
        """Give back the files of spilled ids (the answers found stay)."""
        if self._spill is not None:
            self._spill.close()

    def _answer(self) -> tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]]:
        if self._answers is None:
            looked_for = {path: _joined(found) for path, found in self._unresolved.items()}
            if self._spill is None:
                ids = _as_ints(self._ids)
                ids.sort()  # in place: the buffer is the sorted ids from here on
                self._answers = _answers_of(ids, looked_for)
                del ids  # the view: a later merge may grow the buffer again
            else:
                self._answers = self._answers_on_disk(looked_for)
        return self._answers

    def _answers_on_disk(
        self, looked_for: dict[Path, tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]]:
        """:func:`_answers_of` each partition, for the parents that fall in it."""
        assert self._spill is not None
        where = {path: _partition_of(parents) for path, (parents, _) in looked_for.items()}
        dups, unresolved = [], {}
        for number, ids in enumerate(self._spill.partitions()):
            here = {}
            for path, (parents, lines) in looked_for.items():
                mine = where[path] == number
                here[path] = (parents[mine], lines[mine])
            found, missing = _answers_of(ids, here)
            dups.append(found)
            for path, pair in missing.items():
                unresolved.setdefault(path, []).append(pair)
        missing = {path: _joined(pairs) for path, pairs in unresolved.items()}
        return np.sort(np.concatenate(dups)), missing

    @property
    def ids(self) -> np.ndarray:
        """Every id once, sorted (a new array: for tests and small traces)."""
        spilled = list(self._spill.partitions()) if self._spill is not None else []
        return np.unique(np.concatenate([_as_ints(self._ids), *spilled]))

    @property
    def dups(self) -> np.ndarray:
        """The ids seen more than once, anywhere, sorted."""
        return self._answer()[0]

    @property
    def unresolved(self) -> dict[Path, tuple[np.ndarray, np.ndarray]]:
        """File -> (parent ids, line numbers) of the parents no file holds."""
        return self._answer()[1]

    def unresolved_lines(self, path: Path) -> dict[int, set[str]]:
        """Line number -> hex ids of the parents missing from every file, for ``path``."""
        parents, lines = self.unresolved.get(path, (np.empty(0, np.uint64), np.empty(0)))
        wanted: dict[int, set[str]] = {}
        for number, parent in zip(lines.tolist(), ids_hex(parents), strict=True):
            wanted.setdefault(number, set()).add(parent)
        return wanted


def _joined(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(parent ids, line numbers) of several pieces as one pair."""
    return np.concatenate([ids for ids, _ in pairs]), np.concatenate([lines for _, lines in pairs])


def _answers_of(
    ids: np.ndarray, looked_for: dict[Path, tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]]:
    """(duplicates, sorted; parents missing, per file) from sorted ids and the parents
    looked for: all of them, or one partition's and the parents that fall in it."""
    same = ids[1:] == ids[:-1]
    dups = np.unique(ids[1:][same])
    del same
    unresolved = {}
    for path, (parents, lines) in looked_for.items():
        missing = ~_contains(ids, parents)
        if missing.any():
            unresolved[path] = (parents[missing], lines[missing])
    return dups.astype(np.uint64), unresolved
