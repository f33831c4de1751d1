"""The join, proven end to end: train.py's spans and gpulse's metrics of the same process meet.

Everything is real except the GPU: otlp_sink.py receives OTLP/HTTP from both sides; two
train.py jobs run on the CPU, each inside a real container cgroup (a Docker one, and a containerd
pod scope on the cgroup v2 hierarchy) and its own PID namespace (``unshare --pid --fork
--mount-proc``, so both are PID 1 inside and have other PIDs on the host); ``gpulse run`` (the
binary cargo built) samples nvml-sim, whose scenario lists the jobs' host PIDs and gives each a
GPU utilisation and memory that change in known steps. The test checks that both sides name the
process the same way (``container.id``, ``process.vpid``, ``host.name``, ``service.name``, and
``k8s.pod.uid`` for the pod), and that correlate.py's join gives each epoch span the utilisation
and memory the scenario held during that epoch, within what window edges allow.

Needs root (cgroups, namespaces), ``unshare`` and torch. Without them it is skipped with the
reason; under ``CI=true`` (CI runs as root, with torch) a skip would hide a broken proof, so it
fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from conftest import EXAMPLE_DIR, require_torch

import correlate

REPO = EXAMPLE_DIR.parents[1]
TRAIN = EXAMPLE_DIR / "train.py"
SINK = EXAMPLE_DIR / "otlp_sink.py"

SAMPLE_S = 0.1
EXPORT_S = 0.5
# Sim time 0 is gpulse's first NVML init; the test takes it from gpulse's first sample, which
# follows the init by less than this.
CLOCK_SLACK_S = 0.15
UUID = "GPU-7e57c0de-0000-4000-8000-00000000e2e1"

# (at_seconds, percent) steps of each job's sm_util and (at_seconds, MiB) of its memory. The two
# jobs differ everywhere, so a join that mixed them up would fail.
DOCKER_UTIL = [(0, 15), (5, 75), (10, 35), (15, 90), (20, 50), (25, 20)]
POD_UTIL = [(0, 60), (5, 10), (10, 80), (15, 30), (20, 65), (25, 5)]
DOCKER_MEM = [(0, 1024), (10, 3072), (20, 2048)]
POD_MEM = [(0, 512), (10, 1536), (20, 6144)]


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the end-to-end join could not run: {reason}", pytrace=False)
    pytest.skip(f"the end-to-end join did NOT run: {reason}")


def _steps_toml(steps: Sequence[Tuple[float, float]]) -> str:
    return "{ steps = [" + ", ".join(f"[{at}, {value}]" for at, value in steps) + "] }"


def scenario() -> str:
    return f"""
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{UUID}"

[device.signals]
gpu_util = 50

[[device.process]]
pid_env = "DOCKER_TRAINER_PID"
name = "python"
sm_util = {_steps_toml(DOCKER_UTIL)}
memory_used_mib = {_steps_toml(DOCKER_MEM)}

[[device.process]]
pid_env = "POD_TRAINER_PID"
name = "python"
sm_util = {_steps_toml(POD_UTIL)}
memory_used_mib = {_steps_toml(POD_MEM)}
"""


# -- the step functions, for the expected values ------------------------------------------------


def level_at(steps: Sequence[Tuple[float, float]], t: float) -> float:
    value = steps[0][1]
    for at, level in steps:
        if t >= at:
            value = level
    return value


def time_mean(steps: Sequence[Tuple[float, float]], start: float, end: float) -> float:
    """The mean of the step function over [start, end]."""
    cuts = sorted({start, end, *(at for at, _ in steps if start < at < end)})
    total = sum(level_at(steps, a) * (b - a) for a, b in zip(cuts, cuts[1:]))
    return total / (end - start)


def levels_in(steps: Sequence[Tuple[float, float]], start: float, end: float) -> List[float]:
    return [level_at(steps, start)] + [level for at, level in steps if start < at <= end]


def util_tolerance(steps, start: float, end: float) -> float:
    """How far an overlap-weighted mean of windowed points can be from the true mean.

    A window cut by the span's edge averages samples from outside it, and the clock estimate can
    be off: each step within a window's reach of the span can move the mean by at most its jump
    times that reach over the span's length. Far from any step the only error is rounding.
    """
    reach = EXPORT_S + SAMPLE_S + CLOCK_SLACK_S
    tolerance = 0.01
    for (at, level), (_, before) in zip(steps[1:], steps):
        if start - reach <= at <= end + reach:
            tolerance += abs(level - before) / 100 * reach / (end - start)
    return tolerance


# -- processes ----------------------------------------------------------------------------------


def _cgroup_bases() -> Optional[Tuple[Optional[Path], Path]]:
    """(cgroup v1 memory hierarchy or None, cgroup v2 hierarchy), or None when not writable."""
    root = Path("/sys/fs/cgroup")
    v2 = root / "unified" if (root / "unified" / "cgroup.procs").exists() else root
    if not (v2 / "cgroup.controllers").exists() and v2 == root:
        return None
    v1 = root / "memory" if (root / "memory" / "cgroup.procs").exists() else None
    return v1, v2


class Cgroups:
    """Directories the test made, removed deepest first once their processes are gone."""

    def __init__(self) -> None:
        self.made: List[Path] = []

    def create(self, base: Path, relative: str) -> Path:
        path = base
        for part in relative.split("/"):
            path = path / part
            if not path.exists():
                path.mkdir()
                self.made.append(path)
        return path

    def remove(self) -> None:
        for path in reversed(self.made):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)  # the last process is still leaving


@dataclass
class Trainer:
    name: str
    cgroup: Path
    container_id: str
    pod_uid: Optional[str]
    service: str
    process: subprocess.Popen
    log: Path
    host_pid: int = 0


def host_child(parent: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise AssertionError(f"unshare ({parent}) did not fork the trainer within {timeout:.0f}s")


def start_trainer(tmp: Path, name, cgroup, container_id, pod_uid, endpoint, go) -> Trainer:
    service = f"e2e-{name}-trainer"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_SERVICE_NAME=service,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        CUDA_VISIBLE_DEVICES="",  # the CPU path, even on a machine with a GPU
        PYTHONPATH=str(EXAMPLE_DIR / "src"),
    )
    log = tmp / f"{name}.log"
    # The shell joins the cgroup and then becomes unshare, so everything from the first
    # instruction of Python on runs in the container's cgroup and its own PID namespace.
    command = [
        "sh",
        "-c",
        'echo $$ > "$0/cgroup.procs" && exec "$@"',
        str(cgroup),
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        sys.executable,
        str(TRAIN),
        "--start-after",
        str(go),
        "--epochs",
        "4",
        "--steps-per-epoch",
        "5",
        "--batch-size",
        "16",
        "--sleep-per-step",
        "0.45",
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    trainer = Trainer(name, cgroup, container_id, pod_uid, service, process, log)
    trainer.host_pid = host_child(process.pid)
    return trainer


def stop(process: Optional[subprocess.Popen], sig=signal.SIGTERM, timeout=20.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until(predicate, timeout: float, what: str, watch: Sequence[subprocess.Popen] = ()):
    deadline = time.monotonic() + timeout
    while not predicate():
        for process in watch:
            assert process.poll() is None, f"{process.args[0]} exited ({process.returncode}) {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s {what}"
        time.sleep(0.05)


def requests(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the test -----------------------------------------------------------------------------------


def test_epoch_spans_join_the_gpu_metrics_gpulse_measured_for_the_same_process(tmp_path):
    require_torch()
    if os.geteuid() != 0:
        _fail_or_skip("not root (cgroups and PID namespaces need it; CI runs as root)")
    bases = _cgroup_bases()
    if bases is None:
        _fail_or_skip("no writable cgroup v2 hierarchy under /sys/fs/cgroup")
    if shutil.which("unshare") is None:
        _fail_or_skip("unshare (util-linux) is not installed")
    gpulse_bin = Path(os.environ.get("GPULSE_BIN", REPO / "target" / "debug" / "gpulse"))
    sim_lib = Path(os.environ.get("NVML_SIM_LIB", REPO / "target" / "debug" / "libnvidia_ml.so"))
    for built in (gpulse_bin, sim_lib):
        if not built.exists():
            _fail_or_skip(f"{built} is missing: run `cargo build --workspace` first")
    v1, v2 = bases

    docker_id = uuid.uuid4().hex + uuid.uuid4().hex
    pod_uid = str(uuid.uuid4())
    cri_id = uuid.uuid4().hex + uuid.uuid4().hex
    cgroups = Cgroups()
    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    sink = gpulse = None
    trainers: List[Trainer] = []
    try:
        if v1 is not None:
            docker_cgroup = cgroups.create(v1, f"docker/{docker_id}")
        else:
            docker_cgroup = cgroups.create(v2, f"system.slice/docker-{docker_id}.scope")
        slice_uid = pod_uid.replace("-", "_")
        pod_cgroup = cgroups.create(
            v2,
            "kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{cri_id}.scope",
        )

        port_file = tmp_path / "port"
        sink = subprocess.Popen(
            [sys.executable, str(SINK), "--out", str(out), "--port-file", str(port_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        wait_until(port_file.exists, 30, "waiting for otlp_sink.py to listen", [sink])
        endpoint = f"http://127.0.0.1:{int(port_file.read_text())}"

        for name, cgroup, cid, pod in (
            ("docker", docker_cgroup, docker_id, None),
            ("pod", pod_cgroup, cri_id, pod_uid),
        ):
            trainers.append(start_trainer(tmp_path, name, cgroup, cid, pod, endpoint, go))
        docker, pod = trainers
        for trainer in trainers:
            status = Path(f"/proc/{trainer.host_pid}/status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            assert nspid.split()[1:] == [str(trainer.host_pid), "1"], nspid

        scenario_file = tmp_path / "scenario.toml"
        scenario_file.write_text(scenario())
        gpulse_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        gpulse_env.update(
            NVML_SIM_SCENARIO=str(scenario_file),
            DOCKER_TRAINER_PID=str(docker.host_pid),
            POD_TRAINER_PID=str(pod.host_pid),
            GPULSE_KUBELET_SOCKET="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        )
        gpulse_log = tmp_path / "gpulse.log"
        with gpulse_log.open("w") as log:
            gpulse = subprocess.Popen(
                [
                    str(gpulse_bin),
                    "run",
                    "--nvml-lib",
                    str(sim_lib),
                    "--sample-interval",
                    f"{int(SAMPLE_S * 1000)}ms",
                    "--export-interval",
                    f"{int(EXPORT_S * 1000)}ms",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=gpulse_env,
            )
        wait_until(
            lambda: any("resourceMetrics" in r for r in requests(out)),
            30,
            "waiting for gpulse's first export",
            [gpulse],
        )
        go.touch()
        for trainer in trainers:
            try:
                trainer.process.wait(150)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{trainer.name} trainer still running after 150 s: {trainer.log}")
            assert trainer.process.returncode == 0, trainer.log.read_text()[-3000:]
        time.sleep(2 * EXPORT_S)
        stop(gpulse)
        assert gpulse.returncode == 0, gpulse_log.read_text()[-3000:]
        stop(sink)
    finally:
        for trainer in trainers:
            stop(trainer.process, signal.SIGKILL)
            try:
                os.kill(trainer.host_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        stop(gpulse)
        stop(sink)
        cgroups.remove()

    telemetry = correlate.load([str(out)])
    host = socket.gethostname()

    def gpulse_resource(trainer: Trainer) -> Dict[str, object]:
        found = [
            p.resource
            for p in telemetry.points
            if p.metric == correlate.UTILIZATION
            and p.resource.get("process.pid") == trainer.host_pid
        ]
        assert found, f"gpulse exported no utilisation for the {trainer.name} trainer's host PID"
        return found[0]

    def span_resource(trainer: Trainer) -> Dict[str, object]:
        found = [
            s.resource
            for s in telemetry.spans
            if s.name == "epoch" and s.resource.get("service.name") == trainer.service
        ]
        assert len(found) == 4, f"{trainer.name}: expected 4 epoch spans, got {len(found)}"
        return found[0]

    for trainer in trainers:
        metric_side, span_side = gpulse_resource(trainer), span_resource(trainer)
        for key, expected in (
            ("container.id", trainer.container_id),
            ("process.vpid", 1),
            ("host.name", host),
            ("service.name", trainer.service),
            ("k8s.pod.uid", trainer.pod_uid),
        ):
            assert metric_side.get(key) == expected, (trainer.name, "gpulse", key, metric_side)
            assert span_side.get(key) == expected, (trainer.name, "spans", key, span_side)
        # Inside its namespace the job is PID 1; gpulse also says where it is on the host.
        assert span_side.get("process.pid") == 1
        assert metric_side.get("process.pid") == trainer.host_pid != 1

    # Sim time 0: the init just before gpulse's first sample, whose time starts its first window.
    t0 = min(p.start_ns for p in telemetry.points if p.metric.startswith("hw.") and p.start_ns)
    rows = correlate.correlate(telemetry)
    assert len(rows) == 8, correlate.format_table(rows)
    report = correlate.format_table(rows)
    spread = {}
    for trainer, util, memory in ((docker, DOCKER_UTIL, DOCKER_MEM), (pod, POD_UTIL, POD_MEM)):
        mine = [r for r in rows if r.span.resource.get("service.name") == trainer.service]
        assert [r.span.attributes.get("training.epoch") for r in mine] == [0, 1, 2, 3]
        expected_means = []
        for row in mine:
            start = (row.span.start_ns - t0) / 1e9
            end = (row.span.end_ns - t0) / 1e9
            where = (
                f"{trainer.name} epoch {row.span.attributes['training.epoch']} "
                f"[{start:.2f}s, {end:.2f}s]\n{report}"
            )
            assert row.process == f"{trainer.container_id[:12]}/1", where
            assert row.gpu == UUID, where
            assert row.coverage is not None and row.coverage > 0.6, where
            expected = time_mean(util, start, end) / 100
            expected_means.append(expected)
            tolerance = util_tolerance(util, start, end)
            assert row.util_mean == pytest.approx(expected, abs=tolerance), where
            reach = EXPORT_S + SAMPLE_S + CLOCK_SLACK_S
            inner = levels_in(
                util, start + SAMPLE_S + CLOCK_SLACK_S, end - SAMPLE_S - CLOCK_SLACK_S
            )
            outer = levels_in(util, start - reach, end + reach)
            assert max(inner) / 100 - 0.005 <= row.util_max <= max(outer) / 100 + 0.005, where
            peak_mib = row.gpu_mem_peak_bytes / 1048576
            inside = levels_in(memory, start + CLOCK_SLACK_S, end - CLOCK_SLACK_S)
            around = levels_in(memory, start - reach, end + reach)
            assert max(inside) <= peak_mib <= max(around), where
        spread[trainer.name] = max(expected_means) - min(expected_means)
    # Epochs that saw different utilisation got different figures: the check has teeth.
    assert max(spread.values()) > 0.15, (spread, report)
    print(
        f"\nsim time 0 = {correlate.iso_time(t0)}; per-epoch expected utilisation spread {spread}"
    )
    print(report)
