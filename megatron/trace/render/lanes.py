"""Which lane a span belongs to: its incarnation and its rank, as the trace model says.

Both pictures of a trace (the timeline page and the Chrome trace export) draw
one lane per incarnation and rank. The grouping is the trace model's
(:mod:`megatron.trace.model.identity`: by writing process, split at each
``megatron.startup``), so a picture, ``check`` and ``report`` always agree on
what incarnation 1 is; incarnations are numbered from 0, as there.

The model keeps only structural spans; for every other span the pictures
ask it which incarnation wrote the span (:meth:`Trace.incarnation_of`: the
process that wrote it and, within a process that ran ``pretrain()`` more
than once, the startup it came after), so the split is decided in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron.trace.model.identity import slot_of
from megatron.trace.model.incarnation import Incarnation, Trace

__all__ = ["Lane", "LaneIndex", "incarnation_name"]


@dataclass(frozen=True)
class Lane:
    """One incarnation of one rank."""

    incarnation: int  # 0-based, in time order within the rank
    rank: str
    #: its cycle of an in-process restart (:attr:`Incarnation.cycle`); not part of its identity
    cycle: int | None = field(default=None, compare=False)

    def label(self, several_ranks: bool) -> str:
        text = incarnation_name(self.incarnation, self.cycle)
        return f"{text} · rank {self.rank}" if several_ranks else text


def incarnation_name(number: int, cycle: int | None) -> str:
    """``incarnation 1``; ``incarnation 1 · cycle 1`` for a cycle of an in-process restart
    (NVRx called ``pretrain()`` again in the same process)."""
    return f"incarnation {number}" if cycle is None else f"incarnation {number} · cycle {cycle}"


class LaneIndex:
    """The lanes of a :class:`Trace`, and the lane of any span of the files it was built from."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.ranks = list(trace.ranks)

    @property
    def several_ranks(self) -> bool:
        return len(self.ranks) > 1

    @staticmethod
    def lane_of_incarnation(inc: Incarnation) -> Lane:
        return Lane(inc.index, inc.rank, inc.cycle)

    def incarnation(self, span: Mapping[str, Any]) -> Incarnation:
        """The incarnation that wrote ``span`` (the model's rule: a pre_startup by its end)."""
        return self.trace.incarnation_of(span)

    def lane(self, span: Mapping[str, Any]) -> Lane:
        return self.lane_of_incarnation(self.incarnation(span))

    def split(self, process: tuple[Any, ...], spans: Sequence[Any]) -> list[tuple[Lane, list[Any]]]:
        """Decoded spans of one process, grouped by lane (the usual process has one).

        The model's rule (:func:`~megatron.trace.model.identity.slot_of`), for the span
        objects of :mod:`~megatron.trace.otlp.decode` rather than
        flat records.
        """
        boundaries, incs = self.trace.processes[process]
        if not boundaries:
            return [(self.lane_of_incarnation(incs[0]), list(spans))]
        groups: dict[int, list[Any]] = {}
        for span in spans:
            start, end = span.start_time_unix_nano, span.end_time_unix_nano
            groups.setdefault(slot_of(boundaries, span.name, start, end), []).append(span)
        return [(self.lane_of_incarnation(incs[slot]), group) for slot, group in groups.items()]

    def incarnation_name(self, number: int) -> str:
        """Incarnation ``number`` across the ranks: its cycle too where every rank's says the
        same one."""
        cycles = {inc.cycle for inc in self.trace.incarnations if inc.index == number}
        return incarnation_name(number, cycles.pop() if len(cycles) == 1 else None)

    def lanes(self) -> list[Lane]:
        """Every lane, by incarnation then rank."""
        lanes = [self.lane_of_incarnation(inc) for inc in self.trace.incarnations]
        return sorted(lanes, key=lambda lane: (lane.incarnation, self.ranks.index(lane.rank)))
