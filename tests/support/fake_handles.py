"""Telemetry handles for in-process lifecycle tests, and span-id helpers.

Nothing here replaces the OpenTelemetry SDK: the fake handle owns a real
``TracerProvider`` with a ``SimpleSpanProcessor`` over an ``InMemorySpanExporter``,
so span ids, parents, links and timestamps are the SDK's own. It never touches the
process-global tracer provider.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import pytest
from lifecycle_spec import STRUCTURAL_ROOTS, TRAIN
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class RecordingProcessor(SpanProcessor):
    """Records on_start / on_end per span id, counts ``end()`` calls (so a second
    ``end()``, which the SDK swallows with a log line, is still seen) and tracks the
    structural roots that are currently open."""

    def __init__(self) -> None:
        self.started: dict[int, str] = {}
        self.start_order: list[str] = []
        self.on_end_count: collections.Counter[int] = collections.Counter()
        self.end_calls: collections.Counter[int] = collections.Counter()
        self.open_roots: dict[int, str] = {}
        self.max_open_roots = 0
        self.end_order: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        sid = span.context.span_id
        self.started[sid] = span.name
        self.start_order.append(span.name)
        if span.name in STRUCTURAL_ROOTS and span.parent is None:
            self.open_roots[sid] = span.name
            self.max_open_roots = max(self.max_open_roots, len(self.open_roots))
        original_end = span.end
        calls = self.end_calls

        def counting_end(end_time=None):
            calls[sid] += 1
            return original_end(end_time)

        span.end = counting_end

    def on_end(self, span: ReadableSpan) -> None:
        sid = span.context.span_id
        self.on_end_count[sid] += 1
        self.end_order.append(span.name)
        self.open_roots.pop(sid, None)

    def open_spans(self) -> dict[int, str]:
        return {sid: name for sid, name in self.started.items() if self.on_end_count[sid] == 0}

    def assert_all_ended_exactly_once(self) -> None:
        assert self.open_spans() == {}, f"spans never ended: {self.open_spans()}"
        bad_on_end = {self.started[s]: c for s, c in self.on_end_count.items() if c != 1}
        assert bad_on_end == {}, f"on_end count != 1: {bad_on_end}"
        bad_calls = {self.started[s]: c for s, c in self.end_calls.items() if c != 1}
        assert bad_calls == {}, f"end() called more than once: {bad_calls}"

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class RaisingProcessor(SpanProcessor):
    """A processor whose on_end raises: an SDK/exporter failure inside span.end()."""

    def __init__(self) -> None:
        self.calls = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.calls += 1
        raise RuntimeError("exporter exploded in on_end")


class FakeHandle:
    """A real in-memory SDK pipeline with the TelemetryHandle surface."""

    def __init__(
        self,
        *,
        is_exporting: bool = True,
        span_groups: Iterable[str] | None = ("job",),
        extra_processors: Iterable[SpanProcessor] = (),
        shutdown_raises: bool = False,
        flush_raises: bool = False,
    ) -> None:
        self.exporter = InMemorySpanExporter()
        self.recorder = RecordingProcessor()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(self.recorder)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        for processor in extra_processors:
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("tests.telemetry_spans")
        self.is_exporting = is_exporting
        if span_groups is not None:
            self.span_groups = frozenset(span_groups)
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []
        self._shutdown_raises = shutdown_raises
        self._flush_raises = flush_raises

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        if self._flush_raises:
            raise RuntimeError("force_flush exploded")
        return self.provider.force_flush(timeout_millis=timeout_ms or 30000)

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)
        if self._shutdown_raises:
            raise RuntimeError("shutdown exploded")
        if len(self.shutdown_calls) == 1:
            self.provider.shutdown()

    # ---- finished-span queries -------------------------------------------------------
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected exactly one {name!r}, got {len(found)}"
        return found[0]

    def children_of(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.spans() if parent_id(s) == span_id(parent)]

    def in_trace(self, trace: int) -> list[ReadableSpan]:
        return [s for s in self.spans() if trace_id(s) == trace]

    def intervals(self) -> list[ReadableSpan]:
        return sorted(self.named(TRAIN), key=lambda s: s.attributes["megatron.interval.index"])


def span_id(span: ReadableSpan) -> int:
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    return span.context.trace_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def ref(span: ReadableSpan) -> tuple[int, int]:
    return (trace_id(span), span_id(span))


class ForbiddenTracer:
    """Every attribute access is a test failure (``pytest.fail`` raises a
    BaseException, so a callback's ``except Exception`` cannot swallow it); touches
    are also recorded in case something swallows even that."""

    def __init__(self) -> None:
        object.__setattr__(self, "touches", [])

    def __getattribute__(self, name: str):
        if name == "touches":
            return object.__getattribute__(self, name)
        object.__getattribute__(self, "touches").append(name)
        pytest.fail(f"ForbiddenTracer.{name} was accessed while telemetry is off")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "touches").append(f"set {name}")
        pytest.fail(f"ForbiddenTracer.{name} was assigned while telemetry is off")


class ForbiddenHandle:
    """A handle around a ForbiddenTracer. force_flush / shutdown are allowed and counted."""

    def __init__(self, *, is_exporting: bool, span_groups: Iterable[str] | None = ("job",)):
        self.tracer = ForbiddenTracer()
        self.is_exporting = is_exporting
        if span_groups is not None:
            self.span_groups = frozenset(span_groups)
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        return True

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)


class RaisingTracer:
    """A tracer whose every span factory raises (an SDK failure inside a callback)."""

    def __init__(self) -> None:
        self.calls = 0

    def start_span(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("tracer exploded in start_span")

    def start_as_current_span(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("tracer exploded in start_as_current_span")


class RaisingTracerHandle:
    def __init__(self) -> None:
        self.tracer = RaisingTracer()
        self.is_exporting = True
        self.span_groups = frozenset({"job"})
        self.flush_calls: list[Any] = []
        self.shutdown_calls: list[Any] = []

    def force_flush(self, timeout_ms: int | None = None) -> bool:
        self.flush_calls.append(timeout_ms)
        raise RuntimeError("force_flush exploded")

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.shutdown_calls.append(timeout_ms)
        raise RuntimeError("shutdown exploded")


# The OpenTelemetry API functions a lifecycle would need to do anything; with
# telemetry off none of them may be called.
FORBIDDEN_OTEL_API = (
    ("opentelemetry.context", "attach"),
    ("opentelemetry.context", "detach"),
    ("opentelemetry.context", "get_current"),
    ("opentelemetry.context", "Context"),
    ("opentelemetry.trace", "set_span_in_context"),
    ("opentelemetry.trace", "use_span"),
    ("opentelemetry.trace", "get_current_span"),
    ("opentelemetry.trace", "Link"),
    ("opentelemetry.trace", "get_tracer"),
)


def forbid_otel_api(monkeypatch: pytest.MonkeyPatch, module) -> list[str]:
    """Replace the OTel API entry points (in the OTel modules and wherever the module
    under test bound them by name) with recorders. Returns the list of calls made."""
    import importlib

    calls: list[str] = []

    def make(qualname: str):
        def forbidden(*args, **kwargs):
            calls.append(qualname)
            raise AssertionError(f"{qualname} called while telemetry is off")

        return forbidden

    for mod_name, attr in FORBIDDEN_OTEL_API:
        mod = importlib.import_module(mod_name)
        original = getattr(mod, attr)
        replacement = make(f"{mod_name}.{attr}")
        monkeypatch.setattr(mod, attr, replacement)
        for name, value in list(vars(module).items()):
            if value is original:
                monkeypatch.setattr(module, name, replacement)
    return calls


class RecordingProvider:
    """The global tracer provider as ``opentelemetry.trace.get_tracer_provider()`` returns
    it (nemo-lens installs the SDK's): the shared lifecycle's ``flush`` goes there."""

    def __init__(self) -> None:
        self.flushes: list[int] = []  # each flush's timeout_millis
        self.raises = False  # an exporter that fails

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushes.append(timeout_millis)
        if self.raises:
            raise RuntimeError("force_flush exploded")
        return True
