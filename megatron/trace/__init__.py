"""``megatron-trace``: read a training job's OpenTelemetry trace files back.

The command line (``megatron-trace check | report | timeline | export | diff``,
:mod:`megatron.trace.cli`) is a thin layer over this API::

    from megatron.trace import load_trace, build_report, check_files

    trace = load_trace(["runs/demo/telemetry/traces.jsonl"])
    report = build_report(trace)            # a Report: where the wall clock went
    print(json.dumps(report_json(report)))  # as report --json prints it: reasons in words
    result = check_files(rank_files)        # the lifecycle's rules: result.violations
    export_files(rank_files, Path("job.pftrace"), "perfetto")
    write_timeline(rank_files, Path("timeline.html"))

Every function takes many files (one per rank, rotated pieces), reads them
in parallel processes (``jobs``) or on any ``concurrent.futures.Executor``,
and raises a :class:`TraceError` (with its ``exit_code``) for what it cannot
do. The package imports nothing from ``megatron.core`` or
``megatron.training``: it reads traces wherever Megatron-LM is installed, or
no trainer at all. Names load on first use, so importing the vocabulary
(:mod:`megatron.trace_format.semconv`) costs a writer nothing more.

``__version__`` (worked out on first use) is the installed distribution's version (its metadata), or
:data:`SOURCE_VERSION` with ``+source`` appended when the package runs from a
source tree that was never installed (``PYTHONPATH`` at a checkout).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.trace.analysis.check import CheckResult, check_files
    from megatron.trace.analysis.diff import Diff, build_diff
    from megatron.trace.analysis.goodput import build_report, report_files
    from megatron.trace.analysis.liveness import Clock, judge
    from megatron.trace.analysis.report import Report
    from megatron.trace.model.builder import load_trace
    from megatron.trace.model.incarnation import Incarnation, Trace
    from megatron.trace.render.export.write import export_files
    from megatron.trace.render.json.report import report_json
    from megatron.trace.render.timeline.write import write_timeline
    from megatron.trace_format.errors import NoSpansError, TraceError, TraceInputError
    from megatron.trace_format.semconv import Category

#: The distribution this package ships in, and the version pyproject.toml declares
#: (what ``__version__`` says from a source tree that has no metadata installed).
DISTRIBUTION = "megatron-telemetry-spans"
SOURCE_VERSION = "0.1.0"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path

    try:
        found = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return f"{SOURCE_VERSION}+source"
    # Installed somewhere, but is it this copy? A checkout on PYTHONPATH in front of
    # an install runs the checkout's code: say so, rather than the install's number.
    here = Path(__file__).resolve().parent
    installed = Path(str(found.locate_file("megatron/trace/__init__.py"))).resolve().parent
    if installed == here or _editable_home(found) == here.parent.parent:
        return found.version
    return f"{SOURCE_VERSION}+source"


def _editable_home(found: Any) -> Any:
    """The source root of an editable install (PEP 610 ``direct_url.json``), or None."""
    import json
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    text = found.read_text("direct_url.json")
    if not text:
        return None
    url = json.loads(text)
    if not url.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(urlparse(url["url"]).path)).resolve()


#: Public name -> the module that defines it.
_HOMES = {
    "load_trace": "megatron.trace.model.builder",
    "Trace": "megatron.trace.model.incarnation",
    "Incarnation": "megatron.trace.model.incarnation",
    "build_report": "megatron.trace.analysis.goodput",
    "report_files": "megatron.trace.analysis.goodput",
    "Report": "megatron.trace.analysis.report",
    "build_diff": "megatron.trace.analysis.diff",
    "Diff": "megatron.trace.analysis.diff",
    "check_files": "megatron.trace.analysis.check",
    "CheckResult": "megatron.trace.analysis.check",
    "Clock": "megatron.trace.analysis.liveness",
    "judge": "megatron.trace.analysis.liveness",
    "export_files": "megatron.trace.render.export.write",
    "report_json": "megatron.trace.render.json.report",
    "write_timeline": "megatron.trace.render.timeline.write",
    "Category": "megatron.trace_format.semconv",
    "TraceError": "megatron.trace_format.errors",
    "TraceInputError": "megatron.trace_format.errors",
    "NoSpansError": "megatron.trace_format.errors",
}

__all__ = [
    "Category",
    "CheckResult",
    "Clock",
    "Diff",
    "Incarnation",
    "NoSpansError",
    "Report",
    "Trace",
    "TraceError",
    "TraceInputError",
    "build_diff",
    "build_report",
    "check_files",
    "export_files",
    "judge",
    "load_trace",
    "report_files",
    "report_json",
    "write_timeline",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # on first use: reading metadata costs an importer nothing
        globals()[name] = value = _version()
        return value
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES, "__version__"])
