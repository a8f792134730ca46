"""The ``megatron-trace`` command line: one subcommand per module.

Adding a subcommand is two lines: import its module and list it in
``COMMANDS``. Each module exposes ``add_parser(subparsers)``, which adds its
parser with :func:`megatron.trace.command.add_command` (the ``FILE...``
arguments and ``func``: parsed arguments in, exit status out) plus its own
options.

Exit status: whatever the subcommand returns; 2 for a file that cannot be read
or is damaged (one line naming the file and line), as for any bad input; 141
(128 + SIGPIPE), silently, when the output's reader closed the pipe early.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from megatron.core.telemetry.reader import TraceFileDamaged, paused_gc
from megatron.core.telemetry.trace_files import CompressedTraceError
from megatron.trace import check, export, report, timeline

COMMANDS = (check, report, timeline, export)

__all__ = ["COMMANDS", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megatron-trace",
        description="Check, report on and draw the OTLP/JSON trace files a training job wrote.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with paused_gc():  # a command's data holds no cycles: see paused_gc
            status = int(args.func(args))
        sys.stdout.flush()  # here, so a reader that went away is caught below
        return status
    except BrokenPipeError:
        # The output's reader stopped early (``| head``): stop quietly, as the tools a
        # pipe usually joins do when SIGPIPE ends them, with their exit status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (TraceFileDamaged, CompressedTraceError) as error:
        print(f"megatron-trace: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"megatron-trace: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
