"""What the span lifecycle and the instrumentation cost, as ratios measured in one run.

Each figure is ours over a baseline measured in the same process (or, for the
training loop, the same run of this script), interleaved repetition by
repetition so drift in machine load hits both sides alike; we report medians.
Nothing here asserts a time: the figures are printed, a readable table first,
and as the last line one JSON object (the keys of the benchmarks' table). ``--json
PATH`` also writes them, with their targets, descriptions and the run's machine, to
a results file, from which ``table.py`` writes the table of ``tests/benchmarks/README.md``.

Run with ``tox -e bench`` (or ``python tests/benchmarks/run_benchmarks.py``);
``--only encode,pipeline`` runs some sections (``--list`` names them all).
Each section is one function in the module of its subject (``lifecycle``,
``export_pipeline``, ``training``, ``reader``, ``timeline``, ``trace_commands``,
``cluster``, ``watch``, ``receive``, ``inprocess``; what they share is in ``harness``, Megatron-LM's
own lifecycle helpers re-enacted as a baseline in ``upstream_helpers``), registered in
``SECTIONS`` with the keys it records; a new benchmark is a function, a ``SECTIONS`` row
and its target and description in ``targets``.
Kept out of the default test run: pytest collects only ``test_*.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from cluster import section_cluster
from export_pipeline import section_encode, section_pipeline
from goodput_commands import section_goodput
from harness import REPO_ROOT, Run
from history import section_history
from inprocess import section_inprocess
from lifecycle import section_lifecycle, section_reroot, section_step
from reader import section_report, section_selection
from receive import section_receive
from targets import DESCRIPTIONS, TARGETS, unit
from timeline import section_timeline
from trace_commands import section_trace
from training import section_sigterm, section_training
from watch import section_watch

#: Section name -> the function that runs it, in run order. Keep the cheap
#: sections first so a broken expensive one does not hide their figures.
SECTIONS: dict[str, Callable[[Run], None]] = {
    "step": section_step,
    "reroot": section_reroot,
    "lifecycle": section_lifecycle,
    "encode": section_encode,
    "pipeline": section_pipeline,
    "training": section_training,
    "sigterm": section_sigterm,
    "report": section_report,
    "timeline": section_timeline,
    "selection": section_selection,
    "trace": section_trace,
    "cluster": section_cluster,
    "watch": section_watch,
    "receive": section_receive,
    "goodput": section_goodput,
    "history": section_history,
    "inprocess": section_inprocess,
}


#: Packages whose versions the results file records beside Python's.
PACKAGES = ("torch", "opentelemetry-sdk", "transitions", "msgspec", "numpy", "plotly")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def machine(sections: list[str], quick: bool) -> dict[str, Any]:
    """What the figures were measured on and from: taken before the run, so the
    commit and whether the tree was clean are those of the code measured."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    # the results file and the benchmarks' table, which a run rewrites, are not the code
    status = _git(
        "status", "--porcelain", "--untracked-files=no", "--", ".",
        ":(exclude)tests/benchmarks/results.json", ":(exclude,glob)**/*.md",
    )  # fmt: skip
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "python": platform.python_version(),
        "torch": versions.pop("torch"),
        "packages": versions,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "sections": sections,
        "quick": quick,
    }


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def results_file(run: Run, run_info: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The results file's content: the run, then each key in the order measured with
    its figure, target, unit, description, whether it meets its target and the two
    texts the printed table shows beside it (ours, the baseline)."""
    results = {}
    for key, _, ours, base in run.rows:
        value, target = run.results[key], TARGETS[key]
        results[key] = {
            "value": _number(value),
            "target": _number(target),
            "meets": None if math.isnan(target) or math.isnan(value) else value <= target,
            "unit": unit(key),
            "description": DESCRIPTIONS[key],
            "ours": ours,
            "baseline": base,
        }
    return {"run": {**run_info, "seconds": round(seconds)}, "results": results}


def main(argv: list[str] | None = None) -> int:
    # Not taken from __doc__, which ``python -OO`` strips.
    parser = argparse.ArgumentParser(
        description="What the span lifecycle and the instrumentation cost, as ratios "
        "measured in one run."
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help=f"comma-separated sections to run (default: all): {', '.join(SECTIONS)}",
    )
    parser.add_argument("--list", action="store_true", help="print the section names and exit")
    parser.add_argument(
        "--json",
        metavar="PATH",
        type=Path,
        help="also write the results, with targets, descriptions and the machine, to PATH "
        "(tests/benchmarks/table.py turns it into tests/benchmarks/README.md's table)",
    )
    args = parser.parse_args(argv)
    if set(DESCRIPTIONS) != set(TARGETS):  # before a run's minutes, not after them
        parser.error(
            f"targets.py: TARGETS and DESCRIPTIONS differ in {set(DESCRIPTIONS) ^ set(TARGETS)}"
        )
    if args.list:
        print("\n".join(SECTIONS))
        return 0
    chosen = list(SECTIONS)
    if args.only:
        chosen = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in SECTIONS]
        if unknown or not chosen:
            parser.error(
                f"--only: unknown section(s) {', '.join(unknown) or '(none)'}; "
                f"valid: {', '.join(SECTIONS)}"
            )

    run_info = machine(chosen, args.quick) if args.json else {}
    started = time.perf_counter()
    run = Run(quick=args.quick)
    for name in chosen:
        SECTIONS[name](run)

    width = max([len("key"), *(len(key) for key, *_ in run.rows)]) + 2
    print(f"{'key':<{width}}{'median':>10}  {'target':>7}  {'ours':<22}baseline")
    for key, value, ours_text, base_text in run.rows:
        print(f"{key:<{width}}{value:>10}  {TARGETS[key]:>7}  {ours_text:<22} {base_text}")
    print(f"# {os.cpu_count()} cpus, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    print(json.dumps(run.results))
    if args.json:
        document = results_file(run, run_info, time.perf_counter() - started)
        args.json.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
