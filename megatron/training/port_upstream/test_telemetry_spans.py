"""Unit tests for ``megatron.training.telemetry_spans``: the job-level span lifecycle.

Runs on a CPU with the OpenTelemetry SDK (nemo-lens's ``sdk`` extra): every
span goes to an in-memory exporter. Covers what the lifecycle promises
``pretrain()``: the startup span opens and closes once, ``megatron.train`` is
rerooted at ``save_interval`` boundaries (each a new trace linked to the one
before), the exit hooks are installed once per process across repeated
``pretrain()`` calls and hook SIGTERM only, and open spans are ended and
exported on the exception and SIGTERM paths. (``port_upstream`` in
megatron-telemetry-spans adds this file to Megatron-LM as
``tests/unit_tests/training/test_telemetry_spans.py``.)
"""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK (nemo-lens[sdk])")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from megatron.training import telemetry_spans
from megatron.training.telemetry_spans import ExitHooks, SpanPhaseError, SpanPhases


class Handle:
    """A telemetry handle as nemo-lens's: a tracer, ``is_exporting``, ``shutdown``."""

    def __init__(self, exporting: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")
        self.is_exporting = exporting
        self.shutdowns = 0

    def shutdown(self, timeout_ms: int = 5000) -> None:
        self.shutdowns += 1

    def spans(self, name: str | None = None) -> list:
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]


def job_on(group: str) -> bool:
    return group == "job"


def job_off(group: str) -> bool:
    return False


def lifecycle(handle, save_interval=0, gate=job_on) -> SpanPhases:
    return SpanPhases(handle, save_interval=save_interval, is_span_group_enabled=gate)


def test_startup_span_opens_and_closes_once():
    handle = Handle()
    phases = lifecycle(handle)
    phases.start_job("ModelType.encoder_or_decoder", {"program_start": 100.0})
    phases.record_phase("megatron.startup.imports", 100.0, 101.0)
    with pytest.raises(SpanPhaseError):
        phases.start_job()
    assert handle.spans("megatron.startup") == []  # still open
    phases.start_train()
    with pytest.raises(SpanPhaseError):
        phases.start_train()
    phases.shutdown()
    (startup,) = handle.spans("megatron.startup")
    assert startup.parent is None
    assert startup.start_time == 100 * 10**9
    assert startup.attributes["is_goodput_span"] is True
    assert startup.attributes["megatron.model_type"] == "ModelType.encoder_or_decoder"
    (imports,) = handle.spans("megatron.startup.imports")
    assert imports.parent.span_id == startup.context.span_id
    assert handle.shutdowns == 1


def test_reroots_at_save_interval_boundaries():
    handle = Handle()
    phases = lifecycle(handle, save_interval=3)
    phases.start_job()
    phases.start_train()
    for iteration in range(100, 107):  # a resumed run: the counter, not the iteration, decides
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    startup = handle.spans("megatron.startup")[0]
    intervals = handle.spans("megatron.train")
    assert [s.attributes["megatron.interval.first_iteration"] for s in intervals] == [100, 103, 106]
    assert [s.attributes["megatron.interval.last_iteration"] for s in intervals] == [102, 105, 106]
    assert all(s.parent is None for s in intervals)
    assert len({s.context.trace_id for s in [startup, *intervals]}) == 4
    linked_to = [s.links[0].context.span_id for s in intervals]
    assert linked_to == [startup.context.span_id] + [s.context.span_id for s in intervals[:-1]]


def test_no_save_interval_is_one_interval_for_the_loop():
    handle = Handle()
    phases = lifecycle(handle, save_interval=0)
    phases.start_job()
    phases.start_train()
    for iteration in range(50):
        phases.step(iteration)
    phases.end_train()
    phases.shutdown()
    assert len(handle.spans("megatron.train")) == 1


def test_every_order_pretrain_produces_is_legal():
    """A resume with nothing left to train, then shutdown reached twice (normal path,
    then the atexit fallback), and an early exit's sys.exit() unwinding after shutdown."""
    handle = Handle()
    phases = lifecycle(handle, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.end_train()  # the loop ran no pass
    phases.shutdown()
    phases.shutdown()
    phases.end_train()
    assert handle.shutdowns == 1
    assert handle.spans("megatron.train") == []


def test_spans_closed_on_the_exception_path():
    handle = Handle()
    phases = lifecycle(handle, save_interval=2)
    phases.start_job()
    phases.start_train()
    phases.step(0)
    phases.shutdown(cause=RuntimeError("boom"))
    (interval,) = handle.spans("megatron.train")
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.attributes["megatron.shutdown.reason"] == "exception"
    assert interval.attributes["error.type"] == "RuntimeError"
    assert len(handle.spans("megatron.startup")) == 1
    assert handle.shutdowns == 1


def test_telemetry_off_opens_no_span():
    for handle, gate in ((Handle(exporting=False), job_on), (Handle(), job_off)):
        phases = lifecycle(handle, save_interval=1, gate=gate)
        phases.start_job()
        phases.start_train()
        phases.step(0)
        phases.shutdown()
        assert handle.spans() == []
    phases = lifecycle(None, save_interval=1)
    phases.start_job()
    with pytest.raises(SpanPhaseError):  # order still checked with no telemetry at all
        phases.end_train()


@pytest.fixture
def hooks(monkeypatch):
    """A fresh ExitHooks whose atexit registrations are recorded, not made, and
    whose SIGTERM handler is put back afterwards."""
    registered = []
    monkeypatch.setattr(telemetry_spans.atexit, "register", registered.append)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    if hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.getsignal(signal.SIGHUP)
    exit_hooks = ExitHooks()
    exit_hooks.registered = registered
    yield exit_hooks
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_exit_hooks_installed_once_across_repeated_pretrain_calls(hooks):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)}
    first, second = lifecycle(Handle()), lifecycle(Handle())
    hooks.attach(first, signals=(signal.SIGTERM,))
    hooks.attach(second, signals=(signal.SIGTERM,))
    assert hooks.registered == [hooks.handle_exit]
    assert signal.getsignal(signal.SIGTERM) == hooks.handle_sigterm
    assert {s: signal.getsignal(s) for s in before} == before  # SIGTERM only
    assert hooks.target is second


def test_exit_hooks_not_installed_without_exporting_telemetry(hooks):
    before = signal.getsignal(signal.SIGTERM)
    hooks.attach(lifecycle(Handle(exporting=False)), signals=(signal.SIGTERM,))
    hooks.attach(lifecycle(None), signals=(signal.SIGTERM,))
    assert hooks.registered == []
    assert signal.getsignal(signal.SIGTERM) == before


def test_spans_closed_on_the_sigterm_path(hooks):
    """A hard SIGTERM ends and exports what is open, then passes the signal on."""
    passed_on = []
    signal.signal(signal.SIGTERM, lambda signum, frame: passed_on.append(signum))
    handle = Handle()
    phases = lifecycle(handle, save_interval=2)
    hooks.attach(phases, signals=(signal.SIGTERM,))
    phases.start_job()
    phases.start_train()
    phases.step(0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert passed_on == [signal.SIGTERM]
    assert phases.state == "shutdown"
    (interval,) = handle.spans("megatron.train")
    assert interval.attributes["error.type"] == "SIGTERM"
    assert handle.shutdowns == 1
    phases.step(1)  # the process outlived the signal: the loop may go on, recording nothing
    phases.end_train()
    phases.shutdown()
    assert len(handle.spans("megatron.train")) == 1


def test_graceful_sigterm_only_flushes(hooks, monkeypatch):
    """With --exit-signal-handler the trainer drains: spans stay open, the
    provider is flushed (nemo-lens's handle has no force_flush: the global one)."""
    from opentelemetry import trace

    handle = Handle()
    flushed = []
    monkeypatch.setattr(handle.provider, "force_flush", lambda timeout_millis=0: flushed.append(1))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: handle.provider)
    drained = []
    signal.signal(signal.SIGTERM, lambda signum, frame: drained.append(signum))
    phases = lifecycle(handle, save_interval=2)
    hooks.attach(phases, graceful=True, signals=(signal.SIGTERM,))
    phases.start_job()
    phases.start_train()
    phases.step(0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert drained == [signal.SIGTERM]
    assert flushed == [1]
    assert phases.state == "interval"
    assert handle.spans("megatron.train") == []
    phases.end_train()
    phases.shutdown()
    assert len(handle.spans("megatron.train")) == 1


def test_train_finds_the_lifecycle_of_the_latest_pretrain():
    """``train()`` fires its triggers on ``SpanPhases.current()``: the newest lifecycle."""
    first = lifecycle(Handle())
    assert SpanPhases.current() is first
    second = lifecycle(None)
    assert SpanPhases.current() is second
