#!/usr/bin/env python3
"""A real OTLP receiver for gpulse's end-to-end tests.

Serves OTLP/gRPC (metrics, logs and traces services) and OTLP/HTTP (/v1/metrics, /v1/logs,
/v1/traces; protobuf bodies, gzip or not) on 127.0.0.1, optionally over TLS, and writes every
request it gets as one JSON line to --output: the request (json_format.MessageToDict) plus what
the tests check about the transport (signal, transport, headers, content encoding, receive time,
and what was answered).

When a port is 0 the kernel picks one; either way the bound ports are printed as one JSON line
on stdout, e.g. {"grpc": 12345, "http": 12346}, once both servers are listening.

Fault modes, for outage and error-handling tests:
  --fail-status S        answer S: unavailable | resource_exhausted_retry_info |
                         invalid_argument | http_429_retry_after (on gRPC: resource exhausted
                         with RetryInfo, so both transports see a retryable hint)
  --fail-until-file P    answer --fail-status (default unavailable) while P exists; delete P
                         to end the outage
  --fail-count N         answer --fail-status to the first N requests only
  --retry-after SECONDS  the hint sent with the retryable statuses (default 1)
  --partial-success N    accept, but report N rejected points/records
  --fail-signal SIGNAL   apply the faults above to this signal only (metrics | logs | traces;
                         repeatable); requests of the other signals are accepted
Without --fail-until-file or --fail-count, --fail-status applies to every request.

Exits 0 on SIGTERM or SIGINT. Exits 3, saying what to install, when a module is missing.
"""

import argparse
import gzip
import json
import os
import signal
import ssl
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import grpc
    from google.protobuf import duration_pb2, json_format
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import (
        metrics_service_pb2,
        metrics_service_pb2_grpc,
    )
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
except ImportError as missing:  # pragma: no cover - exercised by a missing venv, not a test
    here = os.path.dirname(os.path.abspath(__file__))
    sys.stderr.write(
        f"otlp_receiver: missing Python module ({missing}); install the test requirements with\n"
        f"  pip install -r {os.path.join(here, 'requirements.txt')}\n"
        "and point GPULSE_TEST_PYTHON at that interpreter if it is not python3\n"
    )
    sys.exit(3)

FAIL_STATUSES = (
    "unavailable",
    "resource_exhausted_retry_info",
    "invalid_argument",
    "http_429_retry_after",
)

# signal -> (request type, response type, partial-success field of the response)
SIGNALS = {
    "metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
        "rejected_data_points",
    ),
    "logs": (
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
        "rejected_log_records",
    ),
    "traces": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
        "rejected_spans",
    ),
}


class Receiver:
    """What both servers share: the fault policy and the output file."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.seen = 0
        self.out = open(args.output, "a", encoding="utf-8")

    def failure(self, signal_name):
        """The fault to answer the current request with, or None to accept it."""
        if self.args.fail_signal and signal_name not in self.args.fail_signal:
            return None
        with self.lock:
            index = self.seen
            self.seen += 1
        args = self.args
        status = args.fail_status
        if args.fail_until_file is not None:
            if os.path.exists(args.fail_until_file):
                return status or "unavailable"
            return None
        if args.fail_count is not None:
            return (status or "unavailable") if index < args.fail_count else None
        return status

    def record(self, signal_name, transport, headers, encoding, answer, message, error=None):
        line = {
            "signal": signal_name,
            "transport": transport,
            "headers": headers,
            "content_encoding": encoding,
            "received_at": time.time(),
            "answer": answer,
            "request": json_format.MessageToDict(message) if message is not None else None,
        }
        if error:
            line["error"] = error
        with self.lock:
            self.out.write(json.dumps(line, sort_keys=True) + "\n")
            self.out.flush()

    def response(self, signal_name):
        _, response_type, field = SIGNALS[signal_name]
        response = response_type()
        if self.args.partial_success:
            response.partial_success.SetInParent()
            setattr(response.partial_success, field, self.args.partial_success)
            response.partial_success.error_message = (
                f"test receiver rejected {self.args.partial_success}"
            )
        return response


def rpc_status(code, message, retry_after=None):
    status = status_pb2.Status(code=code, message=message)
    if retry_after is not None:
        info = error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=int(retry_after))
        )
        status.details.add().Pack(info)
    return status


# ---------------------------------------------------------------- gRPC


def grpc_servicer(receiver, signal_name):
    grpc_codes = {
        "unavailable": (grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, False),
        "resource_exhausted_retry_info": (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            code_pb2.RESOURCE_EXHAUSTED,
            True,
        ),
        "http_429_retry_after": (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            code_pb2.RESOURCE_EXHAUSTED,
            True,
        ),
        "invalid_argument": (grpc.StatusCode.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT, False),
    }

    def export(request, context):
        metadata = {}
        for key, value in context.invocation_metadata():
            metadata[key] = value if isinstance(value, str) else value.hex()
        encoding = metadata.get("grpc-encoding")
        fault = receiver.failure(signal_name)
        if fault is None:
            receiver.record(signal_name, "grpc", metadata, encoding, "ok", request)
            return receiver.response(signal_name)
        code, rpc_code, hint = grpc_codes[fault]
        message = f"test receiver answers {fault}"
        receiver.record(signal_name, "grpc", metadata, encoding, fault, request)
        status = rpc_status(rpc_code, message, receiver.args.retry_after if hint else None)
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(code, message)

    class Servicer:
        Export = staticmethod(export)

    return Servicer()


def start_grpc(receiver, args):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
        grpc_servicer(receiver, "metrics"), server
    )
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(grpc_servicer(receiver, "logs"), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
        grpc_servicer(receiver, "traces"), server
    )
    address = f"{args.host}:{args.grpc_port}"
    if args.tls_cert:
        with open(args.tls_key, "rb") as key, open(args.tls_cert, "rb") as cert:
            pair = (key.read(), cert.read())
        client_ca = None
        if args.tls_client_ca:
            with open(args.tls_client_ca, "rb") as ca:
                client_ca = ca.read()
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"otlp_receiver: could not bind gRPC on {address}")
    server.start()
    return server, port


# ---------------------------------------------------------------- HTTP

HTTP_PATHS = {"/v1/metrics": "metrics", "/v1/logs": "logs", "/v1/traces": "traces"}


def http_handler(receiver):
    http_faults = {
        "unavailable": (503, code_pb2.UNAVAILABLE, True),
        "resource_exhausted_retry_info": (429, code_pb2.RESOURCE_EXHAUSTED, True),
        "http_429_retry_after": (429, code_pb2.RESOURCE_EXHAUSTED, True),
        "invalid_argument": (400, code_pb2.INVALID_ARGUMENT, False),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass  # stdout carries the ports line only; stderr stays for real errors

        def send_proto(self, status, message, extra_headers=()):
            body = message.SerializeToString()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra_headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            signal_name = HTTP_PATHS.get(self.path)
            if signal_name is None:
                self.send_proto(404, rpc_status(code_pb2.NOT_FOUND, f"no OTLP path {self.path}"))
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            encoding = headers.get("content-encoding")
            request_type = SIGNALS[signal_name][0]
            try:
                body = gzip.decompress(raw) if encoding == "gzip" else raw
                if headers.get("content-type") != "application/x-protobuf":
                    raise ValueError(f"content-type {headers.get('content-type')!r}")
                message = request_type.FromString(body)
            except Exception as bad:  # noqa: BLE001 - any decoding failure is a 400 to the client
                receiver.record(signal_name, "http", headers, encoding, "bad_request", None, str(bad))
                self.send_proto(400, rpc_status(code_pb2.INVALID_ARGUMENT, f"undecodable: {bad}"))
                return
            fault = receiver.failure(signal_name)
            if fault is None:
                receiver.record(signal_name, "http", headers, encoding, "ok", message)
                self.send_proto(200, receiver.response(signal_name))
                return
            status, rpc_code, hint = http_faults[fault]
            receiver.record(signal_name, "http", headers, encoding, fault, message)
            extra = [("Retry-After", str(receiver.args.retry_after))] if hint else []
            self.send_proto(status, rpc_status(rpc_code, f"test receiver answers {fault}"), extra)

    return Handler


def start_http(receiver, args):
    server = ThreadingHTTPServer((args.host, args.http_port), http_handler(receiver))
    server.daemon_threads = True
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca:
            context.load_verify_locations(args.tls_client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
    thread.start()
    return server, server.server_address[1]


# ---------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--grpc-port", type=int, default=0)
    p.add_argument("--http-port", type=int, default=0)
    p.add_argument("--output", required=True, help="JSON lines file, appended to")
    p.add_argument("--fail-status", choices=FAIL_STATUSES)
    p.add_argument("--fail-until-file")
    p.add_argument("--fail-count", type=int)
    p.add_argument("--retry-after", type=int, default=1)
    p.add_argument("--partial-success", type=int, default=0)
    p.add_argument("--fail-signal", action="append", choices=sorted(SIGNALS))
    p.add_argument("--tls-cert", help="server certificate chain (PEM); enables TLS on both")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    return args


def main(argv=None):
    args = parse_args(argv)
    receiver = Receiver(args)
    grpc_server, grpc_port = start_grpc(receiver, args)
    http_server, http_port = start_http(receiver, args)

    stop = threading.Event()

    def on_signal(*_):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(json.dumps({"grpc": grpc_port, "http": http_port}), flush=True)
    while not stop.wait(0.2):
        pass
    http_server.shutdown()
    grpc_server.stop(grace=1).wait()
    receiver.out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
