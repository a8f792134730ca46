"""Checks every goodput report must pass, shared by the report and liveness tests."""

from __future__ import annotations

import json
import math

import jsonschema

from megatron.trace.analysis.report import schema
from megatron.trace.render.json.report import report_json
from megatron.trace_format.semconv import BADPUT_CATEGORIES


def assert_schema(report: dict) -> None:
    """The report, as ``report --json`` prints it, is what ``report.schema.json`` says."""
    jsonschema.validate(json.loads(json.dumps(report_json(report))), schema())


def assert_accounted(report: dict) -> None:
    """goodput + badput == wall: exactly in ns, and in seconds up to float rounding; and the
    report is what its JSON Schema says (every report a test checks is checked against it)."""
    assert_schema(report)
    exact = report["accounting_ns"]
    assert exact["goodput"] + sum(exact[c] for c in BADPUT_CATEGORIES) == exact["wall"]
    assert all(exact[c] >= 0 for c in (*BADPUT_CATEGORIES, "goodput"))
    total = report["goodput_s"] + sum(s for s in report["badput_s"].values() if s is not None)
    assert math.isclose(total, report["wall_s"], abs_tol=1e-6)
    # a figure left out (None) is one the report says it could not compute
    not_computed = {reason.split(":")[0] for reason in report["not_computed"]}
    assert {c for c, s in report["badput_s"].items() if s is None} <= not_computed
    assert set(report["badput_s"]) == set(BADPUT_CATEGORIES)


def nonzero(report: dict) -> dict[str, float]:
    """The badput categories that took any time."""
    return {k: v for k, v in report["badput_s"].items() if v}


def typed_and_schema_keys(typed: type, node: dict) -> tuple[tuple[set[str], set[str]], ...]:
    """(required, optional) keys of a ``TypedDict`` and of its JSON Schema object, to compare:
    the typed report and its schema must name the same keys, equally required."""
    required = set(node["required"])
    return (
        (set(typed.__required_keys__), set(typed.__optional_keys__)),
        (required, set(node["properties"]) - required),
    )
