"""``megatron-trace check``: is this trace whole, and does it obey the span lifecycle?

Rules (each violation is one line naming the rule, span, trace and incarnation):

* ``startup``: every incarnation has exactly one ``megatron.startup`` (one
  killed before its startup span ended is reported as killed instead).
* ``interval-index``: its ``megatron.train`` intervals carry
  ``megatron.interval.index`` 0, 1, ... n in start order, without gaps.
* ``iteration-range``: ``first_iteration`` of C(k+1) is ``last_iteration``
  of C(k) + 1.

  Both need this project's own interval attributes and apply only where an
  interval carries them: Megatron-LM's ``megatron.train`` spans have none
  (``report`` derives the same facts from the spans inside the intervals,
  see :mod:`megatron.trace.intervals`).
* ``interval-link``: C0 links to the startup span, C(k) to C(k-1).
* ``duplicate-span-id``: no span id appears twice.
* ``missing-parent``: every parent is in the files.
* ``end-before-start``: ``end >= start``.
* ``cut-short``: a span marked ``megatron.span.cut_short`` is at the end of its
  incarnation (nothing of the incarnation starts after it ended).
* ``resume``: an incarnation that follows another and starts past iteration 0
  starts at an iteration a checkpoint save of an earlier incarnation recorded.

Facts, not violations (exit status stays 0): an incarnation killed by SIGKILL
(its in-flight interval is missing and its finished children have no parent
in the file; one line per incarnation), one still running (the same, because
its interval is still open: :mod:`megatron.trace.liveness` tells the two
apart; the line gives the time of its newest record) and torn writes (one
line each). Other damage exits 2 naming the line (raised by the reader,
handled by the CLI).

Memory: the span ids seen (one int each) and the children still waiting for
their parent; ``check`` has to remember every id to find duplicates.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron.core.telemetry.reader import iter_spans
from megatron.core.telemetry.records import SpanRecord
from megatron.core.telemetry.semconv import (
    INTERVAL_FIRST_ITERATION,
    INTERVAL_INDEX,
    INTERVAL_LAST_ITERATION,
    ITERATION,
    STARTUP_SPAN,
)
from megatron.trace.command import add_command
from megatron.trace.liveness import Clock, judge, utc_text
from megatron.trace.model import Incarnation, Trace, TraceBuilder, process_of

__all__ = ["CheckResult", "add_parser", "check_files"]


@dataclass
class CheckResult:
    """``violations`` make the exit status 1; ``notes`` (killed, torn) do not."""

    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None


@dataclass(slots=True)
class _Child:
    name: str
    span_id: str
    trace_id: str
    parent_id: str
    file: Path
    line: int
    start_ns: int
    process: tuple[Any, ...]


def _where(name: str, span_id: str, trace_id: str, label: str, file: Path, line: int) -> str:
    return f"span {name} {span_id} trace {trace_id} in {label} ({file}:{line})"


def _record_where(record: SpanRecord, inc: Incarnation) -> str:
    return _where(
        record["name"],
        record["span_id"],
        record["trace_id"],
        inc.label,
        record["file"],
        record["line"],
    )


def check_files(paths: Iterable[Path | str], clock: Clock | None = None) -> CheckResult:
    """Check the files; raises ``TraceFileDamaged`` on damage (exit 2).

    Whether the last incarnations are still running is judged against
    ``clock`` (default: the system clock and the default staleness bound).
    """
    paths = list(paths)
    clock = clock or Clock.system()
    builder = TraceBuilder()
    result = CheckResult()
    seen: set[int] = set()
    waiting: dict[int, list[_Child]] = {}  # parent id -> children read before it
    per_span: list[tuple[str, dict[str, Any]]] = []
    for span in iter_spans(paths, builder.stats):
        builder.add(span)
        span_id = int(span["span_id"], 16)
        if span_id in seen:
            per_span.append(("duplicate-span-id", span))
        seen.add(span_id)
        waiting.pop(span_id, None)
        if span["end_ns"] < span["start_ns"]:
            per_span.append(("end-before-start", span))
        parent = span["parent_id"]
        if parent is not None and int(parent, 16) not in seen:
            child = _Child(
                span["name"],
                span["span_id"],
                span["trace_id"],
                parent,
                span["file"],
                span["line"],
                span["start_ns"],
                process_of(span),
            )
            waiting.setdefault(int(parent, 16), []).append(child)
    trace = builder.finish()
    liveness = judge(trace, paths, clock)
    result.trace = trace
    labels = _process_labels(trace)
    for rule, span in per_span:
        label = labels.get(process_of(span), ("?", None))[0]
        where = _where(
            span["name"], span["span_id"], span["trace_id"], label, span["file"], span["line"]
        )
        result.violations.append(f"{rule}: {where}")
    orphans = _missing_parents(waiting, builder, labels, result)
    for inc in trace.incarnations:
        _check_incarnation(inc, trace, result, orphans.get(id(inc), 0), clock)
    result.notes.extend(f"liveness: {note}" for note in liveness.notes)
    result.notes.extend(
        f"torn write: {torn.path}:{torn.line} (a write cut short by a killed process), skipped"
        for torn in trace.stats.torn
    )
    return result


def _process_labels(trace: Trace) -> dict[tuple[Any, ...], tuple[str, Incarnation]]:
    """Process key -> (label of its last incarnation, that incarnation)."""
    labels: dict[tuple[Any, ...], tuple[str, Incarnation]] = {}
    for inc in trace.incarnations:
        labels[inc.process] = (inc.label, inc)  # later incarnations overwrite earlier
    return labels


def _missing_parents(
    waiting: dict[int, list[_Child]],
    builder: TraceBuilder,
    labels: dict[tuple[Any, ...], tuple[str, Incarnation]],
    result: CheckResult,
) -> dict[int, int]:
    """Report children whose parent never appeared; count those a kill explains."""
    explained: dict[int, int] = {}
    for children in waiting.values():
        for child in children:
            label, inc = labels.get(child.process, ("?", None))
            root_end = builder.root_end(child.process)
            gone = inc is not None and inc.ended in ("killed", "running")
            if gone and child.start_ns >= root_end:
                explained[id(inc)] = explained.get(id(inc), 0) + 1
                continue
            where = _where(child.name, child.span_id, child.trace_id, label, child.file, child.line)
            result.violations.append(f"missing-parent: {where}: parent {child.parent_id}")
    return explained


def _check_incarnation(
    inc: Incarnation, trace: Trace, result: CheckResult, orphans: int, clock: Clock
) -> None:
    violations = result.violations
    open_part = "its startup" if inc.startup is None else "its in-flight interval"
    if inc.ended == "killed":
        result.notes.append(
            f"killed: {inc.label}: {open_part} is missing (SIGKILL); "
            f"{orphans} finished spans have no parent in the file"
        )
    if inc.ended == "running" and inc.as_of_ns is not None:
        age = (clock.now_ns - inc.as_of_ns) / 1e9
        result.notes.append(
            f"running: {inc.label}: still running as of {utc_text(inc.as_of_ns)} (its newest "
            f"record, {age:.1f} s before now; bound {clock.stale_after_ns / 1e9:g} s); "
            f"{open_part} is still open, so not in the file yet; "
            f"{orphans} finished spans wait for their parent"
        )
    still_open = inc.ended in ("killed", "running") and not inc.intervals
    if inc.startup is None and not still_open:
        first = min(
            (*inc.intervals, *inc.saves, *inc.loads, *inc.evaluations, *inc.launch),
            key=lambda r: r["start_ns"],
            default=None,
        )
        where = _record_where(first, inc) if first else inc.label
        violations.append(f"startup: no {STARTUP_SPAN} for {where}")
    previous: SpanRecord | None = None
    for position, interval in enumerate(inc.intervals):
        where = _record_where(interval, inc)
        index = interval["attributes"].get(INTERVAL_INDEX)
        if INTERVAL_INDEX in interval["attributes"] and index != position:
            violations.append(f"interval-index: index {index}, expected {position}: {where}")
        expected = previous if previous is not None else inc.startup
        if (
            expected is not None
            and (expected["trace_id"], expected["span_id"]) not in interval["links"]
        ):
            violations.append(
                f"interval-link: not linked to {expected['name']} {expected['span_id']}: {where}"
            )
        if previous is not None:
            last = previous["attributes"].get(INTERVAL_LAST_ITERATION)
            first = interval["attributes"].get(INTERVAL_FIRST_ITERATION)
            if last is not None and first is not None and first != last + 1:
                violations.append(
                    f"iteration-range: first_iteration {first} after last_iteration {last}: {where}"
                )
        previous = interval
    _check_cut_short(inc, violations)
    _check_resume(inc, trace, violations)


def _check_cut_short(inc: Incarnation, violations: list[str]) -> None:
    starts = [r["start_ns"] for r in (*inc.intervals, *inc.saves, *inc.evaluations)]
    if inc.iterations:
        starts.append(max(inc.iterations.starts))
    latest_start = max(starts, default=0)
    for record in inc.cut_short:
        if latest_start > record["end_ns"]:
            violations.append(
                "cut-short: marked cut short but the incarnation went on after it: "
                + _record_where(record, inc)
            )


def _check_resume(inc: Incarnation, trace: Trace, violations: list[str]) -> None:
    earlier = [other for other in trace.incarnations if other.start_ns < inc.start_ns]
    start = inc.resumed_from if inc.resumed_from is not None else inc.first_iteration
    if not earlier or not start:
        return
    saved = {save["attributes"].get(ITERATION) for other in earlier for save in other.saves}
    if start not in saved:
        record = (inc.loads or inc.intervals or [inc.startup])[0]
        where = _record_where(record, inc) if record is not None else inc.label
        violations.append(
            f"resume: starts at iteration {start}, which no earlier checkpoint save "
            f"recorded (saved: {sorted(i for i in saved if i is not None)}): {where}"
        )


def run(args: argparse.Namespace) -> int:
    result = check_files(args.files, Clock.from_args(args))
    for line in result.notes:
        print(line)
    for line in result.violations:
        print(line)
    trace = result.trace
    assert trace is not None
    print(
        f"{'FAILED' if result.violations else 'ok'}: {trace.span_count} spans, "
        f"{len(trace.incarnations)} incarnations on {len(trace.ranks)} ranks, "
        f"{len(result.violations)} violations"
    )
    return 1 if result.violations else 0


def add_parser(subparsers: Any) -> None:
    add_command(
        subparsers,
        "check",
        "verify the span lifecycle's invariants (exit 1 on a violation)",
        # not __doc__, which python -OO strips
        "``megatron-trace check``: is this trace whole, and does it obey the span lifecycle?",
        run,
    )
