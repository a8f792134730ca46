"""``megatron-trace check``: is this trace whole, and does it obey the span lifecycle?

The rules are :mod:`megatron.trace.analysis.check`'s; this module prints its
notes and violations, one line each, then a summary line. Exit 1 on a violation.
"""

from __future__ import annotations

import argparse
from typing import Any

from megatron.trace.analysis.check import check_files
from megatron.trace.cli.options import add_command, add_job_option, clock, reading_on
from megatron.trace_format.errors import NoSpansError
from megatron.trace_format.words import counted

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    with reading_on(args) as (jobs, executor):
        result = check_files(args.files, clock(args), jobs, executor, args.job)
    trace = result.trace
    assert trace is not None
    if not trace.span_count:  # nothing to check is not a whole trace
        raise NoSpansError(args.files)
    for line in result.notes:
        print(line)
    for line in result.violations:
        print(line)
    print(
        f"{'FAILED' if result.violations else 'ok'}: {counted(trace.span_count, 'span')}, "
        f"{counted(len(trace.incarnations), 'incarnation')} on "
        f"{counted(len(trace.ranks), 'rank')}, {counted(len(result.violations), 'violation')}"
    )
    return 1 if result.violations else 0


def add_parser(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "check",
        "verify the span lifecycle's invariants (exit 1 on a violation)",
        # not __doc__, which python -OO strips; plain text, no markup
        "Check that the trace is whole and obeys the span lifecycle: one startup per "
        "incarnation, intervals indexed, ranged and linked in order, no duplicate or "
        "orphaned span, a resume at a saved iteration. Exit 1 with one line per violation; "
        "a killed incarnation or a torn write is a note, not a violation.",
        run,
        finding="a rule is violated",
    )
    add_job_option(parser)
