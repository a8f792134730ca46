"""The example Prometheus rules shipped for ``megatron-trace watch``, checked by ``promtool``.

``promtool check rules`` on the file as installed (package data), and ``promtool
test rules`` feeding each alert the series ``watch`` serves: it fires when it
should and not otherwise, keeps its identity (``run_id``) while a run goes from
stalled to killed, and the recording rules read a falling goodput gauge as a fall
(``delta``), the progress counter as progress (``rate``, no reset). Runs in
``tox -e promtool`` (and wherever promtool is).
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from promtool import REQUIRED, promtool

from megatron.trace.render.metrics.prometheus import METRICS

RULES = importlib.resources.files("megatron.trace") / "watch_rules.yml"

UNIT_TESTS = r"""
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'megatron_training_goodput_ratio{{run_id="a",rank="0"}}'
        values: '0.5x40'
      - series: 'megatron_job_state{{run_id="a",rank="0",state="running"}}'
        values: '1x40'
      - series: 'megatron_training_goodput_ratio{{run_id="b",rank="0"}}'
        values: '0.95x40'
      - series: 'megatron_job_state{{run_id="b",rank="0",state="running"}}'
        values: '1 1 1 0x37'
      - series: 'megatron_hang_suspected{{run_id="a",rank="1"}}'
        values: '0 0 1 1 1 1'
      - series: 'megatron_hang_seconds{{run_id="a",rank="1"}}'
        values: '0 0 400 460 520 580'
      # run b dies at 3m: stalled on both ranks, then killed from 6m; one alert throughout
      - series: 'megatron_job_state{{run_id="b",rank="0",state="stalled"}}'
        values: '0 0 0 1 1 1 0x34'
      - series: 'megatron_job_state{{run_id="b",rank="0",state="killed"}}'
        values: '0 0 0 0 0 0 1x34'
      - series: 'megatron_job_state{{run_id="b",rank="1",state="stalled"}}'
        values: '0 0 0 0 1 1 0x34'
      - series: 'megatron_job_state{{run_id="b",rank="1",state="killed"}}'
        values: '0 0 0 0 0 0 1x34'
      # run c: 60 s of progress per minute; at 10m a kill turns 120 s of goodput into
      # wasted progress: the goodput gauge falls, the progress counter does not
      - series: 'megatron_training_goodput_seconds{{run_id="c",rank="0"}}'
        values: '0+60x9 420 420 420 420 420 420 420 420 420 420 420 420 420 420 420 420'
      - series: 'megatron_training_progress_seconds_total{{run_id="c",rank="0"}}'
        values: '0+60x9 540 540 540 540 540 540 540 540 540 540 540 540 540 540 540 540'
      - series: 'megatron_training_lost_progress_seconds_total{{run_id="c",rank="0"}}'
        values: '0x9 120 120 120 120 120 120 120 120 120 120 120 120 120 120 120 120'
    alert_rule_test:
      - eval_time: 35m
        alertname: MegatronGoodputLow
        exp_alerts:
          - exp_labels: {{severity: warning, run_id: a}}
            exp_annotations:
              summary: "a: goodput 50% of the wall clock"
              description: "Under 80 % of the run's wall clock so far made progress that \
                survived; megatron_training_badput_seconds by category says where the rest went."
      - eval_time: 5m
        alertname: MegatronHangSuspected
        exp_alerts:
          - exp_labels: {{severity: critical, run_id: a}}
            exp_annotations:
              summary: "a: iterations stopped (a hang is suspected)"
              description: "No iteration finished for longer than max(floor, k x its rolling \
                median iteration time), or the hang watchdog reported a stall, on 1 rank(s); \
                it has lasted 9m 40s."
      - eval_time: 1m
        alertname: MegatronHangSuspected
        exp_alerts: []
      - eval_time: 5m
        alertname: MegatronJobStalled
        exp_alerts:
          - exp_labels: {{severity: critical, run_id: b}}
            exp_annotations:
              summary: "b: signs of life stopped without an ending"
              description: "Neither spans nor metric points arrived within the staleness \
                bound, and the spans do not show the job ending, on 2 rank(s) (0 killed)."
      # stalled -> killed: the same alert, its labels unchanged
      - eval_time: 30m
        alertname: MegatronJobStalled
        exp_alerts:
          - exp_labels: {{severity: critical, run_id: b}}
            exp_annotations:
              summary: "b: signs of life stopped without an ending"
              description: "Neither spans nor metric points arrived within the staleness \
                bound, and the spans do not show the job ending, on 2 rank(s) (2 killed)."
    promql_expr_test:
      - expr: run:megatron_training_goodput_ratio:min
        eval_time: 10m
        exp_samples:
          - labels: 'run:megatron_training_goodput_ratio:min{{run_id="a"}}'
            value: 0.5
          - labels: 'run:megatron_training_goodput_ratio:min{{run_id="b"}}'
            value: 0.95
      # the fall of the gauge is a fall, not a counter reset: 420 s now, 0 s 15 minutes ago
      - expr: run:megatron_training_goodput_seconds:delta15m
        eval_time: 15m
        exp_samples:
          - labels: 'run:megatron_training_goodput_seconds:delta15m{{run_id="c"}}'
            value: 420
      # the counter reads the progress as made: 540 s over the window's 15 minutes
      - expr: run:megatron_training_progress_seconds:rate15m
        eval_time: 15m
        exp_samples:
          - labels: 'run:megatron_training_progress_seconds:rate15m{{run_id="c"}}'
            value: 0.6
      - expr: resets(megatron_training_progress_seconds_total[15m])
        eval_time: 15m
        exp_samples:
          - labels: '{{run_id="c",rank="0"}}'
            value: 0
"""


def test_the_rules_are_shipped_and_name_only_what_watch_serves() -> None:
    text = re.sub(r"\brun:[a-z0-9_:]+", "", RULES.read_text())  # the recorded series' names
    used = set(re.findall(r"\bmegatron_[a-z_]+", text)) - {"megatron_goodput"}
    assert used and used <= set(METRICS), used - set(METRICS)


def test_promtool_check_rules_passes() -> None:
    with importlib.resources.as_file(RULES) as path:
        result = subprocess.run(
            [promtool(), "check", "rules", str(path)], capture_output=True, text=True
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_the_alerts_fire_as_promtool_test_rules_sees_them(tmp_path: Path) -> None:
    tool = promtool()
    with importlib.resources.as_file(RULES) as path:
        rules = tmp_path / "watch_rules.yml"
        rules.write_text(Path(path).read_text())
    tests = tmp_path / "tests.yml"
    tests.write_text(UNIT_TESTS.format(rules=rules.name))
    result = subprocess.run(
        [tool, "test", "rules", tests.name], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr


ROUTING = importlib.resources.files("megatron.trace") / "watch_alertmanager.yml"
DASHBOARD = importlib.resources.files("megatron.trace") / "watch_dashboard.json"


def test_the_alertmanager_routing_passes_amtool_check_config() -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        reason = "amtool is not installed (apt-get install prometheus-alertmanager)"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    text = ROUTING.read_text()
    # one notification group per alert and run; a dead run's hang and goodput are inhibited
    assert "group_by: [alertname, run_id]" in text and "equal: [run_id]" in text
    with importlib.resources.as_file(ROUTING) as path:
        result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_queries_only_what_watch_serves_by_run_and_rank() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "run_id", "rank"}
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for expr in exprs:
        names = set(re.findall(r"\bmegatron_[a-z_]+", expr))
        assert names and names <= set(METRICS), expr
        assert 'run_id=~"$run_id"' in expr and 'rank=~"$rank"' in expr, expr
        # rate() only of counters; the gauges through gauge functions
        for name in re.findall(r"rate\((megatron_[a-z_]+)", expr):
            assert METRICS[name][0] == "counter", expr
