"""torch.cuda.memory_summary() as one log record when the per-epoch peak keeps rising, driven
through a test double of the CudaMemory protocol and read back from the SDK's in-memory logs."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_torch_train import TrainingTelemetry

MiB = 1 << 20
UUID = "GPU-11111111-2222-3333-4444-555555555555"


class PeakCuda:
    """One device whose per-epoch peak the test sets; the summary names the call that made it."""

    def __init__(self, summary_text=None):
        self.peak = 0
        self.reserved_bytes = 512 * MiB
        self.summary_text = summary_text
        self.summaries = 0

    def devices(self):
        return [0]

    def allocated(self, device):
        return 64 * MiB

    def reserved(self, device):
        return self.reserved_bytes

    def max_allocated(self, device):
        return self.peak

    def max_reserved(self, device):
        return self.reserved_bytes

    def reset_peak(self, device):
        self.peak = 64 * MiB

    def synchronize(self):
        return None

    def uuid(self, device):
        return UUID

    def name(self, device):
        return "NVIDIA H100 80GB HBM3"

    def summary(self, device):
        self.summaries += 1
        if self.summary_text is not None:
            return self.summary_text
        return f"|  PyTorch CUDA memory summary, device ID {device}  | (call {self.summaries})"


def make(cuda, **kwargs):
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tel = TrainingTelemetry(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(),
        logger_provider=logger_provider,
        cuda=cuda,
        **kwargs,
    )
    return tel, spans, logs


def train(tel, cuda, peaks_mib):
    with tel.run():
        for epoch in tel.epochs(range(len(peaks_mib))):
            cuda.peak = peaks_mib[epoch] * MiB  # what the epoch's steps reached


def records(logs):
    return [item.log_record for item in logs.get_finished_logs()]


def test_rising_peak_sends_one_summary_per_streak(caplog):
    cuda = PeakCuda()
    tel, spans, logs = make(cuda, memory_summary_after=3)
    caplog.set_level(logging.WARNING, logger="otel_torch_train.memory_summary")
    # Rises at epochs 1, 2, 3 (streak of 3: sent), 4, 5, 6 (sent again), then flat.
    train(tel, cuda, [100, 110, 120, 130, 140, 150, 160, 160, 160])
    sent = records(logs)
    assert [r.attributes["training.epoch"] for r in sent] == [3, 6]
    first = sent[0]
    assert first.event_name == "pytorch.cuda.memory_summary"
    assert first.severity_text == "WARN"
    assert first.body == "|  PyTorch CUDA memory summary, device ID 0  | (call 1)"
    assert dict(first.attributes) == {
        "pytorch.cuda.device": 0,
        "hw.id": UUID,
        "training.epoch": 3,
        "pytorch.cuda.memory.summary.rising_epochs": 3,
        "pytorch.cuda.memory.peak_allocated": 130 * MiB,
        "pytorch.cuda.memory.peak_allocated.before": 100 * MiB,
        "pytorch.cuda.memory.summary.truncated": False,
    }
    assert sent[1].attributes["pytorch.cuda.memory.peak_allocated.before"] == 130 * MiB
    # In the trace of the epoch that completed the streak.
    epoch3 = next(
        s for s in spans.get_finished_spans() if s.attributes.get("training.epoch") == 3
    )
    assert first.trace_id == epoch3.context.trace_id
    assert first.span_id == epoch3.context.span_id
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "CUDA device 0: the per-epoch peak of allocated memory rose 3 epochs in a row" in (
        warnings[0]
    )


def test_a_peak_that_falls_back_restarts_the_count():
    cuda = PeakCuda()
    tel, _, logs = make(cuda, memory_summary_after=3)
    train(tel, cuda, [100, 110, 120, 90, 100, 110])  # two rises, a fall, two rises
    assert records(logs) == []
    assert cuda.summaries == 0


def test_caching_alone_sends_nothing():
    """Reserved memory growing while the tensors' peak stays flat is the allocator caching."""
    cuda = PeakCuda()
    tel, _, logs = make(cuda, memory_summary_after=2)
    with tel.run():
        for epoch in tel.epochs(range(6)):
            cuda.peak = 200 * MiB
            cuda.reserved_bytes = (1024 + 512 * epoch) * MiB
    assert records(logs) == []


def test_off_by_default():
    cuda = PeakCuda()
    tel, _, logs = make(cuda)
    train(tel, cuda, [100, 200, 300, 400, 500])
    assert records(logs) == []
    assert cuda.summaries == 0


def test_a_long_summary_is_cut_and_says_so():
    cuda = PeakCuda(summary_text="x" * 50_000)
    tel, _, logs = make(cuda, memory_summary_after=1, memory_summary_max_chars=1000)
    train(tel, cuda, [100, 110])
    (record,) = records(logs)
    assert len(record.body) == 1000
    assert record.body.endswith("[cut by otel-torch-train: 50000 characters, the first shown]")
    assert record.attributes["pytorch.cuda.memory.summary.truncated"] is True


def test_a_failing_summary_is_reported_in_the_record():
    class Failing(PeakCuda):
        def summary(self, device):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda = Failing()
    tel, _, logs = make(cuda, memory_summary_after=1)
    train(tel, cuda, [100, 110])
    (record,) = records(logs)
    assert record.body == (
        "torch.cuda.memory_summary(0) failed: RuntimeError: "
        "CUDA error: an illegal memory access was encountered"
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"memory_summary_after": 0}, ValueError, "memory_summary_after must be 1 or more"),
        ({"memory_summary_after": 2.5}, TypeError, "whole number of epochs, got 2.5"),
        (
            {"memory_summary_after": 2, "memory_summary_max_chars": 10},
            ValueError,
            "memory_summary_max_chars must be at least 256, got 10",
        ),
    ],
)
def test_bad_settings_say_what_is_wrong(kwargs, error, message):
    with pytest.raises(error, match=message):
        make(PeakCuda(), **kwargs)


def test_the_record_travels_over_otlp_http(tmp_path, monkeypatch):
    """Through the real OTLP/HTTP log exporter to a real receiver (otlp_sink.py's handler)."""
    import threading
    from http.server import ThreadingHTTPServer

    from opentelemetry.sdk.resources import Resource

    import otlp_sink
    from otel_torch_train.providers import build_logger_provider

    out = tmp_path / "otlp.jsonl"
    sink = otlp_sink.Sink(out)
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), otlp_sink.make_handler(sink, otlp_sink._request_types())
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        logger_provider = build_logger_provider(
            Resource.create({"service.name": "leaky-job"}), "otlp"
        )
        cuda = PeakCuda()
        tel = TrainingTelemetry(
            tracer_provider=TracerProvider(),
            meter_provider=MeterProvider(),
            logger_provider=logger_provider,
            cuda=cuda,
            memory_summary_after=2,
        )
        train(tel, cuda, [100, 200, 300])
        logger_provider.shutdown()  # exports what the batch processor holds
    finally:
        server.shutdown()
        server.server_close()
        sink.close()
    (request,) = [json.loads(line) for line in out.read_text().splitlines()]
    (resource_logs,) = request["resourceLogs"]
    resource = {a["key"]: a["value"] for a in resource_logs["resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "leaky-job"}
    (record,) = resource_logs["scopeLogs"][0]["logRecords"]
    assert record["eventName"] == "pytorch.cuda.memory_summary"
    assert record["body"]["stringValue"].startswith("|  PyTorch CUDA memory summary, device ID 0")
    attributes = {a["key"]: a["value"] for a in record["attributes"]}
    assert attributes["hw.id"] == {"stringValue": UUID}
    assert attributes["pytorch.cuda.memory.peak_allocated"] == {"intValue": str(300 * MiB)}
    assert attributes["pytorch.cuda.memory.peak_allocated.before"] == {"intValue": str(100 * MiB)}
