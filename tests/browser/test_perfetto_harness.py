"""The Perfetto harness itself: it sees what Perfetto's importer keeps, and what it drops.

A harness that always reported "no errors" would make every Perfetto test
pass; these files have a known fate in Perfetto's JSON importer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfetto_harness import open_trace, perfetto_version

T = 1_800_000_000_000_000  # epoch microseconds, as the trace-event format counts


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def complete(name: str, ts: int, dur: int, tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 3, "tid": tid}


def test_the_served_ui_is_perfetto_v52() -> None:
    assert perfetto_version().startswith("v52.")


def test_a_clean_file_loads_every_slice_with_exact_integer_timestamps(
    browser, perfetto, tmp_path
) -> None:
    path = write(
        tmp_path / "clean.json",
        [complete("outer", T, 10), complete("inner", T + 2, 3), complete("next", T + 10, 5)],
    )
    trace = open_trace(browser, perfetto, path)
    try:
        assert trace.import_errors() == []
        rows = trace.query("select name, ts, dur, depth from slice order by ts, depth")
        # ts in ns, past 2**53: exact only if the harness keeps BigInt as int.
        assert rows == [
            {"name": "outer", "ts": T * 1000, "dur": 10_000, "depth": 0},
            {"name": "inner", "ts": (T + 2) * 1000, "dur": 3_000, "depth": 1},
            {"name": "next", "ts": (T + 10) * 1000, "dur": 5_000, "depth": 0},
        ]
        assert trace.scalar("select count(*) from thread where tid = 7") == 1
    finally:
        trace.close()


def test_an_overlapping_slice_is_dropped_and_counted_as_an_import_error(
    browser, perfetto, tmp_path
) -> None:
    path = write(tmp_path / "overlap.json", [complete("a", T, 10), complete("b", T + 5, 10)])
    trace = open_trace(browser, perfetto, path)
    try:
        errors = {row["name"]: row["value"] for row in trace.import_errors()}
        assert errors == {"slice_drop_overlapping_complete_event": 1}
        assert trace.scalar("select count(*) from slice") == 1
    finally:
        trace.close()


def test_the_exports_time_text_is_nanosecond_exact_for_weeks_after_its_origin(
    browser, perfetto, tmp_path
) -> None:
    # What export writes: exact decimal microseconds after the origin (render.chrome).
    from megatron.trace.render.export.chrome import micros as _micros

    day = 86_400 * 10**9
    starts = [45 * day + 123_456_789 + 7 * k for k in range(50)]  # 45 days in, odd ns
    events = ",".join(
        f'{{"ph":"X","name":"s{k}","ts":{_micros(t)},"dur":{_micros(3)},"pid":3,"tid":7}}'
        for k, t in enumerate(starts)
    )
    path = tmp_path / "late.json"
    path.write_text('{"traceEvents":[' + events + "]}")
    trace = open_trace(browser, perfetto, path)
    try:
        rows = trace.query("select name, ts, dur from slice order by ts")
        assert [(r["ts"], r["dur"]) for r in rows] == [(t, 3) for t in starts]
    finally:
        trace.close()
