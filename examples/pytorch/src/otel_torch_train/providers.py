"""Tracer and meter providers built from the standard ``OTEL_*`` environment variables.

Which exporter each signal uses, in order: the argument given in code, then
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (comma-separated: ``otlp``, ``console``,
``none``), then ``otlp``; the same for logs with ``OTEL_LOGS_EXPORTER``, whose provider is only
built when something sends logs (the opt-in memory summary). The OTLP transport:
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_LOGS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then
``http/protobuf`` (the specification's default). Endpoints, headers, timeouts, compression and
certificates are left to the OTLP exporters, which read ``OTEL_EXPORTER_OTLP_*`` themselves; the
metric export interval to ``PeriodicExportingMetricReader`` (``OTEL_METRIC_EXPORT_INTERVAL``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    ConsoleLogRecordExporter,
    LogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_LOGS_EXPORTER = "OTEL_LOGS_EXPORTER"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_EXPORTER_OTLP_LOGS_PROTOCOL = "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"

_SUPPORTED_EXPORTERS = ("otlp", "console", "none")
_SUPPORTED_PROTOCOLS = ("http/protobuf", "grpc")


class TelemetryConfigError(ValueError):
    """An ``OTEL_*`` setting this package cannot honour; the message names the variable and fix."""


@dataclass
class Providers:
    """The providers built for one process, to be shut down together at exit."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    #: Only when something sends logs (see build_logger_provider).
    logger_provider: Optional[LoggerProvider] = None

    def shutdown(self) -> None:
        # Tracer first: spans ended during a crash should not wait behind a metric export.
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        if self.logger_provider is not None:
            self.logger_provider.shutdown()


def exporter_names(variable: str, given: Optional[str]) -> List[str]:
    """The exporters named by ``given`` or the variable, validated; ``[]`` means none."""
    raw = given if given is not None else os.environ.get(variable, "otlp")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    if not names:
        names = ["otlp"]
    for name in names:
        if name not in _SUPPORTED_EXPORTERS:
            raise TelemetryConfigError(
                f"{variable}={raw!r}: exporter {name!r} is not supported by otel-torch-train; "
                f"use a comma-separated list of {', '.join(_SUPPORTED_EXPORTERS)}"
            )
    if "none" in names:
        if len(names) > 1:
            raise TelemetryConfigError(
                f"{variable}={raw!r}: 'none' cannot be combined with other exporters"
            )
        return []
    return names


def otlp_protocol(signal_variable: str) -> str:
    """The OTLP transport for one signal, from its own variable, the generic one, or the default."""
    for variable in (signal_variable, OTEL_EXPORTER_OTLP_PROTOCOL):
        value = os.environ.get(variable, "").strip().lower()
        if not value:
            continue
        if value not in _SUPPORTED_PROTOCOLS:
            raise TelemetryConfigError(
                f"{variable}={value!r}: the Python OTLP exporters speak "
                f"{' or '.join(_SUPPORTED_PROTOCOLS)}; http/json is not available in Python"
            )
        return value
    return "http/protobuf"


def _missing_grpc(error: ImportError) -> TelemetryConfigError:
    return TelemetryConfigError(
        "OTLP protocol 'grpc' was asked for but opentelemetry-exporter-otlp-proto-grpc is not "
        f"installed ({error}); pip install 'otel-torch-train[grpc]' or set "
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"
    )


def _otlp_span_exporter() -> SpanExporter:
    if otlp_protocol(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as error:
            raise _missing_grpc(error) from error
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def _otlp_metric_exporter() -> MetricExporter:
    if otlp_protocol(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL) == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )
        except ImportError as error:
            raise _missing_grpc(error) from error
        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as Http,
    )

    return Http()


def _otlp_log_exporter() -> LogRecordExporter:
    if otlp_protocol(OTEL_EXPORTER_OTLP_LOGS_PROTOCOL) == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        except ImportError as error:
            raise _missing_grpc(error) from error
        return OTLPLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as Http

    return Http()


def build_tracer_provider(resource: Resource, exporters: Optional[str] = None) -> TracerProvider:
    """A TracerProvider sending to what ``exporters`` or ``OTEL_TRACES_EXPORTER`` names."""
    provider = TracerProvider(resource=resource)
    for name in exporter_names(OTEL_TRACES_EXPORTER, exporters):
        if name == "otlp":
            # Batching keeps the export off the training thread: a step only enqueues.
            provider.add_span_processor(BatchSpanProcessor(_otlp_span_exporter()))
        else:
            # Console output is for debugging; ordered and immediate beats fast there.
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    return provider


def build_meter_provider(resource: Resource, exporters: Optional[str] = None) -> MeterProvider:
    """A MeterProvider with one periodic reader per exporter ``OTEL_METRICS_EXPORTER`` names."""
    readers = []
    for name in exporter_names(OTEL_METRICS_EXPORTER, exporters):
        exporter = _otlp_metric_exporter() if name == "otlp" else ConsoleMetricExporter()
        readers.append(PeriodicExportingMetricReader(exporter))
    return MeterProvider(resource=resource, metric_readers=readers)


def build_logger_provider(resource: Resource, exporters: Optional[str] = None) -> LoggerProvider:
    """A LoggerProvider sending to what ``exporters`` or ``OTEL_LOGS_EXPORTER`` names."""
    provider = LoggerProvider(resource=resource)
    for name in exporter_names(OTEL_LOGS_EXPORTER, exporters):
        if name == "otlp":
            provider.add_log_record_processor(BatchLogRecordProcessor(_otlp_log_exporter()))
        else:
            provider.add_log_record_processor(SimpleLogRecordProcessor(ConsoleLogRecordExporter()))
    return provider


def build_providers(
    resource: Resource,
    *,
    traces_exporter: Optional[str] = None,
    metrics_exporter: Optional[str] = None,
) -> Providers:
    """Both providers for ``resource``; TelemetryConfigError on a setting it cannot honour."""
    return Providers(
        tracer_provider=build_tracer_provider(resource, traces_exporter),
        meter_provider=build_meter_provider(resource, metrics_exporter),
    )
