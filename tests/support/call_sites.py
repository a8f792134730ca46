"""Megatron-LM's span lifecycle driven through its own call sites, on fakes.

A Megatron-LM ``training.py`` (pristine, or after any prefix of the port's
patch series) is read for the statements that drive the job-level span
lifecycle: its module-level definitions (the ``_otel`` functions and their
globals, or the import of ``telemetry_spans``), the block in ``pretrain()``
that opens the lifecycle and installs the exit hooks, the ``except`` around
``train()``, ``pretrain()``'s last lifecycle call, and in ``train()`` the
calls before the loop, at the top of each pass, on the early-exit path and
after the loop. Those statements, exactly as the file has them, are put into
a small ``pretrain()``/``train()`` of the same shape (:func:`skeleton`) and
run in a fresh process per scenario (``call_site_runner.py``), with a fake
telemetry handle, tracer and tracer provider that write every span, flush and
shutdown to a file as it happens: a process that dies of its SIGTERM leaves
its record behind. Two trees run the same scenarios and their records are
compared (:func:`normalised`).

Only the lifecycle's statements come from the file; everything between them
(model build, data, the step itself) is the scenario's: a fault, a signal, an
early exit, at a chosen pass.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from megatron.training.port_upstream.training_py import DELETED

RUNNER = Path(__file__).resolve().parent / "call_site_runner.py"
TRAINING = Path("megatron/training/training.py")
MODULE = Path("megatron/training/telemetry_spans.py")

#: Names that mark a statement as the lifecycle's: the pristine functions and
#: globals, or what the port writes in their place.
_PORTED = ("_otel_phases", "SpanPhases", "install_exit_hooks", "telemetry_spans")
_LIFECYCLE = re.compile(r"\b(" + "|".join(DELETED + _PORTED) + r")\b")


class NotFound(Exception):
    """A call site the extraction expects is not in the file."""


def _mentions(node: ast.AST) -> bool:
    return bool(_LIFECYCLE.search(ast.unparse(node)))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise NotFound(f"def {name}(")


def _first_run(body: list[ast.stmt]) -> list[ast.stmt]:
    """The first run of consecutive statements of ``body`` that are the lifecycle's."""
    run: list[ast.stmt] = []
    for stmt in body:
        if _mentions(stmt):
            run.append(stmt)
        elif run:
            break
    return run


@dataclass(frozen=True)
class CallSites:
    """The lifecycle's statements of one ``training.py``, as source text."""

    module: str  # module-level definitions
    start: str  # pretrain(): open the lifecycle, record phases, install the hooks
    handler: str  # pretrain(): the `except ...:` clause around train(), its body
    end: str  # pretrain(): its last lifecycle statement
    before_loop: str  # train(): before the loop
    each_pass: str  # train(): at the top of every pass
    early_exit: str  # train(): before its sys.exit()
    after_loop: str  # train(): after the loop


def extract(text: str) -> CallSites:
    """The call sites of ``training.py``'s ``text`` (raises NotFound)."""
    tree = ast.parse(text)
    module = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.Assign | ast.AnnAssign) and _mentions(node):
            if isinstance(node, ast.FunctionDef) and node.name in ("pretrain", "train"):
                continue
            module.append(node)
        elif isinstance(node, ast.ImportFrom) and _mentions(node):
            module.append(node)
    pretrain, train = _function(tree, "pretrain"), _function(tree, "train")
    start = _first_run(pretrain.body)
    handlers = [
        node
        for node in ast.walk(pretrain)
        if isinstance(node, ast.ExceptHandler) and any(_mentions(s) for s in node.body)
    ]
    ends = [stmt for stmt in pretrain.body if _mentions(stmt) and stmt not in start]
    before = _first_run(train.body)
    loops = [node for node in train.body if isinstance(node, ast.While)]
    after = [stmt for stmt in train.body if _mentions(stmt) and stmt not in before]
    if not (start and len(handlers) == 1 and ends and before and loops and after):
        raise NotFound("the lifecycle's call sites in pretrain() and train()")
    loop = loops[-1]
    each_pass = _first_run(loop.body)
    exits = [
        stmt
        for node in train.body
        if isinstance(node, ast.If) and "sys.exit" in ast.unparse(node)
        for stmt in node.body
        if _mentions(stmt)
    ]
    (handler,) = handlers
    clause = ast.unparse(handler).splitlines()[0]
    return CallSites(
        module="\n\n".join(ast.unparse(node) for node in module),
        start="\n".join(ast.unparse(stmt) for stmt in start),
        handler="\n".join(
            [clause, *("    " + line for s in handler.body for line in ast.unparse(s).splitlines())]
        ),
        end=ast.unparse(ends[-1]),
        before_loop="\n".join(ast.unparse(stmt) for stmt in before),
        each_pass="\n".join(ast.unparse(stmt) for stmt in each_pass),
        early_exit="\n".join(ast.unparse(stmt) for stmt in exits),
        after_loop=ast.unparse(after[-1]),
    )


def _indent(text: str, by: int) -> str:
    return "\n".join(" " * by + line if line else line for line in text.splitlines())


def skeleton(sites: CallSites) -> str:
    """A module whose ``pretrain()`` and ``train()`` run the call sites in Megatron-LM's
    order, the rest of the work stood in for by the ``scenario``."""
    return f"""
{sites.module}


def pretrain(model_type, scenario):
    args = get_args()
    program_start = _STARTUP_TIMESTAMPS.get("program_start")
    main_entry = _STARTUP_TIMESTAMPS.get("main_entry")
    pretrain_entry = _STARTUP_TIMESTAMPS.get("pretrain_entry")
    timestamp_after_inprocess_setup = pretrain_entry + 1.0
    timestamp_after_in_job_setup = pretrain_entry + 2.0
    timestamp_after_initialize_megatron = pretrain_entry + 3.0
    timestamp_after_set_jit_fusion_options = pretrain_entry + 4.0
{_indent(sites.start, 4)}
    scenario.startup()
    if scenario.trains():
        try:
            train(scenario)
{_indent(sites.handler, 8)}
{_indent(sites.end, 4)}


def train(scenario):
    args = get_args()
    iteration = scenario.first_iteration
    scenario.before_loop()
{_indent(sites.before_loop, 4)}
    while iteration < args.train_iters:
{_indent(sites.each_pass, 8)}
        scenario.step(iteration)
        iteration += 1
        if scenario.should_exit(iteration):
            break
    if scenario.should_exit(iteration):
{_indent(sites.early_exit, 8)}
        sys.exit(0)
{_indent(sites.after_loop, 4)}
    return iteration
"""


@dataclass(frozen=True)
class Scenario:
    """What the process does around the lifecycle's call sites (see the runner)."""

    name: str
    calls: tuple[str, ...] = ("pretrain",)  # each "pretrain" or "train" (train() alone)
    save_interval: int = 2
    train_iters: int = 5
    first_iteration: int = 0
    telemetry: str = "exporting"  # "exporting", "not_exporting" or "none"
    groups: tuple[str, ...] = ("job", "step")  # the span groups on (exporting only)
    fault_at: int | None = None  # a RuntimeError raised in that pass
    interrupt_at: int | None = None  # a KeyboardInterrupt raised in that pass
    signal_at: int | None = None  # a SIGTERM sent to itself in that pass (-1: at startup)
    startup_fault: bool = False  # a RuntimeError between the start block and train()
    exit_signal_handler: bool = False  # --exit-signal-handler: a drain handler first
    previous: str = "default"  # SIGTERM's disposition before: "default", "ignore", "handler"
    exit_at: int | None = None  # --exit-interval: train()'s early exit after that pass
    #: Telemetry that fails (see the runner): "start:NAME" (start_span of NAME raises, that
    #: many times), "context:NAME" (its get_span_context raises), "attribute" (every
    #: set_attribute raises), "not_recording", "link" (trace.Link raises), "detach"
    #: (context.detach raises), "shutdown" (the handle's shutdown raises, that many times).
    faults: dict = field(default_factory=dict)
    signal_in_shutdown: bool = False  # a SIGTERM to itself inside the handle's shutdown()
    save_interval_in_train: int | None = None  # --save-interval as train() reads it
    timestamps: dict = field(
        default_factory=lambda: {
            "program_start": 100.0,
            "main_entry": 101.0,
            "pretrain_entry": 102.0,
        }
    )


def run(training_py: Path, module: Path | None, scenario: Scenario, work: Path) -> dict:
    """``scenario`` through ``training_py``'s call sites (and ``module``, the tree's
    ``telemetry_spans.py``, if it has one) in a process of its own: its exit status
    and the record it left."""
    work.mkdir(parents=True, exist_ok=True)
    record = work / f"{scenario.name}.jsonl"
    record.unlink(missing_ok=True)
    (work / f"{scenario.name}.py").write_text(skeleton(extract(training_py.read_text())))
    command = [
        sys.executable,
        str(RUNNER),
        str(work / f"{scenario.name}.py"),
        str(module or ""),
        json.dumps(asdict(scenario)),
        str(record),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    events = (
        [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    )
    return {"returncode": done.returncode, "events": events, "stderr": done.stderr}


def normalised(events: list[dict]) -> list[dict]:
    """The record with span and trace ids numbered in order of appearance."""
    ids: dict[str, int] = {}

    def number(value: str | None) -> int | None:
        return None if value is None else ids.setdefault(value, len(ids))

    out = []
    for event in events:
        event = dict(event)
        for key in ("span", "parent", "trace"):
            if key in event:
                event[key] = number(event[key])
        if "links" in event:
            event["links"] = [number(link) for link in event["links"]]
        out.append(event)
    return out


def differences(theirs: list[dict], ours: list[dict]) -> Iterator[str]:
    """Line by line, where two normalised records part."""
    for index in range(max(len(theirs), len(ours))):
        a = theirs[index] if index < len(theirs) else None
        b = ours[index] if index < len(ours) else None
        if a != b:
            yield f"event {index}: pristine {a} / ported {b}"
