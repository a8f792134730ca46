"""The job-level OpenTelemetry span lifecycle of one ``pretrain()`` call.

Everything a newcomer needs to answer "where is this span opened, where is it
closed, and why" is in this file. An incarnation of a training job emits
several separate traces, never one run-long root span:

* trace A, ``pre_startup``: the time the job sat in the scheduler queue
  (backdated, only when it is known);
* trace B, ``megatron.startup``: launch, imports, model build, data, checkpoint
  load, up to the first training step;
* traces C0..Cn, ``megatron.train``: one per checkpoint interval, each linked to
  the one before it (C0 to B), so a SIGKILL loses at most the interval in flight.

The names it writes (span names, attribute keys) are constants of this module:
it is the one file that opens these spans, and it is the same file in this
project and in Megatron-LM (``python -m megatron.training.port_upstream``
copies it there), so it imports only the standard library, ``transitions``
and, once telemetry is on, OpenTelemetry. A test holds the constants equal to
the reader's vocabulary (``megatron.trace``'s semconv).

The lifecycle is an explicit state machine on the ``transitions`` library.
Each state owns exactly the spans that are open while it is current: entering
``startup`` opens B and leaving it closes B; entering ``interval`` opens a C and
leaving it closes that C. A double close or an out-of-order reroot is therefore
impossible by construction: it is a trigger the table does not list, and it
raises :class:`SpanPhaseError` instead of being absorbed by a boolean flag.

The second, tiny machine, :class:`ExitHooks`, models the process-wide atexit
and SIGTERM hooks, which must exist at most once per process and act on the
lifecycle of the most recent ``pretrain()``.

Telemetry off (no handle, a handle that is not exporting, or the ``job`` span
group off): the machine still runs and still rejects illegal orders, so the
call-site ordering in ``training.py`` is checked in every run, but no callback
touches (or imports) the OpenTelemetry API.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, ClassVar, Protocol

from transitions import Machine, MachineError

__all__ = [
    "EXIT_HOOKS",
    "HOOKED_SIGNALS",
    "ExitHooks",
    "SpanPhaseError",
    "SpanPhases",
    "TelemetryLike",
    "install_exit_hooks",
    "mark_goodput",
]

# The names this module writes. It is the one file that opens these spans, and
# it lives in two trees (this project and Megatron-LM), so it spells them
# itself; a test holds them equal to the reader's vocabulary
# (``megatron.trace``'s semconv), so the two spellings cannot drift.
PRE_STARTUP_SPAN = "pre_startup"
STARTUP_SPAN = "megatron.startup"
LAUNCH_SCRIPT_SPAN = "megatron.startup.launch_script"
CONTAINER_LOAD_SPAN = "megatron.startup.container_load"
INTERVAL_SPAN = "megatron.train"
IS_GOODPUT_SPAN = "is_goodput_span"
MODEL_TYPE = "megatron.model_type"
INTERVAL_INDEX = "megatron.interval.index"
INTERVAL_FIRST_ITERATION = "megatron.interval.first_iteration"
INTERVAL_LAST_ITERATION = "megatron.interval.last_iteration"
INTERVAL_REROOTED = "megatron.interval.rerooted"
SHUTDOWN_REASON = "megatron.shutdown.reason"
ERROR_TYPE = "error.type"

#: The span group whose spans this module opens (Megatron-LM's name).
JOB_GROUP = "job"

_log = logging.getLogger(__name__)

# A save_interval <= 0 means "no checkpointing": one interval covers the loop.
# The pass counter then starts so high that it never runs out in practice.
_NEVER = sys.maxsize


class TelemetryLike(Protocol):
    """What the lifecycle needs from a telemetry handle."""

    tracer: Any
    is_exporting: bool

    # ``force_flush(timeout_ms=...)`` is used where the handle has it (see _force_flush).

    def shutdown(self, timeout_ms: int = ...) -> Any: ...


class SpanPhaseError(MachineError):
    """A trigger the transition table does not allow in the current state."""

    def __init__(self, trigger: str, state: str) -> None:
        super().__init__(f"Can't trigger '{trigger}' in state '{state}'")
        self.trigger = trigger
        self.state = state


def _ns(seconds: float) -> int:
    """Epoch seconds to the SDK's integer nanoseconds (same rounding as upstream)."""
    return int(seconds * 1e9)


def _telemetry_enabled(telemetry: TelemetryLike | None, gate: Callable[[str], bool] | None) -> bool:
    """Whether this lifecycle records spans: an exporting handle with the ``job`` group on.

    The group is asked of ``gate`` (the trainer passes the
    ``is_span_group_enabled`` its call sites use); without one, of the
    handle's own ``span_groups`` where it has them, else of nemo-lens (which
    Megatron-LM's telemetry runs on); with neither, telemetry is off.
    """
    if telemetry is None or not getattr(telemetry, "is_exporting", False):
        return False
    if gate is None:
        groups = getattr(telemetry, "span_groups", None)
        if groups is not None:
            return JOB_GROUP in groups
        try:
            from nemo.lens.state import is_span_group_enabled as gate
        except ImportError:
            return False
    return bool(gate(JOB_GROUP))


def _force_flush(telemetry: Any, timeout_ms: int) -> None:
    """Push finished spans out: the handle's ``force_flush``, else the global provider's.

    nemo-lens's handle has no ``force_flush`` of its own; it installs the
    SDK's provider globally, whose ``force_flush`` takes milliseconds.
    """
    flush = getattr(telemetry, "force_flush", None)
    if callable(flush):
        flush(timeout_ms=timeout_ms)
        return
    provider = _otel()[1].get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if callable(flush):
        flush(timeout_millis=timeout_ms)


def mark_goodput(span: Any) -> None:
    """Mark a span the caller opened by hand as a goodput boundary (never raises).

    The lifecycle marks its own spans; Megatron-LM's checkpoint and report
    spans, opened with the explicit span API, use this too.
    """
    if span is None:
        return
    with contextlib.suppress(Exception):  # telemetry must never break training
        span.set_attribute(IS_GOODPUT_SPAN, True)


def _is_folded(ts: Mapping[str, float | None]) -> bool:
    """Whether the launch-script window can be drawn inside the startup trace."""
    start = ts.get("launch_script_start")
    presrun = ts.get("launch_script_presrun")
    program = ts.get("program_start")
    return None not in (start, presrun, program) and start <= presrun <= program


# ``transitions`` logs every transition at INFO (and DEBUG) on its
# ``transitions.core`` logger, which would put a line per reroot into the
# trainer's log. Only this module's own transitions are kept quiet: a filter on
# that logger drops records below WARNING while one of them runs on the current
# thread, so other users of ``transitions`` log as before.
_QUIET = threading.local()
_TRANSITIONS_LOGGER = "transitions.core"


def _drop_own_chatter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not getattr(_QUIET, "depth", 0)


def _keep_transitions_quiet() -> None:
    logger = logging.getLogger(_TRANSITIONS_LOGGER)
    if _drop_own_chatter not in logger.filters:
        logger.addFilter(_drop_own_chatter)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    _QUIET.depth = getattr(_QUIET, "depth", 0) + 1
    try:
        yield
    finally:
        _QUIET.depth -= 1


class _Phase:
    """The model the span-phase ``Machine`` drives: it holds the state.

    ``transitions`` adds a method per trigger (and ``is_*``/``may_*``) to its
    model. Kept on this plain object, they cannot collide with the typed,
    documented trigger methods of :class:`SpanPhases`, which fire them.
    """

    state: str


def _bound(owner: Any, rows: Iterable[Mapping[str, Any]], keys: tuple[str, ...]) -> list[dict]:
    """``rows`` with each callback name in ``keys`` replaced by ``owner``'s bound method."""
    bound = []
    for row in rows:
        row = dict(row)
        for key in keys:
            name = row.get(key)
            if isinstance(name, str):
                row[key] = getattr(owner, name)
        bound.append(row)
    return bound


def _otel() -> Any:
    """OpenTelemetry's API, imported only once telemetry is on (it is optional)."""
    from opentelemetry import context, trace

    return context, trace


def _telemetry_guard(callback):
    """Telemetry must never break training: log an SDK failure, don't raise it."""

    def guarded(self, *args, **kwargs):
        try:
            callback(self, *args, **kwargs)
        except Exception:  # noqa: BLE001 -- any exporter/SDK failure is non-fatal
            self._telemetry_failed(callback.__name__)

    guarded.__name__ = callback.__name__
    guarded.__doc__ = callback.__doc__
    return guarded


class _PassCounter:
    """Loop passes left until the next reroot: the one hot path of the lifecycle.

    ``step()`` runs at the top of every training iteration, so it lives on this
    slotted object (``SpanPhases.step`` is its bound method): one decrement and
    one test, no dict lookup on a larger object. A ``remaining``
    of 1 means "the next pass is a boundary", which is also how a step() in a
    state where it is illegal reaches the table and is rejected there.
    """

    __slots__ = ("_on_boundary", "remaining")

    def __init__(self, on_boundary: Callable[[int | None], None]) -> None:
        self.remaining = 1
        self._on_boundary = on_boundary

    def step(self, iteration: int | None = None) -> None:
        """Count one loop pass; on a checkpoint-interval boundary, reroot.

        The non-boundary path is one decrement and one test for zero (the
        boundary handler never leaves ``remaining`` below 1); ``iteration`` is
        only looked at on a boundary.
        """
        self.remaining = left = self.remaining - 1
        if not left:
            self._on_boundary(iteration)


class SpanPhases:
    """The span lifecycle of one ``pretrain()`` call, driven by named transitions.

    ``training.py`` fires the triggers in the order a job lives: ``start_job``,
    ``record_phase`` for each measured startup phase, ``start_train``, ``step``
    once per loop pass, ``end_train``, and ``shutdown`` on every exit path.

    ``step(iteration=None)`` counts one loop pass and fires ``reroot`` when the
    pass starts a new checkpoint interval; it is legal exactly where ``reroot``
    is (``train`` and ``interval``).
    """

    step: Callable[[int | None], None]

    # The most recently created lifecycle (see current()): one reference, replaced
    # by each pretrain(), as the exit hooks act on the most recent one.
    _latest: ClassVar[SpanPhases | None] = None

    # Each state names the callbacks that open and close the spans it owns.
    STATES: tuple[dict[str, Any], ...] = (
        {"name": "job"},
        {"name": "startup", "on_enter": "_open_startup", "on_exit": "_close_startup"},
        {"name": "train", "on_enter": "_restart_count"},
        {"name": "interval", "on_enter": "_open_interval", "on_exit": "_close_interval"},
        {"name": "shutdown", "on_enter": "_shutdown_telemetry", "final": True},
    )

    _LIVE = ("job", "startup", "train", "interval")

    # The whole contract at a glance. A trigger not listed for the current
    # state raises SpanPhaseError. ``dest: None`` is an internal transition:
    # callbacks run, the state (and so every open span) stays as it is.
    # Every order Megatron-LM's own control flow produces is a row here, so no
    # call site needs to ask first.
    TRANSITIONS: tuple[dict[str, Any], ...] = (
        {"trigger": "start_job", "source": "job", "dest": "startup"},
        {"trigger": "record_phase", "source": "startup", "dest": None, "after": "_emit_phase"},
        {"trigger": "start_train", "source": "startup", "dest": "train"},
        {"trigger": "reroot", "source": "train", "dest": "interval"},
        # Internal, so the one callback reads as what happens: end C(k), open
        # C(k+1). (A reflexive edge would run the same exit/enter pair.)
        {"trigger": "reroot", "source": "interval", "dest": None, "after": "_next_interval"},
        {"trigger": "end_train", "source": "interval", "dest": "train"},
        # The loop ran no pass (a resume with nothing left to train): no interval to end.
        {"trigger": "end_train", "source": "train", "dest": None},
        {"trigger": "shutdown", "source": _LIVE, "dest": "shutdown"},
        {"trigger": "flush", "source": _LIVE, "dest": None, "after": "_flush_telemetry"},
        # After shutdown the process may go on: the atexit fallback reaches
        # shutdown a second time, an early exit's sys.exit() unwinds through
        # pretrain()'s own, and a SIGTERM the process ignores leaves the loop
        # (and a startup) running. Telemetry is gone, so these record nothing.
        {"trigger": "shutdown", "source": "shutdown", "dest": None},
        {"trigger": "flush", "source": "shutdown", "dest": None},
        {"trigger": "record_phase", "source": "shutdown", "dest": None},
        {"trigger": "start_train", "source": "shutdown", "dest": None},
        {"trigger": "reroot", "source": "shutdown", "dest": None},
        {"trigger": "end_train", "source": "shutdown", "dest": None},
    )

    def __init__(
        self,
        telemetry: TelemetryLike | None,
        save_interval: int | None = 0,
        enabled: bool | None = None,
        *,
        is_span_group_enabled: Callable[[str], bool] | None = None,
        timeout_ms: int = 5000,
    ) -> None:
        self.telemetry = telemetry
        if enabled is None:
            enabled = _telemetry_enabled(telemetry, is_span_group_enabled)
        self.enabled = bool(enabled)
        self.save_interval = save_interval or 0
        self.timeout_ms = timeout_ms
        # Only a live tracer is ever kept: with telemetry off it stays None and
        # every callback returns before touching (or importing) OpenTelemetry.
        self._tracer = telemetry.tracer if self.enabled and telemetry is not None else None
        self._otel_context, self._otel_trace = _otel() if self._tracer is not None else (None, None)
        self._startup: Any = None
        self._startup_token: object | None = None
        self._interval: Any = None
        self._interval_token: object | None = None
        # The span context the next interval links to: B's, then each C's.
        self._link_to: Any = None
        self._interval_index = 0
        self._first_iteration: int | None = None
        # Passes per interval, and the counter of passes left until the next
        # reroot. ``step`` is the counter's own method (see _PassCounter).
        self._period = self.save_interval if self.save_interval > 0 else _NEVER
        self._passes = _PassCounter(self._step_boundary)
        self.step = self._passes.step
        self._telemetry_failures = 0
        # Transitions running right now (a signal handler may interrupt one),
        # and work a handler asked for that must wait until they complete.
        self._in_transition = 0
        self._deferred: list[Callable[[], None]] = []
        _keep_transitions_quiet()
        SpanPhases._latest = self
        self._phase = _Phase()
        with _quiet():
            self.machine = Machine(
                model=self._phase,
                states=_bound(self, self.STATES, ("on_enter", "on_exit")),
                transitions=_bound(self, self.TRANSITIONS, ("before", "after")),
                initial="job",
                auto_transitions=False,
                name="span_phases",
            )

    @classmethod
    def current(cls) -> SpanPhases | None:
        """The lifecycle of the most recent ``pretrain()`` in this process (None before one).

        Megatron-LM's ``train()`` is a separate function from the ``pretrain()``
        that creates the lifecycle; it fires its triggers on this one.
        """
        return cls._latest

    @property
    def state(self) -> str:
        """The current state: ``job``, ``startup``, ``train``, ``interval`` or ``shutdown``."""
        return self._phase.state

    def __getattr__(self, name: str) -> Any:
        # The machine's own helpers (``is_interval()``, ``may_shutdown()``).
        if name.startswith(("is_", "may_")) and "_phase" in self.__dict__:
            return getattr(self._phase, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------
    # Triggers: typed entry points, each firing the transition of its name.
    # ------------------------------------------------------------------

    def start_job(
        self, model_type: Any = None, timestamps: Mapping[str, float | None] | None = None
    ) -> None:
        """Emit ``pre_startup`` if due, open ``megatron.startup`` and its launch children."""
        self._fire("start_job", model_type, dict(timestamps or {}))

    def record_phase(self, name: str, start: float | None, end: float | None) -> None:
        """Record an elapsed startup phase as a backdated child of ``megatron.startup``."""
        self._fire("record_phase", name, start, end)

    def start_train(self) -> None:
        """Close ``megatron.startup``; the next ``step()`` opens the first interval."""
        self._fire("start_train")

    def reroot(self) -> None:
        """Close the open interval (if any) and open the next, in a new linked trace."""
        self._fire("reroot")

    def end_train(self) -> None:
        """Close the open interval: the loop is over."""
        self._fire("end_train")

    def flush(self) -> None:
        """Force-flush the exporters without changing any span (graceful SIGTERM drain)."""
        self._fire("flush")

    def shutdown(self, cause: BaseException | int | None = None) -> None:
        """End what is open, innermost first, then shut telemetry down exactly once.

        ``cause`` says why the run is ending when it is not a clean end: the
        exception unwinding through ``pretrain()`` (a ``KeyboardInterrupt``
        for a Ctrl-C), or the number of the signal a hard-stop hook acts on.
        It is recorded on the spans this ends, so the trace says how the run
        ended (see ``_mark_ending``); None (or a clean ``SystemExit``) records
        nothing.
        """
        self._fire("shutdown", cause=cause)

    def _step_boundary(self, iteration: int | None) -> None:
        # step() is legal exactly where reroot is (train and interval), so the
        # table decides; only the trigger named in the error is step's own.
        # A boundary that did not reroot (rejected, or cut short by an exception)
        # leaves the next pass a boundary again, never a count below zero.
        try:
            self._fire("reroot", iteration)
        except SpanPhaseError as err:
            raise SpanPhaseError("step", err.state) from None
        finally:
            if self._passes.remaining < 1:
                self._passes.remaining = 1

    def _fire(self, trigger: str, *args: Any, **kwargs: Any) -> None:
        """Run one transition through ``transitions``, a table miss raising SpanPhaseError."""
        state = self._phase.state
        self._in_transition += 1
        quiet = _QUIET  # what _quiet() does, inline: this runs at every reroot
        quiet.depth = getattr(quiet, "depth", 0) + 1
        try:
            getattr(self._phase, trigger)(*args, **kwargs)
        except SpanPhaseError:
            raise
        except MachineError:
            raise SpanPhaseError(trigger, state) from None
        finally:
            quiet.depth -= 1
            self._in_transition -= 1
            if self._deferred and not self._in_transition:
                self._run_deferred()

    def _telemetry_failed(self, where: str) -> None:
        """Called from an ``except`` in a callback: log the first failure, count the rest."""
        self._telemetry_failures += 1
        if self._telemetry_failures == 1:
            _log.warning(
                "telemetry failed in %s; training continues and later failures "
                "of this lifecycle are not logged",
                where,
                exc_info=True,
            )

    def between_transitions(self, work: Callable[[], None]) -> None:
        """Run ``work`` now, or right after the transition a signal interrupted.

        Python runs a signal handler between two bytecodes of the main thread,
        which can be the middle of a transition (C(k) ended, C(k+1) not yet
        open). The exit hooks route their work through here so they only ever
        see the lifecycle between transitions, whichever thread the kernel
        delivered the signal to.
        """
        if self._in_transition:
            self._deferred.append(work)
        else:
            work()

    def _run_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()

    # ------------------------------------------------------------------
    # State callbacks: where each span is opened and closed.
    # ------------------------------------------------------------------

    @_telemetry_guard
    def _open_startup(self, model_type: Any, timestamps: Mapping[str, float | None]) -> None:
        """Entering ``startup``: traces A and B, and B's folded launch children."""
        if self._tracer is None:
            return
        slurm = timestamps.get("slurm_job_start_time")
        launch = timestamps.get("launch_script_start")
        if slurm is not None and launch is not None and slurm < launch:
            self._backdated(PRE_STARTUP_SPAN, slurm, launch)

        folded = _is_folded(timestamps)
        opened_at = timestamps.get("launch_script_start" if folded else "program_start")
        self._startup = self._tracer.start_span(
            STARTUP_SPAN,
            context=self._otel_context.Context(),
            start_time=None if opened_at is None else _ns(opened_at),
            attributes={IS_GOODPUT_SPAN: True, MODEL_TYPE: str(model_type)},
        )
        self._link_to = self._startup.get_span_context()
        self._startup_token = self._otel_context.attach(
            self._otel_trace.set_span_in_context(self._startup)
        )
        if folded:
            presrun, program = timestamps["launch_script_presrun"], timestamps["program_start"]
            self._backdated(LAUNCH_SCRIPT_SPAN, launch, presrun, self._startup)
            self._backdated(CONTAINER_LOAD_SPAN, presrun, program, self._startup)

    @_telemetry_guard
    def _emit_phase(self, name: str, start: float | None, end: float | None) -> None:
        """``record_phase``: a startup phase measured before telemetry could record it."""
        if self._tracer is not None:
            self._backdated(name, start, end, self._startup)

    @_telemetry_guard
    def _close_startup(self, *_: Any, cause: BaseException | int | None = None, **__: Any) -> None:
        """Leaving ``startup`` (``start_train`` or ``shutdown``): end B, keep its context.

        The span context outlives the span: the first interval links to it. A
        ``shutdown`` with a cause (the start failed) records it on B.
        """
        span, token = self._startup, self._startup_token
        self._startup = self._startup_token = None
        if token is not None:
            self._otel_context.detach(token)
        if span is not None:
            _mark_ending(span, cause)
            span.end()

    def _restart_count(self, *_: Any, **__: Any) -> None:
        """Entering ``train``: the next pass is a boundary and opens an interval.

        Counting passes rather than iteration numbers keeps the boundaries right
        in a resumed run, whose iteration numbers carry the checkpoint's offset.
        """
        self._passes.remaining = 1

    # The interval callbacks run at every reroot, so their telemetry guard is
    # written inline (a try costs nothing until it catches) rather than through
    # the decorator's extra call.

    def _open_interval(self, iteration: int | None = None) -> None:
        """Entering ``interval``: start counting its passes, open C(k).

        C(k) is a root in a new trace, linked to C(k-1) or, for C0, to startup.
        What is known at its start (its index, the first iteration where the
        trainer passes it) is set at its start; the rest when it ends.
        """
        self._passes.remaining = self._period
        self._first_iteration = iteration
        if self._tracer is None:
            return
        try:
            link_to = self._link_to
            attributes = {IS_GOODPUT_SPAN: True, INTERVAL_INDEX: self._interval_index}
            if iteration is not None:
                attributes[INTERVAL_FIRST_ITERATION] = iteration
            span = self._interval = self._tracer.start_span(
                INTERVAL_SPAN,
                context=self._otel_context.Context(),
                links=None if link_to is None else (self._otel_trace.Link(link_to),),
                attributes=attributes,
            )
            self._interval_token = self._otel_context.attach(
                self._otel_trace.set_span_in_context(span)
            )
        except Exception:  # noqa: BLE001 -- any exporter/SDK failure is non-fatal
            self._telemetry_failed("_open_interval")

    def _close_interval(
        self, iteration: int | None = None, cause: BaseException | int | None = None
    ) -> None:
        """Leaving ``interval`` (``end_train`` or ``shutdown``): end C(k).

        The next step() goes to the table again: after ``end_train`` it opens a
        new interval, after ``shutdown`` it is rejected. A ``shutdown`` with a
        cause records it on C(k).
        """
        self._finish_interval(iteration, False, cause)

    def _next_interval(self, iteration: int | None = None) -> None:
        """``reroot`` inside ``interval``: end C(k), open C(k+1) linked to it."""
        self._finish_interval(iteration, True, None)
        self._open_interval(iteration)

    def _finish_interval(
        self, iteration: int | None, rerooted: bool, cause: BaseException | int | None
    ) -> None:
        """Detach and end C(k), keeping its span context for C(k+1)'s link.

        The last iteration it covered comes from counts, not stores: each pass is
        one iteration. Closed by step() on a boundary, it is the one before that
        pass; otherwise the opening pass plus every pass counted since.
        """
        first = self._first_iteration
        if first is None:
            last = None
        elif iteration is not None:
            last = iteration - 1
        else:
            last = first + (self._period - self._passes.remaining)
        self._passes.remaining = 1
        self._interval_index += 1
        span, token = self._interval, self._interval_token
        if span is None:
            return
        self._interval = self._interval_token = None
        try:
            self._link_to = span.get_span_context()
            # One key at a time: set_attributes' mapping costs more than two calls.
            span.set_attribute(INTERVAL_REROOTED, rerooted)
            if last is not None:
                span.set_attribute(INTERVAL_LAST_ITERATION, last)
            if cause is not None:
                _mark_ending(span, cause)
            if token is not None:
                self._otel_context.detach(token)
            span.end()
        except Exception:  # noqa: BLE001 -- any exporter/SDK failure is non-fatal
            self._telemetry_failed("_finish_interval")

    @_telemetry_guard
    def _flush_telemetry(self) -> None:
        """``flush``: push finished spans out; nothing opens or closes."""
        if self._tracer is not None:
            _force_flush(self.telemetry, self.timeout_ms)

    @_telemetry_guard
    def _shutdown_telemetry(self, *_: Any, **__: Any) -> None:
        """Entering ``shutdown``: open spans were already ended by the exit callbacks.

        The handle is shut down here and only here; ``shutdown`` is final, so
        this runs exactly once per lifecycle.
        """
        if self.telemetry is not None:
            self.telemetry.shutdown(timeout_ms=self.timeout_ms)

    # ------------------------------------------------------------------

    def _backdated(
        self, name: str, start: float | None, end: float | None, parent: Any = None
    ) -> None:
        """A span created and ended at once, for time that elapsed before now.

        ``parent`` None makes it the root of a trace of its own. A phase whose
        start or end is unknown is skipped rather than faked.
        """
        if start is None or end is None:
            return
        context = (
            self._otel_trace.set_span_in_context(parent)
            if parent is not None
            else self._otel_context.Context()
        )
        span = self._tracer.start_span(
            name, context=context, start_time=_ns(start), attributes={IS_GOODPUT_SPAN: True}
        )
        span.end(end_time=_ns(end))


def _is_clean_exit(cause: BaseException) -> bool:
    """``sys.exit(0)`` (or a generator closing) unwinding through ``pretrain()`` is no failure."""
    if isinstance(cause, GeneratorExit):
        return True
    return isinstance(cause, SystemExit) and cause.code in (None, 0)


def _type_name(kind: type) -> str:
    """An exception class as OpenTelemetry's ``error.type`` wants it: fully qualified."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _mark_ending(span: Any, cause: BaseException | int | None) -> None:
    """Record on ``span`` why the run is ending, when it is not a clean end.

    An exception (``reason`` ``exception``; ``interrupt`` for a
    ``KeyboardInterrupt``): OpenTelemetry's ``exception`` event
    (``exception.type``, ``.message``, ``.stacktrace``), ERROR status and
    ``error.type``. A signal number (a hard SIGTERM or SIGHUP): ERROR status
    and ``error.type`` = the signal's name. Readers (``megatron-trace``) turn
    the reason into how the incarnation ended: ``failed``, ``interrupted``,
    ``cut_short``.
    """
    if cause is None:
        return
    from opentelemetry.trace import Status, StatusCode  # a span exists: telemetry is on

    if isinstance(cause, BaseException):
        if _is_clean_exit(cause):
            return
        reason = "interrupt" if isinstance(cause, KeyboardInterrupt) else "exception"
        error_type = _type_name(type(cause))
        span.record_exception(cause, escaped=True)
        span.set_status(Status(StatusCode.ERROR, f"{type(cause).__name__}: {cause}"))
    else:
        reason = "signal"
        try:
            error_type = signal.Signals(cause).name
        except ValueError:
            error_type = f"signal {cause}"
        span.set_status(Status(StatusCode.ERROR, f"ended by {error_type}"))
    span.set_attributes({SHUTDOWN_REASON: reason, ERROR_TYPE: error_type})


#: The terminating signals the exit hooks act on by default (those this platform has).
#: Megatron-LM's ``training.py`` passes ``(signal.SIGTERM,)``: the one it hooks.
HOOKED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)
)


class ExitHooks:
    """The process-wide atexit and signal hooks, as a machine of their own.

    They exist only to get telemetry out of a dying process, so they are
    installed only for a lifecycle whose telemetry is exporting, at most once
    per process, and always act on the most recently attached lifecycle.

    The ``sigterm`` trigger stands for every terminating signal hooked
    (:data:`HOOKED_SIGNALS`) and carries its number:

    * SIGTERM, and SIGHUP (a dropped ssh session): hard stop, spans ended and
      written, then the signal is passed on, so the process still dies by it.
      Graceful (flush only) when ``--exit-signal-handler`` left a Python
      handler to drain to; the trainer's handler is for SIGTERM alone.
    * SIGINT: Python's own handler raises ``KeyboardInterrupt``, which unwinds
      through the loop (the iteration in flight ends with ERROR) and through
      ``pretrain()``, which shuts down; so the hook only flushes and passes it
      on, right after the transition it may have interrupted.

    A SIGHUP or SIGINT the process ignores (``nohup``, a background job) stays
    ignored and unhooked.
    """

    STATES: tuple[str, ...] = ("uninstalled", "installed", "terminating")

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        {"trigger": "install", "source": "uninstalled", "dest": "installed", "after": "_register"},
        # Later pretrain() calls only rebind the target (done before firing).
        {"trigger": "install", "source": ["installed", "terminating"], "dest": None},
        # Graceful drain: flush, keep everything open, let the trainer finish.
        {"trigger": "sigterm", "source": "installed", "dest": None, "conditions": "graceful_drain",
         "after": "_flush_target"},
        # Hard stop: end and export everything, then let the signal do its job.
        {"trigger": "sigterm", "source": "installed", "dest": "terminating",
         "after": "_shutdown_target"},
        # A second SIGTERM while the first is being handled: never re-enter.
        {"trigger": "sigterm", "source": "terminating", "dest": None},
        {"trigger": "process_exit", "source": "installed", "dest": None,
         "after": "_shutdown_target"},
        {"trigger": "process_exit", "source": "terminating", "dest": None},
    )  # fmt: skip

    def __init__(self) -> None:
        self.target: SpanPhases | None = None
        self.graceful = False
        # The signals hooked (chosen by the first attach) and the disposition
        # each had before the hook, by number.
        self.signals: tuple[int, ...] = HOOKED_SIGNALS
        self.previous_handlers: dict[int, Any] = {}
        _keep_transitions_quiet()
        with _quiet():
            self.machine = Machine(
                model=self,
                states=list(self.STATES),
                transitions=[dict(t) for t in self.TRANSITIONS],
                initial="uninstalled",
                auto_transitions=False,
                name="exit_hooks",
            )

    def attach(
        self,
        phases: SpanPhases,
        graceful: bool = False,
        signals: Iterable[int] | None = None,
    ) -> None:
        """Make ``phases`` the lifecycle the hooks act on; install them the first time.

        Nothing happens for a lifecycle whose handle does not export, so such a
        process keeps exactly its old signal and exit behaviour. A handle that
        exports with the ``job`` group or traces off still gets the hooks: its
        metrics, logs and other spans need the same flush at a SIGTERM.
        ``signals`` (default :data:`HOOKED_SIGNALS`) are the signals hooked at
        that first installation; later calls only rebind the lifecycle.
        """
        if not getattr(phases.telemetry, "is_exporting", False):
            return
        self.target = phases
        self.graceful = bool(graceful)
        if self.state == "uninstalled" and signals is not None:
            self.signals = tuple(signals)
        with _quiet():
            self.install()

    def graceful_drain(self, signum: int = signal.SIGTERM, *_: Any) -> bool:
        """Whether the process outlives ``signum``, so a flush is all it needs.

        With the signal's default action as the previous disposition the
        process would die right after a mere flush, losing the open spans, so
        such a signal is handled as a hard one even in graceful mode. SIGINT's
        Python handler raises an exception the run unwinds from: graceful.
        """
        previous = self.previous_handlers.get(signum, signal.SIG_DFL)
        if previous in (signal.SIG_DFL, None):
            return False
        return self.graceful or signum == signal.SIGINT

    def handle_sigterm(self, signum: int, frame: Any) -> None:
        """The handler of every hooked signal: flush or shut down, then pass it on.

        Both wait until the lifecycle is between transitions, so a signal that
        interrupts a reroot still finds (and ends) a whole interval.
        """
        self.target.between_transitions(partial(self._on_sigterm, signum, frame))

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        try:
            with _quiet():
                self.sigterm(signum)
        except Exception:  # noqa: BLE001 -- the signal must still be passed on
            _log.warning("telemetry signal hook failed", exc_info=True)
        self._chain(signum, frame)

    def handle_exit(self) -> None:
        """The atexit hook: shut down whatever the latest lifecycle left open."""
        try:
            with _quiet():
                self.process_exit()
        except Exception:  # noqa: BLE001 -- interpreter exit must not be disturbed
            _log.warning("telemetry atexit hook failed", exc_info=True)

    # -- callbacks -------------------------------------------------------

    def _register(self) -> None:
        atexit.register(self.handle_exit)
        try:
            for signum in self.signals:
                previous = signal.getsignal(signum)
                if signum != signal.SIGTERM and previous in (signal.SIG_IGN, None):
                    continue  # ignored (nohup) or not Python's to replace: leave it
                self.previous_handlers[signum] = previous
                signal.signal(signum, self.handle_sigterm)
        except ValueError:  # not the main thread: atexit remains the fallback
            _log.info("signal hooks not installed: not in the main thread")

    def _flush_target(self, *_: Any) -> None:
        if self.target is not None:
            self.target.flush()

    def _shutdown_target(self, signum: int | None = None, *_: Any) -> None:
        # A lifecycle that already shut down takes this as the no-op its table
        # lists. A signal's number is the cause the trace records (None: atexit).
        if self.target is not None:
            self.target.shutdown(cause=signum)

    def _chain(self, signum: int, frame: Any) -> None:
        """Pass the signal on as if the hook had never been there."""
        previous = self.previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL or previous is None:
            # The default action of SIGTERM, SIGHUP and SIGINT is to die by the
            # signal (status -15 / 143, -1 / 129, -2 / 130).
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # SIG_IGN: the process chose to ignore it; so do we.


EXIT_HOOKS = ExitHooks()


def install_exit_hooks(
    phases: SpanPhases, graceful: bool = False, signals: Iterable[int] | None = None
) -> ExitHooks:
    """Point the process-wide exit hooks at ``phases`` (installing them once).

    ``signals``: the signals to hook, at the first installation (default
    :data:`HOOKED_SIGNALS`; Megatron-LM passes its one, ``(signal.SIGTERM,)``).
    """
    EXIT_HOOKS.attach(phases, graceful=graceful, signals=signals)
    return EXIT_HOOKS
