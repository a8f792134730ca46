"""What ``megatron-trace export`` writes: a trace as Chrome trace-event JSON or Perfetto's protobuf.

``--format chrome`` (:mod:`megatron.trace.render.export.chrome`) is what Perfetto UI,
``chrome://tracing`` and PyTorch profiler users read; ``--format perfetto``
(:mod:`megatron.trace.render.export.perfetto`) is Perfetto's native trace, a fraction
of the size, which its UI loads without the JSON importer's limits. Both put
a track (a thread) per incarnation and rank, spans as nested slices, links as
flow arrows.

Two passes over the files keep memory independent of their size: the first
builds the trace model (which incarnation and rank each span belongs to) and
collects the links; the second writes each span as it is read. Several files
are read in parallel processes in both passes (each file's events go to a
part, the parts are joined in file order). ``--since``/``--until``/
``--ranks`` (:mod:`megatron.trace.model.window`) cut a window out of a big trace;
an output bigger than a browser tab loads gets a warning that suggests one.
A lane still running (:mod:`megatron.trace.analysis.liveness`) says so in its
track's name ("rank 0 (running as of …)").

The file is written beside ``-o`` and renamed over it at the end, so a failure
(a damaged input line) never leaves a half-written output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from megatron.trace.analysis.liveness import Clock, judge
from megatron.trace.model.builder import TraceBuilder, refuse_spans_read_twice
from megatron.trace.model.identity import process_key
from megatron.trace.model.incarnation import Trace
from megatron.trace.model.jobs import one_job
from megatron.trace.model.window import (
    Window,
    format_offset,
    resolve_window,
    trace_start,
)
from megatron.trace.otlp.decode import spans_with_links
from megatron.trace.otlp.parallel import FilePiece, imap_files, map_files, pieces
from megatron.trace.otlp.reader import iter_batches, paused_gc
from megatron.trace.otlp.spans import FileSpans, reading, span_source
from megatron.trace.render.export.chrome import ChromePart, ChromeWriter
from megatron.trace.render.export.flows import FlowPlan
from megatron.trace.render.lanes import LaneIndex
from megatron.trace.render.output import replacing
from megatron.trace_format.errors import MissingExtraError, NoSpansError
from megatron.trace_format.files import fixed_end

__all__ = ["FORMATS", "SIZE_LIMITS", "export_chrome", "export_files"]

FORMATS = ("chrome", "perfetto")
#: Output sizes Perfetto UI can still load in a browser tab (about 2 GB of tab
#: memory; its JSON importer needs 2-4x the file, the protobuf one far less).
SIZE_LIMITS = {"chrome": 256 * 2**20, "perfetto": 1024 * 2**20}
_LINKS_KEY = b'"links"'


@dataclass
class ExportResult:
    """What ``export`` wrote: ``events`` (records), ``size`` (bytes), the window, the trace."""

    events: int
    size: int
    window: Window
    trace: Trace


def _mb(size: float) -> str:
    return f"{size / 2**20:.1f} MB" if size < 2**30 else f"{size / 2**30:.2f} GB"


def size_warning(result: ExportResult, fmt: str, output: Path) -> str | None:
    """What to say when the output is too big for Perfetto UI: the cut that would fit."""
    limit = SIZE_LIMITS[fmt]
    if result.size <= limit:
        return None
    trace, window = result.trace, result.window
    start = window.since_ns if window.since_ns is not None else trace_start(trace)
    end = (
        window.until_ns
        if window.until_ns is not None
        else max(inc.end_ns for inc in trace.incarnations)
    )
    fraction = limit / result.size
    offset = start - trace_start(trace) + (end - start) * fraction * 0.9
    hints = [
        f"--since {format_offset(start - trace_start(trace))} --until {format_offset(offset)}"
        if window.since_ns is not None
        else f"--until {format_offset(offset)}"
    ]
    ranks = [r for r in trace.ranks if window.ranks is None or r in window.ranks]
    if len(ranks) > 1:
        hints.append(f"--ranks {ranks[0]}")
    other = " (or --format perfetto, a fraction of the size)" if fmt == "chrome" else ""
    return (
        f"{output} is {_mb(result.size)}; Perfetto UI loads about {_mb(limit)} of "
        f"{'JSON' if fmt == 'chrome' else 'protobuf'} trace in a browser tab: cut a window, "
        f"e.g. {' or '.join(hints)}{other}"
    )


# -- pass 1: the model and the links ------------------------------------------


@dataclass
class _Plan:
    """What the first pass learnt: the pieces it read, the lanes, the links and the time
    origin."""

    pieces: list[FilePiece]  # as the first pass read them: numbered, for the second
    lanes: LaneIndex
    flows: FlowPlan | None  # the Chrome export's drawing of each link (None: Perfetto's)
    # Perfetto's: span id -> its begin's flow_ids (perfetto_trace.flow_fields)
    flow_fields: dict[str, bytes] = field(default_factory=dict)
    origin: int = 0  # the earliest start, rounded down to a whole second (ns)


def _learn(path: FilePiece) -> tuple[FilePiece, TraceBuilder, list[tuple[Any, str, str]]]:
    """The first pass over one piece of a file: the piece (numbered as it was handed out),
    its model summary and its links (the linking span's process, linking, linked-to)."""
    builder, links = TraceBuilder(), []
    with reading(path.path), paused_gc():
        for line in iter_batches(path, builder.stats):
            builder.add_line(line)
            if line.may_hold(_LINKS_KEY):
                for batch in line.batches:
                    process = None
                    for span in spans_with_links(batch.spans):
                        process = process or process_key(batch.resource, line.path)
                        links.extend(
                            (process, span.span_id, target) for _, target in span.link_pairs()
                        )
    return path, builder, links


def _plan(
    fmt: str,
    paths: Sequence[Path],
    work: Sequence[FilePiece],
    jobs: int | None,
    clock: Clock,
    executor: Executor | None,
    job: str | None,
) -> tuple[_Plan, Trace]:
    read, builder, links = [], TraceBuilder(), []
    for piece, piece_builder, piece_links in imap_files(_learn, work, jobs, executor):  # folded
        read.append(piece)
        builder = builder.merge(piece_builder)
        links += piece_links
    earliest = builder.earliest_start()
    if earliest is None:
        raise NoSpansError(paths)
    trace = builder.finish()
    refuse_spans_read_twice(builder)
    trace = one_job(trace, job)  # (the other jobs' processes are not drawn)
    judge(trace, paths, clock)  # which last incarnations are still running
    drawn = [(linking, target) for process, linking, target in links if process in trace.processes]
    flows, fields = None, {}
    if fmt == "chrome":
        flows = FlowPlan()
        for linking, target in drawn:
            flows.add(linking, target)
        flows.plan()
    else:  # Perfetto's flows are the links themselves: nothing to plan
        from megatron.trace.render.export.perfetto import flow_fields

        fields = flow_fields(drawn)
    del links, drawn  # (the plan keeps what each format draws, not the links)
    if len(trace.processes) < len(builder.processes):  # one job of several: from its start
        earliest = min(
            start
            for key in trace.processes
            if (start := builder.processes[key].min_start) is not None
        )
    origin = earliest - earliest % 1_000_000_000
    return _Plan(read, LaneIndex(trace), flows, fields, origin), trace


def _writer(fmt: str, plan: _Plan, part: int) -> Any:
    if fmt == "perfetto":
        from megatron.trace.render.export.perfetto import PerfettoWriter

        return PerfettoWriter(plan.lanes, plan.flow_fields, part, seams=part > 0)
    assert plan.flows is not None  # planned for this format
    return ChromeWriter(plan.lanes, plan.flows, plan.origin)


def _write_spans(
    path: FilePiece, writer: Any, out: IO[bytes], window: Window, lanes: LaneIndex
) -> None:
    ranks, cuts = window.ranks, window.cuts_time
    since = window.since_ns if window.since_ns is not None else -(2**63)
    until = window.until_ns if window.until_ns is not None else 2**64
    with reading(path.path), paused_gc():
        for line in iter_batches(path):
            for batch in line.batches:
                process = process_key(batch.resource, line.path)
                if ranks is not None and process[0] not in ranks:
                    continue
                if process not in lanes.trace.processes:  # another job's
                    continue
                spans = batch.spans
                if window.stretches is not None:  # iterations as they ran: several stretches
                    keeps = window.keeps
                    spans = [
                        s for s in spans if keeps(s.start_time_unix_nano, s.end_time_unix_nano)
                    ]
                elif cuts:
                    spans = [
                        s
                        for s in spans
                        if s.end_time_unix_nano >= since and s.start_time_unix_nano <= until
                    ]
                for lane, group in lanes.split(process, spans):
                    writer.spans(out, lane, group)


@dataclass
class _Part:
    """Pass 2 over one piece of a file into its own part file (picklable, for the pool)."""

    fmt: str
    plan: _Plan
    window: Window
    parts: dict[FilePiece, tuple[int, Path]]  # input -> (part number, part file)

    def __call__(self, path: FilePiece) -> Any:
        number, part_file = self.parts[path]
        writer = _writer(self.fmt, self.plan, number)
        with open(part_file, "wb") as out:
            _write_spans(path, writer, out, self.window, self.plan.lanes)
            writer.finish_part(out)
        return writer.part


def _kept(parts: Iterator[Any], into: list[Any]) -> Iterator[Any]:
    """The parts, each also kept in ``into`` (for the count and the footer) as it passes."""
    for part in parts:
        into.append(part)
        yield part


def export_files(
    paths: Sequence[Path | str],
    output: Path,
    fmt: str = "chrome",
    since: str | None = None,
    until: str | None = None,
    ranks: str | None = None,
    jobs: int | None = None,
    clock: Clock | None = None,
    executor: Executor | None = None,
    job: str | None = None,
) -> ExportResult:
    """Write the spans of ``paths`` to ``output`` in ``fmt``; returns what was written.

    Raises :class:`TraceInputError` (a file missing or damaged, no spans, several jobs
    and none named by ``job``: :func:`~megatron.trace.model.jobs.one_job`) or
    :class:`WindowError` (a bound that names nothing); ``output`` is then
    untouched. The files are read in pieces (:func:`~megatron.trace.otlp.parallel.pieces`)
    in ``jobs`` processes, or on ``executor``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r}: valid are {', '.join(FORMATS)}")
    files = span_source([Path(p) for p in paths]).paths
    if fmt == "perfetto":
        try:
            import perfetto.protos.perfetto.trace.perfetto_trace_pb2  # noqa: F401
        except ImportError:
            raise MissingExtraError("--format perfetto", "perfetto") from None
    # both passes read the same lines, however much a running job appends meanwhile
    fixed = [fixed_end(piece) for piece in pieces(files, jobs, count_lines=False)]
    plan, trace = _plan(fmt, files, fixed, jobs, clock or Clock.system(), executor, job)
    window = resolve_window(trace, since, until, ranks)
    part_files: list[Path] = []
    try:
        with replacing(output, binary=True) as out:
            writer = _writer(fmt, plan, 0)
            count = writer.header(out)
            work = plan.pieces  # the same pieces, numbered as the first pass read them
            if len(work) == 1 or (jobs == 1 and executor is None):
                for piece in work:
                    _write_spans(piece, writer, out, window, plan.lanes)
                writer.finish_part(out)
                parts = [writer.part]
            else:
                # each piece's events to a part of its own, in parallel; joined in file order
                numbered = {
                    piece: (n + 1, output.with_name(f".{output.name}.part{n}"))
                    for n, piece in enumerate(dict.fromkeys(work))
                }
                part_files = [part for _, part in numbered.values()]
                write = _Part(fmt, plan, window, numbered)
                if len(numbered) == len(work):  # joined as they come: none waits whole here
                    written = imap_files(write, list(numbered), jobs, executor)
                else:  # a file given twice: its part twice
                    written_once = map_files(write, list(numbered), jobs, executor)
                    by_piece = dict(zip(numbered, written_once, strict=True))
                    written = (by_piece[piece] for piece in work)
                parts = []
                writer.join(out, _kept(written, parts), [numbered[piece][1] for piece in work])
            count += sum(part.events for part in parts)
            count += writer.footer(out, parts)
    finally:
        for part in part_files:
            part.unlink(missing_ok=True)
    return ExportResult(count, output.stat().st_size, window, trace)


def export_chrome(
    source: FileSpans,
    output: Path,
    files: Sequence[Path | str] = (),
    clock: Clock | None = None,
) -> int:
    """Write the spans of ``source`` (:func:`~megatron.trace.otlp.spans.span_source`) as Chrome
    trace JSON; returns the event count. ``files`` (where the heartbeat is looked up)
    are ``source``'s own; ``clock`` is what running is judged against."""
    return export_files(source.paths, output, "chrome", jobs=1, clock=clock).events


__all__ += ["ChromePart", "ExportResult", "size_warning"]
