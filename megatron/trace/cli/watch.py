"""``megatron-trace watch``: a running job's goodput, state, hangs and stragglers, for Prometheus.

The command is the loop and the endpoint; following the files is
:class:`~megatron.trace.live.follow.Follower`'s, the figures
:class:`~megatron.trace.live.job.LiveJob`'s (``report``'s code), the
metric families :mod:`megatron.trace.render.metrics.prometheus`'s. The files are
polled every ``--interval`` seconds; a scrape computes the figures from what
was read so far (at most once per second). With ``--receive DIR`` it is also
the job's OTLP receiver (``receive``'s :class:`~megatron.trace.receive.Receiver`,
on ``--grpc``/``--http``): what arrives is written to ``DIR/rank<N>/traces.jsonl``
(and ``metrics.jsonl``) and each rank's file is followed from when it appears,
so a job that exports over OTLP only (Megatron-LM's nemo-lens) is watched live
and its files are there for ``report`` after. Ctrl-C or SIGTERM stops it: one
line, exit 0.
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
from megatron.trace.cli.options import exit_statuses, say
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
from megatron.trace_format.errors import TraceError, TraceInputError
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


class _Watch:
    """The shared state of the poll loop and the scrapes (one lock around both)."""

    def __init__(self, args: argparse.Namespace) -> None:
        trace_files = [p for p in args.files if not p.name.startswith("metrics")]
        self.received: Path | None = args.receive
        self.follower = Follower(list(trace_files))
        self.job = LiveJob(
            list(trace_files),
            run_id=args.run_id,
            hang_factor=args.hang_factor,
            hang_floor_s=args.hang_floor,
            killed_after_s=args.killed_after,
        )
        self.stale_after = args.stale_after
        self.lock = threading.Lock()
        self._cached: Any = None
        self._cached_at = 0.0
        self._dirty = True
        self._failed = ""

    def poll(self) -> None:
        if self.received is not None:  # a rank the receiver began writing since
            for path in sorted(self.received.glob("*/traces.jsonl")):
                if self.follower.add(path):
                    self.job.trace_files.append(path)  # its metrics.jsonl: signs of life
        with self.lock:
            if self.job.add_lines(self.follower.poll()):
                self._dirty = True
        for path in self.follower.waiting:
            _say(f"waiting for {path} (not there yet)")
        for path, number in self.follower.cut_off:
            _say(f"{path}:{number}: a last line cut off by a rotation, skipped")
        self.follower.cut_off.clear()

    def snapshot(self) -> Any:
        now = time.monotonic()
        with self.lock:
            if self._dirty or now - self._cached_at >= 1.0:
                try:
                    self._cached = self.job.snapshot(Clock.at(None, self.stale_after))
                except TraceError as error:  # metrics.jsonl damaged, say: keep the last figures
                    if str(error) != self._failed:
                        _warn(str(error))
                    self._failed = str(error)
                else:
                    self._failed = ""
                self._cached_at, self._dirty = now, False
            return self._cached


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
            watched.append(f"{args.receive}/RANK/traces.jsonl (received on {listening})")
        _say(f"serving http://{host}:{bound}/metrics for " + ", ".join(watched))
        while True:
            watch.poll()
            time.sleep(args.interval)
    finally:
        if receiver is not None:
            receiver.stop()
        watch.follower.close()
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
        "too; with --receive DIR it is the job's OTLP receiver as well, writing and watching "
        "DIR/rank<N>/traces.jsonl. Ctrl-C or SIGTERM stops it, with status 0.",
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
        help="also be the job's OTLP receiver, as `receive --out DIR` is (needs the "
        "'receive' extra): write what arrives to DIR/rank<N>/ and watch each rank's "
        "traces.jsonl from when it appears",
    )
    add_listen_arguments(parser, when="with --receive: the ")
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
        "--job",
        dest="run_id",
        default=None,
        help="the run_id label of every series (default: from the first record read: its "
        "resource's megatron.run_id, nemo.run.id, nemo.lens.run_uuid, slurm.job.id or "
        "service.instance.id less -rank<N>, else the first file's folder)",
    )
    parser.set_defaults(func=run)
