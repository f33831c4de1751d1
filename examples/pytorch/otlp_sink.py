#!/usr/bin/env python3
"""A minimal OTLP/HTTP receiver that writes what it gets as OTLP/JSON lines, for tests and demos.

It stands in for an OpenTelemetry Collector with a ``file`` exporter where none is installed:
``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` with protobuf bodies (gzip or not; JSON
bodies are taken as they are) are answered 200 and appended to ``--out``, one request per line, in
the collector file exporter's format (camelCase fields, int64 as strings, trace and span ids in
hex, enums as numbers), which is what correlate.py reads.

Listens on 127.0.0.1 only. Prints ``listening on http://127.0.0.1:<port>`` and writes the port to
``--port-file`` once ready; stops on SIGTERM/SIGINT or after ``--max-seconds``.

Needs ``opentelemetry-proto`` (installed with the OTLP exporters).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _request_types():
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return {
        "/v1/traces": (
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
        ),
        "/v1/metrics": (
            metrics_service_pb2.ExportMetricsServiceRequest,
            metrics_service_pb2.ExportMetricsServiceResponse,
        ),
        "/v1/logs": (
            logs_service_pb2.ExportLogsServiceRequest,
            logs_service_pb2.ExportLogsServiceResponse,
        ),
    }


def hex_ids(node):
    """ProtoJSON writes bytes as base64; OTLP/JSON wants trace and span ids as hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            hex_ids(item)
    return node


def to_json_line(body: bytes, request_type) -> str:
    from google.protobuf.json_format import MessageToDict

    message = request_type()
    message.ParseFromString(body)
    as_dict = MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(hex_ids(as_dict), separators=(",", ":"))


class Sink:
    def __init__(self, out: Path) -> None:
        self._out = out.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self.requests = 0

    def write(self, line: str) -> None:
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()
            self.requests += 1

    def close(self) -> None:
        with self._lock:
            self._out.close()


def make_handler(sink: Sink, types):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?", 1)[0]
            if path not in types:
                self.send_error(404, f"no OTLP signal at {path}; use /v1/traces, /v1/metrics")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            request_type, response_type = types[path]
            try:
                if "json" in self.headers.get("Content-Type", ""):
                    line = json.dumps(json.loads(body), separators=(",", ":"))
                else:
                    line = to_json_line(body, request_type)
            except Exception as error:  # noqa: BLE001 - a bad body is the client's problem
                self.send_error(400, f"cannot decode the OTLP request: {error}")
                return
            sink.write(line)
            payload = response_type().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_args) -> None:
            return None

    return Handler


def serve(out: Path, port: int = 0, port_file: Optional[Path] = None, max_seconds: float = 600):
    sink = Sink(out)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(sink, _request_types()))
    actual = server.server_address[1]
    print(f"listening on http://127.0.0.1:{actual}", flush=True)
    if port_file is not None:
        partial = port_file.with_name(port_file.name + ".partial")
        partial.write_text(f"{actual}\n")
        partial.replace(port_file)
    stop = threading.Event()

    def request_stop(*_args) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait(max_seconds)
    server.shutdown()
    server.server_close()
    sink.close()
    return sink.requests


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="append OTLP/JSON lines here")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    requests = serve(args.out, args.port, args.port_file, args.max_seconds)
    print(f"stopped after {requests} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
