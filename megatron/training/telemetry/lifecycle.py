"""What this trainer adds to the shared span lifecycle (:mod:`megatron.training.telemetry_spans`).

``telemetry_spans.py`` is the module Megatron-LM carries: its ``pretrain()``
catches ``Exception`` only and hooks SIGTERM alone. This trainer also runs from
a terminal and under ``nohup``, so it needs three things more, each built on
the shared module rather than inside it:

* **How a run ended, for every exit.** ``pretrain()`` here unwinds every
  ``BaseException``: a Ctrl-C is recorded as ``megatron.shutdown.reason =
  interrupt`` (readers call that incarnation ``interrupted``), and a clean
  ``sys.exit(0)`` (or a generator closing) as no failure at all, by the same
  rule the call-site spans use (:func:`megatron.core.telemetry.helpers.is_clean_exit`).
* **SIGHUP and SIGINT beside SIGTERM.** A dropped ssh session (SIGHUP) is a
  hard stop like SIGTERM: spans ended and exported, then the process dies of
  the signal. A Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` through Python's
  own handler, which unwinds into ``pretrain()``'s shutdown, so the hook only
  flushes. A SIGHUP or SIGINT the process ignores (``nohup``, a background
  job) stays ignored and unhooked.
* **A flush of everything it exports.** A graceful signal's flush goes through
  the telemetry handle (spans, metrics and logs, within the flush's bound),
  where Megatron-LM's goes through the global tracer provider nemo-lens
  installs, which this trainer's base layer does not replace.
* **Graceful only where the process outlives the signal.** Under
  ``--exit-signal-handler`` a SIGTERM is only flushed, since the trainer's own
  handler drains and shuts down; but where the previous disposition is the
  signal's default action the process would die right after a mere flush, so
  such a signal is handled as a hard one. Each graceful signal flushes again.

Each is a row or a state of :class:`TrainerExitHooks`' own table, drawn in
``state_diagrams/`` beside the shared machines.

And a fourth, in-process restarts (``--inprocess-restart``,
:mod:`megatron.training.inprocess_restart`): NVIDIA Resiliency Extension calls
``pretrain()`` again in the same process after a fault, and telemetry, set up
once per process, must stay up across those *cycles*. So
:class:`TrainerSpanPhases` adds the state ``restarting`` to the shared table: a
cycle's way out of ``pretrain()`` with a fault NVRx restarts from (while
``--inprocess-max-iterations`` allows another cycle) ends the cycle's open spans
with the fault as their error and ``megatron.shutdown.reason =
inprocess_restart``, exports them, and leaves telemetry up for the next cycle's
lifecycle. NVRx's own finalize step fires ``restart``, the cycle's exit path: it
ends what the training path could not end itself (NVRx interrupts a rank with an
exception raised asynchronously, which may land before that path ran), and does
nothing where it did. ``terminate`` (a signal or the atexit fallback between two
cycles, or after NVRx gave up) shuts the process's telemetry down from
``restarting``. Those are rows of the table, drawn in ``state_diagrams/``.
"""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from megatron.core.telemetry.helpers import is_clean_exit, record_exception_once
from megatron.trace_format.semconv import (
    ERROR_TYPE,
    SHUTDOWN_REASON,
    SHUTDOWN_REASON_INPROCESS_RESTART,
)
from megatron.training.telemetry_spans import LIVE, ExitHooks, SpanPhases

__all__ = [
    "HOOKED_SIGNALS",
    "TRAINER_EXIT_HOOKS",
    "RestartCycle",
    "TrainerExitHooks",
    "TrainerSpanPhases",
]

#: The terminating signals the trainer's exit hooks act on (those this platform has).
HOOKED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)
)


#: The triggers fired from a signal handler or at exit, which never wait.
_EXIT_PATH_TRIGGERS = frozenset({"flush", "terminate"})


class RestartCycle(Protocol):
    """What the lifecycle of one in-process restart cycle asks of it
    (:class:`megatron.training.inprocess_restart.Cycle`)."""

    def restarts_after(self, cause: BaseException | int | None) -> bool:
        """Whether NVRx calls ``pretrain()`` again after ``cause`` ended this cycle."""
        ...

    def exclusive(self, wait: bool) -> AbstractContextManager[bool]:
        """Hold off NVRx's interruption while a transition runs (yields True); with
        ``wait`` False, yield False at once when the interruption is under way."""
        ...


class TrainerSpanPhases(SpanPhases):
    """The shared lifecycle, recording a Ctrl-C as an interrupt and a clean exit as none,
    flushing through the telemetry handle, and, for a cycle of an in-process restart,
    ending the cycle without shutting telemetry down (the module doc; the rows below)."""

    STATES: tuple[dict[str, Any], ...] = (
        *SpanPhases.STATES,
        # A cycle of an in-process restart is over: its spans ended and exported,
        # telemetry up for the next cycle's lifecycle.
        {"name": "restarting", "on_enter": "_export_cycle"},
    )

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        # Tried before the shared shutdown row: a fault NVRx restarts from ends the
        # cycle, not the process's telemetry.
        {"trigger": "shutdown", "source": LIVE, "dest": "restarting",
         "conditions": "restart_follows"},
        *SpanPhases.TRANSITIONS,
        # NVRx's finalize: the cycle's exit path, whatever the training path did.
        {"trigger": "restart", "source": LIVE, "dest": "restarting",
         "conditions": "restart_follows"},
        {"trigger": "restart", "source": LIVE, "dest": "shutdown"},
        {"trigger": "restart", "source": ["restarting", "shutdown", "terminated"], "dest": None},
        # Between two cycles, or after NVRx gave up: a signal, the atexit fallback.
        {"trigger": "flush", "source": "restarting", "dest": None, "after": "_flush_telemetry"},
        {"trigger": "terminate", "source": "restarting", "dest": "terminated"},
    )  # fmt: skip

    def __init__(
        self,
        telemetry: Any,
        save_interval: int | None = 0,
        *,
        is_span_group_enabled: Any = None,
        strict: bool = False,
        cycle: RestartCycle | None = None,
    ) -> None:
        """As :class:`SpanPhases`; ``cycle`` is the in-process restart cycle this
        ``pretrain()`` runs as (None: not under ``--inprocess-restart``)."""
        self.cycle = cycle
        super().__init__(
            telemetry, save_interval, is_span_group_enabled=is_span_group_enabled, strict=strict
        )

    def _bind(self, row: Any, *keys: str) -> dict[str, Any]:
        # The shared table binds its callbacks to this object; bind this table's
        # conditions too (the machine would look for them on its model).
        return super()._bind(row, *keys, "conditions")

    def restart(self, cause: BaseException | None = None) -> None:
        """NVRx restarts the cycle (its finalize step): end what is still open, as a
        way out of ``pretrain()`` with ``cause`` would have."""
        self._fire("restart", cause)

    def restart_follows(self, cause: BaseException | int | None = None, *_: Any) -> bool:
        """Condition: ``cause`` ends a cycle of an in-process restart that NVRx restarts."""
        return self.cycle is not None and self.cycle.restarts_after(cause)

    def ending(self, cause: BaseException | int | None) -> tuple[str, str] | None:
        """The shared rule, but ``interrupt`` for a ``KeyboardInterrupt``, None for a
        clean exit (``sys.exit(0)``, a generator closing), and ``inprocess_restart``
        for a fault a restart follows."""
        if isinstance(cause, BaseException) and is_clean_exit(cause):
            return None
        ending = super().ending(cause)
        if isinstance(cause, KeyboardInterrupt):
            return "interrupt", ending[1]
        if ending is not None and self.restart_follows(cause):
            return SHUTDOWN_REASON_INPROCESS_RESTART, ending[1]
        return ending

    def _flush_telemetry(self) -> None:
        """``flush``: the handle's spans, metrics and logs, within the flush's bound (the
        handle's force_flush runs them on helper threads it abandons at the deadline, and
        never raises)."""
        if self.telemetry is not None:
            self.telemetry.force_flush(timeout_ms=self.flush_timeout_ms)

    def _record_ending(self, span: Any, cause: Any) -> None:
        """As the shared rule, but a fault's ``exception`` event (its traceback) only on
        the first span it ended: the others it unwound through carry its status and
        reason, not the traceback again."""
        if (ending := self.ending(cause)) is None:
            return
        description = f"ended by {ending[1]}"
        if isinstance(cause, BaseException):
            record_exception_once(span, cause)
            description = f"{type(cause).__name__}: {cause}"[:200]  # the event has it all
        span.set_status(self._otel_trace.Status(self._otel_trace.StatusCode.ERROR, description))
        span.set_attributes({SHUTDOWN_REASON: ending[0], ERROR_TYPE: ending[1]})

    def _fire(self, trigger: str, *args: Any, said: str = "") -> None:
        """Under an in-process restart, each transition of the training path and of
        NVRx's finalize runs where NVRx's interruption cannot land (an exception
        raised asynchronously would leave it half done). Where the interruption is
        already under way the way out of ``pretrain()`` does not wait for it (it would
        wait until NVRx's soft timeout): NVRx's finalize then fires ``restart``. The
        exit paths (``flush``, ``terminate``: a signal handler, atexit) wait for nothing."""
        with self._exclusive(trigger) as held:
            if held:
                super()._fire(trigger, *args, said=said)

    def _exclusive(self, trigger: str) -> AbstractContextManager[bool]:
        if self.cycle is None or trigger in _EXIT_PATH_TRIGGERS:
            return nullcontext(True)
        return self.cycle.exclusive(wait=trigger != "shutdown")

    def _export_cycle(self, *_: Any, **__: Any) -> None:
        """Entering ``restarting``: the exit callbacks ended the cycle's spans; export
        them now, before NVRx starts the next cycle."""
        self._flush_telemetry()


class TrainerExitHooks(ExitHooks):
    """The shared exit hooks, for SIGTERM, SIGHUP and SIGINT, with this trainer's table.

    Unlike the shared table (one action at the first signal), a graceful signal
    leaves the hooks ``installed`` and flushes each time, and a hard one moves them
    to ``terminating``, after which further signals are only passed on.
    """

    STATES: tuple[str, ...] = ("uninstalled", "installed", "terminating")

    #: The shared ones, and this trainer's live goodput figures (a lock the metric
    #: reader takes, and the main thread when it saves a checkpoint's record).
    TELEMETRY_PACKAGES = (*ExitHooks.TELEMETRY_PACKAGES, "megatron.training.telemetry")

    TRANSITIONS: tuple[dict[str, Any], ...] = (
        {"trigger": "install", "source": "uninstalled", "dest": "installed", "after": "_register"},
        # A later pretrain() only rebinds the lifecycle (done before firing).
        {"trigger": "install", "source": ["installed", "terminating"], "dest": None},
        # Graceful drain: flush, keep everything open, let the trainer finish.
        {"trigger": "sigterm", "source": "installed", "dest": None, "conditions": "graceful_drain",
         "after": "_flush_target"},
        # Hard stop: end and export everything, then let the signal do its job.
        {"trigger": "sigterm", "source": "installed", "dest": "terminating",
         "after": "_terminate_target"},
        # A second signal while the first is handled: never re-enter.
        {"trigger": "sigterm", "source": "terminating", "dest": None},
        {"trigger": "process_exit", "source": ["installed", "terminating"], "dest": None,
         "after": "_terminate_target"},
    )  # fmt: skip

    SIGNALS = HOOKED_SIGNALS

    def graceful_drain(self, signum: int = signal.SIGTERM, *_: Any) -> bool:
        """Whether the process outlives ``signum``, so a flush is all it needs.

        Never where the previous disposition is the default action (the process
        would die right after the flush, losing the open spans). SIGINT's Python
        handler raises an exception the run unwinds from: graceful.
        """
        if self.previous_handlers.get(signum, signal.SIG_DFL) in (signal.SIG_DFL, None):
            return False
        return self.graceful or signum == signal.SIGINT

    def _register(self) -> None:
        # A SIGHUP or SIGINT the process ignores (nohup) stays ignored and unhooked.
        self.SIGNALS = tuple(
            signum
            for signum in self.SIGNALS
            if signum == signal.SIGTERM or signal.getsignal(signum) not in (signal.SIG_IGN, None)
        )
        super()._register()


#: The trainer's process-wide exit hooks (the shared module's ``ExitHooks.process`` stays unused).
TRAINER_EXIT_HOOKS = TrainerExitHooks()


def install_exit_hooks(phases: SpanPhases, graceful: bool = False) -> TrainerExitHooks:
    """Point the trainer's exit hooks at ``phases``, installing them once per process."""
    TRAINER_EXIT_HOOKS.attach(phases, graceful=graceful)
    return TRAINER_EXIT_HOOKS
