"""What a killed incarnation's own metric points say: how long it lived, how far it got.

A SIGKILL keeps from the trace file the spans still open and those not exported yet;
with the ``default`` span groups nothing is written while an interval is open, so the
file cannot say how far a killed incarnation got. Its metric points can: the job
exports them to ``metrics.jsonl`` beside the trace (this project's trainer every 10 s:
the heartbeat, the live goodput gauges and ``megatron.training.iteration``, the
iterations completed; Megatron-LM's through nemo-lens at its metric reader's interval:
``megatron.training.step_duration_ms``, a histogram recorded once per log interval,
``.loss``, ...). A point stamped ``t`` says its process was alive at ``t``; the
iteration gauge says how many iterations it had completed by then; the histogram's
count (cumulative, since its process started) how many log intervals it had finished,
so at least that many iterations, and exactly ``--log-interval`` times as many past
where it resumed when the resource says the interval (:data:`LOG_INTERVAL`).

Only the points of the incarnation's own process count (the resource's identity, as
for spans: another run id, pid or host is another process), and only those within its
time (a process that called ``pretrain()`` twice: split where its spans are); a
histogram only on a process's first incarnation (its count since the process started
is that incarnation's), and only with cumulative temporality. A file without metrics
narrows nothing.

What they narrow (:mod:`megatron.trace.analysis.bounds` says how):

* a killed incarnation lived until its newest point at least (``seen_ns``): the time
  from its last span to there is not restart gap; a final killed incarnation's wall
  clock runs to there;
* its metric reader exported at least every ``export_period_ns``, the longest spacing
  between its newest four exports (a flush, at a SIGTERM or a hang, only shortens one):
  :mod:`~megatron.trace.analysis.bounds` takes a kill to have come at most two such
  periods after its newest point (the SDK's reader collects, exports, then waits: the
  next export was collected within a period and written before the one after it);
* it completed at least :func:`completed` iterations: its wasted iterations are at
  least those past the iteration its successor resumed from;
* :func:`known_wasted`: from where the iteration its successor resumed from began
  (the end of that save, where the file shows it) to the newest point showing that many
  iterations completed or more, every iteration was redone: that stretch is wasted
  progress, not unattributed; only its part after the newest point showing fewer may
  instead be a save in flight at the kill (the bounds take it off wasted progress's
  lower bound).

The points are read from the end of each file (:func:`read_sightings`), newest first:
for each killed incarnation from where its successor started (found by bisection on the
lines' times, a few lines read) back to its newest point, one that showed less and its
newest four exports (or to its start), so a week of metrics costs a few blocks per kill.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

from megatron.trace.analysis.resumed import resume_ranges
from megatron.trace.model.identity import process_of_resource, slot_of
from megatron.trace.model.incarnation import Incarnation, Progress, Sighting, Trace
from megatron.trace.otlp.reader import (
    decode_attributes,
    iter_requests_backwards,
    offset_after_time,
)
from megatron.trace_format.semconv import (
    ITERATION,
    LOG_INTERVAL,
    MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_STEP_DURATION_MS,
)

__all__ = [
    "Redone",
    "completed",
    "finished_shown",
    "known_wasted",
    "read_sightings",
    "started_at",
    "unseen_from",
]

# How far past the oldest killed incarnation's start the scan goes (lines of several
# processes sharing one file are only roughly in time order).
_SCAN_SLACK_NS = 60 * 1_000_000_000
# The OTLP metric kinds whose points carry ``timeUnixNano``.
_POINT_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")
# How many of an incarnation's newest exports its export period is measured on, and how
# close two points' times are for one export (a collection stamps each instrument's point
# as it reads it; a receiver may split one export over lines).
_EXPORTS = 4
_SAME_EXPORT_NS = 1_000_000_000
_CUMULATIVE = 2  # AGGREGATION_TEMPORALITY_CUMULATIVE


class _Seen:
    """What the scan has found of one incarnation so far (newest first)."""

    def __init__(self) -> None:
        self.seen_ns = 0
        self.log_interval: int | None = None
        self.progress: dict[str, list[int | None]] = {}  # kind -> [top, top_ns, below, at]
        self.save_start: tuple[int, int] | None = None  # (at, the save in flight's start)
        self.exports: list[int] = []  # its newest exports' times, newest first

    def note_export(self, at: int) -> None:
        exports = self.exports
        if any(abs(at - t) < _SAME_EXPORT_NS for t in exports):
            return
        if len(exports) == _EXPORTS and at < exports[-1]:
            return
        exports.append(at)
        exports.sort(reverse=True)
        del exports[_EXPORTS:]

    @property
    def export_period_ns(self) -> int | None:
        """The longest spacing between its newest exports read (None: fewer than three)."""
        exports = self.exports
        if len(exports) < 3:
            return None
        return max(a - b for a, b in pairwise(exports))

    def note(self, kind: str, value: int, at: int) -> None:
        found = self.progress.get(kind)
        if found is None:
            self.progress[kind] = [value, at, None, None]
        elif value > found[0]:  # lines only roughly in order: a newer one read later
            if found[1] < at:  # the point read first becomes the newest showing less
                self.progress[kind] = [value, at, found[0], found[1]]
        elif value < found[0] and (found[3] is None or at > found[3]):
            found[2], found[3] = value, at

    def note_save_start(self, started: int, at: int) -> None:
        if self.save_start is None or at > self.save_start[0]:
            self.save_start = (at, started)

    @property
    def settled(self) -> bool:
        return (
            bool(self.seen_ns)
            and len(self.exports) == _EXPORTS
            and all(p[3] is not None for p in self.progress.values())
        )

    def sighting(self, started_at: int | None) -> Sighting:
        def progress(kind: str) -> Progress | None:
            found = self.progress.get(kind)
            return None if found is None else Progress(*found)  # type: ignore[arg-type]

        return Sighting(
            self.seen_ns,
            progress("iteration"),
            progress("steps"),
            self.log_interval,
            self.save_start,
            started_at,
            self.export_period_ns,
        )


def read_sightings(trace: Trace, metrics_files: Iterable[Path]) -> int:
    """Set :attr:`Incarnation.sighting` on each killed incarnation of ``trace`` whose own
    process left metric points in ``metrics_files``; a final killed one's end moves to
    its newest point (it lived until then). Returns how many were found."""
    # one followed by another keeps what an earlier read found (``watch`` judges again and
    # again): its points are all older than its successor
    wanted = {
        id(inc): inc
        for incs in trace.ranks.values()
        for inc in incs
        if inc.ended == "killed" and (inc.sighting is None or inc is incs[-1])
    }
    if not wanted:
        return 0
    found: dict[int, _Seen] = {}
    # newest first: each killed incarnation's points are read back from where its successor
    # started (a final one's, from the file's end), found by bisection on the lines' times
    last = 1 << 63

    def until(inc: Incarnation) -> int:
        found_until = _until(trace, inc)
        return last if found_until is None else found_until

    ordered = sorted(wanted.values(), key=until, reverse=True)
    for path in metrics_files:
        ends = [(inc, _end_offset(path, _until(trace, inc))) for inc in ordered]
        whole = any(end is False for _, end in ends)
        if whole:  # compressed: read once, from the end, back to the oldest incarnation
            ends = [(min(ordered, key=lambda inc: inc.start_ns), None)]
        for inc, end in ends:
            if _settled(found, [inc]) or end == 0:
                continue
            for request in iter_requests_backwards(path, end=end):
                newest = _scan(request, path, trace, wanted, found)
                if _settled(found, wanted.values() if whole else [inc]) or (
                    newest and newest < inc.start_ns - _SCAN_SLACK_NS
                ):
                    break
    pinned: dict[Any, list[int | None]] = {}  # rank -> each incarnation's pinned start
    for key, seen in found.items():
        inc = wanted[key]
        if inc.rank not in pinned:
            pinned[inc.rank] = [
                lower if lower == upper else None
                for lower, upper in resume_ranges(trace.ranks[inc.rank])
            ]
        inc.sighting = seen.sighting(pinned[inc.rank][inc.index])
        if inc is trace.ranks[inc.rank][-1]:
            inc.end_ns = max(inc.end_ns, seen.seen_ns)
    return len(found)


def _settled(found: dict[int, _Seen], incs: Iterable[Incarnation]) -> bool:
    """Whether each of ``incs`` has its newest point and, per progress metric, one showing
    less: reading further back would change nothing."""
    return all(id(inc) in found and found[id(inc)].settled for inc in incs)


def _end_offset(path: Path, until: int | None) -> int | bool | None:
    """Where to start reading ``path`` back for an incarnation dead by ``until``: a byte
    offset (None: the file's end; False: a compressed file, which cannot be read from an
    offset)."""
    if until is None:
        return None
    offset = offset_after_time(path, until + _SCAN_SLACK_NS)
    return False if offset is None else offset


def _log_interval(value: Any) -> int | None:
    """The resource's log interval: an int, or the digits ``OTEL_RESOURCE_ATTRIBUTES`` gives
    as a string (``megatron.log_interval=100``); None when absent or not a positive one."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _until(trace: Trace, inc: Incarnation) -> int | None:
    """When the incarnation's successor on its rank started (None: it is the last), so when
    it was dead by at the latest: its points are older."""
    incs = trace.ranks[inc.rank]
    return incs[inc.index + 1].start_ns if inc.index + 1 < len(incs) else None


def _scan(
    request: dict[str, Any],
    path: Path,
    trace: Trace,
    wanted: dict[int, Incarnation],
    found: dict[int, _Seen],
) -> int:
    """Note the points of one request on the killed incarnations they belong to; returns
    the newest point's time (0: none)."""
    newest = 0
    for resource_metrics in request.get("resourceMetrics") or []:
        resource = decode_attributes((resource_metrics.get("resource") or {}).get("attributes"))
        split = trace.processes.get(process_of_resource(resource, path))
        interval = _log_interval(resource.get(LOG_INTERVAL))
        for scope in resource_metrics.get("scopeMetrics") or []:
            for metric in scope.get("metrics") or []:
                name = metric.get("name")
                for kind in _POINT_KINDS:
                    body = metric.get(kind)
                    if not isinstance(body, dict):
                        continue
                    cumulative = body.get("aggregationTemporality") == _CUMULATIVE
                    for point in body.get("dataPoints") or []:
                        at = int(point.get("timeUnixNano", 0) or 0)
                        newest = max(newest, at)
                        if split is None or not at:
                            continue
                        boundaries, incs = split
                        slot = slot_of(boundaries, "", at, at)
                        inc = incs[slot]
                        if id(inc) not in wanted:
                            continue
                        seen = found.setdefault(id(inc), _Seen())
                        seen.seen_ns = max(seen.seen_ns, at)
                        seen.note_export(at)
                        if interval:
                            seen.log_interval = interval
                        if name == MEGATRON_TRAINING_ITERATION and kind == "gauge":
                            value = point.get("asInt", point.get("asDouble"))
                            if value is not None:
                                seen.note("iteration", int(float(value)), at)
                        elif name == MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME and (
                            kind == "gauge"
                        ):
                            value = point.get("asDouble", point.get("asInt"))
                            if value is not None:
                                seen.note_save_start(round(float(value) * 1e9), at)
                        elif (
                            name == MEGATRON_TRAINING_STEP_DURATION_MS
                            and kind == "histogram"
                            and cumulative
                            and slot == 0
                        ):
                            seen.note("steps", int(point.get("count", 0) or 0), at)
    return newest


def started_at(inc: Incarnation) -> int | None:
    """The iteration the incarnation started at: where its checkpoint load put it, else its
    first iteration, else where the files pin it (:attr:`Sighting.started_at`; None:
    nothing says)."""
    if inc.resumed_from is not None:
        return inc.resumed_from
    if inc.first_iteration is not None:
        return inc.first_iteration
    return inc.sighting.started_at if inc.sighting is not None else None


def finished_shown(inc: Incarnation) -> int | None:
    """The iterations a killed incarnation's metric points show it finished, at least (None:
    they show none, or where it started is not known)."""
    shown, start = completed(inc), started_at(inc)
    if shown is None or start is None:
        return None
    return max(0, shown[0] - start)


def _steps_to_iterations(inc: Incarnation, count: int, log_interval: int | None) -> int:
    """The iterations completed (as Megatron counts them: the next one's number), at
    least, once the step-duration histogram had counted ``count`` log intervals."""
    resumed = started_at(inc)
    if log_interval:
        # logged where the completed count is a multiple of the interval, from resumed on
        return log_interval * ((resumed or 0) // log_interval + count)
    return (resumed or 0) + count


def _completions(inc: Incarnation) -> list[tuple[int, int, int | None, int | None, str]]:
    """(completed at top, at, completed at below, at, the metric) of each progress metric
    of the incarnation's sighting (worked out once)."""
    sighting = inc.sighting
    if sighting is None:
        return []
    if "completions" not in sighting.worked:
        sighting.worked["completions"] = _work_completions(inc, sighting)
    return sighting.worked["completions"]


def _work_completions(
    inc: Incarnation, sighting: Sighting
) -> list[tuple[int, int, int | None, int | None, str]]:
    found = []
    if sighting.iteration is not None:
        p = sighting.iteration
        found.append((p.top, p.top_ns, p.below, p.below_ns, MEGATRON_TRAINING_ITERATION))
    if sighting.steps is not None:
        p, every = sighting.steps, sighting.log_interval
        below = None if p.below is None else _steps_to_iterations(inc, p.below, every)
        top = _steps_to_iterations(inc, p.top, every)
        found.append((top, p.top_ns, below, p.below_ns, MEGATRON_TRAINING_STEP_DURATION_MS))
    return found


def completed(inc: Incarnation) -> tuple[int, int, str] | None:
    """(iterations completed at least, as Megatron counts them: the next one's number; by
    when; the metric that says it): the most any of the incarnation's progress metrics
    shows (None: none does)."""
    best = None
    for top, at, _, _, name in _completions(inc):
        if best is None or top > best[0]:
            best = (top, at, name)
    return best


def _window_start(inc: Incarnation, horizon: int) -> int | None:
    """Where iteration ``horizon`` began, when the file says it exactly: the end of the save
    of ``horizon`` (or of the interval whose last iteration was the one before), the start
    of its iteration span, or, resumed at ``horizon``, the end of the startup (worked out
    once per horizon)."""
    worked = inc.sighting.worked if inc.sighting is not None else {}
    if ("window", horizon) not in worked:
        worked[("window", horizon)] = _work_window_start(inc, horizon)
    return worked[("window", horizon)]


def _work_window_start(inc: Incarnation, horizon: int) -> int | None:
    ends = [save["end_ns"] for save in inc.saves if save["attributes"].get(ITERATION) == horizon]
    ends += [
        record["end_ns"]
        for record, facts in zip(inc.intervals, inc.interval_facts, strict=True)
        if facts.last_iteration == horizon - 1
    ]
    if inc.iterations and inc.iterations.count_from(horizon):
        start = inc.iterations.start_of(horizon)
        if start is not None:
            ends.append(start)
    if started_at(inc) == horizon and inc.startup is not None:
        ends.append(inc.startup["end_ns"])
    return max(ends) if ends else None


class Redone(NamedTuple):
    """What a killed incarnation's metric points show of its time after its last span
    (:func:`known_wasted`)."""

    start: int  # where the redone stretch begins
    end: int  # where it ends: the newest point showing progress, or a save's start
    doubt_from: int  # from here to ``end`` may instead be a save in flight (== end: none)
    save_start: int  # a save in flight at the kill ran from here (== save_end: none seen)
    save_end: int  # until here at least


# A Unix time in seconds, as a double, is exact to about 0.24 us today: a save's start read
# from its gauge may be this far either side of the truth.
_CLOCK_SLACK_NS = 1_000


def known_wasted(inc: Incarnation, horizon: int | None, until_ns: int) -> Redone | None:
    """The stretch of a killed incarnation its metric points show redone: from where
    iteration ``horizon`` began (the file must say it exactly) to its newest point showing
    ``horizon`` or more iterations completed, at most ``until_ns`` (its successor's start).
    None: the points show no such stretch.

    Every iteration in it was past ``horizon``, so redone; a save that ended in it would
    have been resumed from, but one in flight at the kill (not durable) may have begun in
    it after the iteration that point shows completed, so after the newest point showing
    fewer (``doubt_from``). This trainer's save-start gauge, read at that point or later,
    settles it: 0 says no save was in flight then (no doubt); a start says the stretch
    ended there and the save ran on to that point at least (``save_end``)."""
    if inc.ended != "killed" or horizon is None or inc.sighting is None:
        return None
    start = _window_start(inc, horizon)
    if start is None:
        return None
    best = None
    for top, at, _, below_ns, _ in _completions(inc):
        if top >= horizon and min(at, until_ns) > start:
            end = min(at, until_ns)
            doubt = max(start, min(below_ns, end)) if below_ns is not None else start
            if best is None or end > best.end:
                best = Redone(start, end, doubt, end, end)
    saving = inc.sighting.save_start
    if best is None or saving is None or not best.end <= saving[0] <= until_ns:
        return best
    at, began = saving
    if not began or began > at:  # none in flight then (or one begun after it)
        return best._replace(doubt_from=best.end)
    if not start < began - _CLOCK_SLACK_NS < best.end:  # not within the stretch: unsettled
        return best
    # the stretch ends where the save began (the clock's slack either side in doubt)
    end = began + _CLOCK_SLACK_NS
    return Redone(start, end, began - _CLOCK_SLACK_NS, end, max(end, at))


def unseen_from(inc: Incarnation, horizon: int | None, until_ns: int) -> tuple[int, int, int]:
    """(where a killed incarnation's unattributed time begins: its last span's end, or the
    end of :func:`known_wasted`'s stretch and save; until when it was seen alive, at least
    that; how much of the stretch may be a save in flight rather than wasted progress)."""
    stretch = known_wasted(inc, horizon, until_ns)
    start = max(inc.end_ns, max(stretch.end, stretch.save_end) if stretch else 0)
    seen = inc.sighting.seen_ns if inc.sighting is not None else 0
    doubt = max(0, stretch.end - max(stretch.doubt_from, inc.end_ns)) if stretch else 0
    return start, max(start, min(seen, until_ns)), doubt
