"""``megatron-trace receive``: OTLP from the SDK's own exporters becomes the files ``report`` reads.

The receiver runs as a user runs it (``python -m megatron.trace receive`` on
loopback, ports chosen by the system and read from its first line). A
Megatron-LM-shaped job (``upstream_traces.Process``: the real SDK, nemo-lens's
resource) exports every span twice: to the official OTLP/JSON file exporter
(the reference) and, over the wire, to the receiver with the SDK's
``OTLPSpanExporter`` (gRPC, or HTTP with protobuf). ``check`` and
``report --json`` on the received files must equal the same on the
reference: the receiver lost, altered and invented nothing.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import upstream_traces as u
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otlp_receiver import Running, Watching, cli, exporter, report


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Running]:
    running = Running(tmp_path / "received")
    yield running
    if running.process.poll() is None:
        running.process.kill()
        running.process.wait()


def _job(reference: Path, transport: str, receiver: Running) -> None:
    """Two ranks on two hosts: rank 0 runs cleanly, rank 1 is SIGKILLed at iteration 17."""
    for rank, kill in ((0, None), (1, u.Kill(17))):
        process = u.Process(reference, pid=4242 + rank, rank=rank, host=f"node-{rank}")
        wire = SimpleSpanProcessor(exporter(transport, receiver))
        process.provider.add_span_processor(wire)
        process.pretrain(train_iters=30, save_interval=10, eval_interval=10, kill=kill)
        wire.force_flush()


@pytest.mark.parametrize("transport", ["grpc", "http", "http-gzip"])
def test_received_spans_report_and_check_as_the_file_exporter_s(
    receiver: Running, tmp_path: Path, transport: str
) -> None:
    reference = tmp_path / "reference" / "traces.jsonl"
    reference.parent.mkdir()
    _job(reference, transport, receiver)
    status, said = receiver.stop()
    assert status == 0, said

    received = sorted(receiver.out.glob("*/*/traces.jsonl"))
    # one folder for the job (its nemo.run.id), in it one per rank
    assert [(p.parent.parent.name, p.parent.name) for p in received] == [
        ("job-4711", "rank0"),
        ("job-4711", "rank1"),
    ]
    for path in received:  # each rank's file holds that rank's spans only
        ranks = {
            attribute["value"]["intValue"]
            for line in path.read_text().splitlines()
            for entry in json.loads(line)["resourceSpans"]
            for attribute in entry["resource"]["attributes"]
            if attribute["key"] == "dl.rank"
        }
        assert ranks == {path.parent.name.removeprefix("rank")}
    assert re.search(r"stopped: \d+ export requests?, \d+ lines? in 2 files of 1 job under", said)

    expected, got = report(reference), report(*received)
    assert report(receiver.out / "job-4711") == got  # the job's folder: its ranks' files
    assert report(receiver.out) == got  # the receiver's folder, holding that one job
    assert got["spans"] == expected["spans"] > 100
    assert [r["rank"] for r in got["ranks"]] == [0, 1]
    assert got == expected
    checked = [cli("check", *files) for files in ([reference], received)]
    assert checked[0].returncode == checked[1].returncode
    assert checked[1].stdout == checked[0].stdout


def test_ids_are_hex_as_the_file_exporter_writes_them(receiver: Running, tmp_path: Path) -> None:
    reference = tmp_path / "reference.jsonl"
    process = u.Process(reference, pid=77)
    process.provider.add_span_processor(SimpleSpanProcessor(exporter("grpc", receiver)))
    process.pretrain(train_iters=3, save_interval=10)
    receiver.stop()

    def spans(path: Path) -> dict[str, dict]:
        found = {}
        for line in path.read_text().splitlines():
            for entry in json.loads(line)["resourceSpans"]:
                for scope in entry["scopeSpans"]:
                    for span in scope["spans"]:
                        found[span["spanId"]] = span
        return found

    want, got = spans(reference), spans(receiver.out / "job-4711" / "rank0" / "traces.jsonl")
    assert got.keys() == want.keys()
    assert all(re.fullmatch(r"[0-9a-f]{16}", span_id) for span_id in got)
    for span_id, span in want.items():
        assert got[span_id]["traceId"] == span["traceId"]
        assert got[span_id].get("parentSpanId", "") == span.get("parentSpanId", "")
        assert [link["spanId"] for link in got[span_id].get("links", [])] == [
            link["spanId"] for link in span.get("links", [])
        ]
        assert got[span_id]["kind"] == span["kind"]


def test_metrics_arrive_beside_the_rank_s_trace(receiver: Running, tmp_path: Path) -> None:
    u.official_file_exporter()  # (the official file exporters need the newest SDK: skip if not)
    from opentelemetry.exporter.otlp.json.file.metric_exporter import FileMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter
    from opentelemetry.sdk.resources import Resource

    from megatron.core.telemetry.training_metrics import record_training_metrics

    reference = tmp_path / "metrics.jsonl"
    exporters: list[MetricExporter] = [
        FileMetricExporter(reference),
        OTLPMetricExporter(endpoint=f"http://127.0.0.1:{receiver.grpc_port}", insecure=True),
        HttpMetricExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/metrics"),
    ]
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        resource=Resource.create({"dl.rank": 3, "service.instance.id": "job-rank3"}),
        metric_readers=[reader],
    )
    record_training_metrics(
        provider.get_meter("megatron.training"),
        step_duration_ms=100.0, loss=2.5, throughput_tflops=100.0, grad_norm=1.0,
        learning_rate=1e-4, tokens_per_sec=4096.0,
    )  # fmt: skip
    for each in exporters:  # a collection each (the same request twice is written once)
        each.export(reader.get_metrics_data())
        each.shutdown()
    receiver.stop()

    def points(text: str) -> list[tuple[str, float]]:
        found = []
        for line in text.splitlines():
            for entry in json.loads(line)["resourceMetrics"]:
                for scope in entry["scopeMetrics"]:
                    for metric in scope["metrics"]:
                        body = next(v for k, v in metric.items() if isinstance(v, dict))
                        for point in body.get("dataPoints", []):
                            value = point.get("asDouble", point.get("asInt", point.get("sum")))
                            found.append((metric["name"], float(value)))
        return sorted(found)

    received = receiver.out / "job" / "rank3" / "metrics.jsonl"  # (instance id less -rank3)
    lines = received.read_text().splitlines()
    assert len(lines) == 2  # one request by gRPC, one by HTTP
    want = points(reference.read_text())
    assert ("megatron.training.loss", 2.5) in want
    assert points(lines[0]) == points(lines[1]) == want


def test_http_json_bodies_are_kept_and_bad_bodies_refused(receiver: Running) -> None:
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
            "name": "megatron.startup", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2"}  # fmt: skip
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "dl.rank", "value": {"intValue": "0"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}  # fmt: skip

    def post(data: bytes, content_type: str, path: str = "/v1/traces") -> tuple[int, bytes]:
        request = urllib.request.Request(
            url.replace("/v1/traces", path), data=data, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    assert post(json.dumps(body).encode(), "application/json") == (200, b"{}")
    assert post(b"{not json", "application/json")[0] == 400
    assert post(b"\xff\xff\xff", "application/x-protobuf")[0] == 400
    assert post(b"{}", "text/plain")[0] == 415
    assert post(b"{}", "application/json", "/v1/nothing")[0] == 404
    assert receiver.stop()[0] == 0
    # (a resource naming neither job nor process: a folder of its own)
    lines = (receiver.out / "unidentified" / "rank0" / "traces.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [body]  # the bad bodies wrote nothing


def test_a_torn_last_line_stays_the_one_torn_line(tmp_path: Path) -> None:
    out = tmp_path / "received"
    (out / "unidentified" / "rank0").mkdir(parents=True)
    torn = '{"resourceSpans": [{"resource": {'
    (out / "unidentified" / "rank0" / "traces.jsonl").write_text(torn)
    receiver = Running(out)
    try:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        body = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "dl.rank", "value": {"intValue": "0"}}]}, "scopeSpans": []}]}  # fmt: skip
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
    finally:
        receiver.stop()
    assert (out / "unidentified" / "rank0" / "traces.jsonl").read_text().splitlines() == [
        torn,
        json.dumps(body, separators=(",", ":")),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grpc", "nowhere"], "--grpc: expected HOST:PORT (e.g. 0.0.0.0:4317) or off"),
        (["--http", "h:99999"], "--http: expected HOST:PORT (e.g. 0.0.0.0:4318) or off"),
        (["--grpc", "off", "--http", "off"], "nothing would listen"),
        (["--max-folders", "1"], "--max-folders: expected a whole number of folders, 2 or more"),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    result = cli("receive", "--out", tmp_path / "out", *argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1
    assert not (tmp_path / "out").exists()


def test_out_in_a_missing_folder_is_an_error_naming_the_flag(tmp_path: Path) -> None:
    result = cli("receive", "--out", tmp_path / "no" / "such")
    assert result.returncode == 2
    assert "--out" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "no").exists()


def test_a_port_in_use_is_one_line_naming_the_flag(receiver: Running, tmp_path: Path) -> None:
    taken = f"127.0.0.1:{receiver.http_port}"
    result = cli("receive", "--out", tmp_path / "other", "--grpc", "off", "--http", taken)
    assert result.returncode == 2
    assert result.stderr.startswith(f"megatron-trace receive: error: --http {taken}: cannot")


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_watch_receive_serves_what_report_reads_from_the_received_files(
    tmp_path: Path, transport: str
) -> None:
    watching = Watching(tmp_path / "received")
    try:
        reference = tmp_path / "reference" / "traces.jsonl"
        reference.parent.mkdir()
        _job(reference, transport, watching)  # type: ignore[arg-type]
        received = sorted(watching.out.glob("job-4711/*/traces.jsonl"))
        assert [p.parent.name for p in received] == ["rank0", "rank1"]

        # The receiver writes a request before it answers it: the files are whole now.
        # What report reads in each is what watch must come to serve.
        run = "job-4711"
        expected: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for path in received:
            rank = path.parent.name.removeprefix("rank")
            result = cli("report", "--json", path)
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout.splitlines()[-1])
            labels = frozenset({("run_id", run), ("rank", rank)})
            expected[("megatron_training_goodput_seconds", labels)] = report["goodput_s"]
            expected[("megatron_training_wall_clock_seconds", labels)] = report["wall_s"]
            for category, seconds in report["badput_s"].items():
                key = ("megatron_training_badput_seconds", labels | {("category", category)})
                expected[key] = seconds or 0.0
        expected_states = {"0": "finished", "1": "killed"}

        def states(scraped: dict) -> dict[str, str]:
            return {
                dict(labels)["rank"]: dict(labels)["state"]
                for (name, labels), value in scraped.items()
                if name == "megatron_job_state" and value == 1
            }

        def served(scraped: dict) -> bool:
            return states(scraped) == expected_states and all(
                key in scraped and abs(scraped[key] - value) <= 1e-6
                for key, value in expected.items()
            )

        # Wait for watch to have read every line (its polls take longer on a busy
        # machine); the bound only ends a hang, and the asserts below say what differs.
        deadline = time.monotonic() + 120
        while not served(scraped := watching.scrape()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        status, said = watching.stop()
    assert status == 0, said
    for key, value in expected.items():
        assert scraped.get(key) == pytest.approx(value, abs=1e-6), key
    assert states(scraped) == expected_states
