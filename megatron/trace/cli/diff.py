"""``megatron-trace diff``: two runs side by side, each figure with its delta (B - A).

Each run is one trace file (``diff A.jsonl B.jsonl``) or a set of rank files
(``diff --a r0.jsonl --a r1.jsonl --b s0.jsonl --b s1.jsonl``; the two forms
mix: ``diff A.jsonl --b s0.jsonl --b s1.jsonl``). Each side is read and
accounted as ``report`` would (:func:`~megatron.trace.analysis.goodput.build_report`);
:mod:`megatron.trace.analysis.diff` sets the figures side by side and
:mod:`megatron.trace.render.text.diff` lays them out. ``--fail-if-slower PCT``
is a gate for CI (:mod:`megatron.trace.analysis.gates`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from megatron.trace.analysis.diff import build_diff
from megatron.trace.analysis.gates import slower_gate
from megatron.trace.analysis.goodput import build_report
from megatron.trace.analysis.liveness import judge
from megatron.trace.cli.options import (
    add_command,
    add_job_option,
    answer,
    clock,
    percent,
    reading_on,
)
from megatron.trace.model.builder import load_trace
from megatron.trace.model.jobs import one_job
from megatron.trace.render.text.diff import format_diff
from megatron.trace_format.errors import NoSpansError, TraceInputError

__all__ = ["add_parser", "run", "sides"]

_USAGE = (
    "diff compares two runs: A B (a trace file each), or --a FILE ... --b FILE ... "
    "(a set of rank files each; a side given by --a or --b takes no positional file)"
)


def sides(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """A's files and B's: each ``--a`` / ``--b`` set, else the next positional file."""
    from megatron.trace.cli.folders import expand

    positional = list(args.files)
    chosen = []
    for given in (args.a, args.b):
        if given:
            chosen.append(expand(given, "diff"))
        elif positional:
            chosen.append(expand([positional.pop(0)], "diff"))  # a job's folder: one side
        else:
            raise TraceInputError(f"{_USAGE}; got too few files")
    if positional:
        raise TraceInputError(f"{_USAGE}; got more: {', '.join(map(str, positional))}")
    return chosen[0], chosen[1]


def run(args: argparse.Namespace) -> int:
    a_files, b_files = sides(args)
    with reading_on(args) as (jobs, executor):
        traces = [load_trace(files, jobs, executor) for files in (a_files, b_files)]
    runs = []
    for files, trace in zip((a_files, b_files), traces, strict=True):
        if not trace.ranks:
            raise NoSpansError(files)
        trace = one_job(trace, args.job, ", ".join(map(str, files)))
        runs.append((files, trace, build_report(trace, judge(trace, files, clock(args)))))
    diff = build_diff(runs[0], runs[1])
    # judged before printing, so a gate that cannot judge (exit 2) prints nothing
    bound = args.fail_if_slower
    gate = slower_gate(diff, bound) if bound is not None else None
    return answer("diff", format_diff(diff), diff, args.json, gate)


def add_parser(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "diff",
        "two runs side by side: goodput, badput, iteration time, each with its delta",
        # not __doc__, which python -OO strips; plain text, no markup
        "Compare run B with run A: wall clock, goodput and every badput category (seconds, "
        "per cent of the wall clock, seconds per iteration of progress, so runs of different "
        "lengths compare), iteration time median and p90, startup phases and stragglers, "
        "each with B - A. Each run is one trace file (diff A B) or a set of rank files "
        "(--a FILE repeated, --b FILE repeated).",
        run,
        finding="B's median iteration time is over --fail-if-slower",
        gate=True,
        files=False,
    )
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        metavar="FILE",
        help="run A's trace file, then run B's (for a side not given by --a or --b)",
    )
    parser.add_argument(
        "--a",
        action="append",
        type=Path,
        metavar="FILE",
        help="one of run A's files (repeat for each rank's file)",
    )
    parser.add_argument(
        "--b",
        action="append",
        type=Path,
        metavar="FILE",
        help="one of run B's files (repeat for each rank's file)",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the diff as one JSON object, last"
    )
    add_job_option(parser)
    parser.add_argument(
        "--fail-if-slower",
        type=percent,
        default=None,
        metavar="PCT",
        help="a gate for CI: exit 1, with one line on stderr after the diff, when B's median "
        "iteration time is more than PCT %% above A's (exit 2 when either is not computed)",
    )
