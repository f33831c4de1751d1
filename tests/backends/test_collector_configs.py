"""Each otel-config/*.yaml in the real Collector (otelcol-gpulse), AS SHIPPED: only the listen
addresses move to free loopback ports (--set, see conftest.start_collector), and the endpoints the
files read from the environment (${env:...}) point at real backends on this machine.

- every file passes `otelcol-gpulse validate` (kubernetes.yaml too: it needs a cluster to RUN,
  for k8sattributes' API watch, not to validate);
- debug.yaml: gpulse's findings arrive as log records (and its metrics as metrics) in the file
  exporter's ./otlp.jsonl;
- prometheus.yaml: Prometheus scraping the collector gets the device and per-process series with
  their resource attributes as labels;
(traces.yaml runs in test_compose_stack.py, agent.yaml and gateway.yaml in test_agent_gateway.py.)
"""

import json
import os
import subprocess

import pytest

from backend_stack import REPO, backend, promql, start_collector, start_gpulse, start_prometheus

CONFIGS = sorted((REPO / "otel-config").glob("*.yaml"))
ENV_FOR_VALIDATE = {"GATEWAY_ENDPOINT": "127.0.0.1:4317", "REMOTE_WRITE_URL": "http://127.0.0.1:9090/api/v1/write",
                    "TEMPO_ENDPOINT": "127.0.0.1:4317", "VENDOR_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                    "VENDOR_API_KEY": "test-key"}
MIB = 1024 * 1024


def json_lines(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_records(requests):
    """(resource attributes, record) for each log record in OTLP/JSON requests."""
    for req in requests:
        for rl in req.get("resourceLogs", []):
            res = {a["key"]: a["value"] for a in rl.get("resource", {}).get("attributes", [])}
            for sl in rl.get("scopeLogs", []):
                for rec in sl.get("logRecords", []):
                    yield res, rec


def attrs(record):
    out = {}
    for a in record.get("attributes", []):
        v = a["value"]
        out[a["key"]] = next(iter(v.values())) if v else None
    return out


def test_there_are_configs():
    names = {c.name for c in CONFIGS}
    assert {"agent.yaml", "debug.yaml", "gateway.yaml", "kubernetes.yaml", "prometheus.yaml", "traces.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_validates_in_the_real_collector(config):
    binary = backend("otelcol-gpulse")
    env = dict(os.environ, **ENV_FOR_VALIDATE)
    r = subprocess.run([binary, "validate", "--config", config], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"otelcol-gpulse validate --config {config.name} failed:\n{r.stdout}\n{r.stderr}"


def test_debug_yaml_writes_findings_as_log_records(local, workloads):
    workdir = local.tmp / "debug-collector"
    workdir.mkdir()
    _, ports = start_collector(local, REPO / "otel-config" / "debug.yaml", name="collector-debug", cwd=workdir)
    start_gpulse(local, workloads, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['http']}"},
                 name="gpulse-debug")
    out = workdir / "otlp.jsonl"

    def idle_holder_started():
        return [(res, rec) for res, rec in log_records(json_lines(out))
                if attrs(rec).get("gpulse.diagnosis.rule") == "idle_holder"
                and attrs(rec).get("gpulse.diagnosis.state") == "started"]

    found = local.wait_until("an idle_holder finding in the file exporter's otlp.jsonl", idle_holder_started)
    res, rec = found[0]
    assert res.get("process.pid", {}).get("intValue") in (str(workloads.idle.pid), workloads.idle.pid), res
    assert rec.get("eventName") == "gpulse.diagnosis.finding" or \
        attrs(rec).get("event.name") == "gpulse.diagnosis.finding", rec
    assert "body" in rec and rec["body"].get("stringValue"), rec
    metric_names = {m["name"] for req in json_lines(out) for rm in req.get("resourceMetrics", [])
                    for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", [])}
    assert {"hw.gpu.utilization", "process.gpu.memory.usage"} <= metric_names, sorted(metric_names)


def test_prometheus_yaml_serves_series_with_resource_labels(local, workloads):
    _, ports = start_collector(local, REPO / "otel-config" / "prometheus.yaml", name="collector-prometheus")
    _, prom = start_prometheus(local, scrape_targets=[f"127.0.0.1:{ports['prometheus']}"], name="prometheus-scrape")
    start_gpulse(local, workloads, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['grpc']}"},
                 name="gpulse-prometheus")
    q = f'process_gpu_memory_usage_bytes{{container_id="{workloads.container_id}"}}'
    series = local.wait_until("the trainer's series scraped from the collector", lambda: promql(prom, q))
    labels = series[0]["metric"]
    assert float(series[0]["value"][1]) == 4096 * MIB, series
    assert labels.get("k8s_pod_uid") == workloads.pod_uid, labels
    assert labels.get("service_name") == "resnet-training", labels
    assert labels.get("process_pid") == str(workloads.trainer.pid), labels
    util = promql(prom, 'hw_gpu_utilization_ratio{hw_gpu_task="general"}')
    assert sorted(round(float(s["value"][1]), 3) for s in util) == [0.0, 0.8], util
