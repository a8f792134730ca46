"""Fault, delay and hang injection for tests, from seven environment variables.

* ``MEGATRON_TEST_FAULT_AT_ITERATION=N``: the forward step of iteration ``N``
  (the span with ``megatron.iteration == N``) raises
  ``RuntimeError("injected fault at iteration N")``.
* ``MEGATRON_TEST_FAULT_AT_STARTUP=PHASE``: the start of a startup phase,
  ``model_init``, ``load_checkpoint`` or ``dataloader``, raises
  ``RuntimeError("injected fault at startup: PHASE")``.
* ``MEGATRON_TEST_FAULT_AT_SAVE=N``: the checkpoint save after iteration ``N``
  (the save span with ``megatron.iteration == N``) raises
  ``RuntimeError("injected fault in the save of iteration N")`` before it writes anything.
* ``MEGATRON_TEST_ITERATION_SLEEP=S``: sleep ``S`` seconds before each forward
  step, so a test can land a signal in the middle of an iteration.
* ``MEGATRON_TEST_SAVE_SLEEP=S``: sleep ``S`` seconds in each checkpoint save,
  before anything is written (slow storage), so a test can land a SIGKILL in a save.
* ``MEGATRON_TEST_HANG_AT_ITERATION=N``: the forward step of iteration ``N``
  blocks until the process is signalled (a signal whose handler raises or
  ends the process; one that returns lets the block go on). Set on one rank
  of a torchrun job, it is a hung rank: the others block in the next
  collective, waiting for it.
* ``MEGATRON_TEST_HANG_AT_STARTUP=PHASE``: the same block at the start of a
  startup phase, ``model_init``, ``load_checkpoint`` or ``dataloader``, so a
  test can land a signal (a Ctrl-C) while the job is still starting.

Each fault and hang fires **once per process**: an in-process restart
(``--inprocess-restart``) calls ``pretrain()`` again in the same process, and its
next cycle must not meet the fault that ended the last one, as a real fault does
not strike twice at the same place; a relaunched process meets it again, as it
always did. The delays slow every iteration and save, in every cycle.

A hang blocks in naps of :data:`HANG_NAP_S`, so that NVRx's in-process restart,
which interrupts the main thread with an exception raised asynchronously (only
ever delivered between two bytecodes), ends it; any signal ends a nap at once.

A hang says so on stderr as it begins (``MEGATRON_TEST_HANG_AT_STARTUP=model_init:
blocking here until a signal``): the line a test waits for before signalling.

They are test hooks, but a typo in one is still bad input: the arguments
check reads them at startup (exit 2, one line naming the variable), not the
first iteration after the model is built.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass

__all__ = [
    "FAULT_ENV",
    "HANG_ENV",
    "HANG_NAP_S",
    "SAVE_FAULT_ENV",
    "SAVE_SLEEP_ENV",
    "SLEEP_ENV",
    "STARTUP_FAULT_ENV",
    "STARTUP_HANG_ENV",
    "FaultInjection",
]

FAULT_ENV = "MEGATRON_TEST_FAULT_AT_ITERATION"
SLEEP_ENV = "MEGATRON_TEST_ITERATION_SLEEP"
SAVE_SLEEP_ENV = "MEGATRON_TEST_SAVE_SLEEP"
HANG_ENV = "MEGATRON_TEST_HANG_AT_ITERATION"
STARTUP_HANG_ENV = "MEGATRON_TEST_HANG_AT_STARTUP"
STARTUP_FAULT_ENV = "MEGATRON_TEST_FAULT_AT_STARTUP"
SAVE_FAULT_ENV = "MEGATRON_TEST_FAULT_AT_SAVE"
#: The startup phases ``MEGATRON_TEST_HANG_AT_STARTUP`` and ``MEGATRON_TEST_FAULT_AT_STARTUP``
#: may name, in the order they run.
STARTUP_PHASES = ("model_init", "load_checkpoint", "dataloader")

#: How long each wait of a hang lasts. A signal ends a nap at once; an asynchronous
#: exception (NVRx's restart) is delivered when the nap ends.
HANG_NAP_S = 0.1

#: The faults and hangs that already fired in this process, by variable (see the module doc).
_FIRED: set[str] = set()


def _fires(variable: str) -> bool:
    """Whether the hook of ``variable`` fires now: the first time only, in this process."""
    if variable in _FIRED:
        return False
    _FIRED.add(variable)
    return True


@dataclass(frozen=True)
class FaultInjection:
    """What the variables ask for; the default injects nothing."""

    fault_at_iteration: int | None = None
    sleep_s: float = 0.0
    hang_at_iteration: int | None = None
    hang_at_startup: str | None = None
    save_sleep_s: float = 0.0
    fault_at_startup: str | None = None
    fault_at_save: int | None = None

    @classmethod
    def from_env(cls) -> FaultInjection:
        """Read the variables; ``ValueError`` with one line naming a bad one."""
        return cls(
            fault_at_iteration=_iteration(FAULT_ENV),
            sleep_s=_seconds(SLEEP_ENV),
            hang_at_iteration=_iteration(HANG_ENV),
            hang_at_startup=_startup_phase(STARTUP_HANG_ENV),
            save_sleep_s=_seconds(SAVE_SLEEP_ENV),
            fault_at_startup=_startup_phase(STARTUP_FAULT_ENV),
            fault_at_save=_iteration(SAVE_FAULT_ENV),
        )

    def at_startup(self, phase: str) -> None:
        """Called as each startup phase of :data:`STARTUP_PHASES` begins."""
        if phase == self.fault_at_startup and _fires(STARTUP_FAULT_ENV):
            raise RuntimeError(f"injected fault at startup: {phase}")
        if phase == self.hang_at_startup and _fires(STARTUP_HANG_ENV):
            _hang(f"{STARTUP_HANG_ENV}={phase}")

    def in_save(self, iteration: int | None = None) -> None:
        """Called in each checkpoint save (after ``iteration``), before it writes anything."""
        if self.save_sleep_s:
            time.sleep(self.save_sleep_s)
        if iteration is not None and iteration == self.fault_at_save and _fires(SAVE_FAULT_ENV):
            raise RuntimeError(f"injected fault in the save of iteration {iteration}")

    def before_forward(self, iteration: int) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if iteration == self.fault_at_iteration and _fires(FAULT_ENV):
            raise RuntimeError(f"injected fault at iteration {iteration}")
        if iteration == self.hang_at_iteration and _fires(HANG_ENV):
            _hang(f"{HANG_ENV}={iteration}")


def _hang(cause: str) -> None:
    """Say on stderr that ``cause`` blocks here, then block until a signal ends the
    process or its handler raises (or NVRx's restart interrupts it).

    The line is what a test waits for before it signals the process in the hang
    (a fixed wait could end before a busy machine gets there). ``time.sleep`` lets
    Python run signal handlers (the telemetry exit hook, ``KeyboardInterrupt``)
    and, when one returns, sleeps on (PEP 475).
    """
    sys.stderr.write(f"{cause}: blocking here until a signal\n")  # one write: whole line
    sys.stderr.flush()
    while True:
        time.sleep(HANG_NAP_S)


def _iteration(variable: str) -> int | None:
    text = os.environ.get(variable)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{variable}={text!r}: expected an iteration number (an integer >= 0)")
    return value


def _seconds(variable: str) -> float:
    text = os.environ.get(variable)
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{variable}={text!r}: expected seconds (a number >= 0)")
    return value


def _startup_phase(variable: str) -> str | None:
    text = os.environ.get(variable)
    if not text:
        return None
    if text not in STARTUP_PHASES:
        raise ValueError(f"{variable}={text!r}: expected one of {', '.join(STARTUP_PHASES)}")
    return text
