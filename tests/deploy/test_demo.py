"""scripts/demo, the README's first command: it must exit 0 when everything worked, and show what
gpulse is for within its run: the idle notebook kernel and the thermally throttled training GPU,
each with evidence and advice, both in the snapshot and among the log records `gpulse run`
exports; and GPM activity consistent with the GPU's utilisation. A failure must exit non-zero
and name the step that failed."""

import os
import re
import subprocess

import pytest

# The build is done by scripts/test before the Python suites; alone, a first build takes minutes.
TIMEOUT_S = 900


def run_demo(repo, **env):
    return subprocess.run([str(repo / "scripts" / "demo")], cwd=repo, capture_output=True,
                          text=True, timeout=TIMEOUT_S, env={**os.environ, **env})


@pytest.fixture(scope="module")
def demo(repo):
    proc = run_demo(repo)
    assert proc.returncode == 0, (
        f"scripts/demo exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    assert "$ gpulse run" in proc.stdout, proc.stdout
    snapshot, run = proc.stdout.split("$ gpulse run", 1)
    return snapshot, run


def process_rows(snapshot):
    """(gpu, pid, memory MiB, SM %) of the snapshot's process table."""
    rows = re.findall(r"^(\d+)\s+(\d+)\s+\S+\s+C\s+(\d+)MiB\s+(\d+)%", snapshot, re.M)
    return [(int(g), int(p), int(m), int(sm)) for g, p, m, sm in rows]


def finding_block(text, start):
    """The lines of the finding that starts at `start`, up to the next finding."""
    rest = text[start:]
    end = re.search(r"\n  (\[|finding )", rest[1:])
    return rest if end is None else rest[:end.start() + 1]


def test_snapshot_names_the_idle_notebook_kernel_with_evidence_and_advice(demo):
    snapshot, _ = demo
    idle = [pid for gpu, pid, mib, sm in process_rows(snapshot) if gpu == 1 and mib == 6144 and sm == 0]
    assert len(idle) == 1, f"no idle 6 GiB process on GPU 1 in the table:\n{snapshot}"
    m = re.search(rf"\[warning\] idle_holder: pid {idle[0]} \(\S+\) on GPU 1 holds 6\.0 GiB with 0% "
                  r"utilisation for \d+s", snapshot)
    assert m, f"no idle_holder finding for pid {idle[0]}:\n{snapshot}"
    block = finding_block(snapshot, m.start())
    assert "evidence from: the driver (NVML), the kernel (/proc, cgroups)" in block, block
    assert "what to do: " in block and "restart the notebook kernel" in block, block


def test_snapshot_names_the_throttled_training_gpu(demo):
    snapshot, _ = demo
    m = re.search(r"\[warning\] throttling: GPU 0 \(GPU-[0-9a-f-]+\) throttled: sw_thermal_slowdown "
                  r"100% of the window, up to (\d+) °C", snapshot)
    assert m, snapshot
    assert int(m.group(1)) >= 85, m.group(0)
    block = finding_block(snapshot, m.start())
    assert "evidence from: the driver (NVML)" in block and "check cooling" in block, block
    assert "Window of " in snapshot and "samples)" in snapshot, snapshot


def test_gpm_activity_agrees_with_utilisation(demo):
    snapshot, _ = demo
    gpu0 = re.search(r"^0\s+NVIDIA.*?\s(\d+)%\s+(\d+)%\s+\d+/\d+\n\s+activity: SM (\d+)%\s+occupancy "
                     r"(\d+)%\s+tensor (\d+)%\s+DRAM (\d+)%", snapshot, re.M)
    assert gpu0, snapshot
    util, _, sm, occupancy, tensor, dram = map(int, gpu0.groups())
    assert util >= 80, gpu0.group(0)
    # SM activity is the share of SMs busy, GPU-Util whether any kernel ran: busy but below it.
    assert 40 <= sm < util and 0 < occupancy <= sm and tensor > 0 and dram > 0, gpu0.group(0)


def test_run_exports_both_findings_as_log_records(demo):
    snapshot, run = demo
    idle = [pid for gpu, pid, mib, sm in process_rows(snapshot) if gpu == 1 and mib == 6144 and sm == 0]
    metric_requests = re.findall(r"^request \d+: \d+ resources, \d+ data points$", run, re.M)
    assert len(metric_requests) >= 3, run
    m = re.search(rf"finding started \[warning\] idle_holder on service \S+ pid {idle[0]}: ", run)
    assert m, run
    block = finding_block(run, m.start())
    assert re.search(r"evidence \(nvml,procfs\): gpu_memory_bytes=6442450944, .*idle_seconds=", block), block
    assert "what to do: " in block, block
    m = re.search(r"finding started \[warning\] throttling on node \S+: GPU 0 .*throttled: "
                  r"sw_thermal_slowdown", run)
    assert m, run
    block = finding_block(run, m.start())
    assert "evidence (nvml): sw_thermal_slowdown_ratio=1" in block and "what to do: " in block, block


def test_a_failing_step_exits_non_zero_and_says_which(repo, tmp_path):
    proc = run_demo(repo, NVML_SIM_SCENARIO=str(tmp_path / "missing.toml"))
    assert proc.returncode != 0, proc.stdout
    assert "scripts/demo: gpulse snapshot failed (exit 2" in proc.stderr, proc.stderr
    assert "missing.toml" in proc.stderr, proc.stderr
