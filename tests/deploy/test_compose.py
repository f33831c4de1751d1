"""examples/compose/: the compose file validated against the compose-spec JSON schema (shipped in
check-jsonschema as vendor.compose-spec, offline), then cross-checked with the files it mounts:
every bind source exists, the collector runs one of otel-config/ and that config is valid,
Prometheus scrapes the port the collector's prometheus exporter serves, gpulse sends to a port
the collector listens on, and Grafana's provisioning points at the mounted dashboard folder.
No Docker engine runs here, so nothing is started."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import collector_schema
from conftest import REPO, absent

COMPOSE_DIR = REPO / "examples" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yaml"


def check_jsonschema() -> str:
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    if not Path(exe).exists():
        pytest.fail("check-jsonschema not installed: run .ci/install-deploy-tools.sh")
    return exe


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def binds(service):
    for v in service.get("volumes", []):
        src, target, *mode = v.split(":")
        yield src, target, mode


def test_compose_file_matches_the_compose_spec():
    r = subprocess.run([check_jsonschema(), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_schema_rejects_a_bad_file(tmp_path, compose):
    # Control: a misspelt service key must fail, or the check above proves nothing.
    bad = dict(compose)
    bad["services"] = dict(compose["services"])
    bad["services"]["gpulse"] = dict(compose["services"]["gpulse"], read_onyl=True)
    f = tmp_path / "docker-compose.yaml"
    f.write_text(yaml.safe_dump(bad))
    r = subprocess.run([check_jsonschema(), "--builtin-schema", "vendor.compose-spec", str(f)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "read_onyl" in r.stdout + r.stderr


def test_the_whole_stack_is_there(compose):
    assert {"trainer", "gpulse", "otel-collector", "prometheus", "grafana", "jaeger"} <= set(compose["services"])


def test_gpulse_service_is_hardened_and_sees_host_pids(compose):
    g = compose["services"]["gpulse"]
    assert g["pid"] == "host"
    assert g["read_only"] is True
    assert g["user"].split(":")[0] == "65532"
    assert g["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in g["security_opt"]
    assert not g.get("privileged") and g.get("network_mode") != "host"
    devices = g["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu", "utility"]}]
    assert (COMPOSE_DIR / g["build"]["context"] / g["build"]["dockerfile"]).resolve() == (REPO / "Dockerfile").resolve()


def test_bind_mount_sources_exist(compose):
    for name, svc in compose["services"].items():
        for src, target, mode in binds(svc):
            if src.startswith((".", "/")):
                assert (COMPOSE_DIR / src).exists(), f"{name}: bind source {src} does not exist"
                assert mode == ["ro"], f"{name}: {src} should be mounted read-only"


def test_trainer_runs_the_pytorch_example(compose):
    t = compose["services"]["trainer"]
    src = next(s for s, target, _ in binds(t) if target == "/opt/pytorch")
    assert (COMPOSE_DIR / src).resolve() == (REPO / "examples" / "pytorch").resolve()
    assert "train.py" in " ".join(t["command"])
    if not (REPO / "examples" / "pytorch" / "train.py").is_file():
        absent("examples/pytorch/train.py (another helper's) does not exist yet")
    assert t["environment"]["OTEL_SERVICE_NAME"]


def collector_config(compose):
    c = compose["services"]["otel-collector"]
    src = next(s for s, target, _ in binds(c) if target.endswith("config.yaml"))
    path = (COMPOSE_DIR / src).resolve()
    assert path.parent == (REPO / "otel-config").resolve()
    return collector_schema.load(path)


def test_collector_runs_a_valid_project_config(compose):
    assert collector_schema.validate(collector_config(compose)) == []


def test_prometheus_scrapes_the_collector_exporter(compose):
    cfg = collector_config(compose)
    port = cfg["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"otel-collector:{port}" in targets


def test_otlp_senders_reach_the_collector(compose):
    cfg = collector_config(compose)
    listen = {p: c["endpoint"].rsplit(":", 1)[1] for p, c in cfg["receivers"]["otlp"]["protocols"].items()}
    for name in ("gpulse", "trainer"):
        env = compose["services"][name]["environment"]
        m = re.fullmatch(r"http://([\w-]+):(\d+)", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert m and m.group(1) == "otel-collector"
        proto = {"http/protobuf": "http", "grpc": "grpc"}[env["OTEL_EXPORTER_OTLP_PROTOCOL"]]
        assert listen[proto] == m.group(2), f"{name} sends {proto} to {m.group(2)}, the collector listens on {listen[proto]}"


def test_collector_exports_to_services_in_the_stack(compose):
    cfg = collector_config(compose)
    for eid, e in cfg["exporters"].items():
        if "endpoint" in e and not eid.startswith("prometheus"):
            host = re.sub(r"^\w+://", "", e["endpoint"]).split(":")[0]
            assert host in compose["services"], f"{eid} sends to {host}, not a service of this stack"


def test_grafana_provisioning_points_at_the_mounts(compose):
    g = compose["services"]["grafana"]
    mounts = {target: src for src, target, _ in binds(g)}
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    prov = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/dashboards.yaml").read_text())
    path = prov["providers"][0]["options"]["path"]
    assert path in mounts and (COMPOSE_DIR / mounts[path] / "gpulse.json").is_file()
    home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/gpulse.json"
    ds = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/datasources.yaml").read_text())
    for d in ds["datasources"]:
        host = re.sub(r"^\w+://", "", d["url"]).split(":")[0]
        assert host in compose["services"], f"data source {d['name']} points at {host}"
