"""``megatron-trace export --format chrome``: a trace as Chrome trace-event JSON.

The Chrome trace-event format is what Perfetto UI and ``chrome://tracing``
open and what PyTorch profiler users already read, so a job's trace can be
looked at with nothing but a browser. The mapping:

* a process per incarnation and a thread per (incarnation, rank), named,
  with ids no importer reinterprets (:mod:`megatron.trace.tracks`);
* every span a complete event (``"ph": "X"``) on its lane's thread, so
  children nest under their parents by time; attributes, ids and status go
  to ``args``;
* every link a flow arrow from the linked span to the linking one
  (:mod:`megatron.trace.flows`): startup -> C0 -> C1 -> ... joins the
  per-interval traces;
* a lane still running (:mod:`megatron.trace.liveness`) says so in its
  thread's name ("rank 0 (running as of …)"), and ``otherData.incarnations``
  gives, per lane, how the incarnation ended and, when running, the time of
  its newest record.

Time: ``ts`` and ``dur`` are microseconds, as the format counts, written as
decimal text with exactly three fractional digits computed from the integer
nanoseconds, so every span keeps its nanosecond start and end and phases
that tile in nanoseconds still tile. They count from the **time origin**:
the earliest span start in the files, rounded down to a whole second, stated
in the file as ``otherData.time_origin_unix_ns`` (and as UTC text). Epoch
microseconds would not survive: near 1.8e15 a double, which is what viewers
parse numbers into, resolves a quarter of a microsecond, and Perfetto drops
the slices that rounding makes overlap. Relative to the origin a double
resolves a nanosecond for about 50 days of wall clock.

Events are written as the spans are read, in file order (the viewers sort by
time themselves). Two passes over the files keep memory independent of their
size: the first learns the lanes, the time origin and the links, the second
writes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from megatron.trace.command import add_command
from megatron.trace.flows import FlowPlan
from megatron.trace.lanes import LaneIndex
from megatron.trace.liveness import Clock, judge, utc_text
from megatron.trace.model import TraceBuilder
from megatron.trace.output import replacing
from megatron.trace.spans import SpanSource, TraceInputError, span_source
from megatron.trace.tracks import Tracks

__all__ = ["add_parser", "export_chrome", "run"]

FORMATS = ("chrome",)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``export`` on the ``megatron-trace`` command line."""
    parser = add_command(
        subparsers,
        "export",
        help="write the trace in another format (chrome: Perfetto / chrome://tracing)",
        description="Write trace files as Chrome trace-event JSON, for Perfetto UI "
        "(ui.perfetto.dev) and chrome://tracing: a process per incarnation, a thread per "
        "rank in it, spans as complete events (microseconds from a whole-second origin, "
        "nanosecond-exact), links as flow arrows.",
        run=run,
    )
    parser.add_argument("--format", choices=FORMATS, default="chrome", help="output format")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSON file to write")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``export`` for parsed arguments; returns the exit status."""
    files = ", ".join(map(str, args.files))
    try:
        events = export_chrome(
            span_source(args.files), args.output, args.files, Clock.from_args(args)
        )
    except TraceInputError as exc:
        if not str(exc).startswith(tuple(map(str, args.files))):
            exc = TraceInputError(f"{files}: {exc}")
        print(f"megatron-trace export: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # reading errors arrive as TraceInputError: this is the output
        print(f"megatron-trace export: error: cannot write {args.output}: {exc.strerror}",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"wrote {args.output} ({events} events); open it in https://ui.perfetto.dev")
    return 0


def export_chrome(
    source: SpanSource,
    output: Path,
    files: Sequence[Path | str] = (),
    clock: Clock | None = None,
) -> int:
    """Write the spans of ``source`` to ``output`` as Chrome trace JSON; returns the event count.

    ``files`` are the trace files behind ``source``, where the heartbeat is
    looked up; ``clock`` is what running is judged against (default: the
    system clock). The file is written beside ``output`` and renamed over it
    at the end, so a failure (a damaged input line) never leaves a
    half-written ``output``.
    """
    flows = FlowPlan()
    builder = TraceBuilder()
    earliest: int | None = None
    for span in flows.collect(source()):
        builder.add(span)
        if earliest is None or span["start_ns"] < earliest:
            earliest = span["start_ns"]
    if earliest is None:
        raise TraceInputError("no spans in the trace files")
    flows.plan()
    trace = builder.finish()
    judge(trace, files, clock or Clock.system())
    lanes = LaneIndex(trace)
    origin = earliest - earliest % 1_000_000_000
    with replacing(output) as out:
        return _write(out, origin, _events(source(), lanes, flows, origin), _endings(lanes))


def _events(
    spans: Iterable[dict[str, Any]], lanes: LaneIndex, flows: FlowPlan, origin: int
) -> Iterator[dict[str, Any]]:
    """The events; ``ts`` and ``dur`` as integer nanoseconds after ``origin`` (see _write)."""
    tracks = Tracks(lanes)
    running = {
        lanes.lane_of_incarnation(inc): inc.as_of_ns
        for inc in lanes.trace.incarnations
        if inc.ended == "running" and inc.as_of_ns is not None
    }
    named: set[int] = set()
    for track in tracks:
        pid, tid = track.pid, track.tid
        if pid not in named:
            named.add(pid)
            yield {"ph": "M", "name": "process_name", "pid": pid,
                   "args": {"name": track.process_name}}  # fmt: skip
            yield {"ph": "M", "name": "process_sort_index", "pid": pid,
                   "args": {"sort_index": pid}}  # fmt: skip
        thread_name = track.thread_name
        if track.lane in running:
            thread_name += f" (running as of {utc_text(running[track.lane])})"
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
               "args": {"name": thread_name}}  # fmt: skip
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
               "args": {"sort_index": track.thread_sort_index}}  # fmt: skip
    present: set[str] = set()
    finishes: list[tuple[str, dict[str, Any]]] = []
    for span in spans:
        track = tracks.of(lanes.lane(span))
        pid, tid = track.pid, track.tid
        start = span["start_ns"] - origin
        event = {
            "ph": "X",
            "name": span["name"],
            "cat": "span",
            "ts": start,
            "dur": max(span["end_ns"] - span["start_ns"], 0),
            "pid": pid,
            "tid": tid,
            "args": _args(span),
        }
        binding = flows.bindings.get(span["span_id"])
        if binding is not None:
            event.update(binding.attributes())
        yield event
        # Links drawn as flow-event pairs (see megatron.trace.flows): both ends at span starts.
        for flow_id in flows.starts.get(span["span_id"], ()):
            present.add(span["span_id"])
            yield {"ph": "s", "name": "link", "cat": "link", "id": flow_id,
                   "ts": start, "pid": pid, "tid": tid}  # fmt: skip
        for flow_id, target in flows.finishes.get(span["span_id"], ()):
            finish = {"ph": "f", "bp": "e", "name": "link", "cat": "link", "id": flow_id,
                      "ts": start, "pid": pid, "tid": tid}  # fmt: skip
            finishes.append((target, finish))
    for target, event in finishes:
        if target in present:  # its span was in the files: the arrow has both ends
            yield event


def _args(span: dict[str, Any]) -> dict[str, Any]:
    args = dict(span["attributes"])
    args["trace_id"] = span["trace_id"]
    args["span_id"] = span["span_id"]
    if span.get("parent_id"):
        args["parent_id"] = span["parent_id"]
    if span.get("status_code", "UNSET") != "UNSET":
        args["status"] = span["status_code"]
        if span.get("status_message"):
            args["status_message"] = span["status_message"]
    return args


def _micros(ns: int) -> str:
    """Integer nanoseconds as exact decimal microseconds ("12.345"), never through a float."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _encode(event: dict[str, Any]) -> str:
    """One event as JSON; ``ts`` and ``dur`` (ns) written as exact microsecond text."""
    exact = "".join(f'"{key}":{_micros(event.pop(key))},' for key in ("ts", "dur") if key in event)
    return "{" + exact + json.dumps(event, separators=(",", ":"), default=str)[1:]


def _endings(lanes: LaneIndex) -> list[dict[str, Any]]:
    """Per lane: how the incarnation ended and, when running, as of when."""
    return [
        {
            "incarnation": inc.index,
            "rank": inc.rank,
            "ended": inc.ended,
            "as_of": utc_text(inc.as_of_ns) if inc.as_of_ns is not None else None,
        }
        for inc in lanes.trace.incarnations
    ]


def _write(
    out: IO[str],
    origin: int,
    events: Iterable[dict[str, Any]],
    incarnations: list[dict[str, Any]] | None = None,
) -> int:
    """Stream ``events`` as ``{"traceEvents": [...]}``, one event per line."""
    when = datetime.datetime.fromtimestamp(origin // 1_000_000_000, datetime.timezone.utc)
    other: dict[str, Any] = {
        "time_origin_unix_ns": str(origin),
        "time_origin_utc": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "time_unit": "ts and dur are microseconds after the time origin, exact to the ns",
    }
    if incarnations is not None:
        other["incarnations"] = incarnations
    out.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other) + ",\n")
    out.write('"traceEvents": [\n')
    count = 0
    for event in events:
        if count:
            out.write(",\n")
        out.write(_encode(event))
        count += 1
    out.write("\n]}\n")
    return count
