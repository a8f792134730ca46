"""Span links as flow arrows a viewer binds to exactly the two spans of the link.

The Chrome trace-event format has two ways to draw an arrow:

* flow events (``"ph": "s"`` and ``"ph": "f"``, joined by ``id``), separate
  from the slices: a viewer binds each end to the slice open at its
  timestamp on its thread, which Perfetto takes to be the *deepest* one. An
  arrow meant to leave interval C0 then leaves whatever child of C0 was
  running at that instant.
* flow attributes on the complete events themselves (``bind_id`` with
  ``flow_out`` / ``flow_in``): the arrow leaves the slice that says
  ``flow_out`` and enters the next slice, in time, that says ``flow_in`` with
  the same ``bind_id``. Exact, but one ``bind_id`` per slice.

The lifecycle's links form chains (startup <- C0 <- C1 <- ...: each interval
links to the one before, and each span is linked to at most once), and one
``bind_id`` per chain carries all of a chain's arrows. So every link whose
two spans are each in no other link, or in a chain of such links, is drawn
with flow attributes; any other link (a span linked to twice, a span with
two links) falls back to a flow-event pair at the two spans' starts, where
the span itself is the deepest slice open unless a child starts in the same
nanosecond. A link whose target is not in the files draws nothing.

:meth:`FlowPlan.collect` learns the links in the first pass (memory O(links),
not O(spans)); :meth:`FlowPlan.plan` then decides, before the second pass
writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Binding", "FlowPlan"]


@dataclass(frozen=True, slots=True)
class Binding:
    """The flow attributes of one span's complete event."""

    bind_id: int
    flow_in: bool
    flow_out: bool

    def attributes(self) -> dict[str, Any]:
        event: dict[str, Any] = {"bind_id": self.bind_id}
        if self.flow_in:
            event["flow_in"] = True
        if self.flow_out:
            event["flow_out"] = True
        return event


class FlowPlan:
    """Which links become flow attributes (``bindings``) and which flow-event pairs."""

    def __init__(self) -> None:
        self._links: list[tuple[str, str]] = []  # (linking span id, linked-to span id)
        self.bindings: dict[str, Binding] = {}
        # Fallback pairs: linked-to span id -> flow ids; linking span id -> (flow id, target).
        self.starts: dict[str, list[int]] = {}
        self.finishes: dict[str, list[tuple[int, str]]] = {}

    def collect(self, spans: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Pass ``spans`` through, remembering their links."""
        for span in spans:
            for _, target in span["links"]:
                self._links.append((span["span_id"], target))
            yield span

    def add(self, linking: str, target: str) -> None:
        """Remember one link (of span ``linking`` to span ``target``), in read order."""
        self._links.append((linking, target))

    def plan(self) -> None:
        """Decide each link's drawing; call once, after :meth:`collect` was consumed."""
        out_degree: dict[str, int] = {}
        in_degree: dict[str, int] = {}
        for source, target in self._links:
            out_degree[source] = out_degree.get(source, 0) + 1
            in_degree[target] = in_degree.get(target, 0) + 1
        parent: dict[str, str] = {}

        def root(node: str) -> str:
            while parent[node] != node:
                parent[node] = parent[parent[node]]
                node = parent[node]
            return node

        chained: list[tuple[str, str]] = []
        next_id = 0
        for source, target in self._links:
            if out_degree[source] == 1 and in_degree[target] == 1 and source != target:
                chained.append((source, target))
                parent.setdefault(source, source)
                parent.setdefault(target, target)
                parent[root(source)] = root(target)
            else:
                next_id += 1
                self.starts.setdefault(target, []).append(next_id)
                self.finishes.setdefault(source, []).append((next_id, target))
        chain_ids: dict[str, int] = {}
        flags: dict[str, list[bool]] = {}  # span id -> [flow_in, flow_out]
        for source, target in chained:
            flags.setdefault(source, [False, False])[0] = True
            flags.setdefault(target, [False, False])[1] = True
        for span_id, (flow_in, flow_out) in flags.items():
            chain = root(span_id)
            if chain not in chain_ids:
                next_id += 1
                chain_ids[chain] = next_id
            self.bindings[span_id] = Binding(chain_ids[chain], flow_in, flow_out)
        self._links = []
