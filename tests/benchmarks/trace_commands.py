"""Every ``megatron-trace`` command as a whole process against the floor any
pure-Python reader pays, their peak RSS and how it grows with the file (section
``trace``)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import REPO_ROOT, Run, synthetic_trace_file

# -- reading a week of many ranks: each command against the stdlib floor --------

# Every process reports the peak RSS of its biggest process on stderr, last line:
# its own (VmHWM, which starts afresh at exec: a child's ru_maxrss would start at
# this big process's) or that of the biggest of the workers it forked and waited for.
_PEAK = (
    "import atexit, resource, sys\n"
    "def _peak():\n"
    "    with open('/proc/self/status') as status:\n"
    "        kb = next(int(l.split()[1]) for l in status if l.startswith('VmHWM:'))\n"
    "    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "    print(f'peak_kb {max(kb, workers)}', file=sys.stderr)\n"
    "atexit.register(_peak)\n"
)
FLOOR_SCRIPT = _PEAK + (
    "import json\n"
    "with open(sys.argv[1], 'rb') as file:\n"
    "    for line in file:\n"
    "        json.loads(line)\n"
)
TRACE_SCRIPT = _PEAK + (
    "import runpy\n"
    "if sys.argv[1] == 'stdlib':\n"
    "    sys.modules['msgspec'] = None  # as if it were not installed\n"
    "sys.argv = ['megatron-trace', *sys.argv[2:]]\n"
    "runpy.run_module('megatron.trace', run_name='__main__')\n"
)


def measure_process(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one whole process (CPU from its own ``wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # as installed: with bytecode cached (an installer writes it), not compiled at each start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        errors.seek(0)
        said = errors.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # check exits 1 on a violation; none is expected
        raise RuntimeError(f"{' '.join(argv)}: exit {code}: {said[-500:]}")
    peak_kb = int(said.rsplit("peak_kb ", 1)[1].split()[0])
    return wall, usage.ru_utime + usage.ru_stime, peak_kb / 1024


def bench_trace_commands(repeats: int, spans: int = 1_000_000) -> dict[str, Any]:
    """Every ``megatron-trace`` reader as a whole process against the floor, interleaved.

    The floor is what any pure-Python reader must pay: ``json.loads`` of every
    line of the same file, in a process of its own. The file is a synthetic
    two-rank ``per_step`` trace (a SIGKILL and a resume on each rank, 100
    iterations an interval), written as the sink writes. A second file of as
    many spans has an interval every 4 iterations (a hundred thousand
    intervals): its ratios say what the number of intervals costs. (It is as
    big as the first so that the fixed cost of starting a process weighs the
    same in both; on a file a quarter the size it added a fifth to each ratio.)
    Two more files have the ``communication`` group too (gradient all-reduce spans:
    what ``report`` splits into work and wait per rank), of 1M and 4M spans: every
    command's peak RSS on the second over the first says how its memory grows with
    the file.
    """
    py = sys.executable
    directory = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    try:
        path, count, size_mb = synthetic_trace_file(
            directory, "traces.jsonl", ranks=2, spans=spans, incarnations=2
        )
        many, many_count, _ = synthetic_trace_file(
            directory, "many.jsonl", ranks=2, spans=spans, save_interval=4
        )
        comm, comm_count, _ = synthetic_trace_file(
            directory, "comm.jsonl", ranks=2, spans=spans, incarnations=2, communication=True
        )
        comm4, _, _ = synthetic_trace_file(
            directory, "comm4.jsonl", ranks=2, spans=4 * spans, incarnations=2, communication=True
        )
        out = directory / "out"

        def trace(*args: str) -> list[str]:
            return [py, "-c", TRACE_SCRIPT, "msgspec", *args]

        commands = {
            "floor": [py, "-c", FLOOR_SCRIPT, str(path)],
            "report": trace("report", str(path)),
            "check": trace("check", str(path)),
            "export": trace("export", str(path), "-o", f"{out}.json"),
            "export_perfetto": trace(
                "export", str(path), "--format", "perfetto", "-o", f"{out}.pftrace"
            ),
            "report_fallback": [py, "-c", TRACE_SCRIPT, "stdlib", "report", str(path)],
            "many_floor": [py, "-c", FLOOR_SCRIPT, str(many)],
            "many_export": trace("export", str(many), "-o", f"{out}-many.json"),
            "many_report": trace("report", str(many)),
            "many_check": trace("check", str(many)),
            "many_export_perfetto": trace(
                "export", str(many), "--format", "perfetto", "-o", f"{out}-many.pftrace"
            ),
            "comm_floor": [py, "-c", FLOOR_SCRIPT, str(comm)],
            "comm_report": trace("report", str(comm)),
            "comm_check": trace("check", str(comm)),
            "comm_export": trace("export", str(comm), "-o", f"{out}-comm.json"),
            "comm_export_perfetto": trace(
                "export", str(comm), "--format", "perfetto", "-o", f"{out}-comm.pftrace"
            ),
            "comm_timeline": trace("timeline", str(comm), "-o", f"{out}-comm.html"),
            "comm4_report": trace("report", str(comm4)),
            "comm4_check": trace("check", str(comm4)),
            "comm4_export": trace("export", str(comm4), "-o", f"{out}-comm4.json"),
            "comm4_export_perfetto": trace(
                "export", str(comm4), "--format", "perfetto", "-o", f"{out}-comm4.pftrace"
            ),
            "comm4_timeline": trace("timeline", str(comm4), "-o", f"{out}-comm4.html"),
        }
        measured: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, argv in commands.items():
                measured[name].append(measure_process(argv))
                # the growth runs' outputs (up to a GB): gone before their pages are
                # written back, so the disk is as quiet for the next command as before
                for output in directory.glob("out-comm*"):
                    output.unlink()
        sizes = {
            "json": Path(f"{out}.json").stat().st_size / 2**20,
            "perfetto": Path(f"{out}.pftrace").stat().st_size / 2**20,
        }
    finally:
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()

    def median(name: str, field: int) -> float:
        return statistics.median(sample[field] for sample in measured[name])

    return {
        "spans": count,
        "size_mb": size_mb,
        "many_spans": many_count,
        "comm_spans": comm_count,
        "sizes": sizes,
        "wall": {name: median(name, 0) for name in commands},
        "cpu": {name: median(name, 1) for name in commands},
        "peak_mb": {name: median(name, 2) for name in commands},
    }


def section_trace(run: Run) -> None:
    figures = bench_trace_commands(1 if run.quick else 5)
    wall, cpu, peak = figures["wall"], figures["cpu"], figures["peak_mb"]
    per_million = 1e6 / figures["spans"]
    for name in ("report", "check", "export", "export_perfetto", "report_fallback"):
        run.record(
            f"{name}_floor_ratio",
            wall[name] / wall["floor"],
            f"{wall[name] * per_million:.2f} s/M spans, cpu {cpu[name] / cpu['floor']:.2f}x",
            f"floor {wall['floor'] * per_million:.2f} s/M spans ({figures['spans']} spans, "
            f"{figures['size_mb']:.0f} MB)",
        )
    for name in ("export", "report", "check", "export_perfetto"):
        many = f"many_{name}"
        run.record(
            f"{name}_many_intervals_floor_ratio",
            wall[many] / wall["many_floor"],
            f"{wall[many] * 1e6 / figures['many_spans']:.2f} s/M spans, "
            f"cpu {cpu[many] / cpu['many_floor']:.2f}x",
            f"an interval every 4 iterations ({figures['many_spans']} spans)",
        )
    run.record(
        "check_peak_mb_1m_spans", peak["check"], "peak RSS", f"floor process {peak['floor']:.1f} MB"
    )
    run.record(
        "report_communication_floor_ratio",
        wall["comm_report"] / wall["comm_floor"],
        f"{wall['comm_report'] * 1e6 / figures['comm_spans']:.2f} s/M spans",
        f"with grad_sync spans ({figures['comm_spans']} spans)",
    )
    for name in ("report", "check", "export", "export_perfetto", "timeline"):
        run.record(
            f"{name}_peak_growth_4x_spans",
            peak[f"comm4_{name}"] / peak[f"comm_{name}"],
            f"{peak[f'comm4_{name}']:.1f} MB at 4M spans",
            f"{peak[f'comm_{name}']:.1f} MB at 1M",
        )
    run.record(
        "export_perfetto_size_ratio",
        figures["sizes"]["perfetto"] / figures["sizes"]["json"],
        f"{figures['sizes']['perfetto']:.0f} MB",
        f"chrome JSON {figures['sizes']['json']:.0f} MB",
    )
