"""How a run ended is written on the spans ``shutdown`` ends.

An exception unwinding through ``pretrain()`` is the cause given to ``shutdown``
(a hard signal, to ``terminate``):
the open interval (or the startup span, when the start failed) gets
``megatron.shutdown.reason``, OpenTelemetry's ``error.type``, ERROR status
and, for an exception, the ``exception`` event. A clean end records nothing.
This trainer's lifecycle (``TrainerSpanPhases``) also names a ``KeyboardInterrupt``
``interrupt`` and records a clean ``sys.exit`` as no failure; Megatron-LM's
``pretrain()`` unwinds ``Exception`` only, so the shared module needs neither.
"""

from __future__ import annotations

import signal

import pytest
from fake_handles import FakeHandle
from launch_times import launch_timestamps
from lifecycle_spec import STARTUP
from opentelemetry.trace import StatusCode

from megatron.training.telemetry.lifecycle import TrainerSpanPhases
from megatron.training.telemetry_spans import SpanPhases

REASON = "megatron.shutdown.reason"


class TrainingStepFailed(Exception):
    """An exception of a user's module: error.type names it fully qualified."""


def _in_interval(lifecycles, handle, cls=SpanPhases):
    phases = lifecycles.new(handle, save_interval=4, cls=cls)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.start_train()
    for iteration in range(6):
        phases.step(iteration)
    return phases


@pytest.mark.parametrize(
    ("cause", "reason", "error_type", "cls"),
    [
        (RuntimeError("injected fault at iteration 5"), "exception", "RuntimeError", SpanPhases),
        (KeyboardInterrupt(), "interrupt", "KeyboardInterrupt", TrainerSpanPhases),
        (
            TrainingStepFailed("nan loss"),
            "exception",
            f"{__name__}.TrainingStepFailed",
            SpanPhases,
        ),
        (RuntimeError("the same in the trainer"), "exception", "RuntimeError", TrainerSpanPhases),
    ],
)
def test_an_exception_is_recorded_on_the_open_interval(lifecycles, cause, reason, error_type, cls):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, cls)
    phases.shutdown(cause)
    finished, failed = handle.intervals()
    assert REASON not in finished.attributes
    assert finished.status.status_code is StatusCode.UNSET
    assert failed.attributes[REASON] == reason
    assert failed.attributes["error.type"] == error_type
    assert failed.status.status_code is StatusCode.ERROR
    (event,) = failed.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == error_type  # the SDK's name is the same
    assert event.attributes["exception.message"] == str(cause)
    assert "exception.stacktrace" in event.attributes
    assert REASON not in handle.one(STARTUP).attributes


def test_a_failed_start_is_recorded_on_the_startup_span(lifecycles):
    handle = FakeHandle()
    phases = lifecycles.new(handle)
    phases.start_job(model_type="gpt", timestamps=launch_timestamps())
    phases.shutdown(ValueError("checkpoint is corrupt"))
    startup = handle.one(STARTUP)
    assert startup.attributes[REASON] == "exception"
    assert startup.attributes["error.type"] == "ValueError"
    assert startup.status.status_code is StatusCode.ERROR


def test_a_hard_signal_is_recorded_by_its_name(lifecycles):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle)
    phases.terminate(signal.SIGTERM)
    interval = handle.intervals()[-1]
    assert interval.attributes[REASON] == "signal"
    assert interval.attributes["error.type"] == "SIGTERM"
    assert interval.status.status_code is StatusCode.ERROR
    assert interval.events == ()


@pytest.mark.parametrize(
    ("cause", "cls"),
    [(None, SpanPhases), (None, TrainerSpanPhases), (SystemExit(0), TrainerSpanPhases),
     (SystemExit(None), TrainerSpanPhases)],
)  # fmt: skip
def test_a_clean_end_records_nothing(lifecycles, cause, cls):
    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle, cls)
    phases.shutdown(cause)
    for span in handle.spans():
        assert REASON not in span.attributes and "error.type" not in span.attributes
        assert span.status.status_code is StatusCode.UNSET


def test_the_exit_hook_passes_the_signal_to_terminate(lifecycles):
    from megatron.training.telemetry.lifecycle import TrainerExitHooks

    handle = FakeHandle()
    phases = _in_interval(lifecycles, handle)
    hooks = TrainerExitHooks()
    hooks.target = phases
    hooks.machine.set_state("installed")
    hooks.sigterm(signal.SIGHUP)  # previous handler unknown: the hard path
    assert phases.state == "terminated"
    assert handle.intervals()[-1].attributes["error.type"] == "SIGHUP"
