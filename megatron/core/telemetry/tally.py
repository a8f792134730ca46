"""A span processor that counts what this run wrote, for the end-of-run summary.

Re-reading the whole trace file at exit, every earlier incarnation
included, would cost more the longer the job ran. :class:`SpanTally` counts
as the run goes instead, so the summary costs the same after a minute or a
week: spans and traces by count, spans by name, cut-short and
ERROR spans, the torn line of a killed predecessor the sink sealed, and a
flat record (:class:`~megatron.trace_format.records.SpanRecord`, what the
reader yields) of the few structural spans the goodput line needs, a handful
per checkpoint interval. It also knows which structural spans are open
(the interval in flight), so the live goodput metrics can count a run's
accounting so far at any moment (:meth:`SpanTally.structural_snapshot`).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from megatron.core.telemetry.jsonl import JsonlFile
from megatron.trace_format.records import SpanFields, SpanRecord, span_record
from megatron.trace_format.semconv import SPAN_CUT_SHORT, STRUCTURAL_SPAN_NAMES

__all__ = ["SpanTally"]

_STATUS = {StatusCode.UNSET: "UNSET", StatusCode.OK: "OK", StatusCode.ERROR: "ERROR"}


class SpanTally(SpanProcessor):
    """Counts ended spans; keeps flat records of structural and cut-short spans."""

    def __init__(self, trace_sink: JsonlFile | None = None) -> None:
        self._trace_sink = trace_sink
        self._lock = threading.Lock()
        self.by_name: Counter[str] = Counter()
        self.trace_ids: set[int] = set()  # one per root: a few per checkpoint interval
        self.cut_short = 0
        self.errors = 0
        # The spans themselves (immutable once ended); flattened only when read,
        # so an interval's end pays an append, not a dict build.
        self._kept: list[ReadableSpan] = []
        self._open: dict[int, Span] = {}  # structural spans started, not ended: a handful

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.name in STRUCTURAL_SPAN_NAMES:
            with self._lock:
                self._open[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        cut_short = bool(attributes.get(SPAN_CUT_SHORT))
        with self._lock:
            self.by_name[span.name] += 1
            if span.parent is None:
                self.trace_ids.add(span.context.trace_id)
            if cut_short:
                self.cut_short += 1
            if span.status.status_code is StatusCode.ERROR:
                self.errors += 1
            if span.name in STRUCTURAL_SPAN_NAMES or cut_short:
                self._kept.append(span)
                self._open.pop(span.context.span_id, None)

    @property
    def kept(self) -> list[SpanRecord]:
        """The structural and cut-short spans so far, as the reader's flat records."""
        with self._lock:
            spans = list(self._kept)
        return [_flat(span) for span in spans]

    def structural_snapshot(self, since: int = 0) -> tuple[list[SpanRecord], list[SpanRecord]]:
        """``(kept[since:], open)`` at one instant, as the reader's flat records.

        ``kept`` only grows, so a caller that polls keeps what it flattened
        before and asks only for what came since. An open span's ``end_ns`` is
        0 (it has not ended; the caller decides what "so far" means).
        """
        with self._lock:
            kept = self._kept[since:]
            still_open = list(self._open.values())
        return [_flat(span) for span in kept], [_flat(span) for span in still_open]

    @property
    def span_count(self) -> int:
        return sum(self.by_name.values())

    @property
    def torn_lines_sealed(self) -> int:
        """Torn lines (a killed predecessor's) the trace file sink sealed this run."""
        return self._trace_sink.torn_lines_sealed if self._trace_sink is not None else 0

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    """A copy of the attributes; an open span's may change under the copy (then retried)."""
    for _ in range(3):
        try:
            return dict(span.attributes or {})
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return {}


def _flat(span: ReadableSpan) -> SpanRecord:
    """The span as :func:`megatron.trace.otlp.reader.iter_spans` would read it back.

    Except what the summary never looks at: no events, and no file or line.
    """
    parent = span.parent
    fields = SpanFields(
        span.name,
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
        f"{parent.span_id:016x}" if parent is not None else None,
        span.start_time or 0,
        span.end_time or 0,
        _attributes(span),
        [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links],
        [dict(link.attributes or {}) for link in span.links],
        [],
        _STATUS.get(span.status.status_code, "UNSET"),
        span.status.description or "",
        span.kind.value + 1,
    )
    return span_record(fields, dict(span.resource.attributes), None, 0)
