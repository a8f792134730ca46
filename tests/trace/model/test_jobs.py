"""Two jobs in one file are never read as one (``model/jobs.py``): the collector's file
exporter writes every job into one file unless its ``group_by`` is set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tracegen as g

from megatron.trace.analysis.goodput import report_files
from megatron.trace.analysis.liveness import Clock
from megatron.trace.cli.main import build_parser, main
from megatron.trace.cli.watch import _Watch
from megatron.trace.live.follow import Follower
from megatron.trace.live.job import LiveJob
from megatron.trace.model.builder import load_trace
from megatron.trace.model.jobs import SeveralJobsError, jobs_in, one_job


def _two_jobs(path: Path) -> Path:
    """Job "a" (killed, then resumed and finished), then job "b" started afresh."""
    g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6), run="a")
    return g.write(path, g.lifecycle(60), pid=300, run="b")


def _two_rank_jobs(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """The collector's file of two jobs of two ranks (job "a" killed, then resumed and
    finished; job "b" started afresh), and each job's own file. Rank 1 starts each launch
    half a second before rank 0, the job rank: its start alone falls in the job before."""
    jobs = {
        "a": [
            [g.lifecycle(0.5, kill_after=1), g.lifecycle(20.5, first=6, load=6)],
            [g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6)],
        ],
        "b": [[g.lifecycle(60.5)], [g.lifecycle(60)]],
    }
    both, own = tmp_path / "collector.jsonl", {}
    for name, ranks in jobs.items():
        own[name] = tmp_path / name / "traces.jsonl"
        own[name].parent.mkdir()
        for path in (both, own[name]):
            for rank, incarnations in enumerate(ranks):
                pid = 300 + rank if name == "b" else None
                g.write(path, *incarnations, rank=rank, pid=pid, run=name)
    return both, own


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["report", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main([*argv, "--now", "1000"])
    out, err = capsys.readouterr()
    return status, out, err


def test_two_jobs_in_one_file_are_named_in_one_line_and_read_one_at_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _two_jobs(tmp_path / "collector.jsonl")
    assert main(["report", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "megatron-trace report: error: the files hold 2 jobs, the later not resumed from the "
        "earlier's checkpoints: a (2 incarnations from 1970-01-01T00:00:00Z); b (1 "
        "incarnation from 1970-01-01T00:01:00Z); name one with --job a"
    )
    # each job read alone gives what its own file would
    for job, alone in (("a", [0, 20]), ("b", [60])):
        (tmp_path / job).mkdir()
        own = tmp_path / job / "traces.jsonl"
        if job == "a":
            g.write(own, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6), run="a")
        else:
            g.write(own, g.lifecycle(60), pid=300, run="b")
        picked = _report(capsys, str(path), "--job", job, "--now", "1000")
        expected = _report(capsys, str(own), "--now", "1000")
        assert len(picked["incarnations"]) == len(alone)
        for key in ("accounting_ns", "incarnations", "bounds", "wasted_iterations"):
            assert picked[key] == expected[key], key
    assert main(["report", str(path), "--job", "c"]) == 2
    assert capsys.readouterr().err.strip().endswith("hold no such job; valid are a, b")
    assert main(["diff", str(path), str(path), "--job", "b"]) == 0


@pytest.mark.needs_extras  # plotly: without it, timeline says that first
def test_timeline_names_the_jobs_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _two_jobs(tmp_path / "collector.jsonl")
    assert main(["timeline", str(path), "-o", str(tmp_path / "t.html")]) == 2
    assert "hold 2 jobs" in capsys.readouterr().err


def test_a_job_of_two_ranks_read_alone_is_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each rank's incarnation goes with the job of the job rank's one of the same launch,
    whichever rank started first, and the job's spans are its processes'."""
    both, own = _two_rank_jobs(tmp_path)
    for job, path in own.items():
        picked = _report(capsys, str(both), "--job", job, "--now", "1000")
        assert picked == _report(capsys, str(path), "--now", "1000"), job


def test_a_resumed_job_stays_one_job_whatever_its_launches_run_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """This trainer's launches carry different run ids without MEGATRON_OTEL_RUN_ID or Slurm
    (torchrun's default rendezvous): resumed from the earlier's checkpoint, one job; a
    launch killed in its startup, before its load was written, goes with the one after."""
    path = tmp_path / "traces.jsonl"
    g.write(path, g.lifecycle(0, kill_after=1), run="first")
    g.write(path, g.lifecycle(20, intervals=0)[:1], pid=200, run="second")  # its imports only
    g.write(path, g.lifecycle(30, first=6, load=6), pid=300, run="third")
    trace = load_trace([path])
    (job,) = jobs_in(trace)
    assert job.ids == ("first", "second", "third")
    assert one_job(trace) is trace
    # and so every command reads it: no line naming jobs, no figures of one launch alone
    status, out, err = _run(capsys, "check", str(path))
    assert (status, err) == (0, "") and "3 incarnations on 1 rank" in out
    status, _, err = _run(capsys, "export", str(path), "-o", str(tmp_path / "t.json"))
    assert (status, err) == (0, "")
    live = _live([path])
    snapshot = live.snapshot(Clock(now_ns=1000 * g.SECOND))
    assert live.jobs_note is None and snapshot is not None
    assert snapshot.ranks[0].wall_s == report_files([path], Clock(now_ns=1000 * g.SECOND))["wall_s"]


def test_a_restart_afresh_with_the_same_run_id_is_the_same_job(tmp_path: Path) -> None:
    """Without --save a restart starts at iteration 0: the same run id keeps it the job's."""
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0, kill_after=1), g.lifecycle(20))
    assert len(jobs_in(load_trace([path]))) == 1


def test_several_jobs_are_an_error_of_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SeveralJobsError, match="hold 2 jobs"):
        one_job(load_trace([_two_jobs(tmp_path / "t.jsonl")]))


def test_check_and_export_name_the_jobs_and_read_the_one_named_as_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both, own = _two_rank_jobs(tmp_path)
    line = (
        "error: the files hold 2 jobs, the later not resumed from the earlier's checkpoints: "
        "a (2 incarnations from 1970-01-01T00:00:00Z); b (1 incarnation from "
        "1970-01-01T00:01:00Z); name one with --job a\n"
    )
    output, alone = tmp_path / "picked.json", tmp_path / "alone.json"
    for command in (["check"], ["export", "-o", str(output)]):
        assert _run(capsys, *command, str(both)) == (2, "", f"megatron-trace {command[0]}: {line}")
    assert not output.exists()
    for job, path in own.items():
        # (check: the orphans of job a's killed launches are no missing parents of job b's)
        picked = _run(capsys, "check", str(both), "--job", job)
        assert picked == _run(capsys, "check", str(path)) and picked[0] == 0, job
        assert _run(capsys, "export", str(both), "--job", job, "-o", str(output))[0] == 0
        assert _run(capsys, "export", str(path), "-o", str(alone))[0] == 0
        assert output.read_bytes() == alone.read_bytes(), job  # its links' flows too
    for command in (["check"], ["export", "-o", str(output)]):
        status, _, err = _run(capsys, *command, str(both), "--job", "c")
        assert status == 2 and err.endswith("--job c: the files hold no such job; valid are a, b\n")


def _live(paths: list[Path], job: str | None = None) -> LiveJob:
    live = LiveJob(paths, job=job)
    live.add_lines(Follower(paths).poll())
    return live


def test_watch_figures_one_job_of_several_never_two_mixed(tmp_path: Path) -> None:
    """Without --job, the job of the first record read (its run id labels the series); with
    it, the job named, labelled by it; a job named that is not in the files, no figures."""
    both, own = _two_rank_jobs(tmp_path)
    clock = Clock(now_ns=1000 * g.SECOND)
    for job, expected in ((None, "a"), ("a", "a"), ("b", "b")):
        picked, alone = _live([both], job).snapshot(clock), _live([own[expected]]).snapshot(clock)
        assert picked is not None and alone is not None
        assert (picked.run_id, picked.ranks, picked.spans) == (expected, alone.ranks, alone.spans)
    first = _live([both])
    first.snapshot(clock)
    assert first.jobs_note == (
        "the files hold 2 jobs, the later not resumed from the earlier's checkpoints: a (2 "
        "incarnations from 1970-01-01T00:00:00Z); b (1 incarnation from 1970-01-01T00:01:00Z); "
        "the figures are a's alone (the job of the first record read): watch another with --job b"
    )
    named = _live([both], "b")
    named.snapshot(clock)
    assert named.jobs_note is None
    missing = _live([both], "c")
    assert missing.snapshot(clock) is None
    assert missing.jobs_note == (
        "--job c: the files hold no such job yet (they hold a, b); no figures until they do"
    )


def test_watch_says_the_jobs_once_as_they_come(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job appended to a file watch follows: one warning; said again only when another
    job comes, however often the figures are worked out again."""
    path = tmp_path / "collector.jsonl"
    g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=6, load=6), run="a")
    watch = _Watch(build_parser("watch").parse_args(["watch", str(path)]))
    said, figures = [], []
    try:
        for more in (
            lambda: None,  # job a alone: nothing to say
            lambda: g.write(path, g.lifecycle(60), pid=300, run="b"),
            lambda: g.write(path, g.lifecycle(60), rank=1, pid=301, run="b"),  # b's rank 1
            lambda: g.write(path, g.lifecycle(100), pid=400, run="c"),
        ):
            more()
            watch.poll()
            (snapshot,) = watch.snapshot()
            assert snapshot.run_id == "a"
            figures.append(snapshot.ranks)  # job a's, whatever came after it
            said.append(capsys.readouterr().err.count("megatron-trace watch: warning: "))
    finally:
        watch.close()
    assert said == [0, 1, 0, 1]
    assert len(figures[0]) == 1 and all(later == figures[0] for later in figures)


@pytest.mark.needs_extras  # prometheus_client (the watch extra), asked for first
def test_watch_job_without_files_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --receive alone each job is watched apart already: --job would pick nothing."""
    assert main(["watch", "--receive", str(tmp_path), "--job", "b"]) == 2
    assert capsys.readouterr().err == (
        "megatron-trace watch: error: --job b picks one job of the FILEs named, and no FILE "
        "is; with --receive alone each job is watched apart already (its folder, its run_id): "
        "name the FILEs, or leave --job out\n"
    )
