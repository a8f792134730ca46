"""The trace model built in one streaming pass: :class:`TraceBuilder`, :func:`load_trace`.

Spans are grouped by the process that wrote them and cut into its incarnations
(:mod:`megatron.trace.model.identity` states the rule; :mod:`megatron.trace.model.split`
places the records); the result is a :class:`~megatron.trace.model.incarnation.Trace`.

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

How an incarnation ended is :mod:`megatron.trace.model.ending`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from types import MappingProxyType
from typing import Any

from megatron.trace.model.identity import process_key, rank_sort_key
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.launches import same_launch
from megatron.trace.model.process import ProcessSpans
from megatron.trace.model.split import Split
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
from megatron.trace_format.errors import SpansReadTwiceError
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    CHECKPOINT_EXIT_FINALIZE_SPAN,
    CHECKPOINT_FINALIZE_SPAN,
    CHECKPOINT_LOAD_SPAN,
    CHECKPOINT_SPAN_PREFIX,
    GRAD_SYNC_FINISH_SPAN,
    HANG_RECOVERED_SPAN,
    HANG_SPAN,
    IS_GOODPUT_SPAN,
    ITERATION,
    ITERATION_SPAN,
    SPAN_CUT_SHORT,
    STARTUP_PHASE_PREFIX,
    STRUCTURAL_SPAN_NAMES,
)

__all__ = ["TraceBuilder", "load_trace", "refuse_spans_read_twice", "scan", "scan_file"]


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


def _kept_name(name: str) -> bool:
    return name in _KEPT_NAMES or name.startswith(STARTUP_PHASE_PREFIX)


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
        self._processes: dict[tuple[Any, ...], ProcessSpans] = {}
        self.span_count = 0
        self._kinds: dict[str, int] = {}  # span name -> what a line adds of such spans
        self._resources: dict[tuple[Any, ...], dict[str, Any]] = {}  # see _shared
        self._ignored: set[str] = set()  # the names whose kind is _IGNORED
        self._splits: dict[tuple[Any, ...], Split] = {}  # what finish() placed, per process

    def _process_for(self, resource: dict[str, Any], path: Path) -> ProcessSpans:
        key = process_key(resource, path)
        proc = self._processes.get(key)
        if proc is None:
            proc = self._processes[key] = ProcessSpans(key[0], path)
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

    def _add_loop_roots(self, proc: ProcessSpans, roots: Sequence[Any]) -> None:
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
        proc.span_count += len(spans)
        kinds, ignored = self._kinds, self._ignored
        low = min([s.start_time_unix_nano for s in spans])
        if proc.min_start is None or low < proc.min_start:
            proc.min_start = low
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

    @property
    def processes(self) -> Mapping[tuple[Any, ...], ProcessSpans]:
        """What was added so far, per writing process (:func:`process_key`), read only."""
        return MappingProxyType(self._processes)

    def root_end(self, process: tuple[Any, ...]) -> int:
        """The latest end of a root span the process wrote (0: none)."""
        proc = self._processes.get(process)
        return proc.max_end_root if proc is not None else 0

    def finish(self) -> Trace:
        """The trace of everything added so far. It may be called again as more is added:
        each process's incarnations are then placed from what the previous finish placed
        (:class:`Split`), so a finish costs what was added since, not what came before."""
        ranks: dict[str, list[Incarnation]] = {}
        processes = {}
        spared: list[Incarnation] = []
        for key, proc in self._processes.items():
            split = self._splits.get(key)
            if split is None or split.proc is not proc:
                split = self._splits[key] = Split(key, proc)
            split.update()
            incs = split.incarnations()
            processes[key] = (list(split.boundaries), incs)
            ranks.setdefault(proc.rank, []).extend(incs)
        for incarnations in ranks.values():
            incarnations.sort(key=lambda inc: inc.start_ns)
            for index, inc in enumerate(incarnations):
                inc.index = index
            spared += _killed_in_first_iteration(incarnations)
        _killed_on_another_rank(spared, ranks)
        ordered = dict(sorted(ranks.items(), key=lambda item: rank_sort_key(item[0])))
        spans = {key: proc.span_count for key, proc in self._processes.items()}
        return Trace(ordered, self.stats, self.span_count, processes, spans)

    def repeated_span(self) -> tuple[SpanRecord, SpanRecord] | None:
        """Two reads of one span, as the last :meth:`finish` found them (None: none): a
        process's ``megatron.startup`` twice, with the same start and end. A process starts
        ``pretrain()`` once at a time, so it is one span read twice: one file named by two
        paths, or a job's own file read with a receiver's copy of it."""
        for split in self._splits.values():
            if split.repeated is not None:
                first, second = split.proc.records.records(split.repeated)
                return first, second
        return None


def _killed_in_first_iteration(incs: list[Incarnation]) -> list[Incarnation]:
    """Mark killed each of a rank's incarnations that wrote its startup and nothing of its
    training loop (no interval, iteration or goodput span), though the rank's other
    incarnations wrote intervals: a SIGKILL during its first iteration lost the interval in
    flight, and a clean end would have written it. But one that resumed where a clean end
    left off may have had nothing left to train, unless a later incarnation trained on from
    there: those are returned, for the other ranks to tell (:func:`_killed_on_another_rank`).
    (A rank that never writes an interval, Megatron-LM with ``save_interval`` 0 and the
    default groups, cannot tell the two.)"""
    with_intervals = any(inc.intervals for inc in incs)
    spared = []
    for position, inc in enumerate(incs):
        if inc.ended != "shutdown" or inc.startup is None or inc.in_flight is not None:
            continue
        if inc.intervals or inc.iterations or inc.goodput_time or not with_intervals:
            continue
        before = incs[position - 1] if position else None
        if (
            before is not None
            and before.ended == "shutdown"
            and before.last_iteration is not None
            and inc.resumed_from == before.last_iteration + 1
            and not any(
                (later.last_iteration or -1) >= inc.resumed_from for later in incs[position + 1 :]
            )
        ):
            spared.append(inc)  # resumed where a clean end left off: nothing left to train?
            continue
        inc.ended = "killed"
    return spared


def _killed_on_another_rank(spared: list[Incarnation], ranks: dict[str, list[Incarnation]]) -> None:
    """Mark killed each ``spared`` incarnation (:func:`_killed_in_first_iteration`) whose
    launch another rank's file shows killed or training: every rank of a launch had the
    same iterations to train, and a kill of one brings the others down."""
    for inc in spared:
        for rank, incs in ranks.items():
            if rank == inc.rank:
                continue
            other = same_launch([inc], incs)[0]
            if other is not None and (
                other.ended == "killed" or other.intervals or other.iterations
            ):
                inc.ended = "killed"
                break
        else:
            inc.ending_unsure = True


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
    :class:`~megatron.trace.otlp.reader.TraceFileDamaged` on damage, and
    :class:`~megatron.trace_format.errors.SpansReadTwiceError` when the files hold one
    span twice (every figure would count it twice); torn writes are in
    ``trace.stats.torn``.
    """
    builder = scan(paths, jobs, executor)
    trace = builder.finish()
    refuse_spans_read_twice(builder)
    return trace


def refuse_spans_read_twice(builder: TraceBuilder) -> None:
    """Raise :class:`~megatron.trace_format.errors.SpansReadTwiceError` when the finished
    ``builder`` read one span twice (:meth:`TraceBuilder.repeated_span`): every figure
    drawn from it would count that span's time twice."""
    repeated = builder.repeated_span()
    if repeated is not None:
        first, second = repeated
        raise SpansReadTwiceError(
            f"{_where(second)}: span {second['name']} {second['span_id']} was read already, "
            f"at {_where(first)}: the files hold the same spans twice (a job's own file and "
            f"a receiver's copy of it?), and every figure would count them twice; name one "
            f"copy (megatron-trace check lists each span read twice)"
        )


def _where(record: SpanRecord) -> str:
    return f"{record['file']}:{record['line']}"
