"""The job-level OpenTelemetry span lifecycle of ``pretrain()``, as a state machine.

An incarnation of a training job emits several separate traces, never one
run-long root span (which a SIGKILL would lose whole):

* ``pre_startup``: the time the job sat in the scheduler queue, backdated, only
  when it is known;
* ``megatron.startup``: launch, imports, model build, data, checkpoint load, up
  to the first training step;
* ``megatron.train``: one trace per checkpoint interval, each linked to the one
  before it (the first to ``megatron.startup``), so a SIGKILL loses at most the
  interval in flight.

Each state of :class:`SpanPhases` owns the spans open while it is current:
entering ``startup`` opens ``megatron.startup``, leaving it ends it; entering
``interval`` opens a ``megatron.train``, leaving it ends it. What may happen in
which order is the transition table, :attr:`SpanPhases.TRANSITIONS`. Two kinds
of caller fire triggers:

* the training path (``pretrain()`` and ``train()``) is held to the table: a
  double close or an out-of-order step is a trigger the table does not list for
  the current state, and raises :class:`SpanPhaseError`;
* the exit paths (the atexit fallback and the SIGTERM handler of
  :class:`ExitHooks`) arrive wherever the training path happens to be, also
  after its own ``shutdown``: they fire ``flush`` and ``terminate``, whose rows
  are legal in every state, and never raise. They act between two transitions
  and outside telemetry code, whose locks the exit path needs. A process that
  outlives a ``terminate`` (its previous SIGTERM handler returned) trains on in
  ``terminated``, where every trigger records nothing.

With telemetry off (no handle, a handle that does not export, or the ``job``
span group off) the machine still runs and still rejects illegal orders, but
no callback touches OpenTelemetry.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from transitions import Machine, MachineError

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

#: The span group whose spans this module opens.
JOB_GROUP = "job"

#: The states in which the training path still drives the lifecycle.
LIVE = ("job", "startup", "train", "interval", "ended")
#: The training path's triggers (``step()`` fires ``reroot`` on a boundary).
TRAINING_TRIGGERS = ("start_job", "record_phase", "start_train", "reroot", "end_train", "shutdown")

_log = logging.getLogger(__name__)


def _drop_own_chatter(record: logging.LogRecord) -> bool:
    """``transitions`` logs every transition at INFO, prefixed by its machine's name:
    a line per checkpoint interval in the training log. Only this module's are dropped."""
    args = record.args if isinstance(record.args, tuple) else ()
    own = bool(args) and str(args[0]).startswith(("span_phases: ", "exit_hooks: "))
    return record.levelno >= logging.WARNING or not own


logging.getLogger("transitions.core").addFilter(_drop_own_chatter)


class SpanPhaseError(MachineError):
    """A trigger the transition table does not allow in the current state."""

    def __init__(self, trigger: str, state: str) -> None:
        super().__init__(f"Can't trigger '{trigger}' in state '{state}'")
        self.trigger, self.state = trigger, state


def mark_goodput(span: Any) -> None:
    """Mark a span opened by hand (a checkpoint save, say) as goodput; never raises."""
    with contextlib.suppress(Exception):  # telemetry must never break training (nor None)
        span.set_attribute(IS_GOODPUT_SPAN, True)


def _guarded(callback: Callable) -> Callable:
    """Telemetry must never break training: an SDK failure is logged once, not raised."""

    def guarded(self: SpanPhases, *args: Any, **kwargs: Any) -> None:
        try:
            callback(self, *args, **kwargs)
        except Exception:  # noqa: BLE001 -- any exporter or SDK failure is non-fatal
            self._failures += 1
            if self._failures == 1:
                _log.warning(
                    "telemetry %s failed; training goes on", callback.__name__, exc_info=True
                )

    guarded.__name__, guarded.__doc__ = callback.__name__, callback.__doc__
    return guarded


class _Phase:
    """The model the machine drives, so its generated trigger, ``is_*`` and
    ``may_*`` methods never collide with the typed triggers of SpanPhases."""

    state: str


class SpanPhases:
    """The span lifecycle of one ``pretrain()`` call, driven by named triggers.

    The training path fires, in the order a job lives: ``start_job``,
    ``record_phase`` for each startup phase measured before telemetry was up,
    ``start_train``, ``step`` at the top of every loop pass, ``end_train`` when
    the loop is over, and ``shutdown`` on the way out of ``pretrain()``.
    """

    _latest: ClassVar[SpanPhases | None] = None  # the latest pretrain()'s (see current())
    timeout_ms = 5000  # what a flush or the handle's shutdown may take

    STATES: tuple[dict[str, Any], ...] = (
        {"name": "job"},
        {"name": "startup", "on_enter": "_open_startup", "on_exit": "_close_startup"},
        {"name": "train"},
        {"name": "interval", "on_enter": "_open_interval", "on_exit": "_finish_interval"},
        {"name": "ended"},
        {"name": "shutdown", "on_enter": "_shutdown_telemetry", "final": True},
        {"name": "terminated", "on_enter": "_shutdown_telemetry", "final": True},
    )

    # A trigger not listed for the current state raises SpanPhaseError.
    # ``dest: None`` is an internal transition: callbacks run, nothing opens or closes.
    TRANSITIONS: tuple[dict[str, Any], ...] = (
        # The training path.
        {"trigger": "start_job", "source": "job", "dest": "startup"},
        {"trigger": "record_phase", "source": "startup", "dest": None, "after": "_emit_phase"},
        {"trigger": "start_train", "source": "startup", "dest": "train"},
        {"trigger": "reroot", "source": "train", "dest": "interval"},
        {"trigger": "reroot", "source": "interval", "dest": None, "after": "_next_interval"},
        # From train: the loop ran no pass (a resume with nothing left to train).
        {"trigger": "end_train", "source": ["train", "interval"], "dest": "ended"},
        {"trigger": "shutdown", "source": LIVE, "dest": "shutdown"},
        # The exit paths, legal wherever they arrive.
        {"trigger": "flush", "source": LIVE, "dest": None, "after": "_flush_telemetry"},
        {"trigger": "flush", "source": ["shutdown", "terminated"], "dest": None},
        {"trigger": "terminate", "source": LIVE, "dest": "terminated"},
        {"trigger": "terminate", "source": ["shutdown", "terminated"], "dest": None},
        # A process that outlives a terminate trains on, recording nothing.
        *({"trigger": t, "source": "terminated", "dest": None} for t in TRAINING_TRIGGERS),
    )

    def __init__(
        self, telemetry: Any, save_interval: int | None = 0, *, is_span_group_enabled: Any = None
    ) -> None:
        """Spans are recorded when ``telemetry`` (a handle with ``tracer``,
        ``is_exporting``, ``shutdown(timeout_ms=)`` and optionally
        ``force_flush(timeout_ms=)``) exports and ``is_span_group_enabled`` (the
        gate the call sites use; None: every group on) lets the ``job`` group."""
        self.telemetry = telemetry
        gate = is_span_group_enabled or (lambda group: True)
        self.enabled = bool(getattr(telemetry, "is_exporting", False) and gate(JOB_GROUP))
        # With telemetry off the tracer stays None and no callback imports OpenTelemetry.
        self._tracer = telemetry.tracer if self.enabled else None
        if self._tracer is not None:
            from opentelemetry import context, trace

            self._otel_context, self._otel_trace = context, trace
        self._startup = self._interval = self._token = self._link_to = self._first = None
        self._index = self._failures = self._in_transition = 0
        self._deferred: list[Callable[[], None]] = []  # see between_transitions()
        # Loop passes left until the next interval boundary; 1: the next pass is one.
        # A save_interval <= 0 means no checkpoints: one interval covers the loop.
        self._left, self._period = 1, save_interval if (save_interval or 0) > 0 else sys.maxsize
        states = [self._bind(row, "on_enter", "on_exit") for row in self.STATES]
        rows = [self._bind(row, "after") for row in self.TRANSITIONS]
        self._phase = _Phase()
        # Positional: no event objects for the callbacks, no auto transitions (to_<state>()).
        self.machine = Machine(self._phase, states, "job", rows, False, False, name="span_phases")
        SpanPhases._latest = self

    def _bind(self, row: Mapping[str, Any], *keys: str) -> dict[str, Any]:
        return {k: getattr(self, v) if k in keys else v for k, v in row.items()}

    @classmethod
    def current(cls) -> SpanPhases:
        """The lifecycle ``train()`` drives: the latest ``pretrain()``'s, awaiting its loop.

        ``train()`` called without ``pretrain()`` (or again) gets a lifecycle of
        its own with telemetry off, already in ``startup``.
        """
        if cls._latest is None or cls._latest.state != "startup":
            cls(None).start_job()
        return cls._latest

    @property
    def state(self) -> str:
        """The current state: one of the names in :attr:`STATES`."""
        return self._phase.state

    # -- the training path --------------------------------------------------

    def start_job(self, model_type: Any = None, timestamps: Mapping | None = None) -> None:
        """Emit ``pre_startup`` if due; open ``megatron.startup`` and its launch children."""
        self._fire("start_job", model_type, dict(timestamps or {}))

    def record_phase(self, name: str, start: float | None, end: float | None) -> None:
        """Record a startup phase measured before telemetry was up, under ``megatron.startup``."""
        self._fire("record_phase", name, start, end)

    def start_train(self) -> None:
        """End ``megatron.startup``; the next ``step()`` opens the first interval."""
        self._fire("start_train")

    def end_train(self) -> None:
        """The loop is over: end the open interval."""
        self._fire("end_train")

    def shutdown(self, cause: BaseException | int | None = None) -> None:
        """End what is open, innermost first, then shut telemetry down; ``cause`` (the
        exception unwinding through ``pretrain()``) is recorded on the spans this ends."""
        self._fire("shutdown", cause=cause)

    # -- the exit paths -----------------------------------------------------

    def flush(self) -> None:
        """Force-flush the exporters, changing no span (a graceful SIGTERM's drain)."""
        self._fire("flush")

    def terminate(self, cause: int | None = None) -> None:
        """End what is open and shut telemetry down, recording the signal ``cause``."""
        self._fire("terminate", cause=cause)

    def between_transitions(self, work: Callable[[], None]) -> None:
        """Run ``work`` now, or right after the transition a signal handler interrupted
        (Python runs a handler between two bytecodes: one interval ended, the next not
        yet open), so an exit path always finds whole spans."""
        if self._in_transition:
            self._deferred.append(work)
        else:
            work()

    def step(self, iteration: int | None = None) -> None:
        """Count one loop pass, at its top; a pass that starts a checkpoint interval
        ends the open ``megatron.train`` and opens the next. Passes are counted, not
        iterations compared, so a resumed run (whose iterations carry the checkpoint's
        offset) reroots at the same passes. Off a boundary: one decrement, one test."""
        self._left -= 1
        if self._left:
            return
        # step() is legal where reroot is; the error names step. A boundary that did
        # not reroot leaves the next pass a boundary again.
        try:
            self._fire("reroot", iteration)
        except SpanPhaseError as err:
            raise SpanPhaseError("step", err.state) from None
        finally:
            self._left = max(self._left, 1)

    def _fire(self, trigger: str, *args: Any, **kwargs: Any) -> None:
        self._in_transition += 1
        try:
            getattr(self._phase, trigger)(*args, **kwargs)
        except MachineError:  # a trigger the table does not list: nothing ran
            raise SpanPhaseError(trigger, self._phase.state) from None
        finally:
            self._in_transition -= 1
            while self._deferred and not self._in_transition:
                self._deferred.pop(0)()

    # -- state callbacks: where each span is opened and ended ---------------

    def _span(
        self, name: str, parent: Any = None, start: float | None = None, **kwargs: Any
    ) -> Any:
        """Start a span under ``parent``; without one, the root of a new trace."""
        context = self._otel_context.Context()  # empty: nothing ambient is inherited
        if parent is not None:
            context = self._otel_trace.set_span_in_context(parent, context)
        start_time = None if start is None else int(start * 1e9)
        return self._tracer.start_span(name, context=context, start_time=start_time, **kwargs)

    def _backdated(self, name: str, start: Any, end: Any, parent: Any = None) -> None:
        """A span for time already elapsed; one whose start or end is unknown is skipped."""
        if start is not None and end is not None:
            span = self._span(name, parent, start, attributes={IS_GOODPUT_SPAN: True})
            span.end(end_time=int(end * 1e9))

    @_guarded
    def _open_startup(self, model_type: Any, timestamps: Mapping[str, float | None]) -> None:
        """Entering ``startup``: ``pre_startup`` if due, then ``megatron.startup``.

        The launch window is folded into ``megatron.startup`` (which then opens
        at the launch script's start) when its three times are known and in order.
        """
        if self._tracer is None:
            return
        ts = timestamps
        slurm, launch = ts.get("slurm_job_start_time"), ts.get("launch_script_start")
        presrun, program = ts.get("launch_script_presrun"), ts.get("program_start")
        if slurm is not None and launch is not None and slurm < launch:
            self._backdated(PRE_STARTUP_SPAN, slurm, launch)
        folded = None not in (launch, presrun, program) and launch <= presrun <= program
        attributes = {IS_GOODPUT_SPAN: True, MODEL_TYPE: str(model_type)}
        span = self._span(STARTUP_SPAN, None, launch if folded else program, attributes=attributes)
        self._startup, self._link_to = span, span.get_span_context()
        self._token = self._otel_context.attach(self._otel_trace.set_span_in_context(span))
        if folded:
            self._backdated(LAUNCH_SCRIPT_SPAN, launch, presrun, span)
            self._backdated(CONTAINER_LOAD_SPAN, presrun, program, span)

    @_guarded
    def _emit_phase(self, name: str, start: float | None, end: float | None) -> None:
        if self._tracer is not None:
            self._backdated(name, start, end, self._startup)

    @_guarded
    def _close_startup(self, *_: Any, cause: BaseException | int | None = None) -> None:
        """Leaving ``startup``: end ``megatron.startup``, whose context the first
        interval links to; a ``cause`` (the start failed) is recorded on it."""
        span, self._startup = self._startup, None
        if span is not None:
            self._otel_context.detach(self._token)
            self._mark_ending(span, cause)
            span.end()

    @_guarded
    def _open_interval(self, iteration: int | None = None) -> None:
        """Entering ``interval``: open a ``megatron.train`` in a new trace, linked to
        the interval before it (the first, to ``megatron.startup``)."""
        self._left, self._first = self._period, iteration
        if self._tracer is None:
            return
        attributes = {IS_GOODPUT_SPAN: True, INTERVAL_INDEX: self._index}
        if iteration is not None:
            attributes[INTERVAL_FIRST_ITERATION] = iteration
        links = None if self._link_to is None else (self._otel_trace.Link(self._link_to),)
        span = self._interval = self._span(INTERVAL_SPAN, links=links, attributes=attributes)
        self._token = self._otel_context.attach(self._otel_trace.set_span_in_context(span))

    def _next_interval(self, iteration: int | None = None) -> None:
        """``reroot`` inside ``interval``: end this interval, open the next."""
        self._finish_interval(iteration, rerooted=True)
        self._open_interval(iteration)

    @_guarded
    def _finish_interval(self, iteration: Any = None, cause: Any = None, rerooted=False) -> None:
        """Leaving ``interval`` (``end_train``, ``shutdown``, ``terminate``) or a
        reroot: detach and end the interval, keeping its context for the next's link.

        Its last iteration is counted, not stored: on a boundary, the one before
        the new pass; otherwise the first plus the passes counted since.
        """
        first, left = self._first, self._left
        self._left, self._index = 1, self._index + 1
        span, self._interval = self._interval, None
        if span is None:
            return
        self._otel_context.detach(self._token)
        self._link_to = span.get_span_context()
        span.set_attribute(INTERVAL_REROOTED, rerooted)
        if first is not None:
            last = iteration - 1 if iteration is not None else first + self._period - left
            span.set_attribute(INTERVAL_LAST_ITERATION, last)
        self._mark_ending(span, cause)
        span.end()

    @_guarded
    def _flush_telemetry(self) -> None:
        """``flush``: push finished spans out, through the handle's ``force_flush``
        where it has one, else the global tracer provider's (nemo-lens installs one)."""
        if self._tracer is None:
            return
        if callable(flush := getattr(self.telemetry, "force_flush", None)):
            flush(timeout_ms=self.timeout_ms)
        elif callable(flush := getattr(self._otel_trace.get_tracer_provider(), "force_flush", 0)):
            flush(timeout_millis=self.timeout_ms)

    @_guarded
    def _shutdown_telemetry(self, *_: Any, **__: Any) -> None:
        """Entering ``shutdown`` or ``terminated`` (both final, so this runs once):
        the exit callbacks ended every span; shut the handle down."""
        if self.telemetry is not None:
            self.telemetry.shutdown(timeout_ms=self.timeout_ms)

    def ending(self, cause: BaseException | int | None) -> tuple[str, str] | None:
        """How ``cause`` ends the run: (``megatron.shutdown.reason``, ``error.type``).

        None for a clean end; ``exception`` and the class's qualified name for an
        exception; ``signal`` and the signal's name for a signal number.
        """
        if isinstance(cause, BaseException):
            kind = type(cause)
            module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
            return "exception", module + kind.__qualname__
        if cause is not None:
            known = cause in signal.Signals._value2member_map_
            return "signal", signal.Signals(cause).name if known else f"signal {cause}"
        return None

    def _mark_ending(self, span: Any, cause: BaseException | int | None) -> None:
        """Record why the run ends on ``span``: the reason, ``error.type``, ERROR status
        and, for an exception, OpenTelemetry's ``exception`` event."""
        if (ending := self.ending(cause)) is None:
            return
        description = f"ended by {ending[1]}"
        if isinstance(cause, BaseException):
            span.record_exception(cause, escaped=True)
            description = f"{type(cause).__name__}: {cause}"
        span.set_status(self._otel_trace.Status(self._otel_trace.StatusCode.ERROR, description))
        span.set_attributes({SHUTDOWN_REASON: ending[0], ERROR_TYPE: ending[1]})


class ExitHooks:
    """The process-wide atexit fallback and SIGTERM handler, as a machine of their own.

    They exist only to get telemetry out of a dying process, so they are
    installed only for a lifecycle whose handle exports, once per process, and
    act on the lifecycle of the latest ``pretrain()``. The first SIGTERM
    flushes (graceful, under ``--exit-signal-handler``: the trainer drains and
    shuts down itself) or terminates the lifecycle (hard: every span ended and
    exported); either way the signal is then passed on to the previous handler
    or, where that was the default action, raised again so the process still
    dies of it. A later SIGTERM is only passed on.

    A signal that lands while the main thread runs telemetry code is not acted
    on there (see :class:`_Redelivery`): it comes back once that code is left.
    """

    #: Where the main thread may hold a lock the exit path needs: the OpenTelemetry
    #: SDK's (a span's, a metric instrument's), the telemetry base layer's (its span
    #: processors'; nemo-lens in Megatron-LM) and this module.
    TELEMETRY_PACKAGES: tuple[str, ...] = (
        "opentelemetry",
        "nemo.lens",
        "megatron.core.telemetry",
        __name__,
    )

    STATES: tuple[str, ...] = ("uninstalled", "installed", "signalled")

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        {"trigger": "install", "source": "uninstalled", "dest": "installed", "after": "_register"},
        # A later pretrain() only rebinds the lifecycle (done before firing).
        {"trigger": "install", "source": ["installed", "signalled"], "dest": None},
        {"trigger": "sigterm", "source": "installed", "dest": "signalled",
         "conditions": "graceful", "after": "_flush_target"},
        {"trigger": "sigterm", "source": "installed", "dest": "signalled",
         "after": "_terminate_target"},
        {"trigger": "sigterm", "source": "signalled", "dest": None},
        {"trigger": "process_exit", "source": ["installed", "signalled"], "dest": None,
         "after": "_terminate_target"},
    )  # fmt: skip

    def __init__(self) -> None:
        self.target: SpanPhases | None = None
        self.graceful, self.signals = False, (signal.SIGTERM,)
        self.previous_handlers: dict[int, Any] = {}  # each hooked signal's, by number
        self.redelivery = _Redelivery(self.handle_sigterm)
        self.machine = Machine(
            self, self.STATES, "uninstalled", self.TRANSITIONS, False, False, name="exit_hooks"
        )

    def attach(self, phases: SpanPhases, graceful: bool = False, signals: Any = None) -> None:
        """Act on ``phases`` from now on, installing the hooks (for ``signals``,
        default SIGTERM) the first time. A lifecycle whose handle does not export
        changes nothing: the process keeps its signal and exit behaviour."""
        if getattr(phases.telemetry, "is_exporting", False):
            self.target, self.graceful = phases, bool(graceful)
            if self.state == "uninstalled" and signals is not None:
                self.signals = tuple(signals)
            self.install()

    def handle_sigterm(self, signum: int, frame: Any) -> None:
        """The handler of the hooked signals: act outside telemetry code and between two
        transitions, then pass it on."""
        inside = in_packages(frame, self.TELEMETRY_PACKAGES)
        if self.redelivery.later(signum, inside, self.target.timeout_ms / 1000):
            return
        self.target.between_transitions(lambda: self._on_signal(signum, frame))

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.sigterm(signum)  # never raises: its rows cover every state, its callbacks are guarded
        previous = self.previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):  # die of it, as without the hook
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _register(self) -> None:
        atexit.register(self.process_exit)  # the fallback: end and export what is open
        try:
            for signum in self.signals:
                self.previous_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, self.handle_sigterm)
        except (ValueError, OSError):  # not the main thread: the atexit fallback remains
            _log.info("signal hooks not installed: not in the main thread")

    def _flush_target(self, *_: Any) -> None:
        self.target.flush()

    def _terminate_target(self, signum: int | None = None, *_: Any) -> None:
        self.target.terminate(cause=signum)


def in_packages(frame: Any, packages: tuple[str, ...]) -> bool:
    """Whether ``frame`` runs code of ``packages``, or standard-library code they called.

    The innermost frame outside the standard library decides (a ``Counter`` or a
    ``threading`` call made under a telemetry lock is still inside it), so a function
    a telemetry decorator wraps runs outside: its own frame is innermost.
    """
    prefixes = tuple(f"{package}." for package in packages)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module.partition(".")[0] not in sys.stdlib_module_names:
            return module in packages or module.startswith(prefixes)
        frame = frame.f_back
    return False


class _Redelivery:
    """Hands a signal back to the main thread a moment later, while it runs telemetry code.

    CPython runs a signal handler on the main thread between two bytecodes, also in
    the middle of telemetry code that holds a lock: a span processor's around its
    bookkeeping, the SDK's around a metric measurement. The exit path needs those
    locks (ending a span runs the processors, a flush collects the metrics), and the
    thread holding one cannot wait for it: a hard signal would hang the process for
    good, a flush on a helper thread would stall until its timeout. So the handler
    returns at once, and a helper thread sends the signal to the main thread again
    every ``every_s`` until a handler acts on it. After ``give_up_s`` the main thread
    is stuck there, not busy, and the handler acts anyway.
    """

    def __init__(self, handler: Callable[[int, Any], None], every_s: float = 0.002) -> None:
        self.handler, self.every_s = handler, every_s
        self._pending: dict[int, tuple[float, threading.Event]] = {}  # by signal: since, acted

    def later(self, signum: int, inside: bool, give_up_s: float) -> bool:
        """Whether ``signum``'s handler returns now, to run again later (``inside``: the
        signal landed in telemetry code). False ends the signal's wait: the handler acts."""
        since, acted = self._pending.get(signum, (time.monotonic(), None))
        if inside and hasattr(signal, "pthread_kill") and time.monotonic() - since < give_up_s:
            if acted is None:
                acted = threading.Event()
                self._pending[signum] = since, acted
                main = threading.main_thread().ident
                args = (signum, main, acted)
                threading.Thread(target=self._resend, args=args, daemon=True).start()
            return True
        if acted is not None:
            acted.set()
            del self._pending[signum]
        return False

    def _resend(self, signum: int, main: int, acted: threading.Event) -> None:
        # Signals sent to the process go to the main thread, not here. Stops once acted
        # on, or once another handler replaced this one.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        while not acted.wait(self.every_s) and signal.getsignal(signum) == self.handler:
            signal.pthread_kill(main, signum)


EXIT_HOOKS = ExitHooks()


def install_exit_hooks(phases: SpanPhases, graceful=False, signals: Any = None) -> ExitHooks:
    """Point the process-wide exit hooks at ``phases``, installing them once."""
    EXIT_HOOKS.attach(phases, graceful=graceful, signals=signals)
    return EXIT_HOOKS
