"""examples/kubernetes/: every manifest validated against the Kubernetes OpenAPI JSON schemas in
strict mode (unknown fields are errors) by kubernetes-validate, which bundles the schemas and
runs offline, at 1.29 (the first release with native sidecars on by default) and at the newest
bundled release; then what the deployment promises: hardening of every gpulse container, the
mounts and Downward API wiring, the DaemonSet's node selection, and the collector manifest
matching otel-config/kubernetes.yaml."""

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import collector_schema
from conftest import REPO

K8S_DIR = REPO / "examples" / "kubernetes"
MANIFESTS = sorted(K8S_DIR.glob("*.yaml"))
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
DOWNWARD = {
    "K8S_NODE_NAME": "spec.nodeName",
    "K8S_POD_NAME": "metadata.name",
    "K8S_POD_NAMESPACE": "metadata.namespace",
    "K8S_POD_UID": "metadata.uid",
}
ALLOWED_HOST_PATHS = {"/proc", "/var/lib/kubelet/pod-resources"}


def docs(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pod_spec(doc: dict) -> dict | None:
    kind = doc.get("kind")
    if kind == "Pod":
        return doc["spec"]
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet"):
        return doc["spec"]["template"]["spec"]
    return None


def is_report(container: dict) -> bool:
    return (container.get("args") or [None])[0] == "report"


def gpulse_containers():
    out = []
    for path in MANIFESTS:
        for doc in docs(path):
            spec = pod_spec(doc)
            if spec is None:
                continue
            for field in ("initContainers", "containers"):
                for c in spec.get(field, []):
                    # The agent's checks; `gpulse report` (job-report.yaml) is checked on its own.
                    if str(c.get("image", "")).split(":")[0].endswith("gpulse") and not is_report(c):
                        out.append(pytest.param(path.name, doc, spec, field, c, id=f"{path.name}:{doc['kind']}:{c['name']}"))
    return out


def test_there_are_manifests():
    names = {p.name for p in MANIFESTS}
    assert {"sidecar.yaml", "sidecar-classic.yaml", "daemonset.yaml", "collector.yaml"} <= names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path, version):
    found = docs(path)
    assert found, f"{path.name} holds no document"
    for doc in found:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} {doc.get('kind')}/{doc.get('metadata', {}).get('name')} against {version}: "
                        f"{'.'.join(map(str, e.path))}: {e.message}")


def test_validator_knows_native_sidecars_are_new():
    # Control: the schema version matters. Kubernetes 1.27 has no restartPolicy on init
    # containers, so the native sidecar must be rejected there; if it were not, the checks above
    # would not be checking that field at all.
    job = docs(K8S_DIR / "sidecar.yaml")[0]
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(job, "1.27.0", strict=True)


def test_validator_rejects_a_misspelt_field():
    job = docs(K8S_DIR / "sidecar.yaml")[0]
    sc = job["spec"]["template"]["spec"]["initContainers"][0]["securityContext"]
    sc["readOnlyRootFileSystem"] = sc.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


def test_sidecar_is_native():
    job = docs(K8S_DIR / "sidecar.yaml")[0]
    spec = job["spec"]["template"]["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c["name"] == "gpulse"]
    assert sidecars and sidecars[0].get("restartPolicy") == "Always", "native sidecar: initContainers + restartPolicy Always"
    assert spec["restartPolicy"] == "Never"
    assert spec.get("shareProcessNamespace") is True


def test_classic_sidecar_is_a_second_container():
    dep = docs(K8S_DIR / "sidecar-classic.yaml")[0]
    spec = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]].count("gpulse") == 1
    assert len(spec["containers"]) >= 2
    assert spec.get("shareProcessNamespace") is True


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_container_is_hardened(file, doc, spec, field, c):
    sc = c.get("securityContext", {})
    assert sc.get("runAsNonRoot") is True
    assert sc.get("runAsUser") == 65532
    assert sc.get("allowPrivilegeEscalation") is False
    assert sc.get("readOnlyRootFilesystem") is True
    assert sc.get("privileged", False) is False
    assert sc.get("capabilities", {}).get("drop") == ["ALL"]
    assert not sc.get("capabilities", {}).get("add"), "the default variant adds no capability"
    seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork"), "metrics leave over the pod network"
    image = c["image"]
    assert ":" in image and not image.endswith(":latest"), f"pin the image tag: {image}"


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_resources_and_no_gpu_request(file, doc, spec, field, c):
    res = c.get("resources", {})
    assert res.get("requests") == {"cpu": "10m", "memory": "16Mi"}
    assert res.get("limits") == {"cpu": "100m", "memory": "64Mi"}
    for part in ("requests", "limits"):
        assert "nvidia.com/gpu" not in res.get(part, {}), "a GPU request would take a GPU away from the workload"


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_mounts_are_read_only_and_minimal(file, doc, spec, field, c):
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = c.get("volumeMounts", [])
    assert any(m["mountPath"] == "/var/lib/kubelet/pod-resources" for m in mounts)
    for m in mounts:
        assert m.get("readOnly") is True, f"{m['mountPath']} must be read-only"
        hp = volumes[m["name"]].get("hostPath")
        if hp:
            assert hp["path"] in ALLOWED_HOST_PATHS, f"hostPath {hp['path']} is more than gpulse needs"
    env = {e["name"]: e for e in c.get("env", [])}
    if spec.get("hostPID"):
        assert "HOST_PROC" not in env, "with hostPID the container's own /proc already shows host PIDs"
    else:
        assert env.get("HOST_PROC", {}).get("value") == "/host/proc"
        proc = [m for m in mounts if m["mountPath"] == "/host/proc"]
        assert proc and volumes[proc[0]["name"]]["hostPath"]["path"] == "/proc"


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_downward_api_and_resource_attributes(file, doc, spec, field, c):
    env = c.get("env", [])
    names = [e["name"] for e in env]
    for var, path in DOWNWARD.items():
        e = next((e for e in env if e["name"] == var), None)
        assert e is not None, f"{var} missing"
        assert e["valueFrom"]["fieldRef"]["fieldPath"] == path
    attrs = next(e["value"] for e in env if e["name"] == "OTEL_RESOURCE_ATTRIBUTES")
    pairs = dict(p.split("=", 1) for p in attrs.split(","))
    assert pairs == {"k8s.node.name": "$(K8S_NODE_NAME)", "k8s.pod.name": "$(K8S_POD_NAME)",
                     "k8s.namespace.name": "$(K8S_POD_NAMESPACE)", "k8s.pod.uid": "$(K8S_POD_UID)"}
    # Kubernetes expands $(VAR) only from variables defined EARLIER in the list.
    at = names.index("OTEL_RESOURCE_ATTRIBUTES")
    for ref in re.findall(r"\$\((\w+)\)", attrs):
        assert ref in names[:at], f"$({ref}) is defined after OTEL_RESOURCE_ATTRIBUTES and would stay literal"


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_probes_match_the_health_address(file, doc, spec, field, c):
    addr = next(a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--health-addr="))
    host, port = addr.rsplit(":", 1)
    assert host == "0.0.0.0", "the kubelet probes the pod IP, not loopback"
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    assert ports.get("health") == int(port)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def collector_service():
    for doc in docs(K8S_DIR / "collector.yaml"):
        if doc["kind"] == "Service":
            return doc
    raise AssertionError("collector.yaml has no Service")


def uses_otlp(c: dict) -> bool:
    """Whether a gpulse container sends anything over OTLP (the default for both signals)."""
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    return any("otlp" in env.get(var, "otlp").split(",") for var in ("OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"))


@pytest.mark.parametrize("file,doc,spec,field,c", gpulse_containers())
def test_gpulse_sends_to_the_collector_service(file, doc, spec, field, c):
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if not uses_otlp(c):
        assert not any(k.startswith("OTEL_EXPORTER_OTLP_") for k in env), \
            "a Prometheus-only container names no OTLP endpoint (it would never be used)"
        return
    m = re.fullmatch(r"http://([^.:/]+)\.([^.:/]+)\.svc(?:\.cluster\.local)?:(\d+)", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert m, env["OTEL_EXPORTER_OTLP_ENDPOINT"]
    svc = collector_service()
    assert (m.group(1), m.group(2)) == (svc["metadata"]["name"], svc["metadata"]["namespace"])
    port = int(m.group(3))
    assert port in {p["port"] for p in svc["spec"]["ports"]}
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == {4317: "grpc", 4318: "http/protobuf"}[port]


def test_daemonset_runs_on_gpu_nodes_in_the_host_pid_namespace():
    found = docs(K8S_DIR / "daemonset.yaml")
    ds = next(d for d in found if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" for t in spec["tolerations"])
    sa = next(d for d in found if d["kind"] == "ServiceAccount")
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert spec.get("automountServiceAccountToken") is False, "gpulse calls no Kubernetes API"


def test_collector_manifest_carries_the_kubernetes_config_verbatim():
    found = docs(K8S_DIR / "collector.yaml")
    cm = next(d for d in found if d["kind"] == "ConfigMap")
    embedded = cm["data"]["config.yaml"]
    source = (REPO / "otel-config" / "kubernetes.yaml").read_text(encoding="utf-8")
    assert embedded == source, "examples/kubernetes/collector.yaml's ConfigMap differs from otel-config/kubernetes.yaml"
    assert collector_schema.validate(yaml.safe_load(embedded)) == []


def test_collector_rbac_covers_k8sattributes():
    found = docs(K8S_DIR / "collector.yaml")
    role = next(d for d in found if d["kind"] == "ClusterRole")
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for need in (("", "pods"), ("", "namespaces"), ("apps", "replicasets")):
        assert {"get", "watch", "list"} <= grants.get(need, set()), f"k8sattributes needs get/watch/list on {need}"
    assert all(set(v) <= {"get", "watch", "list"} for v in grants.values()), "read-only"
    binding = next(d for d in found if d["kind"] == "ClusterRoleBinding")
    dep = next(d for d in found if d["kind"] == "Deployment")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]


PROMETHEUS_ONLY = K8S_DIR / "daemonset-prometheus.yaml"


def prometheus_only_container() -> tuple[dict, dict]:
    ds = next(d for d in docs(PROMETHEUS_ONLY) if d["kind"] == "DaemonSet")
    return ds, next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpulse")


def test_dcgm_exporter_replacement_is_prometheus_only_on_port_9400():
    ds, c = prometheus_only_container()
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OTEL_METRICS_EXPORTER"] == "prometheus"
    assert env["OTEL_LOGS_EXPORTER"] == "none"
    assert not uses_otlp(c)
    assert env["OTEL_EXPORTER_PROMETHEUS_HOST"] == "0.0.0.0", "Prometheus scrapes the pod IP"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == int(env["OTEL_EXPORTER_PROMETHEUS_PORT"]) == 9400, "dcgm-exporter's port"
    assert "--prometheus-names=dcgm" in c["args"]
    assert not any(a.startswith("--prometheus-addr") for a in c["args"]), \
        "--prometheus-addr would override the OTEL_EXPORTER_PROMETHEUS_* address"
    # A replacement for daemonset.yaml, selected by the same PodMonitor.
    (main,) = [d for d in docs(K8S_DIR / "daemonset.yaml") if d["kind"] == "DaemonSet"]
    assert ds["metadata"] == main["metadata"]
    assert ds["spec"]["selector"] == main["spec"]["selector"]
    for path in (K8S_DIR / "prometheus-operator").glob("*.yaml"):
        for pm in (d for d in docs(path) if d["kind"] == "PodMonitor"):
            assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
            assert all(ep["port"] == "metrics" for ep in pm["spec"]["podMetricsEndpoints"])


def test_dcgm_exporter_replacement_serves_dcgm_names_and_connects_nowhere(tmp_path):
    """The manifest's own args and literal env, through the real binary against nvml-sim: /metrics
    carries DCGM_FI_* series on the OTEL_EXPORTER_PROMETHEUS_* address, a finding is still logged
    with the logs exporter off, and a listener set as the OTLP endpoint sees no connection. Only the port is moved to
    a free one (9400 may be taken) and the health address kept on loopback."""
    import socket
    import time
    import urllib.request

    binary = REPO / "target" / "debug" / "gpulse"
    sim = REPO / "target" / "debug" / "libnvidia_ml.so"
    if not (binary.exists() and sim.exists()):
        absent("target/debug/gpulse and libnvidia_ml.so are not built (cargo build --workspace)")
    _, c = prometheus_only_container()
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e and "$(" not in e["value"]}
    otlp = socket.socket()
    otlp.bind(("127.0.0.1", 0))
    otlp.listen()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(port)
    env["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
    # Were OTLP used, it would go here; the manifest names no endpoint, so this is a trap only.
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{otlp.getsockname()[1]}"
    scenario = tmp_path / "scenario.toml"
    # XID 79 half a second in: a hardware_errors finding, which with OTEL_LOGS_EXPORTER=none must
    # still reach the log and the /metrics findings gauge.
    scenario.write_text('[[device]]\nname = "NVIDIA H100 80GB HBM3"\n\n[device.signals]\ngpu_util = 62\n\n'
                        '[[event]]\nat_s = 0.5\ndevice = 0\nxid = 79\n')
    args = [a for a in c["args"] if not a.startswith("--health-addr")]
    args = [a.replace("--export-interval=10s", "--export-interval=1s") for a in args]
    log = tmp_path / "stderr.log"
    import subprocess
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [str(binary), "run", *args, "--nvml-lib", str(sim), "--kubelet-socket", "none"],
            env={"PATH": "/usr/bin:/bin", "NVML_SIM_SCENARIO": str(scenario), **env},
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        body, deadline = "", time.monotonic() + 60
        while "DCGM_FI_DEV_GPU_UTIL{" not in body or "finding started" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no DCGM series or no finding logged:\n{body}\n{log.read_text()}"
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
            time.sleep(0.2)
        util = [l for l in body.splitlines() if l.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        assert util and float(util[0].rsplit(" ", 1)[1]) == 62, util
        assert "XID 79" in log.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, log.read_text()
    otlp.setblocking(False)
    try:
        conn, peer = otlp.accept()
        raise AssertionError(f"gpulse connected to the OTLP trap from {peer}:\n{log.read_text()}")
    except BlockingIOError:
        pass
    assert "OTLP" not in log.read_text(), log.read_text()


def test_the_job_report_job_runs_gpulse_report_on_every_nodes_file_into_its_volume():
    (doc,) = docs(next(p for p in MANIFESTS if p.name == "job-report.yaml"))
    assert doc["kind"] == "Job" and doc["spec"]["backoffLimit"] == 0
    spec = pod_spec(doc)
    (c,) = spec["containers"]
    assert c["command"] == ["/usr/local/bin/gpulse"], "the image's entrypoint is `gpulse run`"
    args = c["args"]
    assert args[0] == "report" and "--job=$(JOB_ID)" in args, args
    files = [a for a in args[1:] if not a.startswith("-")]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    outputs = [a.split("=", 1)[1] for a in args if a.startswith(("-o=", "--json="))]
    assert len(files) >= 2 and len(outputs) == 2, args
    # Inputs and outputs on the shared volume: the root filesystem is read-only.
    assert all(any(p.startswith(m + "/") for m in mounts) for p in files + outputs), (args, mounts)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert "JOB_ID" in {e["name"] for e in c["env"]}
