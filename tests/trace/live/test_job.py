"""``watch``'s figures stay ``report``'s while it keeps what earlier scrapes worked out.

A scrape costs what changed since the last one, not the job's history: the
model places only the records added since (:meth:`TraceBuilder.finish` called
again), the accounting keeps the time that can no longer change. Whatever is
kept, each scrape must give exactly what a :class:`LiveJob` fed the same bytes
in one go gives, and the last one what ``report --json`` prints. Here the
files grow in many uneven chunks that cut lines in two, with a scrape after
each, against a clock that follows the job (running), lags past the staleness
bound (stalled) or comes long after (killed, finished).
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
import synthetic
import tracegen as g
import upstream_traces as up

from megatron.trace.analysis.liveness import Clock
from megatron.trace.analysis.stragglers import find_stragglers
from megatron.trace.cli.main import main
from megatron.trace.live import stragglers
from megatron.trace.live.follow import Follower
from megatron.trace.live.job import LiveJob, Snapshot

_END = re.compile(rb'"endTimeUnixNano":\s*"?(\d+)')
STALE_S = 30.0


def _chunks(data: bytes, count: int, seed: int) -> Iterator[bytes]:
    """``data`` in about ``count`` pieces of uneven sizes (most cut a line in two)."""
    rng = random.Random(seed)
    mean = max(1, len(data) // count)
    at = 0
    while at < len(data):
        size = max(1, int(rng.expovariate(1 / mean)))
        yield data[at : at + size]
        at += size


def _clock(scrape: int, newest_ns: int) -> Clock:
    """Just after the newest span (running), past the staleness bound (stalled), or long
    after (killed, or how the spans say it ended), by turns."""
    seconds = newest_ns / 1e9 + (0.5, 2 * STALE_S, 10**6)[scrape % 3]
    return Clock.at(seconds, STALE_S)


class Grower:
    """A trace file written a chunk at a time and read by ``watch``'s follower and live
    model, with a scrape after each chunk checked against a job fed every line read so far
    at once."""

    def __init__(self, live: Path, **job: float) -> None:
        self.live = live
        self.follower = Follower([live])
        self.job = LiveJob([live], **job)
        self.options = job
        self.read: list[tuple[Path, int, bytes]] = []
        self.newest_ns = 0
        self.scrapes = 0
        self.last: Snapshot | None = None
        self.clock = Clock.at(0)

    def append(self, data: bytes, target: Path | None = None) -> None:
        with (target or self.live).open("ab") as file:
            file.write(data)
        self.poll()

    def poll(self) -> None:
        lines = list(self.follower.poll())
        for _, _, raw in lines:
            self.newest_ns = max([self.newest_ns, *map(int, _END.findall(raw))])
        self.read.extend(lines)
        self.job.add_lines(lines)
        self.scrape()

    def scrape(self) -> None:
        self.clock = _clock(self.scrapes, self.newest_ns)
        self.scrapes += 1
        ours = self.job.snapshot(self.clock)
        fresh = LiveJob([self.live], **self.options)
        fresh.add_lines(self.read)
        assert ours == fresh.snapshot(self.clock), f"scrape {self.scrapes}"
        if ours is not None:  # the scores as report's own function finds them
            found = find_stragglers(fresh.builder.finish())
            assert {r.rank: r.straggler_score for r in ours.ranks} == {
                r.rank: found.ranks[r.rank].score if r.rank in found.ranks else None
                for r in ours.ranks
            }
            assert {r.rank: r.straggler for r in ours.ranks} == {
                r.rank: found.ranks[r.rank].straggler if r.rank in found.ranks else None
                for r in ours.ranks
            }
        self.last = ours

    def grow(self, source: Path, count: int, seed: int) -> None:
        for piece in _chunks(source.read_bytes(), count, seed):
            self.append(piece)

    def close(self) -> Snapshot:
        self.follower.close()
        assert self.last is not None
        return self.last


def _report(capsys: pytest.CaptureFixture[str], paths: list[Path], clock: Clock) -> dict:
    now, stale = clock.now_ns / 1e9, clock.stale_after_ns / 1e9
    argv = ["report", *map(str, paths), "--json", "--now", repr(now), "--stale-after", repr(stale)]
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])  # (the JSON object is last)


def _assert_is_report(snapshot: Snapshot, report: dict) -> None:
    """The last scrape's figures are what ``report --json`` prints for the same files."""
    assert snapshot.spans == report["spans"] and snapshot.torn_lines == report["torn_lines"]
    by_rank = {str(entry["rank"]): entry for entry in report["ranks"]}
    assert [rank.rank for rank in snapshot.ranks] == list(by_rank)
    for rank in snapshot.ranks:
        entry = by_rank[rank.rank]
        assert round(rank.wall_s, 9) == entry["wall_s"]
        assert round(rank.goodput_s, 9) == entry["goodput_s"]
        score = entry["score"]
        assert (None if rank.straggler_score is None else round(rank.straggler_score, 3)) == score
        assert rank.straggler == entry["straggler"]
    job = snapshot.ranks[0]
    assert {str(c.value): round(s, 9) for c, s in job.badput_s.items()} == {
        k: v or 0.0 for k, v in report["badput_s"].items()
    }
    last = report["incarnations"][-1]
    assert job.ended == last["ended"]
    assert job.iteration == (None if last["last_iteration"] is None else last["last_iteration"] + 1)


def _grown(tmp_path: Path, source: Path, count: int, seed: int, **job: float) -> Grower:
    (tmp_path / "live").mkdir()
    grower = Grower(tmp_path / "live" / source.name, **job)
    grower.grow(source, count, seed)
    return grower


def test_killed_and_resumed_in_many_pieces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three incarnations (two SIGKILLed, each resumed by a new process), one per step."""
    shape = synthetic.Shape(
        ranks=1, spans=6000, save_interval=12, incarnations=3, kill_after=5, per_line=37
    )
    (source,) = synthetic.write_per_step(tmp_path / "traces.jsonl", shape)
    grower = _grown(tmp_path, source, 90, seed=1)
    last = grower.close()
    assert [rank.rank for rank in last.ranks] == ["0"] and last.spans > 6000
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


@pytest.mark.parametrize(
    ("window", "in_process"),
    [(3, False), (30, False), (stragglers.MEDIAN_WINDOW, False), (30, True)],
    ids=["window3", "window30", "window", "in_process"],
)
def test_several_ranks_with_stragglers_in_many_pieces(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    window: int,
    in_process: bool,
) -> None:
    """Three ranks in one file (their lines interleaved), the gradient waits too, so the
    straggler scores are computed; each rank killed once and resumed (by a new process, or
    by ``pretrain()`` again in the same one); its steps vary. With a window of a few values
    around each median, the median leaves it often (and the rank is worked out again);
    with a few tens, what lies outside it is dropped too."""
    monkeypatch.setattr(stragglers, "MEDIAN_WINDOW", window)
    shape = synthetic.Shape(
        ranks=3,
        spans=9000,
        save_interval=15,
        incarnations=2,
        kill_after=4,
        per_line=41,
        communication=True,
        jitter_ns=3 * synthetic.MS,
        in_process=in_process,
    )
    (source,) = synthetic.write_per_step(tmp_path / "traces.jsonl", shape)
    grower = _grown(tmp_path, source, 70, seed=2)
    last = grower.close()
    assert len(last.ranks) == 3
    assert all(rank.straggler_score is not None for rank in last.ranks)
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


@pytest.mark.parametrize(
    "groups", [up.PER_STEP_GROUPS, up.DEFAULT_GROUPS], ids=["per_step", "default"]
)
def test_megatron_lm_shaped_killed_and_resumed_in_many_pieces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], groups: frozenset[str]
) -> None:
    """Megatron-LM's own spans (no interval attributes: the facts are derived)."""
    source = up.killed_and_resumed(tmp_path / "traces.jsonl", groups=groups)
    grower = _grown(tmp_path, source, 60, seed=3)
    last = grower.close()
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


def _saves_past_their_interval(spans: list[dict]) -> list[dict]:
    """The spans with every checkpoint save ending half a second after its interval (a
    save that went on past the reroot): a span that reaches across an interval's end."""
    for span in spans:
        if span["name"] == "megatron.checkpoint.save":
            span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + g.SECOND // 2)
    return spans


def test_an_in_process_restart_a_hang_and_a_failure_in_many_pieces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One process that called ``pretrain()`` three times (so its incarnations are split
    by startup): killed, then hung and cut short by a SIGTERM, then failed; its first
    saves end after their intervals."""
    source = g.write(
        tmp_path / "traces.jsonl",
        _saves_past_their_interval(g.lifecycle(0, intervals=4, per=3, kill_after=2)),
        g.hung(4, waiting=False, start=40),
        g.lifecycle(60, first=6, load=6, intervals=3, per=2, fail_after=1),
        per_line=2,
        pid=77,
    )
    grower = _grown(tmp_path, source, 50, seed=4, hang_floor_s=1)
    last = grower.close()
    assert last.ranks[0].ended == "failed"
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


def test_in_process_restart_cycles_in_many_pieces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks whose cycles NVRx restarted in process twice (the ground truth's
    ``restarted``): between a cycle's end and the next one's first span the rank is
    restarting: ``running`` while its newest record is fresh, never dead on sight (and
    stalled, then killed, past that); the figures carry across the cycles, as report's."""
    import ground_truth as gt

    history = gt.History(
        (gt.Plan(14, "restarted", victim=1, gap_s=8), gt.Plan(10, "restarted", gap_s=8),
         gt.Plan(9)),
        ranks=2, save_interval=5, export_delay_s=(0.0, 0.0),
    )  # fmt: skip
    (source,) = gt.write(gt.simulate(history), tmp_path / "traces.jsonl")
    (tmp_path / "live").mkdir()  # (no metrics: the spans' own freshness decides)
    grower = Grower(tmp_path / "live" / source.name)
    between: dict[str, set[str]] = {"fresh": set(), "stale": set()}
    for piece in _chunks(source.read_bytes(), 60, seed=5):
        grower.append(piece)
        rank = grower.last.ranks[0] if grower.last is not None else None
        if rank is not None and rank.ended == "restarted":
            after = grower.clock.now_ns - grower.newest_ns
            between["fresh" if after <= STALE_S * 1e9 else "stale"].add(rank.state)
    last = grower.close()
    assert between["fresh"] == {"running"}, between
    assert between["stale"] and "running" not in between["stale"], between
    assert [r.ended for r in last.ranks] == ["shutdown", "shutdown"]
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


def test_a_rotation_in_the_middle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """logrotate renames the file halfway (the job goes on writing the old one a little,
    then starts a new one): the scrapes on both sides still equal a job fed every line."""
    shape = synthetic.Shape(ranks=2, spans=4000, save_interval=10, incarnations=2, per_line=29)
    (source,) = synthetic.write_per_step(tmp_path / "traces.jsonl", shape)
    data = source.read_bytes()
    half = data.index(b"\n", len(data) // 2) + 1
    (tmp_path / "live").mkdir()
    live = tmp_path / "live" / "traces.jsonl"
    old = live.with_name("traces.jsonl.1")
    grower = Grower(live)
    pieces = list(_chunks(data[:half], 30, seed=5))
    for piece in pieces[:-3]:
        grower.append(piece)
    os.rename(live, old)
    for piece in pieces[-3:]:  # still written through the job's open descriptor
        grower.append(piece, target=old)
    live.touch()
    for piece in _chunks(data[half:], 30, seed=6):
        grower.append(piece)
    last = grower.close()
    assert len(last.ranks) == 2
    _assert_is_report(last, _report(capsys, [old, live], grower.clock))


def _shuffled(path: Path, seed: int, reach: int = 12) -> Path:
    """The file's lines, each moved up to ``reach`` lines from where it was written (as
    several exporters of one process, or a collector, may write them): records then come
    out of start order, and a record that came late belongs before others."""
    rng = random.Random(seed)
    lines = path.read_bytes().splitlines(keepends=True)
    for at in range(len(lines)):
        other = min(len(lines) - 1, at + rng.randrange(reach + 1))
        lines[at], lines[other] = lines[other], lines[at]
    out = path.with_name("shuffled-" + path.name)
    out.write_bytes(b"".join(lines))
    return out


def _interval_late(spans: list[dict], reason: str | None = None) -> list[dict]:
    """The spans with the second interval written after the third (marked with a shutdown
    ``reason``, which the incarnation's ending must then find among its earlier ones)."""
    second, third = [i for i, span in enumerate(spans) if span["name"] == "megatron.train"][1:3]
    if reason is not None:
        g.attr(spans[second], "megatron.shutdown.reason", reason)
    return [*spans[:second], *spans[second + 1 : third + 1], spans[second], *spans[third + 1 :]]


@pytest.mark.parametrize("shape", ["ours", "megatron_lm", "ranks"])
def test_lines_out_of_order_in_many_pieces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str
) -> None:
    """Spans that come after later ones: placed among them, and what was derived from the
    earlier ones worked out again (an interval's iteration range, how it ended). Ours
    without iteration spans, so the iteration figure is the intervals'."""
    if shape == "ours":
        source = g.write(
            tmp_path / "traces.jsonl",
            _interval_late(
                g.lifecycle(0, intervals=5, per=2, kill_after=1, iterations=False), "interrupt"
            ),
            _interval_late(
                g.lifecycle(
                    30, first=10, load=10, intervals=4, per=2, fail_after=1, iterations=False
                )
            ),
            per_line=1,
            pid=5,
        )
    elif shape == "megatron_lm":
        source = up.killed_and_resumed(tmp_path / "traces.jsonl", groups=up.DEFAULT_GROUPS)
    else:  # two ranks' iterations and waits out of order: their medians worked out anew
        ranks = synthetic.Shape(
            ranks=2, spans=3000, save_interval=10, per_line=7, communication=True, jitter_ns=999
        )
        (source,) = synthetic.write_per_step(tmp_path / "traces.jsonl", ranks)
    grower = _grown(tmp_path, _shuffled(source, seed=8), 40, seed=9)
    last = grower.close()
    _assert_is_report(last, _report(capsys, [grower.live], grower.clock))


def test_a_scrape_with_nothing_new_gives_the_same_figures(tmp_path: Path) -> None:
    """Scraped again with nothing read since, at the same moment or later: as a fresh job
    (the stragglers' scores too, which are then kept)."""
    shape = synthetic.Shape(
        ranks=2, spans=3000, save_interval=10, incarnations=2, per_line=31, communication=True
    )
    (source,) = synthetic.write_per_step(tmp_path / "traces.jsonl", shape)
    grower = _grown(tmp_path, source, 20, seed=7)
    for _ in range(4):
        grower.scrape()
    last = grower.close()
    assert all(rank.straggler_score is not None for rank in last.ranks)


@pytest.mark.parametrize("ranks_of", [stragglers._lower_quartile, stragglers._upper_quartile])
def test_a_quartile_held_by_the_values_near_it_is_report_s(
    monkeypatch: pytest.MonkeyPatch, ranks_of
) -> None:
    """The straggler rule's quartiles, followed as the median is (a window each), equal
    report's (:func:`~megatron.trace._store.selection.median_and_quartiles`) after every
    batch, while the values held stay few."""
    import numpy as np

    from megatron.trace._store.selection import median_and_quartiles

    monkeypatch.setattr(stragglers, "MEDIAN_WINDOW", 50)
    rng = random.Random(11)
    window = stragglers._Window(ranks_of)
    seen: list[int] = []
    for _ in range(400):
        batch = [rng.randrange(10**6) for _ in range(rng.randrange(1, 20))]
        seen += batch
        window.add(np.array(batch, dtype=np.int64))
        values = np.array(seen, dtype=np.int64)
        _, q1, q3, _ = median_and_quartiles(lambda values=values: [values])
        assert window.median() == (q1 if ranks_of is stragglers._lower_quartile else q3)
        assert len(window.values) <= 8 * 50 + len(batch)
    assert window.below > 0  # (values were dropped)


def test_a_median_held_by_the_values_near_it_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the straggler scores take of each rank: the median of every work value so far,
    from only the values near it and the count of those below, equal to the median of
    them all after every batch (values from a steady spread, one coming again and again);
    the values held stay few."""
    import numpy as np

    monkeypatch.setattr(stragglers, "MEDIAN_WINDOW", 50)
    rng = random.Random(10)
    window = stragglers._Window()
    seen: list[int] = []
    for _ in range(400):
        batch = [rng.randrange(10**6) for _ in range(rng.randrange(1, 20))]
        batch += [500_000] * rng.randrange(3)
        seen += batch
        window.add(np.array(batch, dtype=np.int64))
        assert window.median() == statistics.median(seen)
        assert len(window.values) <= 8 * 50 + len(batch)
    assert window.below > 0  # (values were dropped)
