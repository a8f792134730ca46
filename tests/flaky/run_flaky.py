"""Run the timing-sensitive tests again and again under a CPU hog, in a new order each time.

A test that waits on a subprocess, a port, a file appearing, a signal or a clock can
pass on an idle machine and fail on a loaded one, or after another test that left a
port or a process behind. This script finds such tests before CI does:

* the tests: every test marked ``slow`` and every test of the files in
  ``flaky_order.WAITING_PATHS`` (the torchrun, ``watch``, ``receive``, signal, fault,
  watchdog and heartbeat tests), selected by the ``flaky_order`` pytest plugin beside
  this script;
* the load: ``os.cpu_count()`` processes that spin for the whole run (``--hog 0``
  turns them off), so the tests get less CPU than the machine has;
* the order: repetition ``k`` shuffles the tests with seed ``seed + k``; the seed of
  every failure is listed, and ``pytest -p flaky_order --flaky-only --flaky-seed S``
  (with ``tests/flaky`` on ``PYTHONPATH``) runs that order again;
* the result: each test that failed at least once, how often, under which seeds, and
  its first failure with the output it captured (all of them in ``failures.jsonl``).

Run from the checkout's root, in the environment the tests run in::

    python tests/flaky/run_flaky.py --repetitions 30
    python tests/flaky/run_flaky.py -n 3 -- -k torchrun    # after --: pytest's arguments

It exits 1 when any test failed (or a repetition hung past ``--timeout`` and was
killed), 0 when every repetition passed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _spin() -> None:
    while True:
        pass


class Hog:
    """``count`` busy processes, started on entry and ended (by their pids) on exit."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._procs: list[multiprocessing.Process] = []

    def __enter__(self) -> Hog:
        context = multiprocessing.get_context("spawn")
        for _ in range(self.count):
            proc = context.Process(target=_spin, daemon=True)
            proc.start()
            self._procs.append(proc)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(timeout=10)


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``interval`` seconds, for the report."""

    def __init__(self, interval: float = 15.0) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[float] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append(os.getloadavg()[0])
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


@dataclass
class Repetition:
    index: int
    seed: int
    seconds: float
    exit_status: int | None  # None: killed after --timeout
    counts: dict[str, int] = field(default_factory=dict)


def _pytest_command() -> list[str]:
    """The environment's ``pytest`` script, as tox runs it: ``python -m pytest`` would put
    the checkout first on ``sys.path``, so the tests would import the package from the
    source tree while the processes they start import the installed one (the upstream
    environment installs a wheel)."""
    script = Path(sys.executable).with_name("pytest")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pytest"]


def run_once(index: int, seed: int, out: Path, timeout: float, extra: list[str]) -> Repetition:
    """One pytest session over the selected tests in seed ``seed``'s order."""
    report = out / "failures.jsonl"
    before = report.read_text(encoding="utf-8").count("\n") if report.exists() else 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    argv = [
        *_pytest_command(), f"--rootdir={ROOT}", "-p", "flaky_order",
        "--flaky-only", f"--flaky-seed={seed}", f"--flaky-report={report}",
        "-p", "no:cacheprovider", "-q", "-rfE", *extra,
    ]  # fmt: skip
    # (each option with its value in one argument: pytest takes an argument naming an
    # existing file, such as the report from the second repetition on, as a test path)
    start = time.monotonic()
    with open(out / f"rep-{index:03d}-seed-{seed}.log", "w", encoding="utf-8") as log:
        # its own session, so a hang is ended with every process it started and no other
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = None
        except BaseException:  # Ctrl-C or SIGTERM to this script: the session's group ends too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    seconds = time.monotonic() - start
    counts: dict[str, int] = {}
    if report.exists():
        for line in report.read_text(encoding="utf-8").splitlines()[before:]:
            record = json.loads(line)
            if "session" in record:
                counts = record["counts"]
    if status is None:
        running = Path(f"{report}.running")
        test = running.read_text(encoding="utf-8") if running.exists() else "?"
        with open(report, "a", encoding="utf-8") as out_file:
            hang = {
                "nodeid": f"{test} (repetition {index}: killed after {timeout:.0f}s in it)",
                "when": "hang",
                "seed": seed,
                "failure": (out / f"rep-{index:03d}-seed-{seed}.log").read_text()[-20000:],
                "output": [],
            }
            out_file.write(json.dumps(hang) + "\n")
    return Repetition(index, seed, seconds, status, counts)


def summarize(out: Path, reps: list[Repetition], hog: int, load: list[float]) -> str:
    failures: dict[str, list[dict]] = {}
    report = out / "failures.jsonl"
    if report.exists():
        for line in report.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "nodeid" in record:
                failures.setdefault(record["nodeid"], []).append(record)
    lines = [
        f"repetitions: {len(reps)}; CPU hog: {hog} busy processes on {os.cpu_count()} CPUs",
        (
            f"1-minute load average over the run: mean {sum(load) / len(load):.1f}, "
            f"min {min(load):.1f}, max {max(load):.1f} ({len(load)} samples)"
            if load
            else "load average: not sampled"
        ),
    ]
    for rep in reps:
        status = "killed (hang)" if rep.exit_status is None else f"exit {rep.exit_status}"
        counts = ", ".join(f"{n} {k}" for k, n in sorted(rep.counts.items()))
        lines.append(f"  #{rep.index} seed {rep.seed}: {rep.seconds:.0f}s, {status}; {counts}")
    if not failures:
        lines.append("no test failed")
    else:
        lines.append(f"{len(failures)} tests failed at least once:")
        for nodeid, records in sorted(failures.items()):
            seeds = sorted({r["seed"] for r in records})
            lines.append(f"  {nodeid}: {len(records)} failures, seeds {seeds}")
        for nodeid, records in sorted(failures.items()):
            first = records[0]
            lines.append(f"\n===== {nodeid} ({first['when']}, seed {first['seed']}) =====")
            lines.append(first["failure"])
            for section in first["output"]:
                lines.append(f"----- {section['name']} -----")
                lines.append(section["text"])
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--repetitions", type=int, default=30)
    parser.add_argument(
        "--seed", type=int, default=None, help="first seed (default: from the clock)"
    )
    parser.add_argument(
        "--hog", type=int, default=os.cpu_count() or 1, help="busy processes (default: CPU count)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds after which a repetition counts as hung and is killed (default 3600)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds: start no repetition that the longest one so far says would end later",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results folder (default: a temp dir)"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        parser.error(f"--repetitions: expected a count of 1 or more, got {args.repetitions}")
    if args.hog < 0:
        parser.error(f"--hog: expected 0 or more busy processes, got {args.hog}")
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    out = args.out or Path(tempfile.mkdtemp(prefix="flaky-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"results in {out}; seeds {seed}..{seed + args.repetitions - 1}", flush=True)
    # SIGTERM ends the run as Ctrl-C does: the running session and the hog are stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    reps: list[Repetition] = []
    interrupted = False
    sampler = LoadSampler()
    start = time.monotonic()
    with Hog(args.hog):
        sampler.start()
        try:
            for index in range(args.repetitions):
                if args.budget is not None and reps:
                    longest = max(rep.seconds for rep in reps)
                    if time.monotonic() - start + longest > args.budget:
                        print(f"--budget {args.budget:.0f}s: stopping after {len(reps)}")
                        break
                try:
                    rep = run_once(index, seed + index, out, args.timeout, args.pytest_args)
                except (KeyboardInterrupt, SystemExit):
                    print(f"interrupted in repetition #{index}: it is not counted", flush=True)
                    interrupted = True
                    break
                reps.append(rep)
                print(
                    f"#{index} seed {rep.seed}: {rep.seconds:.0f}s, exit {rep.exit_status}, "
                    f"{rep.counts}",
                    flush=True,
                )
        finally:
            sampler.stop()
    print(summarize(out, reps, args.hog, sampler.samples), end="")
    failed = any(rep.exit_status != 0 for rep in reps)
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
