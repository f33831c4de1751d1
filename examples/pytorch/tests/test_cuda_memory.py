"""pytorch.cuda.memory.* gauges and epoch peaks, with a fake CUDA and with the real torch on CPU."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_torch_train import NoCuda, TorchCuda, TrainingTelemetry
from otel_torch_train.cuda_memory import default_backend, format_uuid

MiB = 1 << 20


class FakeCuda:
    """Two initialized devices whose allocator figures the test sets."""

    def __init__(self):
        self.allocated_bytes = {0: 100 * MiB, 1: 40 * MiB}
        self.reserved_bytes = {0: 256 * MiB, 1: 64 * MiB}
        self.peak_allocated = {0: 180 * MiB, 1: 50 * MiB}
        self.peak_reserved = {0: 300 * MiB, 1: 70 * MiB}
        self.resets = []
        self.uuids = {0: "GPU-11111111-2222-3333-4444-555555555555", 1: None}

    def devices(self):
        return [0, 1]

    def allocated(self, device):
        return self.allocated_bytes[device]

    def reserved(self, device):
        return self.reserved_bytes[device]

    def max_allocated(self, device):
        return self.peak_allocated[device]

    def max_reserved(self, device):
        return self.peak_reserved[device]

    def reset_peak(self, device):
        self.resets.append(device)
        self.peak_allocated[device] = self.allocated_bytes[device]
        self.peak_reserved[device] = self.reserved_bytes[device]

    def synchronize(self):
        return None

    def uuid(self, device):
        return self.uuids[device]


class BrokenCuda(FakeCuda):
    def devices(self):
        raise RuntimeError("CUDA error: unspecified launch failure")


def setup(cuda):
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = TrainingTelemetry(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        cuda=cuda,
    )
    return tel, reader, exporter


def points(reader):
    """{metric name: [(attributes, value)]} from one collection."""
    data = reader.get_metrics_data()
    found = {}
    if data is None:
        return found
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                assert metric.unit == "By", metric.name
                found[metric.name] = sorted(
                    ((dict(p.attributes), p.value) for p in metric.data.data_points),
                    key=lambda item: item[0]["pytorch.cuda.device"],
                )
    return found


def test_gauges_report_each_device_with_hw_id_when_known():
    tel, reader, _ = setup(FakeCuda())
    found = points(reader)
    gpu0 = {"pytorch.cuda.device": 0, "hw.id": "GPU-11111111-2222-3333-4444-555555555555"}
    gpu1 = {"pytorch.cuda.device": 1}
    assert found["pytorch.cuda.memory.allocated"] == [(gpu0, 100 * MiB), (gpu1, 40 * MiB)]
    assert found["pytorch.cuda.memory.reserved"] == [(gpu0, 256 * MiB), (gpu1, 64 * MiB)]
    assert found["pytorch.cuda.memory.max_allocated"] == [(gpu0, 180 * MiB), (gpu1, 50 * MiB)]
    # No gpu.index: torch's ordinal is not NVML's index under CUDA_VISIBLE_DEVICES.
    assert all("gpu.index" not in attrs for series in found.values() for attrs, _ in series)


def test_no_cuda_gives_no_points_and_no_error():
    _, reader, _ = setup(NoCuda())
    assert points(reader) == {}


def test_failing_cuda_reads_give_no_points_and_warn_once(caplog):
    tel, reader, _ = setup(BrokenCuda())
    assert points(reader) == {}
    assert points(reader) == {}
    warnings = [
        r for r in caplog.records if "torch.cuda memory statistics failed" in r.getMessage()
    ]
    assert len(warnings) == 1
    with tel.run():
        for _ in tel.epochs(range(1)):
            pass  # peaks unreadable: the epoch still ends


def test_epoch_resets_peaks_and_records_them():
    cuda = FakeCuda()
    tel, _, exporter = setup(cuda)
    with tel.run():
        for _ in tel.epochs(range(2)):
            cuda.peak_allocated[0] = 900 * MiB  # a spike during the epoch
            cuda.peak_allocated[1] = 60 * MiB
    assert cuda.resets == [0, 1, 0, 1]
    epochs = [s for s in exporter.get_finished_spans() if s.name == "epoch"]
    assert len(epochs) == 2
    for epoch in epochs:
        assert epoch.attributes["pytorch.cuda.memory.peak_allocated"] == 900 * MiB
        assert epoch.attributes["pytorch.cuda.memory.peak_reserved"] == 256 * MiB
        assert tuple(epoch.attributes["pytorch.cuda.memory.peak_allocated.per_device"]) == (
            900 * MiB,
            60 * MiB,
        )


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("58b3b7e0-1a2b-3c4d-5e6f-001122334455", "GPU-58b3b7e0-1a2b-3c4d-5e6f-001122334455"),
        ("GPU-58b3b7e0-1a2b-3c4d-5e6f-001122334455", "GPU-58b3b7e0-1a2b-3c4d-5e6f-001122334455"),
        ("MIG-58b3b7e0-1a2b-3c4d-5e6f-001122334455", "MIG-58b3b7e0-1a2b-3c4d-5e6f-001122334455"),
        ("", None),
        (None, None),
    ],
)
def test_format_uuid(raw, expected):
    assert format_uuid(raw) == expected


def test_without_torch_the_default_backend_has_no_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    backend = default_backend()
    assert isinstance(backend, NoCuda)
    assert backend.devices() == []


@pytest.mark.cpu_only
def test_real_torch_without_cuda_gives_no_points(torch):
    assert not torch.cuda.is_available()  # cpu_only tests are deselected where it is
    backend = default_backend()
    assert isinstance(backend, TorchCuda)
    assert backend.devices() == []
    tel, reader, exporter = setup(backend)
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _ in tel.steps([torch.zeros(4, 2)]):
                with tel.phase("forward"):
                    torch.ones(3).sum()
    assert points(reader) == {}
    (epoch,) = [s for s in exporter.get_finished_spans() if s.name == "epoch"]
    assert not any(key.startswith("pytorch.cuda") for key in epoch.attributes)
    assert torch.cuda.is_initialized() is False  # nothing here created a CUDA context


@pytest.mark.cuda
def test_real_torch_with_cuda_reports_the_device(cuda_torch):
    torch = cuda_torch
    kept = torch.ones(1024, 1024, device="cuda")  # 4 MiB live while the reader collects
    backend = TorchCuda(torch)
    tel, reader, _ = setup(backend)
    found = points(reader)
    (attrs, value), *_ = found["pytorch.cuda.memory.allocated"]
    assert attrs["hw.id"].startswith("GPU-")
    assert value >= 4 * MiB
    del kept
