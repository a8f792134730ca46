"""Every span id of a trace, as 64-bit integers: duplicates and missing parents, exactly.

``check`` must find a span id that appears twice and a parent that appears
nowhere, over every span of every file. A Python ``set`` of ids costs about
70 bytes a span (the int and the set slot) and an object allocation each;
here the ids of a file are appended, 8 bytes each, to one growing
``array('Q')`` straight from their hex (``bytes.fromhex`` of a line's ids
joined: one C call a line), and sorted once with numpy when the file ends.
Sorted, a duplicate is two equal neighbours and a parent's presence is a
binary search: exact, with no hashing and no false positives.

Parents need less: most are in the same line as their children (the batch
processor writes a subtree together), so only the parents a line does not
hold itself are kept, once per line, with that line's number. Those are
looked up in the sorted ids at the end; the few that no file holds are the
missing parents, and :func:`check` re-reads just their lines for the
details it prints (name, trace, line).

A file's :class:`IdSet` is its summary in a parallel read: :meth:`IdSet.merge`
is associative (union of the ids; duplicates within either side or across
them; unresolved parents that neither side holds), so files can be mapped
anywhere and folded in file order.
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
        """Sort once: the file's :class:`IdSet`."""
        ids = _as_ints(self._ids)  # a view: sorted in place, no copy
        ids.sort()
        same = ids[1:] == ids[:-1]
        dups = np.unique(ids[1:][same])
        if len(dups):
            ids = ids[np.concatenate(([True], ~same))]
        parents = np.array(_as_ints(self._parents))
        lines = np.array(self._parent_lines, dtype=np.int64)
        missing = ~_contains(ids, parents)
        unresolved = {path: (parents[missing], lines[missing])} if missing.any() else {}
        return IdSet([ids], dups.astype(np.uint64), unresolved)


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


def _in_any(runs: Sequence[np.ndarray], values: np.ndarray) -> np.ndarray:
    found = np.zeros(len(values), dtype=bool)
    for run in runs:
        found |= _contains(run, values)
    return found


class IdSet:
    """The span ids of some files (or pieces of files): ``runs``, the sorted unique ids of
    each, ``dups`` (ids seen more than once, anywhere), and ``unresolved``: file ->
    (parent ids, line numbers) of parents no file here holds.

    The runs are kept apart rather than merged into one array: a merge would
    hold both sides and the result at once (three times the ids), and the
    lookups need only sorted runs. Every lookup goes in bounded chunks, so a
    merge costs little memory beyond the 8 bytes an id the runs take.
    """

    __slots__ = ("dups", "runs", "unresolved")

    def __init__(
        self,
        runs: list[np.ndarray],
        dups: np.ndarray,
        unresolved: dict[Path, tuple[np.ndarray, np.ndarray]],
    ) -> None:
        self.runs = runs
        self.dups = dups
        self.unresolved = unresolved

    @property
    def ids(self) -> np.ndarray:
        """Every id once, sorted (a new array: for tests and small traces)."""
        return np.unique(np.concatenate(self.runs)) if self.runs else np.empty(0, np.uint64)

    def merge(self, other: IdSet) -> IdSet:
        """The ids of both (associative: any grouping of files gives the same set)."""
        across = [theirs[_contains(mine, theirs)] for theirs in other.runs for mine in self.runs]
        dups = np.unique(np.concatenate([self.dups, other.dups, *across]))
        unresolved: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
        for mine, theirs in ((self, other), (other, self)):
            for path, (parents, lines) in mine.unresolved.items():
                keep = ~_in_any(theirs.runs, parents)
                if keep.any():
                    kept = (parents[keep], lines[keep])
                    if path in unresolved:  # the same file given twice, or two pieces of it
                        old = unresolved[path]
                        kept = (
                            np.concatenate((old[0], kept[0])),
                            np.concatenate((old[1], kept[1])),
                        )
                    unresolved[path] = kept
        return IdSet(self.runs + other.runs, dups, unresolved)

    def unresolved_lines(self, path: Path) -> dict[int, set[str]]:
        """Line number -> hex ids of the parents missing from every file, for ``path``."""
        parents, lines = self.unresolved.get(path, (np.empty(0, np.uint64), np.empty(0)))
        wanted: dict[int, set[str]] = {}
        for number, parent in zip(lines.tolist(), ids_hex(parents), strict=True):
            wanted.setdefault(number, set()).add(parent)
        return wanted
