"""The ``*_vs_upstream`` benchmarks' baseline writes what our lifecycle writes.

``tests/benchmarks/upstream_helpers.py`` re-enacts Megatron-LM's flag-based
helpers; a ratio over it means something only if both sides emit the same
spans: the same names, parents and links, ``is_goodput_span`` where ours sets
it. (Only ours writes the ``megatron.interval.*`` attributes.) No timing here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from megatron.training.telemetry_spans import SpanPhases

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PHASES = (("megatron.startup.imports", 100.0, 101.0), ("megatron.startup.arg_parse", 101.0, 102.0))
TIMESTAMPS = {
    "slurm_job_start_time": 90.0,
    "launch_script_start": 95.0,
    "launch_script_presrun": 97.0,
    "program_start": 100.0,
}


def _shape(spans) -> list[tuple]:
    """Each span as (name, parent name, linked names, goodput), in end order."""
    by_id = {span.context.span_id: span for span in spans}

    def name_of(context) -> str | None:
        return None if context is None else by_id[context.span_id].name

    return [
        (
            span.name,
            name_of(span.parent),
            tuple(name_of(link.context) for link in span.links),
            span.attributes.get("is_goodput_span"),
        )
        for span in spans
    ]


def test_the_upstream_baseline_emits_our_spans() -> None:
    upstream = _load("upstream_helpers")
    # the in-memory handle the benchmarks themselves measure with
    handle = _load("harness").InMemoryTelemetry
    passes, save_interval = 7, 3

    ours = handle()
    phases = SpanPhases(ours, save_interval=save_interval)
    phases.start_job(model_type="GPT", timestamps=TIMESTAMPS)
    for phase in PHASES:
        phases.record_phase(*phase)
    phases.start_train()
    for iteration in range(passes):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()

    theirs = handle()
    upstream.bind(theirs, save_interval)
    upstream.pretrain(TIMESTAMPS, PHASES, passes)  # what the benchmark times

    ours_spans = ours.exporter.get_finished_spans()
    theirs_spans = theirs.exporter.get_finished_spans()
    assert _shape(theirs_spans) == _shape(ours_spans)
    assert [s.start_time for s in theirs_spans if s.name != "megatron.train"] == [
        s.start_time for s in ours_spans if s.name != "megatron.train"
    ]
    trains = [s for s in ours_spans if s.name == "megatron.train"]
    assert len(trains) == 3  # passes 0, 3, 6
    assert all(s.context.trace_id != trains[0].context.trace_id for s in trains[1:])
