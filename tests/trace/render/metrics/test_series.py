"""Each rank series watch serves is declared once, and both outputs take it from there."""

from __future__ import annotations

import pytest

from megatron.trace.analysis.stragglers import SCORE_THRESHOLD
from megatron.trace.live.job import STATES, RankFigures
from megatron.trace.render.metrics.prometheus import METRICS, label
from megatron.trace.render.metrics.series import RANK_SERIES
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    GOODPUT_GAUGES,
    ITERATION_TIME_SOURCE_ATTRIBUTE,
    ITERATION_TIME_SOURCES,
    MEGATRON_STRAGGLER_NAMED,
    MEGATRON_TRAINING_ITERATION_TIME_S,
    WATCH_GAUGES,
)


def _figures(**changes: object) -> RankFigures:
    figures = {
        "rank": "0",
        "state": "running",
        "ended": "running",
        "wall_s": 100.0,
        "goodput_s": 80.0,
        "badput_s": dict.fromkeys(BADPUT_CATEGORIES, 2.0),
        "iteration": 41,
        "iteration_time_s": 0.5,
        "hang_suspected": False,
        "hang_s": 0.0,
        "straggler_score": 0.9,
        "iteration_time_source": "loop_passes",
    }
    return RankFigures(**{**figures, **changes})


def test_names_are_unique_and_the_goodput_ones_are_the_trainers() -> None:
    names = [series.gauge.name for series in RANK_SERIES]
    prometheus = [series.gauge.prometheus for series in RANK_SERIES]
    assert len(set(names)) == len(names) and len(set(prometheus)) == len(prometheus)
    assert [s.gauge for s in RANK_SERIES[: len(GOODPUT_GAUGES)]] == list(GOODPUT_GAUGES.values())


@pytest.mark.parametrize("series", RANK_SERIES, ids=lambda series: series.gauge.name)
def test_each_is_served_by_the_endpoint_in_prometheus_conventions(series) -> None:
    gauge = series.gauge
    kind, text = METRICS[gauge.prometheus]
    assert kind == "gauge" and gauge.description in text and gauge.name in text
    assert gauge.prometheus.endswith("_seconds") == (gauge.unit == "s")
    assert all("." not in label(attribute) for attribute in series.labels)


@pytest.mark.parametrize(
    "figures",
    [_figures(), _figures(iteration=None, iteration_time_s=None, straggler_score=None),
     _figures(hang_suspected=None, hang_s=None), _figures(wall_s=0.0, goodput_s=0.0)],
    ids=["all", "no-iterations", "hang-not-computed", "no-wall-clock"],
)  # fmt: skip
def test_every_point_carries_the_labels_its_series_declares(figures: RankFigures) -> None:
    for series in RANK_SERIES:
        for value, extra in series.points(figures):
            assert set(extra) == set(series.labels), series.gauge.name
            assert isinstance(value, float)


def test_the_points_say_the_figures() -> None:
    points = {s.gauge.prometheus: list(s.points(_figures())) for s in RANK_SERIES}
    assert points["megatron_training_goodput_ratio"] == [(0.8, {})]
    assert points["megatron_training_iteration"] == [(41.0, {})]
    states = {extra["state"]: value for value, extra in points["megatron_job_state"]}
    assert states == {state: float(state == "running") for state in STATES}
    assert len(points["megatron_training_badput_seconds"]) == len(BADPUT_CATEGORIES)
    assert points["megatron_iteration_time_seconds"] == [
        (0.5, {ITERATION_TIME_SOURCE_ATTRIBUTE: "loop_passes"})
    ]


def test_a_hang_not_computed_is_served_as_none_suspected() -> None:
    """Hang seconds and the hung ranks have a natural zero: a rank whose spans cannot show
    a hang (no iteration spans, loop passes or watchdog record) serves 0, not nothing, so a
    dashboard draws 0 rather than "no data"."""
    for figures in (_figures(hang_suspected=None, hang_s=None), _figures()):
        points = {s.gauge.prometheus: list(s.points(figures)) for s in RANK_SERIES}
        assert points["megatron_hang_suspected"] == [(0.0, {})]
        assert points["megatron_hang_seconds"] == [(0.0, {})]
    points = {
        s.gauge.prometheus: list(s.points(_figures(hang_suspected=True, hang_s=42.0)))
        for s in RANK_SERIES
    }
    assert points["megatron_hang_suspected"] == [(1.0, {})]
    assert points["megatron_hang_seconds"] == [(42.0, {})]


def test_the_straggler_flag_is_served_as_0_unless_the_rule_names_the_rank() -> None:
    """Not computed (one rank, no per_step spans) and not named both read 0; the gauge's
    description states report's threshold."""
    for straggler, served in ((None, 0.0), (False, 0.0), (True, 1.0)):
        points = {
            s.gauge.prometheus: list(s.points(_figures(straggler=straggler))) for s in RANK_SERIES
        }
        assert points["megatron_straggler_named"] == [(served, {})]
    gauge = WATCH_GAUGES[MEGATRON_STRAGGLER_NAMED]
    assert f"score under {SCORE_THRESHOLD:g}" in gauge.description


def test_the_iteration_time_says_its_source() -> None:
    for source in ITERATION_TIME_SOURCES:
        (point,) = next(
            s.points(_figures(iteration_time_s=2.0, iteration_time_source=source))
            for s in RANK_SERIES
            if s.gauge.name == MEGATRON_TRAINING_ITERATION_TIME_S
        )
        assert point == (2.0, {ITERATION_TIME_SOURCE_ATTRIBUTE: source})
