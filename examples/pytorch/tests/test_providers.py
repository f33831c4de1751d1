"""Providers from OTEL_* variables: exporter choice, protocol choice, and the errors."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource

from otel_torch_train.providers import (
    TelemetryConfigError,
    build_logger_provider,
    build_providers,
    build_tracer_provider,
    exporter_names,
    otlp_protocol,
)

VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_LOGS_EXPORTER",
    "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def exporter_types(tracer_provider):
    # The SDK keeps processors on its multi-span processor; each holds its exporter.
    processors = tracer_provider._active_span_processor._span_processors
    return [
        type(getattr(p, "span_exporter", None) or p._batch_processor._exporter).__name__
        for p in processors
    ]


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, ["otlp"]),
        ("otlp", ["otlp"]),
        ("console", ["console"]),
        ("none", []),
        (" OTLP , console ", ["otlp", "console"]),
        ("", ["otlp"]),
    ],
)
def test_exporter_names(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    assert exporter_names("OTEL_TRACES_EXPORTER", None) == expected


def test_argument_beats_the_variable(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert exporter_names("OTEL_TRACES_EXPORTER", "none") == []


@pytest.mark.parametrize("value", ["zipkin", "none,console"])
def test_unsupported_exporter_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    with pytest.raises(TelemetryConfigError, match="OTEL_TRACES_EXPORTER"):
        exporter_names("OTEL_TRACES_EXPORTER", None)


def test_protocol_precedence(monkeypatch):
    assert otlp_protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert otlp_protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    assert otlp_protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "http/protobuf"


def test_http_json_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(TelemetryConfigError, match="http/json is not available"):
        otlp_protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


def test_console_and_none(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert exporter_types(build_tracer_provider(Resource.get_empty())) == ["ConsoleSpanExporter"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert exporter_types(build_tracer_provider(Resource.get_empty())) == []


@pytest.mark.parametrize(
    "protocol, module",
    [
        ("http/protobuf", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
        ("grpc", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
    ],
)
def test_otlp_protocol_picks_the_exporter(monkeypatch, protocol, module):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9")
    provider = build_tracer_provider(Resource.get_empty())
    try:
        processor = provider._active_span_processor._span_processors[0]
        exporter = processor._batch_processor._exporter
        assert type(exporter).__module__.startswith(module)
    finally:
        provider.shutdown()


def test_build_providers_share_the_resource(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    resource = Resource.create({"service.name": "t"})
    providers = build_providers(resource)
    assert providers.tracer_provider.resource is resource
    assert providers.meter_provider._sdk_config.resource is resource
    providers.shutdown()


def log_exporter_types(logger_provider):
    processors = logger_provider._multi_log_record_processor._log_record_processors
    return [
        type(getattr(p, "_exporter", None) or p._batch_processor._exporter).__name__
        for p in processors
    ]


def test_logs_follow_otel_logs_exporter(monkeypatch):
    resource = Resource.create({})
    assert log_exporter_types(build_logger_provider(resource)) == ["OTLPLogExporter"]
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "console,otlp")
    assert log_exporter_types(build_logger_provider(resource)) == [
        "ConsoleLogRecordExporter",
        "OTLPLogExporter",
    ]
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    assert log_exporter_types(build_logger_provider(resource)) == []
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "kafka")
    with pytest.raises(TelemetryConfigError, match="OTEL_LOGS_EXPORTER='kafka'"):
        build_logger_provider(resource)


def test_logs_protocol_grpc(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "grpc")
    provider = build_logger_provider(Resource.create({}), "otlp")
    processor = provider._multi_log_record_processor._log_record_processors[0]
    assert "grpc" in type(processor._batch_processor._exporter).__module__
