"""One scenario through a training.py's lifecycle call sites, on fakes (``call_sites.py``).

    python call_site_runner.py SKELETON TELEMETRY_SPANS_PY SCENARIO_JSON RECORD

``SKELETON`` is the module :func:`call_sites.skeleton` wrote; ``TELEMETRY_SPANS_PY``
the tree's ``telemetry_spans.py`` (empty for a pristine tree, which has none).
Every span ended, every flush of the tracer provider, every shutdown of the
telemetry handle and every call of the SIGTERM handler that was there before is
appended to ``RECORD`` as a JSON line the moment it happens, so a process that
dies of a signal leaves its record behind.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import sys
import types
from types import SimpleNamespace

from opentelemetry import trace

skeleton_path, module_path, scenario_json, record_path = sys.argv[1:5]
scenario = SimpleNamespace(**json.loads(scenario_json))
faults = dict(scenario.faults)


def fault(key: str) -> bool:
    """Whether ``key`` fails now (a count is used up one failure at a time)."""
    left = faults.get(key)
    if left is True:
        return True
    if left:
        faults[key] = left - 1
        return True
    return False


record = open(record_path, "a", buffering=1)  # noqa: SIM115 -- open until the process ends
ids = itertools.count(1)


def note(**event) -> None:
    record.write(json.dumps(event, sort_keys=True) + "\n")


class FakeSpan(trace.Span):
    """A span as a backend would receive it, written down when it ends."""

    def __init__(self, name, parent, links, attributes, start_time):
        self.name, self.parent, self.start_time = name, parent, start_time
        trace_id = parent.context.trace_id if parent is not None else next(ids)
        self.context = trace.SpanContext(trace_id, next(ids), is_remote=False)
        self.links = [link.context.span_id for link in links or ()]
        self.attributes = dict(attributes or {})
        self.status, self.exceptions, self.ended = None, [], False

    def get_span_context(self):
        if fault(f"context:{self.name}"):
            raise RuntimeError("get_span_context failed")
        return self.context

    def set_attribute(self, key, value):
        if fault("attribute"):
            raise RuntimeError("set_attribute failed")
        self.attributes[key] = value

    def set_attributes(self, attributes):
        self.attributes.update(attributes)

    def set_status(self, status, description=None):
        self.status = status.status_code.name

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False):
        self.exceptions.append(type(exception).__name__)

    def add_event(self, name, attributes=None, timestamp=None):
        pass

    def update_name(self, name):
        self.name = name

    def is_recording(self):
        return not self.ended and not fault("not_recording")

    def end(self, end_time=None):
        note(
            event="end",
            name=self.name,
            span=str(self.context.span_id),
            trace=str(self.context.trace_id),
            parent=None if self.parent is None else str(self.parent.context.span_id),
            links=[str(link) for link in self.links],
            attributes=self.attributes,
            status=self.status,
            exceptions=self.exceptions,
            start=self.start_time,
            end=end_time,
            again=self.ended,
        )
        self.ended = True


class FakeTracer(trace.Tracer):
    def start_span(self, name, context=None, kind=None, attributes=None, links=None,
                   start_time=None, **_):  # fmt: skip
        if fault(f"start:{name}"):
            raise RuntimeError(f"start_span({name}) failed")
        parent = trace.get_current_span(context)
        parent = parent if isinstance(parent, FakeSpan) else None
        return FakeSpan(name, parent, links, attributes, start_time)

    def start_as_current_span(self, *args, **kwargs):  # not used by the lifecycle
        raise NotImplementedError


class FakeProvider(trace.TracerProvider):
    """The global tracer provider nemo-lens installs: flushes are written down."""

    def get_tracer(self, *args, **kwargs):
        return TRACER

    def force_flush(self, timeout_millis=30000):
        note(event="provider_flush", timeout_millis=timeout_millis)
        return True


class FakeHandle:
    """nemo-lens's telemetry handle: a tracer, whether it exports, shutdown()."""

    def __init__(self, exporting):
        self.tracer, self.is_exporting = TRACER, exporting

    def shutdown(self, timeout_ms=5000):
        note(event="handle_shutdown", timeout_ms=timeout_ms)
        if scenario.signal_in_shutdown and fault("signal_in_shutdown"):
            os.kill(os.getpid(), signal.SIGTERM)
            note(event="shutdown_returned")
        if fault("shutdown"):
            raise RuntimeError("shutdown failed")


faults.setdefault("signal_in_shutdown", 1)
if fault("link"):

    def broken_link(*args, **kwargs):
        raise RuntimeError("Link failed")

    trace.Link = broken_link
if faults.pop("detach", None):
    from opentelemetry import context as otel_context

    def broken_detach(token):
        raise RuntimeError("detach failed")

    otel_context.detach = broken_detach
TRACER = FakeTracer()
trace.set_tracer_provider(FakeProvider())
HANDLE = None if scenario.telemetry == "none" else FakeHandle(scenario.telemetry == "exporting")
GROUPS = frozenset(scenario.groups) if scenario.telemetry == "exporting" else frozenset()
ARGS = SimpleNamespace(
    save_interval=scenario.save_interval,
    train_iters=scenario.train_iters,
    exit_signal_handler=scenario.exit_signal_handler,
)


class Work:
    """What happens around the lifecycle's call sites."""

    first_iteration = scenario.first_iteration

    def __init__(self):
        self.drain_requested = False

    def before_loop(self):
        if scenario.save_interval_in_train is not None:  # a checkpoint's arguments
            ARGS.save_interval = scenario.save_interval_in_train

    def startup(self):
        if scenario.signal_at == -1:
            os.kill(os.getpid(), signal.SIGTERM)
        if scenario.startup_fault:
            raise RuntimeError("startup fault")

    def trains(self):
        return ARGS.train_iters > 0

    def step(self, iteration):
        note(event="pass", iteration=iteration)
        if iteration == scenario.fault_at:
            raise RuntimeError("fault in the step")
        if iteration == scenario.interrupt_at:
            raise KeyboardInterrupt
        if iteration == scenario.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def should_exit(self, iteration):
        return self.drain_requested or iteration == scenario.exit_at


WORK = Work()


def previous_handler(signum, frame):
    note(event="previous_handler", signum=signum)
    if scenario.exit_signal_handler:  # Megatron-LM's drain: finish the pass, save, exit
        WORK.drain_requested = True


if scenario.exit_signal_handler or scenario.previous == "handler":
    signal.signal(signal.SIGTERM, previous_handler)
elif scenario.previous == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

if module_path:  # the ported tree's module, under its own name
    for parent in ("megatron", "megatron.training"):
        sys.modules[parent] = types.ModuleType(parent)
        sys.modules[parent].__path__ = []
    spec = importlib.util.spec_from_file_location("megatron.training.telemetry_spans", module_path)
    spans_module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = spans_module
    spec.loader.exec_module(spans_module)

namespace = {
    "__name__": "megatron.training.training",
    "os": os,
    "sys": sys,
    "get_args": lambda: ARGS,
    "get_telemetry": lambda: HANDLE,
    "_otel_sg_enabled": lambda group: group in GROUPS,
    "_STARTUP_TIMESTAMPS": dict(scenario.timestamps),
}
with open(skeleton_path) as source:
    exec(compile(source.read(), skeleton_path, "exec"), namespace)

try:
    for call in scenario.calls:
        if call == "pretrain":
            namespace["pretrain"]("ModelType.encoder_or_decoder", WORK)
        else:
            namespace["train"](WORK)
        WORK.drain_requested = False
finally:
    note(event="returned")
