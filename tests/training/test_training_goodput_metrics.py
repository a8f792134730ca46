"""The live goodput metrics of real runs agree with ``megatron-trace report`` on the same files."""

from __future__ import annotations

import json

import pytest

from megatron.core.telemetry.heartbeat import HEARTBEAT_METRIC
from megatron.trace.otlp.reader import iter_requests
from megatron.trace_format.semconv import BADPUT_CATEGORIES
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
)

pytestmark = pytest.mark.slow

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


def test_a_resumed_run_carries_the_job_forward(training_cli):
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
    # the job's figures, not the resumed run's alone
    assert final[MEGATRON_TRAINING_WALL_CLOCK_S]["job"] == pytest.approx(wall, abs=tolerance)
    assert final[MEGATRON_TRAINING_GOODPUT_S]["job"] == pytest.approx(
        report["goodput_s"], abs=tolerance
    )
    badput = final[MEGATRON_TRAINING_BADPUT_S]
    lost = report["badput_s"]["wasted_progress"] + report["badput_s"]["restart_gap"]
    assert lost > 0
    assert badput[WASTED_OR_RESTART_GAP] == pytest.approx(lost, abs=tolerance)
    for category in ("startup", "checkpoint_load", "checkpoint_save"):
        assert badput[category] == pytest.approx(report["badput_s"][category], abs=tolerance)
    assert final[MEGATRON_TRAINING_ITERATION][""] == 20
