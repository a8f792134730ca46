"""A receiver SIGKILLed while the SDK's exporters send loses nothing it acknowledged.

Real OTLP exporters (the SDK's gRPC and HTTP span exporters, behind its batch
processor) send from several threads, as a cluster's processes would; the
receiver is SIGKILLed mid-stream and started again on the same ports; the
exporters retry what was not acknowledged. Every span whose export request was
answered with success is then in the files, ``check`` reads them, and
``report`` counts each span once, also the one whose request was written, not
acknowledged, and sent again (the receiver writes a resent request once). A
kill in the middle of a write leaves a torn line, which the restarted receiver
ends with a newline, and which ``check`` and ``report`` skip.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import upstream_traces as u
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import Running, cli, exporter, report


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Ports:
    """A receiver's two ports, fixed, so a restarted one listens where the first did."""

    def __init__(self) -> None:
        self.grpc_port, self.http_port = _free_port(), _free_port()

    def start(self, out: Path) -> Running:
        deadline = time.monotonic() + 20
        while True:  # (a port the killed receiver held may take a moment to be free)
            try:
                running = Running(out, "--grpc", f"127.0.0.1:{self.grpc_port}",
                                  "--http", f"127.0.0.1:{self.http_port}")  # fmt: skip
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            assert (running.grpc_port, running.http_port) == (self.grpc_port, self.http_port)
            return running


class _Acknowledged(SpanExporter):
    """An exporter that remembers the spans of each request answered with success."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.acknowledged: set[str] = set()
        self.sent: set[str] = set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ids = {format(span.context.span_id, "016x") for span in spans}
        self.sent |= ids
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            self.acknowledged |= ids
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _span_ids(folder: Path) -> tuple[list[str], int]:
    """Every span id in the folder's trace files (a repeat, repeated), and the torn lines."""
    ids, torn = [], 0
    for path in sorted(folder.rglob("traces.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                request = json.loads(line)
            except json.JSONDecodeError:
                torn += 1
                continue
            for entry in request["resourceSpans"]:
                for scope in entry["scopeSpans"]:
                    ids.extend(span["spanId"] for span in scope["spans"])
    return ids, torn


def test_a_kill_mid_stream_loses_no_acknowledged_span(tmp_path: Path) -> None:
    # the senders' reference copies need the newest SDK: skip before a receiver starts, not
    # after (tox -e mindeps left the receiver running)
    u.official_file_exporter()
    ports, out = _Ports(), tmp_path / "received"
    receiver = ports.start(out)
    recorders: list[_Acknowledged] = []
    sending = []
    for n, transport in enumerate(["grpc", "http", "grpc", "http"]):
        recorder = _Acknowledged(exporter(transport, ports))  # type: ignore[arg-type]
        recorders.append(recorder)
        process = u.Process(tmp_path / f"sent{n}.jsonl", pid=100 + n, rank=n, run_id="stream")
        # small requests, often, and a queue that drops nothing: a stream the kill cuts
        process.provider.add_span_processor(
            BatchSpanProcessor(recorder, max_queue_size=1 << 20,
                               schedule_delay_millis=20, max_export_batch_size=16)
        )  # fmt: skip

        def train(process: u.Process = process) -> None:
            process.pretrain(train_iters=400, save_interval=50, eval_interval=100)
            process.provider.shutdown()  # the processor's last requests, retried as needed

        sending.append(threading.Thread(target=train))
    for thread in sending:
        thread.start()
    deadline = time.monotonic() + 60
    while sum(len(r.acknowledged) for r in recorders) < 200:
        assert time.monotonic() < deadline, "nothing acknowledged"
        time.sleep(0.01)
    receiver.process.send_signal(signal.SIGKILL)  # mid-stream: the exporters go on sending
    receiver.process.wait(timeout=10)
    acknowledged_before = set().union(*(r.acknowledged for r in recorders))
    time.sleep(0.3)
    receiver = ports.start(out)
    try:
        for thread in sending:
            thread.join(timeout=180)
            assert not thread.is_alive()
    finally:
        status, said = receiver.stop()
    assert status == 0, said

    acknowledged = set().union(*(r.acknowledged for r in recorders))
    sent = set().union(*(r.sent for r in recorders))
    assert acknowledged_before < acknowledged  # acknowledged before the kill and after it
    ids, _ = _span_ids(out / "stream")
    assert acknowledged <= set(ids)  # nothing acknowledged was lost
    assert set(ids) <= sent  # nor anything invented
    checked = cli("check", out / "stream")
    assert checked.returncode in (0, 1), checked.stderr  # read whole (a finding, not damage)
    assert report(out / "stream")["spans"] == len(set(ids))  # each span once


def test_a_request_resent_after_a_lost_acknowledgement_is_counted_once(tmp_path: Path) -> None:
    reference = tmp_path / "reference.jsonl"
    process = u.Process(reference, pid=4242, run_id="resent")
    memory = InMemorySpanExporter()
    process.provider.add_span_processor(SimpleSpanProcessor(memory))
    process.pretrain(train_iters=30, save_interval=10, eval_interval=10)
    process.processor.force_flush()
    spans = list(memory.get_finished_spans())
    batches = [spans[i : i + 20] for i in range(0, len(spans), 20)]
    assert len(batches) >= 4

    ports, out = _Ports(), tmp_path / "received"
    receiver = ports.start(out)
    grpc = exporter("grpc", ports)  # type: ignore[arg-type]
    for batch in batches[:2]:
        assert grpc.export(batch) == SpanExportResult.SUCCESS
    # the receiver writes the third request, then is killed before its answer: the
    # exporter never learns it arrived
    assert grpc.export(batches[2]) == SpanExportResult.SUCCESS
    receiver.process.send_signal(signal.SIGKILL)
    receiver.process.wait(timeout=10)
    rank_file = out / "resent" / "rank0" / "traces.jsonl"
    whole = rank_file.read_bytes()
    # and a kill in the middle of a write leaves the start of a line, no newline
    rank_file.write_bytes(whole + whole.splitlines()[0][:700])

    receiver = ports.start(out)
    http = exporter("http", ports)  # type: ignore[arg-type]
    try:
        assert http.export(batches[2]) == SpanExportResult.SUCCESS  # the retry, by HTTP
        for batch in batches[3:]:
            assert grpc.export(batch) == SpanExportResult.SUCCESS
    finally:
        status, said = receiver.stop()
    assert status == 0 and "1 resent lines written once" in said, said

    ids, torn = _span_ids(out / "resent")
    assert torn == 1
    assert sorted(ids) == sorted(format(s.context.span_id, "016x") for s in spans)  # once each
    checked = cli("check", out / "resent")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"torn write: {rank_file}:4 " in checked.stdout  # skipped, and said
    got, expected = report(out / "resent"), report(reference)
    assert got["spans"] == len(spans)
    assert (got.pop("torn_lines"), expected.pop("torn_lines")) == (1, 0)
    assert got == expected  # the rest: what the job wrote, as the file exporter has it
