"""A ``megatron-trace receive`` (or ``watch --receive``) run as a user runs it, for tests.

``python -m megatron.trace receive`` on loopback, its ports chosen by the
system and read from its first line; the SDK's own OTLP span exporters aimed
at it; ``report --json`` and the other commands run as subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

__all__ = ["REPO_ROOT", "Running", "Watching", "cli", "exporter", "report"]

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on grpc 127\.0\.0\.1:(\d+), http http://127\.0\.0\.1:(\d+)/")


class Running:
    def __init__(self, out: Path, *options: str) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [sys.executable, "-m", "megatron.trace", "receive", "--out", str(out),
             "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", *options],
            stderr=subprocess.PIPE, text=True, cwd=out.parent,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip
        assert self.process.stderr is not None
        first = self.process.stderr.readline()
        match = LISTENING.search(first)
        assert match, first
        self.grpc_port, self.http_port = map(int, match.groups())

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        _, rest = self.process.communicate(timeout=120)  # a bound for a hang only
        return self.process.returncode, rest


def exporter(transport: str, receiver: Running):
    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.grpc_port}", insecure=True)
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces",
        compression=Compression.Gzip if transport == "http-gzip" else Compression.NoCompression,
    )


def cli(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megatron.trace", *map(str, argv)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


def report(*files: Path) -> dict:
    # the same instant for both, so liveness (running or not) is judged alike
    result = cli("report", "--json", "--now", "1900000000", *files)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    report.pop("liveness")
    return report


WATCHING = re.compile(
    r"serving http://127\.0\.0\.1:(\d+)/metrics for .*received on grpc 127\.0\.0\.1:(\d+), "
    r"http http://127\.0\.0\.1:(\d+)/v1/traces"
)


class Watching(Running):
    """``watch --receive``: the receiver and the endpoint in one process."""

    def __init__(self, out: Path, *options: str) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [sys.executable, "-m", "megatron.trace", "watch", "--receive", str(out),
             "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--listen", "127.0.0.1:0",
             "--interval", "0.2", *options],
            stderr=subprocess.PIPE, text=True, cwd=out.parent,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip
        assert self.process.stderr is not None
        first = self.process.stderr.readline()
        match = WATCHING.search(first)
        assert match, first
        self.metrics_port, self.grpc_port, self.http_port = map(int, match.groups())

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as answer:  # a bound for a hang only
            text = answer.read().decode()
        series = {}
        for name, labels, value in re.findall(r"^(\w+)\{(.*)\} (\S+)$", text, re.M):
            pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels))
            series[(name, pairs)] = float(value)
        return series
