"""gpulse → Prometheus 3's own OTLP endpoint (--web.enable-otlp-receiver), no Collector between:
PromQL returns the simulated node's device values and each GPU process's values, with the
resource attributes docs/prometheus.md tells users to promote (otlp.promote_resource_attributes) as
labels: container.id and k8s.pod.uid from the trainer's real pod cgroup, service.name from its
environment, process.pid. Findings (log records) go to a real OTLP receiver beside it, as a
Prometheus user sends logs to a log backend."""

import json
import sys

import pytest

from backend_stack import REPO, promql, start_gpulse, start_prometheus

MIB = 1024 * 1024


def first_json_line(path):
    return next((json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")), None)


def by_labels(result, **labels):
    return [s for s in result if all(s["metric"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def node(stack, workloads):
    _, prom = start_prometheus(stack, otlp=True)
    receiver = stack.start("log-receiver", [sys.executable, REPO / "tests/receiver/otlp_receiver.py",
                                            "--output", stack.tmp / "logs.jsonl"])
    ports = stack.wait_until("the log receiver's ports", lambda: first_json_line(receiver.log))
    start_gpulse(stack, workloads, {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{prom}/api/v1/otlp/v1/metrics",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"http://127.0.0.1:{ports['http']}/v1/logs",
    })
    # Both GPUs and both processes, with their memory, once a few windows have arrived.
    stack.wait_until("gpulse's series in Prometheus",
                     lambda: len(promql(prom, "hw_gpu_utilization_ratio")) >= 2
                     and len(promql(prom, "process_gpu_memory_usage_bytes")) >= 2)
    return prom


def test_device_values_are_the_simulated_ones(node, stack):
    util = promql(node, 'hw_gpu_utilization_ratio{hw_gpu_task="general"}')
    values = sorted(round(float(s["value"][1]), 3) for s in util)
    assert values == [0.0, 0.8], f"GPU utilisation per device should be 0 % and 80 % (node.toml): {util}"
    power = sorted(round(float(s["value"][1])) for s in promql(node, "hw_power_watts"))
    assert power == [80, 450], f"power per device: {power}"
    # Every device series names its GPU (hw.id) and the node (host.name, promoted).
    for s in util:
        assert s["metric"].get("hw_id", "").startswith("GPU-b0b0b0b0-"), s["metric"]
        assert s["metric"].get("host_name"), f"host.name was not promoted: {s['metric']}"


def test_process_series_carry_the_promoted_resource_attributes(node, workloads):
    mem = promql(node, "process_gpu_memory_usage_bytes")
    trainer = by_labels(mem, process_pid=str(workloads.trainer.pid))
    assert len(trainer) == 1, f"one memory series for the trainer (pid {workloads.trainer.pid}): {mem}"
    labels = trainer[0]["metric"]
    assert float(trainer[0]["value"][1]) == 4096 * MIB
    assert labels.get("container_id") == workloads.container_id, labels
    assert labels.get("k8s_pod_uid") == workloads.pod_uid, labels
    assert labels.get("service_name") == "resnet-training", labels
    idle = by_labels(mem, process_pid=str(workloads.idle.pid))
    assert len(idle) == 1 and float(idle[0]["value"][1]) == 8192 * MIB, mem
    assert idle[0]["metric"].get("service_name") == "forgotten-notebook", idle[0]["metric"]
    assert "container_id" not in idle[0]["metric"], "the sleeper runs in no container"


def test_promql_joins_a_container_to_its_gpu_share(node, workloads):
    """The query a user writes: SM share of one container's processes, by GPU."""
    q = f'sum by (hw_id) (process_gpu_utilization_ratio{{container_id="{workloads.container_id}", hw_gpu_task="general"}})'
    result = promql(node, q)
    assert len(result) == 1, result
    assert round(float(result[0]["value"][1]), 3) == 0.75, result


def test_the_findings_gauge_is_a_series_too(node, stack):
    active = stack.wait_until("gpulse_diagnosis_active for idle_holder",
                              lambda: promql(node, 'gpulse_diagnosis_active{gpulse_diagnosis_rule="idle_holder"} > 0'))
    assert active, active
