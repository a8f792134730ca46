"""The shared streaming reader: flat spans, torn writes skipped, damage reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron.trace.otlp.reader import (
    ReadStats,
    TraceFileDamaged,
    iter_requests_backwards,
    iter_spans,
    offset_after_time,
    read_spans,
)


def _span(name: str, span_id: str, **extra: object) -> dict:
    return {
        "traceId": "ab" * 16,
        "spanId": span_id,
        "parentSpanId": "",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "2000",
        "attributes": [
            {"key": "megatron.iteration", "value": {"intValue": "7"}},
            {"key": "ratio", "value": {"doubleValue": 0.5}},
            {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "é"}]}}},
        ],
        "status": {"code": 0},
        **extra,
    }


def _line(*spans: dict, rank: int = 0) -> str:
    resource = {"attributes": [{"key": "dl.rank", "value": {"intValue": str(rank)}}]}
    request = {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "m"}, "spans": list(spans)}]}
        ]
    }
    return json.dumps(request, ensure_ascii=False)


def test_flat_span_keys_and_values(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_line(_span("a", "01" * 8)) + "\n\n" + _line(_span("b", "02" * 8)) + "\n")
    first, second = read_spans(path)
    assert first["name"] == "a" and second["name"] == "b"
    assert first["attributes"] == {"megatron.iteration": 7, "ratio": 0.5, "tags": ["é"]}
    assert (first["start_ns"], first["end_ns"], first["parent_id"]) == (1000, 2000, None)
    assert first["resource"] == {"dl.rank": 0}
    assert (first["file"], first["line"], second["line"]) == (path, 1, 3)


def test_several_files_in_order(tmp_path: Path) -> None:
    one, two = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl"
    one.write_text(_line(_span("a", "01" * 8)) + "\n")
    two.write_text(_line(_span("b", "02" * 8), rank=1) + "\n")
    spans = list(iter_spans([one, two]))
    assert [(s["name"], s["resource"]["dl.rank"], s["file"]) for s in spans] == [
        ("a", 0, one),
        ("b", 1, two),
    ]


def test_torn_write_in_the_middle_is_skipped_and_reported(tmp_path: Path) -> None:
    whole = _line(_span("a", "01" * 8))
    path = tmp_path / "t.jsonl"
    path.write_text(whole + "\n" + whole[: len(whole) // 2] + "\n" + _line(_span("b", "02" * 8)))
    stats = ReadStats()
    assert [s["name"] for s in iter_spans(path, stats)] == ["a", "b"]
    assert [(t.path, t.line) for t in stats.torn] == [(path, 2)]


@given(st.data())
def test_every_prefix_of_a_line_is_a_torn_write(tmp_path_factory, data) -> None:
    whole = _line(_span('a\\"é', "01" * 8, links=[{"traceId": "c" * 32, "spanId": "d" * 16}]))
    cut = data.draw(st.integers(min_value=1, max_value=len(whole) - 1))
    path = tmp_path_factory.mktemp("torn") / "t.jsonl"
    path.write_bytes(whole.encode()[:cut] + b"\n" + whole.encode() + b"\n")
    stats = ReadStats()
    assert len(read_spans(path, stats)) == 1
    assert [t.line for t in stats.torn] == [1]


@pytest.mark.parametrize(
    "bad",
    [
        '{"resourceSpans": [}',  # garbage inside the line
        "not json at all",
        '{"resourceSpans": []}}',  # trailing data
        "[1, 2]",  # JSON, but no request
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}',  # span without ids
    ],
)
def test_damage_raises_naming_file_and_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_line(_span("a", "01" * 8)) + "\n" + bad + "\n" + _line(_span("b", "02" * 8)))
    with pytest.raises(TraceFileDamaged) as caught:
        read_spans(path)
    assert caught.value.line == 2
    assert str(caught.value).startswith(f"{path}: line 2 ")
    assert isinstance(caught.value, ValueError)


def test_backwards_reader_yields_newest_first_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"n": n, "pad": "x" * (n % 7) * 10}) for n in range(200)]
    path.write_text("\n".join(lines[:120]) + "\n\n" + "\n".join(lines[120:]) + "\n")
    for block in (7, 64, 1 << 16):  # lines longer and shorter than a block
        found = [r["n"] for r in iter_requests_backwards(path, block_size=block)]
        assert found == list(range(199, -1, -1))


def test_backwards_reader_skips_a_torn_last_line_and_names_damage(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"n": 0}\n{"n": 1}\n{"n": 2, "cut')
    assert [r["n"] for r in iter_requests_backwards(path, block_size=5)] == [1, 0]
    path.write_text('{"n": 0}\ngarbage}\n{"n": 2}\n')
    found = iter_requests_backwards(path, block_size=4)
    assert next(found) == {"n": 2}
    with pytest.raises(TraceFileDamaged) as damaged:
        next(found)
    assert damaged.value.line == 2 and damaged.value.path == path


def test_backwards_reader_reads_a_compressed_file_too(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "metrics.jsonl"
    with gzip.open(path, "wt") as file:  # a rotated copy compressed under the live name
        file.write("".join(json.dumps({"n": n}) + "\n" for n in range(5)))
    assert [r["n"] for r in iter_requests_backwards(path)] == [4, 3, 2, 1, 0]


def _timed(n: int) -> str:
    point = {"timeUnixNano": str(1000 * n), "asInt": "1"}
    return json.dumps({"n": n, "pad": "x" * (n % 13) * 9, "gauge": {"dataPoints": [point]}})


@pytest.mark.parametrize("block", [16, 64, 1 << 16])
def test_a_time_is_found_by_bisection_and_read_back_from_there(tmp_path: Path, block) -> None:
    """``offset_after_time``: past the offset every line is newer than the time asked for,
    and reading back from it starts at most a block's lines after the newest older one."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_timed(n) + "\n" for n in range(500)))
    for n in (0, 1, 137, 250, 498, 499, 600):
        offset = offset_after_time(path, 1000 * n, block_size=block)
        assert offset is not None
        found = [r["n"] for r in iter_requests_backwards(path, end=offset)]
        assert found == list(range(found[0], -1, -1))  # whole lines, newest first, to the start
        assert min(n, 499) <= found[0] <= min(n, 499) + block // 10 + 1, (n, found[0])
    gz = tmp_path / "rotated.jsonl"
    import gzip

    with gzip.open(gz, "wt") as file:
        file.write(_timed(1) + "\n")
    assert offset_after_time(gz, 1000) is None  # compressed: read it whole


@pytest.mark.parametrize(
    ("line", "signal", "usual"),
    [
        ('{"resourceMetrics": [{"resource": {}, "scopeMetrics": []}]}', "metrics", "metrics.jsonl"),
        ('{"resourceLogs": [{"resource": {}, "scopeLogs": []}]}', "logs", "logs.jsonl"),
    ],
)
@pytest.mark.parametrize("command", ["report", "check"])
def test_a_metrics_or_logs_file_given_as_a_trace_says_what_it_is(
    tmp_path: Path, line: str, signal: str, usual: str, command: str
) -> None:
    path = tmp_path / usual
    path.write_text(line + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "megatron.trace", command, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"megatron-trace {command}: error: {path}: line 1 is an OTLP {signal} export, not "
        f"spans: this is a {signal} file (as {usual} is); give the trace files "
        f"(traces.jsonl), beside which {usual} is read by itself\n"
    )
