"""Which incarnation is which across a growing trace's finishes, and whether it changed.

Every finish of a :class:`~megatron.trace.model.builder.TraceBuilder` gives new
:class:`~megatron.trace.model.incarnation.Incarnation` objects. What the live layer keeps
of an incarnation between finishes (its interval facts, its wasted progress, its
straggler work) is keyed by its :class:`Revision`, worked out here from the model's
public views: the trace's processes (where each was split, its incarnations in
order), an incarnation's record lists, and the process's iteration and wait columns
as the builder holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megatron.trace._store.columns import Iterations
from megatron.trace.model.incarnation import RECORD_LISTS, Incarnation, Trace
from megatron.trace.model.process import ProcessSpans

__all__ = ["Revision", "Revisions", "Rows"]


@dataclass(frozen=True)
class Rows:
    """The rows of its process's iteration (or wait) column an incarnation holds."""

    count: int
    #: the first of them in the column, which they follow in the order read; None when
    #: the column is not in start order (its rows are sorted anew, and an incarnation's
    #: rows of one finish need not be the start of the next one's)
    first: int | None


@dataclass(frozen=True)
class Revision:
    """An incarnation as of one finish: two with equal revisions hold the same records,
    iterations, waits and finalizes, and two with the same :attr:`incarnation` are the
    same incarnation of the job (while its process is not split anew)."""

    process: tuple[Any, ...]  # the writing process (model.identity.process_key)
    placement: int  # how many startups split the process (a new one places all again)
    slot: int  # the incarnation's index among its process's
    records: int  # how many records its lists hold (the startup too)
    iterations: Rows
    waits: Rows
    finalizes: int  # how many async-save finalize starts it holds

    @property
    def incarnation(self) -> tuple[Any, ...]:
        """The same in every finish while the process is not split anew."""
        return (self.process, self.placement, self.slot)

    def rows_grow(self) -> bool:
        """Whether a later finish's iterations and waits of this incarnation can only add
        rows to these (both columns in start order)."""
        return self.iterations.first is not None and self.waits.first is not None


class Revisions:
    """The :class:`Revision` of each incarnation of one finish (:meth:`of`)."""

    def __init__(self, trace: Trace, processes: Mapping[tuple[Any, ...], ProcessSpans]) -> None:
        self._by_id: dict[int, Revision] = {}
        for key, (boundaries, incs) in trace.processes.items():
            proc = processes[key]
            iterations = _rows(proc.iterations, [inc.iterations for inc in incs])
            waits = _rows(proc.waits, [inc.waits for inc in incs])
            for slot, inc in enumerate(incs):
                self._by_id[id(inc)] = Revision(
                    process=key,
                    placement=len(boundaries),
                    slot=slot,
                    records=sum(len(getattr(inc, name)) for name in RECORD_LISTS)
                    + (inc.startup is not None),
                    iterations=iterations[slot],
                    waits=waits[slot],
                    finalizes=len(inc.finalize_starts),
                )

    def of(self, inc: Incarnation) -> Revision | None:
        """``inc``'s revision (None: not an incarnation of this finish)."""
        return self._by_id.get(id(inc))


def _rows(column: Iterations, parts: list[Iterations]) -> list[Rows]:
    """The rows of the process's ``column`` each incarnation's part holds: a column in
    start order is cut into consecutive slices, one an incarnation (the model's rule,
    :meth:`~megatron.trace.model.split.Split.incarnations`); otherwise none can say."""
    if not column.in_start_order():
        return [Rows(len(part), None) for part in parts]
    rows, first = [], 0
    for part in parts:
        rows.append(Rows(len(part), first))
        first += len(part)
    return rows
