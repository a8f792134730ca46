"""``StartFootprint``: a failed start removes exactly what it created, and nothing else."""

from __future__ import annotations

from pathlib import Path

from megatron.core.telemetry import TelemetryConfig
from megatron.training.telemetry.start_footprint import StartFootprint, telemetry_files


def test_undo_removes_exactly_the_paths_that_did_not_exist(tmp_path: Path) -> None:
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "old.jsonl").write_text("kept\n")
    save = tmp_path / "fresh" / "ckpt"
    trace = tmp_path / "existing" / "traces.jsonl"
    appended = tmp_path / "existing" / "old.jsonl"
    footprint = StartFootprint.before([save, save / "telemetry" / "m.jsonl", trace, appended, None])

    (save / "telemetry").mkdir(parents=True)
    (save / "telemetry" / "m.jsonl").write_text("{}\n")
    trace.write_text("{}\n")
    appended.write_text("kept\nand appended to\n")

    removed = footprint.undo()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == [
        "existing/traces.jsonl",
        "fresh",
        "fresh/ckpt",
        "fresh/ckpt/telemetry",
        "fresh/ckpt/telemetry/m.jsonl",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]
    assert appended.read_text() == "kept\nand appended to\n"  # it existed: not ours


def test_a_directory_someone_else_wrote_into_stays(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    footprint = StartFootprint.before([save])
    save.mkdir()
    (save / "not-ours.txt").write_text("x")
    assert footprint.undo() == []
    assert (save / "not-ours.txt").exists()


def test_undo_of_paths_never_created_does_nothing(tmp_path: Path) -> None:
    footprint = StartFootprint.before([tmp_path / "a" / "b", tmp_path / "c.jsonl"])
    assert footprint.undo() == []
    assert list(tmp_path.iterdir()) == []


def test_telemetry_files_are_those_the_jsonl_sinks_open(tmp_path: Path) -> None:
    trace = tmp_path / "t" / "traces.jsonl"
    on = TelemetryConfig(enabled=True, trace_file=trace, logs_enabled=True)
    assert telemetry_files(on) == [
        trace,
        trace.with_name("metrics.jsonl"),
        trace.with_name("logs.jsonl"),
    ]
    assert telemetry_files(TelemetryConfig(enabled=False, trace_file=trace)) == []
    assert telemetry_files(TelemetryConfig(enabled=True, exporter="console")) == []
    no_metrics = TelemetryConfig(enabled=True, trace_file=trace, metrics_enabled=False)
    assert telemetry_files(no_metrics) == [trace]
