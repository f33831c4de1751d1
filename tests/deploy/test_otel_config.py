"""otel-config/: each OpenTelemetry Collector configuration validated STRUCTURALLY by
collector_schema.py, because no collector binary with these components installs from PyPI, npm
or crates.io (see that module's docstring for what is and is not checked). Also: each file opens
with a comment block saying when to use it, and the exporters do what the deployment relies on
(resource attributes as Prometheus labels, detailed debug output, retry and queues in the
gateway fan-out, k8sattributes keyed on k8s.pod.uid then container.id)."""

import copy

import pytest
import yaml

import collector_schema
from conftest import REPO

CONFIG_DIR = REPO / "otel-config"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def load(name):
    return collector_schema.load(CONFIG_DIR / name)


def test_the_expected_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"debug.yaml", "prometheus.yaml", "traces.yaml", "kubernetes.yaml", "gateway.yaml", "agent.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_structurally_valid(path):
    errors = collector_schema.validate(collector_schema.load(path))
    assert errors == [], f"{path.name}:\n  " + "\n  ".join(errors)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_starts_with_when_to_use(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# WHEN TO USE:"), f"{path.name} must open with a '# WHEN TO USE:' comment block"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["exporters"].update({"prometheous": {}}), "unknown exporter type"),
        (lambda d: d["exporters"]["prometheus"].update({"resource_to_telemetry_convertion": {"enabled": True}}), "unknown key"),
        (lambda d: d["service"]["pipelines"]["metrics"]["exporters"].append("otlp/missing"), "not defined"),
        (lambda d: d["service"]["pipelines"].update({"traces": {"receivers": ["otlp"], "exporters": ["prometheus"]}}), "does not carry traces"),
        (lambda d: d["service"]["pipelines"]["metrics"].update({"exporters": []}), "has no exporters"),
        (lambda d: d["receivers"]["otlp"]["protocols"]["grpc"].update({"endpoint": "localhost:4317"}), "loopback"),
        (lambda d: d.pop("service"), "no `service` section"),
        (lambda d: d["service"].update({"extensions": ["pprof"]}), "not defined under extensions"),
    ],
    ids=["unknown-type", "misspelt-key", "undefined-component", "wrong-signal", "no-exporter", "loopback", "no-service", "undefined-extension"],
)
def test_validator_catches(mutate, expected):
    doc = copy.deepcopy(load("prometheus.yaml"))
    mutate(doc)
    errors = collector_schema.validate(doc)
    assert any(expected in e for e in errors), errors


def test_debug_config_is_detailed():
    doc = load("debug.yaml")
    assert doc["exporters"]["debug"]["verbosity"] == "detailed"
    for p in doc["service"]["pipelines"].values():
        assert "debug" in p["exporters"]


@pytest.mark.parametrize("name", ["prometheus.yaml", "traces.yaml", "kubernetes.yaml"])
def test_prometheus_exporter_labels_series_with_resource_attributes(name):
    prom = load(name)["exporters"]["prometheus"]
    assert prom["resource_to_telemetry_conversion"] == {"enabled": True}
    # The dashboard's names assume the default translation (suffixes on, underscores).
    assert prom.get("add_metric_suffixes", True) is True
    assert prom.get("translation_strategy", "UnderscoreEscapingWithSuffixes") == "UnderscoreEscapingWithSuffixes"


def test_gateway_fans_out_with_queues_and_retries():
    doc = load("gateway.yaml")
    exporters = doc["exporters"]
    used = {e for p in doc["service"]["pipelines"].values() for e in p["exporters"]}
    assert len(used) >= 3, "a fan-out sends to several backends"
    for eid in used:
        cfg = exporters[eid]
        assert cfg["retry_on_failure"]["enabled"] is True, eid
        queue = cfg.get("sending_queue") or cfg.get("remote_write_queue")
        assert queue and queue["enabled"] is True, f"{eid} has no queue"
    assert exporters["prometheusremotewrite"]["resource_to_telemetry_conversion"] == {"enabled": True}
    for p in doc["service"]["pipelines"].values():
        assert p["processors"][0] == "memory_limiter", "memory_limiter must come first"
        assert "batch" in p["processors"]
    assert "${env:VENDOR_API_KEY}" in exporters["otlphttp/vendor"]["headers"]["authorization"], "no key in the file"


def test_agent_forwards_everything_to_the_gateway():
    doc = load("agent.yaml")
    for p in doc["service"]["pipelines"].values():
        assert p["exporters"] == ["otlp/gateway"]
    gw = doc["exporters"]["otlp/gateway"]
    assert gw["sending_queue"]["enabled"] and gw["retry_on_failure"]["enabled"]


def test_k8sattributes_associates_by_pod_uid_then_container_id():
    k8s = load("kubernetes.yaml")["processors"]["k8sattributes"]
    order = [s["sources"][0].get("name") or s["sources"][0]["from"] for s in k8s["pod_association"]]
    assert order[:2] == ["k8s.pod.uid", "container.id"]
    assert {"k8s.pod.name", "k8s.namespace.name", "k8s.container.name"} <= set(k8s["extract"]["metadata"])


def test_traces_config_sends_spans_to_jaeger_over_otlp():
    doc = load("traces.yaml")
    assert doc["service"]["pipelines"]["traces"]["exporters"] == ["otlp/jaeger"]
    assert doc["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"


def test_yaml_is_plain_yaml():
    # No tabs, no duplicate keys (PyYAML keeps the last one silently; the collector rejects them).
    class Strict(yaml.SafeLoader):
        pass

    def no_dupes(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        dup = {k for k in keys if keys.count(k) > 1}
        assert not dup, f"duplicate keys {dup} at line {node.start_mark.line + 1}"
        return loader.construct_mapping(node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_dupes)
    for p in CONFIGS:
        text = p.read_text(encoding="utf-8")
        assert "\t" not in text, p.name
        yaml.load(text, Loader=Strict)
