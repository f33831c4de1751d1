#!/usr/bin/env python3
"""The end of the load benchmark's pipelines (benches/load/receiver_load.py): an OTLP/gRPC sink
that takes traces, metrics and logs, and for each span it receives notes its id and how long
after its end time it arrived (arrival clock minus the span's end_time_unix_nano, both the
machine's wall clock). The same sink ends the direct run (telemetrygen straight to it), the
gpulse run and the Collector run, so what a middle adds is the difference of the runs.

Prints {"grpc": PORT} once listening. Each line on stdin is a command: `reset` forgets what was
received, `report` prints one JSON line: spans, distinct ids, latency percentiles (ms), the
enriched count (spans with gpulse.gpu.samples), and the last gpulse.receiver.spans that gpulse's
own metrics brought (what its receiver accepted: generated minus that is what the sender's SDK
dropped or had refused, that minus the distinct spans here is what gpulse lost).
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

ENRICHED_KEY = "gpulse.gpu.samples"


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.ids = set()
            self.spans = 0
            self.enriched = 0
            self.latencies_ns = []
            self.gpulse_accepted = None

    def report(self):
        with self.lock:
            lat = sorted(self.latencies_ns)

            def pct(p):
                return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))] / 1e6, 2) if lat else None
            return {"spans": self.spans, "distinct": len(self.ids), "enriched": self.enriched,
                    "p50_ms": pct(50), "p99_ms": pct(99), "max_ms": pct(100),
                    "gpulse_accepted": self.gpulse_accepted}


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, state):
        self.state = state

    def Export(self, request, context):  # noqa: N802 (the generated name)
        now = time.time_ns()
        ids, lat, enriched = [], [], 0
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    ids.append(span.span_id)
                    lat.append(now - span.end_time_unix_nano)
                    enriched += any(a.key == ENRICHED_KEY for a in span.attributes)
        with self.state.lock:
            self.state.spans += len(ids)
            self.state.ids.update(ids)
            self.state.latencies_ns.extend(lat)
            self.state.enriched += enriched
        return trace_service_pb2.ExportTraceServiceResponse()


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, state):
        self.state = state

    def Export(self, request, context):  # noqa: N802
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "gpulse.receiver.spans":
                        with self.state.lock:
                            self.state.gpulse_accepted = sum(p.as_int for p in metric.sum.data_points)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def Export(self, request, context):  # noqa: N802
        return logs_service_pb2.ExportLogsServiceResponse()


def main():
    state = State()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(state), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(state), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"grpc": port}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "reset":
            state.reset()
            print(json.dumps({"reset": True}), flush=True)
        elif command == "report":
            print(json.dumps(state.report()), flush=True)
    server.stop(1)


if __name__ == "__main__":
    main()
