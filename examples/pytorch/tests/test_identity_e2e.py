"""GPU metrics under the service and rank the application itself names, end to end.

Three kinds of application hold a GPU each on nvml-sim while ``gpulse run`` samples them and
receives their telemetry on its OTLP/HTTP receiver:

- a 4-rank ``torchrun`` job (gloo on the CPU, train.py under DDP with the companion) whose code
  names its service (``TrainingTelemetry(service_name="ddp-bar")``), with no ``OTEL_SERVICE_NAME``
  in its environment;
- an application on the plain OpenTelemetry Python SDK (no companion) whose environment says
  ``OTEL_SERVICE_NAME=from-env`` while the resource its code builds says ``from-spans``, and which
  also claims a PID, a host and a pod that are not its own;
- the same application with a resource built in code and nothing in its environment.

Before any of them sends a span, gpulse names each from its environment (the ranks by ``RANK``
and ``WORLD_SIZE``). Within two export windows of a process's first span, gpulse's resource for it
(the one with ``process.gpu.*``) carries the name and rank it sent, keeps them from then on, and
keeps gpulse's own PID and host; ``/status`` and ``/metrics`` say the same.

No root needed. Needs torch and the binaries ``cargo build --workspace`` makes; without them it is
skipped with the reason, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

from conftest import EXAMPLE_DIR, require_torch
from e2e import (
    TRAIN,
    built_binaries,
    fail_or_skip,
    flatten,
    free_port,
    requests,
    start_sink,
    stop,
    wait_until,
)

WHAT = "the identity end-to-end test"
APP = Path(__file__).resolve().parent / "apps" / "plain_sdk_app.py"
RANKS = 4
SERVICE = "ddp-bar"
EXPORT_SECONDS = 1.0
# The SDKs' batch processors send every 200 ms (OTEL_BSP_SCHEDULE_DELAY below).
SEND_DELAY_SECONDS = 0.2


def scenario(pid_envs: List[str]) -> str:
    devices = "".join(
        f"""
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-1d3e0000-0000-4000-8000-{index:012d}"
[device.signals]
gpu_util = 60
power_w = 300
[[device.process]]
pid_env = "{pid_env}"
name = "python"
memory_used_mib = 4096
sm_util = 50
"""
        for index, pid_env in enumerate(pid_envs)
    )
    return '[driver]\nversion = "550.54.15"\ncuda_version = "12.4"\n' + devices


def process_resources(request: dict) -> Dict[int, dict]:
    """The process resources of one of gpulse's metrics requests that carry `process.gpu.*`, by
    host PID, with the time of their newest point (seconds)."""
    found = {}
    for rm in request.get("resourceMetrics", []):
        resource = flatten(rm.get("resource", {}).get("attributes", []))
        metrics = [m for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", [])]
        gpu = [m for m in metrics if m["name"].startswith("process.gpu.")]
        if "process.pid" not in resource or not gpu:
            continue
        times = [
            int(point["timeUnixNano"]) / 1e9
            for m in gpu
            for kind in ("gauge", "sum")
            for point in m.get(kind, {}).get("dataPoints", [])
        ]
        found[resource["process.pid"]] = {"resource": resource, "at": max(times)}
    return found


def first_span_end(path: Path, pid: int, service: str) -> Optional[float]:
    """When the first span the process sent (forwarded by gpulse to the sink) ended."""
    ends = []
    for request in requests(path):
        for rs in request.get("resourceSpans", []):
            resource = flatten(rs.get("resource", {}).get("attributes", []))
            if resource.get("service.name") != service:
                continue
            if resource.get("process.pid") not in (pid, None, 1):
                continue
            ends += [
                int(span["endTimeUnixNano"]) / 1e9
                for ss in rs.get("scopeSpans", [])
                for span in ss.get("spans", [])
            ]
    return min(ends) if ends else None


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_gpu_metrics_take_the_service_and_rank_the_process_sends(tmp_path):
    require_torch()
    gpulse_bin, sim_lib = built_binaries(WHAT)
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        fail_or_skip(WHAT, f"{torchrun} is missing (it comes with torch)")

    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    receiver_port, health_port, prometheus_port = free_port(), free_port(), free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    app_env = dict(
        base_env,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver_port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY=str(int(SEND_DELAY_SECONDS * 1000)),
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(EXAMPLE_DIR / "src"),
    )
    sink = gpulse = job = None
    apps: Dict[str, subprocess.Popen] = {}
    try:
        sink, sink_endpoint = start_sink(out)

        with (tmp_path / "job.log").open("w") as log:
            job = subprocess.Popen(
                [
                    str(torchrun),
                    f"--nproc-per-node={RANKS}",
                    "--rdzv-backend=c10d",
                    "--rdzv-endpoint=127.0.0.1:0",
                    "--rdzv-id=ddp-bar-run",
                    str(TRAIN),
                    "--model=mlp",
                    "--batch-size=16",
                    "--epochs=1",
                    "--steps-per-epoch=60",
                    "--sleep-per-step=0.1",
                    f"--service-name={SERVICE}",
                    f"--pid-file={tmp_path}/rank{{rank}}.pid",
                    f"--start-after={go}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=app_env,
                cwd=tmp_path,
            )
        # The spans say `from-spans`, the environment `from-env`; its resource also claims a
        # PID, host and pod that gpulse must not take.
        app_args = {
            "from-spans": [
                "--ignore-environment",
                "--resource=service.name=from-spans",
                "--resource=service.version=2.0",
                "--resource=deployment.environment.name=staging",
                "--resource=process.pid=1",
                "--resource=host.name=spoofed-host",
                "--resource=k8s.pod.name=spoofed-pod",
            ],
            "in-code": ["--resource=service.name=in-code", "--resource=service.namespace=ml"],
        }
        for name, args in app_args.items():
            env = dict(app_env, OTEL_SERVICE_NAME="from-env") if name == "from-spans" else app_env
            with (tmp_path / f"{name}.log").open("w") as log:
                apps[name] = subprocess.Popen(
                    [
                        sys.executable,
                        str(APP),
                        *args,
                        f"--pid-file={tmp_path}/{name}.pid",
                        f"--start-after={go}",
                        "--seconds=30",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )

        pid_files = [tmp_path / f"rank{r}.pid" for r in range(RANKS)] + [
            tmp_path / f"{name}.pid" for name in app_args
        ]
        wait_until(
            lambda: all(f.exists() for f in pid_files),
            120,
            "waiting for every rank and application to start",
            [job, *apps.values()],
        )
        pids = [int(f.read_text()) for f in pid_files]
        rank_pids, (spans_pid, code_pid) = pids[:RANKS], pids[RANKS:]

        pid_envs = [f"IDENTITY_PID{i}" for i in range(len(pids))]
        (tmp_path / "scenario.toml").write_text(scenario(pid_envs))
        gpulse_env = dict(
            base_env,
            NVML_SIM_SCENARIO=str(tmp_path / "scenario.toml"),
            GPULSE_KUBELET_SOCKET="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=sink_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            **{name: str(pid) for name, pid in zip(pid_envs, pids)},
        )
        with (tmp_path / "gpulse.log").open("w") as log:
            gpulse = subprocess.Popen(
                [
                    str(gpulse_bin),
                    "run",
                    "--nvml-lib",
                    str(sim_lib),
                    "--sample-interval",
                    "200ms",
                    "--export-interval",
                    f"{EXPORT_SECONDS:.0f}s",
                    "--otlp-receiver-http",
                    str(receiver_port),
                    "--health-addr",
                    str(health_port),
                    "--prometheus-addr",
                    f"127.0.0.1:{prometheus_port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=gpulse_env,
            )

        def exported() -> List[Dict[int, dict]]:
            return [r for r in map(process_resources, requests(out)) if r]

        wait_until(
            lambda: any(set(pids) <= set(r) for r in exported()),
            30,
            "waiting for gpulse's first export of every process",
            [gpulse],
        )
        # Before any span: the environment's word.
        before = next(r for r in exported() if set(pids) <= set(r))
        for rank, pid in enumerate(rank_pids):
            resource = before[pid]["resource"]
            assert resource["service.name"].startswith("unknown_service"), resource
            assert resource["gpulse.identity.source"] == "environment", resource
            assert resource["pytorch.distributed.rank"] == rank, resource
            assert resource["pytorch.distributed.world_size"] == RANKS, resource
        assert before[spans_pid]["resource"]["service.name"] == "from-env"
        assert before[code_pid]["resource"]["gpulse.identity.source"] == "default"

        go.touch()
        expected = {pid: SERVICE for pid in rank_pids}
        expected.update({spans_pid: "from-spans", code_pid: "in-code"})

        def adopted() -> bool:
            latest = exported()[-1]
            return all(
                latest.get(pid, {}).get("resource", {}).get("service.name") == name
                for pid, name in expected.items()
            )

        wait_until(adopted, 120, "waiting for gpulse to adopt every process's own name", [gpulse])
        status = get_json(f"http://127.0.0.1:{health_port}/status")
        with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/metrics") as response:
            scraped = response.read().decode()
        try:
            job.wait(240)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job still runs after 240 s: {tmp_path / 'job.log'}")
        assert job.returncode == 0, (tmp_path / "job.log").read_text()[-3000:]
        # What gpulse sent while every process lived (nvml-sim lists the ranks after they exit).
        while_alive = list(requests(out))
        time.sleep(2 * EXPORT_SECONDS)
        stop(gpulse)
        assert gpulse.returncode == 0, (tmp_path / "gpulse.log").read_text()[-3000:]
        stop(sink)
    finally:
        for process in [job, *apps.values(), gpulse, sink]:
            stop(process)

    windows = [r for r in map(process_resources, while_alive) if r]
    host = socket.gethostname()
    for pid, name in expected.items():
        mine = [w[pid] for w in windows if pid in w]
        first = next(i for i, seen in enumerate(mine) if seen["resource"]["service.name"] == name)
        # Stable once known: every later window keeps the name, until the process exits.
        later = {seen["resource"]["service.name"] for seen in mine[first:]}
        assert later == {name}, f"pid {pid}: {later}"
        spans_ended = first_span_end(out, pid, name)
        assert spans_ended is not None, f"no span of pid {pid} reached the sink"
        # Within two export windows of its first span (sent after the SDK's batch delay).
        lag = mine[first]["at"] - spans_ended
        assert lag <= 2 * EXPORT_SECONDS + SEND_DELAY_SECONDS + 0.3, (pid, name, lag)
        resource = mine[first]["resource"]
        assert resource["gpulse.identity.source"] == "telemetry", resource
        # gpulse's own observations are never taken from what the process sends.
        assert resource["process.pid"] == pid and resource["host.name"] == host, resource
        assert "k8s.pod.name" not in resource, resource

    for rank, pid in enumerate(rank_pids):
        resource = next(w[pid] for w in reversed(windows) if pid in w)["resource"]
        assert resource["pytorch.distributed.rank"] == rank, resource
        assert resource["pytorch.distributed.world_size"] == RANKS, resource
        assert resource["pytorch.distributed.job.id"] == "ddp-bar-run", resource
        assert resource["pytorch.distributed.backend"] == "gloo", resource
    spans_resource = next(w[spans_pid] for w in reversed(windows) if spans_pid in w)["resource"]
    assert spans_resource["service.version"] == "2.0", spans_resource
    assert spans_resource["deployment.environment.name"] == "staging", spans_resource
    code_resource = next(w[code_pid] for w in reversed(windows) if code_pid in w)["resource"]
    assert code_resource["service.namespace"] == "ml", code_resource

    # /status and /metrics name the processes the same way.
    named = {
        p["pid"]: (p["workload"]["service_name"], p["workload"]["identity_source"])
        for p in status["processes"]
    }
    for pid, name in expected.items():
        assert named[pid] == (name, "telemetry"), named
    rank0 = rank_pids[0]
    memory_series = [
        line
        for line in scraped.splitlines()
        if line.startswith("process_gpu_memory_usage") and f'process_pid="{rank0}"' in line
    ]
    assert memory_series, scraped[:2000]
    assert all(
        f'service_name="{SERVICE}"' in line and 'pytorch_distributed_rank="0"' in line
        for line in memory_series
    ), memory_series
