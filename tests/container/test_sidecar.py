"""examples/kubernetes/sidecar.yaml played by `podman kube play`: the trainer (the example app
image running examples/pytorch/train.py with the companion) and gpulse share the pod's PID
namespace and network; the trainer sends its spans to gpulse's receiver, gpulse forwards them
enriched to the real Collector, with the GPU metrics of the trainer under its service.name.

The pod runs WITHOUT the host's /proc, as the manifest says a PodSecurity-restricted namespace
must: NVML's host PID of the trainer is not visible, and gpulse matches it by the /dev/nvidia0 the
trainer holds open. The device is a stand-in: a character device node named nvidia0 with
/dev/null's numbers (1:3), which the default device cgroup lets a container open. What only a
real GPU shows: that the NVIDIA runtime mounts the real nodes and that NVML lists the trainer
on the GPU whose minor it holds (nvml-sim lists it because the scenario says so).

What the test changes in the manifest, each because podman 4.3 is not a kubelet or this machine
has no GPU, is listed in `playable_pod`; everything else (securityContext, env, args, the
shared PID namespace) is played as shipped."""

import os
import re
import uuid
from pathlib import Path

import pytest
import yaml

from engine import (
    APP_IMAGE,
    GPULSE_IMAGE,
    HOST_FROM_CONTAINER,
    NVML_IN_CONTAINER,
    REPO,
    build_images,
    host_and_ns_pid,
    inspect,
    metric_resources,
    nvml_sim,
    otlp_lines,
    podman,
    span_resources,
    wait_until,
)

SIDECAR = REPO / "examples" / "kubernetes" / "sidecar.yaml"
TRAINER_UID = 1000
TRAINER_GID = 1000
TORCH_PYTHON = Path(os.environ.get("GPULSE_TORCH_PYTHON", Path.home() / ".cache/gpulse/venvs/torch/bin/python"))


@pytest.fixture(scope="session")
def app_image(gpulse_image):
    build_images("app")
    return APP_IMAGE


def torch_site() -> Path:
    """torch is not in the app image (docs/deploy.md: ~5 GB of CUDA wheels per image copy); the
    test venv's site-packages is mounted read-only instead, as a training image would carry it."""
    found = sorted(TORCH_PYTHON.parent.parent.glob("lib/python3.*/site-packages"))
    if not found or not (found[0] / "torch").is_dir():
        pytest.fail(f"no torch under {TORCH_PYTHON.parent.parent}: run scripts/setup-test-env")
    return found[0]


def playable_pod(pod_name: str, tmp: Path, collector_port: int, gpulse_uid: int, gpulse_gid: int) -> dict:
    job = yaml.safe_load(SIDECAR.read_text())
    template = job["spec"]["template"]
    spec = template["spec"]
    # 1. podman plays Pods, not Jobs: the Job's pod template, as the Job controller would create it.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "labels": template["metadata"]["labels"]},
           "spec": spec}
    # 2. podman 4.3 runs initContainers to completion first: the native sidecar becomes a container
    #    (started before the trainer by the test, as the kubelet would start it).
    gpulse = next(c for c in spec.pop("initContainers") if c["name"] == "gpulse")
    gpulse.pop("restartPolicy")
    trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
    spec["containers"] = [gpulse, trainer]
    # 3. No GPU node, no NVIDIA runtime: no runtime class, node selector, tolerations or GPU request.
    for key in ("runtimeClassName", "nodeSelector", "tolerations"):
        spec.pop(key)
    trainer["resources"]["limits"].pop("nvidia.com/gpu")
    if not trainer["resources"]["limits"]:
        trainer.pop("resources")
    # 4. Without the host's /proc and the kubelet socket: the restricted-namespace variant the
    #    manifest describes ("drop both volumes and their mounts").
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in ("host-proc", "pod-resources")]
    gpulse["volumeMounts"] = []
    gpulse["env"] = [e for e in gpulse["env"] if e["name"] != "HOST_PROC"]
    # 5. podman runs httpGet probes as curl INSIDE the container; the image has neither curl nor a
    #    shell, by design. The health endpoint is served all the same.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        gpulse.pop(probe)
    # 6. Local images, the Collector on the host, shorter intervals for a short test.
    gpulse["image"] = GPULSE_IMAGE
    trainer["image"] = APP_IMAGE
    env = {e["name"]: e for e in gpulse["env"]}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] = f"http://{HOST_FROM_CONTAINER}:{collector_port}"
    gpulse["args"] = [a for a in gpulse["args"] if not a.startswith(("--sample-interval", "--export-interval"))]
    gpulse["args"] += ["--sample-interval=250ms", "--export-interval=2s", "--kubelet-socket=none"]
    # 7. NVML: nvml-sim where the NVIDIA toolkit mounts the driver's library, and its scenario.
    spec["volumes"] += [
        {"name": "nvml", "hostPath": {"path": str(nvml_sim()), "type": "File"}},
        {"name": "nvml-scenario", "hostPath": {"path": str(tmp / "scenario"), "type": "Directory"}},
        {"name": "nvidia0", "hostPath": {"path": str(tmp / "dev" / "nvidia0"), "type": "CharDevice"}},
        {"name": "torch", "hostPath": {"path": str(torch_site()), "type": "Directory"}},
        {"name": "go", "hostPath": {"path": str(tmp / "go"), "type": "Directory"}},
    ]
    gpulse["volumeMounts"] += [
        {"name": "nvml", "mountPath": NVML_IN_CONTAINER, "readOnly": True},
        {"name": "nvml-scenario", "mountPath": "/etc/nvml-sim", "readOnly": True},
    ]
    gpulse["env"].append({"name": "NVML_SIM_SCENARIO", "value": "/etc/nvml-sim/scenario.toml"})
    # 10. podman 4.3's Downward API knows metadata.name but not the node, namespace or pod uid:
    #     those are given literally, as the kubelet would fill them in.
    literal = {"spec.nodeName": os.uname().nodename, "metadata.namespace": "default",
               "metadata.uid": str(uuid.uuid4())}
    for e in gpulse["env"]:
        path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if path in literal:
            e.pop("valueFrom")
            e["value"] = literal[path]
    #     Nor does it expand $(VAR) references to earlier variables; the kubelet does.
    values = {}
    for e in gpulse["env"]:
        if "value" in e:
            e["value"] = re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), e["value"])
            values[e["name"]] = e["value"]
    # 8. The uid and gid gpulse runs as: the trainer's (the documented minimum for the
    #    device-file match) or the manifest's 65532.
    gpulse["securityContext"]["runAsUser"] = gpulse_uid
    gpulse["securityContext"]["runAsGroup"] = gpulse_gid
    # 9. The trainer: holds the stand-in /dev/nvidia0 open for its whole life (fd 3), waits for the
    #    test to say go (gpulse is up by then), trains long enough to span several export windows.
    trainer["volumeMounts"] = [
        {"name": "nvidia0", "mountPath": "/dev/nvidia0"},
        {"name": "torch", "mountPath": "/opt/torch-site", "readOnly": True},
        {"name": "go", "mountPath": "/go", "readOnly": True},
    ]
    trainer["env"].append({"name": "PYTHONPATH", "value": "/opt/torch-site"})
    trainer["command"] = ["sh", "-c", "exec 3</dev/nvidia0; exec python3 /workspace/examples/pytorch/train.py "
                          "--epochs=2 --steps-per-epoch=8 --sleep-per-step=0.4 --device=cpu "
                          "--start-after=/go/go --start-timeout=300"]
    assert trainer["securityContext"]["runAsUser"] == TRAINER_UID
    assert trainer["securityContext"]["runAsGroup"] == TRAINER_GID
    return pod


def scenario_for(host_pid: int) -> str:
    return f"""
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-5e1dcafe-0000-4000-8000-000000000001"
memory_total_mib = 81559
minor = 0

[device.signals]
gpu_util = 70

[[device.process]]
pid = {host_pid}
name = "python3"
sm_util = 65
memory_used_mib = 3072
"""


def play(tmp: Path, collector_port: int, gpulse_uid: int, gpulse_gid: int):
    """Creates the pod, starts the trainer, writes the scenario naming the trainer's HOST PID
    (what NVML would report), then starts gpulse. Returns (pod, trainer, gpulse) names."""
    pod = f"gpulse-test-sidecar-{uuid.uuid4().hex[:8]}"
    for d in ("scenario", "dev", "go"):
        (tmp / d).mkdir(exist_ok=True)
    os.mknod(tmp / "dev" / "nvidia0", 0o666 | 0o020000, os.makedev(1, 3))
    os.chmod(tmp / "dev" / "nvidia0", 0o666)
    manifest = tmp / "pod.yaml"
    manifest.write_text(yaml.safe_dump(playable_pod(pod, tmp, collector_port, gpulse_uid, gpulse_gid), sort_keys=False))
    podman("kube", "play", "--start=false", manifest, timeout=180)
    trainer, gpulse = f"{pod}-trainer", f"{pod}-gpulse"
    podman("start", trainer)
    host_pid, pod_pid = wait_until("the trainer's python process",
                                   lambda: _python_of(trainer), timeout=60, logs=lambda: logs(trainer))
    (tmp / "scenario" / "scenario.toml").write_text(scenario_for(host_pid))
    podman("start", gpulse)
    wait_until("gpulse to start", lambda: " starting " in logs(gpulse), timeout=60, logs=lambda: logs(gpulse))
    return pod, trainer, gpulse, host_pid, pod_pid


def _python_of(trainer):
    try:
        return host_and_ns_pid(trainer, "python3")
    except AssertionError:
        return None


def logs(ctr):
    r = podman("logs", ctr, check=False)
    return f"--- podman logs {ctr}:\n{(r.stdout + r.stderr)[-5000:]}"


def run_training(tmp, trainer, gpulse):
    (tmp / "go" / "go").touch()
    wait_until("the trainer to finish", lambda: inspect(trainer, "{{.State.Status}}") == "exited",
               timeout=240, interval=1.0, logs=lambda: logs(trainer) + "\n" + logs(gpulse))
    assert inspect(trainer, "{{.State.ExitCode}}") == "0", logs(trainer)


def trainer_metrics(otlp, host_pid):
    for res, names in metric_resources(otlp_lines(otlp)):
        if str(res.get("process.pid")) == str(host_pid) and "process.gpu.memory.usage" in names:
            return res
    return None


def enriched_spans(otlp):
    out = []
    for res, spans in span_resources(otlp_lines(otlp)):
        if res.get("service.name") != "train-cnn":
            continue
        for span in spans:
            keys = {a["key"] for a in span.get("attributes", [])}
            if any(k.startswith("gpulse.gpu.") for k in keys):
                out.append((res, span))
    return out


def test_sidecar_with_the_trainers_uid_joins_spans_and_gpu_metrics(app_image, collector, tmp_path):
    port, otlp = collector
    pod, trainer, gpulse, host_pid, pod_pid = play(tmp_path, port, gpulse_uid=TRAINER_UID, gpulse_gid=TRAINER_GID)
    try:
        run_training(tmp_path, trainer, gpulse)
        container_id = inspect(trainer, "{{.Id}}")
        res = wait_until("the trainer's GPU metrics", lambda: trainer_metrics(otlp, host_pid),
                         timeout=60, logs=lambda: logs(gpulse))
        assert res.get("service.name") == "train-cnn", res
        assert res.get("container.id") == container_id, res
        assert str(res.get("process.vpid")) == str(pod_pid), res
        spans = wait_until("enriched spans of train-cnn", lambda: enriched_spans(otlp), timeout=60,
                           logs=lambda: logs(gpulse))
        span_res, span = spans[0]
        # The join key: container.id + process.pid on the app's side = container.id + process.vpid on gpulse's.
        assert span_res.get("container.id") == res["container.id"], span_res
        assert str(span_res.get("process.pid")) == str(res["process.vpid"]), span_res
        assert "cannot read /proc/<pid>/fd" not in logs(gpulse)
        assert inspect(gpulse, "{{.State.Running}}") == "true", logs(gpulse)
    finally:
        podman("pod", "rm", "-f", pod, check=False, timeout=60)


def test_sidecar_without_the_privilege_says_what_is_missing_and_keeps_exporting(app_image, collector, tmp_path):
    port, otlp = collector
    pod, trainer, gpulse, host_pid, _ = play(tmp_path, port, gpulse_uid=65532, gpulse_gid=65532)
    try:
        run_training(tmp_path, trainer, gpulse)
        text = logs(gpulse)
        warnings = [line for line in text.splitlines() if "cannot read /proc/<pid>/fd" in line]
        assert len(warnings) == 1, text
        assert "runAsUser" in warnings[0] and "CAP_SYS_PTRACE" in warnings[0], warnings[0]
        res = wait_until("the GPU process, unattributed", lambda: trainer_metrics(otlp, host_pid),
                         timeout=60, logs=lambda: logs(gpulse))
        assert "container.id" not in res and res.get("service.name") != "train-cnn", res
        devices = [n for _, names in metric_resources(otlp_lines(otlp)) for n in names if n == "hw.gpu.utilization"]
        assert devices, "the device metrics stopped too"
        spans = [s for r, s in span_resources(otlp_lines(otlp)) if r.get("service.name") == "train-cnn"]
        assert spans, "the trainer's spans were not forwarded"
    finally:
        podman("pod", "rm", "-f", pod, check=False, timeout=60)
