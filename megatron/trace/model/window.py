"""A window of a big trace: ``--since`` / ``--until`` (wall clock or iteration) and ``--ranks``.

A week of many ranks does not fit in a browser tab, so ``export`` can cut out
what one wants to look at. A bound is

* a wall-clock time, ISO 8601: ``2026-12-01T10:00:00Z``, ``2026-12-01T11:00+01:00``
  (no zone: UTC, as the trace's timestamps are);
* a time from the trace's first span: ``+90s``, ``+1.5h``, ``+2d`` (units
  ``ms``, ``s``, ``m``, ``h``, ``d``);
* an iteration: ``iteration:1200``. ``--since`` starts where any rank first
  started it, ``--until`` ends where any rank last finished it (from the
  ``megatron.train.iteration`` spans; without them, the interval that holds
  it). With iterations on both sides the window is those iterations as they
  ran: each incarnation's run of them, from the first of them it started to
  the last it finished (merged across ranks), and nothing between the runs.
  On a restarted job whose iterations 700..710 ran twice (killed, resumed
  from an earlier checkpoint) that is two stretches of time, not the gap
  between them with the rest of the killed run and the restart's startup.

A span is kept when it overlaps the window (so the intervals and startup
around a window's iterations come with them, and children stay nested in
their parents); ``--ranks 0,4-7`` keeps those ranks.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from megatron.trace.model.incarnation import Trace
from megatron.trace_format.errors import WindowError
from megatron.trace_format.semconv import INTERVAL_FIRST_ITERATION, INTERVAL_LAST_ITERATION

__all__ = [
    "Window",
    "WindowError",
    "format_offset",
    "parse_duration",
    "parse_ranks",
    "resolve_window",
]

_UNITS = {"ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9, "d": 86400e9}
_OFFSET = re.compile(r"\+(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_ITERATION = re.compile(r"iteration:(\d+)")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FORMS = (
    "an ISO 8601 time (2026-12-01T10:00:00Z), a time from the trace's start (+90s, +1.5h) "
    "or an iteration (iteration:1200)"
)


@dataclass(frozen=True)
class Window:
    """Spans kept: those overlapping ``[since_ns, until_ns]`` (``None``: unbounded)
    and of ``ranks`` (``None``: all)."""

    since_ns: int | None = None
    until_ns: int | None = None
    ranks: frozenset[str] | None = None
    #: A window of iterations on both sides: the stretches of time they ran in (sorted,
    #: disjoint, inside ``[since_ns, until_ns]``); a span is kept when it overlaps one.
    stretches: tuple[tuple[int, int], ...] | None = None
    _stretch_ends: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    @property
    def cuts_time(self) -> bool:
        return self.since_ns is not None or self.until_ns is not None

    def keeps(self, start_ns: int, end_ns: int) -> bool:
        if self.stretches is not None:
            # the first stretch that ends at or after the span's start, if it starts in time
            at = bisect.bisect_left(self._stretch_ends, start_ns)
            return at < len(self.stretches) and self.stretches[at][0] <= end_ns
        return (self.since_ns is None or end_ns >= self.since_ns) and (
            self.until_ns is None or start_ns <= self.until_ns
        )

    def __post_init__(self) -> None:
        # the stretches' ends, for the binary search of each span kept or not
        object.__setattr__(self, "_stretch_ends", tuple(end for _, end in self.stretches or ()))


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")


def parse_duration(text: str) -> int | None:
    """A duration (``90s``, ``30m``, ``1.5h``, ``2d``, ``500ms``) in ns; None for anything
    else, or for a duration under a nanosecond."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    ns = round(float(match.group(1)) * _UNITS[match.group(2)])
    return ns if ns > 0 else None


def parse_ranks(text: str) -> frozenset[str]:
    """``0,2,4-7`` -> the rank names; a name that is not a number is kept as given."""
    ranks: set[str] = set()
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if dash and low.isdigit() and high.isdigit():
            if int(high) < int(low):
                raise WindowError(f"--ranks: {part!r} is an empty range (write low-high)")
            ranks.update(str(rank) for rank in range(int(low), int(high) + 1))
        else:
            ranks.add(part)
    if not ranks:
        raise WindowError(f"--ranks: {text!r} names no rank (write e.g. 0,2,4-7)")
    return frozenset(ranks)


def _wall_clock(text: str) -> int | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _iteration_bound(trace: Trace, number: int, ranks: frozenset[str] | None, upper: bool) -> int:
    found: list[int] = []
    spans: list[int] = []
    for rank, incs in trace.ranks.items():
        if ranks is not None and rank not in ranks:
            continue
        for inc in incs:
            its = inc.iterations
            times = its.ends if upper else its.starts
            spans.extend(t for n, t in zip(its.numbers, times, strict=True) if n == number)
            for interval in inc.intervals:
                first = interval["attributes"].get(INTERVAL_FIRST_ITERATION)
                last = interval["attributes"].get(INTERVAL_LAST_ITERATION)
                if isinstance(first, int) and isinstance(last, int) and first <= number <= last:
                    found.append(interval["end_ns"] if upper else interval["start_ns"])
    candidates = spans or found
    if not candidates:
        raise WindowError(f"iteration {number} is not in the trace{_iteration_range(trace)}")
    return max(candidates) if upper else min(candidates)


def _iteration_stretches(
    trace: Trace, first: int, last: int, ranks: frozenset[str] | None
) -> tuple[tuple[int, int], ...]:
    """The stretches of time iterations ``first..last`` ran in: per incarnation of each
    rank, from the start of the first of them it started to the end of the last it
    finished (its ``megatron.train.iteration`` spans; without any in the trace, its
    intervals that hold some of them), merged where they overlap."""
    stretches: list[tuple[int, int]] = []
    with_spans = any(len(inc.iterations) for inc in trace.incarnations)
    for rank, incs in trace.ranks.items():
        if ranks is not None and rank not in ranks:
            continue
        for inc in incs:
            if with_spans:
                its = inc.iterations
                times = [
                    (start, end)
                    for n, start, end in zip(its.numbers, its.starts, its.ends, strict=True)
                    if first <= n <= last
                ]
            else:
                times = []
                for interval in inc.intervals:
                    low = interval["attributes"].get(INTERVAL_FIRST_ITERATION)
                    high = interval["attributes"].get(INTERVAL_LAST_ITERATION)
                    held = isinstance(low, int) and isinstance(high, int)
                    if held and low <= last and first <= high:
                        times.append((interval["start_ns"], interval["end_ns"]))
            if times:
                stretches.append((min(a for a, _ in times), max(b for _, b in times)))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(stretches):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def _iteration_range(trace: Trace) -> str:
    firsts = [inc.first_iteration for inc in trace.incarnations if inc.first_iteration is not None]
    lasts = [inc.last_iteration for inc in trace.incarnations if inc.last_iteration is not None]
    return f" (it holds iterations {min(firsts)}..{max(lasts)})" if firsts and lasts else ""


def trace_start(trace: Trace) -> int:
    """The wall-clock start of the trace: its first span."""
    return min((inc.start_ns for inc in trace.incarnations), default=0)


def _bound(flag: str, text: str, trace: Trace, ranks: frozenset[str] | None) -> int:
    upper = flag == "--until"
    offset = _OFFSET.fullmatch(text)
    if offset:
        return trace_start(trace) + round(float(offset.group(1)) * _UNITS[offset.group(2)])
    iteration = _ITERATION.fullmatch(text)
    if iteration:
        try:
            return _iteration_bound(trace, int(iteration.group(1)), ranks, upper)
        except WindowError as error:
            raise WindowError(f"{flag}: {error}") from None
    moment = _wall_clock(text)
    if moment is None:
        raise WindowError(f"{flag}: {text!r} is not a time: give {_FORMS}")
    return moment


def resolve_window(trace: Trace, since: str | None, until: str | None, ranks: str | None) -> Window:
    """The window the flags name, in this trace (raises :class:`WindowError`)."""
    chosen = parse_ranks(ranks) if ranks is not None else None
    if chosen is not None:
        unknown = sorted(chosen - set(trace.ranks))
        if unknown and chosen.isdisjoint(trace.ranks):
            raise WindowError(
                f"--ranks: no rank {', '.join(unknown)} in the trace (its ranks: "
                f"{', '.join(trace.ranks)})"
            )
    low = _bound("--since", since, trace, chosen) if since is not None else None
    high = _bound("--until", until, trace, chosen) if until is not None else None
    if low is not None and high is not None and high < low:
        raise WindowError(f"--until ({until}) is before --since ({since})")
    first = _ITERATION.fullmatch(since) if since is not None else None
    last = _ITERATION.fullmatch(until) if until is not None else None
    if first and last:
        if int(last.group(1)) < int(first.group(1)):
            raise WindowError(f"--until ({until}) is before --since ({since})")
        stretches = _iteration_stretches(trace, int(first.group(1)), int(last.group(1)), chosen)
        return Window(stretches[0][0], stretches[-1][1], chosen, stretches)
    return Window(low, high, chosen)


def format_offset(ns: float) -> str:
    """A duration as a ``+N<unit>`` bound, rounded down to a readable unit."""
    for unit in ("d", "h", "m", "s"):
        if ns >= _UNITS[unit] * (2 if unit != "s" else 1):
            value = math.floor(ns / _UNITS[unit] * 10) / 10
            return f"+{value:g}{unit}"
    return f"+{max(1, math.floor(ns / 1e6))}ms"
