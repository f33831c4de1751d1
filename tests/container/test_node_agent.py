"""The image run as examples/kubernetes/daemonset.yaml runs it, in a real engine: `--pid host`,
the host's /proc read-only at /host/proc, NVML (nvml-sim) mounted where the NVIDIA container
toolkit mounts the driver's, uid 65532, read-only root, every capability dropped, exporting to the
real Collector. The GPU process is a process in ANOTHER real container; what podman says about it
(`podman inspect`, `podman top`) is the expected identity.

Also: `podman stop` (SIGTERM to gpulse as PID 1) exports the last window and exits 0 within the
grace period; the image has no shell and runs as 65532 with nothing writable."""

import time

import pytest

from engine import (
    BUSYBOX_IMAGE_OR_BUILD,
    HOST_FROM_CONTAINER,
    NVML_IN_CONTAINER,
    host_and_ns_pid,
    inspect,
    metric_resources,
    name,
    nvml_sim,
    otlp_lines,
    podman,
    wait_until,
)

# As the DaemonSet's securityContext: runAsUser 65532, readOnlyRootFilesystem, drop ALL,
# allowPrivilegeEscalation false.
LEAST_PRIVILEGE = ["--user", "65532:65532", "--read-only", "--cap-drop", "ALL",
                   "--security-opt", "no-new-privileges"]


def scenario_for(host_pid: int) -> str:
    return f"""
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-c0ffee00-0000-4000-8000-000000000001"
memory_total_mib = 81559

[device.signals]
gpu_util = 60

[[device.process]]
pid = {host_pid}
name = "sleep"
sm_util = 40
memory_used_mib = 2048
"""


def run_agent(tmp_path, collector_port, host_pid, *extra_args, export_interval="2s"):
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(scenario_for(host_pid))
    ctr = name("agent")
    podman("run", "-d", "--name", ctr, *LEAST_PRIVILEGE,
           "--pid", "host",
           "-v", "/proc:/host/proc:ro", "-e", "HOST_PROC=/host/proc",
           "-v", f"{nvml_sim()}:{NVML_IN_CONTAINER}:ro",
           "-v", f"{scenario}:/etc/nvml-sim/scenario.toml:ro", "-e", "NVML_SIM_SCENARIO=/etc/nvml-sim/scenario.toml",
           "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT=http://{HOST_FROM_CONTAINER}:{collector_port}",
           "-e", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
           "localhost/gpulse:dev",
           "--sample-interval=500ms", f"--export-interval={export_interval}", "--kubelet-socket=none",
           *extra_args)
    return ctr


def logs(ctr):
    r = podman("logs", ctr, check=False)
    return f"--- podman logs {ctr}:\n{(r.stdout + r.stderr)[-4000:]}"


def process_resource(otlp, host_pid):
    for res, metric_names in metric_resources(otlp_lines(otlp)):
        if res.get("process.pid") == str(host_pid) or res.get("process.pid") == host_pid:
            return res, metric_names
    return None


def test_node_agent_attributes_a_process_in_another_container(gpulse_image, collector, workload, tmp_path):
    port, otlp = collector
    host_pid, ns_pid = host_and_ns_pid(workload, "/bin/busybox sleep")
    assert ns_pid != 1 and ns_pid != host_pid, "the workload's sleep should be a child in its own namespace"
    container_id = inspect(workload, "{{.Id}}")
    agent = run_agent(tmp_path, port, host_pid)
    try:
        res, metric_names = wait_until("the workload's process resource at the collector",
                                       lambda: process_resource(otlp, host_pid), logs=lambda: logs(agent))
        assert res.get("container.id") == container_id, res
        assert str(res.get("process.vpid")) == str(ns_pid), res
        assert res.get("container.runtime.name") == "podman", res
        assert "process.gpu.memory.usage" in metric_names, metric_names
        # The node resource (gpulse's own) came too, with the device metrics.
        devices = [n for r, names in metric_resources(otlp_lines(otlp)) for n in names if n == "hw.gpu.utilization"]
        assert devices, "no hw.gpu.utilization from the simulated GPU"
        assert inspect(agent, "{{.State.Running}}") == "true", logs(agent)
    finally:
        podman("rm", "-f", "-t", "0", agent, check=False)


def test_podman_stop_exports_the_last_window_and_exits_zero(gpulse_image, collector, workload, tmp_path):
    """With a 10-minute export interval nothing is sent before the stop: whatever arrives is the
    last window, flushed on SIGTERM."""
    port, otlp = collector
    host_pid, _ = host_and_ns_pid(workload, "/bin/busybox sleep")
    agent = run_agent(tmp_path, port, host_pid, export_interval="10m")
    try:
        wait_until("gpulse to start", lambda: " starting " in logs(agent), timeout=60, logs=lambda: logs(agent))
        time.sleep(3)  # samples at 500 ms: the window the stop must not lose
        assert otlp_lines(otlp) == [], "something was exported before the stop; the test would prove nothing"
        started = time.monotonic()
        podman("stop", "-t", "10", agent, timeout=30)
        took = time.monotonic() - started
        assert took < 10, f"podman stop took {took:.1f} s: gpulse did not exit on SIGTERM within the grace period"
        assert inspect(agent, "{{.State.ExitCode}}") == "0", logs(agent)
        res = wait_until("the last window at the collector", lambda: process_resource(otlp, host_pid),
                         timeout=30, logs=lambda: logs(agent))
        assert "process.gpu.memory.usage" in res[1], res
    finally:
        podman("rm", "-f", "-t", "0", agent, check=False)


def test_image_has_no_shell_runs_as_65532_and_writes_nothing(gpulse_image):
    assert podman("image", "inspect", "--format", "{{.Config.User}}", gpulse_image).stdout.strip() == "65532:65532"
    for shell in ("/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/sh"):
        r = podman("run", "--rm", "--entrypoint", shell, gpulse_image, "-c", "true", check=False)
        assert r.returncode != 0 and ("no such file" in r.stderr.lower() or "not found" in r.stderr.lower()), (
            f"{shell} seems to exist in the image: {r.returncode} {r.stderr}")
    # Under the least-privilege settings it still starts, and says what it is.
    r = podman("run", "--rm", *LEAST_PRIVILEGE, gpulse_image, "--help")
    assert "Usage: gpulse run" in r.stdout
