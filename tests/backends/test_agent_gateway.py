"""otel-config/agent.yaml → otel-config/gateway.yaml, both AS SHIPPED (listen addresses on free
loopback ports, see backend_stack.start_collector), with the endpoints they read from the
environment pointed at real backends on this machine:

    gpulse (metrics, findings; its receiver forwards the trainer's spans) → agent → gateway →
        REMOTE_WRITE_URL      Prometheus with --web.enable-remote-write-receiver
        TEMPO_ENDPOINT        Jaeger (it takes the OTLP/gRPC that Tempo takes)
        VENDOR_OTLP_ENDPOINT  a real OTLP/HTTP receiver (tests/receiver/otlp_receiver.py), with
                              the API key from VENDOR_API_KEY
"""

import json
import os
import sys

import pytest

from backend_stack import BACKENDS_DIR, REPO, backend, free_port, http_get_json, promql, start_collector, \
    start_gpulse, start_jaeger, start_prometheus

MIB = 1024 * 1024


def json_lines(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def chain(stack, workloads):
    # Without a Jaeger binary the traces pipeline points at a closed port (the gateway retries
    # in the background) and only the span test skips (fails in CI).
    if os.access(BACKENDS_DIR / "bin" / "jaeger", os.X_OK):
        _, jaeger_otlp, jaeger_query = start_jaeger(stack)
    else:
        jaeger_otlp, jaeger_query = f"127.0.0.1:{free_port()}", None
    _, prom = start_prometheus(stack, remote_write=True, name="prometheus-remote-write")
    vendor = stack.start("vendor-receiver", [sys.executable, REPO / "tests/receiver/otlp_receiver.py",
                                             "--output", stack.tmp / "vendor.jsonl"])
    vendor_ports = stack.wait_until("the vendor receiver's ports", lambda: next(
        (json.loads(line) for line in vendor.log.read_text().splitlines() if line.startswith("{")), None))
    _, gateway = start_collector(stack, REPO / "otel-config" / "gateway.yaml", name="collector-gateway", env={
        "REMOTE_WRITE_URL": f"{prom}/api/v1/write",
        "TEMPO_ENDPOINT": jaeger_otlp,
        "VENDOR_OTLP_ENDPOINT": f"http://127.0.0.1:{vendor_ports['http']}",
        "VENDOR_API_KEY": "backends-test-key",
    })
    _, agent = start_collector(stack, REPO / "otel-config" / "agent.yaml", name="collector-agent",
                               env={"GATEWAY_ENDPOINT": f"127.0.0.1:{gateway['grpc']}"})
    receiver_port = free_port()
    start_gpulse(stack, workloads, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{agent['grpc']}"},
                 args=["--otlp-receiver-http", f"127.0.0.1:{receiver_port}"])
    return {"prom": prom, "jaeger": jaeger_query, "receiver": f"http://127.0.0.1:{receiver_port}",
            "vendor": stack.tmp / "vendor.jsonl"}


def test_metrics_reach_prometheus_by_remote_write(chain, stack, workloads):
    q = f'process_gpu_memory_usage_bytes{{container_id="{workloads.container_id}"}}'
    series = stack.wait_until("the trainer's series remote-written to Prometheus", lambda: promql(chain["prom"], q))
    assert float(series[0]["value"][1]) == 4096 * MIB, series
    labels = series[0]["metric"]
    assert labels.get("k8s_pod_uid") == workloads.pod_uid, labels
    assert labels.get("service_name") == "resnet-training", labels
    util = promql(chain["prom"], 'hw_gpu_utilization_ratio{hw_gpu_task="general"}')
    assert sorted(round(float(s["value"][1]), 3) for s in util) == [0.0, 0.8], util


def test_vendor_gets_metrics_and_findings_with_the_api_key(chain, stack):
    def findings():
        reqs = json_lines(chain["vendor"])
        logs = [r for r in reqs if r.get("signal") == "logs"
                and "gpulse.diagnosis.rule" in json.dumps(r.get("request"))]
        return (logs, reqs) if logs and any(r.get("signal") == "metrics" for r in reqs) else None

    logs, reqs = stack.wait_until("metrics and findings at the vendor OTLP/HTTP endpoint", findings)
    for r in reqs:
        headers = {k.lower(): v for k, v in r.get("headers", {}).items()}
        assert headers.get("authorization") == "Bearer backends-test-key", headers
        assert r.get("content_encoding") == "gzip", f"gateway.yaml sets compression: gzip: {r}"


def test_spans_reach_jaeger_through_agent_and_gateway(chain, stack, workloads):
    backend("jaeger")  # skips, or fails under CI=true, when it was not built
    sent = workloads.send_span(chain["receiver"])
    assert sent.get("status") == 200, sent

    def span_tags():
        body = http_get_json(f"{chain['jaeger']}/api/traces/{sent['trace_id']}")
        spans = [s for t in body.get("data") or [] for s in t["spans"] if s["spanID"] == sent["span_id"]]
        return {t["key"]: t["value"] for t in spans[0]["tags"]} if spans else None

    tags = stack.wait_until("the trainer's span in Jaeger through agent and gateway", span_tags)
    gpu = {k: v for k, v in tags.items() if k.startswith("gpulse.gpu.")}
    assert round(float(gpu.get("gpulse.gpu.utilization.mean", -1)), 3) == 0.8, tags
