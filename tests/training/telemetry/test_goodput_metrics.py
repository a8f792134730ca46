"""Live goodput metrics: the accounting so far, at every collection, carried across a resume;
and those of real runs (``slow``) agree with ``megatron-trace report`` on the same files."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from megatron.core.telemetry import TelemetryConfig, managed_span, setup_telemetry, state
from megatron.core.telemetry.heartbeat import HEARTBEAT_METRIC
from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.liveness import Clock
from megatron.trace.otlp.reader import iter_requests
from megatron.trace_format.semconv import (
    BADPUT_CATEGORIES,
    MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME,
)
from megatron.training.telemetry.goodput_metrics import (
    CATEGORY_ATTRIBUTE,
    MEGATRON_TRAINING_BADPUT_S,
    MEGATRON_TRAINING_GOODPUT_FRACTION,
    MEGATRON_TRAINING_GOODPUT_S,
    MEGATRON_TRAINING_ITERATION,
    MEGATRON_TRAINING_WALL_CLOCK_S,
    SCOPE_ATTRIBUTE,
    WASTED_OR_RESTART_GAP,
    CarriedGoodput,
    LiveGoodput,
    checkpoint_sidecar,
    saving,
    start_live_goodput,
)
from megatron.training.telemetry_spans import SpanPhases

S = 1_000_000_000
T0 = 1_800_000_000 * S  # an arbitrary wall-clock origin


@pytest.fixture(autouse=True)
def _no_active_handle() -> Iterator[None]:
    state._reset()
    yield
    state._reset()


def values(reader_or_lines) -> dict[tuple[str, tuple], float]:
    """(metric, sorted attributes) -> value, from an in-memory reader's collection."""
    found = {}
    for resource in reader_or_lines.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted((point.attributes or {}).items())))
                    found[key] = point.value
    return found


def last_export(metrics_file: Path) -> dict[tuple[str, tuple], float]:
    """The same, from the last line of a ``metrics.jsonl``."""
    *_, (_, _, request) = iter_requests(metrics_file)
    found = {}
    for resource in request["resourceMetrics"]:
        for scope in resource["scopeMetrics"]:
            for metric in scope["metrics"]:
                for point in (metric.get("gauge") or {}).get("dataPoints", []):
                    attributes = tuple(
                        sorted(
                            (kv["key"], kv["value"]["stringValue"])
                            for kv in point.get("attributes", [])
                        )
                    )
                    value = point.get("asDouble", point.get("asInt"))
                    found[(metric["name"], attributes)] = float(value)
    return found


def job(**extra: str) -> tuple:
    return tuple(sorted({SCOPE_ATTRIBUTE: "job", **extra}.items()))


def badput(figures: dict, category: str, scope: str = "job") -> float:
    key = tuple(sorted({SCOPE_ATTRIBUTE: scope, CATEGORY_ATTRIBUTE: category}.items()))
    return figures[(MEGATRON_TRAINING_BADPUT_S, key)]


def test_mid_run_figures_count_the_open_interval_as_goodput(tmp_path: Path) -> None:
    """Startup 0-2 s, C0 2-6 s with a save 4-5 s, C1 open since 6 s; collected at 9 s."""
    reader = InMemoryMetricReader()
    config = TelemetryConfig(enabled=True, exporter="jsonl", trace_file=tmp_path / "t.jsonl")
    handle = setup_telemetry(config, metric_reader=reader)
    now = [T0 + 9 * S]
    live = LiveGoodput(handle.tally, is_shut_down=lambda: handle.is_shut_down, clock=lambda: now[0])
    live.register(handle.meter)
    live.follow_iteration(lambda: 7)
    tracer = handle.tracer
    startup = tracer.start_span("megatron.startup", start_time=T0)
    startup.end(end_time=T0 + 2 * S)
    c0 = tracer.start_span("megatron.train", start_time=T0 + 2 * S, context=trace.Context())
    save = tracer.start_span(
        "megatron.checkpoint.save", start_time=T0 + 4 * S, context=trace.set_span_in_context(c0)
    )
    save.end(end_time=T0 + 5 * S)
    c0.set_attribute("megatron.interval.rerooted", True)
    c0.end(end_time=T0 + 6 * S)
    c1 = tracer.start_span("megatron.train", start_time=T0 + 6 * S, context=trace.Context())

    figures = values(reader)
    assert figures[(MEGATRON_TRAINING_WALL_CLOCK_S, job())] == 9.0
    assert figures[(MEGATRON_TRAINING_GOODPUT_S, job())] == 6.0  # C0 less its save, and C1 so far
    assert figures[(MEGATRON_TRAINING_GOODPUT_FRACTION, job())] == pytest.approx(6 / 9)
    assert badput(figures, "startup") == 2.0 and badput(figures, "checkpoint_save") == 1.0
    assert {badput(figures, c) for c in BADPUT_CATEGORIES} - {2.0, 1.0} == {0.0}
    assert (
        MEGATRON_TRAINING_BADPUT_S,
        job(**{CATEGORY_ATTRIBUTE: WASTED_OR_RESTART_GAP}),
    ) not in figures
    assert figures[(MEGATRON_TRAINING_ITERATION, ())] == 7
    assert figures[(HEARTBEAT_METRIC, ())] == 1

    now[0] = T0 + 12 * S  # three seconds later, the open interval has grown
    figures = values(reader)
    assert figures[(MEGATRON_TRAINING_GOODPUT_S, job())] == 9.0
    record = live.checkpoint_record(iteration=40)
    assert record is not None
    assert (record.wall_start_ns, record.as_of_ns, record.iteration) == (T0, T0 + 12 * S, 40)
    assert record.totals_ns["goodput"] == 9 * S and record.scope == "job"
    c1.end()
    handle.shutdown()


def test_the_save_start_gauge_says_when_the_save_in_flight_began(tmp_path: Path) -> None:
    """0 outside a save; inside, the save's start in Unix seconds (``report`` reads it after
    a kill); 0 again once it ended, even by an exception. ``saving(None)``: telemetry off."""
    reader = InMemoryMetricReader()
    handle = setup_telemetry(TelemetryConfig(enabled=True, exporter="none"), metric_reader=reader)
    now = [T0 + 9 * S]
    live = LiveGoodput(handle.tally, clock=lambda: now[0])
    live.register(handle.meter)
    key = (MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME, ())
    assert values(reader)[key] == 0.0
    with saving(live):
        now[0] = T0 + 12 * S
        assert values(reader)[key] == (T0 + 9 * S) / S
    assert values(reader)[key] == 0.0
    with pytest.raises(OSError), saving(live):
        raise OSError("disk full")
    assert values(reader)[key] == 0.0
    with saving(None):
        pass
    handle.shutdown()


def _run_in_process(tmp_path: Path, *, cut_short: bool) -> Path:
    """A short real lifecycle through the jsonl sink, with live goodput on its meter."""
    trace_file = tmp_path / "telemetry" / "traces.jsonl"
    config = TelemetryConfig(
        enabled=True, exporter="jsonl", trace_file=trace_file, span_groups_spec="per_step"
    )
    handle = setup_telemetry(config)
    phases = SpanPhases(handle, save_interval=3)
    phases.start_job(model_type="GPT")
    time.sleep(0.05)
    live = start_live_goodput(handle, None, 0)
    assert live is not None and live.scope == "job"
    phases.start_train()
    for iteration in range(7):
        phases.step(iteration)
        with managed_span("step", "megatron.train.iteration", **{"megatron.iteration": iteration}):
            time.sleep(0.03)
        if (iteration + 1) % 3 == 0:
            with managed_span(
                "checkpoint", "megatron.checkpoint.save", **{"megatron.iteration": iteration + 1}
            ):
                time.sleep(0.01)
    if cut_short:  # a hard SIGTERM mid-iteration: the hook shuts down with it open
        handle.tracer.start_span(
            "megatron.train.iteration", attributes={"megatron.iteration": 7}
        )  # ended by telemetry shutdown, marked cut short
        time.sleep(0.03)
    else:
        phases.end_train()
    phases.shutdown()
    return trace_file


@pytest.mark.parametrize("cut_short", [False, True], ids=["shutdown", "cut_short"])
def test_the_final_export_agrees_with_report(tmp_path: Path, cut_short: bool) -> None:
    trace_file = _run_in_process(tmp_path, cut_short=cut_short)
    report = report_files([trace_file], Clock.system())
    assert report["incarnations"][0]["ended"] == ("cut_short" if cut_short else "shutdown")
    final = last_export(trace_file.with_name("metrics.jsonl"))
    wall = report["wall_s"]
    assert final[(MEGATRON_TRAINING_WALL_CLOCK_S, job())] == pytest.approx(wall, abs=0.02 * wall)
    assert final[(MEGATRON_TRAINING_GOODPUT_S, job())] == pytest.approx(
        report["goodput_s"], abs=0.02 * wall
    )
    for category in BADPUT_CATEGORIES:
        assert badput(final, category) == pytest.approx(
            report["badput_s"][category], abs=0.02 * wall
        ), category
    assert (report["badput_s"]["wasted_progress"] > 0) == cut_short
    assert final[(HEARTBEAT_METRIC, ())] == 0


def test_a_resumed_run_carries_the_job_forward() -> None:
    """Saved at 100 s of a job that began at 0 with 60 s goodput; this run starts at 130 s."""
    carried = CarriedGoodput(
        wall_start_ns=T0,
        as_of_ns=T0 + 100 * S,
        totals_ns={"goodput": 60 * S, "startup": 30 * S, "checkpoint_save": 10 * S},
        scope="job",
        iteration=50,
    )
    reader = InMemoryMetricReader()
    handle = setup_telemetry(TelemetryConfig(enabled=True, exporter="none"), metric_reader=reader)
    live = LiveGoodput(handle.tally, carried=carried, resumed=True, clock=lambda: T0 + 140 * S)
    live.register(handle.meter)
    handle.tracer.start_span("megatron.startup", start_time=T0 + 130 * S).end(end_time=T0 + 135 * S)
    handle.tracer.start_span("megatron.train", start_time=T0 + 135 * S, context=trace.Context())
    figures = values(reader)
    assert figures[(MEGATRON_TRAINING_WALL_CLOCK_S, job())] == 140.0
    assert figures[(MEGATRON_TRAINING_GOODPUT_S, job())] == 65.0
    assert badput(figures, "startup") == 35.0
    assert badput(figures, "checkpoint_save") == 10.0
    assert badput(figures, WASTED_OR_RESTART_GAP) == 30.0  # 100 s .. 130 s: not this run's to split
    record = live.checkpoint_record(60)
    assert record is not None and record.totals_ns[WASTED_OR_RESTART_GAP] == 30 * S
    assert CarriedGoodput.from_json(record.to_json()) == record
    handle.shutdown()


def test_a_resumed_run_without_a_record_reports_itself_alone(tmp_path: Path, caplog) -> None:
    reader = InMemoryMetricReader()
    handle = setup_telemetry(TelemetryConfig(enabled=True, exporter="none"), metric_reader=reader)
    (tmp_path / "iter_0000050").mkdir()
    live = start_live_goodput(handle, str(tmp_path), 50)
    assert live is not None and live.scope == "incarnation" and live.carried is None
    (tmp_path / "iter_0000050" / "goodput_rank0.json").write_text("{not json")
    live = start_live_goodput(handle, str(tmp_path), 50)
    assert live is not None and live.scope == "incarnation"
    assert "goodput record" in caplog.text and "unreadable" in caplog.text
    handle.tracer.start_span("megatron.startup").end()
    scopes = {dict(key[1]).get(SCOPE_ATTRIBUTE) for key in values(reader) if key[1]}
    assert scopes == {"incarnation"}
    sidecar = checkpoint_sidecar(live, 60)
    assert sidecar is not None and sidecar[0] == "goodput_rank0.json"
    assert json.loads(sidecar[1])["scope"] == "incarnation"  # a later resume knows it too
    handle.shutdown()


def test_no_live_goodput_without_spans_or_metrics(tmp_path: Path) -> None:
    trace_file = tmp_path / "t.jsonl"
    for switch in ("metrics_enabled", "traces_enabled"):
        handle = setup_telemetry(
            TelemetryConfig(
                enabled=True, exporter="jsonl", trace_file=trace_file, **{switch: False}
            )
        )
        assert start_live_goodput(handle, None, 0) is None
        handle.shutdown()
    assert start_live_goodput(setup_telemetry(TelemetryConfig(enabled=False)), None, 0) is None
    assert checkpoint_sidecar(None, 10) is None


def test_a_failing_accounting_is_one_warning_and_no_values(caplog) -> None:
    class Broken:
        def structural_snapshot(self, since: int = 0):
            raise RuntimeError("tally broke")

    reader = InMemoryMetricReader()
    handle = setup_telemetry(TelemetryConfig(enabled=True, exporter="none"), metric_reader=reader)
    LiveGoodput(Broken()).register(handle.meter)
    names = {name for name, _ in values(reader)}
    values(reader)
    # the heartbeat still beats, and the save-start gauge needs no accounting
    assert names == {HEARTBEAT_METRIC, MEGATRON_TRAINING_CHECKPOINT_SAVE_START_TIME}
    assert caplog.text.count("Could not compute the live goodput figures") == 1
    handle.shutdown()


# -- real runs: the metrics file agrees with report on the trace file ----------------

TRACE = "ckpt/telemetry/traces.jsonl"
METRICS = "ckpt/telemetry/metrics.jsonl"


def _report(cli) -> dict:
    result = cli.run("report", TRACE, "--json", module=("-m", "megatron.trace"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _last_export(cli) -> dict[str, dict[str, float]]:
    """metric name -> {category or scope or "": value}, from the last line of metrics.jsonl."""
    *_, (_, _, request) = iter_requests(cli.cwd / METRICS)
    found: dict[str, dict[str, float]] = {}
    for resource in request["resourceMetrics"]:
        for scope in resource["scopeMetrics"]:
            for metric in scope["metrics"]:
                for point in (metric.get("gauge") or {}).get("dataPoints", []):
                    attributes = {
                        kv["key"]: kv["value"]["stringValue"] for kv in point.get("attributes", [])
                    }
                    key = attributes.get(CATEGORY_ATTRIBUTE, attributes.get(SCOPE_ATTRIBUTE, ""))
                    value = float(point.get("asDouble", point.get("asInt")))
                    found.setdefault(metric["name"], {})[key] = value
    return found


def _scopes(cli) -> set[str]:
    *_, (_, _, request) = iter_requests(cli.cwd / METRICS)
    return {
        kv["value"]["stringValue"]
        for resource in request["resourceMetrics"]
        for scope in resource["scopeMetrics"]
        for metric in scope["metrics"]
        for point in (metric.get("gauge") or {}).get("dataPoints", [])
        for kv in point.get("attributes", [])
        if kv["key"] == SCOPE_ATTRIBUTE
    }


@pytest.mark.slow
def test_a_finished_run_exports_what_report_says(training_cli):
    cli = training_cli
    run = cli.run(
        *cli.TINY, *cli.TELEMETRY_ON,
        "--train-iters", "12", "--save", "ckpt", "--save-interval", "4", "--eval-interval", "6",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = _report(cli)
    final = _last_export(cli)
    wall = report["wall_s"]
    tolerance = 0.02 * wall
    assert final[MEGATRON_TRAINING_WALL_CLOCK_S]["job"] == pytest.approx(wall, abs=tolerance)
    assert final[MEGATRON_TRAINING_GOODPUT_S]["job"] == pytest.approx(
        report["goodput_s"], abs=tolerance
    )
    assert final[MEGATRON_TRAINING_GOODPUT_FRACTION]["job"] == pytest.approx(
        report["goodput_fraction"], abs=0.02
    )
    badput = final[MEGATRON_TRAINING_BADPUT_S]
    assert set(badput) == set(BADPUT_CATEGORIES)
    for category in BADPUT_CATEGORIES:
        assert badput[category] == pytest.approx(report["badput_s"][category], abs=tolerance)
    assert badput["checkpoint_save"] > 0 and badput["evaluation"] > 0 and badput["startup"] > 0
    assert final[MEGATRON_TRAINING_ITERATION][""] == 12
    assert final[HEARTBEAT_METRIC][""] == 0
    assert _scopes(cli) == {"job"}
    # every save left the job's figures beside its checkpoint, for a resume
    for iteration in (4, 8, 12):
        record = CarriedGoodput.read(cli.cwd / f"ckpt/iter_{iteration:07d}/goodput_rank0.json")
        assert record is not None and (record.iteration, record.scope) == (iteration, "job")
        assert 0 < record.totals_ns["goodput"] < record.as_of_ns - record.wall_start_ns


@pytest.mark.slow
def test_a_resumed_real_run_carries_the_job_forward(training_cli):
    """The live figures are the job's, and agree with ``report`` on the files: exactly
    where the report is exact, within its bounds where the kill kept spans from the file
    (a kill during the save of iteration 15, say, loses iteration 15's span, which the
    report can only bound, while the resumed run carries the figures saved with 15)."""
    cli = training_cli
    args = (*cli.TINY, *cli.TELEMETRY_ON, "--save", "ckpt", "--save-interval", "5")
    resumed = cli.killed_then_resumed(args, cli.cwd / TRACE, load="ckpt", resume_iters=20)
    assert resumed.returncode == 0, resumed.stderr

    report = _report(cli)
    assert [i["ended"] for i in report["incarnations"]] == ["killed", "shutdown"]
    final = _last_export(cli)
    assert _scopes(cli) == {"job"}
    wall = report["wall_s"]
    tolerance = 0.02 * wall
    bounds = report["bounds"]

    def within(live: float, path: str, figure: float) -> None:
        bound = bounds.get(path)
        if bound is None:
            assert live == pytest.approx(figure, abs=tolerance), path
        else:
            upper = math.inf if bound["upper"] is None else bound["upper"]
            assert bound["lower"] - tolerance <= live <= upper + tolerance, (path, live, bound)

    # the job's figures, not the resumed run's alone
    assert "wall_s" not in bounds
    assert final[MEGATRON_TRAINING_WALL_CLOCK_S]["job"] == pytest.approx(wall, abs=tolerance)
    within(final[MEGATRON_TRAINING_GOODPUT_S]["job"], "goodput_s", report["goodput_s"])
    for category in ("startup", "checkpoint_load", "checkpoint_save"):
        within(final[MEGATRON_TRAINING_BADPUT_S][category], f"badput_s.{category}",
               report["badput_s"][category])  # fmt: skip
    # the stretch from the save resumed from to the restart, which the live gauges cannot
    # split: the report's wasted progress and restart gap, and the rest of that save
    lost = final[MEGATRON_TRAINING_BADPUT_S][WASTED_OR_RESTART_GAP]
    assert lost > 0

    def bound(category: str, side: str) -> float:
        return bounds.get(f"badput_s.{category}", {}).get(side, report["badput_s"][category])

    lower = bound("wasted_progress", "lower") + bound("restart_gap", "lower")
    upper = sum(bound(c, "upper") for c in ("wasted_progress", "restart_gap", "checkpoint_save"))
    assert lower - tolerance <= lost <= upper + tolerance, (lost, lower, upper)
    assert final[MEGATRON_TRAINING_ITERATION][""] == 20
