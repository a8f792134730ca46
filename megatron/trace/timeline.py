"""``megatron-trace timeline``: one self-contained HTML page that shows where a job's time went.

A Gantt chart, one lane per incarnation (and per rank when the files hold
several): the scheduler queue, the launch and startup phases, every
checkpoint interval, checkpoint loads and saves, evaluations, the gaps
between incarnations and how each incarnation ended (shut down, cut short by
SIGTERM, killed) with the progress each one lost. Hovering a bar shows the
span's name, duration, iteration range and attributes.

Drawn with plotly (the ``trace`` extra) and with plotly.js embedded in the
page, so it opens offline and can be mailed around. Per-step spans are not
drawn (a day-long job has millions). What is drawn is decided in
:mod:`megatron.trace.timeline_data`, how it looks in
:mod:`megatron.trace.timeline_page`; this module is the command.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from megatron.trace.command import add_command
from megatron.trace.liveness import Clock
from megatron.trace.output import replacing
from megatron.trace.spans import TraceInputError, span_source
from megatron.trace.timeline_data import Bar, Timeline, collect
from megatron.trace.timeline_page import figure, page_pieces, render_html

__all__ = [
    "PLOTLY_MISSING",
    "Bar",
    "Timeline",
    "add_parser",
    "collect",
    "figure",
    "render_html",
    "run",
    "write_beside_trace",
    "write_page",
]

PLOTLY_MISSING = (
    "megatron-trace timeline: error: plotly is not installed; "
    "pip install 'megatron-telemetry-spans[trace]'"
)


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
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``timeline`` for parsed arguments; returns the exit status."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        print(PLOTLY_MISSING, file=sys.stderr)
        return 2
    try:
        timeline = collect(
            span_source(args.files),
            [str(path) for path in args.files],
            Clock.from_args(args),
            args.jobs,
        )
    except TraceInputError as exc:
        print(f"megatron-trace timeline: error: {exc}", file=sys.stderr)
        return 2
    if not timeline.lanes:
        files = ", ".join(map(str, args.files))
        print(f"megatron-trace timeline: error: no spans in {files}", file=sys.stderr)
        return 2
    try:
        write_page(timeline, args.output)
    except OSError as exc:
        print(
            f"megatron-trace timeline: error: cannot write {args.output}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
    print(f"timeline written to {args.output}")
    return 0


def write_beside_trace(trace: Path | None) -> Path | None:
    """The end of ``tox -e demo``: draw the run's trace as ``timeline.html`` beside it.

    ``trace`` is the span file the run wrote (``None`` when it wrote none:
    telemetry off, or another exporter than ``jsonl``). Best effort by
    design: whatever goes wrong (plotly not installed, an unreadable file)
    is one line on stdout, never an exception, so it cannot change how the
    training run ends. Returns the page's path.
    """
    try:
        if os.environ.get("RANK", "0") != "0":
            return None  # one page per job, from the first rank's launcher
        if trace is None or not trace.is_file():
            return None
        try:
            import plotly  # noqa: F401
        except ImportError:
            print("timeline: not drawn; pip install 'megatron-telemetry-spans[trace]'", flush=True)
            return None
        output = trace.with_name("timeline.html")
        # read in this process: a training process forks no readers on its way out
        write_page(collect(span_source([trace]), [str(trace)], jobs=1), output)
    except Exception as exc:  # noqa: BLE001 -- a picture must never end a training run
        print(f"timeline: not drawn: {exc}", flush=True)
        return None
    print(f"timeline: {output}", flush=True)
    return output


def write_page(timeline: Timeline, output: Path) -> None:
    """Write the page beside ``output`` and rename it over, so a failure leaves no torn page
    (piece by piece: the bars' arrays are read from their temporary file as they are written,
    never held whole)."""
    pieces = page_pieces(timeline)
    with replacing(output, binary=True) as out:
        for piece in pieces:
            out.write(piece)
