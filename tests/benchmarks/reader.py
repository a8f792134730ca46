"""The reader's own costs in one process: ``report`` on a million spans (time and
peak RSS), and its order statistics by selection against ``np.partition``
(sections ``report`` and ``selection``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, Run, interleaved


def bench_trace_report(
    repeats: int, spans: int = 1_000_000
) -> tuple[float, float, int, float, float]:
    """``megatron-trace report`` on a synthetic per_step trace of ``spans`` spans.

    The file is written directly as OTLP/JSON lines shaped like a per_step run
    (intervals of 100 iterations, each with three children, a checkpoint save
    per interval, 500 spans per line), which takes seconds instead of a day of
    training. Each repetition reports in a fresh subprocess, so its peak RSS
    (``VmHWM``, else ``ru_maxrss``) is the report's own. Returns (seconds per million spans,
    peak MB, spans, file MB, peak MB before reading: interpreter and imports),
    medians over the repetitions.
    """
    resource = json.dumps(
        {"attributes": [{"key": "dl.rank", "value": {"intValue": "0"}},
                        {"key": "service.instance.id", "value": {"stringValue": "bench-rank0"}},
                        {"key": "process.pid", "value": {"intValue": "1"}}]}
    )  # fmt: skip
    head = (
        '{"resourceSpans":[{"resource":'
        + resource
        + ',"scopeSpans":[{"scope":{"name":"megatron"},"spans":['
    )
    ids = iter(range(1, 1 << 62))

    def span(
        name: str, trace: str, parent: str, start: int, end: int, attrs: str = "", links: str = ""
    ) -> str:
        span_id = f"{next(ids):016x}"
        return (
            f'{{"traceId":"{trace}","spanId":"{span_id}","parentSpanId":"{parent}","name":"{name}",'
            f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":[{attrs}],"events":[],"links":[{links}],"status":{{"code":0}}}}'
        ), span_id

    def iattr(key: str, value: int) -> str:
        return f'{{"key":"{key}","value":{{"intValue":"{value}"}}}}'

    path = Path(tempfile.mkdtemp(prefix="bench-report-")) / "traces.jsonl"
    ms = 1_000_000
    written, batch = 0, []
    with path.open("w") as file:

        def emit(text: str) -> None:
            nonlocal written
            batch.append(text)
            written += 1
            if len(batch) == 500:
                file.write(head + ",".join(batch) + "]}]}]}\n")
                batch.clear()

        now, iteration = 0, 0
        text, previous = span("megatron.startup", "a" * 32, "", now, now + 1000 * ms)
        previous_trace = "a" * 32
        emit(text)
        now += 1000 * ms
        index = 0
        while written < spans:
            trace = f"{index + 1:032x}"
            interval_id = f"{next(ids):016x}"
            start = now
            for _ in range(100):
                text, iteration_id = span(
                    "megatron.train.iteration",
                    trace,
                    interval_id,
                    now,
                    now + 20 * ms,
                    iattr("megatron.iteration", iteration),
                )
                for name in (
                    "megatron.train.get_batch",
                    "megatron.train.forward_backward",
                    "megatron.train.optimizer",
                ):
                    emit(span(name, trace, iteration_id, now, now + 5 * ms)[0])
                emit(text)
                now += 20 * ms
                iteration += 1
            emit(
                span(
                    "megatron.checkpoint.save",
                    trace,
                    interval_id,
                    now,
                    now + 50 * ms,
                    iattr("megatron.iteration", iteration),
                )[0]
            )
            now += 50 * ms
            attrs = ",".join(
                (
                    iattr("megatron.interval.index", index),
                    iattr("megatron.interval.first_iteration", iteration - 100),
                    iattr("megatron.interval.last_iteration", iteration - 1),
                )
            )
            link = f'{{"traceId":"{previous_trace}","spanId":"{previous}"}}'
            emit(
                f'{{"traceId":"{trace}","spanId":"{interval_id}","parentSpanId":"","name":"megatron.train",'
                f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{now}",'
                f'"attributes":[{attrs}],"events":[],"links":[{link}],"status":{{"code":0}}}}'
            )
            previous, previous_trace, index = interval_id, trace, index + 1
        if batch:
            file.write(head + ",".join(batch) + "]}]}]}\n")
    code = textwrap.dedent(
        """
        import json, resource, sys, time
        from megatron.trace.analysis.goodput import report_files

        def peak_kb():
            try:  # VmHWM starts afresh at exec; ru_maxrss would inherit the parent's peak
                with open("/proc/self/status") as status:
                    return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
            except OSError:
                return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        imports_kb = peak_kb()
        started = time.perf_counter()
        report = report_files([sys.argv[1]])
        elapsed = time.perf_counter() - started
        print(json.dumps({"s": elapsed, "peak_kb": peak_kb(), "imports_kb": imports_kb,
                          "spans": report["spans"]}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    seconds, peaks, imports = [], [], []
    try:
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-c", code, str(path)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            measured = json.loads(out.stdout.splitlines()[-1])
            assert measured["spans"] == written
            seconds.append(measured["s"])
            peaks.append(measured["peak_kb"] / 1024)
            imports.append(measured["imports_kb"] / 1024)
        size_mb = path.stat().st_size / 2**20
    finally:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    per_million = statistics.median(seconds) * 1e6 / written
    return per_million, statistics.median(peaks), written, size_mb, statistics.median(imports)


def section_report(run: Run) -> None:
    per_million, peak_mb, spans, size_mb, imports_mb = bench_trace_report(1 if run.quick else 3)
    run.record(
        "report_s_per_million_spans", per_million, f"{spans} spans", f"{size_mb:.0f} MB file"
    )
    run.record("report_peak_mb_1m_spans", peak_mb, "peak RSS", f"{imports_mb:.1f} MB imports")


def bench_selection(
    repeats: int, rows: int = 4_000_000
) -> tuple[float, float, float, float, float, float]:
    """The report's median and p90 of ``rows`` iteration durations: selected a radix digit
    at a time over the columns' parts (:mod:`megatron.trace._store.selection`) against
    ``np.partition`` of the whole column, read from the same spilled columns, with the
    same answer. Returns (peak ratio, time ratio, our peak MB, partition's peak MB, our
    s, partition's s); the peaks are tracemalloc's, above what was allocated before."""
    import tracemalloc

    import numpy as np

    from megatron.trace._store.columns import Iterations
    from megatron.trace._store.selection import select

    rng = np.random.default_rng(7)
    durations = rng.lognormal(np.log(2e7), 0.1, rows).astype(np.int64)
    starts = np.cumsum(durations + 1000) - durations
    ends = starts + durations
    its = Iterations()
    for lo in range(0, rows, 4096):  # through the hot loop's arrays, as the reader fills them
        numbers_tail, starts_tail, ends_tail = its.arrays()
        numbers_tail.frombytes(np.arange(lo, min(lo + 4096, rows), dtype=np.int64).tobytes())
        starts_tail.frombytes(starts[lo : lo + 4096].tobytes())
        ends_tail.frombytes(ends[lo : lo + 4096].tobytes())
    del durations, starts, ends
    ranks = [(rows - 1) // 2, rows // 2, max(0, -(-9 * rows // 10) - 1)]

    def selected() -> list[int]:
        def parts() -> Iterator[Any]:
            for part in its.parts():
                yield np.frombuffer(part.ends, np.int64) - np.frombuffer(part.starts, np.int64)

        return select(parts, ranks)

    def partitioned() -> list[int]:
        whole = np.frombuffer(its.ends, np.int64) - np.frombuffer(its.starts, np.int64)
        whole.partition(ranks)
        return [int(whole[rank]) for rank in ranks]

    if selected() != partitioned():
        raise AssertionError("selection and np.partition disagree")

    def peak(function: Callable[[], list[int]]) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            function()
            return (tracemalloc.get_traced_memory()[1] - before) / 2**20
        finally:
            tracemalloc.stop()

    def timed(function: Callable[[], list[int]]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            function()
            return time.perf_counter() - start

        return run

    ours_mb, base_mb = peak(selected), peak(partitioned)
    ratio, ours_s, base_s = interleaved(timed(selected), timed(partitioned), repeats)
    return ours_mb / base_mb, ratio, ours_mb, base_mb, ours_s, base_s


def section_selection(run: Run) -> None:
    peak_ratio, time_ratio, ours_mb, base_mb, ours_s, base_s = bench_selection(
        3 if run.quick else 7
    )
    run.record(
        "selection_peak_ratio_vs_partition",
        peak_ratio,
        f"{ours_mb:.1f} MB over 4M rows",
        f"np.partition of the whole column: {base_mb:.1f} MB",
    )
    run.record(
        "selection_time_ratio_vs_partition",
        time_ratio,
        f"{ours_s * 1e3:.0f} ms",
        f"np.partition: {base_s * 1e3:.0f} ms",
    )
