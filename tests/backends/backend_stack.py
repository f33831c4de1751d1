"""Helpers of the end-to-end tests against the real backends (tests/backends): the
OpenTelemetry Collector (otelcol-gpulse), Prometheus and Jaeger that scripts/backends builds, and
`gpulse run` against nvml-sim with real processes as the GPU processes.

Everything listens on free 127.0.0.1 ports and is stopped at the end (SIGTERM, then SIGKILL).
A missing backend binary skips with the command that builds it; under CI=true it FAILS instead.
Each started program's output goes to a log file whose tail is put into the failure message, so
a failure says what the program itself said.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "node.toml"
APP = HERE / "app.py"
BACKENDS_DIR = Path(os.environ.get("GPULSE_BACKENDS_DIR", Path.home() / ".cache" / "gpulse" / "backends"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))

# gpulse's diagnosis, shortened so the idle_holder finding of node.toml starts within seconds.
GPULSE_CONFIG = """
[diagnosis]
clear_after_windows = 2

[diagnosis.history]
max_windows = 5

[diagnosis.idle_holder]
min_duration = "2s"
"""

# How long a backend may take to show data on a loaded 2-core machine. Polled, not slept.
DATA_TIMEOUT_S = 90.0


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def absent(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this is required, not optional)")
    pytest.skip(f"NOT CHECKED: {reason}")


def backend(name: str) -> Path:
    path = BACKENDS_DIR / "bin" / name
    if not os.access(path, os.X_OK):
        absent(f"{path} is missing: build the backends with `scripts/backends` "
               f"(pinned Go modules; the first build takes tens of minutes on 2 cores, later runs are cached)")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """One started program: its output in `log`, stopped by `stop()` (SIGTERM, then SIGKILL)."""

    def __init__(self, name, argv, log_dir: Path, env=None, cwd=None, stdin=None, preexec_fn=None, unset=()):
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.argv = [str(a) for a in argv]
        full_env = {k: v for k, v in os.environ.items() if k not in unset}
        full_env.update(env or {})
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                          cwd=cwd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                          preexec_fn=preexec_fn)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines=40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def check_alive(self):
        code = self.popen.poll()
        if code is not None:
            pytest.fail(f"{self.name} exited with {code}:\n{self.tail()}")

    def stop(self, timeout=15.0):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


class Stack:
    """The programs of one test module, stopped in reverse start order at teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[Proc] = []

    def start(self, name, argv, **kw) -> Proc:
        proc = Proc(name, argv, self.tmp, **kw)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}):\n{p.tail(15)}" for p in self.procs)

    def stop_all(self):
        for proc in reversed(self.procs):
            proc.stop()

    def wait_until(self, what, probe, timeout=DATA_TIMEOUT_S, interval=0.5):
        """Polls `probe()` until it returns something truthy; fails with every log otherwise."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for p in self.procs:
                p.check_alive()
            try:
                result = probe()
            except (OSError, urllib.error.URLError, ValueError, KeyError, IndexError, AssertionError) as e:
                result, last = None, e
            if result:
                return result
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last!r})\n{self.logs()}")


def http_get(url, timeout=5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def http_get_json(url, timeout=5.0):
    return json.loads(http_get(url, timeout))


def http_ok(url) -> bool:
    try:
        http_get(url, timeout=2.0)
        return True
    except (OSError, urllib.error.URLError):
        return False


# ---------------------------------------------------------------------------------------------
# Programs


def gpulse_paths():
    gpulse = TARGET / "debug" / "gpulse"
    lib = TARGET / "debug" / "libnvidia_ml.so"
    for p in (gpulse, lib):
        if not p.exists():
            pytest.fail(f"{p} is missing: run `cargo build --workspace` first (scripts/test does)")
    return gpulse, lib


def start_gpulse(stack: Stack, workloads, env: dict, args=(), name="gpulse") -> Proc:
    """`gpulse run` on node.toml, sampling every 200 ms and exporting every second."""
    gpulse, lib = gpulse_paths()
    config = stack.tmp / "gpulse.toml"
    config.write_text(GPULSE_CONFIG)
    full_env = {
        "NVML_SIM_SCENARIO": str(SCENARIO),
        "GPULSE_BACKENDS_TRAINER": str(workloads.trainer.pid),
        "GPULSE_BACKENDS_IDLE": str(workloads.idle.pid),
        "GPULSE_KUBELET_SOCKET": "none",
        "GPULSE_LOG": "info",
        "OTEL_SERVICE_NAME": "gpulse",
    }
    full_env.update(env)
    # Only what the test sets: no OTLP settings or resource attributes from the caller's shell.
    unset = [k for k in os.environ if k.startswith(("OTEL_", "GPULSE_"))]
    return stack.start(name, [gpulse, "run", "--nvml-lib", lib, "--config", config, "--sample-interval", "200ms",
                              "--export-interval", "1s", *args], env=full_env, unset=unset)


PROMETHEUS_OTLP = {
    # What a gpulse user promotes (docs/prometheus.md, "Prometheus 3 without a Collector"): the per-process
    # resource attributes that tell GPU processes apart and join them to their workload.
    "promote_resource_attributes": [
        "service.name", "service.namespace", "service.instance.id", "host.name",
        "container.id", "process.pid", "process.vpid", "process.executable.name",
        "k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name", "k8s.node.name", "k8s.container.name",
        "gpulse.job.id",
    ],
}


def start_prometheus(stack: Stack, scrape_targets=(), otlp=False, remote_write=False, name="prometheus",
                     rule_files=()):
    """Prometheus on a free port; returns (proc, base URL). Scrapes `scrape_targets` every second
    and evaluates the rules of `rule_files` every second."""
    binary = backend("prometheus")
    port = free_port()
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    if scrape_targets:
        # honor_labels as examples/compose/prometheus.yml: keep the collector's job/instance.
        config["scrape_configs"] = [{"job_name": "otel-collector", "honor_labels": True,
                                     "static_configs": [{"targets": list(scrape_targets)}]}]
    if otlp:
        config["otlp"] = PROMETHEUS_OTLP
    path = stack.tmp / f"{name}.yml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    argv = [binary, f"--config.file={path}", f"--storage.tsdb.path={stack.tmp / (name + '-data')}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    if otlp:
        argv.append("--web.enable-otlp-receiver")
    if remote_write:
        argv.append("--web.enable-remote-write-receiver")
    proc = stack.start(name, argv)
    base = f"http://127.0.0.1:{port}"
    stack.wait_until(f"{name} to be ready", lambda: http_ok(f"{base}/-/ready"), timeout=60)
    return proc, base


def promql(base, query):
    """An instant query; the result vector, or the error Prometheus gave."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        body = http_get_json(url)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise AssertionError(f"PromQL {query!r} failed: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def start_jaeger(stack: Stack):
    """Jaeger v2 all-in-one with in-memory storage; returns (proc, OTLP gRPC address, query URL)."""
    binary = backend("jaeger")
    otlp, query_http, query_grpc, health = (free_port() for _ in range(4))
    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                     "exporters": ["jaeger_storage_exporter"]}},
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
        },
        "extensions": {
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health}"}},
            "jaeger_query": {"storage": {"traces": "memstore"},
                             "http": {"endpoint": f"127.0.0.1:{query_http}"},
                             "grpc": {"endpoint": f"127.0.0.1:{query_grpc}"}},
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 10000}}}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{otlp}"}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }
    path = stack.tmp / "jaeger.yaml"
    path.write_text(json.dumps(config, indent=1))
    proc = stack.start("jaeger", [binary, "--config", path])
    query = f"http://127.0.0.1:{query_http}"
    stack.wait_until("jaeger's query API", lambda: http_ok(f"{query}/api/services"), timeout=60)
    return proc, f"127.0.0.1:{otlp}", query


def start_collector(stack: Stack, config: Path, name="collector", env=None, overrides=(), cwd=None):
    """otelcol-gpulse running `config` AS SHIPPED, except for what `overrides` (--set) changes:
    the listen addresses move to free loopback ports (the shipped files bind 0.0.0.0 on fixed
    ports, which would collide between collectors and with anything else on the machine) and the
    collector's own telemetry is off (it would also take a fixed port, 8888). Returns (proc, ports)
    with ports = {"grpc", "http", "health", and "prometheus" when the config has that exporter}."""
    binary = backend("otelcol-gpulse")
    text = config.read_text()
    ports = {"grpc": free_port(), "http": free_port(), "health": free_port()}
    sets = [f"receivers::otlp::protocols::grpc::endpoint=127.0.0.1:{ports['grpc']}",
            f"receivers::otlp::protocols::http::endpoint=127.0.0.1:{ports['http']}",
            "service::telemetry::metrics::level=none"]
    if re.search(r"^\s+health_check:", text, re.M):
        sets.append(f"extensions::health_check::endpoint=127.0.0.1:{ports['health']}")
    if re.search(r"^  prometheus:", text, re.M):
        ports["prometheus"] = free_port()
        sets.append(f"exporters::prometheus::endpoint=127.0.0.1:{ports['prometheus']}")
    sets.extend(overrides)
    argv = [binary, "--config", config.resolve()] + [f"--set={s}" for s in sets]
    proc = stack.start(name, argv, env=env, cwd=cwd)
    if "health_check" in text:
        stack.wait_until(f"{name} health check", lambda: http_ok(f"http://127.0.0.1:{ports['health']}/"), timeout=60)
    else:
        stack.wait_until(f"{name} OTLP/HTTP port", lambda: port_open(ports["http"]), timeout=60)
    return proc, ports


def port_open(port) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------------------
# The GPU processes: real processes, the trainer in a Kubernetes pod's cgroup (cgroup v2)


def cgroup2_root() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


class Workloads:
    """The trainer (tests/backends/app.py, OTEL_SERVICE_NAME=resnet-training, in a pod cgroup
    kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope) and an idle sleeper."""

    def __init__(self, stack: Stack):
        root = cgroup2_root()
        if os.geteuid() != 0 or root is None or not os.access(root, os.W_OK):
            absent("the trainer must run in a real pod cgroup: needs root and a writable cgroup v2 "
                   "hierarchy (CI runs as root)")
        self.pod_uid = str(uuid.uuid4())
        self.container_id = uuid.uuid4().hex + uuid.uuid4().hex
        slice_ = f"kubepods-burstable-pod{self.pod_uid.replace('-', '_')}.slice"
        self.cgroup_dirs = [root / "kubepods.slice", root / "kubepods.slice" / "kubepods-burstable.slice",
                            root / "kubepods.slice" / "kubepods-burstable.slice" / slice_]
        leaf = self.cgroup_dirs[-1] / f"cri-containerd-{self.container_id}.scope"
        self.cgroup_dirs.append(leaf)
        self.created = []
        for d in self.cgroup_dirs:
            if not d.exists():
                d.mkdir()
                self.created.append(d)
        procs_file = leaf / "cgroup.procs"

        def join_pod():  # in the child, before exec: the trainer starts inside its container
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))

        self.trainer = stack.start("trainer", [sys.executable, APP], stdin=subprocess.PIPE, preexec_fn=join_pod,
                                   env={"OTEL_SERVICE_NAME": "resnet-training", "PYTHONUNBUFFERED": "1"})
        self.idle = stack.start("idle-holder", ["sleep", "3600"], env={"OTEL_SERVICE_NAME": "forgotten-notebook"})

    def send_span(self, receiver_url: str) -> dict:
        """Asks the trainer to send one span to `receiver_url` (OTLP/HTTP); returns what it sent."""
        self.trainer.popen.stdin.write(f"send {receiver_url}\n".encode())
        self.trainer.popen.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in self.trainer.log.read_text().splitlines():
                if line.startswith("{") and receiver_url in line:
                    sent = json.loads(line)
                    if "error" in sent:
                        pytest.fail(f"the trainer could not send its span: {sent['error']}")
                    return sent
            time.sleep(0.2)
        pytest.fail(f"the trainer did not report sending its span:\n{self.trainer.tail()}")

    def remove_cgroups(self):
        for d in reversed(self.created):
            try:
                d.rmdir()
            except OSError:
                pass


def otlp_http_env(base: str) -> dict:
    return {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": base}
