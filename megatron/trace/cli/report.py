"""``megatron-trace report``: where the job's wall-clock time went (goodput and badput).

This module is the command; its text is
:mod:`megatron.trace.render.text.report`'s, and the figures themselves (the
categories, the sweep, wasted progress, the iteration statistics) are
computed by :mod:`megatron.trace.analysis.goodput`, whose module docstring says how.
``--json`` prints :func:`~megatron.trace.analysis.goodput.build_report`'s dict, its bounds'
reasons in words (:mod:`megatron.trace.render.json.report`).
``--window DURATION`` adds the accounting per window of the wall clock; ``--mtbf
DURATION`` sets the mean time between failures the checkpoint-interval advice assumes.
``--fail-under-goodput PCT`` is a gate for CI (:mod:`megatron.trace.analysis.gates`):
exit 1, with one line on stderr after the report, when the goodput is under PCT %.
"""

from __future__ import annotations

import argparse
from typing import Any

from megatron.trace.analysis.gates import goodput_gate
from megatron.trace.analysis.goodput import build_report
from megatron.trace.analysis.liveness import judge
from megatron.trace.cli.options import (
    add_command,
    add_job_option,
    answer,
    clock,
    duration,
    percent,
    reading_on,
)
from megatron.trace.model.builder import load_trace
from megatron.trace.model.jobs import one_job
from megatron.trace.render.json.report import report_json
from megatron.trace.render.text.report import format_report
from megatron.trace_format.errors import NoSpansError

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    with reading_on(args) as (jobs, executor):
        trace = load_trace(args.files, jobs, executor)
    if not trace.ranks:
        raise NoSpansError(args.files)
    trace = one_job(trace, args.job)
    mtbf_s = args.mtbf / 1e9 if args.mtbf is not None else None
    liveness = judge(trace, args.files, clock(args))
    report = build_report(trace, liveness, window_ns=args.window, mtbf_s=mtbf_s)
    # judged before printing, so a gate that cannot judge (exit 2) prints nothing
    bound = args.fail_under_goodput
    gate = goodput_gate(report, bound) if bound is not None else None
    return answer("report", format_report(report), report_json(report), args.json, gate)


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
        finding="the goodput is under --fail-under-goodput",
        gate=True,
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the report as one JSON object, last"
    )
    add_job_option(parser)
    parser.add_argument(
        "--window",
        type=duration,
        default=None,
        metavar="DURATION",
        help="also goodput and the top badput categories per window of the wall clock, "
        "cut every DURATION from its start (90s, 30m, 1h, 1.5h, 2d); the windows add up to "
        "the whole",
    )
    parser.add_argument(
        "--mtbf",
        type=duration,
        default=None,
        metavar="DURATION",
        help="the mean time between failures the checkpoint-interval advice assumes (12h, "
        "3d), instead of the one observed (which needs at least two failures)",
    )
    parser.add_argument(
        "--fail-under-goodput",
        type=percent,
        default=None,
        metavar="PCT",
        help="a gate for CI: exit 1, with one line on stderr after the report, when the "
        "goodput is under PCT %% of the wall clock (exit 2 when goodput is not computed)",
    )
