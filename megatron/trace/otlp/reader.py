"""Read back the OTLP/JSON lines the ``jsonl`` sink wrote: the one streaming reader.

``megatron-trace`` and the tests read trace files through this module, so
they can never disagree about what is on disk. (The end-of-run summary does
not read the file at all: it counts as the run goes, see ``tally``.)

A trace file holds one OTLP/JSON ``ExportTraceServiceRequest`` per line. That
nesting (resource -> scope -> spans, attributes as typed ``KeyValue`` lists,
integers as decimal strings) is right for interchange and awkward for
analysis, so :func:`iter_spans` flattens it into one plain dict per span (a
:class:`~megatron.trace_format.records.SpanRecord`, the shape the tally
builds too). It reads line by line: memory depends on the longest line (one
export batch), never on the file's size, so a week-long job's gigabytes read
like a minute's.

Files are opened by :mod:`megatron.trace_format.files`, which reads
rotated and compressed copies (gzip, zstd) as transparently as plain ones.

Two kinds of bad line, told apart because they mean different things:

* A **torn write**: the line ends before its JSON does (a process died in the
  middle of a ``write``). The sink starts the next incarnation's first write
  with a newline, so a torn line can sit anywhere in the file, followed by
  whole lines. It is skipped and counted in :class:`ReadStats`, with its file
  and line number.
* **Damage**: anything else that does not decode into spans (garbage in the
  middle of a line, a JSON value that is no export request). Nothing a crash
  leaves behind looks like that, so it raises :class:`TraceFileDamaged`
  naming the file and line.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.trace.otlp.decode import (
    SpanBatch,
    decode_any_value,
    decode_attributes,
    decode_fast,
    decode_python,
)
from megatron.trace_format.errors import TraceFileDamaged
from megatron.trace_format.files import FilePiece, is_compressed
from megatron.trace_format.files import iter_piece_lines as piece_lines
from megatron.trace_format.records import SpanFields, SpanRecord, span_record

__all__ = [
    "DAMAGE_ERRORS",
    "DecodedLine",
    "NotSpansError",
    "ReadStats",
    "SpanBatch",
    "TornLine",
    "TraceFileDamaged",
    "damaged",
    "decode_any_value",
    "decode_attributes",
    "decode_line",
    "flat_span",
    "iter_batches",
    "iter_lines",
    "iter_logs",
    "iter_metrics",
    "iter_requests",
    "iter_requests_backwards",
    "iter_spans",
    "offset_after_time",
    "paused_gc",
    "read_spans",
    "span_fields",
]

#: What a failed decode of a whole line's structure raises (then: damage).
DAMAGE_ERRORS = (KeyError, TypeError, ValueError, AttributeError)
# JSON literals a line can be cut inside of.
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_PARTIAL_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{0,4})?$")
_PARTIAL_NUMBER = re.compile(r"-?[0-9]*(\.[0-9]*)?([eE][-+]?[0-9]*)?")


@dataclass(frozen=True)
class TornLine:
    """A line cut short by a process that died mid-write (skipped)."""

    path: Path
    line: int


@dataclass
class ReadStats:
    """What a read skipped: the torn lines, in file order."""

    torn: list[TornLine] = field(default_factory=list)
    lines: int = 0


def _is_torn(text: str, error: json.JSONDecodeError) -> bool:
    """Whether ``text`` is a prefix of some JSON value: the decoder ran out of input."""
    if error.pos >= len(text) or error.msg.startswith("Unterminated string"):
        return True
    rest = text[error.pos :]
    if any(literal.startswith(rest) for literal in _LITERALS):
        return True  # cut inside true/false/null
    if _PARTIAL_NUMBER.fullmatch(rest):
        return True  # cut inside a number ("5.", "1e", "-")
    # cut inside an escape sequence near the end of a string
    return error.msg.startswith("Invalid") and _PARTIAL_ESCAPE.search(text) is not None


def iter_lines(
    paths: Path | str | FilePiece | Iterable[Path | str | FilePiece],
    stats: ReadStats | None = None,
) -> Iterator[tuple[Path, int, bytes]]:
    """Yield ``(path, line number, bytes)`` for every line of the files that is not blank.

    The file-opening layer: everything above it sees only lines. A
    :class:`~megatron.trace_format.files.FilePiece` reads its share of
    a file, numbered as the whole file's lines.
    """
    if isinstance(paths, str | Path | FilePiece):
        paths = [paths]
    for raw_path in paths:
        # plain, gzip or zstd: trace_files opens and decompresses; decoding stays above
        piece = raw_path if isinstance(raw_path, FilePiece) else FilePiece(Path(raw_path))
        if piece.first_line == 0:  # a programming error: the lines would be misnumbered
            raise ValueError(f"{piece}: not numbered yet (trace_files.numbered)")
        path = piece.path
        for number, raw in enumerate(piece_lines(piece), start=piece.first_line):
            if stats is not None:
                stats.lines += 1
            if not raw or raw.isspace():
                continue
            yield path, number, raw


def _request(path: Path, number: int, raw: bytes, stats: ReadStats | None) -> Any:
    """One line decoded by the standard library; ``None`` for a torn write (recorded)."""
    text = raw.decode("utf-8", errors="replace").rstrip()
    try:
        request = json.loads(text)
    except json.JSONDecodeError as error:
        if _is_torn(text, error):
            if stats is not None:
                stats.torn.append(TornLine(path, number))
            return None
        raise TraceFileDamaged(path, number, str(error)) from error
    if not isinstance(request, dict):
        raise TraceFileDamaged(path, number, "not a JSON object")
    return request


def iter_requests(
    paths: Path | str | Iterable[Path | str], stats: ReadStats | None = None
) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """Yield ``(path, line number, request)`` for every whole line of the files.

    Blank lines are skipped; torn writes are skipped and recorded in ``stats``;
    any other undecodable line raises :class:`TraceFileDamaged`.
    """
    for path, number, raw in iter_lines(paths, stats):
        request = _request(path, number, raw, stats)
        if request is not None:
            yield path, number, request


@dataclass(frozen=True, slots=True)
class DecodedLine:
    """One line of a trace file, decoded: its ``resourceSpans`` as :class:`SpanBatch` es.

    ``raw`` is the line as read, for a consumer's fast test of whether the
    line can hold something at all (``key in raw``: an attribute key missing
    from the bytes is in no span of the line, unless a ``\\u`` escape spells it).
    """

    path: Path
    number: int
    raw: bytes
    batches: list[SpanBatch]

    def may_hold(self, key: bytes) -> bool:
        """False only when no string of the line can equal ``key`` (ASCII)."""
        raw = self.raw
        return key in raw or b"\\" in raw  # any escape could spell a character of it


def iter_requests_backwards(
    path: Path | str, block_size: int = 1 << 16, end: int | None = None
) -> Iterator[dict[str, Any]]:
    """The requests of one file, like :func:`iter_requests`, newest line first.

    For readers that want only the latest records (the heartbeat in a week's
    ``metrics.jsonl``): stopping after the first few lines costs a few blocks,
    whatever the file's size. ``end`` (a byte offset, :func:`offset_after_time`)
    starts there instead of at the file's end, from the end of the line it falls
    in. Torn writes are skipped; damage raises
    :class:`TraceFileDamaged` with the line's number, counted from the start
    (only then is the rest of the file scanned, for the count). A compressed
    file (rotated, gzip or zstd) cannot be read from its end: it is read
    through in order, then given back newest first (``end`` ignored).
    """
    path = Path(path)
    with path.open("rb") as probe:
        compressed = is_compressed(probe.read(4))
    if compressed:
        yield from reversed([request for _, _, request in iter_requests(path)])
        return
    with path.open("rb") as file:
        size = file.seek(0, 2)
        if end is not None and end < size:
            file.seek(max(0, end - 1))
            file.readline()  # to the end of the line the offset falls in
            size = file.tell()
        position, carry = size, b""

        def decode(raw: bytes, offset: int) -> dict[str, Any] | None:
            text = raw.decode("utf-8", errors="replace").rstrip()
            if not text:
                return None
            try:
                request = json.loads(text)
            except json.JSONDecodeError as error:
                if _is_torn(text, error):
                    return None
                raise TraceFileDamaged(path, _line_at(file, offset), str(error)) from error
            if not isinstance(request, dict):
                raise TraceFileDamaged(path, _line_at(file, offset), "not a JSON object")
            return request

        while position > 0:
            size = min(block_size, position)
            position -= size
            file.seek(position)
            chunk = file.read(size) + carry
            pieces = chunk.split(b"\n")
            carry = pieces[0]  # may continue in the block before this one
            offset = position + len(chunk)
            for piece in reversed(pieces[1:]):
                offset -= len(piece) + 1
                request = decode(piece, offset + 1)
                if request is not None:
                    yield request
        if carry:
            request = decode(carry, 0)
            if request is not None:
                yield request


_TIME_FIELD = re.compile(rb'"timeUnixNano":\s*"?(\d+)')


def offset_after_time(path: Path | str, time_ns: int, block_size: int = 1 << 16) -> int | None:
    """A byte offset of an uncompressed file of OTLP/JSON lines in time order (a
    ``metrics.jsonl``) past which the lines' points are all newer than ``time_ns``, found
    by bisection: a few lines read, whatever the file's size. None: a compressed file
    (read it whole). Lines a few seconds out of order (several writers) need a slack."""
    path = Path(path)
    with path.open("rb") as file:
        if is_compressed(file.read(4)):
            return None
        lo, hi = 0, file.seek(0, 2)
        while hi - lo > block_size:
            mid = (lo + hi) // 2
            file.seek(mid)
            file.readline()  # the rest of the line the offset falls in
            start = file.tell()
            line = file.readline()
            times = [int(found) for found in _TIME_FIELD.findall(line)]
            if not line or (times and min(times) > time_ns):
                hi = mid
            else:
                lo = max(start + len(line), lo + 1)
        return max(lo, hi)


def _line_at(file: Any, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` of an open file."""
    file.seek(0)
    remaining, newlines = offset, 0
    while remaining > 0:
        chunk = file.read(min(remaining, 1 << 20))
        if not chunk:
            break
        newlines += chunk.count(b"\n")
        remaining -= len(chunk)
    return newlines + 1


def iter_batches(
    paths: Path | str | Iterable[Path | str], stats: ReadStats | None = None
) -> Iterator[DecodedLine]:
    """Every whole line of the trace files, decoded into span batches (the fast path).

    Spans are :mod:`~megatron.trace.otlp.decode` span objects:
    ``msgspec``'s when it is installed and accepts the line, otherwise the
    same objects built from the standard library's decode. Torn writes are
    skipped and recorded in ``stats``; damage raises :class:`TraceFileDamaged`.
    A consumer that reads attributes, links, events or status (decoded when
    asked for) turns the errors of :data:`DAMAGE_ERRORS` into damage of the
    line with :func:`damaged`.
    """
    for path, number, raw in iter_lines(paths, stats):
        line = decode_line(path, number, raw, stats)
        if line is not None:
            yield line


def decode_line(
    path: Path, number: int, raw: bytes, stats: ReadStats | None = None
) -> DecodedLine | None:
    """One line of :func:`iter_lines` decoded; ``None`` for a torn write (recorded)."""
    batches = decode_fast(raw)
    if batches is None:
        request = _request(path, number, raw, stats)
        if request is None:
            return None
        try:
            batches = decode_python(request)
        except DAMAGE_ERRORS as error:
            raise _other_signal(path, number, request) or damaged(path, number, error) from error
    return DecodedLine(path, number, raw, batches)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a big file is read, then as it was.

    Decoding allocates millions of small containers, and every 700 of them
    the collector would scan the young ones for cycles that decoded JSON
    never makes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def damaged(path: Path, number: int, error: BaseException) -> TraceFileDamaged:
    """The damage a decoding error of a span on ``path:number`` means."""
    return TraceFileDamaged(path, number, f"not an OTLP trace request: {error!r}")


#: The other OTLP signals' requests, by the field that holds their entries.
_OTHER_SIGNALS = {
    "resourceMetrics": ("metrics", "metrics.jsonl"),
    "resourceLogs": ("logs", "logs.jsonl"),
}


class NotSpansError(TraceFileDamaged):
    """A line that is a whole OTLP export request of another signal (metrics, logs): a
    metrics or logs file given where trace files go. Damage of the line, as any line that
    is no trace request, with a message that says what the file is."""

    def __init__(self, path: Path | str, line: int, signal: str) -> None:
        super().__init__(path, line, f"an OTLP {signal} export")
        self.signal = signal
        usual = dict(_OTHER_SIGNALS.values()).get(signal, signal)
        self.args = (
            f"{path}: line {line} is an OTLP {signal} export, not spans: this is a {signal} "
            f"file (as {usual} is); give the trace files (traces.jsonl), beside which "
            f"{usual} is read by itself",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.line, self.signal))


def _other_signal(path: Path, number: int, request: Any) -> NotSpansError | None:
    """The error for a request of another OTLP signal, or None when it is none of them."""
    if isinstance(request, dict) and "resourceSpans" not in request:
        for key, (signal, _) in _OTHER_SIGNALS.items():
            if key in request:
                return NotSpansError(path, number, signal)
    return None


def span_fields(span: Any) -> SpanFields:
    """A decoded span object's own fields (what :func:`flat_span` adds where it was read to)."""
    links = span.link_pairs() if span.has_links() else []
    return SpanFields(
        span.name,
        span.trace_id,
        span.span_id,
        span.parent_span_id or None,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        span.attribute_dict() if span.has_attributes() else {},
        links,
        span.link_attribute_dicts() if links else [],
        span.event_dicts() or [],
        span.status_code() if span.status else "UNSET",
        span.status_message() if span.status else "",
        span.kind,
    )


def flat_span(span: Any, resource: dict[str, Any], path: Path, line: int) -> SpanRecord:
    """One decoded span object as the flat :class:`SpanRecord` :func:`iter_spans` yields."""
    return span_record(span_fields(span), resource, path, line)


def iter_spans(
    paths: Path | str | Iterable[Path | str], stats: ReadStats | None = None
) -> Iterator[SpanRecord]:
    """Every span of the trace files, in file order, as a flat :class:`SpanRecord` dict.

    Keys: ``name``, ``trace_id`` (32 hex), ``span_id`` (16 hex), ``parent_id``
    (16 hex, ``None`` for a root), ``start_ns`` / ``end_ns`` (ints),
    ``attributes`` (plain dict), ``links`` (list of ``(trace_id, span_id)``),
    ``link_attributes`` (one plain dict per link), ``events`` (list of
    ``{"name", "time_ns", "attributes"}``), ``status_code`` (``"UNSET"``,
    ``"OK"`` or ``"ERROR"``), ``status_message``, ``kind`` (OTLP integer),
    ``resource`` (plain dict of the resource attributes, shared by the spans
    of one request), ``file`` (``Path``) and ``line`` (1-based).

    Torn writes are skipped and recorded in ``stats``; damage raises
    :class:`TraceFileDamaged`. (Tools that read millions of spans use
    :func:`iter_batches`, which builds no dict per span.)
    """
    for line in iter_batches(paths, stats):
        try:
            flat = [
                flat_span(span, batch.resource, line.path, line.number)
                for batch in line.batches
                for span in batch.spans
            ]
        except DAMAGE_ERRORS as error:
            raise damaged(line.path, line.number, error) from error
        yield from flat


def read_spans(path: Path | str, stats: ReadStats | None = None) -> list[SpanRecord]:
    """All spans of one file as a list (:func:`iter_spans`); for tests and small files."""
    return list(iter_spans(path, stats))


def iter_metrics(
    paths: Path | str | Iterable[Path | str], stats: ReadStats | None = None
) -> Iterator[dict[str, Any]]:
    """Every metric of the metrics files (``metrics.jsonl``), in file order.

    Yields ``{"name", "resource", "data"}`` where ``data`` is the OTLP/JSON
    metric object as written (``sum`` / ``gauge`` / ``histogram`` with its
    ``dataPoints``), because point layouts differ by kind.
    """
    for path, line, request in iter_requests(paths, stats):
        try:
            for resource_metrics in request["resourceMetrics"]:
                resource = decode_attributes(
                    (resource_metrics.get("resource") or {}).get("attributes")
                )
                for scope_metrics in resource_metrics.get("scopeMetrics", []):
                    for metric in scope_metrics.get("metrics", []):
                        yield {"name": metric["name"], "resource": resource, "data": metric}
        except (KeyError, TypeError, AttributeError) as error:
            raise TraceFileDamaged(path, line, f"not an OTLP metrics request: {error!r}") from error


def iter_logs(
    paths: Path | str | Iterable[Path | str], stats: ReadStats | None = None
) -> Iterator[dict[str, Any]]:
    """Every log record of the log files (``logs.jsonl``), in file order.

    Yields ``{"resource", "scope", "data"}``: the resource attributes as a
    plain dict, the instrumentation scope's name, and the OTLP/JSON
    ``LogRecord`` as written (``traceId``, ``spanId``, ``severityText``,
    ``body`` ...), because what a reader wants of a record varies.
    """
    for path, line, request in iter_requests(paths, stats):
        try:
            for resource_logs in request["resourceLogs"]:
                resource = decode_attributes(
                    (resource_logs.get("resource") or {}).get("attributes")
                )
                for scope_logs in resource_logs.get("scopeLogs", []):
                    scope = (scope_logs.get("scope") or {}).get("name", "")
                    for record in scope_logs.get("logRecords", []):
                        yield {"resource": resource, "scope": scope, "data": record}
        except (KeyError, TypeError, AttributeError) as error:
            raise TraceFileDamaged(path, line, f"not an OTLP logs request: {error!r}") from error
