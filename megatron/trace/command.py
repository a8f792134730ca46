"""What every ``megatron-trace`` subcommand shares: its parser with the FILE arguments."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megatron.trace.liveness import add_liveness_arguments

__all__ = ["add_command"]


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


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    description: str,
    run: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` taking ``FILE...`` (trace files); ``run`` gives the exit status.

    Every command also takes the liveness options (``--stale-after``,
    ``--now``): they all say whether the job is still running.
    Returns the parser, for the subcommand's own options.
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
    add_liveness_arguments(parser)
    parser.set_defaults(func=run)
    return parser
