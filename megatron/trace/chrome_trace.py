"""The Chrome trace-event JSON ``export --format chrome`` writes, span batch by span batch.

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
time themselves), a batch of spans encoded by ``msgspec`` at once (the
standard library's ``json`` without it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from megatron.trace.lanes import Lane, LaneIndex

__all__ = ["ChromePart", "ChromeWriter"]

try:
    import msgspec
except ImportError:  # pragma: no cover - the fallback's own test runs without it
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    _encode = msgspec.json.Encoder().encode

    class _Complete(msgspec.Struct, gc=False):
        """One span as a complete event (encoded field by field, in this order)."""

        name: str
        ts: float
        dur: float
        pid: int
        tid: int
        args: dict[str, Any]
        ph: str = "X"
        cat: str = "span"

    def _events_json(events: list[Any]) -> bytes:
        return _encode(events)[1:-1]
else:  # pragma: no cover

    class _Complete:  # type: ignore[no-redef]
        __slots__ = ("args", "dur", "name", "pid", "tid", "ts")

        def __init__(self, name, ts, dur, pid, tid, args):
            self.name, self.ts, self.dur, self.pid, self.tid, self.args = (
                name,
                ts,
                dur,
                pid,
                tid,
                args,
            )

    def _default(value: Any) -> Any:
        if isinstance(value, _Complete):
            return {
                "ph": "X",
                "name": value.name,
                "cat": "span",
                "ts": value.ts,
                "dur": value.dur,
                "pid": value.pid,
                "tid": value.tid,
                "args": value.args,
            }
        return str(value)

    def _events_json(events: list[Any]) -> bytes:
        return json.dumps(events, separators=(",", ":"), default=_default)[1:-1].encode()


def _args(span: Any) -> dict[str, Any]:
    args = span.attribute_dict() if span.has_attributes() else {}
    args["trace_id"] = span.trace_id
    args["span_id"] = span.span_id
    if span.parent_span_id:
        args["parent_id"] = span.parent_span_id
    if span.status:  # ``{}`` (UNSET) is the usual status
        code = span.status_code()
        if code != "UNSET":
            args["status"] = code
            message = span.status_message()
            if message:
                args["status_message"] = message
    return args


@dataclass
class ChromePart:
    """What writing one file's spans produced: counts, and flow finishes held back."""

    events: int = 0
    present: set[str] = field(default_factory=set)  # link targets written
    finishes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class ChromeWriter:
    """Writes the events; one instance per output part (file of the input)."""

    def __init__(
        self,
        lanes: LaneIndex,
        flows_out: dict[str, list[int]],
        flows_in: dict[str, list[tuple[int, str]]],
    ) -> None:
        self.lanes = lanes
        self.flows_out = flows_out  # linked-to span id -> flow ids
        self.flows_in = flows_in  # linking span id -> (flow id, linked-to span id)
        self.part = ChromePart()

    def header(self, out: IO[bytes]) -> int:
        """The document's start and the metadata naming processes and threads."""
        events = []
        for lane in self.lanes.lanes():
            pid, tid = lane.incarnation + 1, self.lanes.thread_id(lane.rank)
            name = f"incarnation {lane.incarnation}"
            events += [
                {"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": name}},
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": pid},
                },
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": f"rank {lane.rank}"},
                },
            ]
        out.write(b'{"displayTimeUnit": "ms", "traceEvents": [\n')
        out.write(b",\n".join(_events_json([event]) for event in events))
        return len(events)

    def spans(self, out: IO[bytes], lane: Lane, spans: Sequence[Any]) -> None:
        """Complete events (and flow starts) for spans of one lane."""
        pid, tid = lane.incarnation + 1, self.lanes.thread_id(lane.rank)
        events: list[Any] = [
            _Complete(
                span.name,
                span.start_time_unix_nano / 1000,
                (span.end_time_unix_nano - span.start_time_unix_nano) / 1000,
                pid,
                tid,
                _args(span),
            )
            for span in spans
        ]
        for event in events:
            if event.dur < 0:
                event.dur = 0.0
        flows_out, flows_in = self.flows_out, self.flows_in
        if flows_out or flows_in:
            for span in spans:
                if span.span_id in flows_out:
                    self._flow_starts(span, pid, tid, events)
                if span.span_id in flows_in:
                    self._flow_finishes(span, pid, tid)
        if events:
            out.write(b",\n" + _events_json(events))
            self.part.events += len(events)

    def _flow_starts(self, span: Any, pid: int, tid: int, events: list[dict[str, Any]]) -> None:
        # 1 µs before the linked span ends: a viewer binds the arrow to the slice open then
        tail = max(span.end_time_unix_nano - 1000, span.start_time_unix_nano) / 1000
        self.part.present.add(span.span_id)
        for flow_id in self.flows_out[span.span_id]:
            events.append(
                {
                    "ph": "s",
                    "name": "link",
                    "cat": "link",
                    "id": flow_id,
                    "ts": tail,
                    "pid": pid,
                    "tid": tid,
                }
            )

    def _flow_finishes(self, span: Any, pid: int, tid: int) -> None:
        ts = span.start_time_unix_nano / 1000
        for flow_id, target in self.flows_in[span.span_id]:
            self.part.finishes.append(
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

    def finish_part(self, out: IO[bytes]) -> None:
        """The end of one input file (every event is already written)."""

    def footer(self, out: IO[bytes], parts: Sequence[ChromePart]) -> int:
        """The flow finishes whose start was written (a lost target draws no arrow), and the end."""
        present = set().union(*(part.present for part in parts))
        finishes = [event for part in parts for target, event in part.finishes if target in present]
        if finishes:
            out.write(b",\n" + _events_json(finishes))
        out.write(b"\n]}\n")
        return len(finishes)
