"""The trace model: spans grouped into ranks and incarnations, built in one streaming pass.

An *incarnation* is one ``pretrain()`` of one rank: its ``pre_startup``,
``megatron.startup`` (with launch children), the ``megatron.train`` intervals,
checkpoint loads and saves, evaluations and iterations. A resumed job appends
its next incarnation to the same file; several ranks write several files or
share one (``all_ranks``).

Grouping rule: spans belong to the *process* that wrote them: the resource's
``service.instance.id``, run id (``nemo.run.id``, ``megatron.run_id``),
``host.name`` and ``process.pid``, and the restart counters launchers set
(``slurm.restart_count``, NVRx's ``nvrx.cycle``), so two containers' pid 1 on
two hosts, or a job requeued onto the same host, are two processes even
without a ``service.instance.id``; a process that called
``pretrain()`` more than once is split at each ``megatron.startup`` by start
time (a ``pre_startup`` goes with the startup it precedes): :func:`slot_of`
is that rule, and :meth:`Trace.incarnation_of` applies it to any span of the
files for the pictures, which draw spans the model does not keep. The rank
is the resource's ``dl.rank`` (else its ``service.instance.id``, else the
file name).
Grouping by process rather than by following links keeps a broken link a
finding of ``check`` instead of silently making a new incarnation.

Memory: only the structural spans (a few per checkpoint interval) and the
hang watchdog's records are kept, as the reader's
:class:`~megatron.trace_format.records.SpanRecord`; iterations are kept as
three compact integer columns per process (number, start, end: 24 bytes
each, written to a temporary file in blocks once there are many:
:mod:`megatron.trace._store.columns`), and so are the gradient all-reduce waits
(``megatron.grad_sync.finish`` with ``megatron.iteration``: the
``communication`` span group), Megatron-LM's
per-pass checkpoint bookkeeping spans as the union of the time they cover
(:mod:`megatron.trace._store.stretches`) and one start per async-save finalize,
everything else as running aggregates.
A million-span file therefore costs a few tens of MB, whatever its size on
disk.

How an incarnation ended (:attr:`Incarnation.ended`: ``shutdown``,
``failed``, ``interrupted``, ``cut_short``, ``killed``, or ``running``, which
:func:`megatron.trace.analysis.liveness.judge` sets) follows the rule stated
once in ``megatron/trace/README.md``, "How an incarnation ended"; this module
applies it, and the report, ``check``, the timeline and the export read it
from here.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from megatron.trace._store.columns import Iterations
from megatron.trace._store.record_log import RecordLog, extents, extents_from, latest
from megatron.trace._store.stretches import Stretches
from megatron.trace.model import intervals
from megatron.trace.model.intervals import IntervalFacts
from megatron.trace.otlp.parallel import FilePiece, map_reduce, pieces
from megatron.trace.otlp.reader import (
    DAMAGE_ERRORS,
    DecodedLine,
    ReadStats,
    damaged,
    iter_batches,
    paused_gc,
    span_fields,
)
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    CHECKPOINT_EXIT_FINALIZE_SPAN,
    CHECKPOINT_FINALIZE_SPAN,
    CHECKPOINT_LOAD_SPAN,
    CHECKPOINT_SPAN_PREFIX,
    DL_RANK,
    ERROR_TYPE,
    GRAD_SYNC_FINISH_SPAN,
    HANG_RECOVERED_SPAN,
    HANG_SPAN,
    HOST_NAME,
    INTERVAL_REROOTED,
    IS_GOODPUT_SPAN,
    ITERATION,
    ITERATION_SPAN,
    NEMO_RUN_ID,
    NVRX_CYCLE,
    PRE_STARTUP_SPAN,
    PROCESS_PID,
    RUN_ID,
    SERVICE_INSTANCE_ID,
    SHUTDOWN_REASON,
    SLURM_RESTART_COUNT,
    SPAN_CATEGORY,
    SPAN_CUT_SHORT,
    STARTUP_PHASE_PREFIX,
    STARTUP_SPAN,
    STRUCTURAL_SPAN_NAMES,
    Category,
)

__all__ = [
    "Incarnation",
    "Iterations",
    "Trace",
    "TraceBuilder",
    "load_trace",
    "process_key",
    "process_of",
    "process_of_resource",
    "rank_of",
    "scan",
    "scan_file",
    "slot_of",
]

#: The writing process's identity, beside its rank (see the module docstring).
PROCESS_KEYS = (
    SERVICE_INSTANCE_ID,
    PROCESS_PID,
    RUN_ID,
    NEMO_RUN_ID,
    HOST_NAME,
    SLURM_RESTART_COUNT,
    NVRX_CYCLE,
)
_FINALIZE_NAMES = frozenset({CHECKPOINT_FINALIZE_SPAN, CHECKPOINT_EXIT_FINALIZE_SPAN})
# What the model keeps as records: the structural spans and the hang watchdog's, and
# the startup's phases (a handful an incarnation, which the timeline draws: _kept_name).
_KEPT_NAMES = STRUCTURAL_SPAN_NAMES | {HANG_SPAN, HANG_RECOVERED_SPAN}
_CUT_SHORT_KEY = SPAN_CUT_SHORT.encode()
# What TraceBuilder.add does with a span, by its name (the fast path looks it up once):
# keep it as a record; keep it as an iteration; as a gradient all-reduce wait; add its
# time to the checkpoint bookkeeping (and, for a finalize, its start); note a
# finalize's start only; nothing.
_STRUCTURAL, _ITERATION, _WAIT, _CHECKPOINT, _FINALIZE, _FINALIZE_ONLY, _IGNORED = range(7)
# The lifecycle's shutdown reason -> how the incarnation ended (strongest first).
_ENDED_BY_REASON = {"exception": "failed", "interrupt": "interrupted", "signal": "cut_short"}


def _kept_name(name: str) -> bool:
    return name in _KEPT_NAMES or name.startswith(STARTUP_PHASE_PREFIX)


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
    _facts_rerooted: bool = field(default=False, repr=False, compare=False)
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
    #: What its records, iterations, waits and finalizes are as of its builder's finish:
    #: two incarnations of one builder with equal revisions hold the same of them (None:
    #: not from a builder). What ``watch`` keeps of an incarnation between scrapes is
    #: keyed by it.
    revision: tuple[Any, ...] | None = field(default=None, compare=False)
    # derives interval_facts as intervals.derive does, from what an earlier finish of the
    # same builder derived (see _FactsCache); None: intervals.derive itself
    _deriver: Any = field(default=None, repr=False, compare=False)

    @property
    def interval_facts(self) -> list[IntervalFacts]:
        """Each interval's index and iteration range (:func:`intervals.derive`), worked out
        when first asked for: with thousands of intervals that is a tenth of a read,
        and only the goodput accounting and the pictures ask."""
        if self._facts is None:
            if self._deriver is not None:
                self._facts = self._deriver(self)
            else:
                self._facts = intervals.derive(
                    self.intervals,
                    self.iterations,
                    self.saves,
                    self.resumed_from,
                    last_closed_by_reroot=self._facts_rerooted,
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
        a builder makes, in start order, found by bisection: what ``watch`` reads again)."""
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

        A save is durable when it ends; with Megatron-LM's async saves (the
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
_RECORD_LISTS = tuple(f.name for f in fields(Incarnation) if f.type == "Sequence[SpanRecord]")


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
    #: The builder's finishes so far, this one included.
    generation: int = 1
    #: Each process given spans since the builder's previous finish -> the earliest start
    #: of those spans: nothing older than that changed since (every process, at the
    #: first finish). ``watch`` keeps what that earlier time still gives.
    touched: dict[tuple[Any, ...], int] = field(default_factory=dict, repr=False)

    @property
    def incarnations(self) -> list[Incarnation]:
        """Every incarnation of every rank, rank by rank."""
        return [inc for incs in self.ranks.values() for inc in incs]

    def incarnation_of(self, span: Mapping[str, Any]) -> Incarnation:
        """The incarnation that wrote ``span``, any span of the files read (:func:`slot_of`)."""
        boundaries, incs = self.processes[process_of(span)]
        return incs[slot_of(boundaries, span["name"], span["start_ns"], span["end_ns"])]


class _Process:
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
        "touched",
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
        # the earliest start of a span added since the builder's last finish (None: none)
        self.touched: int | None = None

    def touch(self, start_ns: int) -> None:
        """Note that spans from ``start_ns`` on were added (:attr:`Trace.touched`)."""
        if self.touched is None or start_ns < self.touched:
            self.touched = start_ns

    def merge(self, other: _Process) -> None:
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
        if other.min_start is not None:
            self.touch(other.min_start)


def _rank(resource: Mapping[str, Any], path: Path | str | None) -> str:
    if DL_RANK in resource:
        return str(resource[DL_RANK])
    if SERVICE_INSTANCE_ID in resource:
        return str(resource[SERVICE_INSTANCE_ID])
    return str(path)


def process_key(resource: Mapping[str, Any], path: Path | str | None) -> tuple[Any, ...]:
    """The process that wrote the spans of ``resource``, read from ``path``: its rank and
    every identity the resource carries (:data:`PROCESS_KEYS`)."""
    return (_rank(resource, path), *map(resource.get, PROCESS_KEYS))


def rank_of(span: Mapping[str, Any]) -> str:
    """The rank a span's writer ran as (``dl.rank``, else instance id, else file)."""
    return _rank(span["resource"], span["file"])


def process_of(span: Mapping[str, Any]) -> tuple[Any, ...]:
    """The process that wrote a span: :func:`process_key` of its resource."""
    return process_key(span["resource"], span["file"])


def process_of_resource(resource: Mapping[str, Any], file: Any) -> tuple[Any, ...]:
    """:func:`process_of` for anything carrying this resource (the metrics' heartbeat too)."""
    return process_of({"resource": resource, "file": file})


def slot_of(boundaries: Sequence[int], name: str, start_ns: int, end_ns: int) -> int:
    """Which of a process's incarnations a span belongs to: the incarnation-split rule.

    ``boundaries`` are the start times of the process's ``megatron.startup``
    spans but the first, in order; a span goes to the incarnation whose
    startup last began at or before it. A ``pre_startup`` ends where its own
    startup begins, so it is placed by its end; every other span by its start.
    """
    at = end_ns if name == PRE_STARTUP_SPAN else start_ns
    return bisect.bisect_right(boundaries, at)


class _Flat:
    """A :class:`~megatron.trace_format.records.SpanRecord` seen as the decoded span objects
    of a line are (:mod:`megatron.trace.otlp.decode`), so both take one path into the model."""

    __slots__ = ("record",)

    def __init__(self, record: SpanRecord) -> None:
        self.record = record

    name = property(lambda self: self.record["name"])
    trace_id = property(lambda self: self.record["trace_id"])
    span_id = property(lambda self: self.record["span_id"])
    parent_span_id = property(lambda self: self.record["parent_id"])
    start_time_unix_nano = property(lambda self: self.record["start_ns"])
    end_time_unix_nano = property(lambda self: self.record["end_ns"])
    kind = property(lambda self: self.record["kind"])
    status = True  # (the record always carries its status code)

    def has_attributes(self) -> bool:
        return bool(self.record["attributes"])

    def attribute(self, key: str, default: Any = None) -> Any:
        return self.record["attributes"].get(key, default)

    def attribute_dict(self) -> dict[str, Any]:
        return self.record["attributes"]

    def has_links(self) -> bool:
        return bool(self.record["links"])

    def link_pairs(self) -> list[tuple[str, str]]:
        return self.record["links"]

    def link_attribute_dicts(self) -> list[dict[str, Any]]:
        return self.record["link_attributes"]

    def event_dicts(self) -> list[Any]:
        return self.record["events"]

    def status_code(self) -> str:
        return self.record["status_code"]

    def status_message(self) -> str:
        return self.record["status_message"]


class TraceBuilder:
    """Feed spans (:meth:`add_line`, or :meth:`add` one flat record at a time), then
    :meth:`finish` into a :class:`Trace`.

    A builder is also the per-file summary of a parallel read: build one per
    file (:func:`scan_file`), :meth:`merge` them in file order, then finish.
    Merging is associative, so any grouping of the files gives the same trace.
    """

    def __init__(self, stats: ReadStats | None = None) -> None:
        self.stats = stats if stats is not None else ReadStats()
        self._processes: dict[tuple[Any, ...], _Process] = {}
        self.span_count = 0
        self._kinds: dict[str, int] = {}  # span name -> what a line adds of such spans
        self._resources: dict[tuple[Any, ...], dict[str, Any]] = {}  # see _shared
        self._ignored: set[str] = set()  # the names whose kind is _IGNORED
        self._splits: dict[tuple[Any, ...], _Split] = {}  # what finish() placed, per process
        self._finishes = 0

    def _process_for(self, resource: dict[str, Any], path: Path) -> _Process:
        key = process_key(resource, path)
        proc = self._processes.get(key)
        if proc is None:
            proc = self._processes[key] = _Process(key[0], path)
        return proc

    def _shared(self, resource: dict[str, Any]) -> dict[str, Any]:
        """One dict for each distinct resource the kept records point to.

        Every line decodes its own copy of its process's resource (twenty-odd
        attributes), and a kept record would keep that copy alive: at ten million
        spans, a fifth of ``check``'s memory was copies of the same few dicts.
        """
        try:
            key = tuple(resource.items())
            return self._resources.setdefault(key, resource)
        except TypeError:  # an unhashable value (an array attribute): keep this copy
            return resource

    def _kind(self, name: str) -> int:
        """What a span of this name adds (``_STRUCTURAL`` ... ``_IGNORED``), worked out once."""
        kind = self._kinds.get(name)
        if kind is None:
            if _kept_name(name):
                kind = _STRUCTURAL
            elif name == ITERATION_SPAN:
                kind = _ITERATION
            elif name == GRAD_SYNC_FINISH_SPAN:
                kind = _WAIT
            elif name.startswith(CHECKPOINT_SPAN_PREFIX):
                kind = _FINALIZE if name in _FINALIZE_NAMES else _CHECKPOINT
                if name.startswith(CHECKPOINT_LOAD_SPAN):  # a load's children lie inside it
                    kind = _FINALIZE_ONLY if kind == _FINALIZE else _IGNORED
            else:
                kind = _IGNORED
            self._kinds[name] = kind
            if kind == _IGNORED:
                self._ignored.add(name)
        return kind

    def _add_loop_roots(self, proc: _Process, roots: Sequence[Any]) -> None:
        """Add the training loop's time that no interval holds: a root iteration span, or a
        root span marked ``is_goodput_span`` that no report category claims by its name
        (Megatron-LM with ``save_interval`` 0 never opens an interval, so each loop pass's
        spans are roots). Inside an interval such spans are covered by it already."""
        kinds = self._kinds
        for span in roots:
            kind = kinds.get(span.name)
            if kind is None:
                kind = self._kind(span.name)
            if kind == _ITERATION or (
                kind == _IGNORED
                and span.has_attributes()
                and span.attribute(IS_GOODPUT_SPAN) is True
            ):
                proc.goodput_time.add(span.start_time_unix_nano, span.end_time_unix_nano)

    def add_line(self, line: DecodedLine) -> None:
        """Add every span of one decoded line (the fast path: no dict per span)."""
        try:
            self._add_line(line)
        except DAMAGE_ERRORS as error:
            raise damaged(line.path, line.number, error) from error

    def _add_line(self, line: DecodedLine) -> None:
        maybe_cut = line.may_hold(_CUT_SHORT_KEY)
        for batch in line.batches:
            if batch.spans:
                self._add_batch(batch.spans, batch.resource, line.path, line.number, maybe_cut)

    def _add_batch(
        self,
        spans: Sequence[Any],
        resource: dict[str, Any],
        path: Path | None,
        number: int,
        maybe_cut: bool,
    ) -> None:
        """Add decoded spans of one process (one request's batch), gathered with comprehensions;
        ``maybe_cut``: whether any may be marked cut short (the line holds the key)."""
        proc = self._process_for(resource, path)
        shared = None  # the batch's shared resource, looked up at its first record
        self.span_count += len(spans)
        kinds, ignored = self._kinds, self._ignored
        low = min([s.start_time_unix_nano for s in spans])
        if proc.min_start is None or low < proc.min_start:
            proc.min_start = low
        if proc.touched is None or low < proc.touched:
            proc.touched = low
        proc.max_end = max(proc.max_end, max([s.end_time_unix_nano for s in spans]))
        roots = [s for s in spans if not s.parent_span_id]
        if roots:
            proc.max_end_root = max(proc.max_end_root, max([s.end_time_unix_nano for s in roots]))
            self._add_loop_roots(proc, roots)
        if maybe_cut:  # the rare line that may hold a span marked cut short
            cut = {id(s) for s in spans if s.has_attributes() and s.attribute(SPAN_CUT_SHORT)}
            child_ends = [
                s.end_time_unix_nano for s in spans if s.parent_span_id and id(s) not in cut
            ]
            kept = [s for s in spans if s.name not in ignored or id(s) in cut]
        else:
            cut = set()
            child_ends = [s.end_time_unix_nano for s in spans if s.parent_span_id]
            kept = [s for s in spans if s.name not in ignored]  # and names not seen yet
        if child_ends:
            proc.max_end_child = max(proc.max_end_child, max(child_ends))
        numbers, starts, ends = proc.iterations.arrays()
        for span in kept:
            kind = kinds.get(span.name)
            if kind is None:
                kind = self._kind(span.name)
            if kind == _STRUCTURAL or id(span) in cut:
                if shared is None:
                    shared = self._shared(resource)
                proc.records.add(span_fields(span), shared, path, number)
                if kind in (_STRUCTURAL, _IGNORED):
                    continue
            if kind == _ITERATION:
                # an iteration whose step raised (ERROR status) did not finish
                # (an UNSET status is usually absent or {}: no call for it)
                failed = span.status and span.status_code() == "ERROR"
                if id(span) not in cut and not failed:
                    value = span.attribute(ITERATION)
                    if value is not None:
                        numbers.append(int(value))
                        starts.append(span.start_time_unix_nano)
                        ends.append(span.end_time_unix_nano)
                continue
            if kind == _WAIT:
                value = span.attribute(ITERATION)
                if value is not None and id(span) not in cut:
                    proc.waits.append(
                        int(value), span.start_time_unix_nano, span.end_time_unix_nano
                    )
                continue
            start, end = span.start_time_unix_nano, span.end_time_unix_nano
            if kind in (_CHECKPOINT, _FINALIZE):
                proc.checkpoint_time.add(start, end)
            if kind in (_FINALIZE, _FINALIZE_ONLY):
                proc.finalize_starts.append(start)

    def merge(self, other: TraceBuilder) -> TraceBuilder:
        """Add ``other``'s spans, as if its files were read after this one's; returns self."""
        for key, proc in other._processes.items():
            mine = self._processes.get(key)
            if mine is None:
                self._processes[key] = proc
            else:
                mine.merge(proc)
        self.span_count += other.span_count
        self.stats.torn.extend(other.stats.torn)
        self.stats.lines += other.stats.lines
        return self

    def add(self, span: SpanRecord) -> None:
        """Add one flat record (the trainer's tally hands its spans this way): the same path
        as :meth:`add_line`, a batch of one."""
        self._add_batch([_Flat(span)], span["resource"], span["file"], span["line"], True)

    def earliest_start(self) -> int | None:
        """The earliest start of any span added (None: no span)."""
        starts = [p.min_start for p in self._processes.values() if p.min_start is not None]
        return min(starts, default=None)

    def root_end(self, process: tuple[Any, ...]) -> int:
        """The latest end of a root span the process wrote (0: none)."""
        proc = self._processes.get(process)
        return proc.max_end_root if proc is not None else 0

    def finish(self) -> Trace:
        """The trace of everything added so far. It may be called again as more is added
        (``watch`` does at every scrape): each process's incarnations are then placed
        from what the previous finish placed (:class:`_Split`), and
        :attr:`Trace.touched` says from when on the processes changed since."""
        ranks: dict[str, list[Incarnation]] = {}
        processes = {}
        touched = {}
        for key, proc in self._processes.items():
            split = self._splits.get(key)
            if split is None or split.proc is not proc:
                split = self._splits[key] = _Split(key, proc)
            split.update()
            incs = split.incarnations()
            processes[key] = (list(split.boundaries), incs)
            ranks.setdefault(proc.rank, []).extend(incs)
            if proc.touched is not None:
                touched[key], proc.touched = proc.touched, None
        for incarnations in ranks.values():
            incarnations.sort(key=lambda inc: inc.start_ns)
            for index, inc in enumerate(incarnations):
                inc.index = index
        ordered = dict(sorted(ranks.items(), key=lambda item: _rank_sort_key(item[0])))
        self._finishes += 1
        return Trace(ordered, self.stats, self.span_count, processes, self._finishes, touched)


def _rank_sort_key(rank: str) -> tuple[int, int | str]:
    return (0, int(rank)) if rank.isdigit() else (1, rank)


def rank_value(rank: str) -> int | str:
    """A rank as the report writes it: the integer ``dl.rank`` gave, or (a resource without
    one) the instance id or file name the model named it by."""
    return int(rank) if rank.isdigit() else rank


# Span name -> the incarnation's record list it goes to: the structural spans of each
# report category (but startup, a single record) and the hang watchdog's.
_LIST_OF_CATEGORY = {
    Category.QUEUE: PRE_STARTUP_SPAN,  # (the list is named as its span)
    Category.LAUNCH: "launch",
    Category.GOODPUT: "intervals",
    Category.CHECKPOINT_SAVE: "saves",
    Category.CHECKPOINT_LOAD: "loads",
    Category.EVALUATION: "evaluations",
}
_LIST_OF_NAME = {
    **{
        name: _LIST_OF_CATEGORY[category]
        for name, category in SPAN_CATEGORY.items()
        if category != Category.STARTUP
    },
    HANG_SPAN: "hangs",
    HANG_RECOVERED_SPAN: "recoveries",
}
_SERIALS = itertools.count()  # tells the splits apart in Incarnation.revision


def _insert(positions: array, position: int, starts: array) -> bool:
    """Put ``position`` among ``positions`` (in start order, ties in log order: it is the
    newest record) and say whether it went last."""
    start = starts[position]
    if not positions or starts[positions[-1]] <= start:
        positions.append(position)
        return True
    positions.insert(bisect.bisect_right(positions, start, key=starts.__getitem__), position)
    return False


class _EndingScan:
    """How an incarnation's spans say it ended (the rule in ``megatron/trace/README.md``),
    its search for a shutdown reason kept between finishes: the reasons the startup and
    the intervals scanned so far carry (each with the error type of the first record
    that gave it), so a finish decodes only the intervals added since."""

    __slots__ = ("intervals", "reasons", "startup")

    def __init__(self) -> None:
        self.startup: int | None = -1  # the startup's position scanned (-1: none yet)
        self.intervals = array("q")  # the intervals' positions scanned, in order
        self.reasons: dict[str, Any] = {}

    def ending(
        self, inc: Incarnation, startup: int | None, intervals: array
    ) -> tuple[str, str | None]:
        """How the lifecycle's shutdown said ``inc`` ended, and the error type: the first
        record (its startup, then its intervals in order) of the strongest reason."""
        done = len(self.intervals)
        if self.startup == startup and intervals[:done] == self.intervals:
            records: Iterable[SpanRecord | None] = inc.intervals[done:]
        else:  # (an interval placed before others: scanned again from the start)
            self.startup, self.reasons = startup, {}
            records = itertools.chain([inc.startup], inc.intervals)
        for record in records:
            if record is None or SHUTDOWN_REASON not in record["attributes"]:
                continue
            reason = record["attributes"][SHUTDOWN_REASON]
            if isinstance(reason, str) and reason not in self.reasons:
                self.reasons[reason] = record["attributes"].get(ERROR_TYPE)
        self.intervals = array("q", intervals)
        for reason, ended in _ENDED_BY_REASON.items():
            if reason in self.reasons:
                return ended, self.reasons[reason]
        return ("cut_short" if inc.cut_short else "shutdown"), None


class _FactsCache:
    """An incarnation's :attr:`Incarnation.interval_facts` kept between finishes: what
    :func:`intervals.derive_each` gave, and what it was given, so that the next finish
    derives only the intervals added since (and reads only the iterations and saves
    that start inside them). It holds while the intervals derived before are still the
    first ones, in the same order, and nothing that derivation read has changed:
    for an interval derived from iterations or saves, no iteration or save came
    that starts before its end, and the iteration resumed from is the same; and the
    iterations are the rows they were and more (:func:`_lineage`)."""

    __slots__ = ("derived_reach", "intervals", "lengths", "lineage", "mark", "raw", "reach",
                 "resumed", "rows", "saves", "sized", "unfilled")  # fmt: skip

    def __init__(self) -> None:
        self.lineage: Any = None  # which rows of its process the iterations were (_lineage)
        self.rows = 0  # ... how many rows those had
        self.intervals = array("q")  # the positions of the intervals derived, in order
        self.saves = array("q")  # ... of the saves there were
        self.resumed: int | None = None
        self.raw: list[IntervalFacts] = []  # derive_each's facts
        self.reach = -(2**63)  # the latest end of an interval derived
        self.derived_reach: int | None = None  # ... of one derived from iterations or saves
        self.mark = 0  # the rows of the iterations that start before ``reach`` (in order)
        self.sized = 0  # by_length's look at the first ``sized`` facts:
        self.lengths: set[int] = set()  # ... the lengths of those with a known range
        self.unfilled = False  # ... whether one has a last iteration but no first

    def derive(self, inc: Incarnation) -> list[IntervalFacts]:
        """:func:`intervals.derive` of ``inc`` (its lists are views of one log)."""
        iterations, saves = inc.iterations, inc.saves
        positions: array = inc.intervals._positions  # type: ignore[attr-defined]
        save_positions: array = saves._positions  # type: ignore[attr-defined]
        starts = inc.intervals._log.starts  # type: ignore[attr-defined]
        ends = inc.intervals._log.ends  # type: ignore[attr-defined]
        resumed = inc.resumed_from
        count = len(iterations)
        if not self._holds(inc, count, positions, save_positions, starts, resumed):
            self.__init__()  # type: ignore[misc]  # (derived afresh)
        known = len(self.raw)
        new = positions[known:]
        if new:
            ordered = iterations.in_start_order()
            lowest = min(starts[p] for p in new)
            if known and ordered and lowest >= self.reach:  # only rows from the newest on
                rows: Iterations = iterations.slice(self.mark, count)
            else:
                rows = iterations
            part = saves.from_start(lowest) if known else saves  # type: ignore[attr-defined]
            self.raw = intervals.derive_each(inc.intervals, rows, part, resumed, self.raw)
            for position, facts in zip(new, self.raw[known:], strict=True):
                self.reach = max(self.reach, ends[position])
                if facts.derived:
                    reach = self.derived_reach
                    self.derived_reach = (
                        ends[position] if reach is None else max(reach, ends[position])
                    )
            if ordered:
                after = iterations.slice(self.mark, count).starts
                self.mark += bisect.bisect_left(after, self.reach)
        self.lineage, self.rows, self.resumed = _lineage(inc), count, resumed
        self.intervals, self.saves = array("q", positions), array("q", save_positions)
        return self._by_length(len(self.raw) if inc._facts_rerooted else len(self.raw) - 1)

    def _holds(
        self,
        inc: Incarnation,
        count: int,
        positions: array,
        save_positions: array,
        starts: array,
        resumed: int | None,
    ) -> bool:
        """Whether the facts derived before still hold (the class docstring)."""
        if not self.raw:
            return True
        lineage = _lineage(inc)
        if lineage is None or lineage != self.lineage or count < self.rows:
            return False
        iterations = inc.iterations
        if positions[: len(self.intervals)] != self.intervals:
            return False
        reach = self.derived_reach
        if reach is None:
            return True  # every fact from the intervals' own attributes
        if resumed != self.resumed or save_positions[: len(self.saves)] != self.saves:
            return False
        if any(starts[p] < reach for p in save_positions[len(self.saves) :]):
            return False
        if count > self.rows:
            if not iterations.in_start_order():
                return False
            if iterations.slice(self.rows, self.rows + 1).starts[0] < reach:
                return False
        return True

    def _by_length(self, full_count: int) -> list[IntervalFacts]:
        """:func:`intervals.by_length`, looking at each fact once: the facts as they are
        (a copy) unless a first iteration can be filled in."""
        raw = self.raw
        if full_count < self.sized:
            self.sized, self.lengths, self.unfilled = 0, set(), False
        for facts in raw[self.sized : max(full_count, 0)]:
            first, last = facts.first_iteration, facts.last_iteration
            if first is not None and last is not None:
                self.lengths.add(last - first + 1)
            elif last is not None:
                self.unfilled = True
        self.sized = max(full_count, self.sized)
        if self.unfilled and len(self.lengths) == 1:
            return intervals.by_length(raw, full_count)
        return list(raw)


def _lineage(inc: Incarnation) -> Any:
    """Which rows of its process's iterations an incarnation of a :class:`_Split` holds:
    equal for two finishes when the later one's rows only add to the earlier one's (the
    whole column, or a slice from the same row, in start order); None when they may not
    (sorted one by one)."""
    assert inc.revision is not None
    rows = inc.revision[3]
    if isinstance(rows, int):
        return "whole"
    return rows[0] if isinstance(rows[0], int) else None


class _Slot:
    """One incarnation's share of its process as placed so far (:class:`_Split`): its
    records' positions in the process's log, per list of :class:`Incarnation`, in start
    order (ties in log order), and what is worked out of them and kept between finishes."""

    __slots__ = (
        "ending",
        "facts",
        "first",
        "last",
        "lists",
        "startup",
        "startup_record",
        "version",
    )

    def __init__(self) -> None:
        self.lists = {name: array("q") for name in _RECORD_LISTS}
        self.startup: int | None = None  # the position of its megatron.startup
        self.startup_record: SpanRecord | None = None  # ... decoded once
        self.first, self.last = 2**63, -(2**63)  # the first start and last end of its records
        self.version = 0  # how many records were placed in it
        self.ending = _EndingScan()
        self.facts = _FactsCache()


class _Split:
    """A process cut into its incarnations, kept by its builder between finishes.

    One incarnation per ``megatron.startup`` of the process (at least one), split
    where the startups but the first began (:func:`slot_of`). Each record is placed by
    its name and times, which the log holds undecoded; only a startup is decoded. A
    builder whose files grow (``watch``) finishes again and again: the records added
    since the last finish are placed among the others, and only a new startup (which
    moves the boundaries) places them all again; an incarnation's iterations are cut
    from the process's by the rows added since. An incarnation's lists are views of
    the process's :class:`~megatron.trace._store.record_log.RecordLog` in start order
    (:class:`~megatron.trace._store.record_log.RecordList`): the readers decode them.
    """

    def __init__(self, key: tuple[Any, ...], proc: _Process) -> None:
        self.key, self.proc = key, proc
        self.placed = 0  # the records of the log placed so far
        self.boundaries: list[int] = []
        self.slots = [_Slot()]
        self.serial = next(_SERIALS)
        # iterations, waits -> (rows cut so far, where each boundary cuts them), and each
        # incarnation's slice of them with its (first, end) row
        self.cuts: dict[str, tuple[int, list[int]]] = {}
        self.parts: dict[str, list[tuple[Iterations, tuple[int, int]]]] = {}

    def update(self) -> None:
        """Place the records added since the last update."""
        log = self.proc.records
        count = len(log)
        if any(log.name(i) == STARTUP_SPAN for i in range(self.placed, count)):
            self._reset(count)
        else:
            for position in range(self.placed, count):
                self._place(position)
        self.placed = count

    def _reset(self, count: int) -> None:
        """Place every record again, in start order (stable: log order on ties)."""
        log = self.proc.records
        starts = log.starts
        order = sorted(range(count), key=starts.__getitem__)
        startups = [i for i in order if log.name(i) == STARTUP_SPAN]
        self.boundaries = [starts[i] for i in startups[1:]]
        self.slots = [_Slot() for _ in range(len(self.boundaries) + 1)]
        self.serial = next(_SERIALS)
        self.cuts, self.parts = {}, {}
        for position in order:
            self._place(position)

    def _place(self, position: int) -> None:
        log = self.proc.records
        starts = log.starts
        name, start, end = log.name(position), starts[position], log.ends[position]
        boundaries = self.boundaries
        slot = self.slots[slot_of(boundaries, name, start, end) if boundaries else 0]
        if log.cut_short(position):
            _insert(slot.lists["cut_short"], position, starts)
        if name == STARTUP_SPAN:
            slot.startup, slot.startup_record = position, None
        else:
            target = _LIST_OF_NAME.get(name)
            if target is None and name.startswith(STARTUP_PHASE_PREFIX):
                target = "startup_phases"
            if target is not None:
                _insert(slot.lists[target], position, starts)
        if name in SPAN_CATEGORY:  # a span of Incarnation.records
            slot.first, slot.last = min(slot.first, start), max(slot.last, end)
        slot.version += 1

    def incarnations(self) -> list[Incarnation]:
        """The process's incarnations as placed (new objects: the readers may change them)."""
        proc, log = self.proc, self.proc.records
        boundaries, slots = self.boundaries, self.slots
        incs = [Incarnation(proc.rank, 0, self.key) for _ in slots]
        for inc, slot in zip(incs, slots, strict=True):
            for name in _RECORD_LISTS:
                setattr(inc, name, log.view(array("q", slot.lists[name]), ordered=True))
            if slot.startup is not None:
                if slot.startup_record is None:  # (its log block is read once, not each time)
                    slot.startup_record = log[slot.startup]
                inc.startup = slot.startup_record
        iterations = self._distribute("iterations", proc.iterations)
        waits = self._distribute("waits", proc.waits)
        for index, inc in enumerate(incs):
            inc.iterations, inc.waits = iterations[index][0], waits[index][0]
            if len(incs) == 1:  # the usual case: the process's own, not copies
                inc.checkpoint_time, inc.goodput_time = proc.checkpoint_time, proc.goodput_time
                inc.finalize_starts = proc.finalize_starts
                continue
            lo = boundaries[index - 1] if index else -(2**63)
            hi = boundaries[index] if index < len(boundaries) else 2**63 - 1
            inc.checkpoint_time = proc.checkpoint_time.clipped(lo, hi)
            inc.goodput_time = proc.goodput_time.clipped(lo, hi)
            inc.finalize_starts = array("q", (s for s in proc.finalize_starts if lo <= s < hi))
        for index, (inc, slot) in enumerate(zip(incs, slots, strict=True)):
            times = [(slot.first, slot.last)] if slot.first <= slot.last else []
            for stretches in (inc.checkpoint_time, inc.goodput_time):
                if stretches:
                    times.append((stretches.starts[0], stretches.ends[-1]))
            if inc.iterations:
                times.append((inc.iterations.min_start(), inc.iterations.max_end()))
            if index == len(incs) - 1:
                times.append((proc.min_start or 0, proc.max_end))
            inc.start_ns = min((s for s, _ in times), default=0)
            inc.end_ns = max((e for _, e in times), default=0)
            if index > 0:
                inc.start_ns = max(inc.start_ns, boundaries[index - 1])
            inc.ended, inc.error_type = slot.ending.ending(
                inc, slot.startup, slot.lists["intervals"]
            )
            inc.revision = (
                self.serial,
                index,
                slot.version,
                iterations[index][1],
                waits[index][1],
                len(inc.finalize_starts),
            )
            inc._deriver = slot.facts.derive
        last = incs[-1]
        if last.ended == "shutdown" and (
            proc.max_end_child > proc.max_end_root or _lost_next(last)
        ):
            last.ended = "killed"
        for inc in incs:
            # a killed incarnation's last interval was closed by the reroot that opened the lost
            # one (as judged here: liveness may later call the last incarnation running)
            inc._facts_rerooted = inc.ended == "killed"
        return incs

    def _distribute(self, attribute: str, column: Iterations) -> list[tuple[Iterations, Any]]:
        """Each incarnation's iterations (or waits), in start order, and what tells them
        apart from what an earlier finish gave it (:attr:`Incarnation.revision`).

        They come in start order (a process runs its iterations one after another, and
        the pieces of a file merge in file order): then one incarnation takes them as
        they are, and several (``pretrain()`` called again in the process: an in-process
        restart) take a slice each, cut where their startups began, only the rows added
        since the last finish read to find where. Otherwise they are sorted one by one
        first (a Python object per iteration: never seen in a file).
        """
        count = len(column)
        if column.in_start_order():
            if len(self.slots) == 1:
                return [(column, count)]  # the usual case: no copy
            rows, cuts = self.cuts.get(attribute, (0, [0] * len(self.boundaries)))
            if count > rows:  # slot_of places a start equal to a boundary after it
                starts = column.slice(rows, count).starts
                cuts = [
                    cut if cut < rows else rows + bisect.bisect_left(starts, boundary)
                    for cut, boundary in zip(cuts, self.boundaries, strict=True)
                ]
                self.cuts[attribute] = (count, cuts)
            bounds = [0, *cuts, count]
            earlier = self.parts.get(attribute, [])
            found = []
            for index, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                before = earlier[index] if index < len(earlier) else None
                if before is not None and before[1] == (lo, hi):
                    found.append(before)  # the same rows: the same object, its scan kept
                    continue
                grew = before is not None and before[1][0] == lo
                found.append((column.slice(lo, hi, before[0] if grew else None), (lo, hi)))
            self.parts[attribute] = found
            return found
        parts = [Iterations() for _ in self.slots]
        numbers, starts, ends = column.numbers, column.starts, column.ends
        for i in sorted(range(len(starts)), key=starts.__getitem__):
            start, end = starts[i], ends[i]
            slot = slot_of(self.boundaries, ITERATION_SPAN, start, end)
            parts[slot].append(numbers[i], start, end)
        return [(part, ("sorted", count)) for part in parts]


def _lost_next(inc: Incarnation) -> bool:
    """Whether the incarnation's last interval was closed by a reroot that opened
    an interval the file does not hold (it was in flight at a SIGKILL)."""
    if not inc.intervals:
        return False
    last = latest(inc.intervals)
    return last is not None and last["attributes"].get(INTERVAL_REROOTED) is True


def scan_file(path: Path | str | FilePiece) -> TraceBuilder:
    """The map step of a parallel read: one file's (or piece's) spans in a builder."""
    builder = TraceBuilder()
    with paused_gc():
        for line in iter_batches(path, builder.stats):
            builder.add_line(line)
    return builder


def scan(
    paths: Iterable[Path | str], jobs: int | None = None, executor: Executor | None = None
) -> TraceBuilder:
    """Every file scanned (in parallel processes when there are several) and merged in order."""
    work = pieces(list(paths), jobs, count_lines=False)  # numbered as handed out
    return map_reduce(scan_file, TraceBuilder.merge, work, jobs, executor)


def load_trace(
    paths: Iterable[Path | str], jobs: int | None = None, executor: Executor | None = None
) -> Trace:
    """Read the files once, streaming, into a :class:`Trace`.

    Several files are read in ``jobs`` parallel processes (default: one per
    file, up to the cores), or on ``executor``. Raises
    :class:`~megatron.trace.otlp.reader.TraceFileDamaged` on damage; torn
    writes are in ``trace.stats.torn``.
    """
    return scan(paths, jobs, executor).finish()
