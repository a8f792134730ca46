"""The span lifecycle against the raw SDK: ``step()``, one ``reroot`` and a whole
lifecycle (sections ``step``, ``reroot`` and ``lifecycle``); the last two also against
Megatron-LM's own flag-based helpers, re-enacted in ``upstream_helpers``."""

from __future__ import annotations

import time

import upstream_helpers as upstream
from harness import InMemoryTelemetry, Run, interleaved, time_calls
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link

from megatron.training.telemetry_spans import SpanPhases


class _Comparable:
    """The step() baseline: an object with an empty method of the same shape."""

    def __init__(self) -> None:
        self._countdown = 1
        self.save_interval = 100

    def step(self, iteration: int | None = None) -> None:
        pass


# -- step() -----------------------------------------------------------------


def bench_step(enabled: bool, repeats: int, n: int):
    telemetry = InMemoryTelemetry() if enabled else None
    phases = SpanPhases(telemetry, save_interval=10**12)
    phases.start_job(model_type="GPT")
    phases.start_train()
    phases.step(0)  # the boundary pass: opens the interval; the rest are not boundaries
    baseline = _Comparable()
    return interleaved(
        lambda: time_calls(phases.step, n), lambda: time_calls(baseline.step, n), repeats
    )


# -- reroot -----------------------------------------------------------------


def _in_first_interval() -> tuple[InMemoryTelemetry, SpanPhases]:
    """Our lifecycle, rerooting at every pass, inside its first interval: where each
    reroot benchmark starts."""
    telemetry = InMemoryTelemetry()
    phases = SpanPhases(telemetry, save_interval=1)
    phases.start_job(model_type="GPT")
    phases.start_train()
    phases.step(0)
    return telemetry, phases


def bench_reroot(repeats: int, n: int):
    ours_telemetry, phases = _in_first_interval()

    raw_telemetry = InMemoryTelemetry()
    tracer = raw_telemetry.tracer
    first = tracer.start_span("megatron.train", context=otel_context.Context())
    raw = {"span": first, "token": otel_context.attach(otel_trace.set_span_in_context(first))}
    index = [0]

    def raw_reroot(_: int) -> None:
        # The minimal SDK calls for the same two spans and link: detach and end
        # C(k), start C(k+1) in an empty context linked to it, attach it.
        previous = raw["span"]
        otel_context.detach(raw["token"])
        previous.set_attribute("megatron.interval.rerooted", True)  # as ours writes it
        previous.end()
        index[0] += 1
        span = tracer.start_span(
            "megatron.train",
            context=otel_context.Context(),
            links=[Link(previous.get_span_context())],
            attributes={"is_goodput_span": True, "megatron.interval.index": index[0]},
        )
        raw["span"] = span
        raw["token"] = otel_context.attach(otel_trace.set_span_in_context(span))

    def ours() -> float:
        ours_telemetry.exporter.clear()
        return time_calls(lambda _: phases.step(), n)

    def baseline() -> float:
        raw_telemetry.exporter.clear()
        return time_calls(raw_reroot, n)

    result = interleaved(ours, baseline, repeats)
    otel_context.detach(raw["token"])
    return result


# -- a whole lifecycle -------------------------------------------------------


def bench_lifecycle(repeats: int, passes: int = 10_000, save_interval: int = 100):
    def ours() -> float:
        telemetry = InMemoryTelemetry()
        phases = SpanPhases(telemetry, save_interval=save_interval)
        start = time.perf_counter()
        phases.start_job(model_type="GPT", timestamps={"program_start": time.time() - 1})
        phases.start_train()
        for iteration in range(passes):
            phases.step(iteration)
        phases.end_train()
        phases.shutdown()
        elapsed = time.perf_counter() - start
        assert len(telemetry.exporter.get_finished_spans()) == 1 + passes // save_interval
        return elapsed

    def baseline() -> float:
        telemetry = InMemoryTelemetry()
        tracer = telemetry.tracer
        start = time.perf_counter()
        startup = tracer.start_span(
            "megatron.startup",
            context=otel_context.Context(),
            start_time=int((time.time() - 1) * 1e9),
            attributes={"is_goodput_span": True, "megatron.model_type": "GPT"},
        )
        token = otel_context.attach(otel_trace.set_span_in_context(startup))
        otel_context.detach(token)
        startup.end()
        link_to, interval, index, first = startup.get_span_context(), None, 0, 0
        for iteration in range(passes):
            if iteration % save_interval == 0:
                if interval is not None:
                    otel_context.detach(token)
                    interval.set_attributes(
                        {
                            "megatron.interval.first_iteration": first,
                            "megatron.interval.last_iteration": iteration - 1,
                            "megatron.interval.rerooted": True,
                        }
                    )
                    interval.end()
                    link_to = interval.get_span_context()
                interval = tracer.start_span(
                    "megatron.train",
                    context=otel_context.Context(),
                    links=[Link(link_to)],
                    attributes={"is_goodput_span": True, "megatron.interval.index": index},
                )
                token = otel_context.attach(otel_trace.set_span_in_context(interval))
                index, first = index + 1, iteration
        otel_context.detach(token)
        interval.set_attributes(
            {
                "megatron.interval.first_iteration": first,
                "megatron.interval.last_iteration": passes - 1,
                "megatron.interval.rerooted": False,
            }
        )
        interval.end()
        telemetry.shutdown()
        return time.perf_counter() - start

    return interleaved(ours, baseline, repeats)


# -- against upstream's helpers -------------------------------------------------

#: The startup phases both sides record after opening the startup span.
PHASES = tuple(f"megatron.startup.phase{index}" for index in range(4))


def _phase_spans(now: float) -> list[tuple[str, float, float]]:
    """:data:`PHASES` as (name, start, end), a tenth of a second each, from ``now - 1``."""
    return [(name, now - 1 + i * 0.1, now - 0.9 + i * 0.1) for i, name in enumerate(PHASES)]


def bench_lifecycle_vs_upstream(repeats: int, passes: int = 10_000, save_interval: int = 100):
    """The whole lifecycle, ours over upstream's helpers: same spans, links, order."""
    spans = 1 + len(PHASES) + passes // save_interval

    def ours() -> float:
        telemetry = InMemoryTelemetry()
        phases = SpanPhases(telemetry, save_interval=save_interval)
        now = time.time()
        startup = _phase_spans(now)
        start = time.perf_counter()
        phases.start_job(model_type="GPT", timestamps={"program_start": now - 1})
        for phase in startup:
            phases.record_phase(*phase)
        phases.start_train()
        for iteration in range(passes):
            phases.step(iteration)
        phases.end_train()
        phases.shutdown()
        elapsed = time.perf_counter() - start
        assert len(telemetry.exporter.get_finished_spans()) == spans
        return elapsed

    def baseline() -> float:
        telemetry = InMemoryTelemetry()
        upstream.bind(telemetry, save_interval)
        now = time.time()
        startup = _phase_spans(now)
        start = time.perf_counter()
        upstream.pretrain({"program_start": now - 1}, startup, passes)
        elapsed = time.perf_counter() - start
        assert len(telemetry.exporter.get_finished_spans()) == spans
        return elapsed

    return interleaved(ours, baseline, repeats)


def bench_reroot_vs_upstream(repeats: int, n: int):
    """One reroot (end C(k), open C(k+1) linked to it), ours over upstream's helper."""
    ours_telemetry, phases = _in_first_interval()

    upstream_telemetry = InMemoryTelemetry()
    upstream.bind(upstream_telemetry, 1)
    upstream.start_job("GPT", time.time() - 1, {})
    upstream.end_startup()
    upstream.start_train()
    upstream.step()

    def ours() -> float:
        ours_telemetry.exporter.clear()
        return time_calls(lambda _: phases.step(), n)

    def baseline() -> float:
        upstream_telemetry.exporter.clear()
        return time_calls(lambda _: upstream.reroot(), n)

    result = interleaved(ours, baseline, repeats)
    upstream.shutdown()
    phases.shutdown()
    return result


def section_step(run: Run) -> None:
    for key, enabled in (("step_ratio_off", False), ("step_ratio_on", True)):
        ratio, ours, base = bench_step(enabled, run.reps, 200_000)
        run.record(key, ratio, f"{ours * 1e9:.1f} ns", f"{base * 1e9:.1f} ns (empty method)")


def section_reroot(run: Run) -> None:
    ratio, ours, base = bench_reroot(run.reps, 2_000)
    run.record("reroot_ratio", ratio, f"{ours * 1e6:.2f} us", f"{base * 1e6:.2f} us (raw SDK)")
    ratio, ours, base = bench_reroot_vs_upstream(run.reps, 2_000)
    run.record(
        "reroot_ratio_vs_upstream", ratio, f"{ours * 1e6:.2f} us", f"{base * 1e6:.2f} us (upstream)"
    )


def section_lifecycle(run: Run) -> None:
    ratio, ours, base = bench_lifecycle(max(run.reps // 2, 3))
    run.record("lifecycle_ratio", ratio, f"{ours * 1e3:.2f} ms", f"{base * 1e3:.2f} ms (raw SDK)")
    ratio, ours, base = bench_lifecycle_vs_upstream(max(run.reps // 2, 3))
    run.record(
        "lifecycle_ratio_vs_upstream",
        ratio,
        f"{ours * 1e3:.2f} ms",
        f"{base * 1e3:.2f} ms (upstream)",
    )
