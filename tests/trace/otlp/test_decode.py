"""The fast decode path (msgspec) and the pure-Python fallback read every line alike.

``megatron-trace`` decodes lines with msgspec when it is installed and with
the standard library when it is not (or when msgspec rejects a line); the
two must never disagree, or a result would depend on what is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import synthetic
import tracegen
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from megatron.trace.otlp import decode as otlp_decode
from megatron.trace.otlp.reader import ReadStats, TraceFileDamaged, iter_spans

REPO = Path(__file__).resolve().parents[3]


def _read(path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every flat span and the read stats, or the damage raised, with one path forced."""
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(otlp_decode, "_decode_request", None)
        stats = ReadStats()
        try:
            spans = list(iter_spans(path, stats))
        except TraceFileDamaged as error:
            return ("damaged", error.line, error.reason)
        return spans, [(t.path, t.line) for t in stats.torn], stats.lines


def _exotic_span(**extra: Any) -> dict[str, Any]:
    return {
        "traceId": "ab" * 16,
        "spanId": "01" * 8,
        "parentSpanId": "02" * 8,
        "name": "megatron.train.iteration",
        "kind": 2,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": 2000,  # a JSON number is allowed too
        "attributes": [
            {"key": "megatron.iteration", "value": {"intValue": "7"}},
            {"key": "ratio", "value": {"doubleValue": 0.5}},
            {"key": "inf", "value": {"doubleValue": "Infinity"}},
            {"key": "flag", "value": {"boolValue": True}},
            {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "é"}, {}]}}},
            {
                "key": "nested",
                "value": {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": 1}}]}},
            },
            {"key": "blob", "value": {"bytesValue": "AAE="}},
            {"key": "empty", "value": {}},
            {"key": "none"},
            {"key": "megatron.iteration", "value": {"intValue": "8"}},  # duplicate: last wins
        ],
        "events": [
            {
                "name": "exception",
                "timeUnixNano": "1500",
                "attributes": [{"key": "exception.type", "value": {"stringValue": "E"}}],
            },
            {},
        ],
        "links": [
            {
                "traceId": "cd" * 16,
                "spanId": "03" * 8,
                "attributes": [{"key": "why", "value": {"stringValue": "resume"}}],
            }
        ],
        "status": {"code": "STATUS_CODE_ERROR", "message": "boom"},
        **extra,
    }


def _line(spans: list[dict[str, Any]], scopes: int = 1) -> str:
    resource = {"attributes": [{"key": "dl.rank", "value": {"intValue": "3"}}]}
    per = max(1, len(spans) // scopes)
    scope_spans = [
        {"scope": {"name": "m"}, "spans": spans[i : i + per]} for i in range(0, len(spans), per)
    ]
    return json.dumps(
        {
            "resourceSpans": [
                {"resource": resource, "scopeSpans": scope_spans},
                {"scopeSpans": [{"spans": spans[:1]}]},
            ]
        }
    )


def test_both_paths_read_a_synthetic_trace_alike(tmp_path: Path, monkeypatch) -> None:
    shape = synthetic.Shape(spans=3000, ranks=2, save_interval=10, incarnations=2)
    (path,) = synthetic.write_per_step(tmp_path / "t.jsonl", shape)
    fast = _read(path, True, monkeypatch)
    assert len(fast[0]) >= 3000
    assert fast == _read(path, False, monkeypatch)


def test_both_paths_read_every_otlp_field_alike(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "t.jsonl"
    spans = [_exotic_span(), _exotic_span(spanId="04" * 8, parentSpanId="", status={})]
    path.write_text(_line(spans, scopes=2) + "\n")
    fast = _read(path, True, monkeypatch)
    assert fast == _read(path, False, monkeypatch)
    first = fast[0][0]
    assert first["attributes"]["megatron.iteration"] == 8
    assert first["attributes"]["tags"] == ["é", None]
    assert first["attributes"]["nested"] == {"a": 1}
    assert first["attributes"]["empty"] is None and first["attributes"]["none"] is None
    assert first["end_ns"] == 2000 and first["kind"] == 2 and first["status_code"] == "ERROR"
    assert first["events"][0] == {
        "name": "exception",
        "time_ns": 1500,
        "attributes": {"exception.type": "E"},
    }
    assert first["link_attributes"] == [{"why": "resume"}]
    assert [s["resource"] for s in fast[0]] == [{"dl.rank": 3}] * 2 + [
        {}
    ]  # two scopes, then a bare entry


def test_a_line_msgspec_rejects_is_read_by_the_fallback(tmp_path: Path, monkeypatch) -> None:
    # null where the schema wants a string, an integer spelled " 7": not msgspec's types
    odd = _exotic_span(parentSpanId=None, startTimeUnixNano=" 7")
    path = tmp_path / "t.jsonl"
    path.write_text(_line([odd]) + "\n")
    assert otlp_decode.decode_fast(path.read_bytes()) is None
    spans = _read(path, True, monkeypatch)[0]
    assert (spans[0]["parent_id"], spans[0]["start_ns"]) == (None, 7)


_INTEGERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=2**64).map(str),
    st.sampled_from(
        [
            "1e3",
            "1.0",
            "-0.0",
            "1.5",
            "10e-1",
            "0.5e1",
            "1.5e2",
            " 7",
            "+3",
            "007",
            "1_0",
            "",
            "abc",
            "1e400",
            "NaN",
            "Infinity",
            "0x10",
            "1.",
            ".5",
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.booleans(),
)


@given(st.data())
@settings(max_examples=examples(150))
def test_both_paths_agree_on_any_field_value(tmp_path_factory, data) -> None:
    fields = {
        "startTimeUnixNano": data.draw(_INTEGERS),
        "endTimeUnixNano": data.draw(_INTEGERS),
        "attributes": [{"key": "k", "value": {"intValue": data.draw(_INTEGERS)}}],
    }
    if data.draw(st.booleans()):
        fields["parentSpanId"] = data.draw(st.sampled_from(["", None, "ab" * 8, 5]))
    if data.draw(st.booleans()):
        fields["status"] = data.draw(st.sampled_from([None, {}, {"code": 2}, {"code": "X"}, 0]))
    path = tmp_path_factory.mktemp("any") / "t.jsonl"
    path.write_text(_line([_exotic_span(**fields)]) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        fast = _read(path, True, patch)
        slow = _read(path, False, patch)
    assert fast == slow


@pytest.mark.parametrize(
    "text",
    ["1", "-12", "1e3", "1E3", "1.0", "-0.0", "10e-1", "0.5e1", "1.5e2", "12345678901234567890123"],
)
def test_otlp_int_takes_what_msgspec_takes(text: str) -> None:
    class Holder(msgspec.Struct):
        value: int

    decoded = msgspec.json.Decoder(Holder, strict=False).decode(f'{{"value":"{text}"}}'.encode())
    assert otlp_decode.otlp_int(text) == decoded.value


@pytest.mark.parametrize("text", ["1.5", "abc", "", "NaN", "Infinity", "0x10"])
def test_otlp_int_rejects_what_is_no_integer(text: str) -> None:
    with pytest.raises(ValueError, match="not an integer"):
        otlp_decode.otlp_int(text)


def test_without_msgspec_the_fallback_gives_the_same_report(tmp_path: Path) -> None:
    first = tracegen.lifecycle(0, kill_after=1)
    path = tracegen.write(tmp_path / "t.jsonl", first, tracegen.lifecycle(20, first=6, load=6))
    code = (
        "import sys, json\n"
        "if sys.argv[1] == 'without': sys.modules['msgspec'] = None  # as if not installed\n"
        "from megatron.trace.otlp import decode as otlp_decode\n"
        "from megatron.trace.analysis.goodput import report_files\n"
        "from megatron.trace.analysis.liveness import Clock\n"
        "from megatron.trace.render.json.report import report_json\n"
        "clock = Clock(now_ns=2_000_000_000 * 10**9)  # one now for both processes\n"
        "report = report_json(report_files([sys.argv[2]], clock))\n"
        "print(otlp_decode.FAST, json.dumps(report, sort_keys=True))\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    outputs = {
        mode: subprocess.run(
            [sys.executable, "-c", code, mode, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.split(" ", 1)
        for mode in ("with", "without")
    }
    assert outputs["with"][0] == "True" and outputs["without"][0] == "False"
    assert outputs["with"][1] == outputs["without"][1]
    assert json.loads(outputs["with"][1])["incarnations"][0]["ended"] == "killed"
