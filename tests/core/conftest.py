"""Fixtures for the telemetry base-layer tests.

Every test starts and ends with no active handle and no span group enabled,
because that state is process-wide and a leak would make later tests pass or
fail for the wrong reason. Handles made through ``make_handle`` are shut down
after the test even when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from megatron.core.telemetry import TelemetryConfig, TelemetryHandle, setup_telemetry, state


@pytest.fixture(autouse=True)
def _reset_telemetry_state() -> Iterator[None]:
    state._reset()
    yield
    state._reset()


@pytest.fixture
def make_handle() -> Iterator[Callable[..., TelemetryHandle]]:
    handles: list[TelemetryHandle] = []

    def make(config: TelemetryConfig, **kwargs: Any) -> TelemetryHandle:
        handle = setup_telemetry(config, **kwargs)
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        handle.shutdown(timeout_ms=2000)
