"""``megatron-trace receive``: be a collector's OTLP receiver; write the files ``report`` reads.

For a job whose telemetry exports over OTLP only (Megatron-LM's nemo-lens:
``OTEL_EXPORTER_OTLP_ENDPOINT``), point its exporter here instead of at a
collector: every export request is appended, split by job and rank, under
``--out`` (``OUT/JOB/rank<N>/``: :mod:`megatron.trace.receive`), and
``report``, ``check``, ``timeline`` and ``watch`` read those files (``report
OUT/JOB``; ``report OUT`` when it holds one job). Ctrl-C or SIGTERM stops it:
what was received is on disk (each request one whole line), one summary
line, exit 0.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from megatron.trace.cli.options import exit_statuses, say
from megatron.trace_format.errors import TraceInputError, TraceOutputError
from megatron.trace_format.words import counted

__all__ = [
    "DEFAULT_GRPC",
    "DEFAULT_HTTP",
    "add_listen_arguments",
    "add_parser",
    "listen_address",
    "listening_on",
    "new_receiver",
    "out_folder",
    "run",
]

#: Where a collector's OTLP receiver listens by default (loopback: say 0.0.0.0:PORT for
#: a job on other machines).
DEFAULT_GRPC = "localhost:4317"
DEFAULT_HTTP = "localhost:4318"


def listen_address(flag: str) -> Any:
    def parse(text: str) -> tuple[str, int] | None:
        if text == "off":
            return None
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise argparse.ArgumentTypeError(
                f"expected HOST:PORT (e.g. 0.0.0.0:{flag[-4:]}) or off, got {text!r}"
            )
        return host.strip("[]"), int(port)

    return parse


def out_folder(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not path.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: its folder {path.parent} does not exist (receive creates only the last one)"
        )
    return path


class _Stopped(Exception):
    """SIGTERM arrived: stop receiving."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def new_receiver(args: argparse.Namespace, out: Path, flag: str, on_error: Any) -> Any:
    """The receiver ``args.grpc``/``args.http`` ask for, writing under ``out`` (given by
    ``flag``), not listening yet: ``receive``'s, and ``watch --receive``'s."""
    from megatron.trace.receive import Receiver

    if args.grpc is None and args.http is None:
        raise TraceInputError("--grpc off and --http off: nothing would listen; keep one")
    try:
        out.mkdir(exist_ok=True)
    except OSError as error:
        raise TraceOutputError(f"{flag} {out}: {error.strerror or error}") from None
    return Receiver(out, args.grpc, args.http, on_error=on_error, max_folders=args.max_folders)


def listening_on(args: argparse.Namespace, receiver: Any) -> str:
    """Where a started receiver listens, as ``receive`` and ``watch --receive`` say it."""
    listening = []
    if args.grpc is not None:
        listening.append(f"grpc {args.grpc[0]}:{receiver.grpc_port}")
    if args.http is not None:
        listening.append(f"http http://{args.http[0]}:{receiver.http_port}/v1/traces")
    return ", ".join(listening)


def run(args: argparse.Namespace) -> int:
    receiver = new_receiver(args, args.out, "--out", _warn)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        receiver.start()
        _say(f"listening on {listening_on(args, receiver)}; writing {args.out}/JOB/RANK/")
        threading.Event().wait()
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        receiver.stop()
    files = sorted(receiver.files.lines)
    jobs = len({path.parent.parent for path in files})
    refused = receiver.files.refused
    _say(
        f"stopped: {counted(receiver.requests, 'export request')}, "
        f"{counted(sum(receiver.files.lines.values()), 'line')} in "
        f"{counted(len(files), 'file')} of {counted(jobs, 'job')} under {args.out}"
        + (f"; {refused} resource entries refused (--max-folders)" if refused else "")
        + (
            f"; {receiver.files.duplicates} resent lines written once"
            if receiver.files.duplicates
            else ""
        )
    )
    return 0


def _say(text: str) -> None:
    say("receive", text)


def _warn(text: str) -> None:
    _say(f"warning: {text}")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "receive",
        help="listen as a collector's OTLP receiver and write the files report reads",
        description="Listen for OTLP exports as a collector's OTLP receiver does (gRPC, "
        "and HTTP with protobuf or JSON bodies on /v1/traces, /v1/metrics, /v1/logs) and "
        "append each request, split by the job and the rank its resource names, to "
        "OUT/JOB/rank<N>/traces.jsonl, metrics.jsonl and logs.jsonl in the OTLP file "
        "exporter's JSON format: `megatron-trace report OUT/JOB` then reads a job. The job "
        "is the first of nemo.lens.job_uuid (not Megatron-LM's one for jobs outside Slurm), "
        "megatron.run_id, nemo.run.id, slurm.job.id, service.instance.id less -rank<N>; a "
        "process naming none gets a folder of its own. Point the jobs' exporters here, e.g. "
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:4317 (needs the 'receive' extra). Ctrl-C "
        "or SIGTERM stops it, with status 0.",
        epilog=exit_statuses(None),
    )
    parser.add_argument(
        "--out", type=out_folder, required=True, metavar="DIR", help="the folder to write into"
    )
    add_listen_arguments(parser)
    parser.set_defaults(func=run)


def _folders(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of folders, 2 or more (a job's and a rank's), got {text!r}"
        )
    return int(text)


def add_listen_arguments(parser: argparse.ArgumentParser, when: str = "") -> None:
    """``--grpc``, ``--http`` and ``--max-folders``: where the receiver listens and how many
    folders it may make (``receive``'s, and ``watch --receive``'s, whose help says ``when``
    they apply)."""
    from megatron.trace.receive.files import DEFAULT_MAX_FOLDERS

    parser.add_argument(
        "--max-folders",
        type=_folders,
        default=DEFAULT_MAX_FOLDERS,
        metavar="N",
        help=f"{when}the most folders (a job's and each of its ranks') the output folder may "
        "hold, those there already included; a request for more is refused, and not retried "
        f"by the sender (default {DEFAULT_MAX_FOLDERS})",
    )
    for flag, transport, default, port in (
        ("--grpc", "OTLP/gRPC", DEFAULT_GRPC, 4317),
        ("--http", "OTLP/HTTP", DEFAULT_HTTP, 4318),
    ):
        parser.add_argument(
            flag,
            type=listen_address(f"{flag} {port}"),
            default=default,
            metavar="HOST:PORT",
            help=f"{when}the {transport} listen address, or off (default {default})",
        )
