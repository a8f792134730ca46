"""A job's trace as its spans come, finished again and again, and what changed between.

``watch`` adds the new lines of the files at every poll and the trainer its own spans
as they end; both finish the same :class:`~megatron.trace.model.builder.TraceBuilder`
``report`` fills, as often as they are asked. The builder knows nothing of that:
:class:`GrowingTrace` notes, for the live caches, which processes were given spans
since the previous finish and from when on, and each :class:`Finish` carries that with
the incarnations' :class:`~megatron.trace.live.revision.Revision`\\ s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from megatron.trace.live.revision import Revisions
from megatron.trace.model.builder import TraceBuilder
from megatron.trace.model.identity import process_key
from megatron.trace.model.incarnation import Trace
from megatron.trace.otlp.reader import DAMAGE_ERRORS, DecodedLine
from megatron.trace_format.records import SpanRecord

__all__ = ["Finish", "GrowingTrace"]


@dataclass(frozen=True)
class Finish:
    """One finish of a :class:`GrowingTrace`: the trace, and what changed since the one
    before (``generation - 1``)."""

    trace: Trace
    generation: int  # the finishes so far, this one included
    #: each process given spans since the previous finish -> the earliest start among
    #: them: nothing older than that changed since (every process, at the first finish)
    touched: Mapping[tuple[Any, ...], int]
    revisions: Revisions


class GrowingTrace:
    """Spans added as they come (:meth:`add_line`, :meth:`add`), finished again and again
    (:meth:`finish`); :attr:`builder` is the model's own."""

    def __init__(self) -> None:
        self.builder = TraceBuilder()
        self._touched: dict[tuple[Any, ...], int] = {}
        self._generation = 0

    def add_line(self, line: DecodedLine) -> None:
        """Add a decoded line's spans (:meth:`TraceBuilder.add_line`, which raises on a
        damaged one: what it added before the damage is noted as added)."""
        try:
            for batch in line.batches:
                if batch.spans:
                    low = min([span.start_time_unix_nano for span in batch.spans])
                    self._touch(process_key(batch.resource, line.path), low)
        except DAMAGE_ERRORS:
            pass  # the builder stops at this batch too, and says why
        self.builder.add_line(line)

    def add(self, records: Iterable[SpanRecord]) -> None:
        """Add flat records (:meth:`TraceBuilder.add`), each once, in any order."""
        for record in records:
            self._touch(process_key(record["resource"], record["file"]), record["start_ns"])
            self.builder.add(record)

    def _touch(self, process: tuple[Any, ...], start_ns: int) -> None:
        touched = self._touched.get(process)
        if touched is None or start_ns < touched:
            self._touched[process] = start_ns

    def finish(self) -> Finish:
        """The trace of everything added so far, with what changed since the last finish."""
        trace = self.builder.finish()
        self._generation += 1
        touched, self._touched = self._touched, {}
        return Finish(trace, self._generation, touched, Revisions(trace, self.builder.processes))
