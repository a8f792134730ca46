"""The hang watchdog: notice that a rank stopped making progress, and record where.

A hung job makes no progress until something kills it: PyTorch's collective
timeout (10 minutes by default for NCCL), the scheduler's time limit, or an
operator. Nothing of that reaches a trace by itself: a rank blocked in a
collective runs no Python at all, and a killed one no handler. So a thread
watches the training loop's heartbeat (:meth:`HangWatchdog.progress`, once
per finished loop pass) and, when no pass has finished for the timeout:

* prints one warning line naming the rank, the iteration in flight and the
  seconds stalled;
* writes a ``megatron.hang`` span, a child of the innermost open span (where
  the training thread stalled), carrying every thread's Python stack, the
  training thread's innermost frame, whether the rank was waiting for the
  others, and when it last made progress; with the log bridge on, the same
  as a warning log record correlated with that span;
* force-flushes telemetry at once, so the record is on disk (or sent) before
  whatever ends the job: what a rank killed while blocked has left behind.

It fires once per stall; when a pass finishes again it writes a
``megatron.hang.recovered`` span (how long the stall lasted) and re-arms. The
job keeps running either way: the watchdog only reports.

The timeout is ``MEGATRON_OTEL_HANG_TIMEOUT`` seconds; unset, it is
:data:`DEFAULT_FACTOR` times the median of the recent loop passes, and never
less than :data:`DEFAULT_FLOOR_S` (five minutes: long enough for a checkpoint
save, short enough to report before PyTorch's ten-minute collective timeout
aborts the job). ``0`` turns the watchdog off. There is no thread unless the
rank exports telemetry and the timeout is not 0.

"Waiting for the others": the training thread's innermost open span is a
communication span (the gradient all-reduce's ``megatron.grad_sync.finish``),
or its innermost Python frame is in ``torch.distributed``; without the
``communication`` span group, a frame in ``torch.autograd`` counts too,
because that is where a DDP backward waits for its all-reduce when no hook
times it. A stalled rank that was not waiting stopped in its own work: the
culprit ``megatron-trace report`` names.
"""

from __future__ import annotations

import collections
import logging
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from megatron.core.telemetry._signals import start_daemon_thread
from megatron.core.telemetry.logs import console_logger, print_lines
from megatron.trace_format.semconv import (
    HANG_FRAME,
    HANG_LAST_ITERATION,
    HANG_LAST_PROGRESS,
    HANG_RECOVERED_SPAN,
    HANG_SPAN,
    HANG_STACKS,
    HANG_STALLED_S,
    HANG_STALLED_SPAN,
    HANG_STALLED_SPAN_ID,
    HANG_TIMEOUT_S,
    HANG_WAITING,
    ITERATION,
)

__all__ = [
    "DEFAULT_FACTOR",
    "DEFAULT_FLOOR_S",
    "NO_WATCHDOG",
    "HangWatchdog",
    "Watchdog",
    "hang_watchdog",
]

DEFAULT_FLOOR_S = 300.0
DEFAULT_FACTOR = 10.0
#: Loop passes the default timeout's median is taken over.
RECENT_PASSES = 64
#: Longest stack text recorded (a few threads' stacks take a few KB).
MAX_STACKS_CHARS = 64_000
_FLUSH_TIMEOUT_MS = 5000

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Stall:
    beats: int  # the heartbeat count the stall was detected at
    last_progress_mono: float


class HangWatchdog:
    """Watches one training loop's heartbeat from a daemon thread (see the module doc).

    ``start`` (the loop begins), ``progress`` (a pass finished: the hot path,
    a clock read and a few stores), ``stop`` (the loop ended). :meth:`check`
    is one look at the heartbeat, which the thread runs every
    :meth:`check_interval` seconds; tests call it directly with a fake clock.
    """

    def __init__(
        self,
        telemetry: Any,
        timeout_s: float | None = None,
        *,
        wait_spans: frozenset[str] = frozenset(),
        autograd_waits: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        out: TextIO | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.timeout_s = timeout_s
        self.wait_spans = wait_spans
        self.autograd_waits = autograd_waits
        self._clock = clock
        self._wall_ns = wall_ns
        self._out = out
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT_PASSES)
        self._beat = clock()
        self._beats = 0
        self._next_iteration: int | None = None
        self._last_iteration: int | None = None
        self._stall: _Stall | None = None
        self._fired_at: int | None = None  # heartbeat count of the last stall reported
        self._thread_ident: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the training thread's side ------------------------------------------

    def start(self, next_iteration: int) -> None:
        """The loop starts at ``next_iteration``: arm, and start the thread."""
        self.arm(next_iteration)
        self._stop.clear()
        self._thread = start_daemon_thread(self._run, "megatron-telemetry-hang-watchdog")

    def arm(self, next_iteration: int) -> None:
        """Watch the calling thread from now on (``start`` without the thread)."""
        self._thread_ident = threading.get_ident()
        self._next_iteration = next_iteration
        self._beat = self._clock()

    def progress(self, finished_iteration: int) -> None:
        """A loop pass finished ``finished_iteration`` (its save and evaluation included)."""
        now = self._clock()
        self._recent.append(now - self._beat)
        self._beat = now
        self._last_iteration = finished_iteration
        self._next_iteration = finished_iteration + 1
        self._beats += 1
        if self._stall is not None:
            self._resumed(now)

    def stop(self) -> None:
        """The loop ended (or is unwinding): stop the thread."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    @contextmanager
    def watching(self, next_iteration: int) -> Iterator[HangWatchdog]:
        self.start(next_iteration)
        try:
            yield self
        finally:
            self.stop()

    # -- the watchdog thread's side --------------------------------------------

    def current_timeout(self) -> float:
        """The timeout in force: the configured one, else the derived default."""
        if self.timeout_s is not None:
            return self.timeout_s
        try:
            recent = tuple(self._recent)
        except RuntimeError:  # appended to meanwhile: take the floor this once
            recent = ()
        if not recent:
            return DEFAULT_FLOOR_S
        return max(DEFAULT_FLOOR_S, DEFAULT_FACTOR * statistics.median(recent))

    def check_interval(self) -> float:
        """How often the thread looks: a quarter of the timeout, at most 1 s."""
        return min(1.0, max(0.01, self.current_timeout() / 4))

    def check(self) -> bool:
        """Look at the heartbeat once; report a new stall. Returns whether it fired."""
        if getattr(self.telemetry, "is_shut_down", False):
            return False
        with self._lock:
            beats, beat = self._beats, self._beat
            if self._fired_at == beats:
                return False  # this stall was reported; wait for progress
            stalled = self._clock() - beat
            timeout = self.current_timeout()
            if stalled < timeout:
                return False
            self._fired_at = beats
            # Decided under the lock, so a recovery (progress() takes it too)
            # is always reported, and always stamped later than the stall.
            self._stall = _Stall(beats, beat)
            now_ns = self._wall_ns()
        try:
            self._report(stalled, timeout, now_ns)
        except Exception:  # noqa: BLE001 -- a watchdog must never hurt the job
            _log.warning("hang watchdog could not record the stall", exc_info=True)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval()):
            try:
                self.check()
            except Exception:  # noqa: BLE001 -- keep watching
                _log.warning("hang watchdog check failed", exc_info=True)

    # -- records -------------------------------------------------------------------

    def _report(self, stalled: float, timeout: float, now_ns: int) -> None:
        last_progress_ns = now_ns - round(stalled * 1e9)
        frames = sys._current_frames()
        frame = frames.get(self._thread_ident) if self._thread_ident is not None else None
        where = _frame_text(frame)
        innermost = self._innermost_open_span()
        span_name = getattr(innermost, "name", None) or ""
        waiting = self._is_waiting(span_name, frame)
        rank = getattr(self.telemetry, "rank", "?")
        iteration = self._next_iteration
        attributes: dict[str, Any] = {
            HANG_STALLED_S: round(stalled, 3),
            HANG_TIMEOUT_S: round(timeout, 3),
            HANG_LAST_PROGRESS: last_progress_ns,
            HANG_STALLED_SPAN: span_name,
            HANG_FRAME: where,
            HANG_WAITING: waiting,
            HANG_STACKS: _all_stacks(frames, self._thread_ident),
        }
        if iteration is not None:
            attributes[ITERATION] = iteration
        if self._last_iteration is not None:
            attributes[HANG_LAST_ITERATION] = self._last_iteration
        if innermost is not None:
            attributes[HANG_STALLED_SPAN_ID] = f"{innermost.get_span_context().span_id:016x}"
        line = (
            f"telemetry: rank {rank} stalled: no iteration finished for {stalled:.1f} s "
            f"(hang timeout {timeout:g} s); iteration {iteration} in flight"
            f"{f' in {span_name}' if span_name else ''} at {where}"
            f"{', waiting for other ranks' if waiting else ''}; "
            f"every thread's stack is in the {HANG_SPAN} span"
        )
        print_lines(line, self._out or sys.stderr)
        self._emit(HANG_SPAN, innermost, now_ns, attributes, line)
        self.telemetry.force_flush(timeout_ms=_FLUSH_TIMEOUT_MS)

    def _resumed(self, now: float) -> None:
        """Called by ``progress`` after a reported stall: say so, re-arm."""
        with self._lock:
            stall, self._stall = self._stall, None
        if stall is None:
            return
        try:
            stalled = now - stall.last_progress_mono
            rank = getattr(self.telemetry, "rank", "?")
            line = (
                f"telemetry: rank {rank} progressing again: iteration {self._last_iteration} "
                f"finished after {stalled:.1f} s without progress"
            )
            print_lines(line, self._out or sys.stderr)
            attributes = {HANG_STALLED_S: round(stalled, 3), ITERATION: self._last_iteration}
            parent = otel_trace.get_current_span()
            self._emit(HANG_RECOVERED_SPAN, parent, self._wall_ns(), attributes, None)
        except Exception:  # noqa: BLE001 -- a watchdog must never hurt the job
            _log.warning("hang watchdog could not record the recovery", exc_info=True)

    def _emit(
        self, name: str, parent: Any, at_ns: int, attributes: dict[str, Any], line: str | None
    ) -> Any:
        """A span at ``at_ns`` under ``parent``, and with a ``line`` its log record too."""
        tracer = self.telemetry.tracer
        context = (
            otel_trace.set_span_in_context(parent) if parent is not None else otel_context.Context()
        )
        span = tracer.start_span(name, context=context, start_time=at_ns, attributes=attributes)
        span.end(end_time=at_ns)
        if line is not None:
            token = otel_context.attach(otel_trace.set_span_in_context(span))
            try:
                # The console logger is silent unless the log bridge is installed,
                # so the line above is not printed twice.
                console_logger().warning(line, extra=attributes)
            finally:
                otel_context.detach(token)
        return span

    def _innermost_open_span(self) -> Any:
        finder = getattr(self.telemetry, "innermost_open_span", None)
        return finder() if finder is not None else None

    def _is_waiting(self, span_name: str, frame: FrameType | None) -> bool:
        if span_name in self.wait_spans:
            return True
        path = frame.f_code.co_filename.replace("\\", "/") if frame is not None else ""
        if "/torch/distributed/" in path:
            return True
        return self.autograd_waits and "/torch/autograd/" in path


def _frame_text(frame: FrameType | None) -> str:
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _all_stacks(frames: dict[int, FrameType], training_ident: int | None) -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in frames.items():
        label = names.get(ident, "?")
        if ident == training_ident:
            label += ", the training thread"
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {ident} ({label}), most recent call last:\n{stack}")
    text = "\n".join(parts)
    if len(text) > MAX_STACKS_CHARS:
        text = text[:MAX_STACKS_CHARS] + "\n... (truncated)"
    return text


class _Idle:
    """The watchdog of a run that has none: every call is a no-op."""

    __slots__ = ()

    def start(self, next_iteration: int) -> None:
        pass

    def progress(self, finished_iteration: int) -> None:
        pass

    def stop(self) -> None:
        pass

    @contextmanager
    def watching(self, next_iteration: int) -> Iterator[_Idle]:
        yield self


NO_WATCHDOG = _Idle()

#: What :func:`hang_watchdog` returns: a live watchdog or the idle one.
Watchdog = HangWatchdog | _Idle


def hang_watchdog(
    telemetry: Any,
    timeout_s: float | None,
    *,
    wait_spans: frozenset[str] = frozenset(),
    autograd_waits: bool = False,
) -> Watchdog:
    """A watchdog for this rank's loop, or :data:`NO_WATCHDOG` when there must be none.

    None when the rank does not export telemetry (nothing could be recorded)
    or the timeout is 0 (turned off). ``wait_spans``: open spans that mean
    "waiting for the other ranks"; ``autograd_waits``: whether a stall inside
    ``torch.autograd`` means that too (a DDP model without the timing hook).
    """
    if telemetry is None or not getattr(telemetry, "is_exporting", False) or timeout_s == 0:
        return NO_WATCHDOG
    return HangWatchdog(telemetry, timeout_s, wait_spans=wait_spans, autograd_waits=autograd_waits)
