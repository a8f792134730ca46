"""``megatron-trace watch``: following growing, rotating files; the live figures; the endpoint.

The figures are ``report``'s: a job read a piece at a time, as it is written,
agrees with ``report`` on the whole file. The follower reads each byte once,
across rotation; the endpoint is a real ``prometheus_client`` HTTP server.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tracegen as g
import upstream_traces as up
from processes import subprocess_env
from promtool import promtool

from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.liveness import Clock
from megatron.trace.live.follow import Follower, is_rotated_copy
from megatron.trace.live.job import LiveJob
from megatron.trace_format.errors import SpansReadTwiceError

LATER = up.T0 / 1e9 + 10**6  # long after any span of the upstream-shaped files


def lines_of(follower: Follower) -> list[tuple[str, int, bytes]]:
    return [(path.name, number, raw) for path, number, raw in follower.poll()]


# -- the follower -------------------------------------------------------------------------


def test_only_whole_new_lines_are_read_and_a_torn_last_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    follower = Follower([path])
    assert lines_of(follower) == [] and follower.waiting == [path]
    assert lines_of(follower) == [] and follower.waiting == []  # said once
    path.write_bytes(b'{"a": 1}\n{"b"')
    assert lines_of(follower) == [("traces.jsonl", 1, b'{"a": 1}')]
    assert lines_of(follower) == []  # nothing new; the torn line waits
    with path.open("ab") as file:
        file.write(b': 2}\n\n{"c": 3}\n')
    assert lines_of(follower) == [
        ("traces.jsonl", 2, b'{"b": 2}'),
        ("traces.jsonl", 4, b'{"c": 3}'),
    ]
    follower.close()


def test_a_rotation_loses_nothing_and_reads_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"1\n2\n")
    follower = Follower([path])
    assert [raw for *_, raw in follower.poll()] == [b"1", b"2"]
    with path.open("ab") as file:
        file.write(b"3\n4")  # the job writes on, the last line unfinished ...
    os.rename(path, tmp_path / "traces.jsonl.1")  # ... logrotate renames it ...
    with (tmp_path / "traces.jsonl.1").open("ab") as file:
        file.write(b"\n5\n")  # ... the job still holds it open ...
    # ... and then the copy is compressed, its name removed, a new file started
    with (tmp_path / "traces.jsonl.1").open("rb") as old:
        (tmp_path / "traces.jsonl.1.gz").write_bytes(gzip.compress(old.read()))
        os.unlink(tmp_path / "traces.jsonl.1")
        path.write_bytes(b"6\n")
        assert [raw for *_, raw in follower.poll()] == [b"3", b"4", b"5", b"6"]
    with path.open("ab") as file:
        file.write(b"7\n")
    assert [(n, raw) for _, n, raw in follower.poll()] == [(2, b"7")]
    follower.close()


def test_a_file_cut_back_in_place_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"1\n2\n")
    follower = Follower([path])
    assert len(list(follower.poll())) == 2
    with path.open("r+b") as file:  # logrotate's copytruncate
        file.truncate(0)
    assert list(follower.poll()) == []
    path.write_bytes(b"3\n")
    assert [raw for *_, raw in follower.poll()] == [b"3"]
    follower.close()


def test_rotated_copies_named_are_read_once(tmp_path: Path) -> None:
    old = tmp_path / "traces.jsonl.2.gz"
    old.write_bytes(gzip.compress(b"1\n2\n"))
    plain = tmp_path / "traces.jsonl.1"
    plain.write_bytes(b"3\n")
    assert is_rotated_copy(old) and is_rotated_copy(plain)
    assert not is_rotated_copy(tmp_path / "traces.jsonl")
    follower = Follower([old, plain])
    assert [raw for *_, raw in follower.poll()] == [b"1", b"2", b"3"]
    plain.write_bytes(b"3\n4\n")
    assert list(follower.poll()) == []


# -- the figures --------------------------------------------------------------------------


def _grow_and_compare(path: Path, clock: Clock) -> None:
    data = path.read_bytes()
    cuts = sorted({data.index(b"\n", k) + 1 for k in range(0, len(data), max(1, len(data) // 5))})
    live_path = path.with_name("live") / "traces.jsonl"
    live_path.parent.mkdir()
    follower = Follower([live_path])
    job = LiveJob([live_path])
    written = 0
    for cut in [*cuts, len(data)]:
        with live_path.open("ab") as file:
            file.write(data[written : cut + 3])  # and a little of the next line
        written = cut + 3
        job.add_lines(follower.poll())
    follower.close()
    snapshot = job.snapshot(clock)
    report = report_files([path], clock)
    assert snapshot is not None
    assert snapshot.spans == report["spans"]
    (rank,) = snapshot.ranks
    assert rank.wall_s == report["wall_s"]
    assert rank.goodput_s == report["goodput_s"]
    assert {str(c.value): s for c, s in rank.badput_s.items()} == {
        k: v or 0.0 for k, v in report["badput_s"].items()
    }
    assert rank.ended == report["incarnations"][-1]["ended"]


@pytest.mark.parametrize(
    "groups", [up.PER_STEP_GROUPS, up.DEFAULT_GROUPS], ids=["per_step", "default"]
)
def test_read_as_it_grows_the_figures_are_reports(tmp_path: Path, groups: frozenset[str]) -> None:
    path = up.killed_and_resumed(tmp_path / "traces.jsonl", groups=groups)
    _grow_and_compare(path, Clock.at(LATER))


def test_states_running_stalled_killed_finished(tmp_path: Path) -> None:
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1))  # last span 10.25 s
    g.beat(path, 10, 20, 30)
    follower = Follower([path])
    job = LiveJob([path], killed_after_s=100)
    job.add_lines(follower.poll())

    def state(seconds: float) -> str:
        snapshot = job.snapshot(Clock(now_ns=round(seconds * g.SECOND)))
        assert snapshot is not None
        return snapshot.job_state

    assert state(35) == "running"
    assert state(61) == "stalled"  # quiet for 31 s: past the bound, no ending
    assert state(129.9) == "stalled"
    assert state(130) == "killed"  # quiet for killed_after
    (tmp_path / "clean").mkdir()
    clean = g.write(tmp_path / "clean" / "traces.jsonl", g.lifecycle(0))
    done = LiveJob([clean])
    done.add_lines(Follower([clean]).poll())
    snapshot = done.snapshot(Clock(now_ns=10**6 * g.SECOND))
    assert snapshot is not None and snapshot.job_state == "finished"


def test_a_hang_is_suspected_past_k_times_the_rolling_median(tmp_path: Path) -> None:
    """Iterations of one second; a running job whose newest iteration ended long ago."""
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1))
    job = LiveJob([path], hang_factor=10, hang_floor_s=5)
    job.add_lines(Follower([path]).poll())
    last_end = 9.75  # the last finished iteration's end
    snapshot = job.snapshot(Clock(now_ns=round(19.5 * g.SECOND), stale_after_ns=10**12))
    assert snapshot is not None
    (rank,) = snapshot.ranks
    assert rank.state == "running"
    assert rank.iteration_time_s == 1.0
    assert (rank.hang_suspected, rank.hang_s) == (False, 0.0)  # 9.75 s quiet: under 10 x 1 s
    snapshot = job.snapshot(Clock(now_ns=round(25.0 * g.SECOND), stale_after_ns=10**12))
    assert snapshot is not None
    (rank,) = snapshot.ranks
    assert rank.hang_suspected is True
    assert rank.hang_s == 25.0 - last_end


def test_without_iteration_spans_the_passes_are_told_by_their_finalize(tmp_path: Path) -> None:
    """The ``default`` groups write no iteration span, but Megatron-LM opens
    ``megatron.checkpoint.save.finalize`` at the top of every loop pass: the rolling pass
    time and the hang rule run on those."""
    path = tmp_path / "traces.jsonl"
    up.Process(path, pid=4242, groups=up.DEFAULT_GROUPS).pretrain(
        train_iters=100, save_interval=10, kill=up.Kill(25)
    )
    finalizes = sorted(
        int(span["startTimeUnixNano"])
        for line in path.read_text().splitlines()
        for resource_spans in json.loads(line)["resourceSpans"]
        for scope in resource_spans["scopeSpans"]
        for span in scope["spans"]
        if span["name"] == "megatron.checkpoint.save.finalize"
    )
    assert len(finalizes) == 26  # passes 0..25, the last one killed in its step
    job = LiveJob([path], hang_factor=10, hang_floor_s=0.5)
    job.add_lines(Follower([path]).poll())

    def rank_at(seconds_after_last_pass: float):
        now = finalizes[-1] + round(seconds_after_last_pass * 1e9)
        snapshot = job.snapshot(Clock(now_ns=now, stale_after_ns=10**12))
        assert snapshot is not None
        (rank,) = snapshot.ranks
        assert rank.state == "running"
        return rank

    # a pass: the heartbeat, the finalize and the 100 ms step (the save passes are longer)
    pass_s = (up.MS // 10 + up.MS // 20 + up.ITERATION_NS) / 1e9
    rank = rank_at(0.9)  # under the bound, max(0.5, 10 x the median pass)
    assert rank.iteration_time_s == pytest.approx(pass_s)
    assert rank.iteration_time_source == "loop_passes"
    assert (rank.hang_suspected, rank.hang_s) == (False, 0.0)
    rank = rank_at(1.5)
    assert (rank.hang_suspected, rank.hang_s) == (True, pytest.approx(1.5))


def test_without_iteration_spans_nor_finalizes_the_intervals_tell_the_iteration_time(
    tmp_path: Path,
) -> None:
    """This trainer's ``default`` groups: intervals of two one-second iterations and a
    0.25 s save each, no iteration span, no finalize. The iteration time is the newest
    intervals' time over the iterations they covered, said to come from the intervals;
    the hang rule has nothing to run on, and no hang is suspected."""
    path = g.write(
        tmp_path / "traces.jsonl", g.lifecycle(0, intervals=15, iterations=False, kill_after=1)
    )
    job = LiveJob([path], hang_factor=10, hang_floor_s=0.5)
    job.add_lines(Follower([path]).poll())
    snapshot = job.snapshot(Clock(now_ns=round(200 * g.SECOND), stale_after_ns=10**12))
    assert snapshot is not None
    (rank,) = snapshot.ranks
    assert rank.state == "running"
    # the last ten intervals cover the 20 iterations of the rolling window: 22.5 s over 20
    assert rank.iteration_time_s == pytest.approx(22.5 / 20)
    assert rank.iteration_time_source == "intervals"
    assert (rank.hang_suspected, rank.hang_s) == (None, None)  # not computed (served as 0)
    # per-iteration spans, when there are, come first
    (tmp_path / "spans").mkdir()
    with_spans = g.write(tmp_path / "spans" / "traces.jsonl", g.lifecycle(0, kill_after=1))
    job = LiveJob([with_spans])
    job.add_lines(Follower([with_spans]).poll())
    snapshot = job.snapshot(Clock(now_ns=round(12 * g.SECOND), stale_after_ns=10**12))
    assert snapshot is not None
    assert [(r.iteration_time_s, r.iteration_time_source) for r in snapshot.ranks] == [
        (1.0, "iteration_spans")
    ]


def test_a_corrupt_line_is_counted_skipped_and_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0))
    with path.open("a") as file:
        file.write("this is not JSON at all\n")
    job = LiveJob([path])
    with caplog.at_level(logging.WARNING, logger="megatron.trace"):
        job.add_lines(Follower([path]).poll())
    snapshot = job.snapshot(Clock(now_ns=10**6 * g.SECOND))
    assert snapshot is not None and snapshot.corrupt_lines == 1
    # (megatron.trace's alone: a thread another test left could log meanwhile)
    (warning,) = [record for record in caplog.records if record.name.startswith("megatron.trace")]
    assert "traces.jsonl" in warning.getMessage()


# -- the endpoint ---------------------------------------------------------------------------


@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_the_families_as_prometheus_reads_them(tmp_path: Path) -> None:
    import prometheus_client

    from megatron.trace.render.metrics.prometheus import METRICS, SnapshotCollector

    path = up.killed_and_resumed(tmp_path / "traces.jsonl")
    job = LiveJob([path])
    job.add_lines(Follower([path]).poll())
    registry = prometheus_client.CollectorRegistry()
    registry.register(SnapshotCollector(lambda: job.snapshot(Clock.at(LATER))))
    text = prometheus_client.generate_latest(registry).decode()
    assert 'megatron_training_goodput_seconds{rank="0",run_id="job-4711"} 4.0' in text
    assert 'megatron_job_state{rank="0",run_id="job-4711",state="finished"} 1.0' in text
    assert (
        'megatron_training_badput_seconds{category="restart_gap",rank="0",run_id="job-4711"}'
        in (text)
    )
    assert 'megatron_training_iteration{rank="0",run_id="job-4711"} 40.0' in text
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert served <= {*METRICS, *(name.removesuffix("_total") for name in METRICS)}


def _upstream_resource(path: Path, **attributes: str) -> Path:
    """A one-line trace whose resource carries ``attributes`` (and nothing else naming a run)."""
    span = g.lifecycle(0)[0]
    request = {"resourceSpans": [{
        "resource": {"attributes": [
            {"key": key, "value": {"stringValue": value}} for key, value in attributes.items()
        ]},
        "scopeSpans": [{"scope": {"name": "megatron"}, "spans": [span]}],
    }]}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(request) + "\n")
    return path


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"megatron.run_id": "ours-1", "nemo.run.id": "nemo-1"}, "ours-1"),
        ({"nemo.run.id": "nemo-1", "service.instance.id": "x-rank3"}, "nemo-1"),
        ({"nemo.lens.run_uuid": "6f1c", "slurm.job.id": "4711"}, "6f1c"),
        ({"slurm.job.id": "4711", "service.instance.id": "x-rank3"}, "4711"),
        ({"service.instance.id": "pretrain-7b-rank12"}, "pretrain-7b"),
        ({"service.name": "megatron"}, "run-a"),  # nothing names it: the folder above rank0/
    ],
)
def test_the_run_id_comes_from_the_first_record(
    tmp_path: Path, attributes: dict[str, str], expected: str
) -> None:
    path = _upstream_resource(tmp_path / "run-a" / "rank0" / "traces.jsonl", **attributes)
    job = LiveJob([path])
    job.add_lines(Follower([path]).poll())
    snapshot = job.snapshot(Clock.at(LATER))
    assert snapshot is not None and snapshot.run_id == expected


def test_the_run_id_is_fixed_by_the_first_record_and_never_changes(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    follower = Follower([path])
    g.write(path, g.lifecycle(0, kill_after=1)[:2])  # a first line, before any startup span
    job = LiveJob([path])
    job.add_lines(follower.poll())
    first = job.snapshot(Clock(now_ns=5 * g.SECOND))
    assert first is not None and first.run_id == "run"
    g.write(path, g.lifecycle(0, kill_after=1)[2:])
    g.write(path, g.lifecycle(60, first=4), pid=101, run="run101")  # a process saying another
    job.add_lines(follower.poll())
    later = job.snapshot(Clock.at(LATER))
    assert later is not None and later.run_id == "run"
    given = LiveJob([path], run_id="pretrain-7b")
    given.add_lines(Follower([path]).poll())
    assert given.snapshot(Clock.at(LATER)).run_id == "pretrain-7b"  # type: ignore[union-attr]


@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_a_kill_lowers_the_goodput_gauge_and_no_counter(tmp_path: Path) -> None:
    import prometheus_client

    from megatron.trace.render.metrics.prometheus import SnapshotCollector

    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1))  # last span 10.25 s
    job = LiveJob([path])
    job.add_lines(Follower([path]).poll())
    clock = {"now": 10.5}
    registry = prometheus_client.CollectorRegistry()
    registry.register(
        SnapshotCollector(lambda: job.snapshot(Clock(now_ns=round(clock["now"] * g.SECOND))))
    )

    def scrape() -> dict[str, float]:
        text = prometheus_client.generate_latest(registry).decode()
        series = r'^(megatron_training_\w+)\{rank="0",run_id="run"\} (\S+)$'
        return {name: float(value) for name, value in re.findall(series, text, re.M)}

    running = scrape()
    clock["now"] = 100.0  # long past the staleness bound: killed, its last progress lost
    killed = scrape()
    assert (
        killed["megatron_training_goodput_seconds"] < running["megatron_training_goodput_seconds"]
    )
    lost = killed["megatron_training_lost_progress_seconds_total"]
    assert lost > running["megatron_training_lost_progress_seconds_total"] == 0
    for counter in ("progress_seconds_total", "lost_progress_seconds_total"):
        name = f"megatron_training_{counter}"
        assert killed[name] >= running[name], name
    # goodput is what the progress kept: progress less the lost part
    assert killed["megatron_training_goodput_seconds"] == pytest.approx(
        killed["megatron_training_progress_seconds_total"] - lost
    )
    assert running["megatron_training_progress_seconds_total"] == pytest.approx(
        running["megatron_training_goodput_seconds"]
    )
    clock["now"] = 10.5  # a figure that would fall back (a clock set back): the counters hold
    again = scrape()
    assert again["megatron_training_lost_progress_seconds_total"] == lost


@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_promtool_check_metrics_passes_on_a_scrape(tmp_path: Path) -> None:
    import prometheus_client

    from megatron.trace.render.metrics.prometheus import SnapshotCollector

    tool = promtool()
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1))
    job = LiveJob([path], hang_floor_s=1)
    job.add_lines(Follower([path]).poll())
    registry = prometheus_client.CollectorRegistry()
    registry.register(
        SnapshotCollector(lambda: job.snapshot(Clock(now_ns=20 * g.SECOND, stale_after_ns=10**12)))
    )
    text = prometheus_client.generate_latest(registry).decode()
    assert "megatron_hang_suspected" in text and "megatron_iteration_time_seconds" in text
    lint = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-m", "megatron.trace", "watch", "--interval", "0.2", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    assert child.stderr is not None
    return child, child.stderr.readline()


@pytest.mark.slow
@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_watch_serves_follows_and_stops_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    child, first = _start(["--listen", "127.0.0.1:0", str(path)])
    try:
        port = int(re.search(r"127.0.0.1:(\d+)/metrics for ", first).group(1))  # type: ignore[union-attr]
        waiting = child.stderr.readline()  # type: ignore[union-attr]
        assert waiting == f"megatron-trace watch: waiting for {path} (not there yet)\n"
        up.killed_and_resumed(path)
        # until watch has read the whole file (the series appears with its first lines,
        # at a smaller figure); the bound only ends a hang
        served = 'megatron_training_goodput_seconds{rank="0",run_id="job-4711"} 4.0'
        deadline = time.monotonic() + 120
        text = ""
        while served not in text and time.monotonic() < deadline:
            time.sleep(0.2)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert served in text, text
        # a second watch on the same port: one line, exit 2
        other, line = _start(["--listen", f"127.0.0.1:{port}", str(path)])
        assert other.wait(timeout=60) == 2
        assert line.startswith(f"megatron-trace watch: error: cannot listen on 127.0.0.1:{port}")
        assert other.stderr.read() == ""  # type: ignore[union-attr]
    finally:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
    assert child.stderr.read() == "megatron-trace watch: stopped\n"  # type: ignore[union-attr]


@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_a_sigterm_as_soon_as_it_serves_stops_it_cleanly(tmp_path: Path) -> None:
    """The handler is in place before the "serving" line: a supervisor that stops the
    watch the moment it is up gets exit 0 and one line, never death by SIGTERM (143)."""
    path = tmp_path / "traces.jsonl"
    for _ in range(5):
        child, first = _start(["--listen", "127.0.0.1:0", "--interval", "0.01", str(path)])
        assert "/metrics for " in first
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
        rest = child.stderr.read()  # type: ignore[union-attr]
        assert rest.endswith("megatron-trace watch: stopped\n"), rest
        assert "Traceback" not in rest


def test_a_copy_read_with_its_file_gives_no_figures(tmp_path: Path) -> None:
    """A job's own file and a receiver's copy of it hold the same spans: followed together,
    each would count twice (a wall clock of decades). The job's snapshot refuses, naming
    the two places of a span read twice, as ``report`` does, and keeps refusing."""
    path = g.write(tmp_path / "t.jsonl", g.lifecycle(0, kill_after=1))
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    follower = Follower([path, copy])
    job = LiveJob([path, copy])
    job.add_lines(follower.poll())
    clock = Clock.at(LATER, 30.0)
    for _ in range(2):
        with pytest.raises(SpansReadTwiceError, match=re.escape(f"was read already, at {path}:1")):
            job.snapshot(clock)
    follower.close()


@pytest.mark.needs_extras  # prometheus_client (the watch extra)
def test_watch_of_a_file_and_its_copy_ends_with_one_error(tmp_path: Path) -> None:
    """Named on the command line, the copy is the user's slip: the first scrape finds it,
    serves no figure, and ``watch`` ends with one line naming both files and exit 2."""
    path = tmp_path / "traces.jsonl"
    up.killed_and_resumed(path)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    child, first = _start(["--listen", "127.0.0.1:0", str(path), str(copy)])
    try:
        port = int(re.search(r"127.0.0.1:(\d+)/metrics for ", first).group(1))  # type: ignore[union-attr]
        # scrape until the files have been read (the bound only ends a hang)
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            except OSError:
                break  # it stopped between two scrapes
            assert "megatron_training_wall_clock_seconds{" not in text, text
            time.sleep(0.2)
        assert child.wait(timeout=60) == 2
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    rest = child.stderr.read()  # type: ignore[union-attr]
    assert rest.startswith(f"megatron-trace watch: error: {copy}:"), rest
    assert f"was read already, at {path}:" in rest and rest.count("\n") == 1, rest


def test_a_received_job_holding_a_span_twice_loses_its_series_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--receive``, one job's folder holding the same spans twice withdraws that job's
    figures, said once; the receiver and the other jobs carry on."""
    from megatron.trace.cli.main import build_parser
    from megatron.trace.cli.watch import _Watch

    spans = g.lifecycle(0, kill_after=1)
    for job, ranks in (("good", ["rank0"]), ("twice", ["rank0", "rank1"])):
        for rank in ranks:  # the same process's spans in two ranks' files
            (tmp_path / job / rank).mkdir(parents=True)
            g.write(tmp_path / job / rank / "traces.jsonl", spans)
    args = build_parser("watch").parse_args(["watch", "--receive", str(tmp_path)])
    watch = _Watch(args)
    try:
        for _ in range(3):
            watch.poll()
            served = {snapshot.run_id for snapshot in watch.snapshot()}
            watch.refuse()  # raises only for files named on the command line
            assert served == {"good"}
    finally:
        watch.close()
    said = capsys.readouterr().err
    assert said.count("megatron-trace watch: warning: job twice: ") == 1, said
    assert f"was read already, at {tmp_path / 'twice' / 'rank0' / 'traces.jsonl'}:1" in said
