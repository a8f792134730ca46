"""``megatron-trace watch`` end to end: a real Prometheus scraping it while a real job trains.

Issue 31's "done when": Debian's ``prometheus`` (started here, on loopback,
scraping every second), the trainer (``python -m megatron.training``, a tiny
model on the CPU, our own trace: ``--otel-enabled`` with the ``default`` span
groups) and ``megatron-trace watch`` on its trace file. Prometheus's HTTP API
then shows the job ``running`` with a rising goodput; once the job has
finished, the goodput and badput Prometheus scraped agree with ``report
--json`` on the same file within 2 % of the wall clock. A SIGKILLed job turns
``stalled`` or ``killed`` within the documented bound (``--stale-after`` of
its newest record, plus a poll and a scrape).

``tox -e promtool`` runs this; there a missing ``prometheus`` fails the test
(``MEGATRON_TEST_REQUIRE_PROMTOOL=1``), elsewhere it skips.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from processes import TINY, subprocess_env
from promtool import REQUIRED

pytestmark = [pytest.mark.slow, pytest.mark.needs_extras]  # prometheus_client: the watch extra

TRAIN = (*TINY, "--otel-enabled", "--save", "ckpt", "--save-interval", "5")
SLEEP = {"MEGATRON_TEST_ITERATION_SLEEP": "0.05", "OMP_NUM_THREADS": "1"}


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        reason = (
            "prometheus is not installed (apt-get install prometheus); tox -e promtool runs this"
        )
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


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

    def state(self) -> str | None:
        on = [m["state"] for m, v in self.query("megatron_job_state") if v == 1]
        assert len(on) <= 1, on
        return on[0] if on else None


def _stop(child: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM) -> None:
    if child is None or child.poll() is not None:
        return
    child.send_signal(sig)
    try:
        child.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=10)


@contextmanager
def _stack(tmp_path: Path, watch_args: tuple[str, ...], train_iters: int) -> Iterator[Any]:
    """Prometheus, ``watch`` and the trainer, all three running; everything stopped after."""
    prometheus = _prometheus()
    prom_port, watch_port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: watch\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{watch_port}']\n"
    )
    trace = tmp_path / "ckpt" / "telemetry" / "traces.jsonl"
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("prometheus", "watch", "train")}  # noqa: SIM115
    children: dict[str, subprocess.Popen[Any]] = {}
    try:
        children["prometheus"] = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=logs["prometheus"], stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        children["watch"] = subprocess.Popen(
            [sys.executable, "-m", "megatron.trace", "watch", "--interval", "0.2",
             "--listen", f"127.0.0.1:{watch_port}", *watch_args, str(trace)],
            stdout=logs["watch"], stderr=subprocess.STDOUT, env=subprocess_env(), cwd=tmp_path,
        )  # fmt: skip
        prom = Prom(prom_port)
        _wait(prom.ready, 60, "prometheus ready", children["prometheus"])
        _wait(lambda: _get(f"http://127.0.0.1:{watch_port}/metrics") is not None, 30,
              "watch serving", children["watch"])  # fmt: skip
        children["train"] = subprocess.Popen(
            [sys.executable, "-m", "megatron.training", *TRAIN, "--train-iters", str(train_iters)],
            stdout=logs["train"], stderr=subprocess.STDOUT, env=subprocess_env(SLEEP),
            cwd=tmp_path,
        )  # fmt: skip
        yield prom, children, trace
    except BaseException:
        for log in logs.values():
            log.flush()
        for name in logs:
            print(f"--- {name}.log ---\n" + (tmp_path / f"{name}.log").read_text()[-4000:])
        raise
    finally:
        _stop(children.get("train"), signal.SIGKILL)
        _stop(children.get("watch"))
        _stop(children.get("prometheus"))
        for log in logs.values():
            log.close()


def test_prometheus_sees_a_running_job_then_reports_figures(tmp_path: Path) -> None:
    # long enough (about 15 s) that several scrapes fall while it runs, however loaded the
    # machine: the file grows at each checkpoint interval's end and each export
    with _stack(tmp_path, (), train_iters=240) as (prom, children, trace):
        train = children["train"]
        seen: list[tuple[str | None, float | None]] = []
        while train.poll() is None:
            seen.append((prom.state(), prom.one("megatron_training_goodput_seconds")))
            time.sleep(0.5)
        assert train.returncode == 0, (tmp_path / "train.log").read_text()[-4000:]
        running = [goodput for state, goodput in seen if state == "running" and goodput]
        assert len(set(running)) >= 2 and running == sorted(running), seen
        assert running[-1] > running[0], seen

        _wait(lambda: prom.state() == "finished", 30, "state finished", children["watch"])
        time.sleep(2.5)  # two more scrapes of the final figures
        goodput = prom.one("megatron_training_goodput_seconds")
        wall = prom.one("megatron_training_wall_clock_seconds")
        badput = {m["category"]: v for m, v in prom.query("megatron_training_badput_seconds")}
        assert prom.one("megatron_training_goodput_ratio") == pytest.approx(goodput / wall)

        result = subprocess.run(
            [sys.executable, "-m", "megatron.trace", "report", "--json", str(trace)],
            capture_output=True, text=True, env=subprocess_env(), timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.splitlines()[-1])  # the JSON object, last
        tolerance = 0.02 * report["wall_s"]
        assert report["incarnations"][-1]["ended"] == "shutdown"
        assert wall == pytest.approx(report["wall_s"], abs=tolerance)
        assert goodput == pytest.approx(report["goodput_s"], abs=tolerance)
        assert set(badput) >= {k for k, v in report["badput_s"].items() if v}
        for category, seconds in report["badput_s"].items():
            assert badput.get(category, 0.0) == pytest.approx(seconds or 0.0, abs=tolerance), (
                category
            )


STALE_AFTER_S = 3.0
KILLED_AFTER_S = 8.0


def test_a_sigkilled_job_turns_stalled_then_killed(tmp_path: Path) -> None:
    args = ("--stale-after", str(STALE_AFTER_S), "--killed-after", str(KILLED_AFTER_S))
    with _stack(tmp_path, args, train_iters=2000) as (prom, children, _):
        train = children["train"]

        def running_with_goodput() -> bool:
            goodput = prom.one("megatron_training_goodput_seconds")
            return prom.state() == "running" and (goodput or 0) > 0

        _wait(running_with_goodput, 120, "running with goodput", train, children["watch"])
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
