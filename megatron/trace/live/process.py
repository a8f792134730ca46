"""One process's goodput accounting as its own spans end: the trainer's live gauges.

``watch`` reads a job from its files (:mod:`megatron.trace.live.job`); a training
process asks the same of itself while it runs
(:mod:`megatron.training.telemetry.goodput_metrics`), from the flat records its span
tally keeps. :class:`LiveProcess` holds those records in one
:class:`~megatron.trace.live.growing.GrowingTrace`, and accounts them
with ``watch``'s :class:`~megatron.trace.live.accounting.LiveAccounting`, so a
collection costs what ended since the last one, not the run's history.

The builder is given ended spans only, as a file is. A process's in-process restart
cycles are its incarnations, as in a file (one process, split at each
``megatron.startup``), so the figures carry across them. A running process is judged
running as of the moment asked (:func:`~megatron.trace.analysis.liveness.mark_running`,
``report``'s rule for a live job): its wall clock ends then, and the interval (or
startup) in flight counts so far as what it is. A save, evaluation or load still in
flight counts as that interval (or startup) until it ends, as ``watch`` and ``report``
count it from the files.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from megatron.trace.analysis.liveness import mark_running
from megatron.trace.live.accounting import LiveAccounting
from megatron.trace.live.facts import FactsCaches
from megatron.trace.live.growing import GrowingTrace
from megatron.trace_format.records import SpanRecord

__all__ = ["LiveProcess"]


class LiveProcess:
    """The accounting of the spans :meth:`add`\\ ed so far, as of any moment (thread-safe:
    the metric reader's thread and the training loop may both ask)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._growing = GrowingTrace()
        self._accounting = LiveAccounting()
        self._facts = FactsCaches()

    def add(self, records: Iterable[SpanRecord]) -> None:
        """Add ended spans (each once, in any order)."""
        with self._lock:
            self._growing.add(records)

    def accounting(self, as_of_ns: int, *, running: bool) -> dict[str, Any] | None:
        """:func:`~megatron.trace.analysis.accounting.rank_accounting` of the process's
        rank, its last incarnation judged running as of ``as_of_ns`` when ``running``
        (else ended as its spans say); None before any span."""
        with self._lock:
            if not self._growing.builder.span_count:
                return None
            finish = self._growing.finish()
            self._facts.attach(finish)
            incs = next(iter(finish.trace.ranks.values()))
            # (a cycle of an in-process restart that ended: the next one has not ended its
            # startup yet; the figures stay as of the fault until it has)
            if running and incs[-1].ended != "restarted":
                mark_running(incs[-1], max(as_of_ns, incs[-1].start_ns))
            return self._accounting(incs, finish)
