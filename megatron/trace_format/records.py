"""The flat span record: one span as analysis sees it, whoever built it.

Two producers make these records: the reader, from the OTLP/JSON lines on
disk (:func:`megatron.trace.otlp.reader.iter_spans`), and the tally,
from the spans this run ended (:attr:`megatron.core.telemetry.tally.SpanTally.kept`).
The trace model, ``megatron-trace`` and the tests consume them, so both
producers build them with :func:`span_record` and no consumer can tell
which one it got.

A record is a plain ``dict``, declared as a :class:`~typing.TypedDict`:
the reader builds one per span of files that hold millions, and a dict
literal is the cheapest record to build and to index (a type checker still
knows every key). Consumers index it by key, ``span["name"]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from megatron.trace_format.semconv import SPAN_CUT_SHORT, SPAN_TRUNCATED

__all__ = ["SpanEvent", "SpanFields", "SpanRecord", "is_cut_short", "span_record"]


class SpanEvent(TypedDict):
    """One span event: its name, time and attributes."""

    name: str
    time_ns: int
    attributes: dict[str, Any]


class SpanRecord(TypedDict):
    """One span, flat: ids as hex strings, times as integer ns, attributes as a plain dict."""

    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str | None  # 16 hex digits; None for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id) of each linked span
    link_attributes: list[dict[str, Any]]  # one dict per link, in the order of links
    events: list[SpanEvent]
    status_code: str  # "UNSET", "OK" or "ERROR"
    status_message: str
    kind: int | None  # the OTLP integer (1 internal ... 5 consumer)
    resource: dict[str, Any]  # the resource's attributes; shared by the spans of one request
    file: Path | None  # the file it was read from; None when not read from a file
    line: int  # 1-based line in ``file``; 0 when not read from a file


class SpanFields(NamedTuple):
    """A span's own fields, in :class:`SpanRecord`'s order: all of it but where it was read
    (``resource``, ``file``, ``line``). The one spelling of that order: the producers build
    it, the record log pickles it as a plain tuple, :func:`span_record` makes the record."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    link_attributes: list[dict[str, Any]]
    events: list[SpanEvent]
    status_code: str
    status_message: str
    kind: int | None


def span_record(
    fields: tuple[Any, ...], resource: dict[str, Any], file: Path | None, line: int
) -> SpanRecord:
    """The one place a :class:`SpanRecord` is built: ``fields`` a :class:`SpanFields` (or the
    plain tuple of one), and where it was read (a dict literal: the reader's hot path)."""
    (
        name,
        trace_id,
        span_id,
        parent_id,
        start_ns,
        end_ns,
        attributes,
        links,
        link_attributes,
        events,
        status_code,
        status_message,
        kind,
    ) = fields
    return {
        "name": name,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": parent_id,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "attributes": attributes,
        "links": links,
        "link_attributes": link_attributes,
        "events": events,
        "status_code": status_code,
        "status_message": status_message,
        "kind": kind,
        "resource": resource,
        "file": file,
        "line": line,
    }


def is_cut_short(record: SpanRecord) -> bool:
    """Whether the span was still open at telemetry shutdown (and was ended then): this
    project's ``megatron.span.cut_short``, or nemo-lens's ``nemo.span.truncated``."""
    return attributes_cut_short(record["attributes"])


def attributes_cut_short(attributes: dict[str, Any]) -> bool:
    """:func:`is_cut_short` of a span with these attributes."""
    return bool(attributes.get(SPAN_CUT_SHORT) or attributes.get(SPAN_TRUNCATED))
