"""train.py -> real OTLP/HTTP exporter -> otlp_sink.py -> correlate.py, joined with gpulse-shaped
metrics written for the job's PID and container: the whole path minus gpulse itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import correlate
from conftest import EXAMPLE_DIR, require_torch

CONTAINER = "feedface" * 8
GPU = "GPU-12345678-abcd-ef01-2345-6789abcdef01"


@pytest.fixture
def sink(tmp_path):
    out = tmp_path / "collector.jsonl"
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE_DIR / "otlp_sink.py"), "--out", str(out),
         "--port-file", str(port_file), "--max-seconds", "180"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "otlp_sink.py did not start"
        time.sleep(0.05)
    yield int(port_file.read_text()), out, process
    if process.poll() is None:
        process.kill()
        process.wait()


def stop(process):
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr[-2000:]
    return stdout


def gpulse_line(pid, start_ns, end_ns, utilization, memory_bytes, first_seen_ns):
    """One request as `gpulse run --exporter stdout` prints it, for the job's process."""

    def attr(key, value):
        kind = "intValue" if isinstance(value, int) else "stringValue"
        return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}

    window = {"startTimeUnixNano": str(start_ns), "timeUnixNano": str(end_ns)}
    gpu = [attr("hw.id", GPU), attr("gpu.index", 0)]
    resource = [
        attr("container.id", CONTAINER),
        attr("process.pid", pid + 100_000),  # the host PID differs from the container's
        attr("process.vpid", pid),
        attr("host.name", "node-1"),
    ]
    metrics = [
        {"name": "process.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
            {**window, "asDouble": utilization,
             "attributes": gpu + [attr("hw.gpu.task", "general")]}]}},
        {"name": "process.gpu.memory.usage", "unit": "By", "sum": {"dataPoints": [
            {"startTimeUnixNano": str(first_seen_ns), "timeUnixNano": str(end_ns),
             "asInt": str(memory_bytes), "attributes": gpu}]}},
    ]  # fmt: skip
    return json.dumps(
        {
            "resourceMetrics": [
                {"resource": {"attributes": resource}, "scopeMetrics": [{"metrics": metrics}]}
            ]
        }  # fmt: skip
    )


def test_spans_exported_over_otlp_join_gpu_metrics(tmp_path, sink):
    require_torch()
    port, out, sink_process = sink
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_SERVICE_NAME="roundtrip",
        OTEL_RESOURCE_ATTRIBUTES=f"container.id={CONTAINER}",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        CUDA_VISIBLE_DEVICES="",
    )
    train = subprocess.run(
        [sys.executable, str(EXAMPLE_DIR / "train.py"), "--epochs", "2", "--steps-per-epoch", "3",
         "--batch-size", "4", "--sleep-per-step", "0.05", "--model", "mlp"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    pid = int(train.stdout.splitlines()[0].split()[1])
    stop(sink_process)

    telemetry = correlate.load([str(out)])
    names = sorted(s.name for s in telemetry.spans)
    assert names.count("epoch") == 2 and names.count("step") == 6
    assert names.count("training run") == 1 and names.count("data_wait") == 6
    resource = telemetry.spans[0].resource
    assert resource["container.id"] == CONTAINER
    assert resource["process.vpid"] == pid and resource["process.pid"] == pid
    assert resource["service.name"] == "roundtrip"
    assert len({s.trace_id for s in telemetry.spans}) == 1
    assert all(len(s.trace_id) == 32 and len(s.span_id) == 16 for s in telemetry.spans)

    # gpulse's view: one window exactly over each epoch, and a decoy for another container.
    epochs = sorted((s for s in telemetry.spans if s.name == "epoch"), key=lambda s: s.start_ns)
    # Memory is a cumulative Sum: its start is when gpulse first saw the process, not a window.
    first_seen = epochs[0].start_ns - 5 * 10**9
    metrics = tmp_path / "gpulse.jsonl"
    lines = [
        gpulse_line(pid, epochs[0].start_ns, epochs[0].end_ns, 0.3, 700 << 20, first_seen),
        gpulse_line(pid, epochs[1].start_ns, epochs[1].end_ns, 0.7, 900 << 20, first_seen),
        gpulse_line(pid, epochs[0].start_ns, epochs[1].end_ns, 1.0, 1 << 30, first_seen).replace(
            CONTAINER, "0" * 64
        ),
    ]
    metrics.write_text("\n".join(lines) + "\n")

    rows = correlate.correlate(correlate.load([str(metrics), str(out)]), ["epoch"])
    assert [
        (r.gpu, pytest.approx(r.util_mean), r.gpu_mem_peak_bytes, r.coverage) for r in rows
    ] == [
        (GPU, 0.3, 700 << 20, 1.0),
        (GPU, 0.7, 900 << 20, 1.0),
    ]
    steps = correlate.correlate(correlate.load([str(metrics), str(out)]), ["step"])
    assert len(steps) == 6
    for step in steps:
        epoch = step.span.attributes["training.epoch"]
        assert step.util_mean == pytest.approx(0.3 if epoch == 0 else 0.7)
        assert step.coverage == pytest.approx(1.0)
