"""End-to-end on two torchrun ranks (CPU, gloo): a slowed rank is named, a hung rank is caught.

Each test runs a real ``torchrun --nproc-per-node 2`` job with every rank
exporting (``all_ranks``) the ``per_step`` span groups, and one rank set apart
through a ``torchrun --no-python`` wrapper script that sets a test hook for
that rank only. Then ``megatron-trace report --json`` reads the shared trace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from processes import TORCHRUN_2

from megatron.trace.cli.main import main as trace_main
from megatron.trace.otlp.reader import read_spans

pytestmark = pytest.mark.slow

ITERATIONS = 60
SLEEP_S = 0.03


def _torchrun(cli, rank1_env: dict[str, str], *args: str) -> list[str]:
    """The torchrun command line; ``rank1_env`` is set for rank 1 only."""
    script = cli.cwd / "rank_wrapper.sh"
    exports = "".join(f"export {name}={value}\n" for name, value in rank1_env.items())
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$RANK" = "1" ]; then\n{exports}true\nfi\n'
        f'exec "{sys.executable}" -m megatron.training "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [
        sys.executable, *TORCHRUN_2,
        "--no-python", str(script),
        *cli.TINY, *cli.TELEMETRY_ON,
        "--log-interval", "20",
        "--global-batch-size", "4",  # one micro-batch per rank: every backward all-reduces
        "--save", "ckpt",
        *args,
    ]  # fmt: skip


ENV = {"OMP_NUM_THREADS": "1", "MEGATRON_OTEL_RANK_STRATEGY": "all_ranks"}


def _report(cli, capsys) -> tuple[dict, str]:
    capsys.readouterr()
    assert trace_main(["report", str(cli.cwd / "ckpt/telemetry/traces.jsonl"), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def _run(
    cli, rank1_env: dict[str, str], iterations: int = ITERATIONS, env: dict[str, str] | None = None
) -> None:
    """The job, to its end; ``env`` set for both ranks (``rank1_env`` overrides it for rank 1)."""
    command = _torchrun(cli, rank1_env, "--train-iters", str(iterations))
    result = subprocess.run(
        command, cwd=cli.cwd, env=cli.env({**ENV, **(env or {})}), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_slowed_rank_is_the_straggler_with_its_slowdown_as_the_score(training_cli, capsys):
    cli = training_cli
    _run(cli, {"MEGATRON_TEST_ITERATION_SLEEP": str(SLEEP_S)})
    report, text = _report(cli, capsys)
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert (ranks[0]["straggler"], ranks[1]["straggler"]) == (False, True)
    assert report["stragglers"]["ranks"] == [1]
    # Both ranks' iterations last as long (the all-reduce waits for rank 1) ...
    assert report["iterations"]["median_ms"] > 1000 * SLEEP_S
    # ... but rank 0 spends the 30 ms waiting, and rank 1 working.
    work0, work1 = ranks[0]["work_ms_median"], ranks[1]["work_ms_median"]
    assert 0.7 * 1000 * SLEEP_S < work1 - work0 < 1.5 * 1000 * SLEEP_S
    assert ranks[0]["wait_ms_median"] > 0.7 * 1000 * SLEEP_S > ranks[1]["wait_ms_median"]
    assert ranks[0]["score"] == 1.0
    assert ranks[1]["score"] == pytest.approx(work0 / work1, abs=0.002)
    # the job time lost: about 30 ms for each iteration after the two of warm-up
    assert report["straggler_s"] == pytest.approx((ITERATIONS - 2) * SLEEP_S, rel=0.3)
    assert "stragglers: rank 1  (rule: score < 0.9 and the rank's lower quartile" in text
    assert ranks[1]["work_ms_q1"] > ranks[0]["work_ms_q3"]
    assert "STRAGGLER" in next(line for line in text.splitlines() if "  rank 1:" in line)


@contextlib.contextmanager
def _cpu_hog() -> Iterator[None]:
    """A process spinning on one core while the job runs: on this 2-core machine the two
    ranks and the hog take turns on the cores, so each rank's iterations are delayed in
    bursts, now one rank's, now the other's."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


BALANCED_RUNS = 3


def test_balanced_runs_under_a_cpu_hog_name_no_straggler_and_a_quarter_slower_rank_is(
    training_cli, capsys
):
    """Issue 50 item 5, with no second chance: balanced two-rank runs (50 iterations, both
    ranks alike) under a CPU hog name no straggler, every one; then, under the same hog, a
    run whose rank 1 is slowed by a quarter in every iteration names it.

    Every run sleeps both ranks ``SLOWED_BASE_S`` before each forward step, so the work,
    which the hog delays by some milliseconds at a time, is mostly the sleep: the balanced
    runs and the slowed one differ only in rank 1's extra quarter. (Balanced runs of bare
    compute are balanced only on a machine with a core to spare: under run_flaky.py's
    hogs as well, five busy processes on two cores, the scheduler left one rank a tenth
    slower over a whole run, and the rule rightly named it, issue 52.) The slowed run's
    rank 1 sleeps a quarter longer: its work a quarter longer but for the compute both ranks
    share (a few milliseconds), so a score a little over 0.8, not under it. (Calibrating
    the extra sleep on the balanced runs' compute overshot: without a sleep the ranks
    contend more, and the rank came out 30 % slower.)"""
    for attempt in range(BALANCED_RUNS):
        cli = type(training_cli)(training_cli.cwd / f"balanced{attempt}")
        cli.cwd.mkdir()
        with _cpu_hog():
            _run(cli, {}, iterations=50, env={"MEGATRON_TEST_ITERATION_SLEEP": str(SLOWED_BASE_S)})
        report, text = _report(cli, capsys)
        ranks = report["stragglers"]
        assert ranks["ranks"] == [], (attempt, report["ranks"], text)
        assert [entry["straggler"] for entry in report["ranks"]] == [False, False], attempt
        assert report["straggler_s"] == 0, attempt
        with capsys.disabled():  # (the next _report reads the captured output away)
            print(f"balanced run {attempt}: {_figures(report)}")
    cli = type(training_cli)(training_cli.cwd / "slowed")
    cli.cwd.mkdir()
    slowed_s = 1.25 * SLOWED_BASE_S
    with _cpu_hog():
        _run(
            cli,
            {"MEGATRON_TEST_ITERATION_SLEEP": f"{slowed_s:.4f}"},
            iterations=50,
            env={"MEGATRON_TEST_ITERATION_SLEEP": str(SLOWED_BASE_S)},
        )
    report, text = _report(cli, capsys)
    print(f"slowed run (rank 1 sleeps {slowed_s:.4f} s): {_figures(report)}")
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert report["stragglers"]["ranks"] == [1], (report["ranks"], text)
    assert ranks[1]["work_ms_q1"] > ranks[0]["work_ms_q3"]
    # a quarter slower, less the shared compute: a score about 0.8 (with the noise)
    assert 0.78 < ranks[1]["score"] < 0.87, ranks


SLOWED_BASE_S = 0.2


def _figures(report: dict) -> str:
    """Each rank's work quartiles and median (ms) and score, for the test's output."""
    return "; ".join(
        f"rank {e['rank']} work {e['work_ms_q1']}/{e['work_ms_median']}/{e['work_ms_q3']} ms "
        f"score {e['score']}"
        for e in report["ranks"]
    )


def test_a_hung_rank_is_caught_named_and_accounted(training_cli, capsys):
    cli = training_cli
    command = _torchrun(
        cli, {"MEGATRON_TEST_HANG_AT_ITERATION": "5"}, "--train-iters", "50", "--save-interval", "3"
    )
    env = cli.env({**ENV, "MEGATRON_OTEL_HANG_TIMEOUT": "1"})
    stderr_path = cli.cwd / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        job = subprocess.Popen(command, cwd=cli.cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=stderr, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while stderr_path.read_text().count(" stalled: ") < 2:
            assert job.poll() is None, stderr_path.read_text()[-3000:]
            assert time.monotonic() < deadline, stderr_path.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(0.5)  # the job stays up after the report: the watchdog only reports
        assert job.poll() is None
        terminated_ns = time.time_ns()
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)  # SIGTERM ends the job
        ended_ns = time.time_ns()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    stalls = [line for line in stderr_path.read_text().splitlines() if " stalled: " in line]
    assert sorted(line.split(" stalled: ")[0][-6:] for line in stalls) == ["rank 0", "rank 1"]
    assert all("iteration 5 in flight" in line for line in stalls)

    spans = read_spans(cli.cwd / "ckpt/telemetry/traces.jsonl")
    hangs = {s["resource"]["dl.rank"]: s for s in spans if s["name"] == "megatron.hang"}
    assert sorted(hangs) == [0, 1]  # each rank reported once, and reached the file
    capsys.readouterr()
    assert trace_main(["check", str(cli.cwd / "ckpt/telemetry/traces.jsonl")]) == 0
    report, text = _report(cli, capsys)
    entries = {entry["rank"]: entry for entry in report["hangs"]}
    assert sorted(entries) == [0, 1]
    assert entries[1]["culprit"] and not entries[0]["culprit"]
    assert entries[1]["frame"].endswith("in _hang")  # rank 1 stopped in its own forward step
    assert entries[0]["span"] == "megatron.grad_sync.finish"  # rank 0 waited for it
    assert {e["last_iteration"] for e in entries.values()} == {4}
    assert {e["iteration"] for e in entries.values()} == {5}
    # hang badput: from the last progress to the SIGTERM's shutdown, as the job lived it. The
    # shutdown came after the signal was sent and before the job was seen to end (how long
    # after depends on the scheduler alone: a loaded machine delivers it late).
    last_progress = hangs[0]["attributes"]["megatron.hang.last_progress_unix_nano"]
    at_least_s = (terminated_ns - last_progress) / 1e9
    at_most_s = (ended_ns - last_progress) / 1e9
    assert at_least_s > 1.5
    assert at_least_s <= report["badput_s"]["hang"] <= at_most_s
    assert at_least_s - 0.0005 <= entries[0]["stalled_s"] <= at_most_s + 0.0005  # 3 decimals
    assert "(culprit, stopped in its own work; ended cut_short)" in text
    assert [inc["ended"] for inc in report["incarnations"]] == ["cut_short"]
