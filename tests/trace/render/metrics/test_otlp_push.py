"""``megatron-trace watch --otlp-endpoint``: the figures pushed over OTLP/HTTP as well.

The receiver is a plain HTTP server on loopback that decodes each request
body with OpenTelemetry's own protobuf classes (``ExportMetricsServiceRequest``,
as a collector's OTLP receiver does). What it receives must be what the
Prometheus endpoint of the same ``watch`` serves, under the in-process live
metrics' names, and a last push must arrive when the watch is stopped.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import tracegen as g
import upstream_traces as up
from processes import subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.needs_extras]  # prometheus_client, the otlp extra

Points = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Receiver:
    """An OTLP/HTTP metrics receiver on loopback: each request's gauge points, decoded."""

    def __init__(self, port: int = 0) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        self.requests: list[tuple[str, Points, dict[str, Any]]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportMetricsServiceRequest.FromString(body)
                points: Points = {}
                resource: dict[str, Any] = {}
                for resource_metrics in request.resource_metrics:
                    for kv in resource_metrics.resource.attributes:
                        resource[kv.key] = kv.value.string_value
                    for scope in resource_metrics.scope_metrics:
                        for metric in scope.metrics:
                            for point in metric.gauge.data_points:
                                key = frozenset(
                                    (kv.key, kv.value.string_value) for kv in point.attributes
                                )
                                value = point.as_double or float(point.as_int)
                                points[(metric.name, key)] = value
                received.append((self.path, points, resource))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra")
    serving = Receiver()
    yield serving
    serving.close()


def _scrape(port: int) -> Points:
    """The endpoint's samples, read with ``prometheus_client``'s own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_pushed_figures_are_the_scraped_ones(tmp_path: Path, receiver: Receiver) -> None:
    path = up.killed_and_resumed(tmp_path / "traces.jsonl")
    url = f"http://127.0.0.1:{receiver.port}/v1/metrics"
    child = subprocess.Popen(
        [sys.executable, "-m", "megatron.trace", "watch", "--interval", "0.2",
         "--listen", "127.0.0.1:0", "--otlp-endpoint", url, "--otlp-interval", "0.3",
         "--run-id", "pretrain-7b", str(path)],
        stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    try:
        assert child.stderr is not None
        first = child.stderr.readline()
        port = int(re.search(r"127.0.0.1:(\d+)/metrics for ", first).group(1))  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while not any(points for _, points, _ in receiver.requests):
            assert time.monotonic() < deadline, "nothing pushed within 60 s"
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.1)
        scraped = _scrape(port)
    finally:
        child.send_signal(signal.SIGTERM)
        status = child.wait(timeout=60)
    assert status == 0
    assert child.stderr.read().endswith("megatron-trace watch: stopped\n")  # type: ignore[union-attr]

    pushes = [points for _, points, _ in receiver.requests if points]
    assert len(pushes) >= 2  # at the interval, and once more at the stop
    path_, _, resource = receiver.requests[-1]
    assert path_ == "/v1/metrics" and resource["service.name"] == "megatron-trace-watch"
    pushed = pushes[-1]
    rank = frozenset({("run_id", "pretrain-7b"), ("rank", "0")})

    def both(otel: str, prometheus: str, **labels: str) -> tuple[float, float]:
        extra = frozenset(labels.items())
        prom_extra = frozenset((k.rsplit(".", 1)[-1], v) for k, v in labels.items())
        return pushed[(otel, rank | extra)], scraped[(prometheus, rank | prom_extra)]

    goodput, scraped_goodput = both(
        "megatron.training.goodput_s", "megatron_training_goodput_seconds"
    )
    assert goodput == scraped_goodput == 4.0  # the killed-and-resumed run: 40 iterations of 0.1 s
    wall, scraped_wall = both(
        "megatron.training.wall_clock_s", "megatron_training_wall_clock_seconds"
    )
    assert wall == scraped_wall
    for category in ("startup", "wasted_progress", "restart_gap", "checkpoint_save"):
        value, expected = both(
            "megatron.training.badput_s",
            "megatron_training_badput_seconds",
            **{"megatron.badput.category": category},
        )
        assert value == expected, category
    assert pushed[("megatron.training.iteration", rank)] == 40
    for state in ("running", "finished", "stalled", "killed"):
        expected = 1.0 if state == "finished" else 0.0
        assert pushed[("megatron.job.state", rank | {("state", state)})] == expected, state
    assert pushed[("megatron.training.goodput_fraction", rank)] == pytest.approx(
        scraped[("megatron_training_goodput_ratio", rank)]
    )


def test_a_collector_down_is_one_line_and_the_pushes_resume(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otlp extra")
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0))  # runs where up cannot: mindeps
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/metrics"
    child = subprocess.Popen(
        [sys.executable, "-m", "megatron.trace", "watch", "--interval", "0.2",
         "--listen", "127.0.0.1:0", "--otlp-endpoint", url, "--otlp-interval", "0.3", str(path)],
        stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    receiver = None
    try:
        assert child.stderr is not None
        assert "/metrics for " in child.stderr.readline()
        assert child.stderr.readline() == (
            f"megatron-trace watch: warning: cannot push to {url}; trying again at every export\n"
        )
        receiver = Receiver(port)  # the collector comes up
        assert child.stderr.readline() == f"megatron-trace watch: pushing to {url} again\n"
        assert receiver.requests
    finally:
        child.send_signal(signal.SIGTERM)
        status = child.wait(timeout=60)
        if receiver is not None:
            receiver.close()
    assert status == 0
    assert child.stderr.read() == "megatron-trace watch: stopped\n"  # type: ignore[union-attr]


def test_a_bad_endpoint_is_one_line_and_status_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "megatron.trace", "watch", "--otlp-endpoint", "127.0.0.1:4318",
         str(tmp_path / "traces.jsonl")],
        capture_output=True, text=True, env=subprocess_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "megatron-trace watch: error: argument --otlp-endpoint: expected an OTLP/HTTP metrics "
        "URL (e.g. http://127.0.0.1:4318/v1/metrics), got '127.0.0.1:4318'"
    )
    assert result.stdout == ""
