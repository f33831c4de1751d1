#!/usr/bin/env python3
"""An application instrumented with the plain OpenTelemetry Python SDK, no companion: it builds
its Resource in code and sends a span every 100 ms over OTLP/HTTP, for the identity tests.

``--resource KEY=VALUE`` (repeatable) is the resource it builds. By default it is built the usual
way, ``Resource.create`` (the SDK's detectors, so ``OTEL_SERVICE_NAME`` in the environment wins
over code); ``--ignore-environment`` builds it with ``Resource(...)`` alone, so what the code says
is what it sends whatever its environment holds (a launcher's ``OTEL_SERVICE_NAME`` inherited by
an application that names itself). Writes its PID to ``--pid-file`` and waits for
``--start-after`` before sending.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ignore-environment", action="store_true")
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--start-after", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {}
    for pair in args.resource:
        key, _, value = pair.partition("=")
        attributes[key] = int(value) if value.isdigit() else value
    resource = Resource(attributes) if args.ignore_environment else Resource.create(attributes)

    partial = args.pid_file.with_name(args.pid_file.name + ".partial")
    partial.write_text(str(os.getpid()))
    partial.replace(args.pid_file)
    deadline = time.monotonic() + 120
    while not args.start_after.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"plain_sdk_app: {args.start_after} never appeared")
        time.sleep(0.05)

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    tracer = provider.get_tracer("plain-sdk-app")
    stop_at = time.monotonic() + args.seconds
    while time.monotonic() < stop_at:
        with tracer.start_as_current_span("work"):
            time.sleep(0.1)
    provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
