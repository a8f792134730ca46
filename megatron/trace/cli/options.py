"""What every ``megatron-trace`` subcommand shares: its parser, the FILE arguments, the clock."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from megatron.trace.analysis.liveness import Clock
from megatron.trace.errors import TraceOutputError
from megatron.trace.semconv import STALE_AFTER_S

__all__ = ["add_command", "clock", "writing"]


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--jobs must be a whole number of processes, 1 or more: {text!r}"
        )
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _epoch_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds since the epoch, got {text!r}")
    return value


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    description: str,
    run: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` taking ``FILE...`` (trace files); ``run`` gives the exit status.

    Every command also takes ``--jobs`` and the liveness options
    (``--stale-after``, ``--now``): they all say whether the job is still
    running. Returns the parser, for the subcommand's own options.
    """
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="trace files")
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="read the files in N parallel processes (default: one per file, up to the cores)",
    )
    parser.add_argument(
        "--stale-after",
        type=_positive_seconds,
        default=STALE_AFTER_S,
        metavar="SECONDS",
        help="a job not seen to end is running while its newest record is at most this old "
        f"(default {STALE_AFTER_S:g}: three heartbeat periods)",
    )
    parser.add_argument(
        "--now",
        type=_epoch_seconds,
        default=None,
        metavar="EPOCH_SECONDS",
        help="judge that against this time instead of the clock",
    )
    parser.set_defaults(func=run)
    return parser


def clock(args: argparse.Namespace) -> Clock:
    """The clock ``--now`` and ``--stale-after`` give."""
    return Clock.at(getattr(args, "now", None), getattr(args, "stale_after", None))


@contextlib.contextmanager
def writing(output: Path) -> Iterator[None]:
    """Name ``output`` in what goes wrong writing it: the readers raise their own errors
    (:class:`~megatron.trace.errors.TraceInputError`), so an ``OSError`` here is the output's."""
    try:
        yield
    except OSError as error:
        raise TraceOutputError(f"cannot write {output}: {error.strerror or error}") from error
