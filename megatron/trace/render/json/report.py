"""``report --json``: the report as one JSON object, as ``report.schema.json`` states it.

The report's figures are plain data already; its bounds keep their reasons and sources as
data (:mod:`megatron.trace.analysis.reasons`) until here, where each is put in words once.
"""

from __future__ import annotations

from typing import Any

from megatron.trace.analysis.reasons import reason_text, source_text

__all__ = ["report_json"]


def report_json(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` (a :func:`~megatron.trace.analysis.goodput.build_report`) with each
    bound's ``reason`` and ``source`` in words: what ``json.dumps`` prints."""
    bounds = {}
    for path, bound in report.get("bounds", {}).items():
        said = {**bound, "reason": _words(bound["reason"], reason_text)}
        if "source" in bound:
            said["source"] = _words(bound["source"], source_text)
        bounds[path] = said
    return {**report, "bounds": bounds}


def _words(value: Any, render: Any) -> str:
    """``value`` in words (one in words already, a report read back from JSON, as it is)."""
    return value if isinstance(value, str) else render(value)
