"""Hangs: where an incarnation stopped making progress for good, and which rank stopped first.

The trainer's hang watchdog writes a ``megatron.hang`` span when a rank has
finished no loop pass for its timeout (and flushes it at once, so it is in
the file even when the rank is later killed while blocked), and a
``megatron.hang.recovered`` span if a pass finishes after all. A *hang* is
an incarnation's last stall when no recovery followed it and the
incarnation did not shut down cleanly: it ended by a signal, a kill or an
exception, stuck (or it is still running, stuck so far). Its time, from the
last progress the record names to the incarnation's end as far as the file
can tell (the spans a SIGTERM's shutdown ended; for a SIGKILL, the last
record written, at the latest the stall report itself), is the ``hang``
badput category.

``culprit``: the stalled rank was not waiting for the others (the watchdog's
``megatron.hang.waiting``: not inside the gradient all-reduce or another
collective) but stopped in its own work; the ranks waiting for it are its
victims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.trace.model.identity import rank_value
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    HANG_FRAME,
    HANG_LAST_ITERATION,
    HANG_LAST_PROGRESS,
    HANG_STALLED_S,
    HANG_STALLED_SPAN,
    HANG_WAITING,
    ITERATION,
)

__all__ = ["Hang", "find_hang", "hang_entries", "recovered_stalls"]


@dataclass(frozen=True)
class Hang:
    """An incarnation's unrecovered stall: ``[start_ns, end_ns]`` is its hang time."""

    inc: Incarnation
    record: SpanRecord  # the megatron.hang span
    start_ns: int  # the last progress before it
    end_ns: int  # the incarnation's end

    @property
    def waiting(self) -> bool:
        return bool(self.record["attributes"].get(HANG_WAITING))


def _last_progress_ns(record: SpanRecord) -> int:
    value = record["attributes"].get(HANG_LAST_PROGRESS)
    if isinstance(value, int):
        return value
    stalled = record["attributes"].get(HANG_STALLED_S)
    start = record["start_ns"]
    return start - round(float(stalled) * 1e9) if stalled is not None else start


def find_hang(inc: Incarnation) -> Hang | None:
    """The incarnation's hang, if its last stall never recovered and it did not shut down."""
    if inc.ended == "shutdown" or not inc.hangs:
        return None
    last = max(inc.hangs, key=lambda record: record["start_ns"])
    if any(recovery["start_ns"] >= last["start_ns"] for recovery in inc.recoveries):
        return None
    end = max(inc.end_ns, last["end_ns"])
    return Hang(inc, last, min(_last_progress_ns(last), end), end)


def hang_entries(trace: Trace) -> list[dict[str, Any]]:
    """The report's ``hangs``: one per hung incarnation and rank, in time order."""
    found = []
    for incs in trace.ranks.values():
        for inc in incs:
            hang = find_hang(inc)
            if hang is not None:
                found.append(hang)
    found.sort(key=lambda hang: (hang.start_ns, hang.inc.rank))
    return [_entry(hang) for hang in found]


def _entry(hang: Hang) -> dict[str, Any]:
    attributes = hang.record["attributes"]
    return {
        "rank": rank_value(hang.inc.rank),
        "incarnation": hang.inc.index,
        "ended": hang.inc.ended,
        "last_iteration": attributes.get(HANG_LAST_ITERATION),
        "iteration": attributes.get(ITERATION),
        "span": attributes.get(HANG_STALLED_SPAN) or None,
        "frame": attributes.get(HANG_FRAME),
        "stalled_s": round((hang.end_ns - hang.start_ns) / 1e9, 3),
        "detected_after_s": attributes.get(HANG_STALLED_S),
        "waiting": hang.waiting,
        "culprit": not hang.waiting,
    }


def recovered_stalls(trace: Trace) -> list[dict[str, Any]]:
    """Stalls a rank came back from: where and how long (no badput; the job went on)."""
    found = []
    for incs in trace.ranks.values():
        for inc in incs:
            for recovery in inc.recoveries:
                found.append(
                    {
                        "rank": rank_value(inc.rank),
                        "incarnation": inc.index,
                        "iteration": recovery["attributes"].get(ITERATION),
                        "stalled_s": recovery["attributes"].get(HANG_STALLED_S),
                    }
                )
    return found
