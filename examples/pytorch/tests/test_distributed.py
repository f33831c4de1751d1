"""torch.distributed: the job's identity, and the collective wait of each step (gloo, for real)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conftest import EXAMPLE_DIR, require_torch
from otel_torch_train import NoCuda, TrainingTelemetry, distributed
from otel_torch_train.distributed import _union_seconds


def test_job_id_prefers_the_run_id_then_slurm_then_the_rendezvous_address():
    master = {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}
    assert distributed.job_id({**master, "TORCHELASTIC_RUN_ID": "run-42"}) == "run-42"
    # torchrun's placeholder is shared by every job started without --rdzv-id: not an identity.
    assert distributed.job_id({**master, "TORCHELASTIC_RUN_ID": "none"}) == "10.0.0.7:29500"
    assert distributed.job_id({**master, "SLURM_JOB_ID": "9917"}) == "slurm-9917"
    assert distributed.job_id(master) == "10.0.0.7:29500"
    assert distributed.job_id({"MASTER_ADDR": "10.0.0.7"}) is None
    assert distributed.job_id({}) is None


def test_attributes_from_the_launcher_before_init():
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "job-a",
    }
    assert distributed.attributes(env, dist=None) == {
        distributed.RANK: 3,
        distributed.LOCAL_RANK: 1,
        distributed.WORLD_SIZE: 8,
        distributed.JOB_ID: "job-a",
    }
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "77"}
    assert distributed.attributes(slurm, dist=None)[distributed.RANK] == 5
    assert distributed.attributes(slurm, dist=None)[distributed.JOB_ID] == "slurm-77"
    # Not in a job: nothing, not a rank 0 of 1.
    assert distributed.attributes({}, dist=None) == {}
    assert distributed.attributes({"RANK": "x", "WORLD_SIZE": "2"}, dist=None) == {}


class FakeDist:
    """An initialised torch.distributed as far as attributes() asks."""

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_rank(self):
        return 2

    def get_world_size(self):
        return 4

    def get_backend(self):
        return "nccl"


def test_an_initialised_group_wins_over_the_environment():
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "2", "SLURM_JOB_ID": "5"}
    assert distributed.attributes(env, dist=FakeDist()) == {
        distributed.RANK: 2,
        distributed.WORLD_SIZE: 4,
        distributed.BACKEND: "nccl",
        distributed.LOCAL_RANK: 2,
        distributed.JOB_ID: "slurm-5",
    }


def test_overlapping_collectives_count_once():
    assert _union_seconds([]) == 0.0
    assert _union_seconds([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0)]) == pytest.approx(2.5)
    assert _union_seconds([(2.0, 3.0), (0.0, 1.0), (0.9, 0.95)]) == pytest.approx(2.0)
    assert _union_seconds([(1.0, 1.0), (2.0, 1.0)]) == 0.0


@pytest.fixture
def gloo_world_of_one(tmp_path):
    torch = require_torch()
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield torch, dist
    dist.destroy_process_group()


def test_ddp_buckets_and_explicit_calls_are_timed_on_the_step(gloo_world_of_one):
    torch, dist = gloo_world_of_one
    from torch.nn.parallel import DistributedDataParallel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    tel = TrainingTelemetry(
        "ddp",
        tracer_provider=provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        cuda=NoCuda(),
    )
    model = tel.watch_ddp(DistributedDataParallel(torch.nn.Linear(8, 2)))
    batches = [torch.randn(4, 8) for _ in range(3)]
    with tel.run():
        for _ in tel.epochs(range(1)):
            for x in tel.steps(batches):
                model(x).sum().backward()
                total = torch.ones(1)
                dist.all_reduce(total)  # explicit, synchronous
                dist.barrier()
                tel.record_step(loss=float(total))
    # Outside a step: not counted anywhere.
    dist.all_reduce(torch.ones(1))
    tel.shutdown()

    steps = [s for s in exporter.get_finished_spans() if s.name == "step"]
    assert len(steps) == 3
    for step in steps:
        # One DDP bucket, the explicit all_reduce and the barrier.
        assert step.attributes[distributed.COLLECTIVE_COUNT] == 3
        wait = step.attributes[distributed.COLLECTIVE_WAIT]
        assert 0.0 < wait < (step.end_time - step.start_time) / 1e9
    run = next(s for s in exporter.get_finished_spans() if s.name == "training run")
    assert run.attributes[distributed.BACKEND] == "gloo"
    assert run.attributes[distributed.WORLD_SIZE] == 1

    points = [
        point
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == distributed.COLLECTIVE_WAIT
        for point in metric.data.data_points
    ]
    assert [p.count for p in points] == [3], "one histogram point per step"
    assert metric_unit(reader) == "s"


def metric_unit(reader):
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == distributed.COLLECTIVE_WAIT:
                    return metric.unit
    return None


def test_no_collective_attributes_outside_a_job():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = TrainingTelemetry(
        "plain", tracer_provider=provider, meter_provider=MeterProvider(), cuda=NoCuda()
    )
    for _ in tel.steps([1, 2]):
        pass
    tel.shutdown()
    for span in exporter.get_finished_spans():
        assert distributed.COLLECTIVE_WAIT not in span.attributes


class HeldFuture:
    """A future whose callback is run, then kept, as a gloo worker does between the two."""

    def __init__(self):
        self.callback = None

    def then(self, callback):
        self.callback = callback
        return "chained"

    def complete(self):
        return self.callback(self)


def test_fence_waits_until_the_worker_lets_go_of_a_callback_that_ran():
    fence = distributed.CallbackFence()
    future = HeldFuture()
    assert fence.then(future, lambda fut: "value") == "chained"
    assert fence.settle(timeout=0.01), "a callback that never ran is not waited for"
    assert future.complete() == "value"
    assert not fence.settle(timeout=0.05), "ran, still held by the worker: settle must wait"
    future.callback = None  # the worker destroys the callback
    assert fence.settle(timeout=0.01)


def test_fence_keeps_futures_until_a_step_after_their_release():
    fence = distributed.CallbackFence()
    future = HeldFuture()
    fence.then(future, lambda fut: None)
    future.complete()
    future.callback = None
    fence.prune()  # released in this step: still held, so the worker never drops the last ref
    assert [entry[0] for entry in fence._released] == [future]
    fence.prune()
    assert fence._released == [] and fence._held == []


EXIT_SCRIPT = """
import atexit, threading, time
from otel_torch_train.distributed import CallbackFence

state = {}
# Registered first, so it runs last: after the fence's own exit hook.
atexit.register(lambda: print("worker let go before exit:", state.get("dropped", False)))
fence = CallbackFence()
fence.settle_at_exit()

class Held:
    def then(self, callback):
        self.callback = callback

held = Held()
fence.then(held, lambda fut: None)
held.callback(held)

def worker():
    time.sleep(0.3)
    state["dropped"] = True
    held.callback = None

threading.Thread(target=worker, daemon=True).start()
"""


def test_fence_waits_at_interpreter_exit_for_a_callback_still_held():
    result = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(EXAMPLE_DIR / "src")},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "worker let go before exit: True", result.stdout


def test_fence_settles_after_a_torch_future_completed_on_another_thread():
    import threading

    torch = require_torch()

    fence = distributed.CallbackFence()
    source = torch.futures.Future()
    chained = fence.then(source, lambda fut: fut.value() + 1)
    worker = threading.Thread(target=source.set_result, args=(41,))
    worker.start()
    worker.join()
    assert chained.wait() == 42
    assert fence.settle(timeout=5)


def console_spans(stdout):
    decoder = json.JSONDecoder()
    spans, index = [], 0
    while True:
        start = stdout.find("{", index)
        if start < 0:
            return spans
        span, index = decoder.raw_decode(stdout, start)
        spans.append(span)


def test_torchrun_the_fast_rank_waits_for_the_slow_one(tmp_path):
    """Two gloo ranks under a real torchrun; rank 1's loader sleeps 150 ms a batch."""
    require_torch()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        CUDA_VISIBLE_DEVICES="",
    )
    result = subprocess.run(
        [
            torchrun,
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "--rdzv-id=straggler-test",
            str(EXAMPLE_DIR / "train.py"),
            "--model=mlp",
            "--epochs=1",
            "--steps-per-epoch=6",
            "--data-delay=0.15",
            "--slow-rank=1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    waits, data_waits = {0: [], 1: []}, {0: [], 1: []}
    spans = console_spans(result.stdout)
    by_id = {}
    for span in spans:
        resource = span["resource"]["attributes"]
        assert resource[distributed.JOB_ID] == "straggler-test"
        assert resource[distributed.WORLD_SIZE] == 2
        rank = resource[distributed.RANK]
        by_id[span["context"]["span_id"]] = span
        if span["name"] == "step":
            waits[rank].append(span["attributes"][distributed.COLLECTIVE_WAIT])
    for span in spans:
        if span["name"] == "data_wait":
            rank = span["resource"]["attributes"][distributed.RANK]
            data_waits[rank].append(duration(span))
    assert len(waits[0]) == len(waits[1]) == 6
    # The first step is a rendezvous for both; from then on rank 0 waits ~150 ms for rank 1.
    fast, slow = statistics.median(waits[0][1:]), statistics.median(waits[1][1:])
    assert fast > 0.1, waits
    assert slow < fast / 3, waits
    assert statistics.median(data_waits[1]) > 0.1 > statistics.median(data_waits[0])


def duration(span):
    from datetime import datetime

    def parse(text):
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return (parse(span["end_time"]) - parse(span["start_time"])).total_seconds()


@pytest.mark.cuda
def test_nccl_collectives_are_timed_with_cuda_events(cuda_torch, tmp_path):
    """The GPU path (scripts/device-check runs it): NCCL does not block the host, so the wait
    comes from CUDA events around each collective, read when the step ends."""
    torch = cuda_torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tel = TrainingTelemetry("ddp-cuda", tracer_provider=provider, meter_provider=MeterProvider())
        assert tel._collectives is not None and tel._collectives.on_cuda(torch.ones(1).cuda())
        model = tel.watch_ddp(
            DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[0])
        )
        batches = [torch.randn(256, 1024, device="cuda") for _ in range(4)]
        with tel.run():
            for _ in tel.epochs(range(1)):
                for x in tel.steps(batches):
                    model(x).sum().backward()
                    total = torch.ones(1 << 20, device="cuda")
                    dist.all_reduce(total)
                    tel.record_step(loss=float(total[0]))
        tel.shutdown()
        steps = [s for s in exporter.get_finished_spans() if s.name == "step"]
        assert len(steps) == 4
        run = next(s for s in exporter.get_finished_spans() if s.name == "training run")
        assert run.attributes[distributed.BACKEND] == "nccl"
        for step in steps:
            assert step.attributes[distributed.COLLECTIVE_COUNT] == 2
            wait = step.attributes[distributed.COLLECTIVE_WAIT]
            assert 0.0 < wait < (step.end_time - step.start_time) / 1e9
    finally:
        dist.destroy_process_group()
