"""The ledger end to end: a real training loop with known phases, the companion, ``gpulse run``.

train.py (the MLP on the CPU, the companion sending its spans to gpulse's own OTLP/HTTP receiver)
runs steps of known phases: its DataLoader sleeps 0.20 s producing each batch (``data_wait``), and
the step then sleeps 0.35 s, the 0.30 s of "GPU work" and 0.05 s of host work the scenario's GPU
utilisation follows: nvml-sim's GPU 0 (where the scenario puts the trainer's real PID) is idle
0.20 s, busy 0.30 s and idle 0.05 s of every 0.55 s. GPU 1 holds a ``sleep`` that never sends
a span, 30 % busy. gpulse exports to otlp_sink.py every second.

Over the windows in which the trainer is in steady training, the ledger's causes of the
trainer's ``process.gpu.time`` are each within 5 points (of the held time) of the known shares
(input_wait 0.20/0.55, compute 0.30/0.55, host 0.05/0.55), compute within 5 % of its own, and in
every window the causes add up to the held time and, per GPU, charged + unattributed energy to
the device's counter, within 1 %.
The process without the companion gets only compute and idle time (30 % / 70 %).

No root needed. Needs torch and the binaries ``cargo build --workspace`` makes; without them it
is skipped with the reason, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLE_DIR, require_torch
from e2e import (
    TRAIN,
    MetricsWindow,
    built_binaries,
    free_port,
    requests,
    start_sink,
    stop,
    wait_until,
)

WHAT = "the ledger end-to-end test"
DATA_WAIT = 0.20
GPU_WORK = 0.30
HOST = 0.05
STEP = DATA_WAIT + GPU_WORK + HOST
KNOWN = {
    "input_wait": DATA_WAIT / STEP,
    "compute": GPU_WORK / STEP,
    "host": HOST / STEP,
}
STEPS = 50
TRAINER_GPU = "GPU-1ed9e500-0000-4000-8000-000000000000"
PLAIN_GPU = "GPU-1ed9e500-0000-4000-8000-000000000001"


def phases(over_seconds: float) -> str:
    """A steps signal idle for DATA_WAIT, busy for GPU_WORK, idle for HOST, period after period."""
    points = []
    t = 0.0
    while t < over_seconds:
        points += [[round(t, 3), 0], [round(t + DATA_WAIT, 3), 100], [round(t + DATA_WAIT + GPU_WORK, 3), 0]]
        t += STEP
    return "{ steps = " + repr(points) + " }"


def power(over_seconds: float) -> str:
    points = []
    t = 0.0
    while t < over_seconds:
        points += [[round(t, 3), 100], [round(t + DATA_WAIT, 3), 500], [round(t + DATA_WAIT + GPU_WORK, 3), 100]]
        t += STEP
    return "{ steps = " + repr(points) + " }"


def scenario() -> str:
    over = 300.0
    return f"""
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{TRAINER_GPU}"
[device.signals]
gpu_util = {phases(over)}
power_w = {power(over)}
[[device.process]]
pid_env = "LEDGER_TRAINER_PID"
name = "python"
memory_used_mib = 4096
sm_util = {phases(over)}

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{PLAIN_GPU}"
[device.signals]
gpu_util = 30
power_w = 300
[[device.process]]
pid_env = "LEDGER_PLAIN_PID"
name = "sleep"
memory_used_mib = 1024
sm_util = 30
"""


def close(a: float, b: float, relative: float) -> bool:
    return abs(a - b) <= relative * max(abs(a), abs(b)) + 1e-9


def test_a_training_loop_lands_in_its_known_causes_and_everything_adds_up(tmp_path):
    require_torch()
    gpulse_bin, sim_lib = built_binaries(WHAT)
    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    receiver_port = free_port()
    sink = gpulse = trainer = plain = None
    try:
        sink, sink_endpoint = start_sink(out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            OTEL_SERVICE_NAME="ledger-trainer",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver_port}",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_BSP_SCHEDULE_DELAY="200",
            CUDA_VISIBLE_DEVICES="",
            PYTHONPATH=str(EXAMPLE_DIR / "src"),
        )
        with (tmp_path / "trainer.log").open("w") as log:
            trainer = subprocess.Popen(
                [
                    sys.executable,
                    str(TRAIN),
                    "--model=mlp",
                    "--batch-size=16",
                    "--epochs=1",
                    f"--steps-per-epoch={STEPS}",
                    f"--data-delay={DATA_WAIT}",
                    f"--sleep-per-step={GPU_WORK + HOST}",
                    f"--pid-file={tmp_path}/trainer.pid",
                    f"--start-after={go}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
            )
        plain = subprocess.Popen(["sleep", "300"])
        pid_file = tmp_path / "trainer.pid"
        wait_until(pid_file.exists, 120, "waiting for the trainer to start", [trainer])
        trainer_pid = int(pid_file.read_text())

        (tmp_path / "scenario.toml").write_text(scenario())
        gpulse_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        gpulse_env.update(
            NVML_SIM_SCENARIO=str(tmp_path / "scenario.toml"),
            GPULSE_KUBELET_SOCKET="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=sink_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            LEDGER_TRAINER_PID=str(trainer_pid),
            LEDGER_PLAIN_PID=str(plain.pid),
        )
        with (tmp_path / "gpulse.log").open("w") as log:
            gpulse = subprocess.Popen(
                [
                    str(gpulse_bin),
                    "run",
                    "--nvml-lib",
                    str(sim_lib),
                    "--sample-interval",
                    "100ms",
                    "--export-interval",
                    "1s",
                    "--otlp-receiver-http",
                    str(receiver_port),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=gpulse_env,
            )
        wait_until(
            lambda: out.exists() and '"resourceMetrics"' in out.read_text(),
            30,
            "waiting for gpulse's first export",
            [gpulse],
        )
        go.touch()
        try:
            trainer.wait(180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the trainer still runs after 180 s: {tmp_path / 'trainer.log'}")
        assert trainer.returncode == 0, (tmp_path / "trainer.log").read_text()[-3000:]
        stop(gpulse)
        assert gpulse.returncode == 0, (tmp_path / "gpulse.log").read_text()[-3000:]
        stop(sink)
    finally:
        for process in (trainer, plain, gpulse, sink):
            stop(process)

    windows = [MetricsWindow(r) for r in requests(out) if "resourceMetrics" in r]
    windows = [w for w in windows if w.process(trainer_pid) and w.process(plain.pid)]
    assert len(windows) > 10, f"{len(windows)} windows with both processes"

    # It adds up, in every window: the causes are the held time, and per GPU the charged and
    # unattributed energy are what the device's counter says it used.
    for w in windows:
        for pid in (trainer_pid, plain.pid):
            held = sum(w.by_cause(pid, "process.gpu.time").values())
            span = w.held_span(pid)
            assert close(held, span, 0.01), f"pid {pid}: causes {held} s, held {span} s"
        for uuid in (TRAINER_GPU, PLAIN_GPU):
            split, counter = w.device_energy(uuid)
            assert close(split, counter, 0.01), f"{uuid}: {split} J against the counter's {counter} J"

    # The trainer in steady training: from its third window with step figures to the one before
    # its last (the first steps warm up; the last window may end after its last step).
    training = [w for w in windows if w.training(trainer_pid)]
    assert len(training) >= 12, f"only {len(training)} windows of training"
    first, last = training[2], training[-2]
    time_first = first.by_cause(trainer_pid, "process.gpu.time")
    time_last = last.by_cause(trainer_pid, "process.gpu.time")
    delta = {c: time_last.get(c, 0.0) - time_first.get(c, 0.0) for c in time_last}
    held = sum(delta.values())
    shares = {c: v / held for c, v in delta.items() if v > 0}
    report = ", ".join(f"{c} {s:.3f}" for c, s in sorted(shares.items()))
    print(f"trainer over {held:.1f} s of steady training: {report}; known {KNOWN}")
    for cause, known in KNOWN.items():
        assert abs(shares.get(cause, 0.0) - known) <= 0.05, f"{cause}: {report}"
    # Compute is the GPU's own busy share, which the scenario fixes: within 5 % of itself. The
    # loop's own work on the CPU (the MLP's forward and backward, the telemetry: tens of ms a
    # step) lengthens its real step beyond 0.55 s, which lowers input_wait's share and raises
    # host's, as it should: that is host time.
    assert close(shares.get("compute", 0.0), KNOWN["compute"], 0.05), report
    assert set(shares) <= set(KNOWN) | {"idle"}, report
    assert shares.get("idle", 0.0) <= 0.05, report
    # The energy of its busy time is compute's: the waits and host held an idle GPU.
    energy_first = first.by_cause(trainer_pid, "process.gpu.energy")
    energy_last = last.by_cause(trainer_pid, "process.gpu.energy")
    energy = {c: energy_last.get(c, 0.0) - energy_first.get(c, 0.0) for c in energy_last}
    assert energy.get("compute", 0.0) > 0, energy
    assert sum(v for c, v in energy.items() if c != "compute") <= 0.01 * sum(energy.values()), energy

    # Without the companion: compute and idle only, by its 30 % activity.
    plain_time = windows[-1].by_cause(plain.pid, "process.gpu.time")
    assert set(plain_time) <= {"compute", "idle", "unknown"}, plain_time
    plain_held = sum(plain_time.values())
    assert close(plain_time["compute"], 0.3 * plain_held, 0.02), plain_time
    assert close(plain_time["idle"], 0.7 * plain_held, 0.02), plain_time
