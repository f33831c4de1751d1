#!/usr/bin/env python3
"""The application of the backend tests: a stand-in for a training job that the scenario lists
as a GPU process. It waits on standard input; for each line `send URL` it sends one span
("train_step", covering the last 3 seconds) over OTLP/HTTP protobuf to URL/v1/traces with its
own resource (service.name from OTEL_SERVICE_NAME, process.pid = its own PID), and prints one
JSON line: the URL, the trace and span ids (hex) and the HTTP status, or an error.
Uses only opentelemetry-proto (the test environment's receiver dependency)."""

import json
import os
import sys
import time
import urllib.request

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span


def send(url: str) -> dict:
    trace_id, span_id = os.urandom(16), os.urandom(8)
    now = time.time_ns()
    resource = Resource(attributes=[
        KeyValue(key="service.name", value=AnyValue(string_value=os.environ.get("OTEL_SERVICE_NAME", "app"))),
        KeyValue(key="process.pid", value=AnyValue(int_value=os.getpid())),
    ])
    span = Span(trace_id=trace_id, span_id=span_id, name="train_step", kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=now - 3_000_000_000, end_time_unix_nano=now,
                attributes=[KeyValue(key="train.step", value=AnyValue(int_value=1))])
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(scope=InstrumentationScope(name="backends-test-app"), spans=[span])])])
    out = {"url": url, "trace_id": trace_id.hex(), "span_id": span_id.hex(), "pid": os.getpid()}
    try:
        req = urllib.request.Request(url.rstrip("/") + "/v1/traces", data=request.SerializeToString(),
                                     headers={"Content-Type": "application/x-protobuf"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            out["status"] = r.status
    except Exception as e:  # reported to the test, which fails with it
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def main():
    for line in sys.stdin:
        words = line.split()
        if len(words) == 2 and words[0] == "send":
            print(json.dumps(send(words[1])), flush=True)


if __name__ == "__main__":
    main()
