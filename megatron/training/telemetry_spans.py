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

The names it writes (span names, attribute keys) are spelled once, in
:mod:`megatron.trace_format.semconv`, which everything reading them shares.

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
touches the OpenTelemetry API.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode
from transitions import Machine, MachineError
from transitions.core import EventData

from megatron.core.telemetry.span_groups import SpanGroup
from megatron.core.telemetry.state import is_span_group_enabled
from megatron.trace_format.semconv import (
    CONTAINER_LOAD_SPAN,
    ERROR_TYPE,
    INTERVAL_FIRST_ITERATION,
    INTERVAL_INDEX,
    INTERVAL_LAST_ITERATION,
    INTERVAL_REROOTED,
    INTERVAL_SPAN,
    IS_GOODPUT_SPAN,
    LAUNCH_SCRIPT_SPAN,
    MODEL_TYPE,
    PRE_STARTUP_SPAN,
    SHUTDOWN_REASON,
    STARTUP_SPAN,
)

__all__ = [
    "EXIT_HOOKS",
    "HOOKED_SIGNALS",
    "ExitHooks",
    "SpanPhaseError",
    "SpanPhases",
    "TelemetryLike",
    "install_exit_hooks",
]

_log = logging.getLogger(__name__)

# A save_interval <= 0 means "no checkpointing": one interval covers the loop.
# The pass counter then starts so high that it never runs out in practice.
_NEVER = sys.maxsize


class TelemetryLike(Protocol):
    """What the lifecycle needs from a telemetry handle."""

    tracer: Any
    is_exporting: bool

    def force_flush(self, timeout_ms: int = ...) -> Any: ...

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


def _is_folded(ts: Mapping[str, float | None]) -> bool:
    """Whether the launch-script window can be drawn inside the startup trace."""
    start = ts.get("launch_script_start")
    presrun = ts.get("launch_script_presrun")
    program = ts.get("program_start")
    return None not in (start, presrun, program) and start <= presrun <= program


class _Machine(Machine):
    """A ``Machine`` that leaves a model's own trigger methods in place.

    ``SpanPhases`` defines typed, documented methods named after its triggers;
    the stock machine would log a warning for each on every construction.
    The library's public ``model_override=True`` does not fit: it *replaces*
    a model's methods with raw triggers (losing ``SpanPhaseError`` and the
    signal-safe deferral of ``_fire``) and warns for every ``is_*``/``may_*``
    helper the model lacks. So this overrides a private hook, and
    ``pyproject.toml`` pins ``transitions`` to the releases it was tested on.

    It also compiles its table (:meth:`routes`): ``Event.trigger`` costs about
    5 us a call (an ``EventData``, callbacks looked up by name, a dozen log
    calls) where a reroot's SDK calls take some 20 us, for no behaviour these
    tables use. A compiled row runs the same callbacks in the same order.
    """

    def _checked_assignment(self, model: Any, name: str, func: Callable[..., Any]) -> None:
        if not hasattr(model, name):
            setattr(model, name, func)

    def routes(self, model: Any) -> dict[str, dict[str, Callable[..., None]]]:
        """Every (trigger, source state) the table lists, as one callable each.

        ``routes(model)[trigger]`` maps each state the trigger is legal in to
        what firing it there runs; a state missing from it is a trigger the
        table does not allow there. A row is compiled (see ``_compiled_route``)
        when it is a plain one: a single transition with no conditions and no
        prepare callbacks, on a machine without machine-wide callbacks, queue
        or event objects to pass. Any other row (the exit hooks' conditional
        ``sigterm``) keeps the library's own ``Event.trigger``. Compiled once:
        a transition or callback added to the machine afterwards is not seen
        (the lifecycle's table is fixed at construction).
        """
        plain_machine = not (
            self.has_queue
            or self.send_event
            or self.before_state_change
            or self.after_state_change
            or self.prepare_event
            or self.finalize_event
            or self.on_exception
            or self.on_final
        )
        table: dict[str, dict[str, Callable[..., None]]] = {}
        for trigger, event in self.events.items():
            by_state = table[trigger] = {}
            for source, rows in event.transitions.items():
                plain = (
                    plain_machine
                    and len(rows) == 1
                    and not rows[0].conditions
                    and not rows[0].prepare
                )
                if plain:
                    by_state[source] = self._compiled_route(model, event, rows[0])
                else:
                    by_state[source] = partial(event.trigger, model)
        return table

    def _compiled_route(self, model: Any, event: Any, row: Any) -> Callable[..., None]:
        """What ``Transition.execute`` runs for ``row``, resolved once: the
        transition's ``before`` callbacks, the source state's ``on_exit``, the
        state change, the destination's ``on_enter``, then ``after``; each
        called with the trigger's arguments, as with ``send_event=False``.
        Without the per-call ``EventData``, name lookups and logging."""
        stub = EventData(None, event, self, model, (), {})

        def resolve(names: list[Any]) -> tuple[Callable[..., Any], ...]:
            return tuple(self.resolve_callable(name, stub) for name in names)

        before = resolve(row.before)
        after = resolve(row.after)
        if row.dest is None:  # internal: no state change, no exit or enter
            first, dest, then = before, None, after
        else:
            first = before + resolve(self.get_state(row.source).on_exit)
            dest = self.get_state(row.dest).value
            then = resolve(self.get_state(row.dest).on_enter) + after
        if dest is None and not first and len(then) == 1:
            return then[0]  # one callback, no state change: the route is that callback
        attribute = self.model_attribute

        def route(*args: Any, **kwargs: Any) -> None:
            for callback in first:
                callback(*args, **kwargs)
            if dest is not None:
                setattr(model, attribute, dest)
            for callback in then:
                callback(*args, **kwargs)

        return route


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
    slotted object rather than on ``SpanPhases``, whose instance dict the
    ``transitions`` machine fills with trigger and ``may_*``/``is_*`` methods:
    attribute access there measured about 10 % slower per call. A ``remaining``
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
    TRANSITIONS: tuple[dict[str, Any], ...] = (
        {"trigger": "start_job", "source": "job", "dest": "startup"},
        {"trigger": "record_phase", "source": "startup", "dest": None, "after": "_emit_phase"},
        {"trigger": "start_train", "source": "startup", "dest": "train"},
        {"trigger": "reroot", "source": "train", "dest": "interval"},
        # Internal, so the one callback reads as what happens: end C(k), open
        # C(k+1). (A reflexive edge would run the same exit/enter pair, at
        # twice transitions' dispatch cost.)
        {"trigger": "reroot", "source": "interval", "dest": None, "after": "_next_interval"},
        {"trigger": "end_train", "source": "interval", "dest": "train"},
        {"trigger": "shutdown", "source": _LIVE, "dest": "shutdown"},
        {"trigger": "flush", "source": _LIVE, "dest": None, "after": "_flush_telemetry"},
    )

    def __init__(
        self,
        telemetry: TelemetryLike | None,
        save_interval: int | None = 0,
        enabled: bool | None = None,
        *,
        timeout_ms: int = 5000,
    ) -> None:
        self.telemetry = telemetry
        self.enabled = self._telemetry_enabled(telemetry) if enabled is None else bool(enabled)
        self.save_interval = save_interval or 0
        self.timeout_ms = timeout_ms
        # Only a live tracer is ever kept: with telemetry off it stays None and
        # every callback returns before touching OpenTelemetry.
        self._tracer = telemetry.tracer if self.enabled and telemetry is not None else None
        self._startup: Span | None = None
        self._startup_token: object | None = None
        self._interval: Span | None = None
        self._interval_token: object | None = None
        # The span context the next interval links to: B's, then each C's.
        self._link_to: SpanContext | None = None
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
        self.machine = _Machine(
            model=self,
            states=[dict(s) for s in self.STATES],
            transitions=[dict(t) for t in self.TRANSITIONS],
            initial="job",
            auto_transitions=False,
            name="span_phases",
        )
        # The table, compiled: trigger -> legal source state -> what firing runs.
        self._routes = self.machine.routes(self)

    @staticmethod
    def _telemetry_enabled(telemetry: TelemetryLike | None) -> bool:
        if telemetry is None or not getattr(telemetry, "is_exporting", False):
            return False
        groups = getattr(telemetry, "span_groups", None)
        if groups is not None:
            return SpanGroup.JOB in groups
        return is_span_group_enabled(SpanGroup.JOB)

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
        """Run one transition, turning a table miss into SpanPhaseError."""
        route = self._routes[trigger].get(self.state)
        if route is None:
            raise SpanPhaseError(trigger, self.state)
        self._in_transition += 1
        try:
            route(*args, **kwargs)
        except SpanPhaseError:
            raise
        except MachineError:
            raise SpanPhaseError(trigger, self.state) from None
        finally:
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
            context=otel_context.Context(),
            start_time=None if opened_at is None else _ns(opened_at),
            attributes={IS_GOODPUT_SPAN: True, MODEL_TYPE: str(model_type)},
        )
        self._link_to = self._startup.get_span_context()
        self._startup_token = otel_context.attach(otel_trace.set_span_in_context(self._startup))
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
            otel_context.detach(token)
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
                context=otel_context.Context(),
                links=None if link_to is None else (Link(link_to),),
                attributes=attributes,
            )
            self._interval_token = otel_context.attach(otel_trace.set_span_in_context(span))
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
                otel_context.detach(token)
            span.end()
        except Exception:  # noqa: BLE001 -- any exporter/SDK failure is non-fatal
            self._telemetry_failed("_finish_interval")

    @_telemetry_guard
    def _flush_telemetry(self) -> None:
        """``flush``: push finished spans out; nothing opens or closes."""
        if self._tracer is not None:
            self.telemetry.force_flush(timeout_ms=self.timeout_ms)

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
        self, name: str, start: float | None, end: float | None, parent: Span | None = None
    ) -> None:
        """A span created and ended at once, for time that elapsed before now.

        ``parent`` None makes it the root of a trace of its own. A phase whose
        start or end is unknown is skipped rather than faked.
        """
        if start is None or end is None:
            return
        context = (
            otel_trace.set_span_in_context(parent) if parent is not None else otel_context.Context()
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


def _mark_ending(span: Span, cause: BaseException | int | None) -> None:
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


#: The terminating signals the exit hooks act on (those this platform has).
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
        # The disposition each hooked signal had before the hook, by number.
        self.previous_handlers: dict[int, Any] = {}
        self.machine = _Machine(
            model=self,
            states=list(self.STATES),
            transitions=[dict(t) for t in self.TRANSITIONS],
            initial="uninstalled",
            auto_transitions=False,
            name="exit_hooks",
        )

    def attach(self, phases: SpanPhases, graceful: bool = False) -> None:
        """Make ``phases`` the lifecycle the hooks act on; install them the first time.

        Nothing happens for a lifecycle whose handle does not export, so such a
        process keeps exactly its old signal and exit behaviour. A handle that
        exports with the ``job`` group or traces off still gets the hooks: its
        metrics, logs and other spans need the same flush at a SIGTERM.
        """
        if not getattr(phases.telemetry, "is_exporting", False):
            return
        self.target = phases
        self.graceful = bool(graceful)
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
            self.sigterm(signum)
        except Exception:  # noqa: BLE001 -- the signal must still be passed on
            _log.warning("telemetry signal hook failed", exc_info=True)
        self._chain(signum, frame)

    def handle_exit(self) -> None:
        """The atexit hook: shut down whatever the latest lifecycle left open."""
        try:
            self.process_exit()
        except Exception:  # noqa: BLE001 -- interpreter exit must not be disturbed
            _log.warning("telemetry atexit hook failed", exc_info=True)

    # -- callbacks -------------------------------------------------------

    def _register(self) -> None:
        atexit.register(self.handle_exit)
        try:
            for signum in HOOKED_SIGNALS:
                previous = signal.getsignal(signum)
                if signum != signal.SIGTERM and previous in (signal.SIG_IGN, None):
                    continue  # ignored (nohup) or not Python's to replace: leave it
                self.previous_handlers[signum] = previous
                signal.signal(signum, self.handle_sigterm)
        except ValueError:  # not the main thread: atexit remains the fallback
            _log.info("signal hooks not installed: not in the main thread")

    def _flush_target(self, *_: Any) -> None:
        if self.target is not None and self.target.may_flush():
            self.target.flush()

    def _shutdown_target(self, signum: int | None = None, *_: Any) -> None:
        # "If the table still allows it": a lifecycle that already shut down is
        # left alone rather than made to raise from inside a signal handler.
        # A signal's number is the cause the trace records (None: atexit).
        if self.target is not None and self.target.may_shutdown():
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


def install_exit_hooks(phases: SpanPhases, graceful: bool = False) -> ExitHooks:
    """Point the process-wide exit hooks at ``phases`` (installing them once)."""
    EXIT_HOOKS.attach(phases, graceful=graceful)
    return EXIT_HOOKS
