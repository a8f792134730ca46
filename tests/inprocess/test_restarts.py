"""The trainer under NVRx's in-process restart, for real: faults, and the trace told back.

Each test runs a job (``tests/support/inprocess_runs.py``: two torchrun ranks on
gloo, or one process), injects faults at moments it chooses (a loop iteration, a
checkpoint save, a startup phase, a hang past the soft timeout, two faults in a
row, the cycle limit), and checks the job's exit, its log, and its trace against
what happened: each rank's cycles in one process, how each ended, the iterations
each ran and resumed from, the fault recorded once, nothing of a cycle exported
after the next one began, telemetry shut down once.

These need NVRx (the ``inprocess`` extra): ``tox -e inprocess`` runs them.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from inprocess_runs import SOFT_TIMEOUT_S, Job, run_job

pytestmark = pytest.mark.slow

CYCLE = "nvrx.inprocess.iteration"
REASON = "megatron.shutdown.reason"
RESTARTED = "inprocess_restart"
RANK_SHOULD_RESTART = "nvidia_resiliency_ext.inprocess.monitor_thread.RankShouldRestart"


def _cycles(job: Job, rank: int) -> dict[int, list[dict[str, Any]]]:
    """One rank's spans by cycle; every span says its cycle, and one process wrote them."""
    spans = job.spans(rank)
    assert spans, f"rank {rank} wrote no span"
    assert all(CYCLE in s["attributes"] for s in spans), "a span without its cycle"
    assert len({s["resource"]["process.pid"] for s in spans}) == 1, "cycles of several pids"
    by_cycle: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for span in spans:
        by_cycle[span["attributes"][CYCLE]].append(span)
    assert sorted(by_cycle) == list(range(len(by_cycle)))
    return dict(by_cycle)


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["name"] == name]
    return found


def _iterations(spans: list[dict[str, Any]]) -> list[int]:
    """The iterations a cycle finished (its iteration spans without ERROR status), in order."""
    finished = [s for s in spans if s["name"] == "megatron.train.iteration"]
    return sorted(
        s["attributes"]["megatron.iteration"] for s in finished if s["status_code"] != "ERROR"
    )


def _fault_end(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The span the lifecycle ended at the cycle's fault: its last interval, else its startup."""
    intervals = [s for s in spans if s["name"] == "megatron.train"]
    return (
        max(intervals, key=lambda s: s["start_ns"])
        if intervals
        else _one(spans, "megatron.startup")
    )


def _assert_told_truly(job: Job, rank: int, cycles: int) -> dict[int, list[dict[str, Any]]]:
    """What holds for every rank of every job here: ``cycles`` cycles, each but the last
    ended by its fault (restart reason, ERROR status), each exported whole before the
    next began, and telemetry shut down once, at the end."""
    by_cycle = _cycles(job, rank)
    assert len(by_cycle) == cycles
    for cycle in range(cycles - 1):
        ended = _fault_end(by_cycle[cycle])
        assert ended["attributes"][REASON] == RESTARTED, ended["attributes"]
        assert ended["status_code"] == "ERROR"
        last_line = max(s["line"] for s in by_cycle[cycle])
        assert last_line < min(s["line"] for s in by_cycle[cycle + 1])
        next_start = _one(by_cycle[cycle + 1], "megatron.startup")["start_ns"]
        assert max(s["end_ns"] for s in by_cycle[cycle]) <= next_start
    beats = job.heartbeats(rank)
    assert beats and beats[-1] == 0.0 and beats.count(0.0) == 1, beats
    return by_cycle


def _report_cycles(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (
            inc["cycle"],
            inc["ended"],
            inc["resumed_from"],
            inc["first_iteration"],
            inc["last_iteration"],
        )
        for inc in report["incarnations"]
    ]


def test_a_fault_on_one_rank_restarts_both_in_process_and_the_job_finishes(tmp_path: Path):
    job = run_job(
        tmp_path, "--train-iters", "20", rank_env={0: {"MEGATRON_TEST_FAULT_AT_ITERATION": "7"}}
    )
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    # rank 0 logs each finished iteration: 7 of them, then from the checkpoint of 5 on
    assert job.logged_iterations() == [*range(1, 8), *range(6, 21)]
    assert "rank=0 fn_ex: RuntimeError('injected fault at iteration 7')" in job.result.stderr
    rank0 = _assert_told_truly(job, 0, cycles=2)
    rank1 = _assert_told_truly(job, 1, cycles=2)
    for by_cycle in (rank0, rank1):
        assert _iterations(by_cycle[0]) == list(range(7))
        assert _iterations(by_cycle[1]) == list(range(5, 20))
        assert (
            _one(by_cycle[1], "megatron.checkpoint.load")["attributes"]["megatron.iteration"] == 5
        )
    # the fault, on the rank it struck: recorded once, on the first span it ended
    ended = _fault_end(rank0[0])
    assert ended["attributes"]["error.type"] == "RuntimeError"
    assert ended["status_message"] == "RuntimeError: injected fault at iteration 7"
    events = [(s["name"], e) for s in job.spans(0) for e in s["events"] if e["name"] == "exception"]
    assert [(name, e["attributes"]["exception.message"]) for name, e in events] == [
        ("megatron.train.forward_backward", "injected fault at iteration 7")
    ]
    # the other rank's cycle ended when its collective lost rank 0
    assert _fault_end(rank1[0])["attributes"]["error.type"] == "RuntimeError"
    assert job.megatron_trace("check").stdout.startswith("ok: ")
    report = job.report()
    assert _report_cycles(report) == [(0, "restarted", None, 0, 7), (1, "shutdown", 5, 5, 19)]
    first, second = report["incarnations"]
    assert first["pid"] == second["pid"] == rank0[0][0]["resource"]["process.pid"]
    assert (first["error_type"], first["wasted_iterations"]) == ("RuntimeError", 2)
    gap_ns = _one(rank0[1], "megatron.startup")["start_ns"] - max(s["end_ns"] for s in rank0[0])
    assert first["restart_gap_s"] == pytest.approx(gap_ns / 1e9, abs=1e-3)
    assert second["restart_gap_s"] is None
    assert report["checkpoint_advice"]["failures"] == 1
    assert "cycle 0 of pid" in job.megatron_trace("report").stdout
    # the live goodput gauges carried on across the cycles: their final export is report's
    for entry in report["ranks"]:
        wall = job.gauge(entry["rank"], "megatron.training.wall_clock_s")[-1]
        goodput = job.gauge(entry["rank"], "megatron.training.goodput_s")[-1]
        assert wall == pytest.approx(entry["wall_s"], abs=0.02 * entry["wall_s"])
        assert goodput == pytest.approx(entry["goodput_s"], abs=0.02 * entry["wall_s"])
        assert job.gauge(entry["rank"], "megatron.training.iteration")[-1] == 20


def test_a_fault_in_a_startup_ends_that_cycle_s_startup_and_the_next_cycle_trains(tmp_path):
    job = run_job(
        tmp_path,
        "--train-iters",
        "8",
        rank_env={1: {"MEGATRON_TEST_FAULT_AT_STARTUP": "dataloader"}},
    )
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    assert job.logged_iterations() == list(range(1, 9))  # cycle 1 starts afresh: no checkpoint yet
    rank1 = _assert_told_truly(job, 1, cycles=2)
    startup = _one(rank1[0], "megatron.startup")
    assert startup["attributes"][REASON] == RESTARTED
    assert startup["status_message"] == "RuntimeError: injected fault at startup: dataloader"
    assert not [s for s in rank1[0] if s["name"] == "megatron.train"]
    assert _iterations(rank1[1]) == list(range(8))
    _assert_told_truly(job, 0, cycles=2)
    # the failed start keeps its files: the job went on writing them
    assert (tmp_path / "ck" / "latest_checkpointed_iteration.txt").read_text().strip() == "8"
    report = job.report()
    assert [inc["ended"] for inc in report["incarnations"]] == ["restarted", "shutdown"]
    assert report["incarnations"][1]["resumed_from"] is None


def test_a_fault_in_a_save_loses_the_interval_since_the_last_durable_one(tmp_path: Path):
    job = run_job(
        tmp_path, "--train-iters", "15", rank_env={0: {"MEGATRON_TEST_FAULT_AT_SAVE": "10"}}
    )
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    assert job.logged_iterations() == [*range(1, 11), *range(6, 16)]
    rank0 = _assert_told_truly(job, 0, cycles=2)
    saves = [s for s in rank0[0] if s["name"] == "megatron.checkpoint.save"]
    assert [(s["attributes"]["megatron.iteration"], s["status_code"]) for s in saves] == [
        (5, "UNSET"),
        (10, "ERROR"),
    ]
    report = job.report()
    assert _report_cycles(report) == [(0, "restarted", None, 0, 9), (1, "shutdown", 5, 5, 14)]
    assert report["incarnations"][0]["wasted_iterations"] == 5  # 5..9: their save failed


def test_a_rank_hung_past_the_soft_timeout_restarts_both(tmp_path: Path):
    job = run_job(
        tmp_path, "--train-iters", "12", rank_env={1: {"MEGATRON_TEST_HANG_AT_ITERATION": "7"}}
    )
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    assert "MEGATRON_TEST_HANG_AT_ITERATION=7: blocking here" in job.result.stderr
    assert "SOFT_TIMEOUT" in job.result.stderr  # NVRx's own account of the restart
    assert job.logged_iterations() == [*range(1, 8), *range(6, 13)]
    rank1 = _assert_told_truly(job, 1, cycles=2)
    ended = _fault_end(rank1[0])
    assert ended["attributes"]["error.type"] == RANK_SHOULD_RESTART
    hung = [
        s
        for s in rank1[0]
        if s["name"] == "megatron.train.iteration" and s["attributes"]["megatron.iteration"] == 7
    ]
    assert (hung[0]["end_ns"] - hung[0]["start_ns"]) / 1e9 >= SOFT_TIMEOUT_S
    _assert_told_truly(job, 0, cycles=2)
    report = job.report()
    assert _report_cycles(report) == [(0, "restarted", None, 0, 7), (1, "shutdown", 5, 5, 11)]


TWO_FAULTS = {
    0: {"MEGATRON_TEST_FAULT_AT_ITERATION": "7"},
    1: {"MEGATRON_TEST_FAULT_AT_ITERATION": "12"},
}


def test_two_faults_in_a_row_are_two_restarts(tmp_path: Path):
    job = run_job(tmp_path, "--train-iters", "16", rank_env=TWO_FAULTS)
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    assert job.logged_iterations() == [*range(1, 8), *range(6, 13), *range(11, 17)]
    for rank in (0, 1):
        by_cycle = _assert_told_truly(job, rank, cycles=3)
        assert [_iterations(by_cycle[c]) for c in range(3)] == [
            list(range(7)),
            list(range(5, 12)),
            list(range(10, 16)),
        ]
    report = job.report()
    assert _report_cycles(report) == [
        (0, "restarted", None, 0, 7),
        (1, "restarted", 5, 5, 12),
        (2, "shutdown", 10, 10, 15),
    ]
    assert [inc["wasted_iterations"] for inc in report["incarnations"]] == [2, 2, 0]
    assert all(inc["restart_gap_s"] > 0 for inc in report["incarnations"][:2])


def test_at_the_cycle_limit_the_job_ends_with_one_clear_error_and_a_whole_trace(tmp_path):
    job = run_job(
        tmp_path, "--train-iters", "16", "--inprocess-max-iterations", "2", rank_env=TWO_FAULTS
    )
    assert job.result.returncode == 1
    line = (
        "megatron-pretrain: error: in-process restart gave up after 2 cycles "
        "(--inprocess-max-iterations 2); the last ended by RuntimeError: injected fault at "
        "iteration 12"
    )
    assert line in job.result.stderr.splitlines()
    for rank in (0, 1):
        by_cycle = _assert_told_truly(job, rank, cycles=2)
        last = _fault_end(by_cycle[1])
        assert last["attributes"][REASON] == "exception" and last["status_code"] == "ERROR"
        assert not [s for s in by_cycle[1] if s["attributes"].get("megatron.span.cut_short")]
    assert job.megatron_trace("check").stdout.startswith("ok: ")
    report = job.report()
    assert _report_cycles(report) == [(0, "restarted", None, 0, 7), (1, "failed", 5, 5, 12)]
    # the last cycle lost what it did past the checkpoint of 10
    assert report["incarnations"][1]["wasted_iterations"] == 2


def test_one_process_restarts_in_process_too(tmp_path: Path):
    job = run_job(
        tmp_path,
        "--train-iters",
        "8",
        ranks=1,
        rank_env={0: {"MEGATRON_TEST_FAULT_AT_ITERATION": "3"}},
    )
    assert job.result.returncode == 0, job.result.stderr[-4000:]
    assert job.logged_iterations() == [1, 2, 3, *range(1, 9)]  # no checkpoint before 5
    _assert_told_truly(job, 0, cycles=2)
    assert _report_cycles(job.report()) == [
        (0, "restarted", None, 0, 3),
        (1, "shutdown", None, 0, 7),
    ]
