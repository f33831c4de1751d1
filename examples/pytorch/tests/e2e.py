"""What the end-to-end tests share: gpulse's binaries, free ports, waiting on and stopping real
processes, and reading the OTLP/JSON lines otlp_sink.py writes.

Not a test module; imported by the ``test_*_e2e.py`` tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import EXAMPLE_DIR

REPO = EXAMPLE_DIR.parents[1]
TRAIN = EXAMPLE_DIR / "train.py"
SINK = EXAMPLE_DIR / "otlp_sink.py"


def fail_or_skip(what: str, reason: str) -> None:
    """Skips the test saying it did not run, or fails it under ``CI=true``."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {what} could not run: {reason}", pytrace=False)
    pytest.skip(f"{what} did NOT run: {reason}")


def built_binaries(what: str) -> Tuple[Path, Path]:
    """The gpulse binary and nvml-sim's library that ``cargo build --workspace`` makes."""
    gpulse_bin = Path(os.environ.get("GPULSE_BIN", REPO / "target" / "debug" / "gpulse"))
    sim_lib = Path(os.environ.get("NVML_SIM_LIB", REPO / "target" / "debug" / "libnvidia_ml.so"))
    for built in (gpulse_bin, sim_lib):
        if not built.exists():
            fail_or_skip(what, f"{built} is missing: run `cargo build --workspace` first")
    return gpulse_bin, sim_lib


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, watch=()):
    deadline = time.monotonic() + timeout
    while not predicate():
        for process in watch:
            assert process.poll() is None, f"{process.args[:2]} exited ({process.returncode}) {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s {what}"
        time.sleep(0.1)


def stop(process, timeout: float = 20.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_sink(out: Path) -> Tuple[subprocess.Popen, str]:
    """otlp_sink.py writing what it receives to ``out``, and its OTLP/HTTP endpoint, once it
    listens."""
    port_file = out.with_name(out.name + ".port")
    sink = subprocess.Popen(
        [sys.executable, str(SINK), "--out", str(out), "--port-file", str(port_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(port_file.exists, 30, "waiting for otlp_sink.py to listen", [sink])
    except BaseException:
        stop(sink)
        raise
    return sink, f"http://127.0.0.1:{int(port_file.read_text())}"


def flatten(attributes: List[dict]) -> Dict[str, object]:
    """OTLP/JSON attributes as a dict; ints as ints."""
    out = {}
    for kv in attributes:
        value = kv.get("value", {})
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                out[kv["key"]] = int(value[kind]) if kind == "intValue" else value[kind]
    return out


def requests(path: Path) -> Iterator[dict]:
    """Every request otlp_sink.py wrote, in the order it received them; a last line the sink is
    still writing (no newline yet) is left for the next read."""
    if not path.exists():
        return
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            yield json.loads(line)


def findings(path: Path) -> List[dict]:
    """Every finding log record the sink received, its attributes flattened."""
    found = []
    for request in requests(path):
        for resource_logs in request.get("resourceLogs", []):
            resource = flatten(resource_logs.get("resource", {}).get("attributes", []))
            for scope in resource_logs.get("scopeLogs", []):
                for record in scope.get("logRecords", []):
                    attributes = flatten(record.get("attributes", []))
                    if "gpulse.diagnosis.rule" in attributes:
                        found.append(
                            {"resource": resource, "attributes": attributes, "body": record}
                        )
    return found


def companion_env(service: str, receiver_port: int) -> Dict[str, str]:
    """The environment of a train.py process whose companion sends its spans (only) to gpulse's
    OTLP/HTTP receiver on ``receiver_port``, every 200 ms, with torch kept off any GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_SERVICE_NAME=service,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver_port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="200",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(EXAMPLE_DIR / "src"),
    )
    return env


def torchrun(
    tmp_path: Path,
    job: str,
    ranks: int,
    receiver_port: int,
    train_args: List[str],
    env: Dict[str, str] = None,
    node: Tuple[int, int, int] = None,
) -> subprocess.Popen:
    """``torchrun`` running train.py (the MLP under DDP, gloo on the CPU) with ``ranks`` ranks
    sending to gpulse's OTLP/HTTP receiver; each rank writes its PID to
    ``{tmp_path}/{job}-rank{rank}.pid`` and the output goes to ``{tmp_path}/{job}.log``.
    ``node``: ``(nodes, this node's rank, rendezvous port)`` for one node of a multi-node job
    (``ranks`` per node; its log is ``{job}-node{rank}.log``)."""
    runner = Path(sys.executable).parent / "torchrun"
    if not runner.exists():
        fail_or_skip(f"the {job} job", f"{runner} is missing (it comes with torch)")
    job_env = companion_env(job, receiver_port)
    job_env.update(env or {})
    launch = ["--rdzv-endpoint=127.0.0.1:0"]
    log_name = f"{job}.log"
    if node is not None:
        nodes, node_rank, port = node
        launch = [f"--nnodes={nodes}", f"--node-rank={node_rank}", f"--rdzv-endpoint=127.0.0.1:{port}"]
        log_name = f"{job}-node{node_rank}.log"
    with (tmp_path / log_name).open("w") as log:
        return subprocess.Popen(
            [
                str(runner),
                f"--nproc-per-node={ranks}",
                "--rdzv-backend=c10d",
                *launch,
                f"--rdzv-id={job}",
                str(TRAIN),
                "--model=mlp",
                "--batch-size=16",
                "--epochs=1",
                f"--pid-file={tmp_path}/{job}-rank{{rank}}.pid",
                *train_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=job_env,
            cwd=tmp_path,
        )


def rank_pids(tmp_path: Path, job: str, ranks: int, watch=()) -> List[int]:
    """The PIDs the ranks of ``job`` wrote (see ``torchrun``), once all have."""
    files = [tmp_path / f"{job}-rank{rank}.pid" for rank in range(ranks)]
    wait_until(lambda: all(f.exists() for f in files), 120, f"waiting for {job}'s ranks", watch)
    return [int(f.read_text()) for f in files]


def one_gpu_each(pid_envs: List[str], gpu_util: int = 80) -> str:
    """An nvml-sim scenario giving each process (its PID in the variable named) an H100 of its
    own, listed while the process runs."""
    devices = "".join(
        f"""
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-5e1f0000-0000-4000-8000-{index:012d}"
[device.signals]
gpu_util = {gpu_util}
power_w = 400
[[device.process]]
pid_env = "{pid_env}"
while_alive = true
name = "python"
memory_used_mib = 8192
sm_util = 70
"""
        for index, pid_env in enumerate(pid_envs)
    )
    return '[driver]\nversion = "550.54.15"\ncuda_version = "12.4"\n' + devices


def start_gpulse_on_sim(
    tmp_path: Path,
    name: str,
    pids: Dict[str, int],
    config: str,
    receiver_port: int,
    sink_endpoint: str,
    out: Path,
    what: str,
    extra_args: List[str] = (),
    scenario: Optional[str] = None,
    sample_interval: str = "200ms",
    env: Optional[Dict[str, str]] = None,
) -> subprocess.Popen:
    """``gpulse run`` on nvml-sim (``scenario``, by default one GPU per PID of ``pids``; the PIDs
    are passed in the variables named), its OTLP/HTTP receiver on ``receiver_port``, exporting
    every second to the sink; returns once the sink has its first export. Its log is
    ``{tmp_path}/{name}.log``. ``env``: more variables for gpulse (``OTEL_RESOURCE_ATTRIBUTES``
    with a ``host.name`` makes it stand in for a node of its own)."""
    extra_env = env
    gpulse_bin, sim_lib = built_binaries(what)
    (tmp_path / f"{name}-scenario.toml").write_text(scenario or one_gpu_each(list(pids)))
    (tmp_path / f"{name}.toml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        NVML_SIM_SCENARIO=str(tmp_path / f"{name}-scenario.toml"),
        GPULSE_KUBELET_SOCKET="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=sink_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    env.update({key: str(pid) for key, pid in pids.items()})
    env.update(extra_env or {})
    with (tmp_path / f"{name}.log").open("w") as log:
        gpulse = subprocess.Popen(
            [
                str(gpulse_bin),
                "run",
                "--config",
                str(tmp_path / f"{name}.toml"),
                "--nvml-lib",
                str(sim_lib),
                "--sample-interval",
                sample_interval,
                "--export-interval",
                "1s",
                "--otlp-receiver-http",
                str(receiver_port),
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    try:
        wait_until(
            lambda: out.exists() and '"resourceMetrics"' in out.read_text(),
            30,
            f"waiting for {name}'s first export",
            [gpulse],
        )
    except BaseException:
        stop(gpulse)
        raise
    return gpulse


def describe(records: List[dict]) -> str:
    """Findings one per line, for assertion messages."""
    return "\n".join(
        f"{r['attributes'].get('gpulse.diagnosis.rule')} "
        f"{r['attributes'].get('gpulse.diagnosis.state')} pid={r['resource'].get('process.pid')}: "
        f"{r['body'].get('body', {}).get('stringValue', '')}"
        for r in records
    )


def point_value(point: dict) -> float:
    """A number data point's value, double or int."""
    if "asDouble" in point:
        return float(point["asDouble"])
    return float(point.get("asInt", 0))


class MetricsWindow:
    """One metrics request gpulse exported, as the ledger's tests read it: each process's
    cumulative time and energy by ``gpulse.gpu.cause``, and each GPU's energy."""

    def __init__(self, request: dict):
        self.resources = request["resourceMetrics"]

    def process(self, pid: int) -> Optional[dict]:
        for resource in self.resources[1:]:
            if flatten(resource.get("resource", {}).get("attributes", [])).get("process.pid") == pid:
                return resource
        return None

    @staticmethod
    def points(resource: dict, name: str) -> List[dict]:
        return [
            point
            for scope in resource.get("scopeMetrics", [])
            for metric in scope.get("metrics", [])
            if metric["name"] == name
            for point in (metric.get("sum") or metric.get("gauge") or {}).get("dataPoints", [])
        ]

    def by_cause(self, pid: int, name: str) -> Dict[str, float]:
        """``name`` (``process.gpu.time`` or ``.energy``) of ``pid`` summed by cause."""
        sums: Dict[str, float] = {}
        for (cause, _), v in self.by_cause_and_rank(pid, name).items():
            sums[cause] = sums.get(cause, 0.0) + v
        return sums

    def by_cause_and_rank(self, pid: int, name: str) -> Dict[Tuple[str, Optional[int]], float]:
        """The same by (cause, ``gpulse.straggler.rank``)."""
        resource = self.process(pid)
        sums: Dict[Tuple[str, Optional[int]], float] = {}
        for point in self.points(resource, name) if resource else []:
            attributes = flatten(point["attributes"])
            key = (attributes["gpulse.gpu.cause"], attributes.get("gpulse.straggler.rank"))
            sums[key] = sums.get(key, 0.0) + point_value(point)
        return sums

    def held_span(self, pid: int) -> float:
        point = self.points(self.process(pid), "process.gpu.time")[0]
        return (int(point["timeUnixNano"]) - int(point["startTimeUnixNano"])) / 1e9

    def training(self, pid: int) -> bool:
        resource = self.process(pid)
        return bool(resource and self.points(resource, "gpulse.training.step.duration"))

    def device_energy(self, uuid: str) -> Tuple[float, float]:
        """(charged + unattributed, the device's own counter)."""
        node = self.resources[0]
        split = sum(
            point_value(p)
            for p in self.points(node, "gpulse.gpu.energy")
            if flatten(p["attributes"]).get("hw.id") == uuid
        )
        counter = [
            point_value(p)
            for p in self.points(node, "hw.energy")
            if flatten(p["attributes"]).get("hw.id") == uuid
        ]
        assert counter, f"no hw.energy for {uuid}"
        return split, counter[0]


def gpulse_report(what: str, files: List[Path], out_dir: Path, *args: str) -> Tuple[subprocess.CompletedProcess, Optional[dict]]:
    """``gpulse report FILES... -o OUT_DIR/job.html --json OUT_DIR/job.json ARGS``: the finished
    command (its summary on standard error) and the JSON, when it was written."""
    gpulse_bin, _ = built_binaries(what)
    html, js = out_dir / "job.html", out_dir / "job.json"
    for stale in (html, js):
        stale.unlink(missing_ok=True)
    done = subprocess.run(
        [str(gpulse_bin), "report", *map(str, files), "-o", str(html), "--json", str(js), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, (json.loads(js.read_text()) if js.exists() else None)
