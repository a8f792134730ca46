"""Test-side readings of a trace: the link chains and ancestry, walked independently.

``megatron-trace`` groups spans by the process that wrote them; these follow
the links and parent ids instead, so a test that checks a run's structure does
not lean on the code it is checking.
"""

from __future__ import annotations

from typing import Any


def incarnations(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group spans by ``pretrain()`` call: each startup span and the intervals chained to it.

    Returns ``[{"startup": span or None, "intervals": [C0, C1, ...]}]``, one
    entry per ``megatron.startup`` in file order, following the links
    (C0 -> startup, C(k) -> C(k-1)). Intervals whose chain does not reach a
    startup in the file (its trace lost, or the ``job`` span group was off at
    startup) form entries of their own with ``startup`` None.
    """
    entries: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # span id -> its entry
    for span in spans:
        if span["name"] == "megatron.startup":
            entry = {"startup": span, "intervals": []}
            owner[span["span_id"]] = entry
            entries.append(entry)
    intervals = [span for span in spans if span["name"] == "megatron.train"]
    linked_to = {
        span["span_id"]: span["links"][0][1] if span["links"] else None for span in intervals
    }
    # In start-time order every interval comes after the span it links to.
    for interval in sorted(intervals, key=lambda span: span["start_ns"]):
        entry = owner.get(linked_to[interval["span_id"]])
        if entry is None:
            entry = {"startup": None, "intervals": []}
            entries.append(entry)
        entry["intervals"].append(interval)
        owner[interval["span_id"]] = entry
    return entries


def ancestor_names(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    """Names of ``span``'s parent, grandparent, ... up to its trace's root."""
    by_id = {s["span_id"]: s for s in spans}
    names = []
    while span["parent_id"] is not None and span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names
