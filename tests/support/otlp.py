"""An OTLP/HTTP trace receiver: what a collector would get from Keel's processes.

It decodes the protobuf requests the SDK's exporter sends (``/v1/traces``) into plain
span records, so a test reads the spans exactly as an APM would receive them.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    service: str
    attributes: dict[str, Any]
    links: tuple[str, ...]  # span ids
    start_ns: int
    status: int  # 0 unset, 1 ok, 2 error


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Span(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            service=str(resource.get("service.name", "")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple(link.span_id.hex() for link in span.links),
                            start_ns=span.start_time_unix_nano,
                            status=span.status.code,
                        )
                    )
        with self._lock:
            self.spans.extend(received)
            self.requests += 1

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)


def ancestors(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """``span``'s parent, its parent's parent, ... as far as the received spans go."""
    chain = []
    current = by_id.get(span.parent_id)
    while current is not None and current not in chain:
        chain.append(current)
        current = by_id.get(current.parent_id)
    return chain
