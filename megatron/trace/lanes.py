"""Which lane a span belongs to: its incarnation and its rank.

Both pictures of a trace (the timeline page and the Chrome trace export) draw
one lane per incarnation and rank, so they share this one answer. A span's
lane comes from the resource of the process that wrote it: every process of a
job (one per rank per ``pretrain()`` launch) has its own
``service.instance.id`` / ``process.pid``, and its rank is ``dl.rank``.
The k-th process of a rank, in order of its first span, belongs to the k-th
incarnation: a restart relaunches every rank once.

Only the small per-process index is kept (a few numbers per process), so the
span stream itself can be read twice instead of held in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Lane", "LaneIndex", "process_key"]

ProcessKey = tuple[str, int, str, int]


def process_key(resource: Mapping[str, Any]) -> ProcessKey:
    """The identity of the process that wrote a span, from its resource attributes."""
    return (
        str(resource.get("service.instance.id", resource.get("megatron.run_id", ""))),
        _int(resource.get("dl.rank"), 0),
        str(resource.get("host.name", "")),
        _int(resource.get("process.pid"), 0),
    )


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Lane:
    """One process's place in the pictures: incarnation (1-based) and rank."""

    incarnation: int
    rank: int

    def label(self, several_ranks: bool) -> str:
        text = f"incarnation {self.incarnation}"
        return f"{text} · rank {self.rank}" if several_ranks else text


class LaneIndex:
    """Maps every process seen in a span stream to its lane."""

    def __init__(self, spans: Iterable[Mapping[str, Any]]) -> None:
        first_start: dict[ProcessKey, int] = {}
        for span in spans:
            key = process_key(span.get("resource") or {})
            start = span["start_ns"]
            if key not in first_start or start < first_start[key]:
                first_start[key] = start
        by_rank: dict[int, list[ProcessKey]] = {}
        for key in sorted(first_start, key=lambda k: (first_start[k], k)):
            by_rank.setdefault(key[1], []).append(key)
        self._lanes = {
            key: Lane(incarnation=position + 1, rank=rank)
            for rank, keys in by_rank.items()
            for position, key in enumerate(keys)
        }
        self.ranks = sorted(by_rank)
        self.incarnations = max((len(keys) for keys in by_rank.values()), default=0)

    @property
    def several_ranks(self) -> bool:
        return len(self.ranks) > 1

    def lane(self, span: Mapping[str, Any]) -> Lane:
        """The lane of ``span`` (which must come from the stream the index was built on)."""
        return self._lanes[process_key(span.get("resource") or {})]

    def lanes(self) -> list[Lane]:
        """Every lane, by incarnation then rank."""
        return sorted(set(self._lanes.values()), key=lambda lane: (lane.incarnation, lane.rank))
