"""``report --json`` is what ``report.schema.json`` says, and the schema what the types say.

Every report the tests account (:func:`report_checks.assert_accounted`) is
validated against the schema too; here, the command's own output on the
shapes that fill the optional parts (several ranks, stragglers, a hang, a
recovered stall, a running job), and the schema against the typed report
field by field, so neither can drift from the other.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import jsonschema
import pytest
import tracegen as g
from report_checks import assert_schema, typed_and_schema_keys

from megatron.trace.analysis import report as types
from megatron.trace.analysis.report import schema
from megatron.trace.cli.main import main
from megatron.trace_format.semconv import BADPUT_CATEGORIES

NS = 1_000_000_000


def _json_report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_the_schema_is_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())


def test_a_killed_and_resumed_run(tmp_path: Path, capsys) -> None:
    killed, resumed = g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    report = _json_report(capsys, str(g.write(tmp_path / "t.jsonl", killed, resumed)))
    assert_schema(report)
    assert [inc["ended"] for inc in report["incarnations"]] == ["killed", "shutdown"]


def test_several_ranks_with_a_straggler(tmp_path: Path, capsys) -> None:
    steady = g.lifecycle(0, intervals=4, per=3)
    zero = g.write(tmp_path / "r0.jsonl", g.with_waits(steady, 0.5), rank=0)
    one = g.write(tmp_path / "r1.jsonl", g.with_waits(steady, 0.0), rank=1)
    report = _json_report(capsys, str(zero), str(one))
    assert_schema(report)
    assert [entry["rank"] for entry in report["ranks"]] == [0, 1]
    assert report["stragglers"] is not None


def test_a_file_named_twice_or_through_a_link_is_read_once(tmp_path: Path, capsys) -> None:
    """A shell glob that matches a run's folder and a symlink to it (pytest's
    ``*-current``, a ``latest`` link) names one file twice: its spans count once."""
    killed, resumed = g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    (tmp_path / "run").mkdir()
    path = g.write(tmp_path / "run" / "t.jsonl", killed, resumed)
    (tmp_path / "latest").symlink_to(tmp_path / "run")
    once = _json_report(capsys, str(path), "--now", "1e9")
    for twice in ([path, path], [path, tmp_path / "latest" / "t.jsonl"]):
        assert _json_report(capsys, *map(str, twice), "--now", "1e9") == once


def test_a_copy_of_a_file_read_with_it_is_one_clear_error(tmp_path: Path, capsys) -> None:
    """A job's own file and a receiver's copy of it hold the same spans: read together,
    each would count twice (a wall clock of decades, once); ``report`` names the two
    places of a span read twice and exits 2, and ``check`` lists every such span."""
    killed, resumed = g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    path = g.write(tmp_path / "t.jsonl", killed, resumed)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    assert main(["report", str(path), str(copy)]) == 2
    error = capsys.readouterr().err
    assert f"{copy}:1: span megatron.startup " in error
    assert f"was read already, at {path}:1: the files hold the same spans twice" in error
    assert main(["check", str(path), str(copy)]) == 1
    assert "duplicate-span-id" in capsys.readouterr().out
    out = tmp_path / "out.json"  # export reads the model too, and writes nothing
    assert main(["export", str(path), str(copy), "-o", str(out)]) == 2
    assert "the files hold the same spans twice" in capsys.readouterr().err
    assert not out.exists()


def test_a_running_job_carries_its_age_and_the_liveness_rule(tmp_path: Path, capsys) -> None:
    spans = g.lifecycle(0, kill_after=1)
    newest = max(int(span["endTimeUnixNano"]) for span in spans)
    path = g.write(tmp_path / "t.jsonl", spans)
    report = _json_report(capsys, str(path), "--now", str(newest / NS + 1))
    assert_schema(report)
    assert report["running"] is True and "as_of_age_s" in report and "liveness" in report


def test_a_windowed_report(tmp_path: Path, capsys) -> None:
    killed, resumed = g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)
    path = g.write(tmp_path / "t.jsonl", killed, resumed)
    report = _json_report(capsys, str(path), "--window", "2s")
    assert_schema(report)
    assert len(report["windows"]["entries"]) == 15  # 29.5 s
    report["windows"]["entries"][0]["top_badput"] = ["surprise"]
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        jsonschema.validate(report, schema())


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda r: r["badput_s"].pop("hang"), "badput_s"),
        (lambda r: r.update(surprise=1), "surprise"),
        (lambda r: r["incarnations"][0].update(ended="exploded"), "exploded"),
        (lambda r: r["accounting_ns"].update(wall=1.5), "1.5"),
    ],
)
def test_the_schema_rejects_what_report_never_writes(tmp_path: Path, capsys, mutate, where) -> None:
    report = _json_report(capsys, str(g.write(tmp_path / "t.jsonl", g.lifecycle(0))))
    mutate(report)
    with pytest.raises(jsonschema.ValidationError, match=where):
        jsonschema.validate(report, schema())


@pytest.mark.parametrize(
    ("typed", "path"),
    [
        (types.Report, ()),
        (types.IncarnationEntry, ("$defs", "incarnation")),
        (types.IterationStats, ("$defs", "iterations")),
        (types.Anomalies, ("$defs", "iterations", "properties", "anomalous")),
        (types.SlowIteration, ("$defs", "slow_iteration")),
        (types.RankEntry, ("$defs", "rank_entry")),
        (types.HangEntry, ("$defs", "hang")),
        (types.RecoveredStall, ("$defs", "recovered_stall")),
        (types.LivenessEntry, ("$defs", "liveness")),
        (types.Windows, ("properties", "windows")),
        (types.CheckpointAdvice, ("$defs", "checkpoint_advice")),
        (types.IntervalChoice, ("$defs", "interval_choice")),
        (types.WindowEntry, ("$defs", "window")),
    ],
)
def test_the_schema_names_the_typed_fields(typed: type, path: tuple[str, ...]) -> None:
    node = schema()
    for key in path:
        node = node[key]
    typed_keys, schema_keys = typed_and_schema_keys(typed, node)
    assert schema_keys == typed_keys


def test_the_categories_are_the_vocabulary_s() -> None:
    badput = schema()["properties"]["badput_s"]
    assert badput["required"] == sorted(BADPUT_CATEGORIES)
    ended = set(schema()["$defs"]["ended"]["enum"])
    assert ended == set(typing.get_args(types.Ended))
