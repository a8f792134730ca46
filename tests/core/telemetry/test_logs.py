"""The log bridge: records correlated with spans, logs.jsonl, and its OTLP/JSON encoding."""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle, managed_span, setup_telemetry
from megatron.core.telemetry._otlp_json import encode_logs
from megatron.core.telemetry.logs import CONSOLE_LOGGER_NAME, logs_file_for
from megatron.trace.otlp.reader import iter_logs
from megatron.training.distributed import print_rank_0

Make = Callable[..., TelemetryHandle]


class Collect(LogRecordExporter):
    def __init__(self) -> None:
        self.records: list[ReadableLogRecord] = []

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        self.records.extend(batch)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def provider(resource: Resource, exporter: Collect) -> LoggerProvider:
    logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return logger_provider


def sample_records() -> list[ReadableLogRecord]:
    """Records of every shape the bridge produces, from two resources and three scopes."""
    exporter = Collect()
    first = provider(Resource.create({"service.name": "a", "n": 1}), exporter)
    second = provider(Resource({"only": "attr"}, schema_url="https://example/schema"), exporter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(logger_provider=first)
    library = logging.getLogger("conformance.library")
    library.addHandler(handler)
    library.setLevel(logging.DEBUG)
    library.propagate = False
    try:
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("outer"):
            library.info(
                "iteration %d | loss %s",
                7,
                "2.5",
                extra={
                    "flag": True,
                    "count": 2**40,
                    "ratio": 0.25,
                    "nan": math.nan,
                    "inf": -math.inf,
                    "names": ["a", "b"],
                    "floats": (1.5, 2.5),
                    "empty": [],
                    "raw": b"\x00\xffbytes",
                    "nested": {"k": [1, {"deep": False}], "empty": {}},
                    "text": "héllo",
                },
            )
        library.warning("outside any span")
        try:
            raise ValueError("bad batch")
        except ValueError:
            library.exception("training step failed")
        library.debug("")  # an empty body
    finally:
        library.removeHandler(handler)
        library.propagate = True
    scoped = first.get_logger("scoped", "1.2.3", schema_url="https://s", attributes={"x": 1})
    scoped.emit(body={"structured": [1, 2.5, None]}, severity_text="TRACE", event_name="ev")
    scoped.emit(body=None)
    second.get_logger("second").emit(body=["list", "body"], attributes={"only": 3})
    return exporter.records


@pytest.fixture
def official_encode() -> Callable[..., Any]:
    # The reference requires the newest SDK: `tox -e mindeps` runs without it.
    encoder = pytest.importorskip(
        "opentelemetry.exporter.otlp.json.common._log_encoder",
        reason="the official OTLP/JSON encoder (test extra) requires the newest SDK",
    )
    return encoder.encode_logs


def test_log_encoding_matches_the_official_encoder(official_encode: Callable[..., Any]) -> None:
    records = sample_records()
    assert len(records) == 7
    ours = json.loads(json.dumps(encode_logs(records), allow_nan=False))
    official = json.loads(official_encode(records).to_json())
    assert ours == official


def test_log_encoding_of_one_record_per_batch_also_matches(
    official_encode: Callable[..., Any],
) -> None:
    for record in sample_records():
        assert json.loads(json.dumps(encode_logs([record]))) == json.loads(
            official_encode([record]).to_json()
        )


def test_log_encoding_of_a_value_otlp_cannot_carry_is_a_string() -> None:
    exporter = Collect()
    logger = provider(Resource({}), exporter).get_logger("odd")
    logger.emit(body=object.__new__(type("Opaque", (), {"__repr__": lambda self: "opaque"})))
    (record,) = exporter.records
    encoded = encode_logs([record])
    (log_record,) = encoded["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert log_record["body"] == {"stringValue": "opaque"}


# --- the bridge ----------------------------------------------------------------


def bridge_config(tmp_path: Path, **kwargs: object) -> TelemetryConfig:
    values: dict[str, object] = {
        "enabled": True,
        "exporter": "jsonl",
        "trace_file": tmp_path / "telemetry" / "traces.jsonl",
        "run_id": "logs",
        "span_groups_spec": "all",
        "logs_enabled": True,
    }
    values.update(kwargs)
    return TelemetryConfig(**values)  # type: ignore[arg-type]


def bridged_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger(), logging.getLogger(CONSOLE_LOGGER_NAME)]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, LoggingHandler)]


def log_records(path: Path) -> list[dict[str, Any]]:
    return [
        {**record["data"], "_resource": record["resource"], "_scope": record["scope"]}
        for record in iter_logs(path)
    ]


def test_records_carry_the_current_span_and_go_to_logs_jsonl(
    make_handle: Make, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = make_handle(bridge_config(tmp_path))
    assert handle.logs_file == tmp_path / "telemetry" / "logs.jsonl"
    assert len(bridged_handlers()) == 2  # root, and the console-line logger
    library = logging.getLogger("some.library")
    with managed_span("job", "outer") as outer:
        library.warning("disk is slow")
        with managed_span("step", "inner") as inner:
            print_rank_0(" iteration        1/      10 | lm loss: 1.0 |")
    library.error("after the spans")
    logging.getLogger("opentelemetry.sdk.test").warning("not bridged: the SDK's own logger")
    library.info("not bridged: below the library's level")
    handle.shutdown()

    assert capsys.readouterr().out == " iteration        1/      10 | lm loss: 1.0 |\n"
    assert bridged_handlers() == []
    records = log_records(logs_file_for(tmp_path / "telemetry" / "traces.jsonl"))
    by_body = {r["body"]["stringValue"]: r for r in records}
    assert set(by_body) == {
        "disk is slow",
        " iteration        1/      10 | lm loss: 1.0 |",
        "after the spans",
    }
    ids = lambda span: (  # noqa: E731
        format(span.get_span_context().trace_id, "032x"),
        format(span.get_span_context().span_id, "016x"),
    )
    slow = by_body["disk is slow"]
    assert (slow["traceId"], slow["spanId"]) == ids(outer)
    assert (slow["severityText"], slow["severityNumber"], slow["_scope"]) == (
        "WARN",
        13,
        "some.library",
    )
    line = by_body[" iteration        1/      10 | lm loss: 1.0 |"]
    assert (line["traceId"], line["spanId"]) == ids(inner)
    assert line["_scope"] == CONSOLE_LOGGER_NAME and line["severityText"] == "INFO"
    after = by_body["after the spans"]
    assert "traceId" not in after and "spanId" not in after
    assert after["_resource"]["nemo.run.id"] == "logs"


def test_logs_off_adds_no_handler_and_no_file(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(bridge_config(tmp_path, logs_enabled=False))
    assert bridged_handlers() == [] and handle.logs_file is None
    assert not logging.getLogger(CONSOLE_LOGGER_NAME).isEnabledFor(logging.INFO)
    logging.getLogger("some.library").warning("goes nowhere new")
    handle.shutdown()
    assert sorted(p.name for p in (tmp_path / "telemetry").iterdir()) == [
        "metrics.jsonl",
        "traces.jsonl",
    ]


def test_telemetry_off_touches_no_logger(tmp_path: Path) -> None:
    root_handlers = list(logging.getLogger().handlers)
    handle = setup_telemetry(bridge_config(tmp_path, enabled=False))
    assert not handle.is_exporting
    assert logging.getLogger().handlers == root_handlers
    assert list(tmp_path.iterdir()) == []


def test_logs_only(make_handle: Make, tmp_path: Path) -> None:
    handle = make_handle(bridge_config(tmp_path, traces_enabled=False, metrics_enabled=False))
    assert handle.is_exporting
    logging.getLogger("some.library").warning("only logs")
    handle.shutdown()
    assert [p.name for p in (tmp_path / "telemetry").iterdir()] == ["logs.jsonl"]
    (record,) = log_records(tmp_path / "telemetry" / "logs.jsonl")
    assert record["body"] == {"stringValue": "only logs"}


class FakeOTLPLogExporter(Collect):
    made: ClassVar[list[FakeOTLPLogExporter]] = []

    def __init__(self) -> None:
        super().__init__()
        FakeOTLPLogExporter.made.append(self)


@pytest.mark.parametrize(
    ("protocol", "module"),
    [
        ("grpc", "opentelemetry.exporter.otlp.proto.grpc._log_exporter"),
        ("http/protobuf", "opentelemetry.exporter.otlp.proto.http._log_exporter"),
    ],
)
def test_otlp_exporter_sends_log_records_over_otlp(
    make_handle: Make, monkeypatch: pytest.MonkeyPatch, protocol: str, module: str
) -> None:
    import importlib

    monkeypatch.setattr(importlib.import_module(module), "OTLPLogExporter", FakeOTLPLogExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", protocol)
    FakeOTLPLogExporter.made.clear()
    config = TelemetryConfig(
        enabled=True,
        exporter="otlp",
        logs_enabled=True,
        traces_enabled=False,
        metrics_enabled=False,
    )
    handle = make_handle(config)
    logging.getLogger("some.library").warning("to the collector")
    handle.shutdown()
    (exporter,) = FakeOTLPLogExporter.made
    assert [r.log_record.body for r in exporter.records] == ["to the collector"]
