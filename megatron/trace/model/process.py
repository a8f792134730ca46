"""What the builder keeps of one writing process while it reads: its records and aggregates.

Only the structural spans (a few per checkpoint interval) and the hang
watchdog's records are kept, in a
:class:`~megatron.trace._store.record_log.RecordLog`; iterations and gradient
all-reduce waits as compact integer columns, the checkpoint bookkeeping as the
union of the time it covers, everything else as running aggregates.
"""

from __future__ import annotations

from array import array
from pathlib import Path

from megatron.trace._store.columns import Iterations
from megatron.trace._store.record_log import RecordLog
from megatron.trace._store.stretches import Stretches

__all__ = ["ProcessSpans"]


class ProcessSpans:
    """Running aggregates of one writing process."""

    __slots__ = (
        "checkpoint_time",
        "file",
        "finalize_starts",
        "goodput_time",
        "iterations",
        "max_end",
        "max_end_child",
        "max_end_root",
        "min_start",
        "rank",
        "records",
        "span_count",
        "waits",
    )

    def __init__(self, rank: str, file: Path) -> None:
        self.rank = rank
        self.file = file
        self.records = RecordLog()
        self.iterations = Iterations()
        self.checkpoint_time = Stretches()
        self.goodput_time = Stretches()
        self.finalize_starts = array("q")
        self.waits = Iterations()
        self.min_start: int | None = None
        self.max_end = 0
        self.max_end_root = 0
        self.max_end_child = 0
        self.span_count = 0  # every span the process wrote, kept or not

    def merge(self, other: ProcessSpans) -> None:
        """Add what ``other`` (the same process, read later) learnt."""
        self.records.extend(other.records)
        self.iterations.extend(other.iterations)
        self.waits.extend(other.waits)
        for start, end in other.checkpoint_time:
            self.checkpoint_time.add(start, end)
        for start, end in other.goodput_time:
            self.goodput_time.add(start, end)
        self.finalize_starts.extend(other.finalize_starts)
        if other.min_start is not None and (
            self.min_start is None or other.min_start < self.min_start
        ):
            self.min_start = other.min_start
        self.max_end = max(self.max_end, other.max_end)
        self.max_end_root = max(self.max_end_root, other.max_end_root)
        self.max_end_child = max(self.max_end_child, other.max_end_child)
        self.span_count += other.span_count
