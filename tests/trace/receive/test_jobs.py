"""One receiver for several jobs: a folder per job, then per rank; never two jobs in one.

The rule (:func:`megatron.trace.receive.files.job_id`) is checked on the
resources Megatron-LM with nemo-lens and this project's trainer really
carry; then jobs exporting at once through the SDK's own OTLP exporters (gRPC
and HTTP, from threads, as processes on a cluster would) must each read, in
their own folder, exactly as the file exporter's copy of what they sent; a
resumed job lands beside its first launch; a receiver's folder of several jobs
is named in one line; and a client cannot make the receiver create folders
without end.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import upstream_traces as u
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import Running, Watching, cli, exporter, report

from megatron.trace.receive.files import (
    NAME_CHARS,
    UNPLACED_JOB_UUID,
    job_folder,
    job_id,
    rank_folder,
    safe_name,
)


def _resource(**attributes: object) -> dict:
    def value(v: object) -> dict:
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}

    return {"attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()]}


def _megatron_lm_uuids(cluster: str, job: str, restart: int) -> tuple[str, str]:
    """``nemo.lens.job_uuid`` and ``run_uuid`` as Megatron-LM derives them (UUID5 over
    the URL namespace) for a non-array Slurm job's ``restart``-th requeue."""
    job_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"nemo.lens.job/{cluster}/{job}")
    run_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"nemo.lens.run/{cluster}/{job}/sr{restart}")
    return str(job_uuid), str(run_uuid)


def test_the_unplaced_job_uuid_is_megatron_lm_s_value_outside_slurm() -> None:
    assert _megatron_lm_uuids("nocluster", "nojob", 0)[0] == UNPLACED_JOB_UUID


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        # Megatron-LM on Slurm: the job uuid, the same across requeues (run_uuid differs)
        ({"nemo.lens.job_uuid": "J", "nemo.lens.run_uuid": "R1", "nemo.run.id": "77"}, "J"),
        # Megatron-LM off Slurm: every job has the same job uuid, passed over for the run id
        ({"nemo.lens.job_uuid": UNPLACED_JOB_UUID, "nemo.run.id": "lens-run-41"}, "lens-run-41"),
        # this project's trainer
        ({"megatron.run_id": "ours", "nemo.run.id": "ours", "slurm.job.id": "9"}, "ours"),
        ({"megatron.run_id": "ours", "nemo.run.id": "theirs"}, "ours"),
        ({"slurm.job.id": "123", "service.instance.id": "x-rank0"}, "123"),
        ({"service.instance.id": "job-4711-rank3", "service.name": "megatron-lm"}, "job-4711"),
        # service.name is the same for every Megatron-LM job: never a job
        ({"service.name": "megatron-lm", "dl.rank": 0}, None),
    ],
)
def test_the_job_is_the_first_id_the_resource_names(attributes: dict, expected: str | None) -> None:
    assert job_id(_resource(**attributes)) == expected


def test_launches_of_one_slurm_job_share_a_folder_two_jobs_never_do() -> None:
    first = _megatron_lm_uuids("eos", "4242", 0)
    requeued = _megatron_lm_uuids("eos", "4242", 1)
    other = _megatron_lm_uuids("eos", "4243", 0)
    assert first[1] != requeued[1]  # a new launch: a new run uuid
    folders = [
        job_folder(_resource(**{"nemo.lens.job_uuid": j, "nemo.lens.run_uuid": r}))
        for j, r in (first, requeued, other)
    ]
    assert folders[0] == folders[1] != folders[2]


def test_a_process_naming_no_job_gets_a_folder_of_its_own() -> None:
    one = job_folder(_resource(**{"host.name": "n1", "process.pid": 10, "service.name": "m"}))
    two = job_folder(_resource(**{"host.name": "n1", "process.pid": 11, "service.name": "m"}))
    assert re.fullmatch(r"process-[0-9a-f]{12}", one) and one != two
    assert job_folder(_resource(**{"host.name": "n1", "process.pid": 10})) == one
    assert job_folder(_resource()) == "unidentified"


@pytest.mark.parametrize(
    "text",
    ["../../etc", "a/b", "a_b", "..", ".", "", "x" * 500, "\x00\n", "rank 0", "ünïcode", "-"],
)
def test_folder_names_are_safe_and_distinct_whatever_a_client_sends(text: str) -> None:
    name = safe_name(text)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), name
    assert len(name) <= NAME_CHARS and name not in (".", "..")
    assert job_folder(_resource(**{"nemo.run.id": text})) == (name if text else "unidentified")


def test_two_ids_that_sanitise_alike_keep_two_folders() -> None:
    names = {safe_name(t) for t in ("a/b", "a_b", "a b", "a\\b", "x" * 200, "x" * 201)}
    assert len(names) == 6
    # a client sending another id's hashed name, or the name of the folder of processes
    # naming no job, is given a folder of its own
    hashed = safe_name("a/b")
    assert safe_name(hashed) not in (hashed, "a_b")
    assert safe_name("unidentified") != "unidentified"
    process = job_folder(_resource(**{"host.name": "n1", "process.pid": 10}))
    assert safe_name(process) != process
    assert safe_name("job-4711") == "job-4711" and safe_name("a_b") == "a_b"


def test_rank_folders_stay_bounded_names() -> None:
    assert rank_folder(_resource(**{"dl.rank": 3})) == "rank3"
    weird = rank_folder(_resource(**{"dl.rank": "9" * 40, "service.instance.id": "../x"}))
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", weird) and ".." not in weird


# -- jobs exporting at once, over the wire --------------------------------------------------


def _send(job: str, rank: int, transport: str, receiver: Running, reference: Path) -> None:
    process = u.Process(reference, pid=1000 + rank, rank=rank, host=f"{job}-node{rank}", run_id=job)
    wire = BatchSpanProcessor(exporter(transport, receiver), schedule_delay_millis=50)
    process.provider.add_span_processor(wire)
    kill = u.Kill(13) if (job, rank) == ("job-b", 1) else None
    process.pretrain(train_iters=20, save_interval=10, eval_interval=10, kill=kill)
    wire.force_flush()
    process.processor.force_flush()


def test_jobs_exporting_at_once_each_read_as_what_it_sent(tmp_path: Path) -> None:
    # Each job's reference copy is written by the official file exporter, which needs
    # the newest SDK: skip here, not in the sending threads (tox -e mindeps).
    u.official_file_exporter()
    receiver = Running(tmp_path / "received")
    references: dict[str, list[Path]] = {}
    try:
        threads = []
        for job, transport in (("job-a", "grpc"), ("job-b", "http"), ("job-c", "http-gzip")):
            for rank in (0, 1):
                reference = tmp_path / "reference" / job / f"rank{rank}" / "traces.jsonl"
                reference.parent.mkdir(parents=True)
                references.setdefault(job, []).append(reference)
                threads.append(
                    threading.Thread(target=_send, args=(job, rank, transport, receiver, reference))
                )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        status, said = receiver.stop()
    assert status == 0, said
    assert "lines in 6 files of 3 jobs under" in said
    out = receiver.out
    assert sorted(p.name for p in out.iterdir()) == ["job-a", "job-b", "job-c"]
    for job, files in references.items():
        assert sorted(p.name for p in (out / job).iterdir()) == ["rank0", "rank1"]
        expected, got = report(*files), report(out / job)
        assert got["spans"] == expected["spans"] > 100
        assert [r["rank"] for r in got["ranks"]] == [0, 1]
        assert got == expected, job
        checked = cli("check", out / job)
        assert checked.returncode == cli("check", *files).returncode == 0, checked.stdout

    whole = cli("report", out)
    assert whole.returncode == 2
    lines = whole.stderr.strip().splitlines()
    assert lines == [
        f"megatron-trace report: error: {out} is a receiver's folder holding 3 jobs "
        f"(job-a, job-b, job-c): name one job's folder, e.g. megatron-trace report {out}/job-a"
    ]


def test_a_resumed_job_lands_beside_its_first_launch(tmp_path: Path) -> None:
    receiver = Running(tmp_path / "received")
    reference = tmp_path / "reference.jsonl"
    try:
        killed = u.Process(reference, pid=4242, run_id="resumed")
        wire = BatchSpanProcessor(exporter("grpc", receiver), schedule_delay_millis=50)
        killed.provider.add_span_processor(wire)
        killed.pretrain(train_iters=100, save_interval=10, kill=u.Kill(25))
        wire.force_flush()
        killed.processor.force_flush()
        # the new launch: another process, later, with the same run id, over HTTP
        again = u.Process(reference, pid=5151, run_id="resumed", clock=killed.clock + 60 * u.SECOND)
        wire = BatchSpanProcessor(exporter("http", receiver), schedule_delay_millis=50)
        again.provider.add_span_processor(wire)
        again.pretrain(train_iters=40, save_interval=10, start_iteration=20, load=True)
        wire.force_flush()
        again.processor.force_flush()
    finally:
        assert receiver.stop()[0] == 0
    assert [p.name for p in receiver.out.iterdir()] == ["resumed"]
    got, expected = report(receiver.out / "resumed"), report(reference)
    assert [i["ended"] for i in got["incarnations"]] == ["killed", "shutdown"]
    assert got == expected
    assert got["badput_s"]["restart_gap"] > 0


def _post(port: int, body: dict) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def _body(run_id: str, rank: int) -> dict:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "megatron.startup",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
    }
    resource = _resource(**{"nemo.run.id": run_id, "dl.rank": rank})
    scopes = [{"scope": {"name": "t"}, "spans": [span]}]
    return {"resourceSpans": [{"resource": resource, "scopeSpans": scopes}]}


def test_a_client_cannot_make_folders_without_end(tmp_path: Path) -> None:
    out = tmp_path / "received"
    (out / "old-job" / "rank0").mkdir(parents=True)  # two folders there already
    receiver = Running(out, "--max-folders", "5")
    try:
        port = receiver.http_port
        assert _post(port, _body("job-a", 0)) == 200  # folders 3 and 4
        assert _post(port, _body("job-a", 1)) == 200  # 5
        assert _post(port, _body("job-a", 1)) == 200  # no new folder: still taken
        refused = [_post(port, _body(f"flood-{n}", 0)) for n in range(50)]
        assert refused == [507] * 50  # not retried by an OTLP exporter (not 429/502/503/504)
        assert _post(port, _body("job-a", 2)) == 507
        # the SDK's gRPC exporter is told so too, and gives up at once instead of retrying
        grpc = exporter("grpc", receiver)
        span = u.Process(tmp_path / "grpc.jsonl", pid=9, run_id="flood-grpc")
        memory = InMemorySpanExporter()
        span.provider.add_span_processor(SimpleSpanProcessor(memory))
        span.pretrain(train_iters=1, save_interval=0)
        began = time.monotonic()
        assert grpc.export(memory.get_finished_spans()) == SpanExportResult.FAILURE
        assert time.monotonic() - began < 5  # (a retried code backs off 1, 2, 4, ... s)
    finally:
        status, said = receiver.stop()
    assert status == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_dir()) == [
        "job-a", "job-a/rank0", "job-a/rank1", "old-job", "old-job/rank0",
    ]  # fmt: skip
    warnings = [line for line in said.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "--max-folders allows (5)" in warnings[0]
    assert said.rstrip().endswith(
        "; 52 resource entries refused (--max-folders); 1 resent lines written once"
    )


# -- watch --receive: each job its own series ----------------------------------------------


def _by_run(scraped: dict, name: str) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["run_id"], dict(labels)["rank"]): value
        for (family, labels), value in scraped.items()
        if family == name
    }


def _states(scraped: dict) -> dict[tuple[str, str], str]:
    return {
        (dict(labels)["run_id"], dict(labels)["rank"]): dict(labels)["state"]
        for (family, labels), value in scraped.items()
        if family == "megatron_job_state" and value == 1
    }


def _settled(watching: Watching, want: set[tuple[str, str]]) -> dict:
    """The endpoint once it serves ``want``'s states and has read every received span.

    The senders have flushed, and the receiver writes a request before it answers,
    so the files hold every span: watch has read them all when its span count per
    job is the files'.
    """
    deadline = time.monotonic() + 90
    while set(_states(scraped := watching.scrape())) != want:
        assert time.monotonic() < deadline, f"watch never served {want}: {_states(scraped)}"
        time.sleep(0.3)
    received = {job: report(watching.out / job)["spans"] for job in {job for job, _ in want}}
    while (read := _by_run_only(scraped, "megatron_trace_watch_spans")) != received:
        assert time.monotonic() < deadline, f"watch read {read} of the received spans {received}"
        time.sleep(0.3)
        scraped = watching.scrape()
    return scraped


def test_watch_receive_serves_each_job_apart(tmp_path: Path) -> None:
    watching = Watching(tmp_path / "received")
    try:
        for job, transport in (("job-a", "grpc"), ("job-b", "http")):
            for rank in (0, 1):
                reference = tmp_path / "reference" / job / f"rank{rank}" / "traces.jsonl"
                reference.parent.mkdir(parents=True)
                _send(job, rank, transport, watching, reference)
        two = {(job, rank) for job in ("job-a", "job-b") for rank in ("0", "1")}
        before = _settled(watching, two)
        # a third job arrives and ends: the first two's series stay as they were
        reference = tmp_path / "reference" / "job-c" / "rank0" / "traces.jsonl"
        reference.parent.mkdir(parents=True)
        _send("job-c", 0, "grpc", watching, reference)
        after = _settled(watching, two | {("job-c", "0")})
    finally:
        status, said = watching.stop()
    assert status == 0, said
    assert _states(before) == {
        ("job-a", "0"): "finished",
        ("job-a", "1"): "finished",
        ("job-b", "0"): "finished",
        ("job-b", "1"): "killed",  # job-b's rank 1 was SIGKILLed: that job's alone
    }
    assert _states(after) == {**_states(before), ("job-c", "0"): "finished"}
    for family in ("megatron_training_goodput_seconds", "megatron_training_wall_clock_seconds"):
        was = _by_run(before, family)
        assert {k: v for k, v in _by_run(after, family).items() if k in was} == was
    goodput = _by_run(after, "megatron_training_goodput_seconds")
    for job in ("job-a", "job-b", "job-c"):
        for path in sorted((watching.out / job).glob("*/traces.jsonl")):
            rank = path.parent.name.removeprefix("rank")
            reported = report(path)
            assert goodput[(job, rank)] == pytest.approx(reported["goodput_s"], abs=1e-6)
    spans = _by_run_only(after, "megatron_trace_watch_spans")
    assert spans == {job: report(watching.out / job)["spans"] for job in spans}
    assert sorted(spans) == ["job-a", "job-b", "job-c"]


def _by_run_only(scraped: dict, name: str) -> dict[str, float]:
    return {
        dict(labels)["run_id"]: value
        for (family, labels), value in scraped.items()
        if family == name
    }


def _protobuf_body(run_id: str, rank: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    span = Span(trace_id=bytes(range(16)), span_id=bytes(range(8)), name="megatron.startup",
                start_time_unix_nano=1, end_time_unix_nano=2)  # fmt: skip
    attributes = [
        KeyValue(key="nemo.run.id", value=AnyValue(string_value=run_id)),
        KeyValue(key="dl.rank", value=AnyValue(int_value=rank)),
    ]
    entry = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    entry.resource.attributes.extend(attributes)
    return ExportTraceServiceRequest(resource_spans=[entry]).SerializeToString()


def test_many_exporters_connecting_at_once_are_all_answered(tmp_path: Path) -> None:
    """A cluster's ranks connect together (at a checkpoint, at the export interval), to a
    receiver that has just started: none may be turned away (the standard library's listen
    backlog of 5 reset some of 16), nor fail in the first requests' decoding at once."""
    receiver = Running(tmp_path / "received")
    start = threading.Barrier(48)
    answers: list[int] = []

    def one(rank: int) -> None:
        body = _protobuf_body("crowd", rank)
        request = urllib.request.Request(
            f"http://127.0.0.1:{receiver.http_port}/v1/traces",
            data=body,
            headers={"Content-Type": "application/x-protobuf"},
        )
        start.wait()
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                answers.append(answer.status)
        except (urllib.error.URLError, ConnectionError) as error:
            answers.append(getattr(error, "code", 0))

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(48)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        assert receiver.stop()[0] == 0
    assert answers == [200] * 48
    assert len(list((receiver.out / "crowd").glob("rank*/traces.jsonl"))) == 48


def test_a_job_spread_over_two_receivers_reads_as_that_job(tmp_path: Path) -> None:
    """Each rank exports to one of two receivers (each its own --out): ``report`` on the
    job's two folders reads the job as the file exporter's copy has it."""
    first, second = Running(tmp_path / "a"), Running(tmp_path / "b")
    files = []
    try:
        for rank, receiver in ((0, first), (1, second)):
            reference = tmp_path / "reference" / f"rank{rank}" / "traces.jsonl"
            reference.parent.mkdir(parents=True)
            files.append(reference)
            _send("split", rank, "grpc", receiver, reference)
    finally:
        assert first.stop()[0] == second.stop()[0] == 0
    assert [p.name for p in (tmp_path / "a" / "split").iterdir()] == ["rank0"]
    assert [p.name for p in (tmp_path / "b" / "split").iterdir()] == ["rank1"]
    got = report(tmp_path / "a" / "split", tmp_path / "b" / "split")
    assert [r["rank"] for r in got["ranks"]] == [0, 1]
    assert got == report(*files)
