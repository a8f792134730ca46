"""``megatron-trace timeline``: draw the job as one self-contained HTML page.

What the page shows is :mod:`megatron.trace.render.timeline.write`'s; this module
is the command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from megatron.trace.cli.options import add_command, add_job_option, clock, reading_on, writing
from megatron.trace.render.timeline.write import write_timeline

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``timeline`` on the ``megatron-trace`` command line."""
    parser = add_command(
        subparsers,
        "timeline",
        help="draw the job as a self-contained HTML timeline (needs the 'trace' extra)",
        description="Write a self-contained HTML page (plotly, opens offline) with one lane "
        "per incarnation and rank: queue, startup phases, intervals, checkpoints, "
        "evaluations, restart gaps and how each incarnation ended.",
        run=run,
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("timeline.html"), help="the page to write"
    )
    add_job_option(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``timeline`` for parsed arguments; returns the exit status."""
    with reading_on(args) as (jobs, executor), writing(args.output):
        write_timeline(args.files, args.output, clock(args), jobs, executor, args.job)
    print(f"timeline written to {args.output}")
    return 0
