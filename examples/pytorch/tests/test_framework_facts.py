"""pytorch.dataloader.*, pytorch.autocast.* and pytorch.compile.used on the run and epoch spans,
read from real torch objects on the CPU (a DataLoader, torch.autocast, torch.compile)."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_torch_train import NoCuda, TrainingTelemetry
from otel_torch_train.framework_facts import (
    AUTOCAST_DTYPE,
    AUTOCAST_ENABLED,
    COMPILE_USED,
    LOADER_BATCH_SIZE,
    LOADER_NUM_WORKERS,
    LOADER_PERSISTENT_WORKERS,
    LOADER_PIN_MEMORY,
    LOADER_PREFETCH_FACTOR,
    autocast_state,
    compile_used,
    loader_attributes,
)


def make(**kwargs):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = TrainingTelemetry(
        "tiny", tracer_provider=provider, meter_provider=MeterProvider(), cuda=NoCuda(), **kwargs
    )
    return tel, exporter


def spans(exporter, name):
    return sorted(
        (s for s in exporter.get_finished_spans() if s.name == name), key=lambda s: s.start_time
    )


def pytorch_keys(span):
    return {k: v for k, v in span.attributes.items() if k.startswith("pytorch.")}


@pytest.fixture
def dynamo_counters(torch):
    """TorchDynamo's process-wide counters, emptied for the test and restored after it."""
    from torch._dynamo.utils import counters

    saved = {key: dict(value) for key, value in counters.items()}
    counters.clear()
    yield counters
    counters.clear()
    for key, value in saved.items():
        counters[key].update(value)


def test_dataloader_settings_with_workers(torch):
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(
        TensorDataset(torch.zeros(32, 2)),
        batch_size=8,
        num_workers=2,
        pin_memory=True,
        prefetch_factor=3,
        persistent_workers=True,
    )
    # Read from the loader's settings: no worker is started to get them.
    assert loader_attributes(loader) == {
        LOADER_NUM_WORKERS: 2,
        LOADER_PIN_MEMORY: True,
        LOADER_PREFETCH_FACTOR: 3,
        LOADER_PERSISTENT_WORKERS: True,
        LOADER_BATCH_SIZE: 8,
    }


def test_dataloader_without_workers_has_no_prefetch_factor(torch):
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)
    assert loader_attributes(loader) == {
        LOADER_NUM_WORKERS: 0,
        LOADER_PIN_MEMORY: False,
        LOADER_PERSISTENT_WORKERS: False,
        LOADER_BATCH_SIZE: 4,
    }


def test_batch_size_from_a_batch_sampler(torch):
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

    data = TensorDataset(torch.zeros(10, 2))
    loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 5, False))
    assert loader.batch_size is None
    assert loader_attributes(loader)[LOADER_BATCH_SIZE] == 5


def test_not_a_dataloader_gives_nothing():
    assert loader_attributes([1, 2, 3]) == {}
    assert loader_attributes(iter(range(3))) == {}


def test_run_and_epoch_spans_carry_the_facts(torch, dynamo_counters):
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    model = torch.nn.Linear(4, 2)
    tel, exporter = make()
    with tel.run():
        for epoch in tel.epochs(range(2)):
            for (x,) in tel.steps(loader):
                if epoch == 1:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        with tel.phase("forward"):
                            model(x).sum()
                else:
                    with tel.phase("forward"):
                        model(x).sum()
    loader_facts = {
        LOADER_NUM_WORKERS: 0,
        LOADER_PIN_MEMORY: False,
        LOADER_PERSISTENT_WORKERS: False,
        LOADER_BATCH_SIZE: 4,
    }
    first, second = spans(exporter, "epoch")
    assert pytorch_keys(first) == {
        **loader_facts,
        AUTOCAST_ENABLED: False,
        COMPILE_USED: False,
    }
    assert pytorch_keys(second) == {
        **loader_facts,
        AUTOCAST_ENABLED: True,
        AUTOCAST_DTYPE: "bfloat16",
        COMPILE_USED: False,
    }
    (run,) = spans(exporter, "training run")
    assert pytorch_keys(run) == {
        **loader_facts,
        AUTOCAST_ENABLED: True,
        AUTOCAST_DTYPE: "bfloat16",
        COMPILE_USED: False,
    }


@pytest.mark.parametrize("where", ["record_step", "phase_timer"])
def test_autocast_seen_in_record_step_and_phase_timers(torch, where):
    # phase_spans=False: phases are timers recorded as attributes, which sample autocast too.
    tel, exporter = make(phase_spans=False)
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _batch in tel.steps([torch.zeros(2, 2)]):
                with torch.autocast("cpu", dtype=torch.float16):
                    if where == "record_step":
                        tel.record_step(loss=1.0)
                    else:
                        with tel.phase("forward"):
                            pass
    (epoch,) = spans(exporter, "epoch")
    assert epoch.attributes[AUTOCAST_ENABLED] is True
    assert epoch.attributes[AUTOCAST_DTYPE] == "float16"


def test_autocast_never_sampled_is_not_claimed(torch):
    """No phase and no record_step: nothing saw the loop's code, so no claim either way."""
    tel, exporter = make()
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _batch in tel.steps([torch.zeros(2, 2)]):
                pass
    (epoch,) = spans(exporter, "epoch")
    assert AUTOCAST_ENABLED not in epoch.attributes
    assert AUTOCAST_DTYPE not in epoch.attributes


def test_compile_used_after_torch_compile(torch, dynamo_counters):
    assert compile_used() is False
    model = torch.compile(torch.nn.Linear(3, 1), backend="eager")
    tel, exporter = make()
    with tel.run():
        for _ in tel.epochs(range(1)):
            for x in tel.steps([torch.ones(2, 3)]):
                with tel.phase("forward"):
                    model(x)
    assert compile_used() is True
    (epoch,) = spans(exporter, "epoch")
    assert epoch.attributes[COMPILE_USED] is True
    (run,) = spans(exporter, "training run")
    assert run.attributes[COMPILE_USED] is True


def test_without_dynamo_loaded_compile_is_false(torch, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert compile_used() is False


def test_without_torch_there_are_no_precision_facts(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert autocast_state() is None
    assert compile_used() is None
    tel, exporter = make()
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _batch in tel.steps([1, 2]):
                with tel.phase("forward"):
                    pass
    (epoch,) = spans(exporter, "epoch")
    assert pytorch_keys(epoch) == {}
