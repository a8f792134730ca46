"""``megatron-trace report``: where the job's wall-clock time went (goodput and badput).

This module is the command; its text is
:mod:`megatron.trace.render.report_text`'s, and the figures themselves (the
categories, the sweep, wasted progress, the iteration statistics) are
computed by :mod:`megatron.trace.analysis.goodput`, whose module docstring says how.
``--json`` prints :func:`~megatron.trace.analysis.goodput.build_report`'s dict as is.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megatron.trace.analysis.goodput import build_report
from megatron.trace.analysis.liveness import judge
from megatron.trace.cli.options import add_command, clock, reading_on
from megatron.trace.errors import NoSpansError
from megatron.trace.model.trace import load_trace
from megatron.trace.render.report_text import format_report

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    with reading_on(args) as (jobs, executor):
        trace = load_trace(args.files, jobs, executor)
    if not trace.ranks:
        raise NoSpansError(args.files)
    report = build_report(trace, judge(trace, args.files, clock(args)))
    print(format_report(report))
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


def add_parser(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "report",
        "the goodput report: wall clock, goodput, badput by category, iterations",
        # not __doc__, which python -OO strips; plain text, no markup
        "Where the job's wall-clock time went: goodput and badput by category (queue, "
        "launch, startup, checkpoint load and save, evaluation, wasted progress, restart "
        "gap, other), per incarnation how it ended and what it wasted, and iteration "
        "statistics. Figures the trace cannot give are listed as not computed.",
        run,
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the report as one JSON object, last"
    )
