"""Perfetto's native protobuf trace, as ``export --format perfetto`` writes it.

Perfetto UI reads JSON through a legacy, best-effort importer that needs 2-4
times the file's size in tab memory; its own format is a protobuf ``Trace``
of ``TracePacket`` s, which it loads whole and which is a fraction of the
size. The mapping (``TrackEvent``):

* a track per incarnation and rank ("rank R"), under a track per incarnation
  ("incarnation N", numbered as ``check`` and ``report`` number them), under
  one root track: plain named tracks, so no pid or tid is reinterpreted;
* every span a slice: a ``TYPE_SLICE_BEGIN`` packet at its start and a
  ``TYPE_SLICE_END`` packet at its end, nanosecond timestamps as written;
  children nest under their parents by time; attributes, ids and status are
  debug annotations (the Chrome export's ``args``);
* every link a flow (``flow_ids`` on both slices' begin events), so the
  arrows startup → C0 → C1 … join the per-interval traces.

The timestamps are the spans' own Unix-epoch nanoseconds, so Perfetto UI's
"Realtime (UTC)" timestamp format shows the wall clock as it is. No clock
snapshot is written: tried, it changed no time the UI shows and added a
"System / Clock Snapshots" track that kept the trace's tracks folded on open.

Each track is its own packet sequence, with the track as its default and
the event names and annotation keys interned (written once, referred to by
number), so a per-step span costs about 100 bytes.

Packet order: the trace processor sorts events by time and keeps the file's
order among equal timestamps, and an end closes the innermost open slice.
So where timestamps tie (backdated phases that tile exactly, a child that
starts at its parent's nanosecond, a zero-length span between two phases)
the order must be the tree's: a slice's begin, its children's slices, its
end. The file's order (children end, and are written, before their parents)
is not that. A track's spans are therefore held until their root span arrives (its
subtree is then complete), and a subtree is written sorted when any of its
timestamps tie; a track holding more than :data:`MAX_HELD` spans is written
as it stands.

The structural packets (track descriptors) are built with the protobuf
classes of PyPI's ``perfetto`` package; the per-span packets, millions of
them, are encoded here (building protobuf's Python objects for each would
dominate the export), and the tests parse them back with those classes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from megatron.trace.render.export.chrome import running_lanes
from megatron.trace.render.lanes import Lane, LaneIndex
from megatron.trace.render.output import append_file

__all__ = ["MAX_HELD", "PerfettoPart", "PerfettoWriter", "flow_fields", "varint", "varints"]

#: Spans a track holds back at most before writing them (see the module docstring).
MAX_HELD = 50_000
_ROOT_UUID = 1

_SMALL = [bytes([n]) for n in range(128)]
_TWO = [bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(1 << 14)]  # 128 .. 16383
# 14 bits as two varint bytes that both say "more follows": four of these and a last
# byte spell any integer of 57 to 63 bits, which every epoch-nanosecond time is.
_PAIR = [bytes([(n & 0x7F) | 0x80, (n >> 7) | 0x80]) for n in range(1 << 14)]
_NINE_BYTES = range(1 << 56, 1 << 63)


def varint(value: int) -> bytes:
    """A protobuf base-128 varint of a non-negative int (a negative int64: its 10-byte form)."""
    if value < 0x4000:
        if value >= 0x80:
            return _TWO[value]
        if value >= 0:
            return _SMALL[value]
        value += 1 << 64
    if value in _NINE_BYTES:
        return (
            _PAIR[value & 0x3FFF]
            + _PAIR[(value >> 14) & 0x3FFF]
            + _PAIR[(value >> 28) & 0x3FFF]
            + _PAIR[(value >> 42) & 0x3FFF]
            + _SMALL[value >> 56]
        )
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varints(values: Sequence[int]) -> list[bytes]:
    """:func:`varint` of each value; epoch-nanosecond times (9 bytes each) all at once."""
    if len(values) < 8 or min(values) < (1 << 56) or max(values) >= (1 << 63):
        return [varint(value) for value in values]
    array = np.array(values, dtype=np.uint64)
    groups = np.empty((len(values), 9), dtype=np.uint8)
    for k in range(8):
        groups[:, k] = ((array >> np.uint64(7 * k)) & np.uint64(0x7F)) | np.uint64(0x80)
    groups[:, 8] = array >> np.uint64(56)
    encoded = groups.tobytes()
    return [encoded[i : i + 9] for i in range(0, len(encoded), 9)]


def _field(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


_TAGS = [_field(number, 2) for number in range(128)]  # length-delimited field tags


def _length_delimited(number: int, payload: bytes) -> bytes:
    size = len(payload)
    return _TAGS[number] + (_SMALL[size] if size < 0x80 else varint(size)) + payload


# Field numbers of perfetto/trace/trace_packet.proto and track_event/*.proto.
_TRACE_PACKET = 1  # Trace.packet
_TIMESTAMP = _field(8, 0)
_SEQUENCE_ID = _field(10, 0)
_SEQUENCE_FLAGS = _field(13, 0)
_TRACK_EVENT = 11
_INTERNED_DATA = 12
_DEFAULTS = 59
_SEQ_CLEARED, _SEQ_NEEDS_STATE = 1, 2
_BEGIN = _field(9, 0) + varint(1)  # TrackEvent.type = TYPE_SLICE_BEGIN
_END = _field(9, 0) + varint(2)  # TYPE_SLICE_END
_NAME_IID = _field(10, 0)
_ANNOTATION = 4  # TrackEvent.debug_annotations
_FLOW_ID = _field(47, 1)  # repeated fixed64
_ANN_NAME_IID = _field(1, 0)
_ANN_BOOL = _field(2, 0)
_ANN_INT = _field(4, 0)
_ANN_DOUBLE = _field(5, 1)
_ANN_STRING = 6
_END_EVENT = _length_delimited(_TRACK_EVENT, _END)
_TRACK_EVENT_TAG = _TAGS[_TRACK_EVENT]
_PACKET_TAG = _TAGS[_TRACE_PACKET]
_ANNOTATION_TAG = _TAGS[_ANNOTATION]
_pack_double = struct.Struct("<d").pack


def _annotation_value(value: Any) -> bytes:
    kind = type(value)
    if kind is str:
        return _length_delimited(_ANN_STRING, value.encode("utf-8", "surrogatepass"))
    if kind is bool:
        return _ANN_BOOL + (b"\x01" if value else b"\x00")
    if kind is int and -(1 << 63) <= value < (1 << 63):
        return _ANN_INT + varint(value)
    if kind is float:
        return _ANN_DOUBLE + struct.pack("<d", value)
    return _length_delimited(_ANN_STRING, json.dumps(value, default=str).encode())


@dataclass
class PerfettoPart:
    """What writing one piece of the input produced: the event count, and, when pieces are
    written in parallel, the spans of each track the piece could not place on its own.

    ``heads``: lane -> (preamble, spans, closed): the spans before the track's first
    root span in the piece, and that root; their subtree may have begun in the
    pieces before. ``closed``: that root arrived (else the piece held no root for
    the track, and these spans join the next piece's). ``tails``: lane ->
    (preamble, spans): the spans still held at the piece's end, whose root is in
    a later piece. The preambles make the spans' packet sequences readable
    wherever they are written. :meth:`PerfettoWriter.join` writes both where
    they belong.
    """

    events: int = 0
    heads: dict[Any, tuple[bytes, list[Any], bool]] = field(default_factory=dict)
    tails: dict[Any, tuple[bytes, list[Any]]] = field(default_factory=dict)


#: A span held back: start, end, its begin and end packets (framed as ``Trace.packet``
#: fields), its id and its parent's.
_Held = tuple[int, int, bytes, bytes, str, str]


class _Sequence:
    """One track's packet sequence: its id, interned names, and the spans held back."""

    __slots__ = (
        "_id_heads",
        "annotation_iids",
        "end_tail",
        "head",
        "held",
        "id",
        "is_head",
        "name_iids",
        "new_annotations",
        "new_names",
        "started",
        "uuid",
    )

    def __init__(self, sequence_id: int, uuid: int, is_head: bool = False) -> None:
        self.id = sequence_id
        self.is_head = is_head
        self.uuid = uuid
        self.name_iids: dict[str, bytes] = {}  # name -> encoded name_iid field
        self.annotation_iids: dict[str, bytes] = {}  # key -> encoded DebugAnnotation.name_iid
        self.new_names: list[tuple[int, str]] = []
        self.new_annotations: list[tuple[int, str]] = []
        self.held: list[_Held] = []
        self.started = False
        self.head = _SEQUENCE_ID + varint(sequence_id) + _SEQUENCE_FLAGS + varint(_SEQ_NEEDS_STATE)
        self.end_tail = self.head + _END_EVENT
        # the whole annotation but the value, for the ids at their usual length
        self._id_heads = {
            key: _TAGS[_ANNOTATION]
            + varint(len(self.key_iid(key)) + 2 + size)
            + self.key_iid(key)
            + _TAGS[_ANN_STRING]
            + varint(size)
            for key, size in (("trace_id", 32), ("span_id", 16), ("parent_id", 16))
        }

    def intern_name(self, name: str) -> bytes:
        iid = len(self.name_iids) + 1
        encoded = self.name_iids[name] = _NAME_IID + varint(iid)
        self.new_names.append((iid, name))
        return encoded

    def key_iid(self, key: str) -> bytes:
        encoded = self.annotation_iids.get(key)
        if encoded is None:
            iid = len(self.annotation_iids) + 1
            encoded = self.annotation_iids[key] = _ANN_NAME_IID + varint(iid)
            self.new_annotations.append((iid, key))
        return encoded

    @property
    def id_heads(self) -> tuple[bytes, bytes, bytes]:
        """Each id annotation but its value, for ids of the usual 32 and 16 bytes."""
        return self._id_heads["trace_id"], self._id_heads["span_id"], self._id_heads["parent_id"]

    def ids(self, span: Any) -> bytes:
        """The trace, span and parent ids as annotations (the Chrome export's args)."""
        encoded = self.annotation("trace_id", span.trace_id)
        encoded += self.annotation("span_id", span.span_id)
        if span.parent_span_id:
            encoded += self.annotation("parent_id", span.parent_span_id)
        return encoded

    def annotation(self, key: str, value: Any) -> bytes:
        return _length_delimited(_ANNOTATION, self.key_iid(key) + _annotation_value(value))

    def annotations(self, attributes: dict[str, Any]) -> bytes:
        """Every attribute as an annotation (the usual ints and floats without a call)."""
        iids = self.annotation_iids
        encoded = []
        for key, value in attributes.items():
            body = iids.get(key) or self.key_iid(key)
            kind = type(value)
            if kind is float:
                body += _ANN_DOUBLE + _pack_double(value)
            elif kind is int and 0 <= value < 0x4000:
                body += _ANN_INT + (_SMALL[value] if value < 0x80 else _TWO[value])
            else:
                body += _annotation_value(value)
            size = len(body)
            encoded.append(_ANNOTATION_TAG + (_SMALL[size] if size < 0x80 else varint(size)) + body)
        return b"".join(encoded)

    def status(self, span: Any) -> bytes:
        code = span.status_code()
        if code == "UNSET":
            return b""
        encoded = self.annotation("status", code)
        message = span.status_message()
        return encoded + self.annotation("status_message", message) if message else encoded


def flow_fields(links: Iterable[tuple[str, str]]) -> dict[str, bytes]:
    """Each link a flow: span id -> the encoded ``flow_ids`` of its begin event, a flow
    id per link it is an end of (the linking span and the linked-to span), numbered
    from 1 in ``links``' order.

    Built once per export and shared by its parts, as what the export keeps of
    its links (about one per checkpoint interval and rank): about 160 bytes a
    link with its span ids, traced at 10M spans, where the list of the links
    the plan kept beside each part's map of flow-id lists held several times
    that."""
    fields: dict[str, bytes] = {}
    for flow, (linking, target) in enumerate(links, start=1):
        encoded = _FLOW_ID + struct.pack("<Q", flow)
        fields[target] = fields.get(target, b"") + encoded
        fields[linking] = fields.get(linking, b"") + encoded
    return fields


class PerfettoWriter:
    """Writes the packets; one instance per output part (file of the input)."""

    def __init__(
        self,
        lanes: LaneIndex,
        flows: Mapping[str, bytes],
        part: int = 0,
        seams: bool = False,
    ) -> None:
        self.lanes = lanes
        self.order = {lane: position for position, lane in enumerate(lanes.lanes())}
        self.flows = flows  # flow_fields(links): shared by every part
        self.part = PerfettoPart()
        self._number = part
        self._sequences: dict[Lane, _Sequence] = {}
        # A piece written in parallel with others (seams): each track's spans up to its
        # first root go to a sequence of their own, handed back in ``part.heads``.
        self._seams = seams
        self._heads: dict[Lane, _Sequence] = {}

    def _uuid(self, lane: Lane) -> int:
        return 0x10000 + self.order[lane]

    def header(self, out: IO[bytes]) -> int:
        """The track descriptors: root, one per incarnation, one per lane."""
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
            TracePacket,
            TrackDescriptor,
        )

        explicit = TrackDescriptor.ChildTracksOrdering.EXPLICIT
        packets = [
            TracePacket(
                track_descriptor=TrackDescriptor(
                    uuid=_ROOT_UUID, name="megatron-trace", child_ordering=explicit
                )
            ),
        ]
        incarnations = sorted({lane.incarnation for lane in self.order})
        for number in incarnations:
            packets.append(
                TracePacket(
                    track_descriptor=TrackDescriptor(
                        uuid=0x100 + number,
                        parent_uuid=_ROOT_UUID,
                        name=self.lanes.incarnation_name(number),
                        child_ordering=explicit,
                        sibling_order_rank=number,
                    )
                )
            )
        running = running_lanes(self.lanes)
        for lane, position in self.order.items():
            packets.append(
                TracePacket(
                    track_descriptor=TrackDescriptor(
                        uuid=self._uuid(lane),
                        parent_uuid=0x100 + lane.incarnation,
                        name=f"rank {lane.rank}{running.get(lane, '')}",
                        sibling_order_rank=position,
                    )
                )
            )
        for packet in packets:
            out.write(_length_delimited(_TRACE_PACKET, packet.SerializeToString()))
        return len(packets)

    def _sequence(self, lane: Lane) -> _Sequence:
        sequence = self._sequences.get(lane)
        if sequence is None:
            if self._seams and lane not in self.part.heads:
                sequence = self._heads.get(lane)
                if sequence is None:
                    sequence = self._heads[lane] = self._new_sequence(lane, is_head=True)
                return sequence
            sequence = self._sequences[lane] = self._new_sequence(lane, is_head=False)
        return sequence

    def _new_sequence(self, lane: Lane, is_head: bool) -> _Sequence:
        # Ids unique across the parts, and small: a sequence id is in every packet.
        # Each part numbers its tracks' sequences, then their heads' (see join).
        block = 2 * self._number + is_head
        sequence_id = 1 + block * len(self.order) + self.order[lane]
        return _Sequence(sequence_id, self._uuid(lane), is_head)

    def spans(self, out: IO[bytes], lane: Lane, spans: Sequence[Any]) -> None:
        """Slices for spans of one lane (held until their subtree is complete)."""
        sequence = self._sequence(lane)
        head, end_tail, end_size, held, names, annotations, id_heads = _hot(sequence)
        trace_head, span_head, parent_head = id_heads
        flows = self.flows
        starts = [span.start_time_unix_nano for span in spans]
        ends = [span.end_time_unix_nano for span in spans]
        # The packets are joined from their pieces once each (bytes ``+`` would copy a
        # packet once per piece): a begin is Trace.packet{timestamp, sequence, event}.
        event_tag = _TRACK_EVENT_TAG
        for span, start, end, start_varint, end_varint in zip(
            spans, starts, ends, varints(starts), varints(ends), strict=True
        ):
            name_iid = names.get(span.name) or sequence.intern_name(span.name)
            trace_id, span_id = span.trace_id.encode(), span.span_id.encode()
            parent_id = span.parent_span_id.encode()
            if len(trace_id) == 32 and len(span_id) == 16 and len(parent_id) in (0, 16):
                pieces = [_BEGIN, name_iid, trace_head, trace_id, span_head, span_id]
                if parent_id:
                    pieces += (parent_head, parent_id)
            else:
                pieces = [_BEGIN, name_iid, sequence.ids(span)]
            if span.has_attributes():
                pieces.append(annotations(span.attribute_dict()))
            if span.status:
                pieces.append(sequence.status(span))
            flow_fields = flows.get(span.span_id)
            if flow_fields:
                pieces.append(flow_fields)
            event = b"".join(pieces)
            size = len(event)
            size_varint = _SMALL[size] if size < 0x80 else varint(size)
            size = 1 + len(start_varint) + len(head) + 1 + len(size_varint) + size
            begin = b"".join(
                (
                    _PACKET_TAG,
                    _SMALL[size] if size < 0x80 else varint(size),
                    _TIMESTAMP,
                    start_varint,
                    head,
                    event_tag,
                    size_varint,
                    event,
                )
            )
            # an end is always under 128 bytes
            finish = b"".join(
                (_PACKET_TAG, _SMALL[end_size + len(end_varint)], _TIMESTAMP, end_varint, end_tail)
            )
            held.append((start, end, begin, finish, span.span_id, span.parent_span_id))
            if sequence.is_head:
                if not span.parent_span_id or len(held) > MAX_HELD:
                    # the track's first root here (or too much held): hand the head back
                    self._take_head(lane, sequence, closed=True)
                    sequence = self._sequence(lane)  # ids of another length, maybe: all anew
                    head, end_tail, end_size, held, names, annotations, id_heads = _hot(sequence)
                    trace_head, span_head, parent_head = id_heads
            elif not span.parent_span_id:
                self._flush(out, sequence, _subtree(held))  # a root: its subtree is complete
            elif len(held) > MAX_HELD:
                self._flush(out, sequence, list(held))

    def _take_head(self, lane: Lane, sequence: _Sequence, closed: bool) -> None:
        self.part.heads[lane] = (*self._hand_back(sequence), closed)

    def _hand_back(self, sequence: _Sequence) -> tuple[bytes, list[_Held]]:
        """The sequence's held spans, taken out for :meth:`join` to write, with the preamble
        that makes them readable wherever it writes them (and counted as written)."""
        held = list(sequence.held)
        sequence.held.clear()
        self.part.events += 2 * len(held)
        return self._preamble(sequence), held

    def _preamble(self, sequence: _Sequence) -> bytes:
        """What a reader must see before the sequence's next packets: its first packet (if
        not written yet) and the names interned since the last write."""
        chunks = []
        if not sequence.started:
            chunks.append(self._first_packet(sequence))
            sequence.started = True
        if sequence.new_names or sequence.new_annotations:
            chunks.append(self._interned(sequence))
        return b"".join(chunks)

    def _flush(self, out: IO[bytes], sequence: _Sequence, held: list[_Held]) -> None:
        """Write ``held`` (taken out of the sequence's held spans), in nesting order at ties."""
        if not held:
            return
        if len(held) == len(sequence.held):
            sequence.held.clear()
        else:
            written = {id(entry) for entry in held}
            sequence.held[:] = [entry for entry in sequence.held if id(entry) not in written]
        out.write(self._preamble(sequence) + b"".join(_packets(held)))
        self.part.events += 2 * len(held)

    def _first_packet(self, sequence: _Sequence) -> bytes:
        defaults = _length_delimited(_TRACK_EVENT, _field(11, 0) + varint(sequence.uuid))
        packet = (
            _SEQUENCE_ID
            + varint(sequence.id)
            + _SEQUENCE_FLAGS
            + varint(_SEQ_CLEARED)
            + _length_delimited(_DEFAULTS, defaults)
            + _field(87, 0)
            + varint(1)  # first_packet_on_sequence
        )
        return _length_delimited(_TRACE_PACKET, packet)

    def _interned(self, sequence: _Sequence) -> bytes:
        data = b"".join(
            _length_delimited(2, _field(1, 0) + varint(iid) + _length_delimited(2, name.encode()))
            for iid, name in sequence.new_names
        ) + b"".join(
            _length_delimited(3, _field(1, 0) + varint(iid) + _length_delimited(2, key.encode()))
            for iid, key in sequence.new_annotations
        )
        sequence.new_names.clear()
        sequence.new_annotations.clear()
        packet = (
            _SEQUENCE_ID
            + varint(sequence.id)
            + _SEQUENCE_FLAGS
            + varint(_SEQ_NEEDS_STATE)
            + _length_delimited(_INTERNED_DATA, data)
        )
        return _length_delimited(_TRACE_PACKET, packet)

    def finish_part(self, out: IO[bytes]) -> None:
        """The end of one piece of the input: write what its tracks still hold (hand it
        back in ``part.tails`` and ``part.heads`` when pieces are written in parallel)."""
        if not self._seams:
            for sequence in self._sequences.values():
                self._flush(out, sequence, list(sequence.held))
            return
        for lane, sequence in self._heads.items():
            if lane not in self.part.heads:  # no root of the track in the piece
                self._take_head(lane, sequence, closed=False)
        for lane, sequence in self._sequences.items():
            if sequence.held:
                self.part.tails[lane] = self._hand_back(sequence)

    def join(self, out: IO[bytes], parts: Iterable[PerfettoPart], files: Sequence[Path]) -> None:
        """The parts other writers wrote (a piece of the input each), in input order, and
        between them the subtrees that a cut between two pieces split. Each part is
        taken as it comes (``parts`` may still be being written) and its held spans are
        dropped once written: the join holds those of one part, not of all.

        A track's spans held at a piece's end (its tail) and those before its first
        root in the next piece (that piece's head) are one subtree: they are written
        together, in nesting order, between the two pieces' packets, where the
        trace processor's order at tied timestamps needs them.
        """
        carried: dict[Lane, list[_Held]] = {}
        for part, path in zip(parts, files, strict=True):
            for lane, (preamble, held, closed) in part.heads.items():
                out.write(preamble)
                held = carried.pop(lane, []) + held
                if closed or len(held) > MAX_HELD:
                    out.write(b"".join(_packets(held)))
                else:
                    carried[lane] = held
            append_file(out, path)
            for lane, (preamble, held) in part.tails.items():
                out.write(preamble)
                carried.setdefault(lane, []).extend(held)
            part.heads, part.tails = {}, {}  # written, or carried: the part's count stays
        for held in carried.values():
            out.write(b"".join(_packets(held)))

    def footer(self, out: IO[bytes], parts: Sequence[PerfettoPart]) -> int:
        """Nothing follows the packets."""
        return 0


def _hot(sequence: _Sequence) -> tuple[Any, ...]:
    """What the loop of :meth:`PerfettoWriter.spans` reads of its sequence, as locals: the
    packet head and end tail (their lengths follow the sequence id's), the end's length
    less its timestamp, the held spans, the interning tables, the id annotation heads."""
    tail = sequence.end_tail
    return (
        sequence.head,
        tail,
        1 + len(tail),
        sequence.held,
        sequence.name_iids,
        sequence.annotations,
        sequence.id_heads,
    )


def _packets(held: list[_Held]) -> list[bytes]:
    """The begin and end packets of ``held``, in an order the trace processor nests right."""
    stamps = [entry[0] for entry in held] + [entry[1] for entry in held]
    if len(set(stamps)) == len(stamps):
        # no tie: the trace processor's sort by time puts everything in place
        return [packet for entry in held for packet in (entry[2], entry[3])]
    return _nesting_order(held)


def _subtree(held: list[_Held]) -> list[_Held]:
    """The last held span (a root) and its descendants among the held ones, in order."""
    root = held[-1]
    if len(held) == 1:
        return [root]
    ids = {entry[4] for entry in held}
    if all([entry[5] in ids for entry in held[:-1]]):
        # the usual case: every other held span's parent is held, so each one's chain of
        # parents stays among them and ends at the one span whose parent is not: the root
        return list(held)
    children: dict[str, list[int]] = {}
    for index, entry in enumerate(held):
        children.setdefault(entry[5], []).append(index)
    chosen, todo = set(), [root[4]]
    while todo:
        for index in children.get(todo.pop(), ()):
            if index not in chosen:
                chosen.add(index)
                todo.append(held[index][4])
    chosen.add(len(held) - 1)
    if len(chosen) == len(held):
        return list(held)
    return [entry for index, entry in enumerate(held) if index in chosen]


def _nesting_order(held: list[_Held]) -> list[bytes]:
    """The packets of ``held`` in tree order: a slice's begin, its children's slices (by
    start, the shorter first), its end. In time order wherever time decides, and at a tie
    the order the parents say (a span whose parent is not held counts as a root)."""
    ids = {entry[4] for entry in held}
    children: dict[str, list[_Held]] = {}
    roots = []
    for entry in held:
        if entry[5] and entry[5] in ids and entry[5] != entry[4]:
            children.setdefault(entry[5], []).append(entry)
        else:
            roots.append(entry)
    order = {id(entry): arrival for arrival, entry in enumerate(held)}

    def key(entry: _Held) -> tuple[int, int, int]:
        return entry[0], entry[1], order[id(entry)]

    packets: list[bytes] = []
    todo: list[tuple[_Held, bool]] = [
        (entry, False) for entry in sorted(roots, key=key, reverse=True)
    ]
    while todo:
        entry, done = todo.pop()
        if done:
            packets.append(entry[3])
            continue
        packets.append(entry[2])
        todo.append((entry, True))
        kids = children.pop(entry[4], ())
        todo.extend((kid, False) for kid in sorted(kids, key=key, reverse=True))
    return packets
