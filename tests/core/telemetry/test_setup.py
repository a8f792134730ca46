from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from core_telemetry_helpers import spans_by_name
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from megatron.core.telemetry import (
    MegatronSpanGroup,
    TelemetryConfig,
    TelemetryConfigError,
    TelemetryHandle,
    is_span_group_enabled,
    managed_span,
    record_training_metrics,
    setup_telemetry,
    state,
)
from megatron.trace.otlp.reader import decode_attributes

Make = Callable[..., TelemetryHandle]


def enabled_config(tmp_path: Path | None = None, **kwargs: object) -> TelemetryConfig:
    values: dict[str, object] = {"enabled": True, "run_id": "run-1"}
    if tmp_path is not None:
        values["trace_file"] = tmp_path / "telemetry" / "traces.jsonl"
    values.update(kwargs)
    return TelemetryConfig(**values)  # type: ignore[arg-type]


def thread_ids() -> set[int]:
    return {thread.ident for thread in threading.enumerate() if thread.ident is not None}


def assert_threads_end(before: set[int]) -> None:
    """Every thread started since ``before`` ends (a stopped thread can stay listed a
    moment; the 60 s bound only ends a hang)."""
    deadline = time.monotonic() + 60
    while thread_ids() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_ids() - before == set()


@pytest.mark.parametrize(
    ("config_kwargs", "rank", "world_size"),
    [
        ({"enabled": False}, 0, 1),  # disabled
        ({}, 0, 4),  # single_rank exports on the last rank only
        ({"export_rank": 2}, 1, 4),
    ],
)
def test_non_exporting_handle_starts_nothing(
    tmp_path: Path, config_kwargs: dict[str, object], rank: int, world_size: int
) -> None:
    config = enabled_config(tmp_path, **config_kwargs)
    before = thread_ids()
    handle = setup_telemetry(config, rank=rank, world_size=world_size)
    assert thread_ids() - before == set()
    assert list(tmp_path.iterdir()) == []
    assert handle.is_exporting is False
    assert handle.span_groups == frozenset()
    assert handle.trace_file is None
    assert handle.rank == rank
    assert isinstance(handle.tracer, trace.NoOpTracer)
    assert isinstance(handle.meter, metrics.NoOpMeter)
    assert not any(is_span_group_enabled(g) for g in MegatronSpanGroup.ALL_GROUPS)
    assert state.get_active_tracer() is state.NO_OP_TRACER
    # the no-op handle's methods are safe to call
    record_training_metrics(handle.meter, loss=1.0)
    assert handle.force_flush() is True
    handle.shutdown()
    assert thread_ids() - before == set()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("config_kwargs", "rank", "world_size", "exporting"),
    [
        ({}, 3, 4, True),
        ({}, 0, 4, False),
        ({"export_rank": 0}, 0, 4, True),
        ({"export_rank": 0}, 3, 4, False),
        ({"rank_strategy": "all_ranks"}, 1, 4, True),
    ],
)
def test_exporting_rule(
    make_handle: Make,
    config_kwargs: dict[str, object],
    rank: int,
    world_size: int,
    exporting: bool,
) -> None:
    config = enabled_config(exporter="none", **config_kwargs)
    handle = make_handle(config, rank=rank, world_size=world_size)
    assert handle.is_exporting is exporting


def test_export_rank_outside_the_world_is_an_error(tmp_path: Path) -> None:
    config = enabled_config(tmp_path, export_rank=4)
    with pytest.raises(
        TelemetryConfigError, match=r"MEGATRON_OTEL_EXPORT_RANK=4 .* world size of 4"
    ):
        setup_telemetry(config, rank=0, world_size=4)
    assert list(tmp_path.iterdir()) == []


def test_exporting_handle_activates_its_tracer_and_groups(make_handle: Make) -> None:
    exporter = InMemorySpanExporter()
    config = enabled_config(exporter="none", span_groups_spec="per_step")
    handle = make_handle(config, span_exporter=exporter)
    assert handle.is_exporting is True
    assert handle.span_groups == MegatronSpanGroup.resolve("per_step")
    assert is_span_group_enabled("step") and not is_span_group_enabled("layer")
    assert state.get_active_tracer() is handle.tracer
    with managed_span("step", "iteration"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["iteration"]
    handle.shutdown()
    assert not is_span_group_enabled("step")
    assert state.get_active_tracer() is state.NO_OP_TRACER


def test_resource_attributes(make_handle: Make) -> None:
    exporter = InMemorySpanExporter()
    config = enabled_config(exporter="none", service_name="svc", run_id="job-7", export_rank=2)
    handle = make_handle(
        config,
        rank=2,
        world_size=4,
        span_exporter=exporter,
        resource_attributes={
            "dl.tensor_parallel.size": 2,
            "megatron.precision": "bf16",
            "dl.sequence_length": None,
            "dl.rank": 99,  # identity attributes cannot be overwritten
        },
    )
    handle.tracer.start_span("s").end()
    (span,) = exporter.get_finished_spans()
    resource = dict(span.resource.attributes)
    assert resource["service.name"] == "svc"
    assert resource["megatron.run_id"] == "job-7"
    assert resource["service.instance.id"] == "job-7-rank2"
    assert resource["dl.rank"] == 2
    assert resource["dl.world_size"] == 4
    assert resource["dl.tensor_parallel.size"] == 2
    assert resource["megatron.precision"] == "bf16"
    assert "dl.sequence_length" not in resource
    assert resource["host.name"] == socket.gethostname()
    assert isinstance(resource["process.pid"], int)


def _resource_under(make_handle: Make, monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
                 "LOCAL_WORLD_SIZE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    handle = make_handle(enabled_config(exporter="none"), span_exporter=exporter)
    handle.tracer.start_span("s").end()
    (span,) = exporter.get_finished_spans()
    return dict(span.resource.attributes)


@pytest.mark.skipif(sys.platform != "linux", reason="the agent's identity is read from /proc")
def test_the_launchers_restart_counts_are_on_the_resource_as_megatron_lm_writes_them(
    make_handle: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's requeue count and torchrun's count of its worker group's restarts, strings
    under Megatron-LM's names, and (under torchrun) the agent that started the process: its
    parent, by boot, pid and start time, and how many workers it started."""
    resource = _resource_under(
        make_handle, monkeypatch, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1",
        TORCHELASTIC_RESTART_COUNT="3", LOCAL_WORLD_SIZE="8",
    )  # fmt: skip
    assert resource["slurm.restart_count"] == "1"
    assert resource["slurm.torchelastic.restart_count"] == "3"
    assert resource["torchelastic.agent.local_world_size"] == 8
    boot, parent, ticks = resource["torchelastic.agent.id"].split("/")
    with open("/proc/sys/kernel/random/boot_id") as file:
        assert boot == file.read().strip()
    assert int(parent) == os.getppid() and ticks.isdigit()
    # outside torchrun and Slurm: none of them
    resource = _resource_under(make_handle, monkeypatch)
    assert not {"slurm.restart_count", "slurm.torchelastic.restart_count",
                "torchelastic.agent.id", "torchelastic.agent.local_world_size"
                } & set(resource)  # fmt: skip
    # torchrun without Slurm
    resource = _resource_under(make_handle, monkeypatch, TORCHELASTIC_RESTART_COUNT="0")
    assert resource["slurm.torchelastic.restart_count"] == "0"
    assert "slurm.restart_count" not in resource and "torchelastic.agent.id" in resource


def test_two_setups_export_to_their_own_files(make_handle: Make, tmp_path: Path) -> None:
    first = make_handle(enabled_config(tmp_path / "a", run_id="first"))
    second = make_handle(enabled_config(tmp_path / "b", run_id="second"))
    # the newest exporting handle is the active one
    assert state.get_active_tracer() is second.tracer
    with managed_span("job", "from-first", tracer=first.tracer):
        pass
    with managed_span("job", "from-second"):
        pass
    first.shutdown()
    # shutting the superseded handle down leaves the active one alone
    assert is_span_group_enabled("job")
    with managed_span("job", "second-again"):
        pass
    second.shutdown()
    assert not is_span_group_enabled("job")

    first_spans = spans_by_name(first.trace_file)
    second_spans = spans_by_name(second.trace_file)
    assert set(first_spans) == {"from-first"}
    assert set(second_spans) == {"from-second", "second-again"}
    assert first_spans["from-first"]["resource"]["megatron.run_id"] == "first"
    assert {s["resource"]["megatron.run_id"] for s in second_spans.values()} == {"second"}


def test_two_setups_with_in_memory_exporters(make_handle: Make) -> None:
    one, two = InMemorySpanExporter(), InMemorySpanExporter()
    reader_one, reader_two = InMemoryMetricReader(), InMemoryMetricReader()
    config = enabled_config(exporter="none")
    h1 = make_handle(config, span_exporter=one, metric_reader=reader_one)
    h2 = make_handle(config, span_exporter=two, metric_reader=reader_two)
    h1.tracer.start_span("one").end()
    h2.tracer.start_span("two").end()
    record_training_metrics(h1.meter, loss=1.0)
    assert [s.name for s in one.get_finished_spans()] == ["one"]
    assert [s.name for s in two.get_finished_spans()] == ["two"]

    def names(reader: InMemoryMetricReader) -> set[str]:
        return {
            metric.name
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        }

    # each handle's meter records into its own reader; both carry their heartbeat
    assert names(reader_one) == {"megatron.training.loss", "megatron.training.running"}
    assert names(reader_two) == {"megatron.training.running"}


def test_shutdown_is_idempotent_and_stops_threads(make_handle: Make, tmp_path: Path) -> None:
    before = thread_ids()
    handle = make_handle(enabled_config(tmp_path))
    assert thread_ids() - before, "the jsonl pipeline runs worker threads"
    assert handle.shutdown(timeout_ms=5000) is True
    assert_threads_end(before)
    size = handle.trace_file.stat().st_size
    assert handle.shutdown() is True
    assert handle.force_flush() is True
    assert handle.trace_file.stat().st_size == size


def test_force_flush_exports_without_shutting_down(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(enabled_config(tmp_path))
    root = handle.tracer.start_span("root")
    handle.tracer.start_span("child", context=trace.set_span_in_context(root)).end()
    assert handle.force_flush(timeout_ms=5000) is True
    assert set(spans_by_name(handle.trace_file)) == {"child"}
    root.end()
    handle.shutdown()
    assert set(spans_by_name(handle.trace_file)) == {"child", "root"}


def test_trace_file_under_a_regular_file_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    config = enabled_config(trace_file=blocker / "telemetry" / "traces.jsonl")
    before = thread_ids()
    with pytest.raises(TelemetryConfigError) as info:
        setup_telemetry(config)
    text = str(info.value)
    assert "--otel-trace-file" in text and "MEGATRON_OTEL_TRACE_FILE" in text
    assert str(blocker / "telemetry" / "traces.jsonl") in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]
    assert thread_ids() - before == set()
    assert not is_span_group_enabled("job")


def test_trace_file_that_is_a_directory_is_reported(tmp_path: Path) -> None:
    (tmp_path / "traces.jsonl").mkdir()
    with pytest.raises(TelemetryConfigError, match=r"traces\.jsonl"):
        setup_telemetry(enabled_config(trace_file=tmp_path / "traces.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces.jsonl"]


def test_trace_file_where_directories_cannot_be_created_is_reported() -> None:
    # /sys refuses new directories even to root, unlike a chmod-ed folder.
    target = Path("/sys/megatron-telemetry-test/traces.jsonl")
    with pytest.raises(TelemetryConfigError, match="--otel-trace-file") as raised:
        setup_telemetry(enabled_config(trace_file=target))
    assert str(target) in str(raised.value)
    assert not target.parent.exists()


def test_metrics_file_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    # the trace file could be opened, metrics.jsonl (a directory here) not
    (tmp_path / "telemetry" / "metrics.jsonl").mkdir(parents=True)
    config = enabled_config(tmp_path)
    with pytest.raises(TelemetryConfigError, match=r"metrics\.jsonl"):
        setup_telemetry(config)
    assert sorted(p.name for p in (tmp_path / "telemetry").iterdir()) == ["metrics.jsonl"]


def test_missing_otlp_extra_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    for module in (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    ):
        monkeypatch.setitem(sys.modules, module, None)
    before = thread_ids()
    with pytest.raises(
        TelemetryConfigError, match=r"pip install 'megatron-telemetry-spans\[otlp\]'"
    ):
        setup_telemetry(enabled_config(exporter="otlp"))
    assert thread_ids() - before == set()
    assert not is_span_group_enabled("job")


def test_unknown_otlp_protocol_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(TelemetryConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        setup_telemetry(enabled_config(exporter="otlp"))


def _closed_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_is_bounded_when_the_otlp_endpoint_is_down(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    port = _closed_loopback_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    for name in ("TRACES_ENDPOINT", "METRICS_ENDPOINT"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)
    before = thread_ids()
    handle = setup_telemetry(enabled_config(exporter="otlp"))
    assert handle.is_exporting
    with managed_span("job", "doomed"):
        pass
    record_training_metrics(handle.meter, loss=1.0)
    handle.tracer.start_span("still-open")
    started = time.monotonic()
    handle.shutdown(timeout_ms=2000)
    assert time.monotonic() - started < 15
    assert not is_span_group_enabled("job")
    # the shutdown returned within its bound while an export still retried; that thread
    # ends (the shutdown aborts its retry) and takes its last warning with it, rather than
    # logging into whichever test runs next
    assert_threads_end(before)


def test_console_exporter_writes_spans(
    make_handle: Make, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = make_handle(enabled_config(exporter="console"))
    with managed_span("job", "printed-span"):
        pass
    handle.shutdown()
    assert '"name": "printed-span"' in capsys.readouterr().out


def test_none_exporter_records_but_exports_nothing(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(enabled_config(tmp_path, exporter="none"))
    assert handle.is_exporting and handle.trace_file is None
    with managed_span("job", "recorded") as span:
        assert span.is_recording()
    handle.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_sampler_env_is_honoured(make_handle: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    make_handle(enabled_config(exporter="none"), span_exporter=exporter)
    with managed_span("job", "sampled-out") as span:
        assert not span.is_recording()
    assert exporter.get_finished_spans() == ()


def test_import_starts_nothing() -> None:
    import subprocess

    code = (
        "import threading\n"
        "n = len(threading.enumerate())\n"
        "import megatron.core.telemetry as t\n"
        "assert len(threading.enumerate()) == n\n"
        "assert not t.is_span_group_enabled('job')\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_reader_decodes_attributes() -> None:
    # the shared reader's decoding against a hand-written KeyValue list
    assert decode_attributes(
        [
            {"key": "a", "value": {"intValue": "5"}},
            {"key": "b", "value": {"arrayValue": {"values": [{"boolValue": True}]}}},
        ]
    ) == {"a": 5, "b": [True]}


def test_stamped_attributes_go_on_every_span_started_after(make_handle: Make) -> None:
    """What the resource cannot say because it changes while the providers live (an
    in-process restart's cycle) is set on each span as it starts, until replaced."""
    exporter = InMemorySpanExporter()
    handle = make_handle(enabled_config(exporter="none"), span_exporter=exporter)
    handle.tracer.start_span("before").end()
    handle.stamp_spans({"nvrx.inprocess.iteration": 0})
    open_across = handle.tracer.start_span("across")
    handle.stamp_spans({"nvrx.inprocess.iteration": 1})
    handle.tracer.start_span("after").end()
    open_across.end()
    cycles = {
        s.name: s.attributes.get("nvrx.inprocess.iteration") for s in exporter.get_finished_spans()
    }
    assert cycles == {"before": None, "across": 0, "after": 1}
    off = make_handle(TelemetryConfig())
    off.stamp_spans({"nvrx.inprocess.iteration": 0})  # not exporting: nothing to stamp
