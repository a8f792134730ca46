"""Is the job still running? The rule ``megatron-trace`` applies before it reports.

The spans alone cannot tell a live job from a SIGKILLed one: both leave the
interval in flight out of the file (with the ``default`` span groups nothing
at all is written while an interval is open, which may be hours). What tells
them apart is time: a live job keeps writing. Its telemetry exports metrics
to ``metrics.jsonl`` beside the trace file: this project's every 10 s, each
export carrying the heartbeat gauge (:mod:`megatron.core.telemetry.heartbeat`:
1 while up, 0 in the export at shutdown); Megatron-LM's at its metric reader's
interval, the points it records at each log interval
(``megatron.training.step_duration_ms``, ``.loss``, ...). Every metric data
point is a sign of life, stamped with its collection time; only the heartbeat
also says whether telemetry shut down.

The rule, for the last incarnation of each rank (an earlier one was followed
by a restart, so it is over), when its spans do not show a clean or cut-short
end, or show one but its newest heartbeat still says 1:

* it is **running** while its newest record (metric point or span end) is
  at most ``stale_after`` (default :data:`STALE_AFTER_S`, three export
  periods) older than now, and its newest heartbeat does not say 0;
* otherwise it keeps what its spans say (``killed``, or the end they show).

The killed incarnations' own metric points then say how long each lived and how far
it got (:func:`~megatron.trace.analysis.sightings.read_sightings`), which narrows the
report's bounds.

A running incarnation's figures are as of its newest record (``as_of_ns``):
the wall clock ends there, and the stretch its open interval (or startup)
has covered since the last span written, ``in_flight``, counts as what it
is (goodput, or startup) instead of as wasted. "Now" is the reader's clock,
or ``--now`` (tests, or a file judged as of a given moment); the writer's and
the reader's clocks must agree to well within the bound.

Without ``metrics.jsonl`` (metrics off, or another exporter) there is no
sign of life but the spans: a job is then seen running only within the bound of its newest
span, which with the ``default`` groups may be long before now.

The metric points are read from the end of ``metrics.jsonl``
(:func:`~megatron.trace.otlp.reader.iter_requests_backwards`), stopping
once every incarnation in question has its newest point, so a week of
metrics costs a few blocks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from megatron.trace._store.record_log import latest
from megatron.trace.analysis.sightings import read_sightings
from megatron.trace.model.identity import process_of_resource
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.otlp.reader import decode_attributes, iter_requests_backwards
from megatron.trace_format.files import metrics_file_for
from megatron.trace_format.records import SpanFields, SpanRecord, span_record
from megatron.trace_format.semconv import (
    HEARTBEAT_METRIC,
    INTERVAL_REROOTED,
    INTERVAL_SPAN,
    STALE_AFTER_S,
    STARTUP_SPAN,
)

__all__ = [
    "STALE_AFTER_S",
    "Beat",
    "Clock",
    "Liveness",
    "judge",
    "mark_running",
    "utc_text",
]

#: Attribute on the synthesized in-flight record (never written to a file).
IN_FLIGHT = "megatron.span.in_flight"
# How far back past the oldest incarnation in question the heartbeat scan goes
# (lines of several processes sharing one file are only roughly in time order).
_SCAN_SLACK_NS = 60 * 1_000_000_000
# The OTLP metric kinds whose points carry ``timeUnixNano``.
_POINT_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


@dataclass(frozen=True)
class Clock:
    """What "now" is and how old a live job's newest record may be."""

    now_ns: int
    stale_after_ns: int = int(STALE_AFTER_S * 1e9)

    @classmethod
    def system(cls, stale_after_s: float = STALE_AFTER_S) -> Clock:
        return cls(time.time_ns(), int(stale_after_s * 1e9))

    @classmethod
    def at(cls, now_s: float | None = None, stale_after_s: float | None = None) -> Clock:
        """``now_s`` (epoch seconds; ``None``: the system clock), ``stale_after_s`` (``None``:
        :data:`STALE_AFTER_S`): what ``--now`` and ``--stale-after`` give."""
        stale_ns = int((STALE_AFTER_S if stale_after_s is None else stale_after_s) * 1e9)
        return cls(time.time_ns() if now_s is None else int(now_s * 1e9), stale_ns)

    @property
    def rule(self) -> str:
        bound = self.stale_after_ns / 1e9
        return (
            f"running: the last incarnation of a rank, not seen to shut down, whose newest "
            f"record (metric point in metrics.jsonl, or span) is at most {bound:g} s old"
        )


@dataclass(frozen=True)
class Beat:
    """The newest metric points of one process: a sign of life.

    ``time_ns`` is the newest point's collection time, of any metric;
    ``running`` what the heartbeat gauge said in that export (``None``
    without a heartbeat point there: Megatron-LM's metrics, say).
    """

    time_ns: int
    running: bool | None


@dataclass
class Liveness:
    """What :func:`judge` found: the clock, the heartbeat files, and any caveat."""

    clock: Clock
    metrics_files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rule(self) -> str:
        return self.clock.rule


def utc_text(ns: int) -> str:
    """A time as ISO 8601 UTC with milliseconds: ``2026-12-01T10:32:05.123Z``."""
    moment = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def judge(trace: Trace, trace_files: Sequence[Path | str], clock: Clock) -> Liveness:
    """Mark the incarnations of ``trace`` that are still running (see the module docstring).

    Reads the heartbeat from ``metrics.jsonl`` beside each trace file, if
    there is one; damage there raises ``TraceFileDamaged`` naming its line.
    """
    liveness = Liveness(clock)
    candidates = {
        incs[-1].process: incs[-1]
        for incs in trace.ranks.values()
        if incs[-1].ended in ("killed", "shutdown")
    }
    files = list(dict.fromkeys(metrics_file_for(Path(path)) for path in trace_files))
    liveness.metrics_files = [path for path in files if path.is_file()]
    wanted = {process: inc.start_ns for process, inc in candidates.items()}
    beats = newest_beats(liveness.metrics_files, wanted)
    for process, inc in candidates.items():
        beat = beats.get(process)
        if beat is not None and beat.time_ns < inc.start_ns:
            beat = None  # an earlier pretrain() of the same process
        if beat is not None and beat.running is False:
            inc.ending_unsure = False  # its telemetry shut down: the spans tell how it ended
            continue
        if inc.ended == "shutdown" and (beat is None or beat.running is None):
            continue  # the spans show a clean end and no heartbeat says otherwise
        newest = max(inc.end_ns, beat.time_ns if beat is not None else 0)
        if clock.now_ns - newest > clock.stale_after_ns:
            if inc.ending_unsure and beat is not None and beat.running:
                # nothing left to train would have shut its telemetry down: it was killed
                inc.ended, inc.ending_unsure, inc.resume_range = "killed", False, None
            continue
        mark_running(inc, newest)
        if beat is None:
            liveness.notes.append(
                f"{inc.label}: no metric points (metrics.jsonl beside the trace); judged running "
                "from its newest span alone"
            )
    # what the killed ones' metric points say: how long they lived, how far they got
    read_sightings(trace, liveness.metrics_files)
    return liveness


def newest_beats(
    metrics_files: Iterable[Path], wanted: Mapping[tuple[Any, ...], int]
) -> dict[tuple[Any, ...], Beat]:
    """The newest metric points of each ``wanted`` process (process -> its start ns).

    Reads each file from its end and stops once every wanted process has a
    point, or the lines are older than the oldest wanted start.
    """
    found: dict[tuple[Any, ...], Beat] = {}
    if not wanted:
        return found
    oldest = min(wanted.values()) - _SCAN_SLACK_NS
    for path in metrics_files:
        for request in iter_requests_backwards(path):
            newest_in_line = 0
            for process, beat in _beats_of(request, path):
                newest_in_line = max(newest_in_line, beat.time_ns)
                if process in wanted and (
                    process not in found or beat.time_ns > found[process].time_ns
                ):
                    found[process] = beat
            if len(found) == len(wanted) or (newest_in_line and newest_in_line < oldest):
                break
    return found


def _beats_of(request: dict[str, Any], path: Path) -> Iterable[tuple[tuple[Any, ...], Beat]]:
    """(process, beat) for each resource of one ``ExportMetricsServiceRequest`` with points.

    The beat's time is its newest data point's, of any metric and any kind
    (gauge, sum, histogram, summary); ``running`` is the newest heartbeat
    point's value, if the resource has one.
    """
    for resource_metrics in request.get("resourceMetrics") or []:
        newest = 0
        heartbeat_ns = -1
        running: bool | None = None
        for scope in resource_metrics.get("scopeMetrics") or []:
            for metric in scope.get("metrics") or []:
                is_heartbeat = metric.get("name") == HEARTBEAT_METRIC
                for kind in _POINT_KINDS:
                    body = metric.get(kind)
                    if not isinstance(body, dict):
                        continue
                    for point in body.get("dataPoints") or []:
                        at = int(point.get("timeUnixNano", 0) or 0)
                        newest = max(newest, at)
                        if is_heartbeat and at >= heartbeat_ns:
                            heartbeat_ns = at
                            value = point.get("asInt", point.get("asDouble", 0))
                            running = float(value) != 0
        if newest:
            resource = decode_attributes((resource_metrics.get("resource") or {}).get("attributes"))
            yield process_of_resource(resource, path), Beat(newest, running)


def mark_running(inc: Incarnation, as_of_ns: int) -> None:
    """Judge ``inc`` running as of ``as_of_ns``: its wall clock ends there, and what it has
    been doing since the last span it wrote is its ``in_flight`` record. :func:`judge`
    marks the incarnations the files show alive; the trainer's live gauges
    (:mod:`megatron.trace.live.process`) mark their own, which they know is running."""
    inc.ended = "running"
    inc.resume_range = None  # where a running one resumed is judged on what it shows so far
    inc.as_of_ns = as_of_ns
    inc.end_ns = max(inc.end_ns, as_of_ns)
    inc.in_flight = _in_flight(inc, as_of_ns)


def _in_flight(inc: Incarnation, as_of_ns: int) -> SpanRecord | None:
    """What the running incarnation has been doing since the last span it wrote.

    In startup while ``megatron.startup`` is missing; else in the interval
    after the last one written (a reroot closed it), or in C0 when none is
    written yet. None when the last interval was closed for good (the job is
    saving its final checkpoint and shutting down).
    """
    if inc.startup is None:
        name, start = STARTUP_SPAN, inc.start_ns
    elif inc.intervals:
        last = latest(inc.intervals)
        assert last is not None  # (there are intervals)
        if last["attributes"].get(INTERVAL_REROOTED) is False:
            return None
        name, start = INTERVAL_SPAN, last["end_ns"]
    else:
        name, start = INTERVAL_SPAN, inc.startup["end_ns"]
    if as_of_ns <= start:
        return None
    anchor = inc.startup or next(iter(inc.intervals), None)
    fields = SpanFields(
        name, "", "", None, start, as_of_ns, {IN_FLIGHT: True}, [], [], [], "UNSET", "", None
    )
    return span_record(
        fields,
        anchor["resource"] if anchor is not None else {},
        anchor["file"] if anchor is not None else None,
        0,
    )  # fmt: skip
