"""Every span id of a trace, as 64-bit integers: duplicates and missing parents, exactly.

``check`` must find a span id that appears twice and a parent that appears
nowhere, over every span of every file. A Python ``set`` of ids costs about
70 bytes a span (the int and the set slot) and an object allocation each;
here the ids of a file are appended, 8 bytes each, to one growing
``array('Q')`` straight from their hex (``bytes.fromhex`` of a line's ids
joined: one C call a line), and the ids of all files are sorted once, with
numpy, when all are in (ten million in a tenth of a second). Sorted, a
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

from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["IdCollector", "IdSet", "parse_span_ids"]

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
    """Gathers one file's span ids and its lines' outside parents as it is read."""

    def __init__(self) -> None:
        self._ids = array("Q")
        self._parents = array("Q")
        self._parent_lines = array("q")

    def add(self, line: int, spans: Sequence[Any]) -> None:
        """The spans of one line (``span_id``, ``parent_span_id``)."""
        hex_ids = [span.span_id for span in spans]
        self._ids.frombytes(parse_span_ids(hex_ids))
        local = set(hex_ids)
        outside = {
            span.parent_span_id
            for span in spans
            if span.parent_span_id and span.parent_span_id not in local
        }
        if outside:
            self._parents.frombytes(parse_span_ids(list(outside)))
            self._parent_lines.extend([line] * len(outside))

    def finish(self, path: Path) -> IdSet:
        """The file's (or piece's) :class:`IdSet`: its ids, and the outside parents that
        none of them is (looked up here, in the piece's own ids sorted once)."""
        ids = _as_ints(self._ids)  # a view: sorted in place, no copy
        ids.sort()
        parents = np.array(_as_ints(self._parents))
        lines = np.array(self._parent_lines, dtype=np.int64)
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


class IdSet:
    """The span ids of some files (or pieces of files), every occurrence, and the parents
    each piece looked for and did not hold: ``unresolved`` until the whole is known.

    A merge appends the other's ids to this one's buffer (a copy of 8 bytes an id
    into memory that grows in place) and its unresolved parents to the list; nothing
    is looked up then. The first question (:attr:`dups`, :attr:`unresolved`) sorts
    the whole buffer once, in place, and answers from it: the duplicates are equal
    neighbours, a parent is found by binary search. Looking each new piece up in
    every piece before it instead cost a third of ``check`` at ten million spans
    (the pieces times the pieces), where sorting them all costs a hundredth; and a
    sorted run kept per piece, each received in memory of its own, left the
    merging process's heap in holes.
    """

    __slots__ = ("_answers", "_ids", "_unresolved")

    def __init__(
        self, ids: array, unresolved: dict[Path, list[tuple[np.ndarray, np.ndarray]]]
    ) -> None:
        self._ids = ids  # array("Q"): every id, as read (each piece's sorted)
        self._unresolved = unresolved  # file -> [(parent ids, line numbers)], piece by piece
        self._answers: tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]] | None
        self._answers = None

    def merge(self, other: IdSet) -> IdSet:
        """Add ``other``'s ids, as if its files were read after these; returns self
        (associative: any grouping of files gives the same answers)."""
        self._answers = None
        self._ids.extend(other._ids)
        for path, found in other._unresolved.items():
            self._unresolved.setdefault(path, []).extend(found)
        return self

    def _answer(self) -> tuple[np.ndarray, dict[Path, tuple[np.ndarray, np.ndarray]]]:
        if self._answers is None:
            ids = _as_ints(self._ids)
            ids.sort()  # in place: the buffer is the sorted ids from here on
            same = ids[1:] == ids[:-1]
            dups = np.unique(ids[1:][same])
            del same
            unresolved = {}
            for path, found in self._unresolved.items():
                parents = np.concatenate([parents for parents, _ in found])
                lines = np.concatenate([lines for _, lines in found])
                missing = ~_contains(ids, parents)
                if missing.any():
                    unresolved[path] = (parents[missing], lines[missing])
            del ids  # the view: a later merge may grow the buffer again
            self._answers = dups.astype(np.uint64), unresolved
        return self._answers

    @property
    def ids(self) -> np.ndarray:
        """Every id once, sorted (a new array: for tests and small traces)."""
        return np.unique(_as_ints(self._ids))

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
