"""A job that is still running reads ``running``; one SIGKILLed reads ``killed`` after the bound.

Hand-built files (``tracegen``: one iteration is one second from t = 0) with
heartbeats in ``metrics.jsonl`` beside them, judged against an injected
"now", so no test waits for the staleness bound.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tracegen as g
import upstream_traces as up
from report_checks import assert_accounted, nonzero

from megatron.core.telemetry.heartbeat import STALE_AFTER_S
from megatron.trace.analysis.check import check_files
from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.liveness import Clock
from megatron.trace.cli.main import main
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.export import write as export
from megatron.trace.render.json.report import report_json
from megatron.trace.render.timeline import write as timeline


def at(seconds: float) -> Clock:
    return Clock(now_ns=round(seconds * g.SECOND))


def killed_looking(tmp_path: Path, *, iterations: bool = True) -> Path:
    """Three finished intervals, then one in flight: what a SIGKILL and a live job both leave.

    The last span ends at 10.25 s (the in-flight iteration's finished child).
    """
    return g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1, iterations=iterations))


def report_at(path: Path, seconds: float) -> dict:
    report = report_json(report_files([path], at(seconds)))
    assert_accounted(report)
    return report


@pytest.mark.parametrize("iterations", [True, False], ids=["per_step", "default"])
def test_a_live_job_is_running_and_wastes_nothing(tmp_path: Path, iterations: bool) -> None:
    path = killed_looking(tmp_path, iterations=iterations)
    g.beat(path, 10, 20, 30)
    report = report_at(path, 35)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["as_of"]) == ("running", "1970-01-01T00:00:30.000Z")
    assert (report["running"], report["as_of"], report["as_of_age_s"]) == (
        True,
        "1970-01-01T00:00:30.000Z",
        5.0,
    )
    assert report["wasted_iterations"] == inc["wasted_iterations"] == 0
    assert report["badput_s"]["wasted_progress"] == inc["wasted_s"] == 0
    # the figures run to the newest record: the open interval since C2 ended (8.75 s) is goodput
    assert report["wall_s"] == 30.0
    assert inc["in_flight_s"] == 21.25
    assert report["goodput_s"] == 6.0 + 21.25
    assert nonzero(report) == {"startup": 2.0, "checkpoint_save": 0.75}
    assert report["liveness"]["heartbeat_files"] == [str(tmp_path / "metrics.jsonl")]
    assert report["liveness"]["stale_after_s"] == STALE_AFTER_S == 30.0
    assert "30 s old" in report["liveness"]["rule"]


@pytest.mark.parametrize("iterations", [True, False], ids=["per_step", "default"])
def test_after_the_bound_the_same_file_reads_killed(tmp_path: Path, iterations: bool) -> None:
    path = killed_looking(tmp_path, iterations=iterations)
    g.beat(path, 10, 20, 30)
    assert report_at(path, 60)["running"]  # exactly the bound: still running
    report = report_at(path, 60.001)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["as_of"], inc["in_flight_s"]) == ("killed", None, 0.0)
    assert (report["running"], report["as_of"]) == (False, None)
    # a SIGKILL: the work past the last save is wasted, up to its newest record of any
    # kind (its last heartbeat, at 30 s: it lived that long at least)
    assert report["badput_s"]["wasted_progress"] == 1.5 + 30 - 10.25
    assert report["wall_s"] == 30.0
    assert report["bounds"]["wall_s"]["lower"] == 30.0
    assert report["bounds"]["wall_s"]["upper"] is None
    assert "alive at its last metric export" in report["bounds"]["wall_s"]["reason"]
    assert report["wasted_iterations"] == (1 if iterations else 0)


def test_the_text_report_says_running_and_as_of_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = killed_looking(tmp_path, iterations=False)
    g.beat(path, 10, 20)
    assert main(["report", str(path), "--now", "25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "running: figures as of 1970-01-01T00:00:20.000Z (the newest record, 5.0 s before now)"
    )
    assert any(line.startswith("  0: running   ") for line in lines), lines
    assert (
        "     as of 1970-01-01T00:00:20.000Z; in flight 11.250 s since the last span"
        in "\n".join(lines)
    )
    assert any(line.startswith("liveness rule: running: ") for line in lines)
    assert main(["report", str(path), "--now", "25", "--stale-after", "4"]) == 0
    assert "  0: killed    " in capsys.readouterr().out


def test_a_heartbeat_of_zero_means_it_shut_down(tmp_path: Path) -> None:
    """Fresh, but the export telemetry makes at shutdown says 0: the spans decide."""
    path = killed_looking(tmp_path)
    g.beat(path, 10)
    g.beat(path, 11, running=False)
    assert report_at(path, 12)["incarnations"][0]["ended"] == "killed"


def test_a_clean_looking_file_with_a_live_heartbeat_is_running(tmp_path: Path) -> None:
    """In C0 before anything of it was written, a file looks like a job that shut down in
    startup; its heartbeat says it is alive. Without one, the spans' clean end stands."""
    spans = g.lifecycle(0, intervals=0)
    path = g.write(tmp_path / "traces.jsonl", spans)
    assert report_at(path, 3)["incarnations"][0]["ended"] == "shutdown"
    g.beat(path, 10)
    report = report_at(path, 12)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["in_flight_s"]) == ("running", 8.0)  # C0 since startup's end
    assert report["goodput_s"] == 8.0
    g.beat(path, 13, running=False)  # and then it did shut down
    assert report_at(path, 14)["incarnations"][0]["ended"] == "shutdown"


def test_without_a_heartbeat_only_fresh_spans_say_running(tmp_path: Path) -> None:
    path = killed_looking(tmp_path)  # no metrics.jsonl: metrics off, or another exporter
    report = report_at(path, 20)
    assert report["incarnations"][0]["ended"] == "running"
    assert report["as_of"] == "1970-01-01T00:00:10.250Z"  # its newest span
    (note,) = report["liveness"]["notes"]
    assert "no metric points" in note and "newest span alone" in note
    assert report_at(path, 40.26)["incarnations"][0]["ended"] == "killed"


def test_only_the_last_incarnation_of_a_rank_can_be_running(tmp_path: Path) -> None:
    path = g.write(
        tmp_path / "traces.jsonl",
        g.lifecycle(0, kill_after=1),
        g.lifecycle(20, first=6, load=6, kill_after=1, intervals=1),
    )
    g.beat(path, 10, pid=100)  # the first process, fresh enough, but a restart followed it
    g.beat(path, 30, pid=101)
    report = report_at(path, 32)
    assert [i["ended"] for i in report["incarnations"]] == ["killed", "running"]
    assert report["incarnations"][0]["wasted_iterations"] == 1  # re-done by the second
    assert report["incarnations"][1]["wasted_iterations"] == 0


def test_beats_of_an_earlier_pretrain_in_the_same_process_do_not_count(tmp_path: Path) -> None:
    """Two pretrain() calls in one process share its resource: the first one's last export
    (0, at its shutdown) is older than the second's startup, so it says nothing of the second."""
    first = g.lifecycle(0, intervals=1)
    second = g.lifecycle(40, intervals=1, kill_after=1)  # its newest span ends at 45.75 s
    path = g.write(tmp_path / "traces.jsonl", first + second)  # one process (pid 100)
    g.beat(path, 3)
    g.beat(path, 4.5, running=False)
    report = report_at(path, 50)
    assert [i["ended"] for i in report["incarnations"]] == ["shutdown", "running"]
    assert report["as_of"] == "1970-01-01T00:00:45.750Z"
    g.beat(path, 46, running=False)  # the second one's own shutdown export
    assert [i["ended"] for i in report_at(path, 50)["incarnations"]] == ["shutdown", "killed"]


def test_running_in_startup_counts_the_open_startup(tmp_path: Path) -> None:
    spans = [s for s in g.lifecycle(0, intervals=0) if s["name"] != "megatron.startup"]
    path = g.write(tmp_path / "traces.jsonl", spans)  # only the imports child: 0 .. 0.5 s
    g.beat(path, 5)
    report = report_at(path, 6)
    (inc,) = report["incarnations"]
    assert (inc["ended"], inc["in_flight_s"]) == ("running", 5.0)
    assert nonzero(report) == {"startup": 5.0}
    lines = check_files([path], at(6)).notes
    assert lines[0].startswith("running: rank 0 incarnation 0: still running as of ")
    assert "its startup is still open" in lines[0]


def test_the_heartbeat_is_read_from_the_end_of_a_long_metrics_file(tmp_path: Path) -> None:
    """A week of metrics before the line that matters is not read: damage there goes unseen."""
    path = killed_looking(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("not json at all\n" + g.heartbeat_line(10) + "\n")
    assert report_at(path, 12)["incarnations"][0]["ended"] == "running"


def test_check_says_running_then_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = killed_looking(tmp_path, iterations=False)
    g.beat(path, 10, 20)
    assert main(["check", str(path), "--now", "21"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "running: rank 0 incarnation 0: still running as of 1970-01-01T00:00:20.000Z (its "
        "newest record, 1.0 s before now; bound 30 s); its in-flight interval is still open, "
        "so not in the file yet; 1 finished spans wait for their parent"
    )
    assert lines[-1].startswith("ok: ") and lines[-1].endswith(" 0 violations")
    assert main(["check", str(path), "--now", "51"]) == 0
    assert capsys.readouterr().out.startswith("killed: rank 0 incarnation 0: its in-flight")


@pytest.mark.needs_extras  # the timeline draws with plotly
def test_timeline_and_export_say_running(tmp_path: Path) -> None:
    path = killed_looking(tmp_path, iterations=False)
    g.beat(path, 10, 20)
    tl = timeline.collect(span_source([path]), [str(path)], at(21))
    (lane,) = tl.lanes
    assert (lane.ended, lane.as_of_ns) == ("running", 20 * g.SECOND)
    (in_flight,) = [bar for bar in tl.bars if bar.category == "in_flight"]
    assert (in_flight.start_ns, in_flight.end_ns) == (8_750_000_000, 20 * g.SECOND)
    assert not [bar for bar in tl.bars if bar.category == "wasted"]
    page = timeline.render_html(tl)
    # plotly escapes non-ASCII in its figure JSON unless orjson is installed
    assert "running · as of 00:00:20 UTC" in page.replace("\\u00b7", "·")
    assert "<b>running</b>: figures as of 1970-01-01T00:00:20.000Z" in page

    out = tmp_path / "chrome.json"
    export.export_chrome(span_source([path]), out, [path], at(21))
    document = json.loads(out.read_text())
    names = [e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "thread_name"]
    assert names == ["rank 0 (running as of 1970-01-01T00:00:20.000Z)"]
    assert document["otherData"]["incarnations"] == [
        {
            "incarnation": 0,
            "rank": "0",
            "ended": "running",
            "cycle": None,
            "as_of": "1970-01-01T00:00:20.000Z",
        }
    ]
    export.export_chrome(span_source([path]), out, [path], at(51))
    document = json.loads(out.read_text())
    assert document["otherData"]["incarnations"][0]["ended"] == "killed"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--stale-after", "0", "expected seconds > 0, got '0'"),
        ("--stale-after", "soon", "expected seconds > 0, got 'soon'"),
        ("--now", "nan", "expected seconds since the epoch, got 'nan'"),
    ],
)
@pytest.mark.parametrize("command", ["check", "report", "timeline", "export"])
def test_bad_liveness_options_are_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    flag: str,
    value: str,
    message: str,
) -> None:
    path = killed_looking(tmp_path)
    output = ["-o", str(tmp_path / "out")] if command in ("timeline", "export") else []
    with pytest.raises(SystemExit) as exited:
        main([command, str(path), *output, flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == f"megatron-trace {command}: error: argument {flag}: {message}"
    assert not (tmp_path / "out").exists()


def test_each_rank_is_judged_on_its_own(tmp_path: Path) -> None:
    """Two ranks' files in two directories, each with its own metrics.jsonl."""
    (tmp_path / "r0").mkdir()
    (tmp_path / "r1").mkdir()
    zero = g.write(tmp_path / "r0" / "traces.jsonl", g.lifecycle(0, kill_after=1), rank=0)
    one = g.write(tmp_path / "r1" / "traces.jsonl", g.lifecycle(0, kill_after=1), rank=1)
    g.beat(zero, 50, rank=0, pid=100)
    g.beat(one, 20, rank=1, pid=110)  # rank 1's last beat is 35 s old at 55 s
    trace_report = report_files([zero, one], at(55))
    assert [(i["rank"], i["ended"]) for i in trace_report["incarnations"]] == [(0, "running")]
    assert trace_report["running"]
    assert [r["rank"] for r in trace_report["ranks"]] == [0, 1]
    result = check_files([one, zero], at(55))
    assert sorted(note.split(":")[0] for note in result.notes) == ["killed", "running"]
    assert "rank 1 incarnation 0: its in-flight interval is missing" in " ".join(result.notes)


def test_megatron_lm_metric_points_are_signs_of_life(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Megatron-LM job with the ``default`` groups, mid-interval: no span for long, no
    heartbeat of ours, but the metric points it records at each log interval (through the
    official file exporter) are fresh. It reads running in report, timeline and check;
    once they are older than the bound, killed."""
    path = tmp_path / "traces.jsonl"
    process = up.Process(path, pid=4242, groups=up.DEFAULT_GROUPS)
    process.pretrain(train_iters=100, save_interval=10, kill=up.Kill(25))  # what it has written
    now = time.time() + 5  # its last span ended in 2026-11 (virtual time): long stale
    assert report_files([path], Clock.at(now))["incarnations"][0]["ended"] == "killed"
    metrics = process.export_metrics(exports=2)
    names = {
        metric["name"]
        for line in metrics.read_text().splitlines()
        for scope in json.loads(line)["resourceMetrics"][0]["scopeMetrics"]
        for metric in scope["metrics"]
    }
    assert "megatron.training.step_duration_ms" in names
    assert "megatron.training.running" not in names  # not our heartbeat
    report = report_files([path], Clock.at(now))
    (inc,) = report["incarnations"]
    assert (inc["ended"], report["running"]) == ("running", True)
    assert report["liveness"]["notes"] == []
    assert main(["report", "--now", str(now), str(path)]) == 0
    assert "running" in capsys.readouterr().out
    (lane,) = timeline.collect(span_source([path]), [str(path)], Clock.at(now)).lanes
    assert lane.ended == "running"
    stale = report_files([path], Clock.at(now + STALE_AFTER_S + 10))
    assert stale["incarnations"][0]["ended"] == "killed"
