"""``megatron-trace export --format chrome``: a trace as Chrome trace-event JSON.

The Chrome trace-event format is what Perfetto UI and ``chrome://tracing``
open and what PyTorch profiler users already read, so a job's trace can be
looked at with nothing but a browser. The mapping:

* a process (``pid`` = incarnation + 1) per incarnation, named by
  ``process_name`` metadata ("incarnation 0", numbered as ``check`` and
  ``report`` number them);
* a thread (``tid``) per rank, named by ``thread_name`` metadata;
* every span a complete event (``"ph": "X"``, ``ts``/``dur`` in microseconds),
  so children nest under their parents by time on the rank's thread;
  attributes, ids and status go to ``args``;
* every link a flow (``"ph": "s"`` on the linked span, ``"ph": "f"`` with
  ``"bp": "e"`` on the linking one, same ``id``): the arrows startup → C0 →
  C1 → … that join the per-interval traces.

Events are written as the spans are read, in file order (the viewers sort by
time themselves). Two passes over the files keep memory independent of their
size: the first learns the lanes and which spans are link targets, the second
writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from megatron.trace.command import add_command
from megatron.trace.lanes import LaneIndex
from megatron.trace.model import TraceBuilder
from megatron.trace.output import replacing
from megatron.trace.spans import SpanSource, TraceInputError, span_source

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
        "rank, spans as complete events, links as flow arrows.",
        run=run,
    )
    parser.add_argument("--format", choices=FORMATS, default="chrome", help="output format")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSON file to write")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``export`` for parsed arguments; returns the exit status."""
    files = ", ".join(map(str, args.files))
    try:
        events = export_chrome(span_source(args.files), args.output)
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


def export_chrome(source: SpanSource, output: Path) -> int:
    """Write the spans of ``source`` to ``output`` as Chrome trace JSON; returns the event count.

    The file is written beside ``output`` and renamed over it at the end, so a
    failure (a damaged input line) never leaves a half-written ``output``.
    """
    links = _Links()
    builder = TraceBuilder()
    for span in links.collect(source()):
        builder.add(span)
    lanes = LaneIndex(builder.finish())
    if not builder.span_count:
        raise TraceInputError("no spans in the trace files")
    with replacing(output) as out:
        return _write(out, _events(source(), lanes, links))


class _Links:
    """Flow ids for the links, learnt in the first pass; O(links) memory, not O(spans).

    A flow's start (``s``) is written with the linked-to span, its finish
    (``f``) with the linking span. Finishes are held back until the end, and
    dropped when their linked-to span never appeared (its trace was lost), so
    every written ``f`` has its ``s``.

    The start sits 1 µs before the linked span ends and the finish where the
    linking span starts: a viewer binds each to the slice open at that
    moment, and the arrow runs forward in time, C(k)'s end to C(k+1)'s start.
    """

    def __init__(self) -> None:
        self.out: dict[str, list[int]] = {}  # linked-to span id -> flow ids
        self.into: dict[str, list[tuple[int, str]]] = {}  # linking span id -> (flow id, target)
        self._count = 0

    def collect(self, spans: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for span in spans:
            for _, target in span["links"]:
                self._count += 1
                self.out.setdefault(target, []).append(self._count)
                self.into.setdefault(span["span_id"], []).append((self._count, target))
            yield span


def _events(
    spans: Iterable[dict[str, Any]], lanes: LaneIndex, links: _Links
) -> Iterator[dict[str, Any]]:
    for lane in lanes.lanes():
        pid, tid = lane.incarnation + 1, lanes.thread_id(lane.rank)
        name = f"incarnation {lane.incarnation}"
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": name}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": tid,
               "args": {"sort_index": pid}}  # fmt: skip
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
               "args": {"name": f"rank {lane.rank}"}}  # fmt: skip
    present: set[str] = set()
    finishes: list[tuple[str, dict[str, Any]]] = []
    for span in spans:
        lane = lanes.lane(span)
        pid, tid = lane.incarnation + 1, lanes.thread_id(lane.rank)
        ts = span["start_ns"] / 1000
        yield {
            "ph": "X",
            "name": span["name"],
            "cat": "span",
            "ts": ts,
            "dur": max(span["end_ns"] - span["start_ns"], 0) / 1000,
            "pid": pid,
            "tid": tid,
            "args": _args(span),
        }
        tail = max(span["end_ns"] - 1000, span["start_ns"]) / 1000
        for flow_id in links.out.get(span["span_id"], ()):
            present.add(span["span_id"])
            yield {"ph": "s", "name": "link", "cat": "link", "id": flow_id,
                   "ts": tail, "pid": pid, "tid": tid}  # fmt: skip
        for flow_id, target in links.into.get(span["span_id"], ()):
            finishes.append(
                (
                    target,
                    {
                        "ph": "f",
                        "bp": "e",
                        "name": "link",
                        "cat": "link",
                        "id": flow_id,
                        "ts": ts,
                        "pid": pid,
                        "tid": tid,
                    },
                )
            )
    for target, event in finishes:
        if target in present:
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


def _write(out: IO[str], events: Iterable[dict[str, Any]]) -> int:
    """Stream ``events`` as ``{"traceEvents": [...]}``, one event per line."""
    out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
    count = 0
    for event in events:
        if count:
            out.write(",\n")
        out.write(json.dumps(event, separators=(",", ":"), default=str))
        count += 1
    out.write("\n]}\n")
    return count
