"""Writes the generated part of the fuzz targets' seed corpora (fuzz/seeds/<target>/): OTLP
export requests for otlp_receiver and kubelet answers for pod_resources, built with the
opentelemetry-proto package of the test environment, and real /proc files of this machine for
proc_files. The other targets' seeds are the repository's own fixtures, copied by hand (see
docs/reliability.md, "Fuzzing"). Run from the repository root:

    ~/.cache/gpulse/venvs/test/bin/python fuzz/make_seeds.py
"""

import gzip
import os
import struct
from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

SEEDS = Path(__file__).resolve().parent / "seeds"
S = 1_000_000_000
# gpulse::fuzzing's history: PID 42 (vpid 7, this container, trainer-0) and PID 43, t = 100..110 s.
CONTAINER = "c0ffee" + "0" * 58


def kv(key, value):
    if isinstance(value, bool):
        any_value = AnyValue(bool_value=value)
    elif isinstance(value, int):
        any_value = AnyValue(int_value=value)
    elif isinstance(value, float):
        any_value = AnyValue(double_value=value)
    else:
        any_value = AnyValue(string_value=value)
    return KeyValue(key=key, value=any_value)


def span(name, start_s, end_s, attributes=()):
    return Span(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name=name,
        start_time_unix_nano=int(start_s * S),
        end_time_unix_nano=int(end_s * S),
        attributes=[kv(k, v) for k, v in attributes],
    )


def traces(resource, spans):
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[kv(k, v) for k, v in resource]),
                scope_spans=[ScopeSpans(spans=spans)],
            )
        ]
    )


def receiver_requests():
    """(name, signal selector, serialized request)."""
    yield "traces-pid", 0, traces(
        [("service.name", "train"), ("process.pid", 42)],
        [span("forward", 101, 104.5), span("backward", 104.5, 109)],
    )
    yield "traces-container-vpid", 0, traces(
        [("container.id", CONTAINER), ("process.pid", 7)], [span("step", 102, 103)]
    )
    yield "traces-instance", 0, traces(
        [("service.instance.id", "trainer-0"), ("process.pid", "43")],
        [span("epoch", 100, 110), span("data_wait", 100.5, 100.7)],
    )
    yield "traces-companion", 0, traces(
        [
            ("process.pid", 42),
            ("pytorch.distributed.rank", 0),
            ("pytorch.distributed.local_rank", 0),
            ("pytorch.distributed.world_size", 8),
            ("pytorch.distributed.backend", "nccl"),
            ("pytorch.distributed.job.id", "run-7"),
            ("service.namespace", "ml"),
        ],
        [
            span("step", 101, 102, [("pytorch.distributed.collective.wait", 0.12)]),
            span("data_wait", 102, 102.3, [("pytorch.dataloader.num_workers", 4),
                                            ("pytorch.dataloader.pin_memory", True)]),
        ],
    )
    yield "traces-unknown", 0, traces([("process.pid", 999)], [span("x", 1, 2)])
    metric = Metric(
        name="pytorch.cuda.memory.allocated",
        gauge=Gauge(data_points=[NumberDataPoint(time_unix_nano=105 * S, as_int=1 << 30,
                                                 attributes=[kv("gpu.id", 0)])]),
    )
    yield "metrics-allocator", 1, ExportMetricsServiceRequest(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource(attributes=[kv("process.pid", 42)]),
                scope_metrics=[ScopeMetrics(metrics=[metric])],
            )
        ]
    )
    yield "logs", 2, ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                resource=Resource(attributes=[kv("container.id", CONTAINER)]),
                scope_logs=[ScopeLogs(log_records=[LogRecord(time_unix_nano=103 * S,
                                                             body=AnyValue(string_value="hi"))])],
            )
        ]
    )


def grpc_frame(message, compressed):
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


def write(target, name, data):
    directory = SEEDS / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)


def receiver_seeds():
    for name, signal, request in receiver_requests():
        body = request.SerializeToString()
        write("otlp_receiver", f"{name}-http", bytes([signal]) + body)
        write("otlp_receiver", f"{name}-grpc", bytes([signal | 0b100]) + grpc_frame(body, False))
        if name in ("traces-pid", "metrics-allocator"):
            packed = gzip.compress(body)
            write("otlp_receiver", f"{name}-http-gzip", bytes([signal | 0b1000]) + packed)
            write("otlp_receiver", f"{name}-grpc-gzip",
                  bytes([signal | 0b1100]) + grpc_frame(packed, True))


def pod_resources_seeds():
    """ListPodResourcesResponse, hand-encoded (no generated Python module for the kubelet's
    proto): pod_resources = 1 {name = 1, namespace = 2, containers = 3 {name = 1,
    devices = 2 {resource_name = 1, device_ids = 2}}}."""

    def field(number, payload):
        tag = bytes([number << 3 | 2])
        return tag + varint(len(payload)) + payload

    def varint(n):
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def devices(resource, ids):
        return field(1, resource.encode()) + b"".join(field(2, i.encode()) for i in ids)

    def container(name, *device_sets):
        return field(1, name.encode()) + b"".join(field(2, d) for d in device_sets)

    def pod(name, namespace, *containers):
        return (field(1, name.encode()) + field(2, namespace.encode())
                + b"".join(field(3, c) for c in containers))

    gpu = "GPU-a1b2c3d4-0000-1111-2222-333344445555"
    mig = "MIG-0f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff"
    write("pod_resources", "one-gpu", field(1, pod("train-0", "ml", container(
        "trainer", devices("nvidia.com/gpu", [gpu]), devices("cpu", []))))
    )
    write("pod_resources", "time-sliced", field(1, pod("a", "ml", container(
        "c", devices("nvidia.com/gpu", [gpu + "::0"])))) + field(1, pod("b", "ml", container(
        "c", devices("nvidia.com/gpu", [gpu + "::1"])))))
    write("pod_resources", "mig", field(1, pod("infer", "serving", container(
        "server", devices("nvidia.com/mig-1g.10gb", [mig]), devices("nvidia.com/gpu", [gpu])))))


def proc_seeds():
    """Files shaped as the kernel writes them: this process's stat and status (numbers only),
    the rest written out here so that no path or address of this machine ends up in the seeds."""
    for name in ["stat", "status"]:
        write("proc_files", f"self-{name}", Path(f"/proc/self/{name}").read_bytes())
    write("proc_files", "cmdline", b"python\0-m\0torch.distributed.run\0--nproc-per-node=8\0train.py\0")
    write("proc_files", "environ", b"PATH=/usr/bin\0OTEL_SERVICE_NAME=train\0OTEL_RESOURCE_ATTRIBUTES="
          b"service.instance.id=t-0,pytorch.distributed.job.id=run%207\0RANK=3\0LOCAL_RANK=3\0"
          b"WORLD_SIZE=8\0TORCHELASTIC_RUN_ID=abc\0SLURM_JOB_ID=4242\0MASTER_ADDR=10.0.0.1\0"
          b"MASTER_PORT=29500\0")
    write("proc_files", "proc-stat-btime", b"cpu  1 2 3 4 5 6 7 0 0 0\nbtime 1765000000\nprocesses 7\n")
    # 127.0.0.1:40000 -> 127.0.0.1:4317, the connection gpulse::fuzzing asks for.
    write("proc_files", "net-tcp",
          b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
          b"   0: 0100007F:9C40 0100007F:10DD 01 00000000:00000000 00:00000000 00000000  1000        0 31337 1\n"
          b"   1: 00000000:10DD 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n")
    write("proc_files", "net-tcp6",
          b"  sl  local_address                         remote_address                        st\n"
          b"   0: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:10DD 01 "
          b"00000000:00000000 00:00000000 00000000  1000        0 777 1\n")
    write("proc_files", "passwd", b"root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n")
    write("proc_files", "cgroup-v1-docker", b"12:cpu,cpuacct:/docker/" + b"ab" * 32 + b"\n0::/\n")
    write("proc_files", "cgroup-kubepods", b"0::/kubepods.slice/kubepods-burstable.slice/"
          b"kubepods-burstable-pod12345678_1234_1234_1234_123456789abc.slice/cri-containerd-"
          + b"cd" * 32 + b".scope\n")
    write("proc_files", "cgroup-podman", b"0::/machine.slice/libpod-" + b"ef" * 32 + b".scope/container\n")
    write("proc_files", "cpu-max", b"250000 100000\n")
    write("proc_files", "fd-link", b"/dev/nvidia3")
    write("proc_files", "exe-link", b"/usr/bin/python3.12 (deleted)")


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    receiver_seeds()
    pod_resources_seeds()
    proc_seeds()
