"""The port's rewrite of Megatron-LM's ``megatron/training/training.py``.

It deletes the eleven ``_otel`` lifecycle functions, their module globals, the
exit-hook installer written inline in ``pretrain()`` and the comments about
them, imports ``telemetry_spans`` in their place, and rewrites each call site
to one ``SpanPhases`` trigger or to ``install_exit_hooks``. What the call sites
pass depends on the patch (:class:`CallSites`): ``step(iteration)`` once the
lifecycle records the iterations an interval covers, ``shutdown(cause=...)``
once it records why a run ended.

It edits text by recognised anchors: the definitions (found with ``ast``) and
the known call-site lines. Every anchor is looked for before anything is
written; a file it does not recognise raises :class:`NotRecognised` naming
what it could not find.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TRAINING = Path("megatron/training/training.py")

#: The lifecycle functions ``telemetry_spans.py`` replaces.
LIFECYCLE_FUNCTIONS = (
    "_otel_telemetry_active",
    "_start_otel_job_spans",
    "_otel_mark_goodput",
    "_backdated_otel_span",
    "_end_otel_startup_span",
    "_start_otel_train_span",
    "_reroot_otel_interval",
    "_maybe_reroot_otel_interval",
    "_end_otel_interval_span",
    "_end_otel_train_span",
    "_end_otel_job_spans",
)
#: Their module-level state.
LIFECYCLE_GLOBALS = (
    "_otel_startup_span",
    "_otel_startup_span_ctx",
    "_otel_ctx_module",
    "_otel_startup_ctx_token",
    "_otel_shutdown_done",
    "_otel_interval_span",
    "_otel_interval_ctx_token",
    "_otel_trace_interval_step",
    "_otel_exit_hooks_installed",
)
DELETED = LIFECYCLE_FUNCTIONS + LIFECYCLE_GLOBALS
_DELETED_NAME = re.compile(r"\b(" + "|".join(map(re.escape, DELETED)) + r")\b")

IMPORT_LINES = (
    "",
    "# OTel: the job-level span lifecycle (megatron.startup, one megatron.train per",
    "# checkpoint interval) and its exit hooks, as a state machine: telemetry_spans.py.",
    "from megatron.training.telemetry_spans import SpanPhases, install_exit_hooks, mark_goodput",
)


@dataclass(frozen=True)
class CallSites:
    """What the rewritten call sites pass to the lifecycle."""

    #: ``step(iteration)`` at the top of each pass (else ``step()``).
    step_iteration: bool = False
    #: ``shutdown(cause=...)`` with the exception unwinding through ``pretrain()``.
    shutdown_cause: bool = False


class NotRecognised(Exception):
    """An anchor the port needs is missing: names it."""


@dataclass
class _Edit:
    """Replace lines ``start``..``end`` (1-based, inclusive) by ``lines``."""

    start: int
    end: int
    lines: list[str] = field(default_factory=list)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


class _TrainingPy:
    """``training.py``'s text, its syntax tree, and the edits planned on it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines()
        try:
            self.tree = ast.parse(text)
        except SyntaxError as err:
            raise NotRecognised(f"{TRAINING} does not parse: {err}") from None
        self.edits: list[_Edit] = []
        self.replaced: set[int] = set()

    # -- finding ---------------------------------------------------------

    def function(self, name: str, scope: Iterable[ast.stmt] | None = None) -> ast.FunctionDef:
        for node in self.tree.body if scope is None else scope:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        raise NotRecognised(f"{TRAINING}: could not find `def {name}(`")

    def line_of(self, node: ast.AST) -> str:
        return self.lines[node.lineno - 1]

    def call_lines(self, function: ast.FunctionDef, callee: str) -> list[int]:
        """Line numbers of the statements in ``function`` that are a bare ``callee(...)``."""
        found = []
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == callee
            ):
                found.append(node)
        return sorted(found, key=lambda n: n.lineno)

    def comment_block_above(self, lineno: int) -> int:
        """The first line of the comment lines directly above ``lineno`` (or ``lineno``)."""
        first = lineno
        while first > 1 and self.lines[first - 2].lstrip().startswith("#"):
            first -= 1
        return first

    # -- planning --------------------------------------------------------

    def plan(self, start: int, end: int, lines: list[str]) -> None:
        span = set(range(start, end + 1))
        if span & self.replaced:
            raise NotRecognised(f"{TRAINING}: overlapping anchors at line {start}")
        self.replaced |= span
        self.edits.append(_Edit(start, end, lines))

    def delete_node(self, node: ast.stmt, with_comments: bool = True) -> None:
        first = node.lineno
        if getattr(node, "decorator_list", None):
            first = min(d.lineno for d in node.decorator_list)
        if with_comments:
            first = self.comment_block_above(first)
        self.plan(first, node.end_lineno, [])

    def replace_call(self, node: ast.stmt, new: list[str]) -> None:
        """``node`` (a statement) by ``new``, at its indentation; the comment block
        directly above it goes too when it is about telemetry (``# OTel``) or
        speaks of the deleted functions: ``new`` brings its own."""
        indent = _indent(self.line_of(node))
        first = self.comment_block_above(node.lineno)
        block = "\n".join(self.lines[first - 1 : node.lineno - 1])
        if not (block.lstrip().startswith("# OTel") or _DELETED_NAME.search(block)):
            first = node.lineno
        self.plan(first, node.end_lineno, [indent + line if line else "" for line in new])

    def apply(self) -> str:
        lines = list(self.lines)
        for edit in sorted(self.edits, key=lambda e: e.start, reverse=True):
            end = edit.end
            # A block deleted from between two blank lines takes one of them along.
            between_blanks = (
                not edit.lines
                and edit.start > 1
                and end < len(lines)
                and not lines[edit.start - 2].strip()
                and not lines[end].strip()
            )
            if between_blanks:
                end += 1
            lines[edit.start - 1 : end] = edit.lines
        text = "\n".join(lines) + "\n"
        # A deletion between two blank-line-separated blocks leaves a run of blanks.
        return re.sub(r"\n{4,}", "\n\n\n", text)


def _one(found: list, what: str, where: str) -> ast.stmt:
    if len(found) != 1:
        raise NotRecognised(
            f"{TRAINING}: could not find exactly one `{what}` in {where}() (found {len(found)})"
        )
    return found[0]


def _plan_module_scope(py: _TrainingPy) -> None:
    """Delete the lifecycle functions and globals; import telemetry_spans in their place."""
    for name in LIFECYCLE_FUNCTIONS:
        py.delete_node(py.function(name))
    seen = set()
    for node in py.tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        if targets and set(targets) <= set(LIFECYCLE_GLOBALS):
            py.delete_node(node)
            seen.update(targets)
    missing = [name for name in LIFECYCLE_GLOBALS if name not in seen]
    if missing:
        raise NotRecognised(f"{TRAINING}: could not find the module global `{missing[0]} = ...`")
    # After the block that imports nemo-lens's helpers (or the fallbacks) as _otel_*.
    for node in py.tree.body:
        if isinstance(node, ast.Try) and "_otel_sg_enabled" in ast.unparse(node):
            py.plan(node.end_lineno + 1, node.end_lineno, list(IMPORT_LINES))
            return
    raise NotRecognised(
        f"{TRAINING}: could not find the `try: from nemo.lens.state import "
        "is_span_group_enabled as _otel_sg_enabled` block"
    )


_SAVE_INTERVAL = "getattr(args, 'save_interval', None) or 0"


def _plan_pretrain(py: _TrainingPy, sites: CallSites) -> None:
    pretrain = py.function("pretrain")
    start = _one(
        py.call_lines(pretrain, "_start_otel_job_spans"), "_start_otel_job_spans(", "pretrain"
    )
    py.replace_call(
        start,
        [
            "# OTel: this pretrain()'s span lifecycle: pre_startup (when due), then the",
            "# megatron.startup trace, which the megatron.startup.* phases below nest in.",
            "_otel_phases = SpanPhases(",
            "    get_telemetry(),",
            f"    save_interval={_SAVE_INTERVAL},",
            "    is_span_group_enabled=_otel_sg_enabled,",
            ")",
            "_otel_phases.start_job(",
            "    model_type, timestamps={**_STARTUP_TIMESTAMPS, 'program_start': program_start}",
            ")",
        ],
    )
    phases = py.call_lines(pretrain, "_backdated_otel_span")
    if not phases:
        raise NotRecognised(f"{TRAINING}: could not find `_backdated_otel_span(` in pretrain()")
    for node in phases:
        line = py.line_of(node)
        py.plan(
            node.lineno,
            node.lineno,
            [line.replace("_backdated_otel_span(", "_otel_phases.record_phase(", 1)],
        )
        for lineno in range(node.lineno + 1, node.end_lineno + 1):
            py.plan(lineno, lineno, [py.lines[lineno - 1]])

    # The inline installer: `global _otel_exit_hooks_installed` and the `if` it guards.
    declaration = [
        node
        for node in ast.walk(pretrain)
        if isinstance(node, ast.Global) and "_otel_exit_hooks_installed" in node.names
    ]
    declaration = _one(declaration, "global _otel_exit_hooks_installed", "pretrain")
    installer = [
        node
        for node in ast.walk(pretrain)
        if isinstance(node, ast.If) and "_otel_telemetry_active()" in ast.unparse(node.test)
    ]
    installer = _one(installer, "if _otel_telemetry_active() ...:", "pretrain")
    indent = _indent(py.line_of(declaration))
    py.plan(
        py.comment_block_above(declaration.lineno),
        installer.end_lineno,
        [
            indent + line
            for line in (
                "# OTel: the exit hooks exist only to flush telemetry, so they are installed",
                "# only while it exports, once per process: an atexit fallback and a SIGTERM",
                "# handler (flush only under --exit-signal-handler, else end and export what",
                "# is open, then pass the signal on).",
                # one line, as Megatron-LM's black (-l 100 -C) leaves it
                "install_exit_hooks(_otel_phases, "
                "graceful=bool(getattr(args, 'exit_signal_handler', False)))",
            )
        ],
    )

    # The exception path: `except Exception: _end_otel_job_spans(); raise`. (The
    # installer's own signal handler, deleted above, calls it too.)
    inside = range(installer.lineno, installer.end_lineno + 1)
    ends = [n for n in py.call_lines(pretrain, "_end_otel_job_spans") if n.lineno not in inside]
    handlers = [
        node
        for node in ast.walk(pretrain)
        if isinstance(node, ast.ExceptHandler)
        and any(stmt in ends for stmt in node.body)
        and node.name is None
    ]
    handler = _one(handlers, "except Exception: ... _end_otel_job_spans()", "pretrain")
    header = py.line_of(handler)
    if not re.match(r"\s*except Exception\s*:", header):
        raise NotRecognised(f"{TRAINING}: could not find `except Exception:` in pretrain()")
    if sites.shutdown_cause:
        py.plan(
            handler.lineno,
            handler.lineno,
            [header.replace("except Exception", "except Exception as _otel_exc", 1)],
        )
    in_handler = handler.body[0]
    if in_handler not in ends:
        raise NotRecognised(
            f"{TRAINING}: could not find `_end_otel_job_spans()` first in pretrain()'s "
            "`except Exception:`"
        )
    first = handler.lineno + 1  # the handler's own comment goes with the call it explains
    py.plan(
        first,
        in_handler.end_lineno,
        [
            _indent(py.line_of(in_handler)) + line
            for line in (
                "# OTel: end what is open, recording the exception on it, and flush;",
                "# the process still dies of the exception, as before.",
                "_otel_phases.shutdown(cause=_otel_exc)",
            )
        ]
        if sites.shutdown_cause
        else [
            _indent(py.line_of(in_handler)) + line
            for line in (
                "# OTel: end what is open and flush; the process still dies of the",
                "# exception, as before.",
                "_otel_phases.shutdown()",
            )
        ],
    )
    rest = [node for node in ends if node is not in_handler]
    py.replace_call(
        _one(rest, "_end_otel_job_spans()", "pretrain"),
        ["# OTel: end what is still open and shut telemetry down.", "_otel_phases.shutdown()"],
    )


def _plan_train(py: _TrainingPy, sites: CallSites) -> None:
    train = py.function("train")
    end_startup = _one(
        py.call_lines(train, "_end_otel_startup_span"), "_end_otel_startup_span()", "train"
    )
    start_train = _one(
        py.call_lines(train, "_start_otel_train_span"), "_start_otel_train_span()", "train"
    )
    if start_train.lineno != end_startup.end_lineno + 1:
        raise NotRecognised(
            f"{TRAINING}: could not find `_start_otel_train_span()` right after "
            "`_end_otel_startup_span()` in train()"
        )
    py.replace_call(
        end_startup,
        [
            "# OTel: the preamble above was init and nested in megatron.startup; close it.",
            "# The loop's first pass opens the first megatron.train interval. (train()",
            "# called without pretrain() gets a lifecycle of its own.)",
            "_otel_phases = SpanPhases.current(",
            "    get_telemetry(),",
            f"    save_interval={_SAVE_INTERVAL},",
            "    is_span_group_enabled=_otel_sg_enabled,",
            ")",
        ],
    )
    py.plan(
        start_train.lineno,
        start_train.end_lineno,
        [_indent(py.line_of(start_train)) + "_otel_phases.start_train()"],
    )
    reroot = _one(
        py.call_lines(train, "_maybe_reroot_otel_interval"),
        "_maybe_reroot_otel_interval()",
        "train",
    )
    py.plan(
        reroot.lineno,
        reroot.end_lineno,
        [
            _indent(py.line_of(reroot))
            + ("_otel_phases.step(iteration)" if sites.step_iteration else "_otel_phases.step()")
        ],
    )
    py.replace_call(
        _one(py.call_lines(train, "_end_otel_job_spans"), "_end_otel_job_spans()", "train"),
        [
            "# OTel: this sys.exit() skips the rest of pretrain(): end the open interval",
            "# and shut telemetry down here, before it.",
            "_otel_phases.shutdown()",
        ],
    )
    py.replace_call(
        _one(py.call_lines(train, "_end_otel_train_span"), "_end_otel_train_span()", "train"),
        [
            "# OTel: the loop is over: end the last megatron.train interval.",
            "_otel_phases.end_train()",
        ],
    )


def _plan_mark_goodput(py: _TrainingPy) -> None:
    """Other spans Megatron-LM opens by hand mark themselves through telemetry_spans."""
    for node in ast.walk(py.tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "_otel_mark_goodput"
            and node.lineno not in py.replaced
        ):
            line = py.line_of(node)
            py.plan(
                node.lineno, node.lineno, [line.replace("_otel_mark_goodput(", "mark_goodput(", 1)]
            )


def _drop_stale_comments(py: _TrainingPy) -> None:
    """Comment blocks left speaking of the deleted functions go with them."""
    lineno = 1
    while lineno <= len(py.lines):
        if py.lines[lineno - 1].lstrip().startswith("#") and lineno not in py.replaced:
            end = lineno
            while end < len(py.lines) and py.lines[end].lstrip().startswith("#"):
                end += 1
            block = range(lineno, end + 1)
            text = "\n".join(py.lines[i - 1] for i in block)
            if _DELETED_NAME.search(text) and not (set(block) & py.replaced):
                py.plan(lineno, end, [])
            lineno = end + 1
        else:
            lineno += 1


def port_training(text: str, sites: CallSites = CallSites()) -> str:
    """``training.py``'s text with the extraction applied, its call sites passing what
    ``sites`` says (raises NotRecognised)."""
    py = _TrainingPy(text)
    _plan_module_scope(py)
    _plan_pretrain(py, sites)
    _plan_train(py, sites)
    _plan_mark_goodput(py)
    _drop_stale_comments(py)
    ported = py.apply()
    try:
        tree = ast.parse(ported)
    except SyntaxError as err:  # a layout the anchors did not foresee
        raise NotRecognised(f"{TRAINING}: the rewritten file does not parse ({err})") from None
    left = sorted(
        {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in DELETED}
    )
    if left:
        raise NotRecognised(f"{TRAINING}: could not find every use of `{left[0]}`")
    return ported


def is_ported(text: str) -> bool:
    """Whether ``training.py`` already drives the lifecycle through telemetry_spans."""
    return "from megatron.training.telemetry_spans import" in text and not re.search(
        r"^def (" + "|".join(LIFECYCLE_FUNCTIONS) + r")\(", text, re.M
    )
