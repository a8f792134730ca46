"""``megatron-trace receive`` under many exporters at once: its CPU per span, its throughput.

The requests are the ones Megatron-LM's ranks send: ``upstream_traces``
re-enacts ``pretrain()`` through the real SDK (the ``per_step`` span groups,
and the ``default`` ones), and the spans are encoded as the SDK's OTLP
exporters encode them (``encode_spans``, batches of 512: the batch
processor's default), one request set per exporter, each with a resource of
its own (a job and a rank: :data:`JOBS` jobs of ``EXPORTERS / JOBS`` ranks).
:data:`EXPORTERS` senders then send them all at once, each on its own
connection, to one ``megatron-trace receive`` process: over gRPC (raw
``Export`` calls on a channel each) or OTLP/HTTP (``POST /v1/traces`` with the
protobuf body). The bodies are encoded before the clock starts, so the senders
cost the receiver's core little.

Measured: the receiver process's CPU seconds (``/proc/PID/stat``: user plus
system, its startup excluded) per span received, over the CPU of decoding the
same request bodies with the OTLP protobufs alone
(``ExportTraceServiceRequest.ParseFromString``, in this process); and the
throughput, spans acknowledged per wall second, all senders together. On a
machine whose cores other work shares, the throughput is a lower bound.
"""

from __future__ import annotations

import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, Run

#: Senders at once, and the jobs they belong to (ranks of a job: EXPORTERS / JOBS).
EXPORTERS = 16
JOBS = 4
#: Spans per request: the SDK batch span processor's default batch.
BATCH = 512
#: Iterations each sender's re-enacted ``pretrain()`` runs (its requests: its spans / BATCH).
ITERATIONS = {"per_step": 3000, "default": 3000}


def _requests(groups: str, exporters: int) -> list[list[bytes]]:
    """Each exporter's request bodies: its spans as the SDK's OTLP exporter encodes them."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import upstream_traces as u
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    directory = Path(tempfile.mkdtemp(prefix="bench-receive-"))
    try:
        chosen = u.PER_STEP_GROUPS if groups == "per_step" else u.DEFAULT_GROUPS
        process = u.Process(directory / "traces.jsonl", pid=1, groups=chosen)
        memory = InMemorySpanExporter()
        process.provider.add_span_processor(SimpleSpanProcessor(memory))
        process.pretrain(train_iters=ITERATIONS[groups], save_interval=100, eval_interval=100)
        spans = list(memory.get_finished_spans())
        process.provider.shutdown()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    bodies: list[list[bytes]] = []
    for index in range(exporters):
        job, rank = index % JOBS, index // JOBS
        mine = []
        for start in range(0, len(spans), BATCH):
            request = encode_spans(spans[start : start + BATCH])
            for entry in request.resource_spans:
                attributes = entry.resource.attributes
                for pair in list(attributes):
                    if pair.key in ("dl.rank", "nemo.run.id", "process.pid"):
                        attributes.remove(pair)
                attributes.extend(
                    [
                        KeyValue(key="dl.rank", value=AnyValue(int_value=rank)),
                        KeyValue(key="nemo.run.id", value=AnyValue(string_value=f"job-{job}")),
                        KeyValue(key="process.pid", value=AnyValue(int_value=1000 + index)),
                    ]
                )
            mine.append(request.SerializeToString())
        bodies.append(mine)
    return bodies


def _spans_in(bodies: list[list[bytes]]) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    count = 0
    for body in (b for mine in bodies for b in mine):
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        count += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    return count


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _send_grpc(port: int, bodies: list[bytes]) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        for body in bodies:
            export(body, timeout=60)


def _send_http(port: int, bodies: list[bytes]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for body in bodies:
            connection.request(
                "POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"}
            )
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise AssertionError(f"the receiver answered {answer.status}")
    finally:
        connection.close()


def _receive_once(transport: str, bodies: list[list[bytes]]) -> tuple[float, float]:
    """One run: (receiver CPU seconds, wall seconds) for every body sent at once."""
    import re

    out = Path(tempfile.mkdtemp(prefix="bench-received-"))
    try:
        listen = ["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]
        receiver = subprocess.Popen(
            [sys.executable, "-m", "megatron.trace", "receive", "--out", str(out / "r"), *listen],
            stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip
        assert receiver.stderr is not None
        first = receiver.stderr.readline()
        found = re.search(r"grpc 127\.0\.0\.1:(\d+), http http://127\.0\.0\.1:(\d+)/", first)
        if not found:
            raise AssertionError(first)
        port = int(found.group(1) if transport == "grpc" else found.group(2))
        said: list[str] = []  # (read on, so a warning cannot fill the pipe and stall it)
        drain = threading.Thread(target=lambda: said.extend(receiver.stderr or ()))
        drain.start()
        send = _send_grpc if transport == "grpc" else _send_http
        errors: list[BaseException] = []

        def sender(mine: list[bytes]) -> None:
            try:
                send(port, mine)
            except BaseException as error:  # noqa: BLE001 (reported below)
                errors.append(error)

        threads = [threading.Thread(target=sender, args=(mine,)) for mine in bodies]
        cpu_before, began = _cpu_s(receiver.pid), time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        cpu = _cpu_s(receiver.pid) - cpu_before
        receiver.terminate()
        receiver.wait(timeout=60)
        drain.join()
        if errors or "warning" in "".join(said):
            raise AssertionError("".join(said)) from (errors[0] if errors else None)
        return cpu, wall
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _decode_cpu(bodies: list[list[bytes]]) -> float:
    """CPU seconds of parsing every body with the OTLP protobufs alone, in this process."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    began = time.process_time()
    for body in (b for mine in bodies for b in mine):
        ExportTraceServiceRequest().ParseFromString(body)
    return time.process_time() - began


def bench_receive(
    transport: str, groups: str, repeats: int
) -> tuple[float, float, float, float, int]:
    """(receiver CPU per span / protobuf decoding's, receiver µs per span, decoding µs per
    span, spans per second received, spans per run): medians, interleaved repetitions."""
    bodies = _requests(groups, EXPORTERS)
    spans = _spans_in(bodies)
    ratios, ours, theirs, rates = [], [], [], []
    for rep in range(repeats):
        if rep % 2:
            decode = _decode_cpu(bodies)
            cpu, wall = _receive_once(transport, bodies)
        else:
            cpu, wall = _receive_once(transport, bodies)
            decode = _decode_cpu(bodies)
        ratios.append(cpu / decode)
        ours.append(cpu / spans * 1e6)
        theirs.append(decode / spans * 1e6)
        rates.append(spans / wall)
    return (
        statistics.median(ratios),
        statistics.median(ours),
        statistics.median(theirs),
        statistics.median(rates),
        spans,
    )


def spans_per_iteration(groups: str) -> float:
    """Spans a Megatron-LM rank sends per iteration with these groups (the re-enactment's)."""
    bodies = _requests(groups, 1)
    return _spans_in(bodies) / ITERATIONS[groups]


def section_receive(run: Run) -> None:
    repeats = 1 if run.quick else 3
    for transport in ("grpc", "http"):
        for groups in ("per_step", "default"):
            ratio, ours_us, decode_us, rate, spans = bench_receive(transport, groups, repeats)
            per_iteration = spans_per_iteration(groups)
            ranks = 1e6 / ours_us / per_iteration  # at one iteration a second, on one core
            run.record(
                f"receive_{transport}_{groups}_cpu_ratio",
                ratio,
                f"receiver {ours_us:.1f} µs CPU/span, {rate:,.0f} spans/s from {EXPORTERS} "
                f"exporters ({spans} spans); {per_iteration:.1f} spans/iteration: "
                f"{ranks:,.0f} ranks/core at 1 it/s",
                f"protobuf decode {decode_us:.2f} µs/span",
            )


def _main(argv: list[str] | None = None) -> Any:  # pragma: no cover (a quick look by hand)
    run = Run(quick=True)
    section_receive(run)
    for row in run.rows:
        print(" | ".join(row))


if __name__ == "__main__":  # pragma: no cover
    _main()
