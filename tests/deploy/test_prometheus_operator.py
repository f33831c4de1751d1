"""examples/kubernetes/prometheus-operator/: the PodMonitor / ServiceMonitor that scrape gpulse's
/metrics and the PrometheusRule alerting on its findings gauge. The core objects (the Service)
are validated strictly against the Kubernetes schemas like the other manifests; the
monitoring.coreos.com objects, whose schemas kubernetes-validate does not bundle, are checked
field by field against the prometheus-operator v1 API and against what they must match (the
DaemonSet's labels and port, the rule names gpulse has). The alert rules go through the real
promtool: `check rules`, then `test rules` with series as gpulse exposes them."""

import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from conftest import REPO, absent

OPERATOR_DIR = REPO / "examples" / "kubernetes" / "prometheus-operator"
DAEMONSET = REPO / "examples" / "kubernetes" / "daemonset.yaml"

# Fields of the prometheus-operator monitoring.coreos.com/v1 API (pkg/apis/monitoring/v1) that a
# manifest here may use; a misspelt one (the operator would ignore it silently) fails.
POD_MONITOR_SPEC = {"jobLabel", "podTargetLabels", "podMetricsEndpoints", "selector", "namespaceSelector",
                    "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit",
                    "labelValueLengthLimit", "attachMetadata", "scrapeProtocols", "scrapeClass"}
SERVICE_MONITOR_SPEC = {"jobLabel", "targetLabels", "podTargetLabels", "endpoints", "selector",
                        "namespaceSelector", "sampleLimit", "targetLimit", "labelLimit",
                        "labelNameLengthLimit", "labelValueLengthLimit", "attachMetadata",
                        "scrapeProtocols", "scrapeClass"}
ENDPOINT = {"port", "portNumber", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
            "honorLabels", "honorTimestamps", "trackTimestampsStaleness", "metricRelabelings",
            "relabelings", "filterRunning", "followRedirects", "enableHttp2", "proxyUrl",
            "bearerTokenSecret", "basicAuth", "oauth2", "authorization", "tlsConfig"}
RELABEL = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
RULE_GROUP = {"name", "interval", "rules", "partial_response_strategy", "limit", "query_offset", "labels"}
RULE = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def docs(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def all_docs():
    return [(p.name, d) for p in sorted(OPERATOR_DIR.glob("*.yaml")) for d in docs(p)]


def of_kind(kind: str) -> list[dict]:
    return [d for _, d in all_docs() if d["kind"] == kind]


def daemonset() -> dict:
    return next(d for d in docs(DAEMONSET) if d["kind"] == "DaemonSet")


def gpulse_container() -> dict:
    return next(c for c in daemonset()["spec"]["template"]["spec"]["containers"] if c["name"] == "gpulse")


def rule_ids() -> set[str]:
    """The rules the reference documents: a `rule_id` heading each in docs/rules.md (###) and
    docs/rank-rules.md (##)."""
    ids = set()
    for page in ("rules.md", "rank-rules.md"):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        ids |= set(re.findall(r"^#{2,3} `(\w+)`", text, flags=re.M))
    return ids


def test_the_files_are_there():
    kinds = {d["kind"] for _, d in all_docs()}
    assert {"PodMonitor", "ServiceMonitor", "Service", "PrometheusRule"} <= kinds


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.latest_version()])
def test_core_objects_validate_strictly(version):
    core = [d for _, d in all_docs() if "/" not in d["apiVersion"] or d["apiVersion"].startswith("apps/")]
    assert core
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


def test_operator_objects_use_known_fields_only():
    for name, doc in all_docs():
        if doc["apiVersion"] != "monitoring.coreos.com/v1":
            continue
        assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}, name
        spec = doc["spec"]
        if doc["kind"] == "PodMonitor":
            assert set(spec) <= POD_MONITOR_SPEC, name
            endpoints = spec["podMetricsEndpoints"]
        elif doc["kind"] == "ServiceMonitor":
            assert set(spec) <= SERVICE_MONITOR_SPEC, name
            endpoints = spec["endpoints"]
        else:
            assert doc["kind"] == "PrometheusRule", name
            for group in spec["groups"]:
                assert set(group) <= RULE_GROUP, name
                for rule in group["rules"]:
                    assert set(rule) <= RULE, f"{name}: {rule}"
            continue
        for ep in endpoints:
            assert set(ep) <= ENDPOINT, f"{name}: {ep}"
            for r in ep.get("relabelings", []) + ep.get("metricRelabelings", []):
                assert set(r) <= RELABEL, f"{name}: {r}"


def metrics_port() -> int:
    arg = next(a for a in gpulse_container()["args"] if a.startswith("--prometheus-addr="))
    host, port = arg.split("=", 1)[1].rsplit(":", 1)
    assert host == "0.0.0.0", "Prometheus scrapes the pod IP, not loopback"
    return int(port)


def test_the_daemonset_serves_metrics_on_the_named_port():
    ports = {p["name"]: p["containerPort"] for p in gpulse_container()["ports"]}
    assert ports["metrics"] == metrics_port()
    assert "--prometheus-names=dcgm" in gpulse_container()["args"]


def test_pod_monitor_selects_the_daemonset_pods():
    ds = daemonset()
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    for pm in of_kind("PodMonitor"):
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert ds["metadata"]["namespace"] in pm["spec"]["namespaceSelector"]["matchNames"]
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert ep["port"] == "metrics" and ep["path"] == "/metrics"


def test_service_monitor_selects_the_service_over_the_pods():
    ds = daemonset()
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    (service,) = of_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics" and port["port"] == metrics_port()
    for sm in of_kind("ServiceMonitor"):
        assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert service["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
        assert all(ep["port"] == port["name"] for ep in sm["spec"]["endpoints"])


def rules() -> list[dict]:
    return [r for pr in of_kind("PrometheusRule") for g in pr["spec"]["groups"] for r in g["rules"]]


def test_alerts_name_rules_gpulse_has():
    known = rule_ids()
    assert known, "docs/rules.md and docs/rank-rules.md list the rules as `rule_id` headings"
    covered = set()
    for rule in rules():
        for alternation in re.findall(r'gpulse_diagnosis_rule=~?"([^"]+)"', rule["expr"]):
            names = set(alternation.split("|"))
            assert names <= known, f"{rule['alert']}: {names - known} is not a gpulse rule"
            covered |= names
    assert covered == known, f"no alert on {known - covered}"


def promtool() -> str:
    path = os.environ.get("GPULSE_PROMTOOL_BIN") or str(
        Path(os.environ.get("GPULSE_BACKENDS_DIR", Path.home() / ".cache/gpulse/backends")) / "bin" / "promtool")
    if not Path(path).exists():
        absent(f"{path} is missing: build it with scripts/backends, or set GPULSE_PROMTOOL_BIN")
    return path


def rules_file(tmp_path: Path) -> Path:
    groups = [g for pr in of_kind("PrometheusRule") for g in pr["spec"]["groups"]]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    return path


def test_promtool_checks_the_rules(tmp_path):
    tool = promtool()
    out = subprocess.run([tool, "check", "rules", str(rules_file(tmp_path))], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_hardware_alert_fires_on_the_findings_gauge_and_only_then(tmp_path):
    tool = promtool()
    rules_path = rules_file(tmp_path)
    base = 'gpulse_diagnosis_active{{gpulse_diagnosis_rule="{rule}",host_name="gpu-node-1",instance="10.0.0.7:9400"}}'
    test = {
        "rule_files": [str(rules_path)],
        "evaluation_interval": "10s",
        "tests": [{
            "interval": "10s",
            "input_series": [
                {"series": base.format(rule="hardware_errors"), "values": "0 0 1x30"},
                {"series": base.format(rule="throttling"), "values": "0x32"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GpulseHardwareErrors", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "host_name": "gpu-node-1"},
                    "exp_annotations": {
                        "summary": "GPU hardware errors on gpu-node-1",
                        "description": next(r for r in rules() if r.get("alert") == "GpulseHardwareErrors")
                        ["annotations"]["description"].replace("{{ $value }}", "1"),
                    },
                }]},
                {"eval_time": "5m", "alertname": "GpulseGpuThrottling", "exp_alerts": []},
                {"eval_time": "30s", "alertname": "GpulseHardwareErrors", "exp_alerts": []},
            ],
        }],
    }
    test_path = tmp_path / "test.yml"
    test_path.write_text(yaml.safe_dump(test), encoding="utf-8")
    out = subprocess.run([tool, "test", "rules", str(test_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cross_node_straggler_alert_names_the_slow_rank_and_spares_even_jobs(tmp_path):
    """Job `slow`: ranks 0 and 1 on gpu-node-1 wait 0.25 s of their 0.5 s steps in all-reduce,
    rank 2 on gpu-node-2 waits for nobody (its 0.5 s are all busy): it is the straggler, and the
    alert carries its node and rank. Job `even`: every rank alike, no alert. Series as gpulse's
    /metrics exposes them (scraped from two gpulse instances)."""
    tool = promtool()
    rules_path = rules_file(tmp_path)

    def series(metric, job, rank, node, pid):
        return (f'{metric}{{host_name="{node}",instance="{node}:9400",job="gpulse",process_pid="{pid}",'
                f'pytorch_distributed_job_id="{job}",pytorch_distributed_rank="{rank}"}}')

    inputs = []
    # Binary fractions, so the medians compare exactly.
    ranks = [("slow", 0, "gpu-node-1", 100, 0.5, 0.25), ("slow", 1, "gpu-node-1", 101, 0.5, 0.25),
             ("slow", 2, "gpu-node-2", 200, 0.5, 0.0),
             ("even", 0, "gpu-node-1", 300, 0.5, 0.25), ("even", 1, "gpu-node-2", 400, 0.5, 0.25)]
    for job, rank, node, pid, step, wait in ranks:
        inputs.append({"series": series("gpulse_training_step_duration_seconds", job, rank, node, pid),
                       "values": f"{step}x60"})
        inputs.append({"series": series("gpulse_training_step_collective_wait_seconds", job, rank, node, pid),
                       "values": f"{wait}x60"})
    test = {
        "rule_files": [str(rules_path)],
        "evaluation_interval": "10s",
        "tests": [{
            "interval": "10s",
            "input_series": inputs,
            "promql_expr_test": [{
                "expr": "gpulse:training_step_busy_seconds:job_median",
                "eval_time": "1m",
                "exp_samples": [
                    {"labels": 'gpulse:training_step_busy_seconds:job_median{pytorch_distributed_job_id="slow"}',
                     "value": 0.25},
                    {"labels": 'gpulse:training_step_busy_seconds:job_median{pytorch_distributed_job_id="even"}',
                     "value": 0.25}],
            }],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "GpulseRankStragglerAcrossNodes", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "GpulseRankStragglerAcrossNodes", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "host_name": "gpu-node-2",
                                   "pytorch_distributed_job_id": "slow", "pytorch_distributed_rank": "2"},
                    "exp_annotations": {
                        "summary": "Rank 2 of job slow on gpu-node-2 holds the other ranks back",
                        "description": next(r for r in rules() if r.get("alert") == "GpulseRankStragglerAcrossNodes")
                        ["annotations"]["description"].replace("{{ $labels.host_name }}", "gpu-node-2"),
                    },
                }]},
            ],
        }],
    }
    test_path = tmp_path / "test.yml"
    test_path.write_text(yaml.safe_dump(test), encoding="utf-8")
    out = subprocess.run([tool, "test", "rules", str(test_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
