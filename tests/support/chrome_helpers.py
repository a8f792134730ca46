"""Reading a ``megatron-trace export --format chrome`` file back exactly, for the tests.

Timestamps are read as :class:`~decimal.Decimal` and turned back into epoch
nanoseconds with the file's stated time origin, so a test compares them with
the spans' integer nanoseconds for equality, never approximately. Links are
read back from both ways the export draws them (flow attributes on the
complete events, and flow-event pairs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(), parse_float=Decimal)


def origin_ns(document: dict[str, Any]) -> int:
    return int(document["otherData"]["time_origin_unix_ns"])


def complete_events(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X"]


def start_ns(document: dict[str, Any], event: dict[str, Any]) -> int:
    """The event's start as epoch nanoseconds; asserts the file held it exactly."""
    ns = Decimal(event["ts"]) * 1000
    assert ns == ns.to_integral_value(), event
    return origin_ns(document) + int(ns)


def end_ns(document: dict[str, Any], event: dict[str, Any]) -> int:
    dur = Decimal(event["dur"]) * 1000
    assert dur == dur.to_integral_value(), event
    return start_ns(document, event) + int(dur)


def names(document: dict[str, Any], kind: str) -> dict[tuple[int, int | None], str]:
    """``(pid, tid)`` -> name for ``process_name`` (tid None) or ``thread_name`` metadata."""
    return {
        (event["pid"], event.get("tid")): event["args"]["name"]
        for event in document["traceEvents"]
        if event["ph"] == "M" and event["name"] == kind
    }


def arrows(document: dict[str, Any]) -> list[tuple[str, str]]:
    """Every flow as (span id it leaves, span id it enters), the way a viewer binds it.

    Flow attributes: a ``flow_in`` slice is entered from the latest slice, by
    start time, with the same ``bind_id`` and ``flow_out``. Flow-event pairs:
    the ``s`` binds to the slice that starts at its timestamp on its thread,
    the ``f`` likewise (the export puts both at span starts).
    """
    found: list[tuple[str, str]] = []
    by_bind: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in complete_events(document):
        if "bind_id" in event:
            by_bind[event["bind_id"]].append(event)
    for events in by_bind.values():
        events.sort(key=lambda e: Decimal(e["ts"]))
        latest_out: dict[str, Any] | None = None
        for event in events:
            if event.get("flow_in") and latest_out is not None:
                found.append((latest_out["args"]["span_id"], event["args"]["span_id"]))
            if event.get("flow_out"):
                latest_out = event
    at = {
        (e["pid"], e["tid"], Decimal(e["ts"])): e["args"]["span_id"]
        for e in complete_events(document)
    }
    starts = {e["id"]: e for e in document["traceEvents"] if e["ph"] == "s"}
    for finish in (e for e in document["traceEvents"] if e["ph"] == "f"):
        start = starts[finish["id"]]
        found.append(
            (
                at[(start["pid"], start["tid"], Decimal(start["ts"]))],
                at[(finish["pid"], finish["tid"], Decimal(finish["ts"]))],
            )
        )
    return found


def links(spans: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Every link whose target is among ``spans``, as (linked-to span id, linking span id)."""
    ids = {span["span_id"] for span in spans}
    return [
        (target, span["span_id"]) for span in spans for _, target in span["links"] if target in ids
    ]


def assert_rank_0_twice(document: dict[str, Any]) -> dict[tuple[int, int | None], str]:
    """A killed-and-resumed one-rank job's layout: a process per incarnation ("incarnation
    0" as pid 1, "incarnation 1" as pid 2), each with one thread, "rank 0". Returns the
    thread names."""
    assert names(document, "process_name") == {
        (1, None): "incarnation 0",
        (2, None): "incarnation 1",
    }
    threads = names(document, "thread_name")
    assert sorted((pid, name) for (pid, _), name in threads.items()) == [
        (1, "rank 0"),
        (2, "rank 0"),
    ]
    return threads
