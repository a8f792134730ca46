"""``megatron-trace export``: write the trace for Perfetto UI (Chrome JSON or protobuf).

What is written, and how, is :mod:`megatron.trace.render.export.write`'s; this
module is the command: its options, the line it prints and the size warning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from megatron.trace.cli.options import add_command, add_job_option, clock, reading_on, writing
from megatron.trace.render.export.write import FORMATS, export_files, size_warning

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``export`` on the ``megatron-trace`` command line."""
    parser = add_command(
        subparsers,
        "export",
        help="write the trace for Perfetto UI (chrome: trace-event JSON; perfetto: protobuf)",
        description="Write trace files for Perfetto UI (ui.perfetto.dev): as Chrome "
        "trace-event JSON (also chrome://tracing) or as Perfetto's native protobuf trace. "
        "A track per incarnation and rank, spans as nested slices, links as flow arrows.",
        run=run,
    )
    parser.add_argument("--format", choices=FORMATS, default="chrome", help="output format")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the file to write")
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only spans that end at or after WHEN: an ISO 8601 time (2026-12-01T10:00:00Z), "
        "a time from the trace's start (+90s, +1.5h, +2d) or an iteration (iteration:1200)",
    )
    parser.add_argument("--until", metavar="WHEN", help="only spans that start at or before WHEN")
    parser.add_argument("--ranks", metavar="RANKS", help="only these ranks, e.g. 0,2,4-7")
    add_job_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``export`` for parsed arguments; returns the exit status."""
    with reading_on(args) as (jobs, executor), writing(args.output):
        result = export_files(
            args.files,
            args.output,
            args.format,
            args.since,
            args.until,
            args.ranks,
            jobs,
            clock(args),
            executor,
            args.job,
        )
    mb = result.size / 2**20
    size = f"{mb:.1f} MB" if mb < 1024 else f"{mb / 1024:.2f} GB"
    print(
        f"wrote {args.output} ({result.events} events, {size}); open it in https://ui.perfetto.dev"
    )
    warning = size_warning(result, args.format, args.output)
    if warning:
        print(f"megatron-trace export: warning: {warning}", file=sys.stderr)
    return 0
