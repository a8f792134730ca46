"""``megatron-trace watch``: CPU per span appended against ``report``'s, and memory as a file grows.

The watch side is what the command does in its loop, in-process: a
:class:`~megatron.trace.live.follow.Follower` on a file that grows a chunk at
a time (a synthetic ``per_step`` trace appended in pieces that cut lines in
two), every chunk's new lines into a :class:`~megatron.trace.live.job.LiveJob`,
and every :data:`SNAPSHOT_EVERY` chunks the figures a scrape would compute
(:meth:`LiveJob.snapshot`). Only the follower's and the model's CPU time is
counted, not the writing.
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness import REPO_ROOT, Run, synthetic_trace_file

#: The file is appended in this many chunks; a scrape's figures every SNAPSHOT_EVERY.
CHUNKS = 200
SNAPSHOT_EVERY = 10
CHUNK_BYTES = 512 << 10  # the memory run's chunk: its file grows by this much per poll

_WATCH = textwrap.dedent(
    """
    import gc, json, resource, sys, time
    from pathlib import Path

    from megatron.trace.live.job import LiveJob
    from megatron.trace.analysis.liveness import Clock
    from megatron.trace.live.follow import Follower

    source, live = Path(sys.argv[1]), Path(sys.argv[2])
    chunk, every = int(sys.argv[3]), int(sys.argv[4])


    def peak_kb():
        try:  # VmHWM starts afresh at exec
            with open("/proc/self/status") as status:
                return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


    gc.enable()
    follower, job = Follower([live]), LiveJob([live])
    clock = Clock.at(None, 1e9)
    chunks = 0
    with source.open("rb") as src, live.open("ab") as out:
        while data := src.read(chunk):
            out.write(data)
            out.flush()
            job.add_lines(follower.poll())
            chunks += 1
            if chunks % every == 0:
                job.snapshot(clock)
    job.add_lines(follower.poll())
    snapshot = job.snapshot(clock)
    print(json.dumps({"peak_kb": peak_kb(), "spans": snapshot.spans}))
    """
)


def _watch_cpu(source: Path, live: Path, chunks: int, every: int) -> tuple[float, int]:
    """CPU seconds the follower and the live model spend on ``source`` appended to ``live``
    in ``chunks`` pieces, with a snapshot every ``every`` pieces; and the spans read."""
    from megatron.trace.analysis.liveness import Clock
    from megatron.trace.live.follow import Follower
    from megatron.trace.live.job import LiveJob

    live.unlink(missing_ok=True)
    data = source.read_bytes()
    step = -(-len(data) // chunks)
    follower, job = Follower([live]), LiveJob([live])
    clock = Clock.at(None, 1e9)
    cpu = 0.0
    gc.enable()  # as watch runs: the cyclic collector on
    with live.open("ab") as out:
        for index, start in enumerate(range(0, len(data), step), start=1):
            out.write(data[start : start + step])
            out.flush()
            began = time.process_time()
            job.add_lines(follower.poll())
            if index % every == 0:
                job.snapshot(clock)
            cpu += time.process_time() - began
    began = time.process_time()
    job.add_lines(follower.poll())
    snapshot = job.snapshot(clock)
    cpu += time.process_time() - began
    follower.close()
    assert snapshot is not None
    return cpu, snapshot.spans


def _report_cpu(source: Path) -> tuple[float, int]:
    """CPU seconds of ``report`` on ``source`` in this process (``--jobs 1``, the cyclic
    collector paused as ``main()`` pauses it), and the spans it counted."""
    from megatron.trace.analysis.goodput import report_files
    from megatron.trace.analysis.liveness import Clock

    gc.disable()
    try:
        began = time.process_time()
        report = report_files([source], Clock.at(None, 1e9), jobs=1)
        return time.process_time() - began, report["spans"]
    finally:
        gc.enable()


def bench_watch_cpu(repeats: int, spans: int = 200_000) -> tuple[float, float, float, int]:
    """(watch CPU per span / report CPU per span, watch µs per span, report µs per span,
    spans): medians over ``repeats`` interleaved repetitions on one synthetic file."""
    directory = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    source, _, _ = synthetic_trace_file(directory, "traces.jsonl", ranks=1, spans=spans)
    live = directory / "live" / "traces.jsonl"
    live.parent.mkdir()
    ratios, ours, theirs = [], [], []
    for rep in range(repeats):
        if rep % 2:
            report_s, counted = _report_cpu(source)
            watch_s, read = _watch_cpu(source, live, CHUNKS, SNAPSHOT_EVERY)
        else:
            watch_s, read = _watch_cpu(source, live, CHUNKS, SNAPSHOT_EVERY)
            report_s, counted = _report_cpu(source)
        if read != counted:
            raise AssertionError(f"watch read {read} spans, report counted {counted}")
        ratios.append(watch_s / report_s)
        ours.append(watch_s / read * 1e6)
        theirs.append(report_s / counted * 1e6)
    return statistics.median(ratios), statistics.median(ours), statistics.median(theirs), read


def bench_watch_rss(repeats: int, spans: int = 100_000) -> tuple[float, float, float]:
    """Peak RSS of watching a file grown to 4× ``spans`` over one grown to 1× (each in a
    fresh process, the same chunk size and scrape rate): (ratio, 1× MB, 4× MB), medians."""
    directory = Path(tempfile.mkdtemp(prefix="bench-watch-rss-"))
    sources = {
        size: synthetic_trace_file(directory, f"traces-{size}x.jsonl", ranks=1, spans=size * spans)[
            0
        ]
        for size in (1, 4)
    }
    env_path = str(REPO_ROOT)

    def peak(size: int) -> float:
        live = directory / f"live-{size}x" / "traces.jsonl"
        live.parent.mkdir(exist_ok=True)
        live.unlink(missing_ok=True)
        out = subprocess.run(
            [sys.executable, "-c", _WATCH, str(sources[size]), str(live), str(CHUNK_BYTES), "8"],
            capture_output=True, text=True, check=True, timeout=600,
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        return json.loads(out.stdout.splitlines()[-1])["peak_kb"] / 1024

    ratios, ones, fours = [], [], []
    for rep in range(repeats):
        one, four = (peak(1), peak(4)) if rep % 2 == 0 else tuple(reversed((peak(4), peak(1))))
        ratios.append(four / one)
        ones.append(one)
        fours.append(four)
    return statistics.median(ratios), statistics.median(ones), statistics.median(fours)


def section_watch(run: Run) -> None:
    ratio, ours_us, report_us, spans = bench_watch_cpu(3)
    run.record(
        "watch_cpu_per_span_ratio",
        ratio,
        f"watch {ours_us:.2f} µs/span ({spans} spans, {CHUNKS} polls)",
        f"report {report_us:.2f} µs/span",
    )
    growth, one_mb, four_mb = bench_watch_rss(1 if run.quick else 3)
    run.record("watch_rss_growth_4x", growth, f"{four_mb:.0f} MB at 4x", f"{one_mb:.0f} MB at 1x")
