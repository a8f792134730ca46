"""``python -m megatron.training`` and the ``megatron-pretrain`` console script.

The first statement takes ``program_start``, before torch and everything else
is imported: the startup trace shows that import time as
``megatron.startup.imports`` (``[program_start, main_entry]``), and on a cold
cluster node it is often the largest piece of startup.

Without torch (installed without the ``train`` extra) the command ends
before importing anything of the loop, with one line naming the extra.

Errors a user can fix (bad telemetry settings found at setup, an unreadable
checkpoint) end as one ``megatron-pretrain: error: ...`` line and exit status
2, like the argument errors argparse reports; everything else keeps its
traceback.

With ``--inprocess-restart`` the command runs ``pretrain()`` under NVIDIA
Resiliency Extension's in-process restart
(:mod:`megatron.training.inprocess_restart`); when ``--inprocess-max-iterations``
cycles all ended by a fault it ends with one ``megatron-pretrain: error: ...``
line naming the limit and the last fault, and exit status 1 (each fault's
traceback is in the log above it, where NVRx reported it).

Two ways of ending belong to the command, not to ``pretrain()``, so a library
caller gets neither: an early exit (``--exit-interval``...) is a returned
``exit_reason`` that becomes exit status 0 here, and a Ctrl-C (SIGINT) is one
line instead of a traceback through the training loop, after which the
process still dies by SIGINT (status -2 / 130) as Python's default does, so a
calling shell script stops too.
"""

import os
import time

PROGRAM_START = time.time()

import _signal  # noqa: E402  (the C functions under signal's Python wrappers: see main)
import sys  # noqa: E402
import warnings  # noqa: E402
from types import TracebackType  # noqa: E402

from megatron.training.requirements import missing_for_trainer  # noqa: E402

# Before the training loop's imports: without torch (an install without the `train`
# extra), one line naming the extra, as the argument errors end (status 2).
if (_missing := missing_for_trainer()) is not None:
    sys.stderr.write(f"megatron-pretrain: error: {_missing}\n")  # one write: see print_lines
    sys.exit(2)

# NVIDIA Resiliency Extension (the inprocess extra) installs the deprecated pynvml
# package, whose import (torch.cuda makes it) warns on every run: noise to a user of
# this command, who did not install it directly.
warnings.filterwarnings("ignore", "The pynvml package is deprecated", FutureWarning)

from megatron.core.telemetry import TelemetryConfigError  # noqa: E402
from megatron.core.telemetry.logs import print_lines  # noqa: E402
from megatron.training.arguments import PROG, parse_args  # noqa: E402
from megatron.training.checkpointing import CheckpointError  # noqa: E402
from megatron.training.job_config import JobConfig  # noqa: E402
from megatron.training.training import TrainingResult, pretrain  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    main_entry = time.time()
    config = parse_args(argv)
    if config.demo and "OMP_NUM_THREADS" not in os.environ:
        # The demo's model is too small to gain from a second intra-op thread, and on a
        # core another process keeps busy that thread's spin-waits make every iteration
        # many times slower: one thread keeps the run's length what --help says.
        import torch

        torch.set_num_threads(1)
    replaced = _interrupt_once()
    try:
        result = _run(config, main_entry)
    except (CheckpointError, TelemetryConfigError) as exc:
        # As the argument errors say it (arguments._Parser.error): one line, and the pointer.
        print_lines(f"{PROG}: error: {exc}\nSee '{PROG} --help' for every flag.", sys.stderr)
        sys.exit(2)
    except _restarts_exhausted() as exc:
        print_lines(f"{PROG}: error: {exc}", sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        # A second Ctrl-C from here on must not interrupt the line nor an atexit callback:
        # the handler becomes one that does nothing (SIG_IGN would have a signal that
        # arrived a moment before reported as "ignored due to race condition"). One that
        # lands before this swap, while the run unwinds, reaches _FirstInterrupt (through
        # the telemetry's hook, which chains to it), which raises only once.
        _signal.signal(_signal.SIGINT, _ignore_sigint)
        _quiet_keyboard_interrupt()
        print_lines(
            f"{PROG}: interrupted (SIGINT); checkpoints and telemetry written so far are kept",
            sys.stderr,
        )
        raise
    if replaced is not None:  # (a caller of main() in its own process gets its handler back)
        _signal.signal(_signal.SIGINT, replaced)
    if config.demo:  # the demo ends by drawing its trace; never raises
        from megatron.trace.render.timeline.write import write_beside_trace

        write_beside_trace(result.trace_file)


def _run(config: JobConfig, main_entry: float) -> TrainingResult:
    """``pretrain()``, under NVRx's in-process restart when ``--inprocess-restart`` asks."""
    if not config.inprocess.inprocess_restart:
        return pretrain(config, program_start=PROGRAM_START, main_entry=main_entry)
    from megatron.training.inprocess_restart import run_with_inprocess_restart

    return run_with_inprocess_restart(
        pretrain, config, program_start=PROGRAM_START, main_entry=main_entry
    )


def _restarts_exhausted() -> type[BaseException] | tuple[()]:
    """The error an in-process restart ends with at its cycle limit (none when its module,
    which imports nothing of NVRx itself, was never imported: no such run)."""
    module = sys.modules.get("megatron.training.inprocess_restart")
    return () if module is None else module.RestartsExhausted


def _interrupt_once() -> object:
    """SIGINT's handler for the run: Python's own, but only the first Ctrl-C raises.

    Python's handler raises ``KeyboardInterrupt`` at every SIGINT. A second one
    landing while the first unwinds the loop, before ``main`` has swapped in
    :func:`_ignore_sigint`, would raise again outside any ``except`` (a
    traceback) however early that swap comes: a pending handler runs at the
    next bytecode that checks for one. :class:`_FirstInterrupt` decides in the
    handler itself, where no such check lies between the test and the set.
    A SIGINT that the process inherited as ignored (a background job of a
    non-interactive shell) stays ignored, as Python leaves it. Returns the handler
    replaced (None: none was).
    """
    if _signal.getsignal(_signal.SIGINT) is not _signal.default_int_handler:
        return None
    return _signal.signal(_signal.SIGINT, _FirstInterrupt())


class _FirstInterrupt:
    """Raise ``KeyboardInterrupt`` at the first SIGINT; do nothing at any later one."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.raised:
            return
        self.raised = True
        raise KeyboardInterrupt


def _ignore_sigint(signum: int, frame: object) -> None:
    """SIGINT once the first one is ending the run: nothing more to do."""


def _quiet_keyboard_interrupt() -> None:
    """Let the re-raised KeyboardInterrupt end the process without its traceback.

    Re-raising (rather than exiting 130) keeps Python's own ending: atexit
    hooks run, then the interpreter kills itself with SIGINT. A second Ctrl-C
    meanwhile would raise a new KeyboardInterrupt inside whichever atexit
    callback runs (a traceback of its own), so ``main`` has SIGINT ignored
    first (:func:`_ignore_sigint`): the process is already on its way to dying
    by it (the interpreter restores the default disposition before it does).
    """
    previous = sys.excepthook

    def hook(
        kind: type[BaseException], value: BaseException, traceback: TracebackType | None
    ) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, traceback)

    sys.excepthook = hook


if __name__ == "__main__":
    main()
