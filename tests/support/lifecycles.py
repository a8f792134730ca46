"""Context isolation and lifecycle bookkeeping for in-process tests."""

from __future__ import annotations

from typing import Any

# Bound at import time so a test that forbids the OTel API cannot break the cleanup.
from opentelemetry.context import Context as _Context
from opentelemetry.context import attach as _attach
from opentelemetry.context import detach as _detach


class Lifecycles:
    """Start every test from an empty OTel context and shut down any lifecycle a
    test left open, so nothing leaks into the next test."""

    def __init__(self) -> None:
        self.created: list[Any] = []
        self._token = None
        self.cls: type | None = None  # what new() makes (None: the shared SpanPhases)

    def __enter__(self) -> Lifecycles:
        self._token = _attach(_Context())
        return self

    def __exit__(self, *exc: object) -> None:
        for phases in reversed(self.created):
            try:
                if phases.state not in ("shutdown", "terminated"):
                    phases.shutdown()
            except Exception:  # noqa: BLE001 -- cleanup only; the test already reported
                pass
        _detach(self._token)

    def new(
        self, telemetry: Any, save_interval: int = 3, enabled: bool | None = None, **kwargs: Any
    ):
        """A lifecycle to test; ``enabled`` (when given) is the answer of its
        ``is_span_group_enabled`` gate for the ``job`` group. ``cls`` picks the class
        (default: ``self.cls``, else the shared module's ``SpanPhases``). Strict unless
        ``strict=False``: an order the table does not list raises (a run only logs it)."""
        from megatron.training.telemetry_spans import SpanPhases

        cls = kwargs.pop("cls", self.cls or SpanPhases)
        kwargs.setdefault("strict", True)
        if enabled is not None and "is_span_group_enabled" not in kwargs:
            kwargs["is_span_group_enabled"] = lambda group, on=bool(enabled): on
        phases = cls(telemetry, save_interval=save_interval, **kwargs)
        self.created.append(phases)
        return phases
