"""The ``megatron-trace`` command line: one subcommand per module.

Adding a subcommand is one line: list its name and module in ``COMMANDS``.
Each module exposes ``add_parser(subparsers)``, which adds its parser with
:func:`megatron.trace.command.add_command` (the ``FILE...`` arguments and
``func``: parsed arguments in, exit status out) plus its own options. Only
the chosen subcommand's module is imported (all of them for the top-level
help): a ``report`` does not wait for the exporters and the timeline to
import, a third of its start on a small file.

Exit status: whatever the subcommand returns; 2 for a file that cannot be read
or is damaged (one line naming the file and line), as for any bad input; 141
(128 + SIGPIPE), silently, when the output's reader closed the pipe early.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from megatron.core.telemetry.reader import TraceFileDamaged, paused_gc
from megatron.core.telemetry.trace_files import CompressedTraceError

#: Subcommand -> the module that defines it, in the order the help lists them.
COMMANDS = {
    "check": "megatron.trace.check",
    "report": "megatron.trace.report",
    "timeline": "megatron.trace.timeline",
    "export": "megatron.trace.export",
}

__all__ = ["COMMANDS", "build_parser", "main"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command`` alone (a name in ``COMMANDS``)."""
    parser = argparse.ArgumentParser(
        prog="megatron-trace",
        description="Check, report on and draw the OTLP/JSON trace files a training job wrote.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    chosen = words[0] if words and words[0] in COMMANDS else None  # else: help, or an error
    parser = build_parser(chosen)
    args = parser.parse_args(words)
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
