"""The page ``megatron-trace timeline`` writes: where a job's time went, self-contained HTML.

A Gantt chart, one lane per incarnation (and per rank when the files hold
several): the scheduler queue, the launch and startup phases, every
checkpoint interval, checkpoint loads and saves, evaluations, the gaps
between incarnations and how each incarnation ended (shut down, cut short by
SIGTERM, killed) with the progress each one lost. Hovering a bar shows the
span's name, duration, iteration range and attributes.

Drawn with plotly (the ``trace`` extra) and with plotly.js embedded in the
page, so it opens offline and can be mailed around. Per-step spans are not
drawn (a day-long job has millions). What is drawn is decided in
:mod:`megatron.trace.render.timeline.data`, how it looks in
:mod:`megatron.trace.render.timeline.page`; this module writes the page
(the command is :mod:`megatron.trace.cli.timeline`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

from megatron.trace.analysis.liveness import Clock
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.output import replacing
from megatron.trace.render.timeline.data import Bar, Timeline, collect
from megatron.trace.render.timeline.page import figure, page_pieces, render_html
from megatron.trace_format.errors import MissingExtraError, NoSpansError

__all__ = [
    "Bar",
    "Timeline",
    "collect",
    "figure",
    "render_html",
    "write_beside_trace",
    "write_page",
    "write_timeline",
]


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


def write_timeline(
    paths: Sequence[Path | str],
    output: Path,
    clock: Clock | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
    job: str | None = None,
) -> Timeline:
    """Draw the spans of ``paths`` as the timeline page at ``output``; returns what was drawn.

    Raises :class:`~megatron.trace_format.errors.MissingExtraError` without plotly,
    :class:`~megatron.trace_format.errors.NoSpansError` for files without a span, and
    the reader's errors for a missing or damaged file; ``output`` is then untouched.
    The files are read in ``jobs`` processes, or on ``executor`` (any
    ``concurrent.futures.Executor``: a Dask cluster's, say). Files that hold several jobs
    are drawn one job at a time: ``job`` names it
    (:func:`~megatron.trace.model.jobs.one_job`).
    """
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise MissingExtraError("timeline", "plotly") from None
    files = [Path(path) for path in paths]
    source = span_source(files)
    timeline = collect(source, [str(path) for path in files], clock, jobs, executor, job)
    if not timeline.lanes:
        raise NoSpansError(files)
    write_page(timeline, output)
    return timeline


def write_page(timeline: Timeline, output: Path) -> None:
    """Write the page beside ``output`` and rename it over, so a failure leaves no torn page
    (piece by piece: the bars' arrays are read from their temporary file as they are written,
    never held whole)."""
    pieces = page_pieces(timeline)
    with replacing(output, binary=True) as out:
        for piece in pieces:
            out.write(piece)
