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
"""

from __future__ import annotations

import signal
from typing import Any

from megatron.core.telemetry.helpers import is_clean_exit
from megatron.training.telemetry_spans import ExitHooks, SpanPhases

__all__ = ["HOOKED_SIGNALS", "TRAINER_EXIT_HOOKS", "TrainerExitHooks", "TrainerSpanPhases"]

#: The terminating signals the trainer's exit hooks act on (those this platform has).
HOOKED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)
)


class TrainerSpanPhases(SpanPhases):
    """The shared lifecycle, recording a Ctrl-C as an interrupt and a clean exit as none,
    and flushing through the telemetry handle."""

    def ending(self, cause: BaseException | int | None) -> tuple[str, str] | None:
        """The shared rule, but ``interrupt`` for a ``KeyboardInterrupt`` and None for a
        clean exit (``sys.exit(0)``, a generator closing)."""
        if isinstance(cause, BaseException) and is_clean_exit(cause):
            return None
        ending = super().ending(cause)
        if isinstance(cause, KeyboardInterrupt):
            return "interrupt", ending[1]
        return ending

    def _flush_telemetry(self) -> None:
        """``flush``: the handle's spans, metrics and logs, within the flush's bound (the
        handle's force_flush runs them on helper threads it abandons at the deadline, and
        never raises)."""
        if self.telemetry is not None:
            self.telemetry.force_flush(timeout_ms=self.flush_timeout_ms)


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
