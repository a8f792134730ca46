"""``megatron-trace watch`` end to end: a real Prometheus scraping it while real jobs train.

Issue 31's "done when": Debian's ``prometheus`` (started here, on loopback,
scraping every second), a real training job and ``megatron-trace watch`` on
its trace files. The job is, in most tests, one shaped as Megatron-LM writes
(``tests/support/upstream_job.py``: a tiny torch model trained in real time,
Megatron-LM's span names and the ``default`` span groups, none of our
attributes, OpenTelemetry's official file exporters, metric points at each
log interval); in one, our own trainer (``python -m megatron.training``), so
one dashboard is shown to serve both. The SDK's batch span processor exports
every 0.2 s here (``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default) so the tests
wait less. Prometheus's HTTP API then shows:

* the job ``running`` with a rising goodput, and once it has finished, the
  goodput and badput Prometheus scraped agree with ``report --json`` on the
  same file within 2 % of the wall clock;
* a SIGKILLed job ``stalled``, then ``killed``, within the documented bound
  (``--stale-after`` past its newest record, plus a poll and a scrape);
* of two ranks, the one made to hang (``MEGATRON_TEST_HANG_AT_ITERATION``)
  suspected of a hang within the bound (``--hang-floor`` past its last loop
  pass, plus an export, a poll and a scrape), still ``running`` (its metric
  reader writes on), and the other rank not;
* a trace file rotated several times while watched (renamed to ``.1``,
  compressed, a new one started): the scraped totals equal ``report`` over all
  the rotated pieces, span for span.

Prometheus loads the shipped rules (``watch_rules.yml``, only the alerts'
``for: 1m`` shortened to 2 s) and sends its alerts to Debian's
``prometheus-alertmanager``, routed by the shipped ``watch_alertmanager.yml``
(its waits shortened, its webhook pointed at a recorder here). The scrape
config is Prometheus's default one (no ``honor_labels``): ``job`` and
``instance`` are Prometheus's, the run is ``run_id``. And:

* a SIGKILLed job gives exactly one firing notification (``MegatronJobStalled``,
  identified by ``run_id`` alone), still active and never resolved as the job
  goes from stalled to killed and stays dead; a job that finishes cleanly gives
  none; of two jobs exporting over OTLP to one ``watch --receive``, the one
  SIGKILLed gives one notification, its own, and the other runs on unalerted;
* every query of the shipped Grafana dashboard (``watch_dashboard.json``), its
  variables substituted, returns data while a two-rank torchrun job of ours
  (``per_step``) trains.

``tox -e promtool`` runs this; there a missing ``prometheus`` or
``prometheus-alertmanager`` fails the test (``MEGATRON_TEST_REQUIRE_PROMTOOL=1``),
elsewhere it skips.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.resources
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from processes import REPO_ROOT, TELEMETRY_ON, TINY, TORCHRUN_2, subprocess_env
from promtool import REQUIRED
from upstream_traces import official_file_exporter

from megatron.trace_format.semconv import ITERATION_TIME_SOURCES

pytestmark = [pytest.mark.slow, pytest.mark.needs_extras]  # prometheus_client: the watch extra

UPSTREAM_JOB = REPO_ROOT / "tests" / "support" / "upstream_job.py"
QUICK_EXPORTS = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OMP_NUM_THREADS": "1"}


@dataclass
class Job:
    """A training process to start: its command, its environment's additions, its trace."""

    argv: Sequence[str]
    trace: Path
    env: Mapping[str, str] = field(default_factory=dict)


def megatron_lm_job(
    tmp_path: Path, iters: int, *options: str, rank: int = 0, env: Mapping[str, str] = {}
) -> Job:
    """A job writing as Megatron-LM does (``upstream_job.py``), to ``rankN/traces.jsonl``
    (the calling test skipped where the official file exporter is missing: ``mindeps``)."""
    official_file_exporter()
    trace = tmp_path / f"rank{rank}" / "traces.jsonl"
    argv = [sys.executable, str(UPSTREAM_JOB), str(trace), "--train-iters", str(iters),
            "--save-interval", "20", "--eval-interval", "50", *options]  # fmt: skip
    sleep = {"MEGATRON_TEST_ITERATION_SLEEP": "0.03"}
    return Job(argv, trace, {**QUICK_EXPORTS, **sleep, "RANK": str(rank), **env})


def our_job(tmp_path: Path, iters: int) -> Job:
    """Our trainer, its own trace (the ``default`` span groups)."""
    argv = [sys.executable, "-m", "megatron.training", *TINY, "--otel-enabled", "--save", "ckpt",
            "--save-interval", "5", "--train-iters", str(iters)]  # fmt: skip
    trace = tmp_path / "ckpt" / "telemetry" / "traces.jsonl"
    return Job(argv, trace, {"MEGATRON_TEST_ITERATION_SLEEP": "0.05", "OMP_NUM_THREADS": "1"})


def two_rank_job(tmp_path: Path, iters: int) -> Job:
    """Our trainer on two torchrun ranks (gloo), every rank exporting the ``per_step``
    groups (so straggler scores and the rolling iteration time are served)."""
    argv = [sys.executable, *TORCHRUN_2, "-m", "megatron.training", *TINY,
            *TELEMETRY_ON, "--global-batch-size", "4", "--save", "ckpt",
            "--save-interval", "50", "--train-iters", str(iters)]  # fmt: skip
    trace = tmp_path / "ckpt" / "telemetry" / "traces.jsonl"
    env = {"MEGATRON_TEST_ITERATION_SLEEP": "0.05", "OMP_NUM_THREADS": "1",
           "MEGATRON_OTEL_RANK_STRATEGY": "all_ranks"}  # fmt: skip
    return Job(argv, trace, env)


def _binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed (apt-get install {package}); tox -e promtool runs this"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _prometheus() -> str:
    return _binary("prometheus", "prometheus")


def _alertmanager() -> str:
    return _binary("prometheus-alertmanager", "prometheus-alertmanager")


SHIPPED = importlib.resources.files("megatron.trace")


class Webhook:
    """An Alertmanager webhook receiver on loopback: every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/megatron"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification, in the order they came."""
        return [alert for note in self.notifications for alert in note["alerts"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _shipped_rules(path: Path) -> Path:
    """The shipped rules, the alerts' ``for: 1m`` made 2 s (nothing else changed)."""
    text = (SHIPPED / "watch_rules.yml").read_text()
    assert text.count("for: 1m") == 2
    path.write_text(text.replace("for: 1m", "for: 2s"))
    return path


def _shipped_routing(path: Path, webhook: Webhook) -> Path:
    """The shipped Alertmanager routing, its waits shortened, its receiver the recorder."""
    text = (SHIPPED / "watch_alertmanager.yml").read_text()
    changes = {
        "group_wait: 30s": "group_wait: 1s",
        "group_interval: 5m": "group_interval: 2s",
        "url: http://127.0.0.1:5001/megatron": f"url: {webhook.url}",
    }
    for old, new in changes.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _wait(condition: Callable[[], Any], timeout: float, what: str, *children: Any) -> Any:
    """Poll ``condition`` until it returns something true; fail (naming ``what``) on timeout
    or when one of ``children`` (``subprocess.Popen``) exits unexpectedly."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except OSError:  # not listening yet
            value = None
        if value:
            return value
        for child in children:
            if child.poll() is not None:
                pytest.fail(f"{what}: {child.args[:4]} exited with {child.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.25)


class Prom:
    """The HTTP API of a Prometheus server on ``port``."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def ready(self) -> bool:
        return _get(f"{self.base}/-/ready").startswith(b"Prometheus")

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = json.loads(_get(url))
        assert answer["status"] == "success", answer
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def one(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, result
        return result[0][1] if result else None

    def state(self, rank: str = "0") -> str | None:
        on = [m["state"] for m, v in self.query(f'megatron_job_state{{rank="{rank}"}}') if v == 1]
        assert len(on) <= 1, on
        return on[0] if on else None

    def of(self, metric: str, rank: str = "0") -> float | None:
        return self.one(f'{metric}{{rank="{rank}"}}')


def _stop(child: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM) -> None:
    if child is None or child.poll() is not None:
        return
    child.send_signal(sig)
    try:
        child.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=10)


@dataclass
class Stack:
    """The running servers: Prometheus's API, the processes, the alerts' recorder."""

    prom: Prom
    children: dict[str, subprocess.Popen[Any]]
    webhook: Webhook
    alertmanager: str

    def active_alerts(self) -> list[dict[str, Any]]:
        return json.loads(_get(f"{self.alertmanager}/api/v2/alerts"))


@contextmanager
def _stack(
    tmp_path: Path, watch_args: Sequence[str], jobs: Mapping[str, Job], follow: bool = True
) -> Iterator[Stack]:
    """Alertmanager, Prometheus (the shipped rules loaded, alerting to it), ``watch`` on the
    jobs' trace files (``follow``; else the jobs send over OTLP to ``watch --receive``, in
    ``watch_args``), and the jobs, all running; everything stopped after (the jobs by
    SIGKILL), and the logs shown on a failure."""
    prometheus, alertmanager = _prometheus(), _alertmanager()
    prom_port, watch_port, am_port = _free_port(), _free_port(), _free_port()
    webhook = Webhook()
    rules = _shipped_rules(tmp_path / "watch_rules.yml")
    routing = _shipped_routing(tmp_path / "alertmanager.yml", webhook)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{rules}']\n"
        "alerting:\n  alertmanagers:\n    - static_configs:\n"
        f"        - targets: ['127.0.0.1:{am_port}']\n"
        "scrape_configs:\n  - job_name: watch\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{watch_port}']\n"
    )
    names = ("alertmanager", "prometheus", "watch", *jobs)
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in names}  # noqa: SIM115
    children: dict[str, subprocess.Popen[Any]] = {}
    am_base = f"http://127.0.0.1:{am_port}"
    try:
        children["alertmanager"] = subprocess.Popen(
            [alertmanager, f"--config.file={routing}", f"--storage.path={tmp_path / 'am'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=logs["alertmanager"], stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        children["prometheus"] = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=logs["prometheus"], stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        children["watch"] = subprocess.Popen(
            [sys.executable, "-m", "megatron.trace", "watch", "--interval", "0.2",
             "--listen", f"127.0.0.1:{watch_port}", *watch_args,
             *(str(job.trace) for job in jobs.values() if follow)],
            stdout=logs["watch"], stderr=subprocess.STDOUT, env=subprocess_env(), cwd=tmp_path,
        )  # fmt: skip
        prom = Prom(prom_port)
        _wait(lambda: _get(f"{am_base}/-/ready") is not None, 60, "alertmanager ready",
              children["alertmanager"])  # fmt: skip
        _wait(prom.ready, 60, "prometheus ready", children["prometheus"])
        _wait(lambda: _get(f"http://127.0.0.1:{watch_port}/metrics") is not None, 30,
              "watch serving", children["watch"])  # fmt: skip
        for name, job in jobs.items():
            children[name] = subprocess.Popen(
                job.argv, stdout=logs[name], stderr=subprocess.STDOUT,
                env=subprocess_env(job.env), cwd=tmp_path, start_new_session=True,
            )  # fmt: skip
        yield Stack(prom, children, webhook, am_base)
    except BaseException:
        for log in logs.values():
            log.flush()
        for name in logs:
            print(f"--- {name}.log ---\n" + (tmp_path / f"{name}.log").read_text()[-4000:])
        print("--- notifications ---\n" + json.dumps(webhook.notifications, indent=1)[-4000:])
        raise
    finally:
        for name in jobs:
            _stop(children.get(name), signal.SIGKILL)
            if name in children:  # what a launcher (torchrun) started, too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(children[name].pid, signal.SIGKILL)
        _stop(children.get("watch"))
        _stop(children.get("prometheus"))
        _stop(children.get("alertmanager"))
        webhook.close()
        for log in logs.values():
            log.close()


def _report(*files: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "megatron.trace", "report", "--json", *map(str, files)],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # the JSON object, last


def _count_spans(files: Sequence[Path]) -> int:
    """The spans in the files, counted with the standard library alone."""
    count = 0
    for path in files:
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                for resource_spans in json.loads(line)["resourceSpans"]:
                    count += sum(len(scope["spans"]) for scope in resource_spans["scopeSpans"])
    return count


def _finished(
    prom: Prom, children: Mapping[str, subprocess.Popen[Any]], job: str, *files: Path
) -> dict[str, Any]:
    """Wait for the job's clean exit, then until Prometheus holds watch's final figures
    (the job ``finished``, figures that agree with ``report`` on ``files``); return
    that report. On a busy machine the last poll and scrape come late: the bound only
    ends a hang, and the caller's asserts say what differs."""
    train = children[job]
    train.wait(timeout=240)
    assert train.returncode == 0, f"{job} exited with {train.returncode}"
    report = _report(*files)

    def final() -> bool:
        if prom.state() != "finished":
            return False
        try:
            _agrees_with_report(prom, report)
        except AssertionError:
            return False
        return True

    deadline = time.monotonic() + 120
    while not final() and time.monotonic() < deadline:
        assert children["watch"].poll() is None, "watch exited"
        time.sleep(0.5)
    return report


def _agrees_with_report(prom: Prom, report: dict[str, Any]) -> None:
    """The scraped goodput, badput and wall clock are ``report``'s within 2 % of the wall."""
    goodput = prom.of("megatron_training_goodput_seconds")
    wall = prom.of("megatron_training_wall_clock_seconds")
    badput = {m["category"]: v for m, v in prom.query("megatron_training_badput_seconds")}
    assert prom.of("megatron_training_goodput_ratio") == pytest.approx(goodput / wall)
    tolerance = 0.02 * report["wall_s"]
    assert report["incarnations"][-1]["ended"] == "shutdown"
    assert wall == pytest.approx(report["wall_s"], abs=tolerance)
    assert goodput == pytest.approx(report["goodput_s"], abs=tolerance)
    assert set(badput) >= {k for k, v in report["badput_s"].items() if v}
    for category, seconds in report["badput_s"].items():
        assert badput.get(category, 0.0) == pytest.approx(seconds or 0.0, abs=tolerance), category


def _labels_are_prometheus_s_and_the_run_s(prom: Prom, run_id: str) -> None:
    """A default scrape config: ``job``/``instance`` are the scrape's, ``run_id`` the run's."""
    series = prom.query("megatron_job_state")
    assert series
    for labels, _ in series:
        assert labels["job"] == "watch" and labels["instance"].startswith("127.0.0.1:"), labels
        assert labels["run_id"] == run_id and not any(k.startswith("exported_") for k in labels)


@pytest.mark.parametrize("shape", ["megatron-lm", "ours"])
def test_prometheus_sees_a_running_job_then_reports_figures(tmp_path: Path, shape: str) -> None:
    # long enough (about 10 s of training) that several scrapes fall while it runs,
    # however loaded the machine
    job = megatron_lm_job(tmp_path, 300) if shape == "megatron-lm" else our_job(tmp_path, 240)
    with _stack(tmp_path, (), {"train": job}) as stack:
        prom, children = stack.prom, stack.children
        train = children["train"]
        seen: list[tuple[str | None, float | None]] = []
        while train.poll() is None:
            seen.append((prom.state(), prom.of("megatron_training_goodput_seconds")))
            time.sleep(0.5)
        running = [goodput for state, goodput in seen if state == "running" and goodput]
        assert len(set(running)) >= 2 and running == sorted(running), seen
        assert running[-1] > running[0], seen
        report = _finished(prom, children, "train", job.trace)
        assert prom.state() == "finished"
        _agrees_with_report(prom, report)
        run_id = (
            "job-4711"
            if shape == "megatron-lm"
            else prom.query("megatron_job_state")[0][0]["run_id"]
        )
        _labels_are_prometheus_s_and_the_run_s(prom, run_id)
        # a clean finish: no alert, however long it stays finished (past every shortened
        # `for:`, Alertmanager's group wait and a group interval)
        time.sleep(6)
        assert stack.webhook.notifications == []
        assert stack.active_alerts() == []
        assert prom.query("ALERTS") == []


STALE_AFTER_S = 3.0
KILLED_AFTER_S = 8.0


def test_a_sigkilled_job_turns_stalled_then_killed(tmp_path: Path) -> None:
    args = ("--stale-after", str(STALE_AFTER_S), "--killed-after", str(KILLED_AFTER_S))
    with _stack(tmp_path, args, {"train": megatron_lm_job(tmp_path, 100_000)}) as stack:
        prom, children = stack.prom, stack.children
        train = children["train"]

        def running_with_goodput() -> bool:
            goodput = prom.of("megatron_training_goodput_seconds")
            return prom.state() == "running" and (goodput or 0) > 0

        _wait(running_with_goodput, 120, "running with goodput", train, children["watch"])
        _labels_are_prometheus_s_and_the_run_s(prom, "job-4711")
        train.send_signal(signal.SIGKILL)
        train.wait(timeout=10)
        killed_at = time.monotonic()
        # the bound: --stale-after past the newest record, plus a poll (0.2 s), the cached
        # figures' second and a scrape (1 s); 3 s more for a loaded machine
        bound = STALE_AFTER_S + 0.2 + 1 + 1 + 3
        _wait(lambda: prom.state() in ("stalled", "killed"), bound, "stalled", children["watch"])
        stalled_after = time.monotonic() - killed_at
        _wait(lambda: prom.state() == "killed", KILLED_AFTER_S + 5, "killed", children["watch"])
        assert stalled_after <= bound
        # Alertmanager was told: one alert, the run's, firing
        _wait(lambda: stack.webhook.notifications, 30, "a notification", children["watch"])
        # dead for a while more: through stalled -> killed and 10 s (5 group intervals) past
        time.sleep(10)
        alerts = stack.webhook.alerts()
        assert {alert["status"] for alert in alerts} == {"firing"}, alerts
        assert {alert["fingerprint"] for alert in alerts} == {alerts[0]["fingerprint"]}, alerts
        assert alerts[0]["labels"] == {
            "alertname": "MegatronJobStalled",
            "run_id": "job-4711",
            "severity": "critical",
        }
        assert all(note["status"] == "firing" for note in stack.webhook.notifications)
        active = stack.active_alerts()
        assert [alert["fingerprint"] for alert in active] == [alerts[0]["fingerprint"]]
        assert active[0]["status"]["state"] == "active"
        # the counters never went down across the kill, the goodput gauge may have
        assert prom.one("resets(megatron_training_progress_seconds_total[5m])") == 0
        assert prom.one("resets(megatron_training_lost_progress_seconds_total[5m])") == 0


def test_watch_receive_alerts_for_the_sigkilled_one_of_two_jobs_only(tmp_path: Path) -> None:
    """Two jobs export over OTLP (the SDK's gRPC exporters) to one ``watch --receive``; one
    is SIGKILLed: one notification, for that job's ``run_id`` alone, while the other's series
    go on as a running job's."""
    grpc = _free_port()
    received = tmp_path / "received"
    # two jobs, watch, Prometheus and Alertmanager on a small shared machine: a staleness
    # bound a starved but living job cannot cross
    stale, killed = 10.0, 20.0
    args = ("--stale-after", str(stale), "--killed-after", str(killed),
            "--receive", str(received), "--grpc", f"127.0.0.1:{grpc}", "--http", "off")  # fmt: skip
    jobs = {
        name: megatron_lm_job(
            tmp_path / "sent" / name, 100_000, "--run-id", name, "--otlp-grpc", f"127.0.0.1:{grpc}"
        )
        for name in ("job-a", "job-b")
    }
    with _stack(tmp_path, args, jobs, follow=False) as stack:
        prom, children = stack.prom, stack.children

        def states() -> dict[str, str]:
            found = prom.query('megatron_job_state{rank="0"}')
            return {m["run_id"]: m["state"] for m, v in found if v == 1}

        def goodput(run_id: str) -> float:
            found = prom.one(f'megatron_training_goodput_seconds{{run_id="{run_id}"}}')
            return found or 0.0

        def both_running() -> bool:
            return states() == {"job-a": "running", "job-b": "running"} and all(
                goodput(name) > 0 for name in jobs
            )

        _wait(both_running, 120, "both jobs running", *children.values())
        children["job-b"].send_signal(signal.SIGKILL)
        children["job-b"].wait(timeout=10)
        _wait(lambda: states().get("job-b") == "killed", killed + 10,
              "job-b killed", children["watch"], children["job-a"])  # fmt: skip
        a_then = goodput("job-a")
        _wait(lambda: stack.webhook.notifications, 30, "a notification", children["watch"])
        time.sleep(10)  # dead a while more: 5 group intervals, no other alert
        alerts = stack.webhook.alerts()
        assert {alert["fingerprint"] for alert in alerts} == {alerts[0]["fingerprint"]}, alerts
        assert alerts[0]["labels"] == {
            "alertname": "MegatronJobStalled",
            "run_id": "job-b",
            "severity": "critical",
        }
        assert all(note["status"] == "firing" for note in stack.webhook.notifications)
        assert [a["labels"]["run_id"] for a in stack.active_alerts()] == ["job-b"]
        assert states() == {"job-a": "running", "job-b": "killed"}
        assert goodput("job-a") > a_then  # the other job's series go on
        assert children["job-a"].poll() is None
    assert sorted(p.name for p in received.iterdir()) == ["job-a", "job-b"]


def _panel_queries() -> list[tuple[str, str]]:
    """Every target of the shipped dashboard: (panel title, expr)."""
    dashboard = json.loads((SHIPPED / "watch_dashboard.json").read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_every_dashboard_query_returns_data_for_a_running_job(tmp_path: Path) -> None:
    queries = _panel_queries()
    titles = {title for title, _ in queries}
    assert {
        "Goodput over time",
        "State per rank",
        "Hang seconds and hung ranks",
        "Iteration time",
    } <= titles
    assert any("badput" in t.lower() for t in titles) and any("Straggler" in t for t in titles)
    job = two_rank_job(tmp_path, 400)
    with _stack(tmp_path, (), {"train": job}) as stack:
        prom, children = stack.prom, stack.children

        def scored() -> bool:  # both ranks past the stragglers' warm-up
            return len(prom.query("megatron_straggler_score")) == 2 and prom.state() == "running"

        _wait(scored, 240, "straggler scores of two ranks", children["train"], children["watch"])
        assert children["train"].poll() is None, "the job must still run"
        # the rates need a few scrapes past the scores: wait for them, not for a fixed
        # time (a bad query raises at once; the bound only ends a hang)
        deadline = time.monotonic() + 120
        while (empty := _empty_panels(prom, queries)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert empty == []
        _stop(children["train"])  # torchrun passes SIGTERM on to both ranks


def _empty_panels(prom: Prom, queries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (panel title, query) of the queries that return nothing, the dashboard's
    variables substituted for the one run Prometheus holds (every rank)."""
    runs = json.loads(_get(f"{prom.base}/api/v1/label/run_id/values?match[]=megatron_job_state"))
    assert len(runs["data"]) == 1
    run_id = runs["data"][0]
    # a regular expression inside a PromQL string, whose backslashes are escaped in turn
    pattern = re.escape(run_id).replace("\\", "\\\\")
    values = {"$run_id": pattern, "$rank": ".+", "$__rate_interval": "30s"}
    empty = []
    for title, expr in queries:
        query = expr
        for name, value in values.items():
            query = query.replace(name, value)
        assert "$" not in query, query
        if not prom.query(query):
            empty.append((title, query))
    return empty


@pytest.mark.parametrize("shape", ["megatron-lm", "ours"])
def test_every_dashboard_query_returns_data_for_a_one_rank_default_groups_job(
    tmp_path: Path, shape: str
) -> None:
    """One rank, the ``default`` span groups (no iteration span, no gradient sync): every
    panel has data but the straggler scores', which say they need two ranks. Hang seconds
    and hung ranks read 0; the iteration time is the loop passes' where Megatron-LM opens a
    finalize at each, else the intervals' (this trainer), and says so."""
    dashboard = json.loads((SHIPPED / "watch_dashboard.json").read_text())
    (stragglers,) = [p for p in dashboard["panels"] if p["title"].startswith("Straggler")]
    assert "two ranks" in stragglers["description"]
    iteration = next(p for p in dashboard["panels"] if p["title"] == "Iteration time")
    assert "{{source}}" in iteration["targets"][0]["legendFormat"]
    assert all(source in iteration["description"] for source in ITERATION_TIME_SOURCES)
    job = (
        megatron_lm_job(tmp_path, 100_000) if shape == "megatron-lm" else our_job(tmp_path, 100_000)
    )
    source = "loop_passes" if shape == "megatron-lm" else "intervals"
    with _stack(tmp_path, (), {"train": job}) as stack:
        prom, children = stack.prom, stack.children
        queries = _panel_queries()

        empty: list[tuple[str, str]] = []

        def all_but_the_stragglers() -> bool:
            if prom.state() != "running":  # (nor scraped yet)
                return False
            empty[:] = _empty_panels(prom, queries)
            return [(title, "score" in query) for title, query in empty] == [
                (stragglers["title"], True)
            ]

        try:
            _wait(all_but_the_stragglers, 180, "every panel but the stragglers' with data",
                  children["train"], children["watch"])  # fmt: skip
        finally:
            print(f"the panels without data, last seen: {empty}")
        assert prom.query("megatron_straggler_score") == []
        assert prom.of("megatron_straggler_named") == 0
        assert prom.of("megatron_hang_seconds") == 0
        assert prom.of("megatron_hang_suspected") == 0
        ((labels, seconds),) = prom.query("megatron_iteration_time_seconds")
        assert labels["source"] == source and seconds > 0.03  # at least the step's sleep


HANG_AT = 60
HANG_FLOOR_S = 4.0


def test_a_hung_rank_is_suspected_within_the_bound(tmp_path: Path) -> None:
    jobs = {
        "rank0": megatron_lm_job(tmp_path, 100_000, rank=0),
        "rank1": megatron_lm_job(
            tmp_path, 100_000, rank=1, env={"MEGATRON_TEST_HANG_AT_ITERATION": str(HANG_AT)}
        ),
    }
    args = ("--hang-floor", str(HANG_FLOOR_S))
    with _stack(tmp_path, args, jobs) as stack:
        prom, children = stack.prom, stack.children
        log = tmp_path / "rank1.log"
        # rank 1 logs its HANG_AT-th iteration, then blocks in the next one's forward step
        _wait(lambda: f"iteration {HANG_AT:8d}/" in log.read_text(), 120, "rank 1 at the hang",
              children["rank1"], children["watch"])  # fmt: skip
        hung_at = time.monotonic()
        assert prom.of("megatron_hang_suspected", "1") != 1
        # the bound: the floor past the hung pass's start, plus an export (0.2 s), a poll
        # (0.2 s), the cached figures' second and a scrape (1 s); 3 s more for a loaded machine
        bound = HANG_FLOOR_S + 0.2 + 0.2 + 1 + 1 + 3
        _wait(lambda: prom.of("megatron_hang_suspected", "1") == 1, bound, "hang suspected",
              children["rank1"], children["watch"])  # fmt: skip
        assert time.monotonic() - hung_at <= bound
        assert (prom.of("megatron_hang_seconds", "1") or 0) >= HANG_FLOOR_S
        # still running: its metric reader writes on while its loop is stuck
        assert prom.state("1") == "running"
        assert prom.state("0") == "running"
        assert prom.of("megatron_hang_suspected", "0") == 0
        assert (prom.of("megatron_iteration_time_seconds", "0") or 0) > 0


def test_a_rotated_file_loses_no_span(tmp_path: Path) -> None:
    job = megatron_lm_job(tmp_path, 300, "--rotate-bytes", "16000")
    with _stack(tmp_path, (), {"train": job}) as stack:
        prom, children = stack.prom, stack.children
        children["train"].wait(timeout=240)  # (_finished checks the exit status)
        pieces = sorted(job.trace.parent.glob("traces.jsonl*"))
        assert len(pieces) >= 4, pieces  # the live file and at least three compressed copies
        report = _finished(prom, children, "train", *pieces)
        assert report["spans"] == _count_spans(pieces)
        assert prom.one("megatron_trace_watch_spans") == report["spans"]
        _agrees_with_report(prom, report)
