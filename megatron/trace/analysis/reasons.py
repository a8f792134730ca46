"""Why a figure is only bounded, kept as data until the report is rendered.

A bound's ``reason`` is a :class:`Reason`: its clauses, each one statement with the rank
and incarnation it is about; those that rest on a killed incarnation's metric points
(:class:`Shown`) apart, naming the export. A bound narrowed by more than the spans has a
``source``, a :class:`Source`: whose last metric exports. The report's text and JSON
renderers turn them into words, each with :func:`reason_text` and :func:`source_text`, and
the text prints each reason once, leaving out one another says whole
(:func:`reasons_once`): a rank's wasted-iterations reason names some of the metric exports
the job's names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from megatron.trace_format.words import counted

__all__ = [
    "Clause",
    "Reason",
    "Shown",
    "Source",
    "reason_text",
    "reasons_once",
    "source_of_shown",
    "source_text",
]


@dataclass(frozen=True)
class Clause:
    """One statement of a reason, naming what it is about itself (``text``); ``rank`` and
    ``incarnation`` say which, where it is about one."""

    text: str
    rank: int | str | None = None
    incarnation: int | None = None


@dataclass(frozen=True)
class Shown:
    """A killed incarnation whose last metric export shows more iterations completed than
    its spans: at least ``wasted`` past the iteration its successor resumed from."""

    incarnation: int
    rank: int | str | None  # named where the job has several ranks
    wasted: int
    export: str  # when that export was: "7.5 s after its last exported span and at most ..."
    metric: str  # the metric that says it
    completed: int
    horizon: int  # where its successor resumed


@dataclass(frozen=True)
class Reason:
    """Why a figure is a bound: its clauses, then what metric points show (``shown``)."""

    clauses: tuple[Clause, ...]
    shown: tuple[Shown, ...] = ()

    @classmethod
    def of(cls, *texts: str, rank: int | str | None = None) -> Reason:
        return cls(tuple(Clause(text, rank) for text in texts))


@dataclass(frozen=True)
class Source:
    """Where a bound narrowed by more than the spans comes from: the last metric exports of
    ``incarnations`` (on ``ranks`` ranks); ``export`` when the one export was; ``named``:
    the words name the incarnation (the figure's line does not); ``own``: the figure is
    that incarnation's own (a final one's wall clock)."""

    incarnations: tuple[int, ...]
    ranks: int = 1
    export: str | None = None
    named: bool = True
    own: bool = False


def _shown_text(one: Shown) -> str:
    on = "" if one.rank is None else f" on rank {one.rank}"
    return (
        f"incarnation {one.incarnation}{on}: ≥ {one.wasted} (its metric export {one.export}: "
        f"{one.metric} says {counted(one.completed, 'iteration')} completed, its successor "
        f"resumed from {one.horizon})"
    )


def reason_text(reason: Reason) -> str:
    """A reason as a person reads it: its clauses, then what the metric points show."""
    text = "; ".join(dict.fromkeys(clause.text for clause in reason.clauses))
    if reason.shown:
        text += "; their metric points show more: " + "; ".join(
            dict.fromkeys(_shown_text(one) for one in reason.shown)
        )
    return text


def _several(indices: Iterable[int]) -> str:
    """Some killed incarnations: named while they are few, counted when a long history has
    many (the reasons name them)."""
    indices = list(indices)
    if len(indices) <= 4:
        return f"incarnations {indices}"
    return f"{len(indices)} killed incarnations"


def source_text(source: Source) -> str:
    """A source in a few words, as the text prints it beside its figure."""
    if source.own:
        return f"its last metric export, {source.export}"
    (first, *more) = source.incarnations
    if more:
        return f"the last metric exports of {_several(source.incarnations)}"
    if source.ranks > 1:
        return f"the last metric exports of incarnation {first} on {source.ranks} ranks"
    if not source.named:
        return f"the last metric export {source.export}"
    return f"the last metric export of incarnation {first}" + (
        f", {source.export}" if source.export else ""
    )


def source_of_shown(shown: Iterable[Shown]) -> Source | None:
    """The source of a wasted-iterations bound: the exports its metric points were read from."""
    found = list(dict.fromkeys(shown))
    if not found:
        return None
    incarnations = tuple(dict.fromkeys(one.incarnation for one in found))
    if len(found) == 1:
        return Source(incarnations, export=found[0].export, named=False)
    return Source(incarnations, ranks=len(found) if len(incarnations) == 1 else 1)


def reasons_once(reasons: Iterable[Reason]) -> list[Reason]:
    """Each reason once, in order, less one another says whole (all its clauses and all
    it shows are among the other's)."""
    unique = list(dict.fromkeys(reasons))
    return [
        reason
        for reason in unique
        if not any(
            other != reason
            and set(reason.clauses) <= set(other.clauses)
            and set(reason.shown) <= set(other.shown)
            for other in unique
        )
    ]
