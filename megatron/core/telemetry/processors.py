"""Span processors: ending what is still open, and exporting promptly.

:class:`OpenSpanTracker` exists because a run rarely ends tidily: when
SIGTERM arrives mid-iteration, the iteration's span (and its parents) are
still open, and an open span is never exported. At shutdown the tracker ends
them, marked so a reader can tell "cut short" from "finished".

:class:`RootFlushingBatchSpanProcessor` batches like the SDK's
``BatchSpanProcessor`` but also wakes its worker as soon as a *root* span
ends. The job lifecycle closes one root per checkpoint interval, so a
finished interval reaches the sink within moments instead of sitting in a
queue until the next timer tick: a SIGKILL then loses at most the interval
in flight. (The SDK's processor wakes early only when a batch is full, and
its wake-up hook is private, so this one is written out.)
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from opentelemetry import context
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_EXPORT_TIMEOUT,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Status, StatusCode

from megatron.core.telemetry._signals import start_daemon_thread
from megatron.trace_format.semconv import SPAN_CUT_SHORT

__all__ = [
    "CUT_SHORT_ATTRIBUTE",
    "BatchSettings",
    "OpenSpanTracker",
    "RootFlushingBatchSpanProcessor",
    "SpanStamp",
]

_logger = logging.getLogger(__name__)

#: Boolean attribute set (to ``True``) on spans that telemetry shutdown ended
#: because their code never did (the public name of ``semconv.SPAN_CUT_SHORT``).
CUT_SHORT_ATTRIBUTE = SPAN_CUT_SHORT

_CUT_SHORT_STATUS = "span still open at telemetry shutdown"


def _register_child_hook(instance: object, method: Callable[[object], None]) -> None:
    """Call ``method(instance)`` in forked children while ``instance`` is alive.

    Held weakly: a registered fork hook cannot be unregistered, and must not
    keep every processor of every past handle alive.
    """
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.ref(instance)

    def after_in_child() -> None:
        target = ref()
        if target is not None:
            method(target)

    os.register_at_fork(after_in_child=after_in_child)


class OpenSpanTracker(SpanProcessor):
    """Remembers started-but-not-ended spans and ends them at shutdown.

    Per span the cost is one dict insert and one dict removal. Register it
    *first* on the provider: processors are shut down in registration order,
    so the spans it ends still reach the exporting processors behind it.
    """

    def __init__(self) -> None:
        # Keyed by span id: ``on_end`` receives a ReadableSpan snapshot, not
        # the Span object ``on_start`` saw, so object identity cannot pair them.
        self._open: dict[int, Span] = {}
        _register_child_hook(self, OpenSpanTracker._forget_in_child)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._open[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        self._open.pop(span.context.span_id, None)

    @property
    def open_span_count(self) -> int:
        return len(self._open)

    def innermost(self) -> Span | None:
        """The open span that started last (the innermost of the nest), or ``None``.

        Safe to call from another thread: it reads a snapshot of the dict.
        """
        snapshot = list(self._open.values())  # atomic under the GIL
        return max(snapshot, key=lambda span: span.start_time or 0, default=None)

    def end_open_spans(self) -> int:
        """End every open span, innermost first, marked as cut short.

        Innermost first (latest start first) so children end before their
        parents, as they would have. Returns how many spans were ended.
        """
        snapshot = self._open.copy()  # atomic under the GIL
        spans = sorted(snapshot.values(), key=lambda span: span.start_time or 0, reverse=True)
        ended = 0
        for span in spans:
            try:
                if span.end_time is not None:  # ended by its owner meanwhile
                    continue
                span.set_attribute(CUT_SHORT_ATTRIBUTE, True)
                span.set_status(Status(StatusCode.ERROR, _CUT_SHORT_STATUS))
                span.end()
                ended += 1
            except Exception:
                _logger.warning("Could not end open span %r", span.name, exc_info=True)
        return ended

    def shutdown(self) -> None:
        self.end_open_spans()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def _forget_in_child(self) -> None:
        # The parent's open spans are the parent's to end and export.
        self._open = {}


class SpanStamp(SpanProcessor):
    """Sets the same attributes on every span as it starts, until they are replaced.

    For what a resource cannot say because it changes while the providers live: the
    cycle of an in-process restart, whose spans share the process's providers
    (:meth:`~megatron.core.telemetry.handle.TelemetryHandle.stamp_spans`). One
    ``set_attributes`` per span; a provider without one pays nothing.
    """

    def __init__(self, attributes: Mapping[str, object]) -> None:
        self.attributes = dict(attributes)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attributes(self.attributes)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass(frozen=True)
class BatchSettings:
    """How :class:`RootFlushingBatchSpanProcessor` batches, in the SDK's terms.

    The defaults differ from the SDK's ``BatchSpanProcessor`` in two places,
    each for a reason:

    * ``max_queue_size`` is 16384, eight times the SDK's 2048, so that a
      burst of fine-grained spans (a ``profiling`` preset, or the 10,000
      spans in flight when a SIGTERM lands, as ``sigterm_exit_s`` in the
      benchmarks measures) fits whole while the exporter falls behind: an
      OTLP backend on the network, or a loaded machine (that benchmark's
      burst once outran the JSON encoder and lost spans at 2048). Dropping
      would leave holes in exactly the traces a user is debugging. At about
      2 KB a span the bound is ~32 MB at worst.
    * ``schedule_delay_millis`` is 1000 rather than 5000: a finished
      interval is exported at once anyway (its root span wakes the worker),
      and everything else is on disk within a second.

    ``max_export_batch_size`` (512) and ``export_timeout_millis`` (30000)
    are the SDK's.
    """

    schedule_delay_millis: int = 1000
    max_queue_size: int = 16384
    max_export_batch_size: int = 512
    export_timeout_millis: int = 30000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BatchSettings:
        """The defaults, overridden by the ``OTEL_BSP_*`` variables that are set.

        Read as the SDK reads them: decimal integers, milliseconds for the
        delay and the timeout. An empty variable counts as unset. A value
        that is not a positive integer is ignored with a warning naming it,
        and the default is used, as the OpenTelemetry specification asks of
        invalid settings, so a typo never stops a training job. (The SDK
        warns for a non-integer too, but raises at startup for zero,
        negatives and a batch larger than the queue.) A batch size above the
        queue size is lowered to the queue size, with a warning when the
        variable asked for it.
        """
        environ = os.environ if environ is None else environ
        defaults = cls()
        queue = _positive_int(environ, OTEL_BSP_MAX_QUEUE_SIZE, defaults.max_queue_size)
        batch = _positive_int(
            environ, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, defaults.max_export_batch_size
        )
        if batch > queue:
            if environ.get(OTEL_BSP_MAX_EXPORT_BATCH_SIZE):
                _logger.warning(
                    "%s=%d is larger than the queue (%s: %d); using %d",
                    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
                    batch,
                    OTEL_BSP_MAX_QUEUE_SIZE,
                    queue,
                    queue,
                )
            batch = queue
        return cls(
            schedule_delay_millis=_positive_int(
                environ, OTEL_BSP_SCHEDULE_DELAY, defaults.schedule_delay_millis
            ),
            max_queue_size=queue,
            max_export_batch_size=batch,
            export_timeout_millis=_positive_int(
                environ, OTEL_BSP_EXPORT_TIMEOUT, defaults.export_timeout_millis
            ),
        )


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        _logger.warning(
            "%s=%r is not a positive integer; using the default, %s", name, raw, default
        )
        return default
    return value


class RootFlushingBatchSpanProcessor(SpanProcessor):
    """A batching span processor that exports as soon as a root span ends.

    A worker thread exports when a batch is full, when ``schedule_delay_millis``
    has passed, when a root span (no parent) ends, on :meth:`force_flush` and
    at :meth:`shutdown`. ``on_end`` only appends to a deque and checks the
    parent. When the queue holds ``max_queue_size`` spans, newer spans are
    dropped (counted, logged once) rather than blocking training.

    Arguments left as ``None`` come from :meth:`BatchSettings.from_env`: the
    SDK's ``OTEL_BSP_*`` variables, else our defaults (whose reasons
    :class:`BatchSettings` gives). ``export_timeout_millis`` bounds how long
    :meth:`shutdown` waits for the last export when no timeout is passed;
    like the SDK, which reads ``OTEL_BSP_EXPORT_TIMEOUT`` but cannot pass a
    timeout to ``SpanExporter.export``, we cannot cut a running export short.

    The worker thread blocks asynchronous signals (see
    :mod:`megatron.core.telemetry._signals`), so it never takes a SIGTERM
    meant for the main thread.

    Fork behaviour: a forked child (a dataloader worker) drops its spans. The
    child gets a fresh empty queue, lock and event, never touches the
    parent's worker thread or lock state, and starts no thread; the parent's
    queued spans stay the parent's to export, so nothing is exported twice.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        schedule_delay_millis: float | None = None,
        max_queue_size: int | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: float | None = None,
    ) -> None:
        settings = BatchSettings.from_env()
        if schedule_delay_millis is None:
            schedule_delay_millis = settings.schedule_delay_millis
        if max_queue_size is None:
            max_queue_size = settings.max_queue_size
        if max_export_batch_size is None:
            max_export_batch_size = min(settings.max_export_batch_size, max_queue_size)
        if export_timeout_millis is None:
            export_timeout_millis = settings.export_timeout_millis
        # Explicit arguments are the caller's code, not a user's setting: they raise.
        if schedule_delay_millis <= 0 or export_timeout_millis <= 0:
            raise ValueError("schedule_delay_millis and export_timeout_millis must be positive")
        if max_queue_size <= 0 or max_export_batch_size <= 0:
            raise ValueError("max_queue_size and max_export_batch_size must be positive")
        if max_export_batch_size > max_queue_size:
            raise ValueError("max_export_batch_size must not exceed max_queue_size")
        self._exporter = exporter
        self._delay = schedule_delay_millis / 1000
        self._max_queue_size = max_queue_size
        self._max_export_batch_size = max_export_batch_size
        self._export_timeout_millis = export_timeout_millis
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._flush_requests: list[threading.Event] = []
        self._dropped = 0
        self._shutdown = False
        self._in_forked_child = False
        self._worker: threading.Thread | None = start_daemon_thread(
            self._run, "megatron-telemetry-span-export"
        )
        _register_child_hook(self, RootFlushingBatchSpanProcessor._drop_in_child)

    @property
    def settings(self) -> BatchSettings:
        """The settings in force (after the environment and the arguments)."""
        return BatchSettings(
            schedule_delay_millis=round(self._delay * 1000),
            max_queue_size=self._max_queue_size,
            max_export_batch_size=self._max_export_batch_size,
            export_timeout_millis=round(self._export_timeout_millis),
        )

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because the queue was full."""
        return self._dropped

    @property
    def queued_spans(self) -> int:
        """Ended spans waiting in the queue for the worker's next export."""
        return len(self._queue)

    @property
    def export_thread(self) -> threading.Thread | None:
        """The worker thread that exports; ``None`` in a forked child, which starts none.

        It is alive from construction until :meth:`shutdown` has exported the
        last batch (or its timeout has passed).
        """
        return self._worker

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._shutdown or self._in_forked_child:
            return
        if not span.context.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self._max_queue_size:
            self._dropped += 1
            if self._dropped == 1:
                _logger.warning("Span export queue full; dropping spans")
            return
        queue.append(span)
        if span.parent is None or len(queue) >= self._max_export_batch_size:
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued so far; ``False`` if not done within the timeout."""
        worker = self._worker
        if self._shutdown or worker is None or not worker.is_alive():
            return not self._queue
        done = threading.Event()
        with self._flush_lock:
            self._flush_requests.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Export what is queued, stop the worker, shut the exporter down.

        Waits at most ``timeout_millis`` (default: the export timeout) for the
        worker; an exporter stuck on an unreachable backend is then left to
        its own (daemon) thread.
        """
        if timeout_millis is None:
            timeout_millis = self._export_timeout_millis
        if self._shutdown:
            return
        self._shutdown = True
        if self._in_forked_child:
            return
        self._wake.set()
        worker = self._worker
        if worker is not None:
            worker.join(timeout_millis / 1000)
        try:
            self._exporter.shutdown()
        except Exception:
            _logger.warning("Span exporter shutdown failed", exc_info=True)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            with self._flush_lock:
                requests, self._flush_requests = self._flush_requests, []
            # Read after clearing the event: a shutdown that lands later sets
            # the event again, so the loop makes one more (final) pass.
            stopping = self._shutdown
            self._drain()
            for request in requests:
                request.set()
            if stopping:
                return

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch = []
            try:
                for _ in range(self._max_export_batch_size):
                    batch.append(queue.popleft())
            except IndexError:
                pass
            if batch:
                self._export(batch)

    def _export(self, batch: list[ReadableSpan]) -> None:
        # Suppressed so that an instrumented HTTP client inside an exporter
        # does not trace its own export calls.
        token = context.attach(context.set_value(context._SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self._exporter.export(batch)
        except Exception:
            _logger.warning("Span export failed", exc_info=True)
        finally:
            context.detach(token)

    def _drop_in_child(self) -> None:
        self._in_forked_child = True
        self._queue = collections.deque()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._flush_requests = []
        self._worker = None
