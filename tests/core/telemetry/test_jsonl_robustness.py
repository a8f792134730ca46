"""The jsonl sink under a full disk, log rotation and ranks racing to create its directory."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from megatron.core.telemetry import TelemetryConfig, managed_span
from megatron.core.telemetry.jsonl import JsonlFile, JsonlSpanExporter
from megatron.trace.otlp.reader import read_spans

DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs Linux's /dev/full")


def _full_disk(tmp_path: Path) -> Path:
    """A trace path whose writes fail with ENOSPC: a symlink to /dev/full."""
    path = tmp_path / "telemetry" / "traces.jsonl"
    path.parent.mkdir()
    path.symlink_to(DEV_FULL)
    return path


def read_lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _names(path: Path) -> list[str]:
    return [span["name"] for span in read_spans(path)]


def _export_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "megatron.core.telemetry.jsonl"]


# -- a write the disk cut short leaves no torn line ---------------------------


@pytest.mark.parametrize("predecessor_torn", [False, True])
def test_a_write_a_full_disk_cut_short_is_cut_off_again(tmp_path, monkeypatch, predecessor_torn):
    """Half a line from ENOSPC would read as a killed process's torn write: it is removed."""
    import megatron.core.telemetry.jsonl as jsonl

    path = tmp_path / "traces.jsonl"
    if predecessor_torn:
        path.write_bytes(b'{"whole": 1}\n{"torn by a ki')
    sink = JsonlFile.open(path)
    assert sink.write_lines([{"first": 1}])
    before = path.read_bytes()
    real_write, calls = os.write, []

    def disk_fills_up(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # the disk had room for half
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonl.os, "write", disk_fills_up)
    with pytest.raises(OSError):
        sink.write_lines([{"second": "x" * 200}])
    monkeypatch.setattr(jsonl.os, "write", real_write)
    assert path.read_bytes() == before  # nothing of the failed line is left
    assert sink.torn_lines_sealed == int(predecessor_torn)  # counted once, not per retry
    assert sink.write_lines([{"third": 3}])  # space again
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines[-2:]] == [{"first": 1}, {"third": 3}]


# -- failed exports are logged once, counted, and reported -------------------


@needs_dev_full
def test_failed_exports_log_the_first_cause_once_and_count_the_rest(tmp_path, caplog):
    exporter = JsonlSpanExporter(JsonlFile.open(_full_disk(tmp_path)))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with caplog.at_level(logging.WARNING):
        for name in ("a", "b", "c", "d"):
            tracer.start_span(name).end()
    records = _export_warnings(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "No space left on device" in records[0].getMessage()
    assert records[0].exc_info is None  # a cause, not a traceback per export
    assert (exporter.failures.exports, exporter.failures.items) == (4, 4)
    provider.shutdown()


@needs_dev_full
def test_handle_reports_failed_exports_and_lost_spans_at_shutdown(tmp_path, make_handle, caplog):
    config = TelemetryConfig(
        enabled=True, exporter="jsonl", trace_file=_full_disk(tmp_path), span_groups_spec="all"
    )
    handle = make_handle(config)
    for name in ("one", "two", "three"):
        with managed_span("job", name), managed_span("step", f"{name}.child"):
            pass
    with caplog.at_level(logging.WARNING):
        handle.shutdown(timeout_ms=2000)
    failures = handle.export_failures["span"]
    assert failures.exports >= 1 and failures.items == 6
    assert failures.first_cause == "No space left on device"
    reports = [r.getMessage() for r in caplog.records if "spans lost" in r.getMessage()]
    assert len(reports) == 1 and "6 spans lost" in reports[0], reports


@needs_dev_full
def test_failed_log_exports_are_counted_and_reported_like_spans(tmp_path, make_handle, caplog):
    """The log bridge's file on a full disk: one warning with the cause, then counts."""
    logs = tmp_path / "telemetry" / "logs.jsonl"
    logs.parent.mkdir()
    logs.symlink_to(DEV_FULL)
    config = TelemetryConfig(
        enabled=True,
        exporter="jsonl",
        trace_file=tmp_path / "telemetry" / "traces.jsonl",
        logs_enabled=True,
    )
    handle = make_handle(config)
    library = logging.getLogger("some.library")
    with caplog.at_level(logging.WARNING):
        for index in range(3):
            library.warning("record %d", index)
            handle.force_flush(timeout_ms=2000)
        handle.shutdown(timeout_ms=2000)
    failures = handle.export_failures["log record"]
    assert failures.exports >= 1 and failures.items >= 3
    assert failures.first_cause == "No space left on device"
    first = [r for r in _export_warnings(caplog) if "Could not write log records" in r.getMessage()]
    assert len(first) == 1 and first[0].exc_info is None
    (report,) = [line for line in handle.failure_reports() if "log record" in line]
    assert f"{failures.items} log records lost" in report


def test_a_handle_without_failures_reports_none(tmp_path, make_handle):
    config = TelemetryConfig(
        enabled=True, exporter="jsonl", trace_file=tmp_path / "t.jsonl", span_groups_spec="all"
    )
    handle = make_handle(config)
    with managed_span("job", "fine"):
        pass
    handle.shutdown(timeout_ms=2000)
    assert set(handle.export_failures) == {"span", "metric"}
    assert all(f.exports == 0 for f in handle.export_failures.values())
    assert handle.failure_reports() == []


# -- a trace file deleted or moved during a run is reopened -------------------


@pytest.mark.parametrize("how", ["moved", "deleted", "directory-deleted"])
def test_a_rotated_trace_file_is_reopened_at_its_path(tmp_path, how):
    path = tmp_path / "telemetry" / "traces.jsonl"
    file = JsonlFile.open(path)
    file.write_lines([{"n": 1}])
    if how == "moved":
        path.rename(tmp_path / "traces.jsonl.1")
    elif how == "deleted":
        path.unlink()
    else:
        path.unlink()
        path.parent.rmdir()
    file.write_lines([{"n": 2}])
    file.write_lines([{"n": 3}])
    file.close()
    assert read_lines(path) == [{"n": 2}, {"n": 3}]
    if how == "moved":
        assert read_lines(tmp_path / "traces.jsonl.1") == [{"n": 1}]


def test_spans_after_rotation_reach_the_new_file(tmp_path, make_handle):
    path = tmp_path / "traces.jsonl"
    config = TelemetryConfig(
        enabled=True, exporter="jsonl", trace_file=path, span_groups_spec="all"
    )
    handle = make_handle(config)
    with managed_span("job", "before"):
        pass
    handle.force_flush()
    path.rename(tmp_path / "traces.jsonl.1")
    with managed_span("job", "after"):
        pass
    handle.shutdown(timeout_ms=2000)
    assert _names(path) == ["after"]
    assert _names(tmp_path / "traces.jsonl.1") == ["before"]


# -- ranks creating the same directory at once -------------------------------


def test_a_directory_made_by_another_process_meanwhile_is_tolerated(tmp_path, monkeypatch):
    target = tmp_path / "ckpt" / "telemetry"
    real_mkdir = Path.mkdir

    def mkdir_after_another_rank(self, *args, **kwargs):
        if self == target and not self.exists():
            real_mkdir(self)  # another rank wins the race between check and mkdir
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_after_another_rank)
    file = JsonlFile.open(target / "traces.jsonl")
    file.write_lines([{"ok": True}])
    file.discard()  # undo only what this process created
    assert target.is_dir()
    assert (target / "traces.jsonl").exists()  # written to, so kept


def test_many_threads_opening_one_new_path_all_succeed(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "traces.jsonl"
    start = threading.Barrier(16)
    errors: list[BaseException] = []
    files: list[JsonlFile] = []

    def opener() -> None:
        start.wait()
        try:
            files.append(JsonlFile.open(path))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for index, file in enumerate(files):
        file.write_lines([{"writer": index}])
        file.close()
    assert sorted(line["writer"] for line in read_lines(path)) == list(range(16))


def test_a_file_in_the_way_is_still_an_error(tmp_path):
    (tmp_path / "telemetry").write_text("a file")
    with pytest.raises(OSError):
        JsonlFile.open(tmp_path / "telemetry" / "traces.jsonl")
    assert os.path.isfile(tmp_path / "telemetry")


# -- ranks appending to one file at once ----------------------------------------

_RANK_WRITER = """
import sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from megatron.core.telemetry.jsonl import JsonlFile, JsonlSpanExporter

path, rank, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(JsonlFile.open(path))))
tracer = provider.get_tracer("race")
for i in range(count):
    # a line of several pages: the kernel grows the file page by page while writing it
    with tracer.start_as_current_span(f"rank{rank}.span{i}") as span:
        span.set_attribute("pad", "x" * 150_000)
provider.shutdown()
"""


def test_ranks_appending_to_one_file_at_once_leave_no_blank_or_torn_line(tmp_path):
    """Four processes export large spans into one file: every line parses, none is blank,
    every span is there once, and no torn line was sealed (nothing was killed)."""
    import subprocess
    import sys

    path = tmp_path / "traces.jsonl"
    ranks, count = 4, 60
    procs = [
        subprocess.Popen([sys.executable, "-c", _RANK_WRITER, str(path), str(rank), str(count)])
        for rank in range(ranks)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * ranks
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data[:-1].split(b"\n")
    assert [n for n, line in enumerate(lines) if not line] == []  # no blank line
    for line in lines:
        json.loads(line)  # no torn line
    names = sorted(_names(path))
    assert names == sorted(f"rank{r}.span{i}" for r in range(ranks) for i in range(count))


def test_a_filesystem_without_flock_warns_once_and_still_writes(tmp_path, monkeypatch, caplog):
    """Lustre without ``-o flock`` refuses the lock: one warning naming the file and what to
    do, and the export still reaches the file."""
    import errno

    import megatron.core.telemetry.jsonl as jsonl

    def no_locks(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(jsonl.fcntl, "flock", no_locks)
    path = tmp_path / "traces.jsonl"
    sink = JsonlFile.open(path)
    with caplog.at_level(logging.WARNING):
        assert sink.write_lines([{"a": 1}])
        assert sink.write_lines([{"b": 2}])
    warnings = _export_warnings(caplog)
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage()
    assert "per-rank files" in warnings[0].getMessage()
    assert read_lines(path) == [{"a": 1}, {"b": 2}]
