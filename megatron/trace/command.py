"""What every ``megatron-trace`` subcommand shares: its parser with the FILE arguments."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megatron.trace.liveness import add_liveness_arguments

__all__ = ["add_command"]


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
    add_liveness_arguments(parser)
    parser.set_defaults(func=run)
    return parser
