"""A process's records placed into its incarnations, kept between a builder's finishes.

The builder's :meth:`~megatron.trace.model.builder.TraceBuilder.finish` hands each
process to a :class:`Split`, which places the records added since the last finish
(:func:`~megatron.trace.model.identity.slot_of` is the rule) and gives the
incarnations as views of the process's log. A trace read once places everything
once; a builder finished again as its files grow places only the records added
since, and scans only the intervals added since for how the incarnation ended.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from typing import Any

from megatron.trace._store.columns import Iterations
from megatron.trace.model.ending import EndingScan, lost_next
from megatron.trace.model.identity import slot_of
from megatron.trace.model.incarnation import RECORD_LISTS, Incarnation
from megatron.trace.model.process import ProcessSpans
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    HANG_RECOVERED_SPAN,
    HANG_SPAN,
    ITERATION_SPAN,
    PRE_STARTUP_SPAN,
    SPAN_CATEGORY,
    STARTUP_PHASE_PREFIX,
    STARTUP_SPAN,
    Category,
)

__all__ = ["Split"]


# Span name -> the incarnation's record list it goes to: the structural spans of each
# report category (but startup, a single record) and the hang watchdog's.
_LIST_OF_CATEGORY = {
    Category.QUEUE: PRE_STARTUP_SPAN,  # (the list is named as its span)
    Category.LAUNCH: "launch",
    Category.GOODPUT: "intervals",
    Category.CHECKPOINT_SAVE: "saves",
    Category.CHECKPOINT_LOAD: "loads",
    Category.EVALUATION: "evaluations",
}
_LIST_OF_NAME = {
    **{
        name: _LIST_OF_CATEGORY[category]
        for name, category in SPAN_CATEGORY.items()
        if category != Category.STARTUP
    },
    HANG_SPAN: "hangs",
    HANG_RECOVERED_SPAN: "recoveries",
}


def _insert(positions: array, position: int, starts: array) -> bool:
    """Put ``position`` among ``positions`` (in start order, ties in log order: it is the
    newest record) and say whether it went last."""
    start = starts[position]
    if not positions or starts[positions[-1]] <= start:
        positions.append(position)
        return True
    positions.insert(bisect.bisect_right(positions, start, key=starts.__getitem__), position)
    return False


class _Slot:
    """One incarnation's share of its process as placed so far (:class:`Split`): its
    records' positions in the process's log, per list of :class:`Incarnation`, in start
    order (ties in log order), and what is worked out of them and kept between finishes."""

    __slots__ = (
        "ending",
        "first",
        "last",
        "lists",
        "startup",
        "startup_record",
    )

    def __init__(self) -> None:
        self.lists = {name: array("q") for name in RECORD_LISTS}
        self.startup: int | None = None  # the position of its megatron.startup
        self.startup_record: SpanRecord | None = None  # ... decoded once
        self.first, self.last = 2**63, -(2**63)  # the first start and last end of its records
        self.ending = EndingScan()


class Split:
    """A process cut into its incarnations, kept by its builder between finishes.

    One incarnation per ``megatron.startup`` of the process (at least one), split
    where the startups but the first began (:func:`slot_of`). Each record is placed by
    its name and times, which the log holds undecoded; only a startup is decoded. A
    builder finished again as more is added places the records added
    since the last finish among the others, and only a new startup (which
    moves the boundaries) places them all again; an incarnation's iterations are cut
    from the process's by the rows added since. An incarnation's lists are views of
    the process's :class:`~megatron.trace._store.record_log.RecordLog` in start order
    (:class:`~megatron.trace._store.record_log.RecordList`): the readers decode them.
    """

    def __init__(self, key: tuple[Any, ...], proc: ProcessSpans) -> None:
        self.key, self.proc = key, proc
        self.placed = 0  # the records of the log placed so far
        self.boundaries: list[int] = []
        self.slots = [_Slot()]
        # iterations, waits -> (rows cut so far, where each boundary cuts them), and each
        # incarnation's slice of them with its (first, end) row
        self.cuts: dict[str, tuple[int, list[int]]] = {}
        self.parts: dict[str, list[tuple[Iterations, tuple[int, int]]]] = {}
        # two startups of the one process with the same start and end: one span read twice
        # (the log positions of the first such pair; None: none)
        self.repeated: tuple[int, int] | None = None

    def update(self) -> None:
        """Place the records added since the last update."""
        log = self.proc.records
        count = len(log)
        if any(log.name(i) == STARTUP_SPAN for i in range(self.placed, count)):
            self._reset(count)
        else:
            for position in range(self.placed, count):
                self._place(position)
        self.placed = count

    def _reset(self, count: int) -> None:
        """Place every record again, in start order (stable: log order on ties)."""
        log = self.proc.records
        starts = log.starts
        order = sorted(range(count), key=starts.__getitem__)
        startups = [i for i in order if log.name(i) == STARTUP_SPAN]
        ends = log.ends
        self.repeated = next(
            (
                (a, b)
                for a, b in itertools.pairwise(startups)
                if starts[a] == starts[b] and ends[a] == ends[b]
            ),
            None,
        )
        self.boundaries = [starts[i] for i in startups[1:]]
        self.slots = [_Slot() for _ in range(len(self.boundaries) + 1)]
        self.cuts, self.parts = {}, {}
        for position in order:
            self._place(position)

    def _place(self, position: int) -> None:
        log = self.proc.records
        starts = log.starts
        name, start, end = log.name(position), starts[position], log.ends[position]
        boundaries = self.boundaries
        slot = self.slots[slot_of(boundaries, name, start, end) if boundaries else 0]
        if log.cut_short(position):
            _insert(slot.lists["cut_short"], position, starts)
        if name == STARTUP_SPAN:
            slot.startup, slot.startup_record = position, None
        else:
            target = _LIST_OF_NAME.get(name)
            if target is None and name.startswith(STARTUP_PHASE_PREFIX):
                target = "startup_phases"
            if target is not None:
                _insert(slot.lists[target], position, starts)
        if name in SPAN_CATEGORY:  # a span of Incarnation.records
            slot.first, slot.last = min(slot.first, start), max(slot.last, end)

    def incarnations(self) -> list[Incarnation]:
        """The process's incarnations as placed (new objects: the readers may change them)."""
        proc, log = self.proc, self.proc.records
        boundaries, slots = self.boundaries, self.slots
        incs = [Incarnation(proc.rank, 0, self.key) for _ in slots]
        for inc, slot in zip(incs, slots, strict=True):
            for name in RECORD_LISTS:
                setattr(inc, name, log.view(array("q", slot.lists[name]), ordered=True))
            if slot.startup is not None:
                if slot.startup_record is None:  # (its log block is read once, not each time)
                    slot.startup_record = log[slot.startup]
                inc.startup = slot.startup_record
        iterations = self._distribute("iterations", proc.iterations)
        waits = self._distribute("waits", proc.waits)
        for index, inc in enumerate(incs):
            inc.iterations, inc.waits = iterations[index], waits[index]
            if len(incs) == 1:  # the usual case: the process's own, not copies
                inc.checkpoint_time, inc.goodput_time = proc.checkpoint_time, proc.goodput_time
                inc.finalize_starts = proc.finalize_starts
                continue
            lo = boundaries[index - 1] if index else -(2**63)
            hi = boundaries[index] if index < len(boundaries) else 2**63 - 1
            inc.checkpoint_time = proc.checkpoint_time.clipped(lo, hi)
            inc.goodput_time = proc.goodput_time.clipped(lo, hi)
            inc.finalize_starts = array("q", (s for s in proc.finalize_starts if lo <= s < hi))
        for index, (inc, slot) in enumerate(zip(incs, slots, strict=True)):
            times = [(slot.first, slot.last)] if slot.first <= slot.last else []
            for stretches in (inc.checkpoint_time, inc.goodput_time):
                if stretches:
                    times.append((stretches.starts[0], stretches.ends[-1]))
            if inc.iterations:
                times.append((inc.iterations.min_start(), inc.iterations.max_end()))
            if index == len(incs) - 1:
                times.append((proc.min_start or 0, proc.max_end))
            inc.start_ns = min((s for s, _ in times), default=0)
            inc.end_ns = max((e for _, e in times), default=0)
            if index > 0:
                inc.start_ns = max(inc.start_ns, boundaries[index - 1])
            inc.ended, inc.error_type = slot.ending.ending(
                inc, slot.startup, slot.lists["intervals"]
            )
        last = incs[-1]
        if last.ended == "shutdown" and (proc.max_end_child > proc.max_end_root or lost_next(last)):
            last.ended = "killed"
        for inc in incs:
            # a killed incarnation's last interval was closed by the reroot that opened the lost
            # one (as judged here: liveness may later call the last incarnation running)
            inc.last_closed_by_reroot = inc.ended == "killed"
        return incs

    def _distribute(self, attribute: str, column: Iterations) -> list[Iterations]:
        """Each incarnation's iterations (or waits), in start order.

        They come in start order (a process runs its iterations one after another, and
        the pieces of a file merge in file order): then one incarnation takes them as
        they are, and several (``pretrain()`` called again in the process: an in-process
        restart) take a slice each, cut where their startups began, only the rows added
        since the last finish read to find where. Otherwise they are sorted one by one
        first (a Python object per iteration: never seen in a file).
        """
        count = len(column)
        if column.in_start_order():
            if len(self.slots) == 1:
                return [column]  # the usual case: no copy
            rows, cuts = self.cuts.get(attribute, (0, [0] * len(self.boundaries)))
            if count > rows:  # slot_of places a start equal to a boundary after it
                starts = column.slice(rows, count).starts
                cuts = [
                    cut if cut < rows else rows + bisect.bisect_left(starts, boundary)
                    for cut, boundary in zip(cuts, self.boundaries, strict=True)
                ]
                self.cuts[attribute] = (count, cuts)
            bounds = [0, *cuts, count]
            earlier = self.parts.get(attribute, [])
            found = []
            for index, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                before = earlier[index] if index < len(earlier) else None
                if before is not None and before[1] == (lo, hi):
                    found.append(before)  # the same rows: the same object, its scan kept
                    continue
                grew = before is not None and before[1][0] == lo
                found.append((column.slice(lo, hi, before[0] if grew else None), (lo, hi)))
            self.parts[attribute] = found
            return [part for part, _ in found]
        parts = [Iterations() for _ in self.slots]
        numbers, starts, ends = column.numbers, column.starts, column.ends
        for i in sorted(range(len(starts)), key=starts.__getitem__):
            start, end = starts[i], ends[i]
            slot = slot_of(self.boundaries, ITERATION_SPAN, start, end)
            parts[slot].append(numbers[i], start, end)
        return parts
