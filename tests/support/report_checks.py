"""Checks every goodput report must pass, shared by the report and liveness tests."""

from __future__ import annotations

import math

from megatron.core.telemetry.semconv import BADPUT_CATEGORIES


def assert_accounted(report: dict) -> None:
    """goodput + badput == wall: exactly in ns, and in seconds up to float rounding."""
    exact = report["accounting_ns"]
    assert exact["goodput"] + sum(exact[c] for c in BADPUT_CATEGORIES) == exact["wall"]
    assert all(exact[c] >= 0 for c in (*BADPUT_CATEGORIES, "goodput"))
    total = report["goodput_s"] + sum(report["badput_s"].values())
    assert math.isclose(total, report["wall_s"], abs_tol=1e-6)
    assert set(report["badput_s"]) == set(BADPUT_CATEGORIES)


def nonzero(report: dict) -> dict[str, float]:
    """The badput categories that took any time."""
    return {k: v for k, v in report["badput_s"].items() if v}
