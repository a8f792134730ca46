"""Hand-built OTLP/JSON trace files for the ``megatron-trace`` tests.

``lifecycle()`` writes what one incarnation of the real job writes (startup,
intervals linked in a chain, iterations, checkpoint saves, SIGKILL and
SIGTERM endings) with round numbers: one iteration is one second, so the
expected accounting can be worked out by hand. Tests then break one thing at
a time.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECOND = 1_000_000_000
_ids = itertools.count(1)


def new_id(width: int = 16) -> str:
    return f"{next(_ids):0{width}x}"


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def span(
    name: str,
    start_s: float,
    end_s: float,
    *,
    parent: dict | None = None,
    links: tuple[dict, ...] = (),
    **attributes: Any,
) -> dict[str, Any]:
    """One OTLP/JSON span; a child shares its parent's trace."""
    return encoded(
        name,
        round(start_s * SECOND),
        round(end_s * SECOND),
        trace_id=parent["traceId"] if parent else new_id(32),
        parent_span_id=parent["spanId"] if parent else "",
        links=[(s["traceId"], s["spanId"]) for s in links],
        attributes=attributes,
    )


def encoded(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    trace_id: str,
    span_id: str | None = None,
    parent_span_id: str = "",
    links: list[tuple[str, str]] | tuple[()] = (),
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One span as the OTLP/JSON file exporter writes it (the one encoding of every
    hand-built trace of the tests: :func:`span` and ``pictures_helpers`` build on it)."""
    return {
        "traceId": trace_id,
        "spanId": span_id if span_id is not None else new_id(),
        "parentSpanId": parent_span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [{"key": k, "value": _value(v)} for k, v in (attributes or {}).items()],
        "links": [{"traceId": trace, "spanId": span_id_} for trace, span_id_ in links],
        "status": {"code": 0},
    }


def attr(span_: dict, key: str, value: Any) -> None:
    """Set (or replace) one attribute of a built span."""
    span_["attributes"] = [kv for kv in span_["attributes"] if kv["key"] != key]
    span_["attributes"].append({"key": key, "value": _value(value)})


def line(spans: list[dict], rank: int = 0, pid: int = 100, run: str = "run") -> str:
    """One request line of a process (``rank``, ``pid``) of the job ``run`` names (its
    ``service.instance.id`` is ``<run>-rank<N>``, as this trainer's)."""
    resource = {
        "attributes": [
            {"key": "dl.rank", "value": _value(rank)},
            {"key": "process.pid", "value": _value(pid)},
            {"key": "service.instance.id", "value": _value(f"{run}-rank{rank}")},
        ]
    }
    request = {
        "resourceSpans": [
            {"resource": resource, "scopeSpans": [{"scope": {"name": "megatron"}, "spans": spans}]}
        ]
    }
    return json.dumps(request)


def lifecycle(
    t0: float,
    *,
    first: int = 0,
    intervals: int = 3,
    per: int = 2,
    iterations: bool = True,
    save: bool = True,
    load: int | None = None,
    kill_after: int | None = None,
    cut_short_after: int | None = None,
    fail_after: int | None = None,
    reason: str = "exception",
    error_type: str = "RuntimeError",
) -> list[dict]:
    """One incarnation's spans in write order (children before parents).

    Startup takes 2 s from ``t0`` (with a checkpoint load of 0.5 s when
    ``load`` is given); then ``intervals`` intervals of ``per`` one-second
    iterations, each ending with a 0.25 s checkpoint save when ``save``.
    ``kill_after=k``: a SIGKILL k iterations into one more interval (that
    interval and the iteration in flight are never written).
    ``cut_short_after=k``: a SIGTERM k iterations into one more interval
    (the interval and the iteration in flight are written, marked cut short).
    ``fail_after=k``: an exception (``reason`` ``exception``; ``interrupt``
    for a Ctrl-C) k iterations into one more interval: the iteration in
    flight ends with ERROR status, and the lifecycle's shutdown marks the
    interval with ``megatron.shutdown.reason`` and ``error.type``.
    """
    spans: list[dict] = []
    startup = span("megatron.startup", t0, t0 + 2, is_goodput_span=True)
    spans.append(span("megatron.startup.imports", t0, t0 + 0.5, parent=startup))
    if load is not None:
        model_init = span("megatron.startup.model_init", t0 + 1, t0 + 1.75, parent=startup)
        spans.append(
            span(
                "megatron.checkpoint.load",
                t0 + 1,
                t0 + 1.5,
                parent=model_init,
                **{"megatron.iteration": load},
            )
        )
        spans.append(model_init)
    spans.append(startup)
    previous, now, iteration = startup, t0 + 2, first

    def run_iterations(interval: dict, count: int) -> None:
        nonlocal now, iteration
        for _ in range(count):
            if iterations:
                spans.append(
                    span(
                        "megatron.train.iteration",
                        now,
                        now + 1,
                        parent=interval,
                        **{"megatron.iteration": iteration},
                    )
                )
            now += 1
            iteration += 1

    for index in range(intervals):
        interval = span("megatron.train", now, now, links=(previous,), is_goodput_span=True)
        attr(interval, "megatron.interval.index", index)
        attr(interval, "megatron.interval.first_iteration", iteration)
        run_iterations(interval, per)
        if save:
            spans.append(
                span(
                    "megatron.checkpoint.save",
                    now,
                    now + 0.25,
                    parent=interval,
                    **{"megatron.iteration": iteration},
                )
            )
            now += 0.25
        attr(interval, "megatron.interval.last_iteration", iteration - 1)
        # a reroot closed it when another interval follows (written or not)
        followed = index < intervals - 1 or (kill_after, cut_short_after, fail_after) != (None,) * 3
        attr(interval, "megatron.interval.rerooted", followed)
        interval["endTimeUnixNano"] = str(round(now * SECOND))
        spans.append(interval)
        previous = interval
    if kill_after is not None or cut_short_after is not None:
        interval = span("megatron.train", now, now, links=(previous,), is_goodput_span=True)
        attr(interval, "megatron.interval.index", intervals)
        attr(interval, "megatron.interval.first_iteration", iteration)
        run_iterations(interval, kill_after if kill_after is not None else cut_short_after)
        if cut_short_after is not None:
            in_flight = span(
                "megatron.train.iteration",
                now,
                now + 0.5,
                parent=interval,
                **{"megatron.iteration": iteration, "megatron.span.cut_short": True},
            )
            spans.append(in_flight)
            now += 0.5
            attr(interval, "megatron.span.cut_short", True)
            attr(interval, "megatron.interval.rerooted", False)
            interval["endTimeUnixNano"] = str(round(now * SECOND))
            spans.append(interval)
        else:
            # the in-flight iteration had finished a child before the kill
            doomed = span("megatron.train.iteration", now, now + 1, parent=interval)
            spans.append(span("megatron.train.get_batch", now, now + 0.5, parent=doomed))
            now += 0.5
    if fail_after is not None:
        interval = span("megatron.train", now, now, links=(previous,), is_goodput_span=True)
        attr(interval, "megatron.interval.index", intervals)
        attr(interval, "megatron.interval.first_iteration", iteration)
        run_iterations(interval, fail_after)
        failing = span(
            "megatron.train.iteration",
            now,
            now + 0.5,
            parent=interval,
            **{"megatron.iteration": iteration},
        )
        failing["status"] = {"code": 2, "message": f"{error_type}: boom"}
        spans.append(failing)
        now += 0.5
        attr(interval, "megatron.interval.last_iteration", iteration)
        attr(interval, "megatron.interval.rerooted", False)
        attr(interval, "megatron.shutdown.reason", reason)
        attr(interval, "error.type", error_type)
        interval["status"] = {"code": 2, "message": f"{error_type}: boom"}
        interval["endTimeUnixNano"] = str(round(now * SECOND))
        spans.append(interval)
    return spans


def write(
    path: Path,
    *incarnations: list[dict],
    rank: int = 0,
    per_line: int = 3,
    pid: int | None = None,
    run: str = "run",
) -> Path:
    """Write incarnations (each a separate process, or all by process ``pid``: ``pretrain()``
    called again in it, as an in-process restart does) of the job ``run`` names to ``path``,
    a few spans per line."""
    with path.open("a") as file:
        for position, spans in enumerate(incarnations):
            writer = pid if pid is not None else 100 + 10 * rank + position
            for i in range(0, len(spans), per_line):
                file.write(line(spans[i : i + per_line], rank=rank, pid=writer, run=run) + "\n")
    return path


def heartbeat_line(time_s: float, running: bool = True, rank: int = 0, pid: int = 100) -> str:
    """One ``metrics.jsonl`` line as the job's metrics export writes it: the heartbeat gauge
    (and a training metric beside it), for the process ``line`` names by ``rank``/``pid``."""
    resource = json.loads(line([], rank=rank, pid=pid))["resourceSpans"][0]["resource"]
    at = str(round(time_s * SECOND))
    metrics = [
        {"name": "megatron.training.loss", "unit": "1",
         "gauge": {"dataPoints": [{"timeUnixNano": at, "asDouble": 2.5}]}},
        {"name": "megatron.training.running", "unit": "1",
         "gauge": {"dataPoints": [{"timeUnixNano": at, "asInt": "1" if running else "0"}]}},
    ]  # fmt: skip
    request = {
        "resourceMetrics": [
            {
                "resource": resource,
                "scopeMetrics": [{"scope": {"name": "megatron"}, "metrics": metrics}],
            }
        ]
    }
    return json.dumps(request)


def beat(
    trace_path: Path, *times_s: float, running: bool = True, rank: int = 0, pid: int = 100
) -> Path:
    """Append heartbeats at ``times_s`` to the ``metrics.jsonl`` beside ``trace_path``."""
    path = trace_path.with_name("metrics.jsonl")
    with path.open("a") as file:
        for time_s in times_s:
            file.write(heartbeat_line(time_s, running, rank, pid) + "\n")
    return path


def with_waits(spans: list[dict], wait_s: float | Callable[[int], float]) -> list[dict]:
    """Add each finished iteration's gradient all-reduce wait: its last ``wait_s`` seconds
    (or ``wait_s(n)`` seconds of iteration ``n``)."""
    waits = []
    for it in spans:
        if it["name"] != "megatron.train.iteration":
            continue
        attributes = {kv["key"]: kv["value"] for kv in it["attributes"]}
        if "megatron.iteration" not in attributes or "megatron.span.cut_short" in attributes:
            continue
        end_s = int(it["endTimeUnixNano"]) / SECOND
        number = int(attributes["megatron.iteration"]["intValue"])
        waited = wait_s(number) if callable(wait_s) else wait_s
        waits.append(
            span(
                "megatron.grad_sync.finish",
                end_s - waited,
                end_s,
                parent=it,
                **{"megatron.iteration": number},
            )
        )
    return waits + spans


def slowed(spans: list[dict], factor: float, since: float) -> list[dict]:
    """The same spans with everything after ``since`` seconds ``factor`` times as slow: a
    time ``t`` past it moves to ``since + (t - since) * factor`` (a run whose iterations,
    saves and intervals slowed down from ``since`` on). New span dicts, the same ids."""

    def moved(ns: str) -> str:
        t = int(ns) / SECOND
        return str(round((since + (t - since) * factor if t > since else t) * SECOND))

    return [
        {
            **s,
            "startTimeUnixNano": moved(s["startTimeUnixNano"]),
            "endTimeUnixNano": moved(s["endTimeUnixNano"]),
        }
        for s in spans
    ]


def hang_record(
    parent: dict,
    at_s: float,
    last_progress_s: float,
    *,
    iteration: int,
    waiting: bool,
    last_iteration: int | None = None,
) -> dict:
    """The watchdog's ``megatron.hang`` span, under the span the rank stalled in."""
    attributes: dict[str, Any] = {
        "megatron.iteration": iteration,
        "megatron.hang.stalled_s": round(at_s - last_progress_s, 3),
        "megatron.hang.timeout_s": 1.0,
        "megatron.hang.last_progress_unix_nano": round(last_progress_s * SECOND),
        "megatron.hang.span": parent["name"],
        "megatron.hang.frame": "/x/fault_injection.py:70 in _hang"
        if not waiting
        else "/x/torch/autograd/graph.py:979 in _engine_run_backward",
        "megatron.hang.waiting": waiting,
        "megatron.hang.stacks": "Thread 1 (MainThread, the training thread) ...",
    }
    if last_iteration is not None:
        attributes["megatron.hang.last_iteration"] = last_iteration
    return span("megatron.hang", at_s, at_s, parent=parent, **attributes)


def hung(at: float, *, waiting: bool, end: float = 9.25, start: float = 0) -> list[dict]:
    """SIGTERM at ``end`` after a stall in iteration 3, which started at 5.25 s.

    Times are seconds from ``start`` (where the incarnation's startup begins).
    """
    spans = lifecycle(start, intervals=1, cut_short_after=1)
    in_flight = next(s for s in spans if "megatron.span.cut_short" in str(s["attributes"]))
    interval = spans[-1]
    for record in (in_flight, interval):
        record["endTimeUnixNano"] = str(round((start + end) * SECOND))
    hang = hang_record(
        in_flight, start + at, start + 5.25, iteration=3, waiting=waiting, last_iteration=2
    )
    return [*spans[:-2], hang, *spans[-2:]]
