"""What every benchmark shares: the timing helpers, the run's record of its
figures (``Run``), the in-memory SDK handle and the synthetic trace files."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

REPO_ROOT = Path(__file__).resolve().parents[2]


class InMemoryTelemetry:
    """A handle on a real SDK provider whose spans land in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("bench")
        self.is_exporting = True
        self.span_groups = frozenset({"job"})

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self, timeout_ms: int = 5000) -> None:
        self.provider.shutdown()


def interleaved(ours: Callable[[], float], baseline: Callable[[], float], repeats: int):
    """Median of per-repetition ratios, alternating which side runs first."""
    ratios, ours_times, base_times = [], [], []
    for rep in range(repeats):
        if rep % 2:
            b, o = baseline(), ours()
        else:
            o, b = ours(), baseline()
        ratios.append(o / b)
        ours_times.append(o)
        base_times.append(b)
    return statistics.median(ratios), statistics.median(ours_times), statistics.median(base_times)


def time_calls(fn: Callable[[int], None], n: int) -> float:
    """Seconds per call of ``fn(i)`` over ``n`` calls."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


@dataclass
class Run:
    """Settings of one run, and what its sections recorded."""

    quick: bool
    results: dict[str, float] = field(default_factory=dict)
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def reps(self) -> int:
        return 5 if self.quick else 21

    def record(self, key: str, value: float, ours: str, base: str) -> None:
        self.results[key] = round(value, 3)
        self.rows.append((key, f"{value:.3f}", ours, base))


def synthetic_trace_file(directory: Path, name: str, **shape: Any) -> tuple[Path, int, float]:
    """A :mod:`synthetic` ``per_step`` trace of ``shape`` written to ``directory / name``:
    (its path, its spans, its size in MB)."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    import synthetic

    (path,) = synthetic.write_per_step(directory / name, synthetic.Shape(**shape))
    with path.open("rb") as file:
        spans = sum(line.count(b'"spanId"') - line.count(b'"links":[{') for line in file)
    return path, spans, path.stat().st_size / 2**20
