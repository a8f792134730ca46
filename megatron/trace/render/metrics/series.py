"""What ``megatron-trace watch`` serves of each rank, declared once for both outputs.

Each :class:`RankSeries` is a gauge named in the vocabulary (its OpenTelemetry name, unit
and description, and its Prometheus name: :class:`~megatron.trace_format.semconv.Gauge`,
:data:`~megatron.trace_format.semconv.WATCH_GAUGES`), the labels it adds
beside ``run_id`` and ``rank``, and the points it takes from a rank's
:class:`~megatron.trace.live.job.RankFigures`. The Prometheus endpoint
(:mod:`~megatron.trace.render.metrics.prometheus`) and the OTLP push
(:mod:`~megatron.trace.render.metrics.otlp_push`) both serve :data:`RANK_SERIES`; the
goodput gauges are the trainer's own (:data:`~megatron.trace_format.semconv.GOODPUT_GAUGES`),
so one dashboard charts a job of ours and a watched Megatron-LM job alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from megatron.trace.live.job import STATES, RankFigures
from megatron.trace_format.semconv import (
    BADPUT_CATEGORY_ATTRIBUTE,
    GOODPUT_GAUGES,
    ITERATION_TIME_SOURCE_ATTRIBUTE,
    MEGATRON_HANG_DURATION_S,
    MEGATRON_HANG_SUSPECTED,
    MEGATRON_JOB_STATE,
    MEGATRON_STRAGGLER_NAMED,
    MEGATRON_STRAGGLER_SCORE,
    MEGATRON_TRAINING_BADPUT_S,
    MEGATRON_TRAINING_GOODPUT_FRACTION,
    MEGATRON_TRAINING_GOODPUT_S,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_ITERATION_TIME_S,
    MEGATRON_TRAINING_WALL_CLOCK_S,
    WATCH_GAUGES,
    Gauge,
)

__all__ = ["RANK_SERIES", "Points", "RankSeries"]

#: A series' points of one rank: (value, the labels it adds beside run_id and rank).
Points = Iterable[tuple[float, dict[str, str]]]


@dataclass(frozen=True)
class RankSeries:
    """One gauge of every rank, and how its points come from the rank's figures."""

    gauge: Gauge
    points: Callable[[RankFigures], Points]
    labels: tuple[str, ...] = ()  # the labels its points add (the same in every point)


def _one(value: float | int | bool | None) -> Points:
    return [] if value is None else [(float(value), {})]


def _badput(figures: RankFigures) -> Points:
    return [
        (seconds, {BADPUT_CATEGORY_ATTRIBUTE: str(getattr(category, "value", category))})
        for category, seconds in figures.badput_s.items()
    ]


def _state(figures: RankFigures) -> Points:
    return [(1.0 if figures.state == state else 0.0, {"state": state}) for state in STATES]


def _iteration_time(figures: RankFigures) -> Points:
    if figures.iteration_time_s is None:
        return []
    source = figures.iteration_time_source or ""
    return [(figures.iteration_time_s, {ITERATION_TIME_SOURCE_ATTRIBUTE: source})]


_GOODPUT_POINTS: dict[str, tuple[Callable[[RankFigures], Points], tuple[str, ...]]] = {
    MEGATRON_TRAINING_GOODPUT_S: (lambda f: _one(f.goodput_s), ()),
    MEGATRON_TRAINING_BADPUT_S: (_badput, (BADPUT_CATEGORY_ATTRIBUTE,)),
    MEGATRON_TRAINING_WALL_CLOCK_S: (lambda f: _one(f.wall_s), ()),
    MEGATRON_TRAINING_GOODPUT_FRACTION: (
        lambda f: _one(f.goodput_s / f.wall_s if f.wall_s else 0.0),
        (),
    ),
    MEGATRON_TRAINING_ITERATION: (lambda f: _one(f.iteration), ()),
}

_WATCH_POINTS: dict[str, tuple[Callable[[RankFigures], Points], tuple[str, ...]]] = {
    MEGATRON_JOB_STATE: (_state, ("state",)),
    # a natural zero: no hang suspected, whether or not the spans could show one
    MEGATRON_HANG_SUSPECTED: (lambda f: _one(bool(f.hang_suspected)), ()),
    MEGATRON_HANG_DURATION_S: (lambda f: _one(f.hang_s if f.hang_suspected else 0.0), ()),
    MEGATRON_TRAINING_ITERATION_TIME_S: (_iteration_time, (ITERATION_TIME_SOURCE_ATTRIBUTE,)),
    MEGATRON_STRAGGLER_SCORE: (lambda f: _one(f.straggler_score), ()),
    # a natural zero too: not named, whether or not the ranks could be compared
    MEGATRON_STRAGGLER_NAMED: (lambda f: _one(bool(f.straggler)), ()),
}

#: Every series of every rank, in the order served: the goodput gauges, then watch's own.
RANK_SERIES: tuple[RankSeries, ...] = tuple(
    RankSeries(gauge, *points[name])
    for gauges, points in ((GOODPUT_GAUGES, _GOODPUT_POINTS), (WATCH_GAUGES, _WATCH_POINTS))
    for name, gauge in gauges.items()
)
