"""``megatron-trace watch``: a running job's goodput, state, hangs and stragglers, for Prometheus.

The command is the loop and the endpoint; following the files is
:class:`~megatron.trace.live.follow.Follower`'s, the figures
:class:`~megatron.trace.live.job.LiveJob`'s (``report``'s code), the
metric families :mod:`megatron.trace.render.metrics.prometheus`'s. The files are
polled every ``--interval`` seconds; a scrape computes the figures from what
was read so far (at most once per second). With ``--receive DIR`` it is also
the jobs' OTLP receiver (``receive``'s :class:`~megatron.trace.receive.Receiver`,
on ``--grpc``/``--http``): what arrives is written to
``DIR/JOB/rank<N>/traces.jsonl`` (and ``metrics.jsonl``), and each job is
watched on its own from when its first file appears: its series labelled
``run_id`` = its folder's name, its own state, hangs and stragglers, so
several jobs exporting over OTLP only (Megatron-LM's nemo-lens) to one
receiver are watched live apart, and their files are there for ``report``
after. Ctrl-C or SIGTERM stops it: one line, exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import signal
import threading
import time
from pathlib import Path
from typing import Any

from megatron.trace.analysis.liveness import Clock
from megatron.trace.cli.options import add_job_option, exit_statuses, say
from megatron.trace.cli.receive import (
    add_listen_arguments,
    listening_on,
    new_receiver,
    out_folder,
)
from megatron.trace.live.follow import Follower
from megatron.trace.live.job import HANG_FACTOR, HANG_FLOOR_S, KILLED_AFTER_S, LiveJob
from megatron.trace.render.metrics.otlp_push import OtlpPush
from megatron.trace.render.metrics.prometheus import SnapshotCollector, prometheus_client
from megatron.trace_format.errors import SpansReadTwiceError, TraceError, TraceInputError
from megatron.trace_format.semconv import STALE_AFTER_S

__all__ = ["add_parser", "run"]


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:9464), got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or text.endswith("://"):
        raise argparse.ArgumentTypeError(
            f"expected an OTLP/HTTP metrics URL (e.g. http://127.0.0.1:4318/v1/metrics), "
            f"got {text!r}"
        )
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


class _Followed:
    """One job's files, its live figures, and the snapshot its last scrape computed."""

    def __init__(
        self,
        args: argparse.Namespace,
        files: list[Path],
        run_id: str | None,
        job: str | None = None,
        name: str | None = None,
    ) -> None:
        self.follower = Follower(list(files))
        self.job = LiveJob(
            list(files),
            run_id=run_id,
            hang_factor=args.hang_factor,
            hang_floor_s=args.hang_floor,
            killed_after_s=args.killed_after,
            job=job,
        )
        self.name = name  # a received job's folder (its warnings say it)
        self.jobs_said: str | None = None  # the jobs note last said
        self.cached: Any = None
        self.cached_at = 0.0
        self.dirty = True
        self.failed = ""
        # the files hold one span twice: every figure would count it twice, so none is served
        self.refused: SpansReadTwiceError | None = None
        self.refusal_said = False

    def add(self, path: Path) -> None:
        if self.follower.add(path):
            self.job.trace_files.append(path)  # (its metrics.jsonl: signs of life)

    def poll(self) -> bool:
        return bool(self.job.add_lines(self.follower.poll()))

    def snapshot(self, now: float, stale_after: float) -> Any:
        if self.dirty or now - self.cached_at >= 1.0:
            try:
                self.cached = self.job.snapshot(Clock.at(None, stale_after))
            except SpansReadTwiceError as error:
                self.cached, self.refused = None, error
            except TraceError as error:  # metrics.jsonl damaged, say: keep the last figures
                if str(error) != self.failed:
                    _warn(str(error))
                self.failed = str(error)
            else:
                self.failed = ""
            note = self.job.jobs_note
            if note is not None and note != self.jobs_said:  # several jobs: said as it changes
                _warn(note if self.name is None else f"job {self.name}: {note}")
            self.jobs_said = note
            self.cached_at, self.dirty = now, False
        return self.cached


class _Watch:
    """The shared state of the poll loop and the scrapes (one lock around both): the job of
    the files named, and with ``--receive`` each job the receiver writes a folder for, each
    followed, figured and labelled on its own (``run_id``: its folder's name, the job id
    :mod:`megatron.trace.receive.files` chose), so one job ending, dying or sending damage
    leaves the others' series as they are."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        trace_files = [p for p in args.files if not p.name.startswith("metrics")]
        self.received: Path | None = args.receive
        self.named = _Followed(args, trace_files, args.run_id, args.job) if trace_files else None
        self.jobs: dict[str, _Followed] = {}
        self.stale_after = args.stale_after
        self.lock = threading.Lock()

    def followed(self) -> list[_Followed]:
        return ([self.named] if self.named is not None else []) + list(self.jobs.values())

    def poll(self) -> None:
        if self.received is not None:  # a job or rank the receiver began writing since
            for path in sorted(self.received.glob("*/*/traces.jsonl")):
                name = path.parent.parent.name
                with self.lock:  # (a scrape reads the job's files)
                    if name not in self.jobs:
                        self.jobs[name] = _Followed(self.args, [], name, name=name)
                    self.jobs[name].add(path)
        for followed in self.followed():
            with self.lock:
                if followed.poll():
                    followed.dirty = True
            for path in followed.follower.waiting:
                _say(f"waiting for {path} (not there yet)")
            for path, number in followed.follower.cut_off:
                _say(f"{path}:{number}: a last line cut off by a rotation, skipped")
            followed.follower.cut_off.clear()

    def snapshot(self) -> list[Any]:
        """Each job's figures (a job without a span yet has none)."""
        now = time.monotonic()
        with self.lock:
            found = [f.snapshot(now, self.stale_after) for f in self.followed()]
        return [snapshot for snapshot in found if snapshot is not None]

    def refuse(self) -> None:
        """Raise the named files' refusal (exit 2: the user named one copy too many); warn,
        once, of a received job's, whose series are withdrawn while the others stay."""
        with self.lock:
            if self.named is not None and self.named.refused is not None:
                raise self.named.refused
            for name, followed in self.jobs.items():
                if followed.refused is not None and not followed.refusal_said:
                    followed.refusal_said = True
                    _warn(f"job {name}: {followed.refused}")

    def close(self) -> None:
        for followed in self.followed():
            followed.follower.close()


def _say(text: str) -> None:
    say("watch", text)


class _Stopped(Exception):
    """SIGTERM arrived: stop watching."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def run(args: argparse.Namespace) -> int:
    # SIGTERM ends the watch as Ctrl-C does, by an exception in the main thread (a handler
    # that set a threading.Event could deadlock on the lock the main thread holds inside
    # Event.wait when the signal lands there); installed first, so a SIGTERM sent as soon
    # as the "serving" line shows, or before, still stops it cleanly
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        status = _serve(args)
    except (KeyboardInterrupt, _Stopped):
        status = 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    if status == 0:
        _say("stopped")
    return status


def _serve(args: argparse.Namespace) -> int:
    """Serve until stopped (by an exception); 2 when the port cannot be had."""
    client = prometheus_client()  # before anything starts: a missing extra is one line
    # main() pauses the cyclic collector for a command's one read; a process that runs
    # for weeks, with an HTTP server's garbage, needs it back
    gc.enable()
    if not args.files and args.receive is None:
        raise TraceInputError("no trace files to watch: name them, or --receive DIR")
    if args.job is not None and not args.files:
        raise TraceInputError(
            f"--job {args.job} picks one job of the FILEs named, and no FILE is; with --receive "
            "alone each job is watched apart already (its folder, its run_id): name the "
            "FILEs, or leave --job out"
        )
    receiver = _receiver(args) if args.receive is not None else None
    watch = _Watch(args)
    push = (
        OtlpPush(watch.snapshot, args.otlp_endpoint, args.otlp_interval, _say)
        if args.otlp_endpoint
        else None
    )
    registry = client.CollectorRegistry()
    registry.register(SnapshotCollector(watch.snapshot))
    host, port = args.listen
    server = None
    try:
        try:
            started = client.start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            raise TraceError(
                f"cannot listen on {host}:{port}: {error.strerror or error}"
            ) from error
        server = started[0] if isinstance(started, tuple) else None
        bound = server.server_address[1] if server is not None else port
        watched = [str(p) for p in args.files]
        if receiver is not None:
            receiver.start()
            listening = listening_on(args, receiver)
            watched.append(f"{args.receive}/JOB/RANK/traces.jsonl (received on {listening})")
        _say(f"serving http://{host}:{bound}/metrics for " + ", ".join(watched))
        while True:
            watch.poll()
            watch.refuse()  # what the last scrape or push found
            time.sleep(args.interval)
    finally:
        if receiver is not None:
            receiver.stop()
        watch.close()
        if push is not None:
            push.shutdown()  # the last figures, pushed once more
        if server is not None:
            with contextlib.suppress(Exception):
                server.shutdown()
                server.server_close()


def _receiver(args: argparse.Namespace) -> Any:
    """The OTLP receiver ``--receive`` asks for (not listening yet)."""
    return new_receiver(args, args.receive, "--receive", _warn)


def _warn(text: str) -> None:
    _say(f"warning: {text}")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="follow a running job's files and serve its live figures for Prometheus",
        description="Follow the trace files (and metrics.jsonl beside them) of a running job "
        "as they grow and rotate, reading only what is new, and serve per job and rank: "
        "goodput, badput by category, wall clock, goodput ratio, iteration, the job's state "
        "(running, finished, stalled, killed), a suspected hang and how long it has lasted, "
        "the rolling iteration time and the straggler score, on an HTTP endpoint Prometheus "
        "scrapes (needs the 'watch' extra), and with --otlp-endpoint pushed over OTLP "
        "too; with --receive DIR it is the OTLP receiver of any number of jobs as well, "
        "writing DIR/JOB/rank<N>/traces.jsonl as receive does and watching each job apart "
        "(its run_id: its folder's name). Ctrl-C or SIGTERM stops it, with status 0.",
        epilog=exit_statuses(None),
    )
    parser.add_argument(
        "files", nargs="*", type=Path, metavar="FILE", help="trace files (or --receive)"
    )
    parser.add_argument(
        "--receive",
        type=out_folder,
        default=None,
        metavar="DIR",
        help="also be the jobs' OTLP receiver, as `receive --out DIR` is (needs the "
        "'receive' extra): write what arrives to DIR/JOB/rank<N>/ and watch each job "
        "from when its first file appears, its series labelled run_id=JOB",
    )
    add_listen_arguments(parser, when="with --receive: ")
    parser.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 9464),
        metavar="HOST:PORT",
        help="where to serve /metrics (default 127.0.0.1:9464; port 0: any free port)",
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often the files are polled for new lines (default 2)",
    )
    parser.add_argument(
        "--stale-after",
        type=_seconds,
        default=STALE_AFTER_S,
        metavar="SECONDS",
        help="a job not seen to end is running while its newest record is at most this old "
        f"(default {STALE_AFTER_S:g}, as report's)",
    )
    parser.add_argument(
        "--killed-after",
        type=_seconds,
        default=KILLED_AFTER_S,
        metavar="SECONDS",
        help="a job that stopped without an ending reads stalled, then killed once its "
        f"newest record is this old (default {KILLED_AFTER_S:g})",
    )
    parser.add_argument(
        "--hang-factor",
        type=_seconds,
        default=HANG_FACTOR,
        metavar="K",
        help=f"a hang is suspected past K x the rolling median iteration (default {HANG_FACTOR:g})",
    )
    parser.add_argument(
        "--hang-floor",
        type=_seconds,
        default=HANG_FLOOR_S,
        metavar="SECONDS",
        help=f"... and past at least this many seconds (default {HANG_FLOOR_S:g})",
    )
    parser.add_argument(
        "--otlp-endpoint",
        type=_url,
        default=None,
        metavar="URL",
        help="also push the figures over OTLP/HTTP to this metrics URL (e.g. a collector's "
        "http://127.0.0.1:4318/v1/metrics), under the in-process live metrics' names "
        "(needs the 'otlp' extra)",
    )
    parser.add_argument(
        "--otlp-interval",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how often they are pushed (default 10, the trainer's metrics export period)",
    )
    parser.add_argument(
        "--run-id",
        dest="run_id",
        default=None,
        help="the run_id label of the FILEs' series (default: with --job, NAME; else from "
        "the first record read: its resource's megatron.run_id, nemo.run.id, "
        "nemo.lens.run_uuid, slurm.job.id or service.instance.id less -rank<N>, else the "
        "first file's folder); a received job's is its folder's name",
    )
    add_job_option(parser, live=True)
    parser.set_defaults(func=run)
