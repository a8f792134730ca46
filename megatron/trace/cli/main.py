"""The ``megatron-trace`` entry point, and the one place errors become exit statuses.

Adding a subcommand is one line: list its name and module in ``COMMANDS``.
Each module exposes ``add_parser(subparsers)``, which adds its parser with
:func:`megatron.trace.cli.options.add_command` (the ``FILE...`` arguments and
``func``: parsed arguments in, exit status out) plus its own options. Only
the chosen subcommand's module is imported (all of them for the top-level
help): a ``report`` does not wait for the exporters and the timeline to
import, a third of its start on a small file.

Exit status: whatever the subcommand returns (0, or 1 for a finding: a ``check``
violation, a gate's bound crossed); for a
:class:`~megatron.trace_format.errors.TraceError`, one line
``megatron-trace COMMAND: error: MESSAGE`` and its ``exit_code`` (2: bad
input); 2 for a file the system will not let us read, likewise; 141
(128 + SIGPIPE), silently, when the output's reader closed the pipe early.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence

from megatron.trace.otlp.reader import paused_gc
from megatron.trace_format.errors import TraceError

#: Subcommand -> the module that defines it, in the order the help lists them.
COMMANDS = {
    "check": "megatron.trace.cli.check",
    "report": "megatron.trace.cli.report",
    "timeline": "megatron.trace.cli.timeline",
    "export": "megatron.trace.cli.export",
    "diff": "megatron.trace.cli.diff",
    "watch": "megatron.trace.cli.watch",
    "receive": "megatron.trace.cli.receive",
}

__all__ = ["COMMANDS", "build_parser", "main"]

#: The commands whose FILE arguments may be folders (:mod:`megatron.trace.cli.folders`);
#: diff reads each folder as one side (in its own ``sides``), watch follows files.
_READ_FOLDERS = frozenset({"check", "report", "timeline", "export"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command`` alone (a name in ``COMMANDS``)."""
    parser = argparse.ArgumentParser(
        prog="megatron-trace",
        description="Check, report on and draw the OTLP/JSON trace files a training job wrote.",
        epilog="exit status: 0 success; 1 a finding: check found a violation, or a gate's "
        "bound was crossed (report --fail-under-goodput, diff --fail-if-slower); 2 bad "
        "input (a file missing, unreadable or damaged, no spans, a bad option, a missing "
        "optional package, an output that cannot be written, a gate on a figure not "
        "computed); 141 the output pipe was closed; each command's --help lists its own",
    )
    parser.add_argument(
        "--version", action=_Version, help="print the version (megatron.trace.__version__)"
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
        if args.command in _READ_FOLDERS and getattr(args, "files", None):
            from megatron.trace.cli.folders import expand

            args.files = expand(args.files, args.command)  # a receiver's folders: their files
        with paused_gc(), _warnings_to_stderr():  # (a command's data holds no cycles)
            status = int(args.func(args))
        sys.stdout.flush()  # here, so a reader that went away is caught below
        return status
    except BrokenPipeError:
        # The output's reader stopped early (``| head``): stop quietly, as the tools a
        # pipe usually joins do when SIGPIPE ends them, with their exit status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except TraceError as error:
        return _fail(args.command, str(error), error.exit_code)
    except OSError as error:  # a trace file the system will not let us read
        return _fail(args.command, f"cannot read {error.filename}: {error.strerror}", 2)


class _Version(argparse.Action):
    """``--version``: ``megatron-trace VERSION``, then exit 0. The version is read from the
    package metadata only when asked (argparse's own action wants it at parser build)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import megatron.trace

        print(f"{parser.prog} {megatron.trace.__version__}")
        parser.exit()


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """The library's warnings (``logging.getLogger("megatron.trace")``: a spill that stayed
    in memory, say) as the lines they are, on the stderr of this command."""
    logger = logging.getLogger("megatron.trace")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _fail(command: str, message: str, status: int) -> int:
    print(f"megatron-trace {command}: error: {message}", file=sys.stderr)
    return status
