"""The rules of ``megatron-trace check``: is this trace whole, and does it obey the span lifecycle?

Rules (each violation is one line naming the rule, span, trace and incarnation):

* ``startup``: every incarnation has exactly one ``megatron.startup`` (one
  killed before its startup span ended is reported as killed instead; one
  with no lifecycle span at all, the ``job`` group off, is a note saying
  which rules it could not check).
* ``interval-index``: its ``megatron.train`` intervals carry
  ``megatron.interval.index`` 0, 1, ... n in start order, without gaps.
* ``iteration-range``: ``first_iteration`` of C(k+1) is ``last_iteration``
  of C(k) + 1.

  Both need this project's own interval attributes and apply only where an
  interval carries them: Megatron-LM's ``megatron.train`` spans have none
  (``report`` derives the same facts from the spans inside the intervals,
  see :mod:`megatron.trace.model.intervals`).
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
in the file; one line per incarnation; an export that failed, on a full disk,
looks the same), one still running (the same, because its interval is still
open: :mod:`megatron.trace.analysis.liveness` tells the two apart; the line gives the
time of its newest record) and torn writes (one line each). Other damage
exits 2 naming the line (raised by the reader, handled by the CLI), and so do
files without a single span: nothing to check is not a whole trace.

Memory: ``check`` has to remember every span id to find duplicates: 8 bytes
each, sorted once with numpy (:mod:`megatron.trace._store.span_ids`), and from
:data:`~megatron.trace._store.span_ids.SPILL_FROM_IDS` ids on (262,144) in anonymous
temporary files instead, answered a partition at
a time, so their memory stops growing; beside them, the trace model's
structural spans and iterations. Spans a rule flags are looked
up again afterwards, so nothing is kept per span for the violation lines:
only the pieces of the files that hold a flagged line are read again, and
only those lines decoded (a killed incarnation's orphans cost a piece or two,
not a second pass over a week's file); duplicate ids, whose lines the ids do
not say, mean every piece.

Several files are scanned in parallel processes and their summaries merged
(:mod:`megatron.trace.otlp.parallel`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron.trace.analysis.liveness import Clock, judge, utc_text
from megatron.trace.model.builder import TraceBuilder
from megatron.trace.model.identity import process_key
from megatron.trace.model.incarnation import Incarnation, Trace
from megatron.trace.model.jobs import one_job
from megatron.trace.otlp.parallel import FilePiece, imap_files, map_files, pieces
from megatron.trace.otlp.reader import (
    DAMAGE_ERRORS,
    damaged,
    decode_line,
    iter_batches,
    iter_lines,
    paused_gc,
)
from megatron.trace_format.records import SpanRecord
from megatron.trace_format.semconv import (
    INTERVAL_FIRST_ITERATION,
    INTERVAL_INDEX,
    INTERVAL_LAST_ITERATION,
    INTERVAL_SPAN,
    ITERATION,
    STARTUP_SPAN,
)

if TYPE_CHECKING:
    from megatron.trace._store.span_ids import IdSet

__all__ = ["CheckResult", "check_files"]

_RULE_ORDER = {"duplicate-span-id": 0, "end-before-start": 1}


@dataclass
class CheckResult:
    """``violations`` make the exit status 1; ``notes`` (killed, torn) do not.

    ``reread``: the pieces of the files read a second time for the violation lines
    (module docstring), in read order: none for a whole trace, a piece or two for a
    killed incarnation's orphans, every piece when an id is duplicated.
    """

    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None
    reread: list[FilePiece] = field(default_factory=list)


@dataclass(slots=True)
class _Span:
    """What a violation line says of one span (kept only for the few a rule flags)."""

    name: str
    span_id: str
    trace_id: str
    parent_id: str
    file: Path
    line: int
    index: int  # position in its line
    start_ns: int
    process: tuple[Any, ...]

    @classmethod
    def of(cls, span: Any, process: tuple[Any, ...], path: Path, line: int, index: int) -> _Span:
        return cls(
            span.name,
            span.span_id,
            span.trace_id,
            span.parent_span_id,
            path,
            line,
            index,
            span.start_time_unix_nano,
            process,
        )


@dataclass
class _FileScan:
    """One piece's summary: the trace model's builder, its span ids, spans a rule flagged,
    and the piece itself, numbered (where its lines are, to read some of them again)."""

    builder: TraceBuilder
    ids: IdSet
    late: list[_Span]  # end-before-start, in file order
    piece: FilePiece


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


def _scan(piece: FilePiece) -> _FileScan:
    """The map step: one pass over one piece of a file (:func:`pieces`: in parallel)."""
    from megatron.trace._store.span_ids import IdCollector  # numpy: imported when it is needed

    builder, ids, late = TraceBuilder(), IdCollector(), []
    with paused_gc():
        for line in iter_batches(piece, builder.stats):
            builder.add_line(line)
            try:
                batches = line.batches
                spans = [span for batch in batches for span in batch.spans]
                ids.add(line.number, spans)
                if any(s.end_time_unix_nano < s.start_time_unix_nano for s in spans):
                    late.extend(_flagged(line.path, line.number, batches, _ends_early))
            except DAMAGE_ERRORS as error:
                raise damaged(line.path, line.number, error) from error
    return _FileScan(builder, ids.finish(piece.path), late, piece)


def _ends_early(span: Any) -> bool:
    return span.end_time_unix_nano < span.start_time_unix_nano


def _flagged(path: Path, number: int, batches: list[Any], rule: Any) -> list[_Span]:
    """The spans of one line for which ``rule(span)`` holds, with their positions."""
    found, index = [], 0
    for batch in batches:
        process = None
        for span in batch.spans:
            if rule(span):
                process = process or process_key(batch.resource, path)
                found.append(_Span.of(span, process, path, number, index))
            index += 1
    return found


def _parent_in(parents: set[str]) -> Any:
    return lambda span: span.parent_span_id.lower() in parents


def _id_in(ids: frozenset[str]) -> Any:
    return lambda span: span.span_id.lower() in ids


def _details(
    wanted: dict[int, set[str]], dups: frozenset[str], piece: FilePiece
) -> tuple[list[_Span], list[_Span]]:
    """Re-read one piece for the spans the ids flagged: (orphans, duplicate occurrences).

    Only the lines holding an orphan are decoded, and the piece is read only up
    to the last of them, unless there are duplicate ids (a broken file): then
    every line, to find each occurrence.
    """
    orphans: list[_Span] = []
    copies: list[_Span] = []
    path = piece.path
    last = max(wanted, default=0)  # without duplicates, nothing after it is wanted
    with paused_gc():
        for _, number, raw in iter_lines(piece):
            parents = wanted.get(number)
            if parents is None and not dups:
                if number > last:
                    break
                continue
            line = decode_line(path, number, raw)
            if line is None:
                continue
            if parents:
                orphans.extend(_flagged(path, number, line.batches, _parent_in(parents)))
            if dups:
                copies.extend(_flagged(path, number, line.batches, _id_in(dups)))
    return orphans, copies


def check_files(
    paths: Iterable[Path | str],
    clock: Clock | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
    job: str | None = None,
) -> CheckResult:
    """Check the files; raises ``TraceFileDamaged`` on damage (exit 2), and
    :class:`~megatron.trace.model.jobs.SeveralJobsError` for files holding several jobs
    unless ``job`` names one (then only its processes' spans are checked).

    Whether the last incarnations are still running is judged against
    ``clock`` (default: the system clock and the default staleness bound).
    Several files are scanned in ``jobs`` parallel processes (default: one
    per file, up to the cores) or on ``executor``, and merged in file order.
    """
    from megatron.trace._store.span_ids import ids_hex

    paths = list(paths)
    clock = clock or Clock.system()
    files = [Path(path) for path in paths]
    # folded as the pieces come in: only the merged summary is held, not every piece's
    scans = imap_files(_scan, pieces(files, jobs, count_lines=False), jobs, executor)
    first = next(scans)
    builder, ids, late, read = first.builder, first.ids, list(first.late), [first.piece]
    for scan in scans:
        builder, ids = builder.merge(scan.builder), ids.merge(scan.ids)
        late += scan.late
        read.append(scan.piece)
    result = CheckResult()
    trace = builder.finish()
    if trace.span_count:  # (no span: the caller says there is nothing to check)
        trace = one_job(trace, job)
    liveness = judge(trace, paths, clock)
    result.trace = trace
    labels = _process_labels(trace)
    order = {path: position for position, path in enumerate(files)}
    dups = frozenset(ids_hex(ids.dups))
    wanted = {path: ids.unresolved_lines(path) for path in dict.fromkeys(files)}  # once each
    ids.close()  # (the files of ids spilled to disk, when there were many)
    result.reread = _to_reread(read, wanted, dups)
    found = map_files(_DetailsOf(dups, wanted), result.reread, jobs, executor)
    # the job's spans alone (every span's, when the files hold one job)
    orphans = [span for file_orphans, _ in found for span in file_orphans]
    orphans = [span for span in orphans if span.process in trace.processes]
    copies = [span for _, file_copies in found for span in file_copies]
    copies = [span for span in copies if span.process in trace.processes]
    late = [span for span in late if span.process in trace.processes]
    per_span = [("end-before-start", span) for span in late]
    per_span += [("duplicate-span-id", span) for span in _repeats(copies, order)]
    per_span.sort(key=lambda item: (*_read_order(item[1], order), _RULE_ORDER[item[0]]))
    for rule, span in per_span:
        label = labels.get(span.process, ("?", None))[0]
        where = _where(span.name, span.span_id, span.trace_id, label, span.file, span.line)
        result.violations.append(f"{rule}: {where}")
    orphans.sort(key=lambda span: _read_order(span, order))
    explained = _missing_parents(orphans, builder, labels, result)
    first_saved = _first_saved(trace)
    first_start = min((inc.start_ns for inc in trace.incarnations), default=0)
    for inc in trace.incarnations:
        _check_incarnation(inc, first_saved, first_start, result, explained.get(id(inc), 0), clock)
    result.notes.extend(f"liveness: {note}" for note in liveness.notes)
    result.notes.extend(
        f"torn write: {torn.path}:{torn.line} (a write cut short: a killed process, or a "
        "failed write such as on a full disk), skipped"
        for torn in trace.stats.torn
    )
    return result


def _to_reread(
    read: list[FilePiece], wanted: dict[Path, dict[int, set[str]]], dups: frozenset[str]
) -> list[FilePiece]:
    """The pieces (as numbered by the scan) that hold a line :func:`_details` must decode:
    all of them when an id is duplicated, else those where a flagged line falls. A file
    given twice is read once, as its lines are flagged once."""
    read = list({(piece.path, piece.start): piece for piece in read}.values())
    if dups:
        return read
    firsts: dict[Path, list[int]] = {}
    for piece in read:  # each file's pieces come in line order
        firsts.setdefault(piece.path, []).append(piece.first_line)
    hit: set[tuple[Path, int]] = set()
    for path, lines in wanted.items():
        for number in lines:
            hit.add((path, firsts[path][bisect.bisect_right(firsts[path], number) - 1]))
    return [piece for piece in read if (piece.path, piece.first_line) in hit]


class _DetailsOf:
    """:func:`_details` for one piece, as a picklable callable (for the process pool)."""

    def __init__(self, dups: frozenset[str], wanted: dict[Path, dict[int, set[str]]]) -> None:
        self.dups = dups
        self.wanted = wanted

    def __call__(self, piece: FilePiece) -> tuple[list[_Span], list[_Span]]:
        return _details(self.wanted.get(piece.path, {}), self.dups, piece)


def _read_order(span: _Span, order: dict[Path, int]) -> tuple[int, int, int]:
    return order[span.file], span.line, span.index


def _repeats(copies: list[_Span], order: dict[Path, int]) -> list[_Span]:
    """Every occurrence of a duplicated id but its first, in read order."""
    copies.sort(key=lambda span: _read_order(span, order))
    seen: set[str] = set()
    repeats = []
    for span in copies:
        key = span.span_id.lower()
        if key in seen:
            repeats.append(span)
        seen.add(key)
    return repeats


def _process_labels(trace: Trace) -> dict[tuple[Any, ...], tuple[str, Incarnation]]:
    """Process key -> (label of its last incarnation, that incarnation)."""
    labels: dict[tuple[Any, ...], tuple[str, Incarnation]] = {}
    for inc in trace.incarnations:
        labels[inc.process] = (inc.label, inc)  # later incarnations overwrite earlier
    return labels


def _missing_parents(
    orphans: list[_Span],
    builder: TraceBuilder,
    labels: dict[tuple[Any, ...], tuple[str, Incarnation]],
    result: CheckResult,
) -> dict[int, int]:
    """Report children whose parent never appeared; count those a kill explains.

    Grouped by parent, parents in the order their first child was read.
    """
    by_parent: dict[str, list[_Span]] = {}
    for child in orphans:
        by_parent.setdefault(child.parent_id.lower(), []).append(child)
    explained: dict[int, int] = {}
    for children in by_parent.values():
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


def _first_saved(trace: Trace) -> dict[Any, int]:
    """Iteration a checkpoint save recorded -> start of the first incarnation that saved it."""
    first: dict[Any, int] = {}
    for inc in trace.incarnations:
        for save in inc.saves:
            iteration = save["attributes"].get(ITERATION)
            if inc.start_ns < first.get(iteration, math.inf):
                first[iteration] = inc.start_ns
    return first


def _check_incarnation(
    inc: Incarnation,
    first_saved: dict[Any, int],
    first_start: int,
    result: CheckResult,
    orphans: int,
    clock: Clock,
) -> None:
    violations = result.violations
    if inc.startup is None:
        open_part = "its startup"
    elif not inc.intervals and inc.goodput_time:
        open_part = "its in-flight iteration"  # no interval: Megatron-LM without checkpointing
    else:
        open_part = "its in-flight interval"
    if inc.ended == "killed":
        result.notes.append(
            f"killed: {inc.label}: {open_part} is missing (SIGKILL); {orphans} finished spans "
            "have no parent in the file (an export that failed, e.g. on a full disk, looks the "
            "same)"
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
    if inc.startup is None and not inc.intervals and not still_open:
        # Nothing of the lifecycle: the job span group was off. Say what is not checked.
        result.notes.append(
            f"not checked: {inc.label} has no {STARTUP_SPAN} or {INTERVAL_SPAN} span (the job "
            "span group was off), so the startup, interval and resume rules do not apply"
        )
        return
    if inc.startup is None and not still_open:
        first = min(
            itertools.chain(inc.intervals, inc.saves, inc.loads, inc.evaluations, inc.launch),
            key=lambda r: r["start_ns"],
            default=None,
        )
        where = _record_where(first, inc) if first else inc.label
        violations.append(f"startup: no {STARTUP_SPAN} for {where}")
    previous: SpanRecord | None = None
    for position, interval in enumerate(inc.intervals):
        # (where a violation is, is spelled out only for a violation: thousands of
        # intervals have none)
        index = interval["attributes"].get(INTERVAL_INDEX)
        if INTERVAL_INDEX in interval["attributes"] and index != position:
            violations.append(
                f"interval-index: index {index}, expected {position}: "
                + _record_where(interval, inc)
            )
        expected = previous if previous is not None else inc.startup
        if (
            expected is not None
            and (expected["trace_id"], expected["span_id"]) not in interval["links"]
        ):
            violations.append(
                f"interval-link: not linked to {expected['name']} {expected['span_id']}: "
                + _record_where(interval, inc)
            )
        if previous is not None:
            last = previous["attributes"].get(INTERVAL_LAST_ITERATION)
            first = interval["attributes"].get(INTERVAL_FIRST_ITERATION)
            if last is not None and first is not None and first != last + 1:
                violations.append(
                    f"iteration-range: first_iteration {first} after last_iteration {last}: "
                    + _record_where(interval, inc)
                )
        previous = interval
    _check_cut_short(inc, violations)
    _check_resume(inc, first_saved, first_start, violations)


def _check_cut_short(inc: Incarnation, violations: list[str]) -> None:
    starts = (r["start_ns"] for r in itertools.chain(inc.intervals, inc.saves, inc.evaluations))
    latest_start = max(starts, default=0)
    if inc.iterations:
        latest_start = max(latest_start, inc.iterations.max_start() or 0)
    for record in inc.cut_short:
        if latest_start > record["end_ns"]:
            violations.append(
                "cut-short: marked cut short but the incarnation went on after it: "
                + _record_where(record, inc)
            )


def _check_resume(
    inc: Incarnation, first_saved: dict[Any, int], first_start: int, violations: list[str]
) -> None:
    """The saves of the incarnations that started before this one: is its start among them?"""
    if inc.start_ns <= first_start:
        return  # nothing started earlier
    start = inc.resumed_from if inc.resumed_from is not None else inc.first_iteration
    if not start:
        return  # it started afresh
    if first_saved.get(start, math.inf) < inc.start_ns:
        return
    saved = sorted(i for i, at in first_saved.items() if at < inc.start_ns and i is not None)
    record = (inc.loads or inc.intervals or [inc.startup])[0]
    where = _record_where(record, inc) if record is not None else inc.label
    violations.append(
        f"resume: starts at iteration {start}, which no earlier checkpoint save "
        f"recorded (saved: {saved}): {where}"
    )
