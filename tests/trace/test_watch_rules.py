"""The example Prometheus rules shipped for ``megatron-trace watch``, checked by ``promtool``.

``promtool check rules`` on the file as installed (package data), and ``promtool
test rules`` feeding each alert the series ``watch`` serves: it fires when it
should and not otherwise. Runs in ``tox -e promtool`` (and wherever promtool is).
"""

from __future__ import annotations

import importlib.resources
import re
import subprocess
from pathlib import Path

from promtool import promtool

from megatron.trace.render.metrics.prometheus import METRICS

RULES = importlib.resources.files("megatron.trace") / "watch_rules.yml"

UNIT_TESTS = r"""
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'megatron_training_goodput_ratio{{job="a",rank="0"}}'
        values: '0.5x40'
      - series: 'megatron_job_state{{job="a",rank="0",state="running"}}'
        values: '1x40'
      - series: 'megatron_training_goodput_ratio{{job="b",rank="0"}}'
        values: '0.95x40'
      - series: 'megatron_job_state{{job="b",rank="0",state="running"}}'
        values: '1x40'
      - series: 'megatron_hang_suspected{{job="a",rank="1"}}'
        values: '0 0 1 1 1 1'
      - series: 'megatron_hang_seconds{{job="a",rank="1"}}'
        values: '0 0 400 460 520 580'
      - series: 'megatron_job_state{{job="b",rank="0",state="stalled"}}'
        values: '0 0 0 1 1 1'
    alert_rule_test:
      - eval_time: 35m
        alertname: MegatronGoodputLow
        exp_alerts:
          - exp_labels: {{severity: warning, job: a, rank: "0"}}
            exp_annotations:
              summary: "a rank 0: goodput 50% of the wall clock"
              description: "Under 80 % of the job's wall clock so far made progress that \
                survived; megatron_training_badput_seconds by category says where the rest went."
      - eval_time: 5m
        alertname: MegatronHangSuspected
        exp_alerts:
          - exp_labels: {{severity: critical, job: a, rank: "1"}}
            exp_annotations:
              summary: "a rank 1: iterations stopped (a hang is suspected)"
              description: "No iteration finished for longer than max(floor, k x its rolling \
                median iteration time), or the hang watchdog reported a stall; it has lasted \
                9m 40s."
      - eval_time: 1m
        alertname: MegatronHangSuspected
        exp_alerts: []
      - eval_time: 5m
        alertname: MegatronJobStalled
        exp_alerts:
          - exp_labels: {{severity: critical, job: b, rank: "0", state: stalled}}
            exp_annotations:
              summary: "b rank 0: stalled (signs of life stopped without an ending)"
              description: "Neither spans nor metric points arrived within the staleness \
                bound, and the spans do not show the job ending."
    promql_expr_test:
      - expr: job:megatron_training_goodput_ratio:min
        eval_time: 10m
        exp_samples:
          - labels: 'job:megatron_training_goodput_ratio:min{{job="a"}}'
            value: 0.5
          - labels: 'job:megatron_training_goodput_ratio:min{{job="b"}}'
            value: 0.95
"""


def test_the_rules_are_shipped_and_name_only_what_watch_serves() -> None:
    text = RULES.read_text()
    used = set(re.findall(r"\bmegatron_[a-z_]+", text)) - {"megatron_goodput"}
    assert used and used <= set(METRICS), used - set(METRICS)


def test_promtool_check_rules_passes() -> None:
    with importlib.resources.as_file(RULES) as path:
        result = subprocess.run(
            [promtool(), "check", "rules", str(path)], capture_output=True, text=True
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


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
