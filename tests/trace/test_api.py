"""The public API (``megatron.trace``) and its one error type, as a library user meets them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tracegen as g
from processes import subprocess_env

import megatron.trace as api
from megatron.trace.cli.main import COMMANDS, main
from megatron.trace_format.errors import NoSpansError, TraceError


def test_every_public_name_resolves_to_its_home() -> None:
    for name in api.__all__:
        value = getattr(api, name)
        assert value.__name__ == name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = api.no_such_name


def test_importing_the_vocabulary_loads_neither_the_reader_nor_a_trainer() -> None:
    # a writer imports megatron.trace_format.semconv on its way to writing a trace: that must
    # cost it nothing more (no numpy, no model), and nothing of megatron.core/training
    code = (
        "import sys, megatron.trace_format.semconv, megatron.trace_format.records\n"
        "print(sorted(m for m in sys.modules if m.startswith(('numpy', 'megatron'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    loaded = set(eval(out.stdout))
    assert {"megatron.trace_format.semconv", "megatron.trace_format.records"} <= loaded
    assert loaded <= {
        "megatron",
        "megatron.trace_format",
        "megatron.trace_format.errors",
        "megatron.trace_format.records",
        "megatron.trace_format.semconv",
    }


@pytest.mark.needs_extras  # the timeline draws with plotly
def test_the_api_end_to_end(tmp_path: Path) -> None:
    killed, resumed = g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    path = g.write(tmp_path / "t.jsonl", killed, resumed)
    trace = api.load_trace([path])
    assert [inc.ended for inc in trace.incarnations] == ["killed", "shutdown"]
    report = api.build_report(trace)
    assert report["wasted_iterations"] == 1
    assert api.report_files([path])["wall_s"] == report["wall_s"]
    assert api.check_files([path]).violations == []
    result = api.export_files([path], tmp_path / "t.json")
    assert result.events > 0 and (tmp_path / "t.json").stat().st_size == result.size
    api.write_timeline([path], tmp_path / "t.html")
    assert b"incarnation 1" in (tmp_path / "t.html").read_bytes()


def test_no_spans_is_one_error_type_with_its_exit_code(tmp_path: Path) -> None:
    empty = tmp_path / "t.jsonl"
    empty.write_text("\n")
    with pytest.raises(NoSpansError, match=f"no spans in {empty}") as raised:
        api.export_files([empty], tmp_path / "t.json")
    assert isinstance(raised.value, TraceError) and raised.value.exit_code == 2
    with pytest.raises(NoSpansError):
        api.build_report(api.load_trace([empty]))
    assert not (tmp_path / "t.html").exists() and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize(
    "command",
    # (not watch: it follows files a job has yet to write, so an empty one is waited on)
    [
        pytest.param(c, marks=pytest.mark.needs_extras) if c == "timeline" else c
        for c in COMMANDS
        if c != "watch"
    ],
)
def test_every_command_says_no_spans_in_the_same_one_line(tmp_path, capsys, command) -> None:
    empty = tmp_path / "t.jsonl"
    empty.write_text("\n")
    extra = ["-o", str(tmp_path / "out")] if command in ("export", "timeline") else []
    runs = [str(empty)] * (2 if command == "diff" else 1)  # diff: run A and run B
    assert main([command, *runs, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"megatron-trace {command}: error: no spans in {empty}\n"
    assert captured.out == "" and not (tmp_path / "out").exists()
