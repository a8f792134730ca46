"""The Chrome trace-event JSON ``export --format chrome`` writes, span batch by span batch.

The Chrome trace-event format is what Perfetto UI and ``chrome://tracing``
open and what PyTorch profiler users already read, so a job's trace can be
looked at with nothing but a browser. The mapping:

* a process per incarnation and a thread per (incarnation, rank), named,
  with ids no importer reinterprets (:mod:`megatron.trace.render.export.tracks`);
* every span a complete event (``"ph": "X"``) on its lane's thread, so
  children nest under their parents by time; attributes, ids and status go
  to ``args``;
* every link a flow arrow from the linked span to the linking one
  (:mod:`megatron.trace.render.export.flows`): startup -> C0 -> C1 -> ... joins the
  per-interval traces;
* a lane still running (:mod:`megatron.trace.analysis.liveness`) says so in its
  thread's name ("rank 0 (running as of …)"), and ``otherData.incarnations``
  gives, per lane, how the incarnation ended (its cycle of an in-process restart,
  if it is one) and, when running, the time of
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
time themselves), a batch of spans encoded by ``msgspec`` at once (the
standard library's ``json`` without it).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from megatron.trace.analysis.liveness import utc_text
from megatron.trace.render.export.flows import FlowPlan
from megatron.trace.render.export.tracks import Tracks
from megatron.trace.render.lanes import Lane, LaneIndex
from megatron.trace.render.output import append_file

__all__ = ["ChromePart", "ChromeWriter", "micros"]

try:
    import msgspec
except ImportError:  # tox -e noextras runs without it
    msgspec = None  # type: ignore[assignment]


def micros(ns: int) -> str:
    """Integer nanoseconds as exact decimal microseconds ("12.345"), never through a float."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


_FRACTIONS = [b".%03d" % n for n in range(1000)]
# One span as a complete event: (name, type[, default]) in the order written, the one
# definition of both encoders' event (msgspec's struct, or the standard library's).
_COMPLETE_FIELDS: list[tuple[Any, ...]] = [
    ("ts", Any),
    ("dur", Any),
    ("name", str),
    ("pid", int),
    ("tid", int),
    ("args", dict),
    ("ph", str),
    ("cat", str),
    ("bind_id", int | None, None),
    ("flow_in", bool, False),
    ("flow_out", bool, False),
]
_REQUIRED = object()

if msgspec is not None:
    _encode = msgspec.json.Encoder().encode
    _Raw = msgspec.Raw

    def _exact(ns: int) -> Any:
        return _Raw(micros(ns).encode())

    def _exact_all(values: list[int]) -> list[Any]:
        """:func:`_exact` of each value (none negative), without a call per value."""
        fractions, raw = _FRACTIONS, _Raw
        return [raw(b"%d" % (ns // 1000) + fractions[ns % 1000]) for ns in values]

    # encoded field by field, in this order; the last three omitted when unset
    _Complete = msgspec.defstruct("_Complete", _COMPLETE_FIELDS, gc=False, omit_defaults=True)

    def _events_json(events: list[Any]) -> bytes:
        return _encode(events)[1:-1]

else:  # without msgspec (tox -e noextras runs this)

    class _Exact:
        """Exact microsecond text, written as the number it spells."""

        __slots__ = ("text",)

        def __init__(self, ns: int) -> None:
            self.text = micros(ns)

    def _exact(ns: int) -> Any:
        return _Exact(ns)

    def _exact_all(values: list[int]) -> list[Any]:
        return [_Exact(ns) for ns in values]

    _Complete = dataclasses.make_dataclass(  # type: ignore[misc]
        "_Complete",
        [
            (name, kind, dataclasses.field(default=default))
            if default is not _REQUIRED
            else (name, kind)
            for name, kind, default in (
                (*field, _REQUIRED) if len(field) == 2 else field for field in _COMPLETE_FIELDS
            )
        ],
    )

    def _as_dict(event: Any) -> dict[str, Any]:
        """The event's fields in order, those at their default left out (as msgspec does)."""
        out = {}
        for field in dataclasses.fields(event):
            value = getattr(event, field.name)
            if field.default is dataclasses.MISSING or value != field.default:
                out[field.name] = value
        return out

    def _event_json(event: Any) -> str:
        if isinstance(event, _Complete):
            event = _as_dict(event)
        exact = "".join(f'"{key}":{event[key].text},' for key in ("ts", "dur") if key in event)
        rest = {key: value for key, value in event.items() if key not in ("ts", "dur")}
        return "{" + exact + json.dumps(rest, separators=(",", ":"), default=str)[1:]

    def _events_json(events: list[Any]) -> bytes:
        return ",".join(map(_event_json, events)).encode()


def running_lanes(lanes: LaneIndex) -> dict[Lane, str]:
    """Lane -> what its name says when its incarnation is still running."""
    return {
        lanes.lane_of_incarnation(inc): f" (running as of {utc_text(inc.as_of_ns)})"
        for inc in lanes.trace.incarnations
        if inc.ended == "running" and inc.as_of_ns is not None
    }


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
    present: set[str] = field(default_factory=set)  # fallback-pair targets written
    finishes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class ChromeWriter:
    """Writes the events; one instance per output part (file of the input)."""

    def __init__(self, lanes: LaneIndex, flows: FlowPlan, origin: int) -> None:
        self.lanes = lanes
        self.tracks = Tracks(lanes)
        self.flows = flows
        self.origin = origin  # ns: the earliest start, rounded down to a whole second
        self.part = ChromePart()
        # every span a link touches, whichever way it is drawn
        self._endpoints = {*flows.bindings, *flows.starts, *flows.finishes}

    def header(self, out: IO[bytes]) -> int:
        """The document's start, the time origin, the metadata naming processes and threads."""
        when = datetime.datetime.fromtimestamp(self.origin // 1_000_000_000, datetime.timezone.utc)
        other = {
            "time_origin_unix_ns": str(self.origin),
            "time_origin_utc": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "time_unit": "ts and dur are microseconds after the time origin, exact to the ns",
        }
        other["incarnations"] = [
            {
                "incarnation": inc.index,
                "rank": inc.rank,
                "ended": inc.ended,
                "cycle": inc.cycle,
                "as_of": utc_text(inc.as_of_ns) if inc.as_of_ns is not None else None,
            }
            for inc in self.lanes.trace.incarnations
        ]
        running = running_lanes(self.lanes)
        events: list[dict[str, Any]] = []
        named: set[int] = set()
        for track in self.tracks:
            pid, tid = track.pid, track.tid
            if pid not in named:
                named.add(pid)
                events.append(
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": pid,
                        "args": {"name": track.process_name},
                    }
                )
                events.append(
                    {
                        "ph": "M",
                        "name": "process_sort_index",
                        "pid": pid,
                        "args": {"sort_index": pid},
                    }
                )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": track.thread_name + running.get(track.lane, "")},
                }
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": track.thread_sort_index},
                }
            )
        out.write(b'{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other).encode() + b",\n")
        out.write(b'"traceEvents": [\n')
        out.write(b",\n".join(_events_json([event]) for event in events))
        return len(events)

    def spans(self, out: IO[bytes], lane: Lane, spans: Sequence[Any]) -> None:
        """Complete events (and fallback flow starts) for spans of one lane."""
        track = self.tracks.of(lane)
        pid, tid, origin = track.pid, track.tid, self.origin
        starts = [span.start_time_unix_nano - origin for span in spans]  # the origin is earlier
        lengths = [span.end_time_unix_nano - span.start_time_unix_nano for span in spans]
        lengths = [length if length > 0 else 0 for length in lengths]
        events: list[Any] = [
            _Complete(ts, dur, span.name, pid, tid, _args(span), "X", "span")
            for span, ts, dur in zip(spans, _exact_all(starts), _exact_all(lengths), strict=True)
        ]
        flows = self.flows
        if flows.bindings or flows.starts:
            bindings, starts, finishes = flows.bindings, flows.starts, flows.finishes
            ends = self._endpoints
            for position in [i for i, span in enumerate(spans) if span.span_id in ends]:
                span = spans[position]
                span_id = span.span_id
                binding = bindings.get(span_id)
                if binding is not None:
                    event = events[position]
                    event.bind_id, event.flow_in, event.flow_out = (
                        binding.bind_id,
                        binding.flow_in,
                        binding.flow_out,
                    )
                if span_id in starts or span_id in finishes:
                    self._pairs(span, pid, tid, events)
        if events:
            out.write(b",\n" + _events_json(events))
            self.part.events += len(events)

    def _pairs(self, span: Any, pid: int, tid: int, events: list[Any]) -> None:
        """Links drawn as flow-event pairs (see render.flows): both ends at span starts."""
        ts = _exact(span.start_time_unix_nano - self.origin)
        for flow_id in self.flows.starts.get(span.span_id, ()):
            self.part.present.add(span.span_id)
            events.append(
                {
                    "ph": "s",
                    "name": "link",
                    "cat": "link",
                    "id": flow_id,
                    "ts": ts,
                    "pid": pid,
                    "tid": tid,
                }
            )
        for flow_id, target in self.flows.finishes.get(span.span_id, ()):
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

    def join(self, out: IO[bytes], parts: Iterable[ChromePart], files: Sequence[Path]) -> None:
        """The parts other writers wrote (a piece of the input each), in input order, each
        file appended once its part has come (``parts`` may still be being written)."""
        for _, path in zip(parts, files, strict=True):
            append_file(out, path)

    def footer(self, out: IO[bytes], parts: Sequence[ChromePart]) -> int:
        """The flow finishes whose start was written (a lost target draws no arrow), and the end."""
        present = set().union(*(part.present for part in parts))
        finishes = [event for part in parts for target, event in part.finishes if target in present]
        if finishes:
            out.write(b",\n" + _events_json(finishes))
        out.write(b"\n]}\n")
        return len(finishes)
