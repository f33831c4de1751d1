"""The span tree TrainingTelemetry produces, read back with the SDK's InMemorySpanExporter."""

from __future__ import annotations

import logging
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_torch_train import NoCuda, TrainingTelemetry, infer_batch_size


class FakeBatch:
    """Quacks like a tensor batch: only ``shape`` matters to the telemetry."""

    def __init__(self, size):
        self.shape = (size, 3)


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


def make(exporter, **kwargs):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TrainingTelemetry(
        "tiny",
        tracer_provider=provider,
        meter_provider=MeterProvider(),
        cuda=NoCuda(),
        **kwargs,
    )


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def children(spans, parent):
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_full_tree_shape_and_attributes(exporter):
    tel = make(exporter)
    losses = iter([1.0, 0.5, 0.25, 0.8, 0.4, 0.2])
    with tel.run(lr=0.1):
        for _epoch in tel.epochs(range(2)):
            for _batch in tel.steps(
                [(FakeBatch(4), "y"), (FakeBatch(4), "y"), (FakeBatch(2), "y")]
            ):
                with tel.phase("forward"):
                    pass
                with tel.phase("backward"):
                    pass
                with tel.phase("optimizer"):
                    pass
                tel.record_step(loss=next(losses), lr=0.1)
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 + 2 + 6 * 5

    (run,) = by_name(spans, "training run")
    assert run.parent is None
    assert run.attributes["training.model.name"] == "tiny"
    assert run.attributes["training.lr"] == 0.1
    assert run.status.status_code == StatusCode.UNSET

    epochs = sorted(children(spans, run), key=lambda s: s.start_time)
    assert [e.name for e in epochs] == ["epoch", "epoch"]
    assert [e.attributes["training.epoch"] for e in epochs] == [0, 1]
    assert epochs[0].attributes["training.epoch.steps"] == 3
    assert epochs[0].attributes["training.epoch.samples"] == 10
    assert epochs[0].attributes["training.loss.mean"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert epochs[1].attributes["training.loss.mean"] == pytest.approx((0.8 + 0.4 + 0.2) / 3)
    assert epochs[0].attributes["training.samples_per_second"] > 0
    assert "pytorch.cuda.memory.peak_allocated" not in epochs[0].attributes  # no CUDA here

    for epoch_index, epoch in enumerate(epochs):
        steps = sorted(children(spans, epoch), key=lambda s: s.start_time)
        assert [s.name for s in steps] == ["step"] * 3
        for in_epoch, step in enumerate(steps):
            assert step.attributes["training.epoch"] == epoch_index
            assert step.attributes["training.epoch.step"] == in_epoch
            assert step.attributes["training.step"] == epoch_index * 3 + in_epoch
            assert step.attributes["training.batch.size"] == (2 if in_epoch == 2 else 4)
            assert step.attributes["training.lr"] == 0.1
            assert step.attributes["training.samples_per_second"] > 0
            phases = sorted(children(spans, step), key=lambda s: s.start_time)
            assert [p.name for p in phases] == ["data_wait", "forward", "backward", "optimizer"]
            assert phases[0].start_time == step.start_time
            assert all(
                step.start_time <= p.start_time <= p.end_time <= step.end_time for p in phases
            )
        # Steps tile the epoch: each ends where the next begins to wait for data.
        for earlier, later in zip(steps, steps[1:]):
            assert earlier.end_time <= later.start_time
        assert epoch.start_time <= steps[0].start_time and steps[-1].end_time <= epoch.end_time


def test_data_wait_measures_the_blocking_next(exporter):
    def slow_loader():
        for _ in range(2):
            time.sleep(0.03)
            yield FakeBatch(1)

    tel = make(exporter)
    with tel.run():
        for _ in tel.steps(slow_loader()):
            with tel.phase("forward"):
                pass
    waits = by_name(exporter.get_finished_spans(), "data_wait")
    assert len(waits) == 2
    for wait in waits:
        assert wait.end_time - wait.start_time >= 30_000_000


def test_exception_in_a_phase_marks_phase_step_epoch_and_run(exporter):
    tel = make(exporter)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with tel.run():
            for _ in tel.epochs(range(3)):
                for _ in tel.steps([FakeBatch(1)] * 4):
                    with tel.phase("forward"):
                        raise RuntimeError("CUDA out of memory")
    spans = exporter.get_finished_spans()
    assert len(by_name(spans, "step")) == 1
    assert len(by_name(spans, "epoch")) == 1
    for name in ("forward", "step", "epoch", "training run"):
        (span,) = by_name(spans, name)
        assert span.status.status_code == StatusCode.ERROR, name
        assert "CUDA out of memory" in span.status.description
        assert any(e.name == "exception" for e in span.events), name
    assert by_name(spans, "data_wait")[0].status.status_code == StatusCode.UNSET


def test_exception_outside_phases_is_marked_by_the_run(exporter):
    tel = make(exporter)
    with pytest.raises(ValueError):
        with tel.run():
            for _ in tel.epochs(range(2)):
                for step_index, _ in enumerate(tel.steps([FakeBatch(1)] * 5)):
                    if step_index == 2:
                        raise ValueError("bad batch")
    spans = exporter.get_finished_spans()
    steps = sorted(by_name(spans, "step"), key=lambda s: s.start_time)
    assert [s.status.status_code for s in steps] == [
        StatusCode.UNSET,
        StatusCode.UNSET,
        StatusCode.ERROR,
    ]
    (epoch,) = by_name(spans, "epoch")
    assert epoch.status.status_code == StatusCode.ERROR
    assert epoch.attributes["training.epoch.steps"] == 3
    (run,) = by_name(spans, "training run")
    assert run.status.status_code == StatusCode.ERROR
    # The failed step ended when the loop was left, before the run did.
    assert steps[-1].end_time <= run.end_time


def test_exception_from_the_loader_ends_data_wait_and_step_as_errors(exporter):
    def broken_loader():
        yield FakeBatch(1)
        raise OSError("truncated shard")

    tel = make(exporter)
    with pytest.raises(OSError):
        with tel.run():
            for _ in tel.epochs(range(1)):
                for _ in tel.steps(broken_loader()):
                    pass
    spans = exporter.get_finished_spans()
    steps = sorted(by_name(spans, "step"), key=lambda s: s.start_time)
    assert len(steps) == 2
    assert steps[0].status.status_code == StatusCode.UNSET
    assert steps[1].status.status_code == StatusCode.ERROR
    failed_wait = [
        w for w in by_name(spans, "data_wait") if w.parent.span_id == steps[1].context.span_id
    ]
    assert failed_wait[0].status.status_code == StatusCode.ERROR
    assert "truncated shard" in failed_wait[0].status.description
    assert by_name(spans, "epoch")[0].status.status_code == StatusCode.ERROR


def test_break_ends_the_step_normally_and_the_epoch_goes_on(exporter):
    tel = make(exporter)
    with tel.run():
        for _ in tel.epochs(range(2)):
            for index, _ in enumerate(tel.steps([FakeBatch(1)] * 10)):
                if index == 1:
                    break
            time.sleep(0.01)  # validation, say
    spans = exporter.get_finished_spans()
    steps = by_name(spans, "step")
    assert len(steps) == 4
    assert all(s.status.status_code == StatusCode.UNSET for s in spans)
    for epoch in by_name(spans, "epoch"):
        assert epoch.attributes["training.epoch.steps"] == 2
        last = max(children(spans, epoch), key=lambda s: s.end_time)
        # The broken step ended at the break, not when the epoch did 10 ms later.
        assert epoch.end_time - last.end_time >= 10_000_000


def test_caught_phase_error_does_not_fail_the_step(exporter):
    tel = make(exporter)
    with tel.run():
        for _ in tel.steps([FakeBatch(1)] * 2):
            try:
                with tel.phase("forward"):
                    raise FloatingPointError("nan loss, skipping batch")
            except FloatingPointError:
                pass
    spans = exporter.get_finished_spans()
    assert [s.status.status_code for s in by_name(spans, "forward")] == [StatusCode.ERROR] * 2
    assert [s.status.status_code for s in by_name(spans, "step")] == [StatusCode.UNSET] * 2
    assert by_name(spans, "training run")[0].status.status_code == StatusCode.UNSET


def test_spans_made_by_the_application_nest_under_the_step(exporter):
    tel = make(exporter)
    tracer = tel.tracer_provider.get_tracer("app")
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _ in tel.steps([FakeBatch(1)]):
                with tel.phase("forward"):
                    with tracer.start_as_current_span("attention"):
                        pass
                with tracer.start_as_current_span("log_to_disk"):
                    pass
            with tracer.start_as_current_span("validate"):
                pass
    spans = exporter.get_finished_spans()
    (step,) = by_name(spans, "step")
    (forward,) = by_name(spans, "forward")
    (epoch,) = by_name(spans, "epoch")
    assert by_name(spans, "attention")[0].parent.span_id == forward.context.span_id
    assert by_name(spans, "log_to_disk")[0].parent.span_id == step.context.span_id
    assert by_name(spans, "validate")[0].parent.span_id == epoch.context.span_id
    assert len({s.context.trace_id for s in spans}) == 1


def test_step_spans_every_traces_one_step_in_n_but_counts_all(exporter):
    tel = make(exporter, step_spans_every=3)
    with tel.run():
        for _ in tel.epochs(range(1)):
            for _ in tel.steps([FakeBatch(2)] * 7):
                with tel.phase("forward"):
                    pass
                tel.record_step(loss=1.0)
    spans = exporter.get_finished_spans()
    steps = by_name(spans, "step")
    assert sorted(s.attributes["training.step"] for s in steps) == [0, 3, 6]
    assert len(by_name(spans, "forward")) == 3
    (epoch,) = by_name(spans, "epoch")
    assert epoch.attributes["training.epoch.steps"] == 7
    assert epoch.attributes["training.epoch.samples"] == 14


def test_non_int_epoch_items_are_numbered(exporter):
    tel = make(exporter)
    with tel.run():
        for _ in tel.epochs(["warmup", "main"]):
            pass
    epochs = sorted(by_name(exporter.get_finished_spans(), "epoch"), key=lambda s: s.start_time)
    assert [e.attributes["training.epoch"] for e in epochs] == [0, 1]


def test_record_step_outside_a_step_warns_once(exporter, caplog):
    tel = make(exporter)
    with caplog.at_level(logging.WARNING, logger="otel_torch_train.telemetry"):
        tel.record_step(loss=1.0)
        tel.record_step(loss=2.0)
    warnings = [r for r in caplog.records if "outside a step" in r.getMessage()]
    assert len(warnings) == 1


def test_invalid_step_spans_every_is_rejected(exporter):
    with pytest.raises(ValueError, match="step_spans_every"):
        make(exporter, step_spans_every=0)


@pytest.mark.parametrize(
    "batch, expected",
    [
        (FakeBatch(7), 7),
        ((FakeBatch(5), FakeBatch(5)), 5),
        ([FakeBatch(3)], 3),
        ({"input_ids": FakeBatch(9), "labels": FakeBatch(9)}, 9),
        ([1, 2, 3], None),
        ((), None),
        ("text", None),
    ],
)
def test_infer_batch_size(batch, expected):
    assert infer_batch_size(batch) == expected


def test_phases_as_step_attributes(exporter):
    tel = make(exporter, phase_spans=False)
    with tel.run():
        for _ in tel.steps([FakeBatch(1)] * 2):
            with tel.phase("forward"):
                time.sleep(0.01)
            with tel.phase("backward"):
                pass
            with tel.phase("backward"):  # gradient accumulation: the durations add up
                time.sleep(0.01)
    spans = exporter.get_finished_spans()
    assert sorted({s.name for s in spans}) == ["data_wait", "step", "training run"]
    for step in by_name(spans, "step"):
        assert step.attributes["training.phase.forward.duration"] >= 0.01
        assert step.attributes["training.phase.backward.duration"] >= 0.01
        step_seconds = (step.end_time - step.start_time) / 1e9
        assert step.attributes["training.phase.forward.duration"] < step_seconds


def test_phase_timer_error_fails_the_step(exporter):
    tel = make(exporter, phase_spans=False)
    with pytest.raises(KeyError):
        with tel.run():
            for _ in tel.steps([FakeBatch(1)] * 2):
                with tel.phase("forward"):
                    raise KeyError("missing feature")
    (step,) = by_name(exporter.get_finished_spans(), "step")
    assert step.status.status_code == StatusCode.ERROR
    assert step.attributes["training.phase.forward.duration"] >= 0


class SlowDevice(NoCuda):
    """A device whose queued work takes 30 ms to finish."""

    def __init__(self):
        self.waits = 0

    def synchronize(self):
        self.waits += 1
        time.sleep(0.03)


def test_synchronize_phases_waits_for_the_device_inside_the_phase(exporter):
    device = SlowDevice()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = TrainingTelemetry(
        tracer_provider=provider,
        meter_provider=MeterProvider(),
        cuda=device,
        synchronize_phases=True,
    )
    with tel.run():
        for _ in tel.steps([FakeBatch(1)]):
            with tel.phase("forward"):
                pass
    assert device.waits == 1
    (forward,) = by_name(exporter.get_finished_spans(), "forward")
    assert forward.end_time - forward.start_time >= 30_000_000
