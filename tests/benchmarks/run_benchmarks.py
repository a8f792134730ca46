"""What the span lifecycle and the instrumentation cost, as ratios measured in one run.

Each figure is ours over a baseline measured in the same process (or, for the
training loop, the same run of this script), interleaved repetition by
repetition so drift in machine load hits both sides alike; we report medians.
Nothing here asserts a time: the figures are printed, a readable table first,
and as the last line one JSON object (the keys of the README's Performance table).

Run with ``tox -e bench`` (or ``python tests/benchmarks/run_benchmarks.py``);
``--only encode,pipeline`` runs some sections (``--list`` names them all).
Each section is one function in the module of its subject (``lifecycle``,
``export_pipeline``, ``training``, ``reader``, ``timeline``, ``trace_commands``;
what they share is in ``harness``), registered in ``SECTIONS`` with the keys it
records; a new benchmark is a function, a ``SECTIONS`` row and its targets
(in ``targets``).
Kept out of the default test run: pytest collects only ``test_*.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

from export_pipeline import section_encode, section_pipeline
from harness import Run
from lifecycle import section_lifecycle, section_reroot, section_step
from reader import section_report, section_selection
from targets import TARGETS
from timeline import section_timeline
from trace_commands import section_trace
from training import section_sigterm, section_training

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
}


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
    args = parser.parse_args(argv)
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

    run = Run(quick=args.quick)
    for name in chosen:
        SECTIONS[name](run)

    width = max([len("key"), *(len(key) for key, *_ in run.rows)]) + 2
    print(f"{'key':<{width}}{'median':>10}  {'target':>7}  {'ours':<22}baseline")
    for key, value, ours_text, base_text in run.rows:
        print(f"{key:<{width}}{value:>10}  {TARGETS[key]:>7}  {ours_text:<22} {base_text}")
    print(f"# {os.cpu_count()} cpus, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    print(json.dumps(run.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
