"""The baseline of the ``*_vs_upstream`` figures: Megatron-LM's flag-based lifecycle
helpers (the ``_otel_*`` functions of its ``megatron/training/training.py``), re-enacted.

Written here from what those helpers do, not copied: the same OpenTelemetry calls
in the same order, with the same bookkeeping around them, so that the time they
take is what upstream's lifecycle costs in this process. That is

* state in module globals rewritten through ``global`` statements, spans and
  tokens reset to ``None`` and a "shutdown done" flag;
* at every entry point the telemetry handle looked up through a global getter
  and the ``job`` span group checked, and the OpenTelemetry names imported inside
  the function;
* ``is_goodput_span`` set by its own ``set_attribute`` call after ``start_span``,
  ``megatron.model_type`` through the sanitising attribute setter (here ours, as
  upstream's fallback when nemo-lens is absent is the same kind of helper), and
  each SDK call wrapped in its own ``try``/``except``;
* per loop pass, the save interval read from the global arguments and the
  per-loop counter tested with ``%``; a boundary reroots.

It writes the spans upstream writes (no interval attributes: those are ours);
:func:`bind` points it at a telemetry handle and a save interval, as upstream's
``get_telemetry()`` and ``get_args()`` would find them.
"""

# ruff: noqa: SIM105 -- try/except/pass as upstream writes it: its cost is what is measured

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from megatron.core.telemetry.helpers import safe_set_span_attributes

_HANDLE: Any = None
_ARGS: Any = None
_GROUPS: frozenset[str] = frozenset()

_startup_span: Any = None
_startup_context: Any = None
_context_module: Any = None
_startup_token: Any = None
_interval_span: Any = None
_interval_token: Any = None
_passes_this_loop = 0
_shutdown_done = False


def bind(handle: Any, save_interval: int) -> None:
    """A fresh incarnation: the handle and arguments the helpers look up, state cleared."""
    global _HANDLE, _ARGS, _GROUPS, _startup_span, _startup_context, _context_module
    global _startup_token, _interval_span, _interval_token, _passes_this_loop, _shutdown_done
    _HANDLE, _ARGS = handle, SimpleNamespace(save_interval=save_interval)
    _GROUPS = frozenset(getattr(handle, "span_groups", ()))
    _startup_span = _startup_context = _context_module = _startup_token = None
    _interval_span = _interval_token = None
    _passes_this_loop, _shutdown_done = 0, False


def _telemetry() -> Any:
    return _HANDLE


def _arguments() -> Any:
    assert _ARGS is not None, "args is not initialized."
    return _ARGS


def _group_on(group: str) -> bool:
    return group in _GROUPS


def _goodput(span: Any) -> None:
    try:
        span.set_attribute("is_goodput_span", True)
    except Exception:  # noqa: BLE001
        pass


def backdated(name: str, start: float | None, end: float | None) -> None:
    """A closed span for an elapsed phase; parent: whatever context is current."""
    if not _group_on("job") or start is None or end is None:
        return
    span = _telemetry().tracer.start_span(name, start_time=int(start * 1e9))
    _goodput(span)
    span.end(end_time=int(end * 1e9))


def start_job(model_type: Any, program_start: float | None, timestamps: dict) -> None:
    """Trace A if due, then open trace B (attached) and its folded launch children."""
    global _startup_span, _startup_context, _context_module, _startup_token
    if not _group_on("job"):
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.context import Context

    _context_module = otel_context
    tracer = _telemetry().tracer
    launch = timestamps.get("launch_script_start")
    presrun = timestamps.get("launch_script_presrun")
    slurm = timestamps.get("slurm_job_start_time")
    program_ns = int(program_start * 1e9) if program_start is not None else None
    if launch is not None and slurm is not None and slurm < launch:
        backdated("pre_startup", slurm, launch)
    folded = (
        launch is not None
        and presrun is not None
        and program_start is not None
        and launch <= presrun <= program_start
    )
    opened_ns = int(launch * 1e9) if folded else program_ns
    _startup_span = tracer.start_span("megatron.startup", context=Context(), start_time=opened_ns)
    _goodput(_startup_span)
    safe_set_span_attributes(_startup_span, {"megatron.model_type": str(model_type)})
    try:
        _startup_context = _startup_span.get_span_context()
    except Exception:  # noqa: BLE001
        _startup_context = None
    _startup_token = otel_context.attach(otel_trace.set_span_in_context(_startup_span))
    if folded:
        backdated("megatron.startup.launch_script", launch, presrun)
        backdated("megatron.startup.container_load", presrun, program_start)


def end_startup() -> None:
    """Detach and end B (idempotent through the None check); its context stays for C0."""
    global _startup_span
    if _startup_span is None:
        return
    try:
        if _context_module is not None and _startup_token is not None:
            _context_module.detach(_startup_token)
    except Exception:  # noqa: BLE001
        pass
    try:
        _startup_span.end()
    except Exception:  # noqa: BLE001
        pass
    _startup_span = None


def start_train() -> None:
    """Arm the loop: the per-loop counter restarts."""
    global _passes_this_loop
    if not _group_on("job"):
        return
    _passes_this_loop = 0


def reroot() -> None:
    """End C(k) (if any) and open C(k+1) in a new trace, linked to C(k) or to B."""
    global _interval_span, _interval_token
    if _telemetry() is None or not _group_on("job"):
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link

    previous = _interval_span
    links = []
    try:
        if previous is not None:
            links.append(Link(previous.get_span_context()))
        elif _startup_context is not None:
            links.append(Link(_startup_context))
    except Exception:  # noqa: BLE001
        links = []
    if previous is not None:
        try:
            if _interval_token is not None:
                otel_context.detach(_interval_token)
        except Exception:  # noqa: BLE001
            pass
        try:
            previous.end()
        except Exception:  # noqa: BLE001
            pass
        _interval_span = _interval_token = None
    try:
        span = _telemetry().tracer.start_span("megatron.train", context=Context(), links=links)
        _goodput(span)
        _interval_span = span
        _interval_token = otel_context.attach(otel_trace.set_span_in_context(span))
    except Exception:  # noqa: BLE001
        _interval_span = _interval_token = None


def step() -> None:
    """Once at the top of every loop pass: reroot on a save-interval boundary."""
    global _passes_this_loop
    every = getattr(_arguments(), "save_interval", None) or 0
    if every > 0 and _passes_this_loop % every == 0:
        reroot()
    _passes_this_loop += 1


def end_train() -> None:
    """Detach and end the open interval (idempotent through the None check)."""
    global _interval_span, _interval_token
    if _interval_span is None:
        return
    try:
        from opentelemetry import context as otel_context

        if _interval_token is not None:
            otel_context.detach(_interval_token)
    except Exception:  # noqa: BLE001
        pass
    try:
        _interval_span.end()
    except Exception:  # noqa: BLE001
        pass
    _interval_span = _interval_token = None


def shutdown() -> None:
    """End what is open, innermost first, then shut the handle down once (the flag)."""
    global _shutdown_done
    end_train()
    end_startup()
    if not _shutdown_done:
        handle = _telemetry()
        if handle is not None:
            handle.shutdown()
        _shutdown_done = True


def pretrain(
    timestamps: dict[str, float], phases: Iterable[tuple[str, float, float]], passes: int
) -> None:
    """The helpers' calls in ``pretrain()``'s order, on the bound handle: the job (its
    program start in ``timestamps``) with its backdated startup ``phases``, ``passes``
    loop passes in the training span, and the shutdown."""
    start_job("GPT", timestamps.get("program_start"), timestamps)
    for phase in phases:
        backdated(*phase)
    end_startup()
    start_train()
    for _ in range(passes):
        step()
    end_train()
    shutdown()
