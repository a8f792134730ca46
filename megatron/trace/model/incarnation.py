"""The trace model's data types: an :class:`Incarnation` (one ``pretrain()`` of one
rank) and the :class:`Trace` that holds them.

An incarnation holds its ``pre_startup``, ``megatron.startup`` (with launch
children), the ``megatron.train`` intervals, checkpoint loads and saves,
evaluations and iterations. A resumed job appends its next incarnation to the
same file; several ranks write several files or share one (``all_ranks``).
:mod:`megatron.trace.model.builder` builds them.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from megatron.trace._store.columns import Iterations
from megatron.trace._store.record_log import extents, extents_from
from megatron.trace._store.stretches import Stretches
from megatron.trace.model import intervals
from megatron.trace.model.identity import PROCESS_KEYS, process_of, slot_of
from megatron.trace.model.intervals import IntervalFacts
from megatron.trace.otlp.reader import (
    ReadStats,
)
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    ITERATION,
    NVRX_INPROCESS_ITERATION,
    PROCESS_PID,
)

__all__ = ["RECORD_LISTS", "Incarnation", "Progress", "Sighting", "Trace"]


@dataclass(frozen=True)
class Progress:
    """How far one metric says a process had got: its newest value (``top``, at
    ``top_ns``) and the newest point before it showing less (``below`` at ``below_ns``;
    None: none was read). A later point showing more means the process was still training
    at ``below_ns``. Values are a metric's own: the iteration gauge's completed iterations,
    or the step-duration histogram's count of log intervals since the process started."""

    top: int
    top_ns: int
    below: int | None = None
    below_ns: int | None = None


@dataclass(frozen=True)
class Sighting:
    """What a killed incarnation's own metric points (``metrics.jsonl`` beside the trace,
    of its process and within its time) say: it was alive at ``seen_ns``, its newest point
    of any metric; ``iteration`` and ``steps`` are the progress its iteration gauge and
    its step-duration histogram (cumulative, since its process started) show,
    ``log_interval`` what its resource says the histogram's log interval is, and
    ``save_start`` whether a checkpoint save was in flight at its newest such point,
    ``export_period_ns`` how often its metric reader exported.
    :mod:`megatron.trace.analysis.sightings` reads them."""

    seen_ns: int
    iteration: Progress | None = None
    steps: Progress | None = None
    log_interval: int | None = None
    #: its newest ``megatron.training.checkpoint_save_start_time`` point: (when, the save in
    #: flight's start then, 0: none was in flight)
    save_start: tuple[int, int] | None = None
    #: the iteration it started at where the files pin it though its own spans show neither
    #: a load nor an iteration (its resume range is one point: the first incarnation of a
    #: rank whose next one started afresh, say); None: they do not
    started_at: int | None = None
    #: its metric reader's export period at least: the longest spacing between its newest
    #: exports read (up to four, points within a second of each other one export); None:
    #: fewer than three were read
    export_period_ns: int | None = None
    #: what the analyses worked out of it once (the report asks per figure, per rank)
    worked: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass
class Incarnation:
    """One ``pretrain()`` of one rank.

    ``ended`` is how it ended (the rule in ``megatron/trace/README.md``); once
    :mod:`megatron.trace.analysis.liveness` has judged a running one, ``as_of_ns`` is
    the time of its newest record and ``in_flight`` the open stretch the file cannot
    show yet. ``intervals``,
    ``saves``, ``loads``, ``evaluations``, ``launch`` and ``pre_startup`` are
    sequences of the reader's :class:`~megatron.trace_format.records.SpanRecord`
    in start order (read from a file: views of the process's
    :class:`~megatron.trace._store.record_log.RecordLog`, each record decoded as it
    is read). ``iterations`` holds the finished (not cut short)
    ``megatron.train.iteration`` spans as :class:`Iterations` (empty without
    the ``per_step`` groups). ``interval_facts`` holds each interval's index
    and iteration range (:mod:`megatron.trace.model.intervals`: its attributes, else
    derived); ``checkpoint_time`` the time Megatron-LM's other checkpoint
    spans cover; ``goodput_time`` the time training-loop spans outside any interval
    cover (root iteration spans, and root spans marked ``is_goodput_span``: Megatron-LM
    without checkpointing opens no interval); ``finalize_starts`` the starts of its
    async-save finalizes.
    ``waits`` holds the finished ``megatron.grad_sync.finish`` spans, numbered
    by their ``megatron.iteration``, as :class:`Iterations` (empty without the
    ``communication`` group or with one rank). ``hangs`` and ``recoveries``
    are the hang watchdog's ``megatron.hang`` and ``megatron.hang.recovered``
    records.
    """

    rank: str
    index: int  # 0-based position among the rank's incarnations, in time order
    process: tuple[Any, ...]
    startup: SpanRecord | None = None
    pre_startup: Sequence[SpanRecord] = field(default_factory=list)
    launch: Sequence[SpanRecord] = field(default_factory=list)
    intervals: Sequence[SpanRecord] = field(default_factory=list)
    saves: Sequence[SpanRecord] = field(default_factory=list)
    loads: Sequence[SpanRecord] = field(default_factory=list)
    evaluations: Sequence[SpanRecord] = field(default_factory=list)
    cut_short: Sequence[SpanRecord] = field(default_factory=list)
    # the startup's phases (megatron.startup.*, but the launch's): not in ``records``
    startup_phases: Sequence[SpanRecord] = field(default_factory=list)
    iterations: Iterations = field(default_factory=lambda: Iterations())
    # interval_facts (a property): derived on first use, which export never makes
    _facts: list[IntervalFacts] | None = field(default=None, repr=False, compare=False)
    #: whether its last interval was closed by the reroot that opened a lost one (it was
    #: killed, as the builder judged: liveness may later call it running)
    last_closed_by_reroot: bool = field(default=False, repr=False, compare=False)
    #: whether ``shutdown`` is a guess: it wrote its startup and nothing of its loop, resumed
    #: where a clean end left off (nothing left to train, or killed in its first iteration)
    ending_unsure: bool = field(default=False, repr=False, compare=False)
    #: (lower, upper) of the iteration it resumed from, worked out once for its rank by the
    #: analysis (``megatron.trace.analysis.resumed``); None: not yet, or judged again since
    resume_range: tuple[int, int | None] | None = field(default=None, repr=False, compare=False)
    checkpoint_time: Stretches = field(default_factory=lambda: Stretches())
    goodput_time: Stretches = field(default_factory=lambda: Stretches())
    finalize_starts: array = field(default_factory=lambda: array("q"))
    waits: Iterations = field(default_factory=lambda: Iterations())
    hangs: Sequence[SpanRecord] = field(default_factory=list)
    recoveries: Sequence[SpanRecord] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    ended: str = "shutdown"
    as_of_ns: int | None = None  # running: the time of the newest record seen
    in_flight: SpanRecord | None = None  # running: the open interval (or startup) so far
    # error.type of what ended it: the exception's class, or the signal's name
    error_type: str | None = None
    #: killed: what its metric points showed (None: none read, or none of its own)
    sighting: Sighting | None = None

    @property
    def cycle(self) -> int | None:
        """Its in-process restart cycle (NVRx's restart iteration, ``nvrx.inprocess.iteration``
        on its startup span), or None: not a cycle of an in-process restart."""
        value = self.startup["attributes"].get(NVRX_INPROCESS_ITERATION) if self.startup else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def pid(self) -> Any:
        """The process id its resource names (``process.pid``; None: none), the process's
        whatever its incarnations: the cycles of an in-process restart share it."""
        return self.process[1 + PROCESS_KEYS.index(PROCESS_PID)]

    @property
    def interval_facts(self) -> list[IntervalFacts]:
        """Each interval's index and iteration range (:func:`intervals.derive`), worked out
        when first asked for: it reads every interval, and only the goodput accounting
        and the pictures ask. Whoever already knows them sets them (:meth:`interval_facts`'s
        setter)."""
        if self._facts is None:
            self._facts = intervals.derive(
                self.intervals,
                self.iterations,
                self.saves,
                self.resumed_from,
                last_closed_by_reroot=self.last_closed_by_reroot,
            )
        return self._facts

    @interval_facts.setter
    def interval_facts(self, facts: list[IntervalFacts]) -> None:
        self._facts = facts

    @property
    def label(self) -> str:
        return f"rank {self.rank} incarnation {self.index}"

    def _record_lists(self) -> tuple[Sequence[SpanRecord], ...]:
        """The lists :attr:`records` chains, in its order, the startup as a list of one."""
        startup = [self.startup] if self.startup else []
        return (
            self.pre_startup,
            startup,
            self.launch,
            self.intervals,
            self.loads,
            self.saves,
            self.evaluations,
        )

    @property
    def records(self) -> Iterator[SpanRecord]:
        """Every structural span of the incarnation, its startup included (one at a time:
        a week's intervals are decoded as they are read, not all at once)."""
        return itertools.chain.from_iterable(self._record_lists())

    def records_with_facts(self) -> Iterator[tuple[SpanRecord, IntervalFacts | None]]:
        """:attr:`records`, each paired with its :attr:`interval_facts` if it is an
        interval (None if not): the timeline's labels, without a map of every interval."""
        for records in self._record_lists():
            if records is self.intervals:
                yield from zip(records, self.interval_facts, strict=True)
            else:
                yield from zip(records, itertools.repeat(None))

    def extents(self) -> Iterator[tuple[int, int, str]]:
        """(start, end, name) of each of :attr:`records`, without decoding them."""
        return itertools.chain.from_iterable(map(extents, self._record_lists()))

    def extents_from(self, start_ns: int) -> Iterator[tuple[int, int, str]]:
        """:meth:`extents` of the records that start at ``start_ns`` or later (in the views
        a builder makes, in start order, found by bisection: what changed after a time)."""
        lists = self._record_lists()
        return itertools.chain.from_iterable(extents_from(r, start_ns) for r in lists)

    @property
    def first_iteration(self) -> int | None:
        """The first iteration this incarnation ran (its first interval's, else its
        first iteration span's); None when neither is known."""
        facts = self.interval_facts[:1]
        candidates = [f.first_iteration for f in facts if f.first_iteration is not None]
        first = self.iterations.first_number()
        candidates += [] if first is None else [first]
        return min(candidates) if candidates else None

    @property
    def last_iteration(self) -> int | None:
        """The last iteration this incarnation finished, as far as the file shows (its
        last interval's, or a later iteration span's: a killed one's lost interval)."""
        facts = self.interval_facts[-1:]
        candidates = [f.last_iteration for f in facts if f.last_iteration is not None]
        last = self.iterations.last_number()
        candidates += [] if last is None else [last]
        return max(candidates) if candidates else None

    def durable_saves(self) -> list[int]:
        """Iterations of the checkpoint saves that became durable, in save order.

        A save is durable when it ends, but not when it ended by an exception (ERROR
        status: a fault in the save, which the trainer raises before the checkpoint is
        named); with Megatron-LM's async saves (the
        incarnation has finalize spans) only once a finalize that started
        after it ended, since the save span itself only dispatched the write.
        Upstream's spans do not say which finalize completed which save, so
        the first finalize after a save is taken as its completion.
        """
        last_finalize = max(self.finalize_starts, default=None)
        return [
            save["attributes"][ITERATION]
            for save in self.saves
            if isinstance(save["attributes"].get(ITERATION), int)
            and save["status_code"] != "ERROR"
            and (last_finalize is None or last_finalize >= save["end_ns"])
        ]

    @property
    def resumed_from(self) -> int | None:
        """The iteration a checkpoint load put this incarnation at (None: no load)."""
        for load in self.loads:
            if ITERATION in load["attributes"]:
                return load["attributes"][ITERATION]
        return None


# The incarnation's sequences of records (intervals, saves, ...), by field name.
RECORD_LISTS = tuple(f.name for f in fields(Incarnation) if f.type == "Sequence[SpanRecord]")


@dataclass
class Trace:
    """What :class:`TraceBuilder` learnt: ``ranks`` maps rank -> incarnations in time order.

    ``processes`` maps each writing process (:func:`process_of`) to where it
    was split (the start of each ``megatron.startup`` but its first) and its
    incarnations in that order.
    """

    ranks: dict[str, list[Incarnation]]
    stats: ReadStats
    span_count: int
    processes: dict[tuple[Any, ...], tuple[list[int], list[Incarnation]]] = field(
        default_factory=dict, repr=False
    )
    #: each writing process -> how many spans it wrote (they add up to :attr:`span_count`)
    process_spans: dict[tuple[Any, ...], int] = field(default_factory=dict, repr=False)

    @property
    def incarnations(self) -> list[Incarnation]:
        """Every incarnation of every rank, rank by rank."""
        return [inc for incs in self.ranks.values() for inc in incs]

    def incarnation_of(self, span: Mapping[str, Any]) -> Incarnation:
        """The incarnation that wrote ``span``, any span of the files read (:func:`slot_of`)."""
        boundaries, incs = self.processes[process_of(span)]
        return incs[slot_of(boundaries, span["name"], span["start_ns"], span["end_ns"])]
