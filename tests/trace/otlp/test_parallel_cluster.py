"""The files read on a real Dask cluster, and on a ``spawn`` process pool: the same answers.

On a cluster nothing is inherited from this process: the map function and what it
needs travel with each piece, and a worker reads the files itself. So the
commands run here with ``--scheduler`` on a ``LocalCluster`` of two worker
processes (started once for the module), over 256 rank files and over one big
file cut into many pieces, and their output is compared with one process's:
``check`` and ``report --json`` byte for byte, the exports' bytes. The library
API does the same on a ``ProcessPoolExecutor`` that spawns its workers. Without
dask, ``--scheduler`` is one line naming the extra.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import synthetic
import tracegen as g
from processes import subprocess_env

from megatron.trace import build_report, check_files, load_trace
from megatron.trace.cli import options
from megatron.trace.cli.main import main
from megatron.trace.otlp import parallel
from megatron.trace.render.export.write import export_files

NOW = ("--now", "2000000000")
RANKS = 256


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """The address of a LocalCluster of two single-threaded worker processes."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """256 ranks' files: every seventh rank killed and resumed, every eleventh still cut short."""
    folder = tmp_path_factory.mktemp("ranks")
    files = []
    for rank in range(RANKS):
        path = folder / f"rank{rank:03d}.jsonl"
        if rank % 7 == 0:
            g.write(path, g.lifecycle(0, kill_after=1), g.lifecycle(20, first=2, load=2), rank=rank)
        elif rank % 11 == 0:
            g.write(path, g.lifecycle(0, cut_short_after=1), rank=rank)
        else:
            g.write(path, g.lifecycle(0), rank=rank)
        files.append(path)
    return files


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file of two ranks, killed and resumed, of a few hundred lines."""
    shape = synthetic.Shape(ranks=2, spans=6_000, incarnations=2, save_interval=7, per_line=20)
    (path,) = synthetic.write_per_step(tmp_path_factory.mktemp("big") / "traces.jsonl", shape)
    return path


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut files however small they are. Only this process cuts: a worker is handed the
    piece's byte range and line number, so the patch need not reach the workers."""
    monkeypatch.setattr(parallel, "MIN_PIECE_BYTES", 1)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _same_on_cluster(
    capsys: pytest.CaptureFixture[str], scheduler: str, files: list[Path], jobs: str, *argv: str
) -> None:
    names = [str(path) for path in files]
    alone = _run(capsys, *argv, *names, *NOW, "--jobs", "1")
    spread = _run(capsys, *argv, *names, *NOW, "--scheduler", scheduler, "--jobs", jobs)
    assert alone[0] in (0, 1), alone
    assert spread == alone


@pytest.mark.needs_extras  # dask
@pytest.mark.parametrize("command", [("check",), ("report", "--json")])
def test_rank_files_read_on_the_cluster_give_the_same_answer(
    capsys: pytest.CaptureFixture[str], scheduler: str, rank_files: list[Path], command
) -> None:
    _same_on_cluster(capsys, scheduler, rank_files, "2", *command)


@pytest.mark.needs_extras  # dask
@pytest.mark.parametrize("command", [("check",), ("report", "--json")])
def test_one_big_file_cut_into_pieces_on_the_cluster_gives_the_same_answer(
    capsys: pytest.CaptureFixture[str], scheduler: str, big_file: Path, tiny_pieces: None, command
) -> None:
    _same_on_cluster(capsys, scheduler, [big_file], "16", *command)


@pytest.mark.needs_extras  # dask
@pytest.mark.parametrize("fmt", ["chrome", "perfetto"])
@pytest.mark.parametrize("which", ["ranks", "big"])
def test_exports_written_on_the_cluster_are_the_same_bytes(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    scheduler: str,
    rank_files: list[Path],
    big_file: Path,
    tiny_pieces: None,
    fmt: str,
    which: str,
) -> None:
    """Each worker writes its pieces' part beside the output; this process joins them. (The
    Perfetto export marks the seams between pieces, so it is compared with the local pool
    cutting the same pieces; the Chrome export is the same bytes however it was cut. That
    pool spawns its workers here, where the cluster's threads run, and pickles the lanes
    with every piece: a quarter of the ranks keeps it quick.)"""
    files, jobs = (rank_files, "2") if which == "ranks" else ([big_file], "16")
    if fmt == "perfetto" and which == "ranks":
        files = rank_files[:64]
    names = [str(path) for path in files]
    local = "1" if fmt == "chrome" else jobs
    common = ("export", "--format", fmt, *names, *NOW, "--jobs")
    alone = _run(capsys, *common, local, "-o", str(tmp_path / "alone"))
    spread = _run(capsys, *common, jobs, "--scheduler", scheduler, "-o", str(tmp_path / "spread"))
    assert (alone[0], alone[2]) == (spread[0], spread[2]) == (0, "")
    assert (tmp_path / "spread").read_bytes() == (tmp_path / "alone").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "spread"]  # no part left


@pytest.mark.needs_extras  # dask
def test_the_timeline_read_on_the_cluster_is_the_same_page(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scheduler: str, rank_files: list[Path]
) -> None:
    names = [str(path) for path in rank_files[:32]]
    alone = _run(capsys, "timeline", *names, *NOW, "--jobs", "1", "-o", str(tmp_path / "a"))
    spread = _run(
        capsys, "timeline", *names, *NOW, "--scheduler", scheduler, "-o", str(tmp_path / "b")
    )
    assert alone[0] == spread[0] == 0, (alone, spread)
    assert (tmp_path / "b").read_bytes() == (tmp_path / "a").read_bytes()


@pytest.mark.needs_extras  # dask
def test_a_local_cluster_for_the_command_alone(
    capsys: pytest.CaptureFixture[str], rank_files: list[Path]
) -> None:
    """``--scheduler local:2`` starts its own two workers, and stops them after."""
    names = [str(path) for path in rank_files[:16]]
    alone = _run(capsys, "report", "--json", *names, *NOW, "--jobs", "1")
    spread = _run(capsys, "report", "--json", *names, *NOW, "--scheduler", "local:2")
    assert spread == alone


_WORKERS_ALLOCATOR = (
    "import os\n"
    "from types import SimpleNamespace\n"
    "from megatron.trace.cli.options import reading_on\n"
    "with reading_on(SimpleNamespace(scheduler='local:1', jobs=None)) as (_, executor):\n"
    "    said = executor.submit(os.environ.get, 'MALLOC_TRIM_THRESHOLD_', 'unset').result()\n"
    "    print(said, executor.submit(os.environ.get, 'OMP_NUM_THREADS').result())\n"
)


@pytest.mark.needs_extras  # dask
def test_a_local_clusters_workers_read_with_glibcs_own_allocator_settings() -> None:
    """Not the ``MALLOC_TRIM_THRESHOLD_`` Dask sets its workers (reading a tenth slower);
    the rest of Dask's settings for them stay. (In a process of its own: a nanny started
    in this one, the module's cluster's, has set it here, and a worker inherits it.)"""
    pytest.importorskip("distributed")
    env = subprocess_env()
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    done = subprocess.run(
        [sys.executable, "-c", _WORKERS_ALLOCATOR],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "unset 1\n"), done.stderr


@pytest.mark.needs_extras  # dask
def test_a_file_a_worker_cannot_see_is_one_line_naming_it_and_the_worker(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scheduler: str, rank_files: list[Path]
) -> None:
    """The file is read in a run with another (a call reads a run of files), before it."""
    missing = tmp_path / "elsewhere" / "rank999.jsonl"
    names = [str(rank_files[0]), str(missing), str(rank_files[1])]
    for command in ("check", "report"):
        status, out, err = _run(capsys, command, *names, "--scheduler", scheduler, "--jobs", "1")
        assert (status, out) == (2, "")
        assert err.count("\n") == 1 and err.startswith(f"megatron-trace {command}: error: ")
        assert str(missing) in err and "worker at tcp://127.0.0.1:" in err


@pytest.mark.needs_extras  # dask
def test_an_unreachable_scheduler_is_one_line_within_the_timeout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, rank_files: list[Path]
) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr(options, "CONNECT_TIMEOUT_S", 2.0)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.monotonic()
    status, out, err = _run(
        capsys, "report", str(rank_files[0]), "--scheduler", f"tcp://127.0.0.1:{port}"
    )
    assert time.monotonic() - began < 10
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(
        f"megatron-trace report: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"
    )


@pytest.mark.needs_extras  # dask
def test_the_library_api_on_a_dask_executor_gives_the_same_answers(
    tmp_path: Path, scheduler: str, rank_files: list[Path], big_file: Path, tiny_pieces: None
) -> None:
    """The README's recipe: ``Client(address).get_executor()`` handed to the library."""
    from distributed import Client

    files = [*rank_files[:64], big_file]
    with Client(scheduler) as client:
        _same_answers(tmp_path, files, client.get_executor())


@pytest.mark.needs_extras  # dask
def test_a_spawn_process_pool_through_the_library_gives_the_same_answers(
    tmp_path: Path, rank_files: list[Path], big_file: Path, tiny_pieces: None
) -> None:
    """Spawned workers inherit nothing: no function set before a fork, no patched module."""
    files = [*rank_files[:24], big_file]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        _same_answers(tmp_path, files, pool)


def _same_answers(tmp_path: Path, files: list[Path], executor: Executor) -> None:
    """The library's answers on ``executor`` are its answers in this process. The rank
    files and the big file are two jobs (tracegen's "run" and synthetic's "synth"): check
    and export read one at a time."""
    report = build_report(load_trace(files, jobs=1))
    assert build_report(load_trace(files, jobs=8, executor=executor)) == report
    for job in ("run", "synth"):
        checked = check_files(files, jobs=1, job=job)
        spread = check_files(files, jobs=8, executor=executor, job=job)
        assert (spread.violations, spread.notes) == (checked.violations, checked.notes)
        export_files(files, tmp_path / "alone.json", jobs=1, job=job)
        export_files(files, tmp_path / "spread.json", jobs=8, executor=executor, job=job)
        assert (tmp_path / "spread.json").read_bytes() == (tmp_path / "alone.json").read_bytes()


_WITHOUT_DASK = (
    "import sys\n"
    "sys.modules['distributed'] = None  # as if not installed\n"
    "from megatron.trace.cli.main import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("address", ["local:2", "tcp://127.0.0.1:8786"])
def test_without_dask_the_scheduler_option_names_the_extra(tmp_path: Path, address: str) -> None:
    path = g.write(tmp_path / "traces.jsonl", g.lifecycle(0))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DASK, "report", str(path), "--scheduler", address],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "megatron-trace report: error: --scheduler needs the dask.distributed package: "
        "pip install 'megatron-telemetry-spans[cluster]'\n"
    )


@pytest.mark.needs_extras  # dask
def test_a_cluster_that_loses_the_work_is_one_line_and_no_answer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, rank_files: list[Path]
) -> None:
    """Beyond Dask's retries (a piece that killed its worker each time it ran)."""
    from distributed import KilledWorker

    from megatron.trace.cli import report

    def lost(*args: object) -> None:
        raise KilledWorker("scan_file-1234", SimpleNamespace(address="tcp://127.0.0.1:4321"), 3)

    monkeypatch.setattr(report, "load_trace", lost)
    status, out, err = _run(capsys, "report", str(rank_files[0]), "--scheduler", "local:1")
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith("megatron-trace report: error: the Dask cluster at local:1 lost the work")
    assert "tcp://127.0.0.1:4321" in err


class _DiesOnce:
    """The map step, but the worker reading ``victim`` dies the first time (the marker
    file says it did): the process ends as a kill would end it, mid-piece."""

    def __init__(self, victim: Path, marker: Path) -> None:
        self.victim, self.marker = victim, marker

    def __call__(self, item: object) -> object:
        from megatron.trace.model.builder import scan_file

        path = item.path if isinstance(item, parallel.FilePiece) else item
        if path == self.victim and not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return scan_file(item)  # type: ignore[arg-type]


@pytest.mark.needs_extras  # dask
def test_a_worker_that_dies_mid_run_costs_a_retry_not_the_answer(
    tmp_path: Path, scheduler: str, rank_files: list[Path]
) -> None:
    """Dask's nanny starts a new worker and the lost piece runs again: the whole answer.
    (Last here: the cluster has a new worker after it.)"""
    import cloudpickle
    import dask.config
    from distributed import Client

    from megatron.trace.model.builder import TraceBuilder, scan_file

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import us
    files = rank_files[:16]
    expected = build_report(parallel.map_reduce(scan_file, TraceBuilder.merge, files, 1).finish())
    dies = _DiesOnce(files[5], tmp_path / "died")
    # a result the dead worker held is fetched again from the new one; a try to reach the
    # dead one first may wait the connect timeout (30 s by default): keep it short here
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}), Client(scheduler) as client:
        merged = parallel.map_reduce(  # in runs of four files: the victim's is read again
            dies, TraceBuilder.merge, files, jobs=2, executor=client.get_executor()
        )
    assert (tmp_path / "died").exists()
    assert build_report(merged.finish()) == expected
