"""A pytest plugin for ``run_flaky.py``: the timing-sensitive tests only, in a seeded order.

Loaded with ``-p flaky_order``. ``--flaky-seed N`` shuffles the collected tests with
``random.Random(N)`` (the same seed gives the same order, so a failure's order can be
run again); ``--flaky-report FILE`` appends one JSON line per failed test phase
(its node id, phase, the failure's text and its captured output) and a last line with
the session's counts; ``--flaky-only`` keeps only the tests that wait on another process, a
port, a file appearing, a signal or a clock (:data:`WAITING_PATHS` and every test
marked ``slow``), and deselects the rest through pytest's own deselection report.
"""

from __future__ import annotations

import json
import random

import pytest

#: The test files, besides every ``slow`` test, whose tests start processes, send
#: signals, listen on ports or wait for a file or a thread (paths from the checkout's root).
WAITING_PATHS = (
    "tests/training/runs/",
    "tests/training/telemetry_spans/test_signals.py",
    "tests/training/telemetry_spans/test_exit_hooks.py",
    "tests/training/telemetry_spans/test_endings.py",
    "tests/training/test_distributed.py",
    # the shipped lifecycle tests, in a pytest of their own: one waits for a signal sent again
    "tests/training/test_port_upstream.py",
    "tests/training/telemetry/test_trainer_signals.py",
    # a real lifecycle's final metric export against the report, within 2 % of its wall
    "tests/training/telemetry/test_goodput_metrics.py",
    "tests/core/telemetry/test_signals.py",
    "tests/core/telemetry/test_signal_switches.py",
    "tests/core/telemetry/test_watchdog.py",
    "tests/core/telemetry/test_heartbeat.py",
    "tests/core/telemetry/test_fork.py",
    "tests/core/telemetry/test_fallbacks.py",
    "tests/core/telemetry/test_jsonl_robustness.py",
    # exporter and pipeline threads: started, flushed, stopped, waited for
    "tests/core/telemetry/test_setup.py",
    "tests/core/telemetry/test_processors.py",
    "tests/trace/cli/test_main.py",
    "tests/trace/cli/test_watch.py",
    "tests/trace/receive/",
    "tests/trace/live/",
    "tests/trace/render/metrics/test_otlp_push.py",
    "tests/trace/render/metrics/test_prometheus.py",
    "tests/trace/otlp/test_parallel_cluster.py",
    # Megatron-LM's pretrain_gpt.py on one rank and two: outside the default collection
    # (norecursedirs), so only when named, in the upstream environment (tests/README.md)
    "tests/upstream/",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flaky", "repeated runs of the timing-sensitive tests")
    group.addoption(
        "--flaky-seed",
        type=int,
        default=None,
        help="shuffle the collected tests with this seed (same seed, same order)",
    )
    group.addoption(
        "--flaky-report",
        default=None,
        help="append each failure (and, last, the session's counts) to this file as JSON lines",
    )
    group.addoption(
        "--flaky-only",
        action="store_true",
        help="keep only the slow tests and those in the waiting files (flaky_order.WAITING_PATHS)",
    )


def _waits(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    return item.get_closest_marker("slow") is not None or path.startswith(WAITING_PATHS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("flaky_only"):
        kept = [item for item in items if _waits(item)]
        dropped = [item for item in items if not _waits(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    seed = config.getoption("flaky_seed")
    if seed is not None:
        random.Random(seed).shuffle(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("flaky_seed")
    return None if seed is None else f"flaky_order: tests shuffled with seed {seed}"


def _append(config: pytest.Config, record: dict) -> None:
    path = config.getoption("flaky_report")
    if path is not None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    """The test running now, in ``<report>.running``: what a hung session was doing."""
    config = _CONFIG.get("config")
    path = None if config is None else config.getoption("flaky_report")
    if path is not None:
        with open(f"{path}.running", "w", encoding="utf-8") as out:
            out.write(nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    counts = _CONFIG.setdefault("counts", {})
    if report.when == "call" or report.outcome != "passed":
        counts[report.outcome] = counts.get(report.outcome, 0) + 1
    if report.failed:
        _append(
            config,
            {
                "nodeid": report.nodeid,
                "when": report.when,
                "seed": config.getoption("flaky_seed"),
                "failure": report.longreprtext,
                "output": [{"name": name, "text": text} for name, text in report.sections],
            },
        )


_CONFIG: dict = {}


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _append(
        session.config,
        {"session": int(exitstatus), "counts": _CONFIG.get("counts", {})},
    )
