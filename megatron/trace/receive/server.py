"""The two listeners of ``megatron-trace receive``: OTLP/gRPC and OTLP/HTTP, one writer.

Both answer as a collector's OTLP receiver does: gRPC's ``Export`` of the
trace, metrics and logs services (grpcio, with the services' generated
stubs), and HTTP ``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` with
a protobuf or JSON body, gzip-compressed or not, answered in the body's own
encoding; a body that is not an export request is refused (HTTP 400, gRPC
``INVALID_ARGUMENT``) and nothing of it is written. A request refused because
``OUT`` holds as many folders as it may (:class:`~.files.FolderLimitError`) is
answered as one the sender must not retry (HTTP 507, gRPC
``FAILED_PRECONDITION``), and said once on stderr; a write that failed is
answered as one to retry (HTTP 503, gRPC ``UNAVAILABLE``).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from megatron.trace.receive.convert import from_json, from_protobuf, request_types, to_json
from megatron.trace.receive.files import DEFAULT_MAX_FOLDERS, FolderLimitError, RankFiles
from megatron.trace_format.errors import MissingExtraError, TraceError, TraceInputError

__all__ = ["HTTP_PATHS", "Receiver"]

#: OTLP/HTTP path -> signal.
HTTP_PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}


class Receiver:
    """Listens on ``grpc`` and/or ``http`` ((host, port), or None for off) and writes under
    ``out``. :meth:`start` binds both (a port that cannot be had is a TraceInputError naming
    its flag); ``grpc_port``/``http_port`` are then the ports bound (port 0: any free one)."""

    def __init__(
        self,
        out: Path,
        grpc: tuple[str, int] | None,
        http: tuple[str, int] | None,
        on_error: Callable[[str], None] = lambda text: None,
        max_folders: int = DEFAULT_MAX_FOLDERS,
    ) -> None:
        self.files = RankFiles(out, max_folders)
        self.grpc, self.http = grpc, http
        self.on_error = on_error
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self.requests = 0
        self._count_lock = threading.Lock()
        self._limit_said = False
        self._grpc_server: Any = None
        self._http_server: ThreadingHTTPServer | None = None

    def accept(self, kind: str, request: dict[str, Any]) -> None:
        self.files.write(kind, request)
        with self._count_lock:
            self.requests += 1

    def refused(self, error: FolderLimitError) -> None:
        """Say the first refusal for want of folders (the next ones are counted, in
        ``files.refused``, not said: a client could send them without end)."""
        with self._count_lock:
            said, self._limit_said = self._limit_said, True
        if not said:
            self.on_error(f"{error} (further refusals are counted, not said)")

    def start(self) -> None:
        request_types()  # a missing opentelemetry-proto: one line, before anything listens
        try:
            if self.grpc is not None:
                self._start_grpc(*self.grpc)
            if self.http is not None:
                self._start_http(*self.http)
        except BaseException:
            self.stop()
            raise

    def _start_grpc(self, host: str, port: int) -> None:
        try:
            import grpc
        except ImportError:
            raise MissingExtraError("receive --grpc", "grpcio", "receive") from None
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as logs
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as traces

        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"))
        types = request_types()
        for kind, module, service in (
            ("traces", traces, "TraceService"),
            ("metrics", metrics, "MetricsService"),
            ("logs", logs, "LogsService"),
        ):
            servicer = getattr(module, f"{service}Servicer")
            add = getattr(module, f"add_{service}Servicer_to_server")
            add(_grpc_servicer(servicer, kind, types[kind][1], self, grpc), server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if not bound:
            raise TraceInputError(
                f"--grpc {host}:{port}: cannot listen there (the port in use, or not an "
                "address of this machine); give another HOST:PORT, or --grpc off"
            )
        server.start()
        self._grpc_server, self.grpc_port = server, bound

    def _start_http(self, host: str, port: int) -> None:
        handler = type("Handler", (_OtlpHttpHandler,), {"receiver": self})
        try:
            server = _HttpServer((host, port), handler)
        except OSError as error:
            raise TraceInputError(
                f"--http {host}:{port}: cannot listen there ({error.strerror or error}); "
                "give another HOST:PORT, or --http off"
            ) from None
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True).start()
        self._http_server, self.http_port = server, server.server_address[1]

    def stop(self) -> None:
        """Stop listening (a gRPC call in flight gets a second to finish), then close files."""
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=1.0).wait()
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        self.files.close()


class _HttpServer(ThreadingHTTPServer):
    """The standard library's threading server with a listen backlog for a cluster: its
    default (5) made the kernel reset connections when 16 exporters connected at once."""

    request_queue_size = 1024


def _grpc_servicer(base: type, kind: str, response: type, receiver: Receiver, grpc: Any) -> Any:
    def export(self: Any, request: Any, context: Any) -> Any:
        try:
            receiver.accept(kind, to_json(request))
        except FolderLimitError as error:
            receiver.refused(error)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except TraceError as error:
            receiver.on_error(str(error))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        return response()

    return type(f"{kind.title()}Receiver", (base,), {"Export": export})()


class _OtlpHttpHandler(BaseHTTPRequestHandler):
    receiver: Receiver
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        kind = HTTP_PATHS.get(self.path.split("?", 1)[0])
        if kind is None:
            self._answer(404, "text/plain", f"no such OTLP path: {self.path}".encode())
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        kind_of_body = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding != "identity":
                self._answer(415, "text/plain", f"unsupported encoding {encoding}".encode())
                return
        except (OSError, zlib.error, EOFError) as error:
            self._answer(400, "text/plain", f"cannot decompress the body: {error}".encode())
            return
        if kind_of_body == "application/json":
            decode, answer_type = from_json, "application/json"
        elif kind_of_body in ("application/x-protobuf", "application/protobuf"):
            decode, answer_type = from_protobuf, "application/x-protobuf"
        else:
            self._answer(415, "text/plain", b"expected application/x-protobuf or application/json")
            return
        try:
            request = decode(kind, body)
        except TraceInputError as error:
            self._answer(400, "text/plain", str(error).encode())
            return
        try:
            self.receiver.accept(kind, request)
        except FolderLimitError as error:
            self.receiver.refused(error)
            self._answer(507, "text/plain", str(error).encode())
            return
        except TraceError as error:
            self.receiver.on_error(str(error))
            self._answer(503, "text/plain", str(error).encode())
            return
        if answer_type == "application/json":
            self._answer(200, answer_type, b"{}")
        else:
            self._answer(200, answer_type, request_types()[kind][1]().SerializeToString())

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a request per export interval is no news (errors go to ``on_error``)."""
