"""Helpers of the tests against a real container engine (podman): running podman with the
project's settings, the images scripts/image builds, a busybox image for stand-in workloads, and
the real Collector (otelcol-gpulse) listening where containers reach it.

Podman runs rootful with tests/container/containers.conf (cgroupfs, runc, ulimits: what works on
hybrid-cgroup CI machines). Every container and pod is named `gpulse-test-...` and removed at the
end. Where the engine cannot run, the tests skip with the command that installs it, and FAIL under
CI=true (backend_stack.absent)."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests" / "backends"))

from backend_stack import TARGET, absent, free_port, start_collector  # noqa: E402,F401

CONTAINERS_CONF = HERE / "containers.conf"
GPULSE_IMAGE = "localhost/gpulse:dev"
APP_IMAGE = "localhost/gpulse-train:dev"
BUSYBOX_IMAGE = "localhost/gpulse-test/busybox:latest"
# Where the NVIDIA container toolkit mounts the driver's NVML on Debian/Ubuntu hosts.
NVML_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
# What a container reaches the host by (podman >= 4.1 writes it into /etc/hosts).
HOST_FROM_CONTAINER = "host.containers.internal"


def podman_env() -> dict:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(*args, check=True, timeout=120, input=None) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *map(str, args)], capture_output=True, text=True, env=podman_env(),
                       timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}{r.stdout}")
    return r


def require_engine():
    if shutil.which("podman") is None:
        absent("podman is not installed: apt-get install podman runc (and debootstrap busybox-static "
               "for the bases): the deployment tests run the image in a real engine")
    if os.geteuid() != 0:
        absent("the container tests run rootful podman: run them as root")
    r = podman("run", "--rm", BUSYBOX_IMAGE_OR_BUILD(), "/bin/busybox", "true", check=False)
    if r.returncode != 0:
        absent(f"podman cannot run a container here: {r.stderr.strip()}")


def BUSYBOX_IMAGE_OR_BUILD() -> str:  # noqa: N802 (reads as the image it returns)
    """A one-file image: Debian's static busybox, the stand-in workload of the node-agent tests."""
    if podman("image", "exists", BUSYBOX_IMAGE, check=False).returncode == 0:
        return BUSYBOX_IMAGE
    busybox = Path("/bin/busybox")
    if not busybox.exists() or not _is_static(busybox):
        absent("/bin/busybox (static) is missing: apt-get install busybox-static")
    work = Path(f"/tmp/gpulse-busybox-{uuid.uuid4().hex[:8]}")
    (work / "bin").mkdir(parents=True)
    shutil.copy2(busybox, work / "bin" / "busybox")
    (work / "bin" / "sh").symlink_to("busybox")
    (work / "tmp").mkdir(mode=0o1777)
    tar = subprocess.run(["tar", "-C", str(work), "-c", "."], capture_output=True, check=True).stdout
    r = subprocess.run(["podman", "import", "--quiet", "-", BUSYBOX_IMAGE], input=tar, capture_output=True,
                       env=podman_env())
    shutil.rmtree(work)
    assert r.returncode == 0, f"podman import of busybox failed: {r.stderr.decode(errors='replace')}"
    return BUSYBOX_IMAGE


def _is_static(path: Path) -> bool:
    r = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    return "not a dynamic executable" in (r.stdout + r.stderr)


def gpulse_binary() -> Path:
    """The binary the image is built from: CI's release build when there is one (.ci/run builds it
    before the tests), else the debug build scripts/test made."""
    for profile in ("release", "debug"):
        path = TARGET / profile / "gpulse"
        if path.is_file():
            return path
    absent("no gpulse binary in target/: run cargo build --workspace (or --release)")


def build_images(*targets: str) -> None:
    env = podman_env()
    env["GPULSE_IMAGE_BINARY"] = str(gpulse_binary())
    r = subprocess.run([str(REPO / "scripts" / "image"), *targets], capture_output=True, text=True, env=env,
                       timeout=1800)
    if r.returncode != 0:
        raise AssertionError(f"scripts/image {' '.join(targets)} failed ({r.returncode}):\n{r.stderr}{r.stdout}")


def nvml_sim() -> Path:
    path = TARGET / "debug" / "libnvidia_ml.so"
    if not path.is_file():
        absent(f"{path} is missing: run cargo build --workspace")
    return path


def name(kind: str) -> str:
    return f"gpulse-test-{kind}-{uuid.uuid4().hex[:8]}"


def inspect(container: str, fmt: str) -> str:
    return podman("inspect", "--format", fmt, container).stdout.strip()


def host_and_ns_pid(container: str, process: str) -> tuple[int, int]:
    """(host PID, PID in the container's namespace) of the container's process whose command
    starts with `process`, as podman itself reports them (`podman top ... hpid pid args`)."""
    out = podman("top", container, "hpid", "pid", "args").stdout.splitlines()[1:]
    for line in out:
        hpid, pid, args = line.split(None, 2)
        if args.startswith(process):
            return int(hpid), int(pid)
    raise AssertionError(f"no process {process!r} in {container}: {out}")


def wait_until(what, probe, timeout=90.0, interval=0.5, logs=lambda: ""):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()}")


def otlp_lines(path: Path) -> list[dict]:
    """The OTLP/JSON lines the Collector's file exporter wrote so far."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def attrs(kvs) -> dict:
    out = {}
    for kv in kvs or []:
        v = kv.get("value", {})
        out[kv["key"]] = next(iter(v.values()), None) if v else None
    return out


def metric_resources(lines: list[dict]) -> list[tuple[dict, list[str]]]:
    """(resource attributes, metric names) of every ResourceMetrics received."""
    out = []
    for line in lines:
        for rm in line.get("resourceMetrics", []):
            names = [m["name"] for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", [])]
            out.append((attrs(rm.get("resource", {}).get("attributes")), names))
    return out


def span_resources(lines: list[dict]) -> list[tuple[dict, list[dict]]]:
    out = []
    for line in lines:
        for rs in line.get("resourceSpans", []):
            spans = [s for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])]
            out.append((attrs(rs.get("resource", {}).get("attributes")), spans))
    return out
