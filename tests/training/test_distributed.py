"""What the ranks of a job print reaches the console they share a whole line at a time."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from processes import subprocess_env

from megatron.core.telemetry.logs import print_lines
from megatron.core.telemetry.tally import SpanTally
from megatron.training.telemetry.trace_summary import rank_line, summarize


class _Writes(io.StringIO):
    """A stream that remembers each write, as an unbuffered pipe receives them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_line_is_one_write_and_the_text_is_print_s() -> None:
    text = "telemetry written to t.jsonl\n  spans by name:\n    megatron.train  1"
    stream = _Writes()
    print_lines(text, stream)
    assert stream.writes == [
        "telemetry written to t.jsonl\n",
        "  spans by name:\n",
        "    megatron.train  1\n",
    ]
    printed = io.StringIO()
    print(text, file=printed)
    assert stream.getvalue() == printed.getvalue()
    single, empty = _Writes(), _Writes()
    print_lines("one line", single)
    print_lines("", empty)
    assert single.writes == ["one line\n"] and empty.writes == ["\n"]


# One rank of a torchrun job at its end: the trainer's own end-of-run summary
# (print_telemetry_summary), printed to the stdout it shares with the other rank.
# Its stdout is unbuffered (PYTHONUNBUFFERED, as the test harness and many job
# scripts set it), and wrapped so that the two ranks' writes alternate strictly:
# the worst order a scheduler can pick, chosen on purpose instead of waited for.
_RANK = """
import os, sys
from types import SimpleNamespace
from megatron.core.telemetry.tally import SpanTally
from megatron.training.telemetry.job_telemetry import print_telemetry_summary

rank, mine, theirs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

class TakingTurns:
    def __init__(self, stream):
        self.stream, self.alone = stream, False
    def write(self, text):
        if not self.alone and os.read(mine, 1) == b"x":  # the other rank has ended
            self.alone = True
        written = self.stream.write(text)
        if not self.alone:
            os.write(theirs, b".")
        return written
    def flush(self):
        self.stream.flush()

sys.stdout = TakingTurns(sys.stdout)
handle = SimpleNamespace(
    is_exporting=True, tally=SpanTally(), rank=rank, trace_file="ckpt/telemetry/traces.jsonl",
    span_groups=frozenset({"job", "iteration"}), failure_reports=lambda: [],
)
print_telemetry_summary(handle, SimpleNamespace(exporter="jsonl"))
os.write(theirs, b"x")
"""


def test_two_ranks_on_one_unbuffered_stdout_print_whole_lines() -> None:
    """The torchrun all_ranks job once printed rank 0's summary and no line that began
    `telemetry rank 1: `: rank 1's line had landed between the text of rank 0's last
    line and its newline (print() writes them apart on an unbuffered stream)."""
    turn0_r, turn0_w = os.pipe()  # rank 0 waits on this one for its turn
    turn1_r, turn1_w = os.pipe()
    out_r, out_w = os.pipe()  # the job's one stdout
    os.write(turn0_w, b".")  # rank 0 writes first
    env = subprocess_env()
    assert env["PYTHONUNBUFFERED"] == "1"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), str(mine), str(theirs)],
            stdout=out_w,
            env=env,
            pass_fds=(turn0_r, turn0_w, turn1_r, turn1_w),
        )
        for rank, mine, theirs in ((0, turn0_r, turn1_w), (1, turn1_r, turn0_w))
    ]
    os.close(out_w)
    with os.fdopen(out_r, encoding="utf-8") as out:
        printed = out.read()  # until both ranks have closed their stdout: they have ended
    statuses = [rank.wait(timeout=120) for rank in ranks]  # a bound for a hang only
    for fd in (turn0_r, turn0_w, turn1_r, turn1_w):
        os.close(fd)
    assert statuses == [0, 0], printed
    # every line whole: rank 0's summary and rank 1's line, each as it was made
    tally, groups = SpanTally(), frozenset({"job", "iteration"})
    summary = summarize("ckpt/telemetry/traces.jsonl", tally, span_groups=groups)
    own = rank_line(1, "ckpt/telemetry/traces.jsonl", tally, span_groups=groups)
    lines = printed.splitlines()
    said = f"the job's stdout:\n{printed}"
    assert [line for line in lines if line.startswith("telemetry rank 1: ")] == [own], said
    assert sorted(lines) == sorted([*summary.split("\n"), own]), said
