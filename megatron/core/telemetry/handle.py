"""The handle on one rank's running telemetry, and its bounded shutdown.

:class:`TelemetryHandle` owns the providers :func:`~.setup.setup_telemetry`
built. Flushing and shutting down never wait longer than asked, however
unreachable the backend: the work runs on helper threads abandoned at the
deadline (:func:`_run_bounded`), so telemetry cannot hold a job's exit up.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider

    from megatron.core.telemetry.logs import LogBridge

from megatron.core.telemetry import state
from megatron.core.telemetry._signals import start_daemon_thread
from megatron.core.telemetry.jsonl import ExportFailures
from megatron.core.telemetry.processors import OpenSpanTracker, SpanStamp
from megatron.core.telemetry.tally import SpanTally

__all__ = ["TelemetryHandle"]

_logger = logging.getLogger(__name__)


class TelemetryHandle:
    """One rank's telemetry: a tracer, a meter, and the means to stop them.

    Attributes:
        tracer: where spans are started (a no-op tracer when not exporting,
            or with traces off).
        meter: where metrics are recorded (a no-op meter when not exporting,
            or with metrics off).
        is_exporting: whether this rank records and exports anything.
        span_groups: the span groups this handle enabled (empty when not
            exporting, or with traces off).
        trace_file: the span file of the ``jsonl`` sink, else ``None``.
        logs_file: the log-record file of the ``jsonl`` sink with the log
            bridge on, else ``None``.
        rank: the rank the handle was set up for.
        export_failures: per kind (``span``, ``metric``, ``log record``), the
            exports of the ``jsonl`` sink that failed and what they lost
            (reported at shutdown and in the summary; see
            :meth:`failure_reports`).
        tally: what this handle's spans were, counted as they ended (for
            the end-of-run summary), or ``None`` when not exporting.
    """

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        meter: metrics.Meter,
        rank: int,
        span_groups: frozenset[str] = frozenset(),
        trace_file: Path | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        tracker: OpenSpanTracker | None = None,
        logger_provider: LoggerProvider | None = None,
        log_bridge: LogBridge | None = None,
        logs_file: Path | None = None,
        export_failures: Mapping[str, ExportFailures] | None = None,
        tally: SpanTally | None = None,
    ) -> None:
        self.tracer = tracer
        self.export_failures = dict(export_failures or {})
        self.meter = meter
        self.rank = rank
        self.span_groups = frozenset(span_groups)
        self.trace_file = trace_file
        self.logs_file = logs_file
        self.is_exporting = any(
            provider is not None for provider in (tracer_provider, meter_provider, logger_provider)
        )
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracker = tracker
        self._logger_provider = logger_provider
        self._log_bridge = log_bridge
        self.tally = tally
        self._pid = os.getpid()
        # Re-entrant: a SIGTERM handler may call shutdown() while the main
        # thread is inside it; the nested call then sees the flag and returns.
        self._lock = threading.RLock()
        self._is_shut_down = False
        self._stamp: SpanStamp | None = None

    def __repr__(self) -> str:
        return (
            f"TelemetryHandle(rank={self.rank}, is_exporting={self.is_exporting}, "
            f"span_groups={sorted(self.span_groups)}, trace_file={self.trace_file})"
        )

    @property
    def is_shut_down(self) -> bool:
        """Whether :meth:`shutdown` has begun (the heartbeat then reads 0)."""
        return self._is_shut_down

    def innermost_open_span(self) -> Any:
        """The most recently started span that has not ended yet, or ``None``.

        What the hang watchdog names as "where it stalled". ``None`` with
        traces off, when not exporting, or when nothing is open.
        """
        tracker = self._tracker
        return tracker.innermost() if tracker is not None else None

    def stamp_spans(self, attributes: Mapping[str, Any]) -> None:
        """Set ``attributes`` on every span started from now on (replacing what an
        earlier call set): the spans' own say of what the resource cannot, since it is
        fixed while the providers live (the cycle of an in-process restart). Nothing
        when not exporting or with traces off; never raises."""
        provider = self._tracer_provider
        if provider is None or not self._owns_pipeline():
            return
        try:
            if self._stamp is None:
                self._stamp = SpanStamp(attributes)
                provider.add_span_processor(self._stamp)
            else:
                self._stamp.attributes = dict(attributes)
        except Exception:
            _logger.warning("Could not stamp the spans with %s", dict(attributes), exc_info=True)

    def _owns_pipeline(self) -> bool:
        # A forked child inherits the handle but not the right to export:
        # its parent flushes and shuts down the shared sinks.
        return self.is_exporting and os.getpid() == self._pid

    def _providers(self) -> dict[str, Any]:
        providers = {
            "span": self._tracer_provider,
            "metric": self._meter_provider,
            "log": self._logger_provider,
        }
        return {name: provider for name, provider in providers.items() if provider is not None}

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Export everything recorded so far; ``False`` if that took too long.

        Bounded by ``timeout_ms`` even when the backend does not answer: the
        work runs on a helper thread that is abandoned at the deadline.
        """
        if not self._owns_pipeline() or self._is_shut_down:
            return True
        return _run_bounded(
            {
                f"{name}-flush": lambda provider=provider: provider.force_flush(timeout_ms)
                for name, provider in self._providers().items()
            },
            timeout_ms / 1000,
        )

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """End open spans, flush, and shut both providers down, at most once.

        Spans still open are ended first, marked with
        :data:`~megatron.core.telemetry.processors.CUT_SHORT_ATTRIBUTE`, so
        they are exported too. Returns within about ``timeout_ms`` however
        unreachable the backend is, and returns whether everything finished
        in time. If this handle is still the active one, the process-wide
        span groups are switched off. A second call does nothing.
        """
        with self._lock:
            if self._is_shut_down or not self._owns_pipeline():
                return True
            self._is_shut_down = True
        state._deactivate(self)
        atexit.unregister(self._shutdown_at_exit)
        if self._log_bridge is not None:
            # Records logged from here on go only where they went before.
            self._log_bridge.remove()
        tracer_provider, meter_provider = self._tracer_provider, self._meter_provider
        logger_provider, tracker = self._logger_provider, self._tracker
        deadline = time.monotonic() + timeout_ms / 1000

        def remaining_ms() -> int:
            return max(0, int((deadline - time.monotonic()) * 1000))

        spans_ended = threading.Event()
        if tracer_provider is None:
            spans_ended.set()

        def stop_tracing() -> None:
            # End, then flush, then shut down: the ended spans must be in the
            # queue before the final flush drains it.
            try:
                tracker.end_open_spans()
            finally:
                spans_ended.set()
            tracer_provider.force_flush(remaining_ms())
            tracer_provider.shutdown()

        def stop_metrics() -> None:
            # Shutting a periodic reader down collects and exports once more;
            # after the open spans were ended, so the live goodput figures of
            # that last export count them as a reader of the file will.
            spans_ended.wait(remaining_ms() / 1000)
            meter_provider.shutdown(timeout_millis=remaining_ms())

        tasks: dict[str, Callable[[], Any]] = {}
        if tracer_provider is not None:
            tasks["span-shutdown"] = stop_tracing
        if meter_provider is not None:
            tasks["metric-shutdown"] = stop_metrics
        if logger_provider is not None:
            # Flushes the queued records, then stops the batch thread.
            tasks["log-shutdown"] = logger_provider.shutdown
        finished = _run_bounded(tasks, timeout_ms / 1000)
        # Let go of the pipeline; a thread stuck on a dead backend keeps only
        # what it needs alive.
        self._tracer_provider = self._meter_provider = self._tracker = None
        self._logger_provider = self._log_bridge = None
        for report in self.failure_reports():
            _logger.warning("Telemetry: %s", report)
        return finished

    def failure_reports(self) -> list[str]:
        """One line per kind of ``jsonl`` export that failed; empty when none did."""
        return [report for f in self.export_failures.values() if (report := f.report())]

    def _shutdown_at_exit(self) -> None:
        self.shutdown()


def _run_bounded(tasks: Mapping[str, Callable[[], Any]], timeout_s: float) -> bool:
    """Run ``tasks`` concurrently on daemon threads; wait at most ``timeout_s``.

    Returns ``True`` if all finished in time. A task still running at the
    deadline is abandoned (its thread is a daemon and cannot hold up exit).
    During interpreter shutdown, when new threads may be refused, tasks run
    inline instead.
    """
    deadline = time.monotonic() + timeout_s
    threads = []
    for name, task in tasks.items():

        def target(task: Callable[[], Any] = task, name: str = name) -> None:
            try:
                task()
            except Exception:
                _logger.warning("Telemetry %s failed", name, exc_info=True)

        try:
            thread = start_daemon_thread(target, f"megatron-telemetry-{name}")
        except RuntimeError:
            target()
            continue
        threads.append((name, thread))
    finished = True
    for name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            finished = False
            _logger.warning(
                "Telemetry %s did not finish within %.1f s; continuing without it",
                name,
                timeout_s,
            )
    return finished
