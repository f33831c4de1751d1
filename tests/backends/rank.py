#!/usr/bin/env python3
"""A stand-in for one rank of a torch.distributed job in the backend tests: a real process that,
like the PyTorch companion, sends one `step` span per training step to its node's gpulse receiver
(OTLP/HTTP protobuf) with `pytorch.distributed.collective.wait` on it and the rank and job id on
its resource (process.pid = its own PID, so gpulse ties the spans to the GPU process nvml-sim
lists). Usage: rank.py URL JOB_ID RANK STEP_SECONDS WAIT_SECONDS. Each step sleeps STEP_SECONDS,
of which WAIT_SECONDS count as the collective wait. Prints one line per failed send.
Uses only opentelemetry-proto (the test environment's receiver dependency)."""

import os
import sys
import time
import urllib.request

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span


def main():
    url, job_id, rank, step, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    resource = Resource(attributes=[
        KeyValue(key="service.name", value=AnyValue(string_value=f"trainer-rank{rank}")),
        KeyValue(key="process.pid", value=AnyValue(int_value=os.getpid())),
        KeyValue(key="pytorch.distributed.rank", value=AnyValue(int_value=rank)),
        KeyValue(key="pytorch.distributed.job.id", value=AnyValue(string_value=job_id)),
    ])
    trace_id = os.urandom(16)
    while True:
        time.sleep(step)
        now = time.time_ns()
        span = Span(trace_id=trace_id, span_id=os.urandom(8), name="step", kind=Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=now - int(step * 1e9), end_time_unix_nano=now,
                    attributes=[KeyValue(key="pytorch.distributed.collective.wait",
                                         value=AnyValue(double_value=wait))])
        body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
            resource=resource, scope_spans=[ScopeSpans(scope=InstrumentationScope(name="otel_torch_train"),
                                                        spans=[span])])]).SerializeToString()
        try:
            req = urllib.request.Request(url.rstrip("/") + "/v1/traces", data=body,
                                         headers={"Content-Type": "application/x-protobuf"}, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
        except Exception as e:  # the receiver may not listen yet; the test reads this log on failure
            print(f"send failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
