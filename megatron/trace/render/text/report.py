"""The text of ``megatron-trace report``: the report's figures as a few lines to read.

The figures are :func:`megatron.trace.analysis.goodput.build_report`'s; this
module only lays them out.
"""

from __future__ import annotations

from typing import Any

from megatron.trace.analysis.reasons import reason_text, reasons_once, source_text
from megatron.trace_format.words import counted

__all__ = ["bound_text", "duration_label", "format_report"]

_PRINTED_ANOMALIES = 5  # the slowest iterations the text names (the JSON lists 20)


def bound_text(value: float | None, bound: dict[str, Any] | None, spec: str = ".3f") -> str:
    """A figure as the text prints it: the figure, or its bound said as one (``≥ 35``,
    ``35–41``, ``≤ 3``, ``?`` when unbounded both ways)."""
    if bound is None:
        return "?" if value is None else f"{value:{spec}}"
    lower, upper = bound["lower"], bound["upper"]
    if lower is not None and upper is not None:
        if f"{lower:{spec}}" == f"{upper:{spec}}":
            return f"{lower:{spec}}"
        return f"{lower:{spec}}–{upper:{spec}}"
    if lower is not None:
        return f"≥ {lower:{spec}}"
    if upper is not None:
        return f"≤ {upper:{spec}}"
    return "?"


def _source(bound: dict[str, Any] | None) -> str:
    """`` (where the bound comes from)`` after a bound narrowed by more than the spans (the
    killed incarnations' metric points), else nothing."""
    source = (bound or {}).get("source")
    return f" ({source_text(source)})" if source else ""


def format_report(report: dict[str, Any]) -> str:
    """The report as a few human-readable lines."""
    wall = report["wall_s"]
    bounds = report.get("bounds", {})
    paths = {
        "wall clock": "wall_s",
        "goodput": "goodput_s",
        **{name: f"badput_s.{name}" for name in report["badput_s"]},
    }
    values = {
        "wall clock": wall,
        "goodput": report["goodput_s"],
        **dict(report["badput_s"].items()),
    }
    texts = {name: bound_text(values[name], bounds.get(path)) for name, path in paths.items()}
    # the seconds column: as wide as its widest figure needs, with two spaces before it,
    # so a long category name never runs into a large figure
    width = max(10, 2 + max(len(text) for name, text in texts.items() if values[name] is not None))
    wall_known = "wall_s" not in bounds

    def share(name: str) -> str:
        seconds, bound = values[name], bounds.get(paths[name])
        if bound is None and wall_known:
            percent = f"{100 * seconds / wall if wall else 0:5.1f} %"
        elif name == "wall clock":
            percent = "100.0 %" if wall_known else "    ? %"
        elif wall_known and wall:
            scaled = {
                side: None if bound[side] is None else 100 * bound[side] / wall
                for side in ("lower", "upper")
            }
            percent = f"{bound_text(None, {**scaled, 'reason': ''}, '.1f'):>5} %"
        else:
            percent = "    ? %"
        return f"{texts[name]:>{width}} s  {percent}"

    lines = []
    if report.get("running"):
        age = report.get("as_of_age_s")
        lines.append(
            f"running: figures as of {report['as_of']} (the newest record"
            + (f", {age:.1f} s before now)" if age is not None else ")")
        )
    lines += [
        f"{'wall clock':<17}{share('wall clock')}"
        f"   (rank {report['rank']}, {counted(report['spans'], 'span')})"
        + _source(bounds.get("wall_s")),
        f"{'goodput':<17}{share('goodput')}",
        "badput:",
    ]
    lines += [
        f"  {name:<15}{share(name) if s is not None else '  not computed (see below)'}"
        + _source(bounds.get(paths[name]))
        for name, s in report["badput_s"].items()
    ]
    lines += _window_lines(report)
    lines.append(
        "wasted iterations: "
        + bound_text(report["wasted_iterations"], bounds.get("wasted_iterations"), "d")
        + _source(bounds.get("wasted_iterations"))
    )
    lines.append("incarnations:")
    for inc in report["incarnations"]:
        at = f"incarnations.{inc['index']}."
        startup = f"{inc['startup_s']:.3f} s" if inc["startup_s"] is not None else "-"
        first, last = inc["first_iteration"], inc["last_iteration"]
        if first is None and last is None:
            trained = "no iterations"
        else:  # a bound the spans could not give is "?" (see not computed)
            ends = ["?" if end is None else str(end) for end in (first, last)]
            trained = f"iterations {ends[0]}..{ends[1]}"
        resumed = bounds.get(at + "resumed_from")
        if inc["resumed_from"] is not None or resumed is not None:  # None alone: afresh
            trained += f", resumed from {bound_text(inc['resumed_from'], resumed, 'd')}"
        ended = inc["ended"] + (f" ({inc['error_type']})" if inc.get("error_type") else "")
        wasted = bound_text(inc["wasted_iterations"], bounds.get(at + "wasted_iterations"), "d")
        cycle = f"cycle {inc['cycle']} of pid {inc['pid']}: " if inc["cycle"] is not None else ""
        gap = ""
        if inc["restart_gap_s"] is not None:
            gap_bound = bounds.get(at + "restart_gap_s")
            gap = f"  restart gap {bound_text(inc['restart_gap_s'], gap_bound)} s"
        lines.append(
            f"  {inc['index']}: {cycle}{ended:<9} {trained}"
            f"  startup {startup}  intervals {inc['intervals']}"
            f"  wasted {wasted} it / {bound_text(inc['wasted_s'], bounds.get(at + 'wasted_s'))} s"
            + gap
            + _source(bounds.get(at + "wasted_iterations"))
        )
        if inc.get("as_of"):
            lines.append(
                f"     as of {inc['as_of']}; in flight {inc['in_flight_s']:.3f} s since the last "
                "span written (not in the file yet)"
            )
    stats = report["iterations"]
    if stats:
        anomalous = stats["anomalous"]
        count = bound_text(stats["count"], bounds.get("iterations.count"), "d")
        lines.append(
            f"iterations: {count}  median {stats['median_ms']} ms  "
            f"p90 {stats['p90_ms']} ms  max {stats['max_ms']} ms  "
            f"anomalous: {'?' if anomalous['count'] is None else anomalous['count']} over "
            f"{anomalous['threshold_ms']} ms"
        )
        lines.append(f"  anomaly rule: {anomalous['rule']}")
        if anomalous["slowest"]:
            slowest = ", ".join(
                f"{a['iteration']} ({a['duration_ms']} ms)"
                for a in anomalous["slowest"][:_PRINTED_ANOMALIES]
            )
            lines.append(f"  slowest: {slowest}")
    lines += _advice_lines(report)
    if len(report["ranks"]) > 1:
        lines.append("ranks:")
        lines += [_rank_line(r, bounds) for r in report["ranks"]]
    lines += _straggler_lines(report)
    lines += _hang_lines(report)
    if report["torn_lines"]:
        lines.append(f"torn lines skipped: {report['torn_lines']}")
    lines += [f"not computed: {reason}" for reason in report["not_computed"]]
    reasons = reasons_once(bound["reason"] for bound in bounds.values())
    lines += [f"bounded: {reason_text(reason)}" for reason in reasons]
    liveness = report.get("liveness")
    if liveness is not None and (report.get("running") or liveness["notes"]):
        lines.append(f"liveness rule: {liveness['rule']}")
        lines += [f"liveness: {note}" for note in liveness["notes"]]
    return "\n".join(lines)


def _rank_line(entry: dict[str, Any], bounds: dict[str, Any]) -> str:
    at = f"ranks.{entry['rank']}."
    fraction = bounds.get(at + "goodput_fraction")
    if fraction is not None:
        fraction = {
            **fraction,
            **{
                side: None if fraction[side] is None else 100 * fraction[side]
                for side in ("lower", "upper")
            },
        }
    line = (
        f"  rank {entry['rank']}: wall {bound_text(entry['wall_s'], bounds.get(at + 'wall_s'))} s  "
        f"goodput {bound_text(100 * entry['goodput_fraction'], fraction, '.1f')} %"
    )
    wasted = bounds.get(at + "wasted_iterations")
    if wasted is not None:
        line += f"  wasted {bound_text(entry['wasted_iterations'], wasted, 'd')} it"
    if entry.get("score") is not None:
        line += (
            f"  work {entry['work_ms_median']:.1f} ms"
            f" (quartiles {entry['work_ms_q1']:.1f}-{entry['work_ms_q3']:.1f})"
            f"  wait {entry['wait_ms_median']:.1f} ms"
            f"  score {entry['score']:.2f}{'  STRAGGLER' if entry['straggler'] else ''}"
        )
    return line


def _straggler_lines(report: dict[str, Any]) -> list[str]:
    found = report.get("stragglers")
    if found is None:
        return []
    names = ", ".join(f"rank {rank}" for rank in found["ranks"]) or "none"
    lines = [f"stragglers: {names}  (rule: {found['rule']})"]
    within = found["within_spread"]
    if within:
        lines.append(
            f"  not named, within the ranks' spread (score under {found['score_threshold']:g}, "
            "lower quartile not above the fastest rank "
            f"{found['fastest_rank']}'s upper quartile, {found['fastest_work_ms_q3']:.1f} ms): "
            + ", ".join(f"rank {rank}" for rank in within)
        )
    lines.append(
        "time lost waiting for the stragglers: "
        f"{bound_text(report['straggler_s'], report.get('bounds', {}).get('straggler_s'))} s"
    )
    return lines


def _hang_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for hang in report.get("hangs", []):
        role = "culprit, stopped in its own work" if hang["culprit"] else "waiting for others"
        last = hang["last_iteration"]
        lines.append(
            f"hang: rank {hang['rank']} incarnation {hang['incarnation']}: "
            f"{hang['stalled_s']:.3f} s without progress after iteration "
            f"{'(none)' if last is None else last}, in {hang['span'] or '?'} at "
            f"{hang['frame']} ({role}; ended {hang['ended']})"
        )
    for stall in report.get("recovered_stalls", []):
        lines.append(
            f"recovered stall: rank {stall['rank']} incarnation {stall['incarnation']}: "
            f"{stall['stalled_s']} s before iteration {stall['iteration']} finished"
        )
    return lines


def _window_lines(report: dict[str, Any]) -> list[str]:
    windows = report.get("windows")
    if windows is None:
        return []
    lines = [
        f"per window of {duration_label(windows['window_s'])} from the wall clock's start: "
        "goodput, iterations ended in it, the largest badput"
    ]
    bounds = report.get("bounds", {})
    rows = []
    for entry in windows["entries"]:
        at = f"windows.entries.{entry['index']}."
        fraction = bounds.get(at + "goodput_fraction")
        if fraction is not None:  # a bounded window's share, as per cents
            fraction = {
                side: None if fraction[side] is None else 100 * fraction[side]
                for side in ("lower", "upper")
            }
        share = bound_text(100 * entry["goodput_fraction"], fraction, ".1f")
        rows.append((entry, share, bound_text(entry["goodput_s"], bounds.get(at + "goodput_s"))))
    # as wide as the widest figure, so a bounded window's range keeps the columns
    share_width = max(5, *(len(share) for _, share, _ in rows))
    good_width = max(10, *(len(good) for _, _, good in rows))
    for entry, share, good in rows:
        wall = entry["wall_s"]
        top = ", ".join(
            f"{name} {100 * entry['badput_s'][name] / wall if wall else 0:.1f} %"
            for name in entry["top_badput"]
        )
        lines.append(
            f"  {entry['start']}  +{duration_label(entry['start_s']):<9}"
            f"  goodput {share:>{share_width}} %"
            f"  {good:>{good_width}} s of {wall:.3f} s"
            + _window_iterations(entry)
            + (f"   {top}" if top else "")
        )
    return lines


_UNITS_S = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def duration_label(seconds: float) -> str:
    """A duration as the text labels a window and its offset: ``5400`` -> ``1h30m``,
    ``70`` -> ``1m10s``, ``30`` -> ``30s``, ``0.25`` -> ``250ms``, ``0`` -> ``0s``: from a
    minute on, whole units to the second (as ``--window`` and ``--since`` are written),
    never a fraction of a minute."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:.4g}ms"
    if seconds < 60:
        return f"{seconds:.4g}s"
    left, parts = round(seconds), []
    for unit, size in _UNITS_S:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)


def _window_iterations(entry: dict[str, Any]) -> str:
    count, mean = entry["iterations"], entry["iteration_mean_ms"]
    if count is None:
        return ""
    return f"  {count:6d} it" + (f", mean {mean:8.1f} ms" if mean is not None else " " * 19)


def _advice_lines(report: dict[str, Any]) -> list[str]:
    advice = report.get("checkpoint_advice")
    if advice is None:
        return []

    def figure(value: float | None, unit: str, spec: str = ".3f") -> str:
        return "?" if value is None else f"{value:{spec}} {unit}"

    source = {"observed": "observed", "option": "--mtbf"}.get(advice["mtbf_source"] or "", "")
    saves, failures = advice["saves"], advice["failures"]
    bounds = report.get("bounds", {})

    def bounded(key: str, unit: str = "s") -> str:  # a figure a hidden restart may change
        bound = bounds.get(f"checkpoint_advice.{key}")
        return figure(advice[key], unit) if bound is None else f"{bound_text(None, bound)} {unit}"

    failed = counted(failures, "failure")
    if "checkpoint_advice.failures" in bounds:
        failed = f"≥ {failed}"
    lines = [
        f"checkpoint interval: save {figure(advice['save_s'], 's')} "
        f"({counted(saves, 'save')}), {failed} in {bounded('run_s')}, "
        f"mean time between failures {bounded('mtbf_s')}{f' ({source})' if source else ''}, "
        f"restart {bounded('restart_s')}"
    ]
    for name in ("now", "young", "daly", "availability"):
        choice = advice.get(name)
        if choice is None:
            lines.append(f"  {name:<12} ?")
            continue
        every = (
            "? iterations"
            if choice["iterations"] is None
            else counted(choice["iterations"], "iteration")
        )
        lines.append(
            f"  {name:<12} every {every} ({choice['interval_s']:.3f} s of training): "
            f"badput {figure(choice['badput_per_day_s'], 's', '.1f')} a day"
        )
    model = advice.get("badput_model")
    if model is not None:
        lines.append(
            "  badput a day by "
            + (
                "Young's first-order model"
                if model == "young"
                else "the exact model of random failures (Young's does not hold here)"
            )
        )
    lines += [f"  not computed: {reason}" for reason in advice["not_computed"]]
    return lines
