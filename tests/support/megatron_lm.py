"""Run Megatron-LM's own ``pretrain_gpt.py`` on this CPU machine, and read its spans.

The reusable half of ``tests/upstream`` (and of any test that needs a real
Megatron-LM job): :func:`run_pretrain_gpt` prepares the environment, runs
``pretrain_gpt.py`` of a given Megatron-LM tree with given flags and
variables, and returns its exit status and the spans it exported. It changes
nothing in the tree beyond what Megatron-LM itself writes there (the dataset
helpers it compiles at first use).

What a CPU run needs (``../shared/upstream/README.md``) is supplied from
outside the tree, by ``megatron_lm_site/sitecustomize.py``, which every
Python process of the run imports at start-up (this module puts its
directory first on ``PYTHONPATH`` and sets ``MEGATRON_LM_CPU_SHIMS=1``):
``typing.override`` on 3.11, ``torch.cuda`` answered on the CPU, and the
spans of nemo-lens's ``console`` exporter written to a file rather than
standard output. It also carries the test hooks a case asks for through
variables (:data:`FAULT_AT`, :data:`SIGNAL_AT`, :data:`SIGNAL_IN_LOCK`, :data:`STEP_SLEEP`,
:data:`HIDE_PACKAGES`), again without touching the tree.

Telemetry is nemo-lens's, configured the way Megatron-LM reads it:
``telemetry=True`` sets ``MEGATRON_OTEL_ENABLED=1`` and, unless the caller's
``env`` chooses another, the ``console`` exporter, whose spans come back in
:attr:`MegatronRun.spans` (one dict per span, the SDK's ``to_json`` form).
Metrics are off by default (``MEGATRON_OTEL_METRICS_ENABLED=0``: the console
exporter would print them on standard output). A caller that exports
elsewhere (``MEGATRON_OTEL_EXPORTER=otlp`` with ``OTEL_EXPORTER_OTLP_ENDPOINT``
on a loopback receiver, and ``MEGATRON_OTEL_METRICS_ENABLED=1`` for metrics
too) gets no spans here and reads its receiver instead.

The Python that runs the job is :func:`python_for_megatron`: the interpreter
running the tests unless ``MEGATRON_LM_PYTHON`` names another (an environment
with torch, nemo-lens with its ``sdk`` extra, ``packaging``, ``triton``,
``numpy``, ``pybind11``, ``psutil``, ``typing_extensions``; ``tox -e upstream``
builds one).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).resolve().parent / "megatron_lm_site"

#: ``N``: ``train_step`` raises ``RuntimeError`` on its N-th call in the process.
FAULT_AT = "MEGATRON_LM_TEST_FAULT_AT_STEP"
#: ``N:SIGNAME``: the process sends itself SIGNAME at the start of its N-th ``train_step``.
SIGNAL_AT = "MEGATRON_LM_TEST_SIGNAL_AT_STEP"
#: ``SIGNAME:N``: the N-th span end on the main thread lands SIGNAME inside nemo-lens's
#: ``_OpenSpanCloser.on_end`` while it holds its lock (the handler called with that frame).
SIGNAL_IN_LOCK = "MEGATRON_LM_TEST_SIGNAL_IN_SPAN_CLOSER"
#: ``S``: every ``train_step`` sleeps ``S`` seconds first (a slower step).
STEP_SLEEP = "MEGATRON_LM_TEST_STEP_SLEEP"
#: Comma-separated top-level names (``opentelemetry,nemo.lens``) that fail to import,
#: as if not installed.
HIDE_PACKAGES = "MEGATRON_LM_TEST_HIDE_PACKAGES"
#: Where the ``console`` exporter's spans go (set by :func:`run_pretrain_gpt`).
SPANS_FILE = "MEGATRON_LM_SPANS_FILE"
#: Where the process writes, at exit, which signals have a Python handler (set by
#: :func:`run_pretrain_gpt`; a run killed by a signal writes nothing).
SIGNALS_FILE = "MEGATRON_LM_TEST_SIGNALS_FILE"
#: In :data:`SPANS_FILE` and :data:`SIGNALS_FILE`, replaced by the process's ``RANK``
#: (``launcher`` for torchrun itself), so that each rank writes files of its own.
RANK_FIELD = "{rank}"

#: The flags that make a one-rank, one-layer GPT train on a CPU with mock data
#: (no fused kernels, no CUDA-only paths), before the caller's own.
CPU_FLAGS: tuple[str, ...] = (
    "--num-layers", "1",
    "--hidden-size", "64",
    "--num-attention-heads", "4",
    "--seq-length", "64",
    "--max-position-embeddings", "64",
    "--micro-batch-size", "2",
    "--global-batch-size", "2",
    "--lr", "1e-4",
    "--mock-data",
    "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "128",
    "--log-interval", "1",
    "--eval-iters", "1",
    "--eval-interval", "1000",
    "--use-cpu-initialization",
    "--distributed-backend", "gloo",
    "--transformer-impl", "local",
    "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion",
    "--no-bias-dropout-fusion",
    "--no-rope-fusion",
    "--no-persist-layer-norm",
    "--clip-grad", "0",
)  # fmt: skip


@dataclass
class MegatronRun:
    """One finished ``pretrain_gpt.py`` process."""

    returncode: int
    spans: list[dict] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    argv: list[str] = field(default_factory=list)
    #: Signal name -> ``default``, ``ignore``, ``python`` or ``other``, as the
    #: process left them at exit (empty when it died by a signal).
    signal_handlers: dict[str, str] = field(default_factory=dict)
    #: Under torchrun: each rank's spans and signal record (``spans`` and
    #: ``signal_handlers`` above are rank 0's); one process: ``{0: ...}``.
    rank_spans: dict[int, list[dict]] = field(default_factory=dict)
    rank_signal_handlers: dict[int, dict[str, str]] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Span names in export order."""
        return [span["name"] for span in self.spans]

    def describe(self) -> str:
        """The command, the first traceback it printed and the end of its output, for an
        assertion message. Under torchrun a rank's traceback comes before the launcher's
        own summary of the failure, which alone would fill the end."""
        lines = [*self.stdout.splitlines(), *self.stderr.splitlines()]
        tail = len(lines) - 40
        first = next((i for i, line in enumerate(lines) if "Traceback (most" in line), tail)
        cause = lines[first : min(first + 60, tail)] if first < tail else []
        shown = "\n".join([*cause, *(["..."] if cause else []), *lines[-40:]])
        return f"$ {' '.join(self.argv)}\nexit {self.returncode}\n{shown}"


def python_for_megatron() -> str:
    """The interpreter that runs Megatron-LM (``MEGATRON_LM_PYTHON``, else this one)."""
    return os.environ.get("MEGATRON_LM_PYTHON") or sys.executable


def free_port() -> int:
    """A loopback TCP port nobody listens on now (torch.distributed's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def copy_tree(source: Path, dest: Path) -> Path:
    """A writable copy of a Megatron-LM checkout (the source may be read-only)."""
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = Path(root, name)
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
    dest.chmod(dest.stat().st_mode | 0o200)
    return dest


def job_env(
    tree: Path,
    work_dir: Path,
    *,
    telemetry: bool = True,
    span_groups: str | None = None,
    env: Mapping[str, str] | None = None,
    nproc: int = 1,
) -> dict[str, str]:
    """The environment ``pretrain_gpt.py`` runs in: gloo, the CPU shims.

    With ``nproc`` 1 the process is rank 0 of 1 itself; with more, torchrun
    sets each rank's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``, every rank
    exports its own spans (nemo-lens's ``all_ranks`` strategy; its default
    exports from the last rank only) and writes them, and its signal record,
    to files of its own (:data:`RANK_FIELD` in the paths). ``telemetry`` False
    leaves nemo-lens installed but off (no ``MEGATRON_OTEL_*`` variable at
    all); ``env`` entries win over everything set here (an empty string
    removes a variable).
    """
    python_bin = str(Path(python_for_megatron()).parent)
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MEGATRON_OTEL_", "NEMO_LENS_", "OTEL_", "MEGATRON_LM_TEST_"))
        and key not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    base.update(
        {
            # The dataset helpers' Makefile runs `python3`: this environment's.
            "PATH": python_bin + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join([str(SITE_DIR), str(tree)]),
            "MEGATRON_LM_CPU_SHIMS": "1",
            "PYTHONUNBUFFERED": "1",
            "TORCHDYNAMO_DISABLE": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "OMP_NUM_THREADS": "1",
            SPANS_FILE: str(work_dir / _per_rank("spans.jsonl", nproc)),
            SIGNALS_FILE: str(work_dir / _per_rank("signals.json", nproc)),
        }
    )
    if nproc == 1:
        base.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    if telemetry and nproc > 1:
        base["MEGATRON_OTEL_EXPORT_STRATEGY"] = "all_ranks"
    if telemetry:
        base["MEGATRON_OTEL_ENABLED"] = "1"
        base["MEGATRON_OTEL_EXPORTER"] = "console"
        # Metrics would go to standard output with the console exporter: spans only.
        base["MEGATRON_OTEL_METRICS_ENABLED"] = "0"
        if span_groups is not None:
            base["MEGATRON_OTEL_SPAN_GROUPS"] = span_groups
    for key, value in (env or {}).items():
        if value == "":
            base.pop(key, None)
        else:
            base[key] = value
    return base


def _per_rank(name: str, nproc: int) -> str:
    """``spans.jsonl`` for one process; ``spans.{rank}.jsonl`` for torchrun's ranks."""
    if nproc == 1:
        return name
    stem, _, suffix = name.partition(".")
    return f"{stem}.{RANK_FIELD}.{suffix}"


def read_spans(path: Path) -> list[dict]:
    """The spans a ``ConsoleSpanExporter`` wrote to ``path``, in export order.

    nemo-lens's console formatter writes one JSON object a line; a line cut
    off by the process's death (a hard signal mid-write) is dropped.
    """
    if not path.exists():
        return []
    spans = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "context" in record and "name" in record:
            spans.append(record)
    return spans


def pretrain_gpt_command(
    tree: Path | str,
    flags: Sequence[str] = (),
    *,
    work_dir: Path | str,
    train_iters: int = 5,
    telemetry: bool = True,
    span_groups: str | None = None,
    env: Mapping[str, str] | None = None,
    nproc: int = 1,
) -> tuple[Path, list[str], dict[str, str]]:
    """(the tree, the command, its environment) that run ``TREE/pretrain_gpt.py`` with
    :data:`CPU_FLAGS`, ``--train-iters`` and ``flags`` (:func:`run_pretrain_gpt` says how);
    ``work_dir`` is created, its captured spans and signal records removed."""
    tree = Path(tree).resolve()
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for old in [*work.glob("spans*.jsonl"), *work.glob("signals*.json")]:
        old.unlink()
    environment = job_env(
        tree, work, telemetry=telemetry, span_groups=span_groups, env=env, nproc=nproc
    )
    launcher = [python_for_megatron()]
    if nproc > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            environment["MASTER_PORT"],
        ]
    argv = [
        *launcher,
        "pretrain_gpt.py",
        *CPU_FLAGS,
        "--train-iters",
        str(train_iters),
        *flags,
    ]
    return tree, argv, environment


def start_pretrain_gpt(tree: Path | str, flags: Sequence[str] = (), *, log: Path,
                       **options: Any) -> subprocess.Popen[bytes]:  # fmt: skip
    """:func:`pretrain_gpt_command`'s job started in a session of its own, its output into
    ``log`` (:func:`processes.kill_job` ends it whole)."""
    cwd, argv, environment = pretrain_gpt_command(tree, flags, **options)
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=environment, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def run_pretrain_gpt(
    tree: Path | str, flags: Sequence[str] = (), *, timeout: float = 300.0, **options: Any
) -> MegatronRun:
    """Run ``TREE/pretrain_gpt.py`` with :data:`CPU_FLAGS`, ``--train-iters`` and ``flags``
    (``options``: :func:`pretrain_gpt_command`'s).

    ``work_dir`` (created if missing) holds the captured spans
    (``spans.jsonl``, emptied first), the signal record (``signals.json``) and
    is where checkpoint paths in ``flags`` usually point. With ``nproc`` > 1
    the job is ``torchrun --nproc-per-node NPROC`` on one machine (rendezvous
    on a free loopback port), each rank's files named by its rank
    (``spans.0.jsonl``...). Returns when the process has ended, however it
    ended (a signal's death is a negative ``returncode``).
    """
    tree, argv, environment = pretrain_gpt_command(tree, flags, **options)
    completed = subprocess.run(
        argv,
        cwd=tree,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    rank_spans, rank_signals = {}, {}
    for rank in range(options.get("nproc", 1)):
        spans_file = Path(environment[SPANS_FILE].replace(RANK_FIELD, str(rank)))
        signals_file = Path(environment[SIGNALS_FILE].replace(RANK_FIELD, str(rank)))
        rank_spans[rank] = read_spans(spans_file)
        rank_signals[rank] = json.loads(signals_file.read_text()) if signals_file.exists() else {}
    return MegatronRun(
        returncode=completed.returncode,
        spans=rank_spans[0],
        signal_handlers=rank_signals[0],
        rank_spans=rank_spans,
        rank_signal_handlers=rank_signals,
        stdout=completed.stdout,
        stderr=completed.stderr,
        argv=argv,
    )


# ---------------------------------------------------------------------------
# Reading spans as a forest of traces, independent of ids and timestamps
# ---------------------------------------------------------------------------


@dataclass
class SpanNode:
    """One span in :func:`span_forest`: what two runs of the same code share."""

    name: str
    status: str
    links: tuple
    attribute_keys: frozenset
    children: list[SpanNode] = field(default_factory=list)

    def shape(self) -> tuple:
        """Name, status, links and children's shapes: equal for equal trees."""
        return (self.name, self.status, self.links, tuple(c.shape() for c in self.children))


def _span_id(span: dict) -> str:
    return span["context"]["span_id"]


def span_forest(spans: Sequence[dict]) -> list[SpanNode]:
    """Each trace's root with its children, roots and siblings in start (then end) order.

    A link is written as the position of the root it points to, ``("root",
    i)``, or as ``("span", name)`` when it points inside a trace; a parent the
    spans do not hold (exported by no one) makes its children roots.
    """
    by_id = {_span_id(span): span for span in spans}
    children: dict[str, list[dict]] = {}
    roots = []
    for span in spans:
        parent = span.get("parent_id")
        if parent and parent in by_id:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)

    def order(group: list[dict]) -> list[dict]:
        # Backdated phases can share a start (a phase that took no time at all):
        # the shorter first, as they were recorded.
        return sorted(group, key=lambda s: (s["start_time"], s["end_time"], s["name"]))

    roots = order(roots)
    root_index = {_span_id(span): i for i, span in enumerate(roots)}

    def link(target: dict) -> tuple:
        span_id = target["context"]["span_id"]
        if span_id in root_index:
            return ("root", root_index[span_id])
        return ("span", by_id[span_id]["name"] if span_id in by_id else None)

    def node(span: dict) -> SpanNode:
        return SpanNode(
            name=span["name"],
            status=span["status"]["status_code"],
            links=tuple(link(target) for target in span.get("links") or ()),
            attribute_keys=frozenset(span.get("attributes") or {}),
            children=[node(child) for child in order(children.get(_span_id(span), []))],
        )

    return [node(root) for root in roots]


def forest_differences(upstream: list[SpanNode], ours: list[SpanNode]) -> list[str]:
    """Where ``ours`` is not ``upstream``: a different shape (names, parents,
    trace roots, links, statuses), or a span missing one of upstream's attribute keys."""
    differences: list[str] = []

    def walk(a: SpanNode, b: SpanNode, path: str) -> None:
        mine, theirs = (b.name, b.status, b.links), (a.name, a.status, a.links)
        if theirs != mine:
            differences.append(f"{path}: upstream {theirs} != ours {mine}")
            return
        missing = a.attribute_keys - b.attribute_keys
        if missing:
            differences.append(f"{path}/{a.name}: missing attribute keys {sorted(missing)}")
        if [c.name for c in a.children] != [c.name for c in b.children]:
            differences.append(
                f"{path}/{a.name}: children upstream {[c.name for c in a.children]} "
                f"!= ours {[c.name for c in b.children]}"
            )
            return
        for i, (x, y) in enumerate(zip(a.children, b.children, strict=True)):
            walk(x, y, f"{path}/{a.name}[{i}]")

    if [r.name for r in upstream] != [r.name for r in ours]:
        return [f"roots: upstream {[r.name for r in upstream]} != ours {[r.name for r in ours]}"]
    for i, (a, b) in enumerate(zip(upstream, ours, strict=True)):
        walk(a, b, f"trace {i}")
    return differences


def port_checkout(
    checkout: Path, cwd: Path | None = None, series: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m megatron.training.port_upstream CHECKOUT`` as a user does: in place,
    or (``series``, a folder) writing the pull requests there.

    ``cwd`` (default: this repository) must let this interpreter import the
    project (installed, or the repository on ``PYTHONPATH``).
    """
    options = [] if series is None else ["--series", str(series)]
    return subprocess.run(
        [sys.executable, "-m", "megatron.training.port_upstream", *options, str(checkout)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd or Path(__file__).resolve().parents[2],
    )


def apply_series(tree: Path, series: Path) -> Path:
    """``tree`` made a git repository, its files the first commit, then every patch in
    ``series`` applied with ``git am``, one commit each, as a maintainer applies them."""
    identity = ["-c", "user.name=Reviewer", "-c", "user.email=reviewer@localhost"]
    for command in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "-m", "pristine"]):
        subprocess.run(["git", *command], cwd=tree, check=True, capture_output=True)
    patches = sorted(str(path) for path in series.glob("*.patch"))
    done = subprocess.run(["git", *identity, "am", "-q", *patches], cwd=tree,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return tree
