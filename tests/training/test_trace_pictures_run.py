"""The pictures of a real run's trace: ``megatron-trace export`` and ``timeline``, and the demo.

A tiny model trains to iteration 8 with a checkpoint every 4, then a second
incarnation resumes it to 12, appending to the same file: the trace every
user of ``--load`` gets. Its Chrome export must put each incarnation in its
own process with spans nested on the rank's thread and every link drawn as a
flow; its timeline must show both incarnations with their intervals.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import chrome_helpers
import pytest

from megatron.trace.otlp.reader import read_spans
from megatron.trace.otlp.spans import span_source
from megatron.trace.render.export import write as export
from megatron.trace.render.lanes import Lane
from megatron.trace.render.timeline import write as timeline

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = ("--save", "ck", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "1")


@pytest.fixture(scope="module")
def resumed_trace(training_module_cli) -> Path:
    cli = training_module_cli
    for extra in (("--train-iters", "8"), ("--train-iters", "12", "--load", "ck")):
        result = cli.run(*cli.TINY, *cli.TELEMETRY_ON, *RUN, *extra)
        assert result.returncode == 0, result.stderr
    return cli.cwd / "ck" / "telemetry" / "traces.jsonl"


def test_the_chrome_export_of_a_resumed_run(resumed_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    events = export.export_chrome(span_source([resumed_trace]), out)
    document = chrome_helpers.load(out)
    assert len(document["traceEvents"]) == events
    spans = read_spans(resumed_trace)
    complete = chrome_helpers.complete_events(document)
    assert len(complete) == len(spans)

    # A process per incarnation: the OS process that wrote the span decides its pid.
    pids = {}
    for span, event in zip(spans, complete, strict=True):
        assert (event["name"], event["args"]["span_id"]) == (span["name"], span["span_id"])
        assert chrome_helpers.start_ns(document, event) == span["start_ns"]
        assert chrome_helpers.end_ns(document, event) == span["end_ns"]
        pids.setdefault(span["resource"]["process.pid"], set()).add(event["pid"])
    assert sorted(pids.values(), key=min) == [{1}, {2}]
    chrome_helpers.assert_rank_0_twice(document)

    # Nested by time: every span lies within its parent, on the parent's thread.
    by_id = {e["args"]["span_id"]: e for e in complete}
    children = defaultdict(list)
    for event in complete:
        parent = by_id.get(event["args"].get("parent_id"))
        if parent is None:
            continue
        children[parent["name"]].append(event["name"])
        assert (parent["pid"], parent["tid"]) == (event["pid"], event["tid"])
        assert parent["ts"] <= event["ts"]
        assert event["ts"] + event["dur"] <= parent["ts"] + parent["dur"]  # exact decimals
    assert "megatron.train.iteration" in children["megatron.train"]
    assert "megatron.checkpoint.load" in children["megatron.startup.model_init"]

    # Links as flows: startup -> C0 -> C1 in the first incarnation, startup -> C0 in the second,
    # each bound to exactly the two spans of its link.
    links = chrome_helpers.links(spans)
    assert len(links) == 3
    assert sorted(chrome_helpers.arrows(document)) == sorted(links)


def test_the_timeline_of_a_resumed_run(resumed_trace: Path, tmp_path: Path) -> None:
    tl = timeline.collect(span_source([resumed_trace]), [str(resumed_trace)])
    assert [(s.lane, s.ended) for s in tl.lanes] == [
        (Lane(0, "0"), "shutdown"),
        (Lane(1, "0"), "shutdown"),
    ]
    intervals = [(b.lane.incarnation, b.text) for b in tl.bars if b.category == "interval"]
    assert sorted(intervals) == [(0, "C0 · 0–3"), (0, "C1 · 4–7"), (1, "C0 · 8–11")]
    saves = [b for b in tl.bars if b.category == "checkpoint_save"]
    assert sorted(b.details[0] for b in saves) == [
        "at iteration 12",
        "at iteration 4",
        "at iteration 8",
    ]
    assert [b.lane for b in tl.bars if b.category == "checkpoint_load"] == [Lane(1, "0")]
    assert [b.lane for b in tl.bars if b.category == "restart_gap"] == [Lane(1, "0")]
    phases = {b.name for b in tl.bars if b.category == "startup_phase"}
    assert {"megatron.startup.imports", "megatron.startup.model_init"} <= phases
    out = tmp_path / "timeline.html"
    timeline.write_page(tl, out)
    page = out.read_text()
    assert "incarnation 1" in page and "megatron.checkpoint.load" in page


def _fake_plotly(tmp_path: Path) -> Path:
    """A ``plotly`` that imports but cannot draw: the timeline fails after training."""
    package = tmp_path / "broken" / "plotly"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0'\n")
    (package / "graph_objects.py").write_text("raise RuntimeError('plotly is broken here')\n")
    return package.parent


DEMO = ("--demo", "--train-iters", "4", "--save-interval", "2", "--eval-interval", "2")


def test_the_demo_ends_by_writing_the_timeline_beside_the_trace(training_cli) -> None:
    cli = training_cli
    result = cli.run(*DEMO, *cli.TINY, "--save", "demo")
    assert result.returncode == 0, result.stderr
    page = cli.cwd / "demo" / "telemetry" / "timeline.html"
    assert (
        result.stdout.strip().splitlines()[-1]
        == f"timeline: {Path('demo/telemetry/timeline.html')}"
    )
    assert page.is_file() and "incarnation 0" in page.read_text()


def test_a_timeline_that_fails_never_changes_the_exit_status(training_cli, tmp_path) -> None:
    cli = training_cli
    broken = _fake_plotly(tmp_path)
    result = cli.run(
        *DEMO, *cli.TINY, "--save", "demo", env={"PYTHONPATH": f"{broken}{os.pathsep}{REPO_ROOT}"}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "timeline: not drawn: plotly is broken here"
    assert not (cli.cwd / "demo" / "telemetry" / "timeline.html").exists()
    assert list((cli.cwd / "demo" / "telemetry").glob(".*tmp")) == []


def test_without_the_demo_no_timeline_is_drawn(training_cli) -> None:
    cli = training_cli
    result = cli.run(*cli.TINY, *cli.TELEMETRY_ON, "--train-iters", "2", "--save", "run")
    assert result.returncode == 0, result.stderr
    assert "timeline" not in result.stdout
    assert not (cli.cwd / "run" / "telemetry" / "timeline.html").exists()
