"""The job-level OpenTelemetry span lifecycle of ``pretrain()``, as a state machine.

An incarnation of a training job emits several separate traces, never one
run-long root span (which a SIGKILL would lose whole):

* ``pre_startup``: from the Slurm job's start to the launch script's first
  line, backdated, when both are known;
* ``megatron.startup``: launch, imports, model build, data, checkpoint load,
  up to the training loop;
* ``megatron.train``: one trace per checkpoint interval, each linked to the one
  before it (the first to ``megatron.startup``), so a SIGKILL loses at most the
  interval in flight; without checkpoints, one for the whole loop.

No span covers the whole run: the run's envelope is Slurm's own accounting, and
the run identity every span carries on its resource attributes (``run_uuid``,
``slurm.sluid``, ``nvrx.cycle``) ties the traces together.

Each state of :class:`SpanPhases` owns the spans open while it is current:
entering ``startup`` opens ``megatron.startup``, leaving it ends it; entering
``interval`` opens a ``megatron.train``, leaving it ends it. What may happen in
which order is the transition table, :attr:`SpanPhases.TRANSITIONS`. A trigger
the table does not list for the current state changes nothing: it raises
:class:`SpanPhaseError` where the caller asked for strictness (the tests), and
is logged once otherwise, so telemetry never ends a training run.

Every span is ended before the telemetry handle is shut down, or it would have
nowhere left to be exported to.

``transitions`` comes with the ``otel`` extra, beside nemo-lens, and Megatron-LM
sets telemetry up only where both are installed (``global_vars._set_telemetry``):
without it there is no telemetry, as without nemo-lens. The module still imports,
and a lifecycle does nothing. OpenTelemetry is imported only once telemetry is on.
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
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

try:
    from transitions import Machine, MachineError
except ImportError:  # telemetry off needs no state machine
    Machine, MachineError = None, Exception

PRE_STARTUP_SPAN = "pre_startup"
STARTUP_SPAN = "megatron.startup"
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

logger = logging.getLogger(__name__)


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
    """A callback whose telemetry failures never break training (see ``_never_fatal``)."""

    def guarded(self: SpanPhases, *args: Any) -> None:
        with self._never_fatal():
            callback(self, *args)

    guarded.__name__, guarded.__doc__ = callback.__name__, callback.__doc__
    return guarded


def _row(trigger: str, source: Any, dest: str | None = None, **callbacks: str) -> dict:
    """One row of a transition table: ``dest`` None is an internal transition (its
    callbacks run, nothing opens or closes); ``callbacks`` name methods."""
    return {"trigger": trigger, "source": source, "dest": dest, **callbacks}


def _machine(model: Any, name: str, states: Any, initial: str, rows: Any) -> Any:
    """A ``transitions`` machine driving ``model``: no event objects passed to the
    callbacks, no ``to_<state>()`` shortcuts."""
    options = {"send_event": False, "auto_transitions": False, "name": name}
    return Machine(model, list(states), initial, list(rows), **options)


class SpanPhases:
    """The span lifecycle of one ``pretrain()`` call, driven by named triggers.

    The training path fires, in the order a job lives: ``start_job``,
    ``record_phase`` for each startup phase measured before telemetry was up,
    ``start_train``, ``step`` at the top of every loop pass, ``end_train`` when
    the loop is over, and ``shutdown`` on the way out of ``pretrain()``. The
    exit paths (the atexit fallback and the SIGTERM handler of :class:`ExitHooks`)
    arrive wherever the training path happens to be, also after its own
    ``shutdown``: they fire ``flush`` and ``terminate``, whose rows are legal in
    every state. A process that outlives a ``terminate`` (its previous SIGTERM
    handler returned) trains on in ``terminated``, where every trigger records
    nothing.
    """

    _latest: ClassVar[SpanPhases | None] = None  # see current() and ExitHooks
    #: What a graceful SIGTERM's flush may take: the bound nemo-lens's handle puts on the
    #: flush its shutdown() makes.
    flush_timeout_ms = 5000

    STATES: tuple[dict[str, Any], ...] = (
        {"name": "job"},
        {"name": "startup", "on_enter": "_open_startup", "on_exit": "_close_startup"},
        {"name": "train"},
        {"name": "interval", "on_enter": "_open_interval", "on_exit": "_close_interval"},
        {"name": "ended"},
        {"name": "shutdown", "on_enter": "_shutdown_telemetry", "final": True},
        {"name": "terminated", "on_enter": "_shutdown_telemetry", "final": True},
    )

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        _row("start_job", "job", "startup"),
        _row("record_phase", "startup", after="_emit_phase"),
        # From job: train() called without pretrain().
        _row("start_train", ["job", "startup"], "train"),
        _row("reroot", "train", "interval"),
        _row("reroot", "interval", after="_next_interval"),
        # From train: the loop ran no pass (a resume with nothing left to train).
        _row("end_train", ["train", "interval"], "ended"),
        _row("shutdown", LIVE, "shutdown"),
        # The exit paths, legal wherever they arrive.
        _row("flush", LIVE, after="_flush_telemetry"),
        _row("flush", ["shutdown", "terminated"]),
        _row("terminate", LIVE, "terminated"),
        _row("terminate", ["shutdown", "terminated"]),
        # A process that outlives a terminate trains on, recording nothing.
        *(_row(trigger, "terminated") for trigger in TRAINING_TRIGGERS),
    )

    def __init__(
        self, telemetry: Any, save_interval: Any = 0, *, is_span_group_enabled=None, strict=False
    ) -> None:
        """Spans are recorded when ``telemetry`` (a handle with ``tracer``,
        ``is_exporting`` and ``shutdown()``) exports and ``is_span_group_enabled``
        (None: every group on) lets the ``job`` group. ``strict``: an order the
        table does not list raises :class:`SpanPhaseError` (else it is logged)."""
        self.telemetry, self.strict = telemetry, strict
        gate = is_span_group_enabled or (lambda group: True)
        # Whether it records spans: the handle exports and the job group is on.
        self.enabled = bool(getattr(telemetry, "is_exporting", False) and gate(JOB_GROUP))
        self._tracer = None  # None: no callback touches OpenTelemetry
        if self.enabled:
            from opentelemetry import context, trace

            self._tracer, self._otel_context, self._otel_trace = telemetry.tracer, context, trace
        # The open spans (startup and an interval are never open together), the token
        # of the one current, and the startup's context, kept for the first link.
        self._startup = self._interval = self._token = self._startup_link = None
        self._index, self._first = 0, None  # the next interval's index; the open one's first
        self._rejected: set[tuple[str, str]] = set()  # logged once each
        self._failed = False  # see _never_fatal()
        self._arm(save_interval)
        # The model the machine drives, so its generated trigger and ``is_*`` methods never
        # collide with the typed triggers below (``job`` until it has a machine).
        self._phase, self.machine = types.SimpleNamespace(state="job"), None
        if Machine is not None:
            # transitions logs each transition at INFO, lines per checkpoint interval and
            # rank in the training log: a noisy logger, kept to its warnings.
            logging.getLogger("transitions.core").setLevel(logging.WARNING)
            states = [self._bind(row, "on_enter", "on_exit") for row in self.STATES]
            rows = [self._bind(row, "after") for row in self.TRANSITIONS]
            self.machine = _machine(self._phase, "span_phases", states, "job", rows)
        SpanPhases._latest = self

    def _bind(self, row: Mapping[str, Any], *keys: str) -> dict[str, Any]:
        return {k: getattr(self, v) if k in keys else v for k, v in row.items()}

    def _arm(self, save_interval: Any) -> None:
        """Loop passes left until the next interval boundary: 1, the first pass is
        one; without checkpoints (``save_interval`` 0 or unset), no other ever is."""
        self._left, self._period = 1, save_interval if (save_interval or 0) > 0 else sys.maxsize

    @classmethod
    def current(cls, telemetry: Any = None, save_interval: Any = 0, **kwargs: Any) -> SpanPhases:
        """The lifecycle ``train()`` drives: the latest ``pretrain()``'s, while its loop
        has not started (or an exit path ended it); otherwise (``train()`` alone, or
        again) a new one, whose first interval follows the latest startup. Its
        checkpoint interval is the one ``train()`` passes, which a checkpoint's
        arguments may have changed."""
        latest = cls._latest
        if latest is None or latest.state not in ("job", "startup", "terminated"):
            link = latest and latest._startup_link
            latest = cls(telemetry, save_interval, **kwargs)
            latest._startup_link = link
        latest._arm(save_interval)
        return latest

    @property
    def state(self) -> str:
        """The current state: one of the names in :attr:`STATES`."""
        return self._phase.state

    # -- the triggers ---------------------------------------------------------

    def start_job(self, model_type: Any = None, timestamps: Mapping | None = None) -> None:
        """Emit ``pre_startup`` if due; open ``megatron.startup`` and its launch children."""
        self._fire("start_job", model_type, dict(timestamps or {}))

    def record_phase(self, name: str, start: float | None, end: float | None) -> None:
        """Record a startup phase measured before telemetry was up, under ``megatron.startup``."""
        self._fire("record_phase", name, start, end)

    def start_train(self) -> None:
        """End ``megatron.startup``; the next ``step()`` opens the first interval."""
        self._fire("start_train")

    def step(self, iteration: int | None = None) -> None:
        """Count one loop pass, at its top (``iteration``: ``train()``'s at that point,
        which its log prints as ``iteration + 1``); a pass that starts a checkpoint
        interval ends the open ``megatron.train`` and opens the next. Passes are counted,
        not iterations compared (an iteration carries a resumed run's offset), so a
        resumed run reroots at the same passes. Off a boundary: one decrement, one test."""
        self._left -= 1
        if not self._left:
            self._left = 1  # until the reroot opens an interval: the next pass is one too
            self._fire("reroot", iteration, said="step")

    def end_train(self) -> None:
        """The loop is over: end the open interval."""
        self._fire("end_train")

    def shutdown(self, cause: BaseException | None = None) -> None:
        """End what is open, innermost first, then shut telemetry down; ``cause`` (the
        exception unwinding through ``pretrain()``) is recorded on the spans this ends."""
        self._fire("shutdown", cause)

    # -- the exit paths -----------------------------------------------------

    def flush(self) -> None:
        """Force-flush the tracer provider, changing no span (a graceful SIGTERM's drain,
        which must not end the spans the drain's last iteration and checkpoint go in)."""
        self._fire("flush")

    def terminate(self, cause: int | None = None) -> None:
        """End what is open and shut telemetry down, wherever the training path is,
        recording the signal ``cause`` (None: the atexit fallback, no cause known)."""
        self._fire("terminate", cause)

    def _fire(self, trigger: str, *args: Any, said: str = "") -> None:
        if self.machine is None:
            return
        try:
            getattr(self._phase, trigger)(*args)
        except MachineError:  # a trigger the table does not list: nothing ran
            rejected = (said or trigger, self._phase.state)
            if self.strict:
                raise SpanPhaseError(*rejected) from None
            if rejected not in self._rejected:
                self._rejected.add(rejected)
                logger.error("telemetry: '%s' in state '%s' ignored", *rejected)

    @contextlib.contextmanager
    def _never_fatal(self) -> Iterator[None]:
        """Telemetry must never break training: an SDK or exporter failure in here is
        caught, the first of the lifecycle logged with its traceback, and training goes
        on. Each rank exports its own spans: a failure is logged where it happens."""
        try:
            yield
        except Exception:  # any exporter or SDK failure is non-fatal
            if not self._failed:
                self._failed = True
                logger.warning("telemetry failed; training goes on", exc_info=True)

    # -- state callbacks: where each span is opened and ended ---------------

    def _span(self, name: str, parent: Any = None, start: Any = None, **kwargs: Any) -> Any:
        """Start ``name`` under ``parent`` (None: the root of a new trace, whatever is
        current), at ``start`` (epoch seconds; else now), marked as goodput."""
        context = self._otel_context.Context()  # empty: nothing ambient is inherited
        if parent is not None:
            context = self._otel_trace.set_span_in_context(parent, context)
        time = None if start is None else int(start * 1e9)
        span = self._tracer.start_span(name, context=context, start_time=time, **kwargs)
        mark_goodput(span)
        return span

    @_guarded
    def _backdated(self, name: str, start: Any, end: Any, parent: Any = None) -> None:
        """A span for time already elapsed; one whose start or end is unknown is skipped."""
        if self._tracer is not None and start is not None and end is not None:
            self._span(name, parent, start).end(end_time=int(end * 1e9))

    def _emit_phase(self, name: str, start: Any, end: Any) -> None:
        """``record_phase``: a backdated child of ``megatron.startup`` (a root, should it
        have failed to open)."""
        self._backdated(name, start, end, self._startup)

    @_guarded
    def _open_startup(self, model_type: Any, ts: Mapping[str, float | None]) -> None:
        """Entering ``startup``: ``pre_startup`` if due, then ``megatron.startup``, the
        root of a trace of its own, current until the loop starts (model build, data,
        checkpoint load and ``train()``'s preamble nest in it).

        ``pre_startup`` covers the Slurm job's start to the launch script's first
        line (the tail of the queue, prolog scripts, node setup): a coarse stand-in
        where no out-of-band Slurm accounting reconstructs that window. It ends where
        the NVRx agent's ``nvrx.cold_start`` begins, so the two tile; a restart
        cohort has no ``slurm_job_start_time`` (pretrain_hybrid.py leaves it out), so
        none is emitted there.

        The launch window (launch script to interpreter) is folded into
        ``megatron.startup``, which then opens at the launch script's start, only
        when its three times are known and in order: the plain-srun path. Under
        NVRx the agent's spans describe that window, and pretrain_hybrid.py leaves
        ``launch_script_presrun`` out.
        """
        if self._tracer is None:
            return
        slurm, launch = ts.get("slurm_job_start_time"), ts.get("launch_script_start")
        presrun, program = ts.get("launch_script_presrun"), ts.get("program_start")
        if slurm is not None and launch is not None and slurm < launch:
            self._backdated(PRE_STARTUP_SPAN, slurm, launch)
        folded = None not in (launch, presrun, program) and launch <= presrun <= program
        span = self._startup = self._span(STARTUP_SPAN, None, launch if folded else program)
        with self._never_fatal():  # a failing attribute costs the attribute alone
            if span.is_recording():
                span.set_attribute(MODEL_TYPE, str(model_type))
        with self._never_fatal():  # kept after it ends, for the first interval's link
            self._startup_link = span.get_span_context()
        # Current until the loop starts: model build, data, checkpoint load nest in it.
        self._token = self._otel_context.attach(self._otel_trace.set_span_in_context(span))
        if folded:
            self._backdated("megatron.startup.launch_script", launch, presrun, span)
            self._backdated("megatron.startup.container_load", presrun, program, span)

    def _close_startup(self, cause: Any = None) -> None:
        """Leaving ``startup``: end ``megatron.startup``, recording a ``cause`` (the start
        failed)."""
        span, self._startup = self._startup, None
        self._end(span, cause)

    def _open_interval(self, iteration: int | None = None) -> None:
        """Entering ``interval``: the loop's first ``megatron.train``."""
        self._open(None, iteration)

    def _next_interval(self, iteration: int | None = None) -> None:
        """``reroot`` inside ``interval``: end this interval, open the next, linked to it."""
        previous = self._interval
        self._finish(iteration, rerooted=True)
        self._open(previous, iteration)

    def _open(self, previous: Any, iteration: int | None) -> None:
        """A ``megatron.train`` in a new trace, made current, linked to the ``previous``
        interval (none: the loop's first, linked to ``megatron.startup``), with its
        index and first ``iteration`` (when known); a link that fails is left out, and
        an interval that fails to open leaves the loop without one until the next."""
        self._left, self._first = self._period, iteration
        if self._tracer is None:
            return
        links = []
        with self._never_fatal():
            linked = self._startup_link if previous is None else previous.get_span_context()
            links = [] if linked is None else [self._otel_trace.Link(linked)]
        attributes = {INTERVAL_INDEX: self._index}
        if iteration is not None:
            attributes[INTERVAL_FIRST_ITERATION] = iteration
        with self._never_fatal():
            span = self._interval = self._span(INTERVAL_SPAN, links=links, attributes=attributes)
            self._token = self._otel_context.attach(self._otel_trace.set_span_in_context(span))

    def _close_interval(self, cause: Any = None) -> None:
        """Leaving ``interval`` (``end_train``, ``shutdown``, ``terminate``)."""
        self._finish(None, rerooted=False, cause=cause)

    def _finish(self, iteration: int | None, rerooted: bool, cause: Any = None) -> None:
        """End the open ``megatron.train``, recording whether a reroot ended it and the
        last iteration it covered: on a boundary, the one before ``iteration``; else its
        first plus the passes counted since (the pass in flight when a fault ends it)."""
        span, self._interval = self._interval, None
        passes, self._index = self._period - self._left, self._index + 1
        if span is None:
            return
        with self._never_fatal():  # a failure here still ends the span, below
            span.set_attribute(INTERVAL_REROOTED, rerooted)
            if self._first is not None:
                last = iteration - 1 if iteration is not None else self._first + passes
                span.set_attribute(INTERVAL_LAST_ITERATION, last)
        self._end(span, cause)

    def _end(self, span: Any, cause: Any = None) -> None:
        """Detach ``span``'s context, record why the run ends on it (``cause``), and end
        it; each may fail once the exporter is gone, and no failure stops the others nor
        breaks training."""
        if span is None:
            return
        with self._never_fatal():
            self._otel_context.detach(self._token)
        with self._never_fatal():
            self._record_ending(span, cause)
        with self._never_fatal():
            span.end()

    def _record_ending(self, span: Any, cause: Any) -> None:
        """The reason, ``error.type``, ERROR status and, for an exception, OpenTelemetry's
        ``exception`` event (with its traceback); nothing for a clean end."""
        if (ending := self.ending(cause)) is None:
            return
        description = f"ended by {ending[1]}"
        if isinstance(cause, BaseException):
            span.record_exception(cause)
            description = f"{type(cause).__name__}: {cause}"[:200]  # the event has it all
        span.set_status(self._otel_trace.Status(self._otel_trace.StatusCode.ERROR, description))
        span.set_attributes({SHUTDOWN_REASON: ending[0], ERROR_TYPE: ending[1]})

    def ending(self, cause: BaseException | int | None) -> tuple[str, str] | None:
        """How ``cause`` ends the run: (``megatron.shutdown.reason``, ``error.type``).

        None for a clean end; ``exception`` and the class's qualified name for an
        exception; ``signal`` and the signal's name for a signal number.
        """
        if isinstance(cause, BaseException):
            kind = type(cause)
            module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
            return "exception", module + kind.__qualname__
        if cause is None:
            return None
        try:
            return "signal", signal.Signals(cause).name
        except ValueError:  # a number this platform gives no name
            return "signal", f"signal {cause}"

    @_guarded
    def _flush_telemetry(self) -> None:
        """``flush``: push finished spans out through the tracer provider nemo-lens
        installs, whatever span groups are on (metrics, logs and other spans too), within
        :attr:`flush_timeout_ms`: the drain that follows must save a checkpoint before
        the scheduler's SIGKILL."""
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if hasattr(provider, "force_flush"):
            provider.force_flush(timeout_millis=self.flush_timeout_ms)

    @_guarded
    def _shutdown_telemetry(self, *_: Any) -> None:
        """Entering ``shutdown`` or ``terminated`` (both final, so this runs once per
        lifecycle): the exit callbacks ended every span; shut the handle down."""
        if self.telemetry is not None:
            self.telemetry.shutdown()


class ExitHooks:
    """The process-wide atexit fallback and SIGTERM handler, as a machine of their own.

    ``atexit`` does not run when a signal ends the process, and schedulers stop a
    job with SIGTERM, then SIGKILL: without the SIGTERM handler the open spans of
    the runs that matter most would never be exported. Both exist only for that,
    so they are installed only for a lifecycle whose handle exports (with
    telemetry off the process keeps its signal behaviour exactly: a Python
    SIGTERM handler changes how system calls are interrupted and joins the
    launcher's handler chain), once per process, and act on the latest lifecycle.

    The first SIGTERM flushes (graceful, under ``--exit-signal-handler``: the
    trainer finishes its iteration, saves and shuts down itself) or terminates the
    lifecycle (hard: every span ended and exported); either way the signal
    is then passed on to the previous handler or, where that was the default
    action, raised again so the process still dies of it. A later SIGTERM is only
    passed on.

    A signal that lands while the main thread runs telemetry code (a transition of
    the lifecycle among it) is not acted on there (see :class:`_Redelivery`): it
    comes back once that code is left, at most ``give_up_s`` later.
    """

    #: Where the main thread may hold a lock the exit path needs: the OpenTelemetry
    #: SDK's (a span's, a metric instrument's), the telemetry library's (nemo-lens's span
    #: processors), Megatron-LM's telemetry base layer and this module.
    TELEMETRY_PACKAGES: tuple[str, ...] = (
        "opentelemetry",
        "nemo.lens",
        "megatron.core.telemetry",
        __name__,
    )

    process: ClassVar[ExitHooks | None] = None  # the process's (install_exit_hooks())
    SIGNALS: tuple[int, ...] = (signal.SIGTERM,)  # the signals hooked
    STATES: tuple[str, ...] = ("uninstalled", "installed", "signalled")

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        _row("install", "uninstalled", "installed", after="_register"),
        _row("install", ["installed", "signalled"]),
        _row("sigterm", "installed", "signalled", conditions="graceful", after="_flush_target"),
        _row("sigterm", "installed", "signalled", after="_terminate_target"),
        _row("sigterm", "signalled"),
        _row("process_exit", ["installed", "signalled"], after="_terminate_target"),
    )

    def __init__(self) -> None:
        self.graceful, self.previous_handlers = False, {}  # each hooked signal's, by number
        self.redelivery = _Redelivery(self.handle_sigterm)
        self.machine = _machine(self, "exit_hooks", self.STATES, "uninstalled", self.TRANSITIONS)

    def attach(self, phases: SpanPhases, graceful: bool = False) -> None:
        """Install the hooks the first time a lifecycle's telemetry exports (``graceful``:
        a SIGTERM only flushes, as that installation says); they act on the latest."""
        if getattr(phases.telemetry, "is_exporting", False):
            if self.state == "uninstalled":
                self.graceful = bool(graceful)
            self.install()

    def handle_sigterm(self, signum: int, frame: Any) -> None:
        """The handler of the hooked signals: act once the main thread is out of
        telemetry code, then pass the signal on. A main thread stuck in there past
        the bound only passes it on: acting there could wait for a lock it holds."""
        inside = in_packages(frame, self.TELEMETRY_PACKAGES)
        if self.redelivery.later(signum, inside):
            return
        if not inside:
            with contextlib.suppress(Exception):  # telemetry must never break training
                self.sigterm(signum)
        previous = self.previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:  # die of it, as without the hook
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _register(self) -> None:
        atexit.register(self.process_exit)  # the fallback: end and export what is open
        with contextlib.suppress(ValueError, OSError):  # not the main thread: atexit remains
            for signum in self.SIGNALS:
                self.previous_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, self.handle_sigterm)

    def _flush_target(self, *_: Any) -> None:
        SpanPhases._latest.flush()

    def _terminate_target(self, signum: int | None = None, *_: Any) -> None:
        SpanPhases._latest.terminate(signum)


def in_packages(frame: Any, packages: tuple[str, ...]) -> bool:
    """Whether ``frame`` runs inside ``packages``' code: walking out from it, past the
    standard library and any other library they call (an exporter's gRPC or HTTP
    client, ``transitions``), a frame of theirs comes before one of the program's
    (Megatron-LM's own, or ``__main__``). A function a telemetry decorator wraps runs
    outside: its own frame comes first."""
    prefixes = tuple(f"{package}." for package in packages)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module in packages or module.startswith(prefixes):
            return True
        if module == "__main__" or module.partition(".")[0] == "megatron":
            return False
        frame = frame.f_back
    return False


class _Redelivery:
    """Hands a signal back to the main thread a moment later, while it runs telemetry code.

    CPython runs a signal handler on the main thread between two bytecodes, also in
    the middle of telemetry code that holds a lock: a span processor's around its
    bookkeeping, the SDK's around a metric measurement. The exit path needs those
    locks (ending a span runs the processors), and the thread holding one cannot wait
    for it: the process would hang for good. So the handler returns at once, and a
    helper thread sends the signal to the main thread again every ``every_s`` until a
    handler acts on it. After ``give_up_s`` the main thread is stuck there, and the
    handler gives up (the helper's last signal comes after the bound, then it stops).
    """

    def __init__(self, handler: Callable[[int, Any], None], every_s=0.002, give_up_s=5.0) -> None:
        self.handler, self.every_s, self.give_up_s = handler, every_s, give_up_s
        self.send = getattr(signal, "pthread_kill", None)  # to one thread (None: not here)
        self.thread: threading.Thread | None = None  # the latest helper
        self._pending: dict[int, tuple[float, threading.Event]] = {}  # by signal: since, acted

    def later(self, signum: int, inside: bool) -> bool:
        """Whether ``signum``'s handler returns now, to run again later (``inside``: the
        signal landed in telemetry code). False ends the signal's wait: the handler acts."""
        since, acted = self._pending.get(signum, (time.monotonic(), None))
        if inside and self.send and time.monotonic() - since < self.give_up_s:
            if acted is None:
                acted = threading.Event()
                self._pending[signum] = since, acted
                args = (signum, threading.main_thread().ident, since, acted)
                self.thread = threading.Thread(target=self._resend, args=args, daemon=True)
                self.thread.start()
            return True
        if acted is not None:
            acted.set()
            del self._pending[signum]
        return False

    def _resend(self, signum: int, main: int, since: float, acted: threading.Event) -> None:
        # Signals sent to the process go to the main thread, not here. Stops once acted
        # on, once another handler replaced this one, or after one past the bound.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        while not acted.wait(self.every_s) and signal.getsignal(signum) == self.handler:
            self.send(main, signum)
            if time.monotonic() - since > self.give_up_s:
                return


def install_exit_hooks(phases: SpanPhases, graceful: bool = False) -> ExitHooks | None:
    """The process's exit hooks (none without ``transitions``), attached to ``phases``."""
    if Machine is not None:
        ExitHooks.process = ExitHooks.process or ExitHooks()
        ExitHooks.process.attach(phases, graceful)
    return ExitHooks.process
