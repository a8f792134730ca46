"""The shape of the goodput report: typed, and as a JSON Schema for ``report --json``.

:func:`megatron.trace.analysis.goodput.build_report` returns a :class:`Report`,
a plain ``dict`` at run time, typed here field by field; ``report --json`` is
``json.dumps`` of it once its bounds' reasons are in words
(:func:`~megatron.trace.render.json.report.report_json`). The same shape, as JSON Schema (draft
2020-12), is ``report.schema.json`` beside this module (:func:`schema` loads
it); the tests validate real reports against it, so neither can drift from
what ``build_report`` writes. Times are seconds (``*_s``), milliseconds
(``*_ms``) or exact integer nanoseconds (``accounting_ns``); wall-clock
instants are UTC text; a figure the trace cannot give is ``None`` (JSON
``null``) and its reason is in ``not_computed``; a figure it can only bound (a
SIGKILL lost the spans not yet exported) keeps the value the file gives and has a
:class:`Bound` under its path in ``bounds`` (:mod:`megatron.trace.analysis.bounds`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Literal, TypedDict

from megatron.trace.analysis.reasons import Reason, Source

__all__ = [
    "Anomalies",
    "Bound",
    "CheckpointAdvice",
    "Ended",
    "HangEntry",
    "IncarnationEntry",
    "IntervalChoice",
    "IterationStats",
    "LivenessEntry",
    "RankEntry",
    "RecoveredStall",
    "Report",
    "SlowIteration",
    "StragglerSummary",
    "WindowEntry",
    "Windows",
    "schema",
]

#: How an incarnation ended (``megatron/trace/README.md``, "How an incarnation ended").
Ended = Literal["shutdown", "failed", "interrupted", "cut_short", "restarted", "killed", "running"]


class _BoundSource(TypedDict, total=False):
    """Present when a bound was narrowed by more than the spans: where from (``report
    --json`` says it in a few words: ``the last metric export of incarnation 2, 8.0 s after
    its last exported span and at most 31.5 s before the kill``)."""

    source: Source


class Bound(_BoundSource):
    """A figure the trace can only bound: the truth lies in ``[lower, upper]`` (``None``:
    unbounded on that side), in the figure's unit, for ``reason`` (as data: the renderers
    put it in words, :func:`~megatron.trace.analysis.reasons.reason_text`)."""

    lower: float | None
    upper: float | None
    reason: Reason


class IncarnationEntry(TypedDict):
    """One incarnation (one process's ``pretrain()``) of the job rank. ``resumed_from``:
    the iteration of the checkpoint it resumed from, ``None`` for a fresh start; for one
    killed before its load was exported, what the incarnations around it imply, or the
    lower bound with ``bounds["incarnations.N.resumed_from"]``
    (:mod:`~megatron.trace.analysis.resumed`)."""

    rank: int | str
    index: int
    ended: Ended
    error_type: str | None
    pid: int | None
    cycle: int | None
    restart_gap_s: float | None
    first_iteration: int | None
    last_iteration: int | None
    resumed_from: int | None
    startup_s: float | None
    intervals: int
    start_s: float
    duration_s: float
    wasted_iterations: int | None
    wasted_s: float
    as_of: str | None
    in_flight_s: float


class SlowIteration(TypedDict):
    incarnation: int
    iteration: int
    duration_ms: float


class Anomalies(TypedDict):
    """The iterations over median + k x MAD: the rule, its figures, the slowest 20
    (``count`` None and ``slowest`` empty when too many are over it: not computed)."""

    rule: str
    mad_ms: float
    threshold_ms: float
    count: int | None
    slowest: list[SlowIteration]


class IterationStats(TypedDict):
    count: int
    median_ms: float
    p90_ms: float
    max_ms: float
    anomalous: Anomalies


class RankEntry(TypedDict):
    """One rank's own accounting, and its straggler figures (``None`` when not computed)."""

    rank: int | str
    wall_s: float
    goodput_s: float
    goodput_fraction: float
    wasted_iterations: int | None
    incarnations: int
    work_ms_median: float | None
    work_ms_q1: float | None
    work_ms_q3: float | None
    wait_ms_median: float | None
    score: float | None
    straggler: bool | None


class StragglerSummary(TypedDict):
    """The straggler rule (in words and its figures), the ranks it names, and those under
    the score threshold it does not name, their difference within the ranks' spread."""

    rule: str
    score_threshold: float
    fastest_rank: int | str
    fastest_work_ms_q3: float
    ranks: list[int | str]
    within_spread: list[int | str]


class HangEntry(TypedDict):
    """An incarnation that stopped making progress for good, on one rank."""

    rank: int | str
    incarnation: int
    ended: Ended
    last_iteration: int | None
    iteration: int | None
    span: str | None
    frame: str | None
    stalled_s: float
    detected_after_s: float | None
    waiting: bool | None
    culprit: bool | None


class RecoveredStall(TypedDict):
    rank: int | str
    incarnation: int
    iteration: int | None
    stalled_s: float | None


class LivenessEntry(TypedDict):
    """The rule a running job was judged by, against which clock, from which files."""

    rule: str
    now: str
    stale_after_s: float
    heartbeat_files: list[str]
    notes: list[str]


class IntervalChoice(TypedDict):
    """An interval between checkpoint saves: in seconds of training, in iterations (None
    without iteration spans), and the badput a day it is expected to cost (None without a
    mean time between failures)."""

    interval_s: float
    iterations: int | None
    badput_per_day_s: float | None


class CheckpointAdvice(TypedDict):
    """How often to checkpoint (:mod:`megatron.trace.analysis.checkpoint_advice`): the
    figures, the interval now, Young's and Daly's optimum (while save and restart are
    small against the MTBF) and the availability optimum (None: not computed, the reason
    in its own ``not_computed``)."""

    rule: str
    save_s: float | None
    saves: int
    failures: int
    run_s: float
    mtbf_s: float | None
    mtbf_source: Literal["observed", "option"] | None
    restart_s: float | None
    iteration_ms: float | None
    save_every: int | None
    now: IntervalChoice | None
    young: IntervalChoice | None
    daly: IntervalChoice | None
    #: The interval that maximises availability under random failures (any restart cost).
    availability: IntervalChoice | None
    #: Which model the badput figures come from: ``young`` or ``exponential``.
    badput_model: Literal["young", "exponential"] | None
    not_computed: list[str]


class WindowEntry(TypedDict):
    """One window of the job rank's wall clock (``report --window``): its accounting, as
    the whole report's, its largest badput categories (time > 0), largest first, and the
    iterations that ended in it: their count (None without iteration spans) and mean
    duration (None when none did)."""

    index: int
    start: str
    start_s: float
    end_s: float
    wall_s: float
    goodput_s: float
    goodput_fraction: float
    badput_s: dict[str, float | None]
    accounting_ns: dict[str, int]
    top_badput: list[str]
    iterations: int | None
    iteration_mean_ms: float | None


class Windows(TypedDict):
    """``report --window DURATION``: the wall clock cut every ``window_s`` from its start
    (the last window ends with it); the windows' ``accounting_ns`` add up to the whole's."""

    window_s: float
    entries: list[WindowEntry]


class _WhenJudged(TypedDict, total=False):
    """Present when the report was built with a liveness judgement (the command line's
    always is): the rule, and how old the newest record of a running job is."""

    as_of_age_s: float
    liveness: LivenessEntry


class _WhenWindowed(TypedDict, total=False):
    """Present when the report was asked for windows (``report --window``)."""

    windows: Windows


class Report(_WhenJudged, _WhenWindowed):
    """The goodput report: where the job rank's wall clock went, and what else was found.

    ``badput_s`` and ``accounting_ns`` are keyed by
    :class:`~megatron.trace_format.semconv.Category` values (``accounting_ns`` also
    by ``wall``); ``goodput + sum(badput) == wall`` exactly in
    ``accounting_ns``.
    """

    wall_s: float
    goodput_s: float
    goodput_fraction: float
    badput_s: dict[str, float | None]
    accounting_ns: dict[str, int]
    wasted_iterations: int | None
    incarnations: list[IncarnationEntry]
    iterations: IterationStats | None
    rank: int | str
    ranks: list[RankEntry]
    stragglers: StragglerSummary | None
    straggler_s: float | None
    hangs: list[HangEntry]
    recovered_stalls: list[RecoveredStall]
    spans: int
    torn_lines: int
    not_computed: list[str]
    #: the figures the trace can only bound, by their path (``wall_s``,
    #: ``badput_s.wasted_progress``, ``ranks.1.wasted_iterations``, ...)
    bounds: dict[str, Bound]
    running: bool
    as_of: str | None
    checkpoint_advice: CheckpointAdvice


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of ``report --json`` (``report.schema.json``, shipped in the package)."""
    text = resources.files(__package__).joinpath("report.schema.json").read_text("utf-8")
    return json.loads(text)
