"""``megatron-trace`` reading on a Dask cluster: a report of many rank files there against
the local pool, and what a worker sends back for a piece (section ``cluster``).

The cluster is a ``LocalCluster`` of two single-threaded worker processes, started
once in a process of its own before anything is timed, as an operator's cluster is
up before anyone reads on it. Each side's ``report`` runs in a long-lived driver
process of its own that times the command itself (``main()``, from the parsed
arguments to the printed report), so neither side pays an interpreter's start or
its imports, and the local side's driver has no other thread (this process's
earlier sections may have some): its pool forks, as the command's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, Run, interleaved

# Prints the scheduler's address, then lives until its stdin closes.
_CLUSTER = """
import logging, sys
import distributed
with distributed.LocalCluster(
    n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0",
    silence_logs=logging.ERROR,
) as cluster:
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()
"""

# Runs one command per line of stdin (its argv as JSON); prints [exit status, seconds].
_DRIVER = """
import contextlib, gc, json, os, sys, time
from megatron.trace.cli.main import main
for line in sys.stdin:
    argv = json.loads(line)
    gc.collect()
    try:
        with open(os.devnull, "w") as out, contextlib.redirect_stdout(out):
            started = time.perf_counter()
            status = main(argv)
            seconds = time.perf_counter() - started
    except BaseException as error:
        print(json.dumps([repr(error), 0.0]), flush=True)
        continue
    print(json.dumps([status, seconds]), flush=True)
"""

# For each file given: the summary the map step of ``report`` sends back for it as one
# piece (what the executor runs: ``_Remote(scan_file, TraceBuilder.merge)`` over a run of
# one piece), its size as Dask serializes a task's result and as pickle does (the local
# pool's pipe), and its iterations; then the size of the summary of one run of all of
# them, merged on the worker as a run's pieces are (one summary crosses back a run).
_SUMMARY = """
import json, pickle, sys
from distributed.protocol import serialize
from megatron.trace.model.builder import TraceBuilder, scan_file
from megatron.trace.otlp import parallel
def wire(summary):
    _, frames = serialize(summary)
    return sum(memoryview(frame).nbytes for frame in frames)
remote = parallel._Remote(scan_file, TraceBuilder.merge)
work = [piece for path in sys.argv[1:] for piece in parallel.pieces([path], jobs=2)]
sizes = []
for piece in work:
    summary = remote([piece])
    sizes.append({
        "wire": wire(summary),
        "pickle": len(pickle.dumps(summary, pickle.HIGHEST_PROTOCOL)),
        "iterations": sum(len(p.iterations) for p in summary.processes.values()),
    })
print(json.dumps({"pieces": sizes, "run": wire(remote(work))}))
"""


def _env() -> dict[str, str]:
    # this tree's code, on the workers too (they inherit the cluster process's environment)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
    return env


class _Driver:
    """A process that runs ``megatron-trace`` commands in itself, timing each."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )

    def __call__(self, argv: list[str]) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(argv) + "\n")
        self.process.stdin.flush()
        said = self.process.stdout.readline()
        if not said:
            raise RuntimeError(f"{argv[0]}: the driver process died")
        status, seconds = json.loads(said)
        if status not in (0, 1):
            raise RuntimeError(f"megatron-trace {argv[0]}: {status}")
        return seconds


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _summaries(directory: Path, iterations: int) -> dict[str, Any]:
    """The summaries of two one-rank files with as many checkpoint intervals, the second
    with four times the iterations in each, and of a run of both."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import synthetic

    paths = []
    for times in (1, 4):
        shape = synthetic.Shape(ranks=1, spans=4 * times * iterations, save_interval=100 * times)
        paths.extend(synthetic.write_per_step(directory / f"piece{times}x.jsonl", shape))
    done = subprocess.run(
        [sys.executable, "-c", _SUMMARY, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
    )
    sizes = json.loads(done.stdout)
    for size, path in zip(sizes["pieces"], paths, strict=True):
        size["file_mb"] = path.stat().st_size / 2**20
    return sizes


def bench_cluster(repeats: int, ranks: int = 64, spans_per_rank: int = 12_000) -> dict[str, Any]:
    """``report`` of ``ranks`` rank files on the cluster (``--scheduler``) and on the local
    pool (``--jobs 2``), interleaved; then the summary one piece sends back.

    Each rank file is a synthetic ``per_step`` rank of ``spans_per_rank`` spans (3,000
    iterations, about 3.5 MB; 64 of them, 230 MB): big enough that reading, not the
    round trips, is most of the time. One untimed run on each side first: the workers
    have imported the reader, as a cluster's have after its first read.

    The summary's growth is measured at a fixed number of checkpoint intervals, so the
    difference is the iterations' alone: the model keeps 24 bytes for each (three int64
    columns) and a few structural spans per interval.
    """
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import synthetic

    directory = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    processes: list[subprocess.Popen[str]] = []
    try:
        shape = synthetic.Shape(ranks=ranks, spans=ranks * spans_per_rank, per_rank_files=True)
        files = [str(path) for path in synthetic.write_per_step(directory / "rank.jsonl", shape)]
        size_mb = sum(os.path.getsize(path) for path in files) / 2**20
        sizes = _summaries(directory, spans_per_rank // 4)

        cluster = subprocess.Popen(
            [sys.executable, "-c", _CLUSTER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        processes.append(cluster)
        assert cluster.stdout is not None
        address = cluster.stdout.readline().strip()
        if not address:
            raise RuntimeError("the LocalCluster did not start")
        on_cluster, on_pool = _Driver(), _Driver()
        processes += [on_cluster.process, on_pool.process]
        cluster_argv = ["report", *files, "--scheduler", address, "--jobs", "2"]
        pool_argv = ["report", *files, "--jobs", "2"]
        first = on_cluster(cluster_argv), on_pool(pool_argv)
        ratio, ours, base = interleaved(
            lambda: on_cluster(cluster_argv), lambda: on_pool(pool_argv), repeats
        )
    finally:
        for process in reversed(processes):
            _stop(process)
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
    return {
        "ratio": ratio,
        "cluster_s": ours,
        "pool_s": base,
        "first_s": first,
        "files": len(files),
        "size_mb": size_mb,
        "summaries": sizes,
    }


def section_cluster(run: Run) -> None:
    figures = bench_cluster(run.reps)
    run.record(
        "cluster_report_ratio",
        figures["ratio"],
        f"{figures['cluster_s']:.2f} s on 2 Dask workers",
        f"local pool {figures['pool_s']:.2f} s ({figures['files']} rank files, "
        f"{figures['size_mb']:.0f} MB; first runs {figures['first_s'][0]:.1f} s / "
        f"{figures['first_s'][1]:.1f} s, untimed)",
    )
    small, big = figures["summaries"]["pieces"]
    run_of_both = figures["summaries"]["run"]
    growth = (big["wire"] - small["wire"]) / (big["iterations"] - small["iterations"])
    run.record(
        "cluster_bytes_per_piece",
        growth,
        f"{small['wire'] / 1e3:.0f} KB at {small['iterations']} it, "
        f"{big['wire'] / 1e3:.0f} KB at {big['iterations']} "
        f"({big['wire'] / big['iterations']:.1f} B/it)",
        f"pickle {small['pickle'] / 1e3:.0f} / {big['pickle'] / 1e3:.0f} KB; "
        f"pieces of {small['file_mb']:.1f} / {big['file_mb']:.1f} MB; a run of both "
        f"{run_of_both / 1e3:.0f} KB, {run_of_both / (small['wire'] + big['wire']):.0%} of theirs",
    )
