"""``python -m megatron.training`` and the ``megatron-pretrain`` console script.

The first statement takes ``program_start``, before torch and everything else
is imported: the startup trace shows that import time as
``megatron.startup.imports`` (``[program_start, main_entry]``), and on a cold
cluster node it is often the largest piece of startup.

Errors a user can fix (bad telemetry settings found at setup, an unreadable
checkpoint) end as one ``megatron-pretrain: error: ...`` line and exit status
2, like the argument errors argparse reports; everything else keeps its
traceback.

Two ways of ending belong to the command, not to ``pretrain()``, so a library
caller gets neither: an early exit (``--exit-interval``...) is a returned
``exit_reason`` that becomes exit status 0 here, and a Ctrl-C (SIGINT) is one
line instead of a traceback through the training loop, after which the
process still dies by SIGINT (status -2 / 130) as Python's default does, so a
calling shell script stops too.
"""

import time

PROGRAM_START = time.time()

import _signal  # noqa: E402  (the C functions under signal's Python wrappers: see main)
import sys  # noqa: E402
from types import TracebackType  # noqa: E402

from megatron.core.telemetry import TelemetryConfigError  # noqa: E402
from megatron.training.arguments import PROG, parse_args  # noqa: E402
from megatron.training.checkpointing import CheckpointError  # noqa: E402
from megatron.training.training import pretrain  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    main_entry = time.time()
    config = parse_args(argv)
    try:
        result = pretrain(config, program_start=PROGRAM_START, main_entry=main_entry)
    except (CheckpointError, TelemetryConfigError) as exc:
        # As the argument errors say it (arguments._Parser.error): one line, and the pointer.
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        print(f"See '{PROG} --help' for every flag.", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        # First, before any Python call: a second Ctrl-C must not interrupt the line. A
        # pending handler runs where a Python function is entered (signal.signal is one,
        # and so is the helper), so the handler is swapped by the C call itself, for one
        # that does nothing (SIG_IGN would have a signal that arrived a moment before
        # reported as "ignored due to race condition").
        _signal.signal(_signal.SIGINT, _ignore_sigint)
        _quiet_keyboard_interrupt()
        print(
            f"{PROG}: interrupted (SIGINT); checkpoints and telemetry written so far are kept",
            file=sys.stderr,
            flush=True,
        )
        raise
    if config.demo:  # the demo ends by drawing its trace; never raises
        from megatron.trace.render.timeline.write import write_beside_trace

        write_beside_trace(result.trace_file)


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
