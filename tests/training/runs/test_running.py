"""A real job read while it runs: ``running`` with nothing wasted; SIGKILLed, ``killed``.

The scenario of the issue that asked for it: a job started in the background
(``--save-interval 50``, 50 ms per iteration), ``megatron-trace`` run on its
files about 10 s in, as a user would; then the job is SIGKILLed and read
again once the staleness bound has passed (an injected ``--now``, so the
test does not wait for it). With the ``default`` span groups nothing of the
open interval is in the file; with ``per_step`` its iterations are, as
orphans of the interval still open.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from megatron.core.telemetry.heartbeat import STALE_AFTER_S
from megatron.trace.otlp.reader import iter_requests, read_spans
from megatron.trace_format.semconv import BADPUT_CATEGORIES, MEGATRON_TRAINING_ITERATION
from megatron.training.training_log import parse_log_losses

pytestmark = pytest.mark.slow

TRACE = "ckpt/telemetry/traces.jsonl"
METRICS = "ckpt/telemetry/metrics.jsonl"


def _trace_tool(cli, *args: str) -> subprocess.CompletedProcess[str]:
    result = cli.run(*args, module=("-m", "megatron.trace"))
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _report(cli, *options: str) -> dict:
    report = json.loads(
        _trace_tool(cli, "report", TRACE, "--json", *options).stdout.splitlines()[-1]
    )
    exact = report["accounting_ns"]
    assert exact["goodput"] + sum(exact[c] for c in BADPUT_CATEGORIES) == exact["wall"]
    return report


@pytest.mark.parametrize("groups", ["default", "per_step"])
def test_a_job_read_while_it_runs_then_after_a_sigkill(training_cli, groups: str) -> None:
    cli = training_cli
    trainer = cli.start(
        *cli.TINY, "--otel-enabled", "--otel-span-groups", groups,
        "--train-iters", "100000", "--save", "ckpt", "--save-interval", "50",
        env={"MEGATRON_TEST_ITERATION_SLEEP": "0.05"},
    )  # fmt: skip
    started = time.monotonic()

    def ten_seconds_in_and_past_the_first_interval() -> bool:
        # C0 closed (iteration 50 logged), so what is open is the next interval
        logged = parse_log_losses(trainer.stdout)
        return time.monotonic() - started >= 10 and max(logged, default=0) >= 55

    trainer.wait_until(ten_seconds_in_and_past_the_first_interval, timeout=180)

    report = _report(cli)
    (inc,) = report["incarnations"]
    assert inc["ended"] == "running", _trace_tool(cli, "report", TRACE).stdout
    assert report["running"] and report["as_of"] == inc["as_of"]
    assert report["as_of_age_s"] < STALE_AFTER_S
    assert report["wasted_iterations"] == inc["wasted_iterations"] == 0
    assert report["badput_s"]["wasted_progress"] == inc["wasted_s"] == 0
    # the open interval up to the newest record, counted as goodput (0 when that record is
    # the last interval's own end: no iteration or heartbeat written since the reroot)
    assert inc["in_flight_s"] >= 0
    assert inc["intervals"] >= 1 and report["goodput_s"] > inc["in_flight_s"]
    assert report["liveness"]["heartbeat_files"] == ["ckpt/telemetry/metrics.jsonl"]
    text = _trace_tool(cli, "report", TRACE).stdout
    assert text.startswith("running: figures as of ")

    check = _trace_tool(cli, "check", TRACE).stdout.splitlines()
    assert check[0].startswith("running: rank 0 incarnation 0: still running as of ")
    assert check[-1].endswith(" 0 violations")
    export = _trace_tool(cli, "export", TRACE, "-o", "trace.json")
    assert export.stdout.startswith("wrote trace.json")
    other = json.loads((cli.cwd / "trace.json").read_text())["otherData"]
    assert other["incarnations"][0]["ended"] == "running"
    pytest.importorskip("plotly")
    _trace_tool(cli, "timeline", TRACE, "-o", "timeline.html")
    # plotly escapes non-ASCII in its figure JSON unless orjson is installed
    page = (cli.cwd / "timeline.html").read_text().replace("\\u00b7", "·")
    assert "running · as of " in page

    killed_at = time.time()
    trainer.kill()
    assert trainer.process.returncode == -signal.SIGKILL
    later = str(killed_at + STALE_AFTER_S + 1)
    report = _report(cli, "--now", later)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["as_of"], report["running"]) == ("killed", None, False)
    check = _trace_tool(cli, "check", TRACE, "--now", later).stdout
    assert check.startswith("killed: rank 0 incarnation 0: its in-flight interval is missing")
    if groups == "per_step":  # the iterations on file past the last save are lost
        spans = read_spans(cli.cwd / TRACE)
        saved = max(
            s["attributes"]["megatron.iteration"]
            for s in spans
            if s["name"] == "megatron.checkpoint.save"
        )
        lost = {
            s["attributes"]["megatron.iteration"]
            for s in spans
            if s["name"] == "megatron.train.iteration"
            and s["attributes"]["megatron.iteration"] >= saved
        }
        # ... and so are those the newest iteration gauge shows past it (the spans of the
        # last ones, not exported yet, died with the process; the export may be newer)
        gauge = _newest_iteration_gauge(cli.cwd / METRICS)
        assert inc["wasted_iterations"] == max(len(lost), gauge - saved), (len(lost), gauge)
        wasted_s = report["badput_s"]["wasted_progress"]
        if lost:
            assert wasted_s > 0
        else:
            # killed after the save, before the next iteration span was written: only the
            # pass in flight since the interval boundary is wasted (a 50 ms iteration; a
            # second leaves room for a loaded machine), none of it an iteration on file
            assert 0 <= wasted_s < 1.0
    # read right after the kill, within the bound, the job still reads running: the rule's price
    assert _report(cli, "--now", str(killed_at + 1))["incarnations"][0]["ended"] == "running"


def _newest_iteration_gauge(metrics) -> int:
    """The newest ``megatron.training.iteration`` point in ``metrics`` (0: none)."""
    newest = (0, 0)
    for _, _, request in iter_requests(metrics):
        for resource in request["resourceMetrics"]:
            for scope in resource["scopeMetrics"]:
                for metric in scope["metrics"]:
                    if metric["name"] != MEGATRON_TRAINING_ITERATION:
                        continue
                    for point in metric["gauge"]["dataPoints"]:
                        at = int(point["timeUnixNano"])
                        newest = max(newest, (at, int(point.get("asInt", 0))))
    return newest[1]
