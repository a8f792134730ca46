"""Read an ``export --format perfetto`` file back as Perfetto's trace processor would.

The packets are parsed with the protobuf classes PyPI's ``perfetto`` package
ships; interned names and track defaults are resolved per packet sequence;
then, per track, the events are sorted by time (equal times keep the file's
order, as the trace processor's sorter does) and a begin opens a slice on the
track's stack, an end closes the innermost. ``tests/browser`` checks the same
files in the real Perfetto; this runs everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent


@dataclass
class Slice:
    name: str
    ts: int
    dur: int
    depth: int
    track: str  # "incarnation N/rank R"
    args: dict[str, Any]
    flows: list[int]
    parent: Slice | None = field(default=None, repr=False)


def _value(annotation: Any) -> Any:
    kind = annotation.WhichOneof("value")
    return getattr(annotation, kind) if kind else None


def read_slices(path: Path) -> tuple[list[Slice], dict[int, str]]:
    """Every slice, and the track names by uuid ("incarnation N/rank R" for the lanes)."""
    trace = Trace.FromString(path.read_bytes())
    names: dict[int, str] = {}
    parents: dict[int, int] = {}
    state: dict[int, dict[str, Any]] = {}
    events: list[tuple[int, int, int, Any, dict[str, Any]]] = []  # track, ts, order, type, ...
    for order, packet in enumerate(trace.packet):
        if packet.HasField("track_descriptor"):
            descriptor = packet.track_descriptor
            names[descriptor.uuid] = descriptor.name
            if descriptor.HasField("parent_uuid"):
                parents[descriptor.uuid] = descriptor.parent_uuid
            continue
        if packet.HasField("clock_snapshot"):
            continue  # the clocks, not an event (read by clock_snapshot below)
        sequence = packet.trusted_packet_sequence_id
        if packet.sequence_flags & TracePacketFlags.CLEARED:
            state[sequence] = {"names": {}, "keys": {}, "track": None}
        seq = state[sequence]
        if packet.HasField("trace_packet_defaults"):
            seq["track"] = packet.trace_packet_defaults.track_event_defaults.track_uuid
        if packet.HasField("interned_data"):
            for entry in packet.interned_data.event_names:
                seq["names"][entry.iid] = entry.name
            for entry in packet.interned_data.debug_annotation_names:
                seq["keys"][entry.iid] = entry.name
        if not packet.HasField("track_event"):
            continue
        assert packet.sequence_flags & TracePacketFlags.NEEDS_STATE
        event = packet.track_event
        track = event.track_uuid if event.HasField("track_uuid") else seq["track"]
        detail = {
            "name": seq["names"][event.name_iid] if event.HasField("name_iid") else event.name,
            "args": {seq["keys"][a.name_iid]: _value(a) for a in event.debug_annotations},
            "flows": list(event.flow_ids),
        }
        events.append((track, packet.timestamp, order, event.type, detail))
    lanes = {
        uuid: f"{names[parents[uuid]]}/{name}"
        for uuid, name in names.items()
        if uuid in parents and parents[uuid] in parents
    }
    slices: list[Slice] = []
    stacks: dict[int, list[Slice]] = {}
    for track, ts, _, kind, detail in sorted(events, key=lambda e: (e[1], e[2])):
        stack = stacks.setdefault(track, [])
        if kind == TrackEvent.TYPE_SLICE_BEGIN:
            opened = Slice(
                detail["name"],
                ts,
                -1,
                len(stack),
                lanes[track],
                detail["args"],
                detail["flows"],
                stack[-1] if stack else None,
            )
            stack.append(opened)
            slices.append(opened)
        else:
            assert kind == TrackEvent.TYPE_SLICE_END and stack, f"unmatched end at {ts}"
            closed = stack.pop()
            closed.dur = ts - closed.ts
    assert not any(stacks.values()), "slices left open"
    return slices, lanes


class TracePacketFlags:
    CLEARED = 1
    NEEDS_STATE = 2


def clock_snapshots(path: Path) -> list[dict[int, int]]:
    """Each clock snapshot of the trace: clock id -> its timestamp at the snapshot."""
    trace = Trace.FromString(path.read_bytes())
    return [
        {clock.clock_id: clock.timestamp for clock in packet.clock_snapshot.clocks}
        for packet in trace.packet
        if packet.HasField("clock_snapshot")
    ]
