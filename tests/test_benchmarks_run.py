"""The lifecycle benchmarks still run against the lifecycle's API.

``tests/benchmarks/lifecycle.py`` drives ``SpanPhases`` directly, so a change to its
methods breaks ``tox -e bench`` and nothing else: the public ``reroot()`` went in
9198130 and the bench failed on it, unseen, for 139 commits. Its three sections run
here as ``run_benchmarks.py --quick`` runs them (a few seconds); the figures are not
judged. The module is loaded alone: ``run_benchmarks.py`` imports every section, and
the pipeline's needs the official OTLP/JSON encoder, which ``tox -e mindeps`` lacks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from opentelemetry import context

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"
KEYS = {
    "step_ratio_off",
    "step_ratio_on",
    "reroot_ratio",
    "reroot_ratio_vs_upstream",
    "lifecycle_ratio",
    "lifecycle_ratio_vs_upstream",
}


@pytest.fixture
def benchmarks() -> Iterator[tuple[ModuleType, ModuleType]]:
    # as run_benchmarks.py finds them: its folder first on sys.path, modules by name
    names = ("harness", "lifecycle", "upstream_helpers", "synthetic")
    for name in names:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(BENCHMARKS))
    # The benchmarks leave lifecycles open, their spans current: not past this test.
    token = context.attach(context.Context())
    try:
        import harness
        import lifecycle

        yield harness, lifecycle
    finally:
        context.detach(token)
        sys.path.remove(str(BENCHMARKS))
        for name in names:
            sys.modules.pop(name, None)


def test_the_lifecycle_sections_run_and_record_their_keys(benchmarks) -> None:
    harness, lifecycle = benchmarks
    run = harness.Run(quick=True)
    for section in (lifecycle.section_step, lifecycle.section_reroot, lifecycle.section_lifecycle):
        section(run)
    assert set(run.results) == KEYS, run.results
    assert all(value > 0 for value in run.results.values()), run.results
