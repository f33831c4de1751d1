"""One report for a job spread over two nodes: real torchrun, the companion, two ``gpulse run``.

Two torchrun agents stand in for two nodes (ranks 0-1 on ``node-a``, 2-3 on ``node-b``, one
rendezvous, gloo on the CPU, train.py's MLP under DDP with the companion's comm hook). Each node
has its own ``gpulse run`` on nvml-sim (its own scenario listing its own ranks' real PIDs, its
own ``host.name``) and its own OTLP/JSON lines file (otlp_sink.py, a Collector file exporter's
format). Two jobs run at once on the same nodes:

- ``slow-job``: rank 3's DataLoader sleeps 0.3 s a batch; the other ranks wait for it in their
  all-reduce. Node A alone cannot tell why its ranks wait (rank 3 is not there).
- ``even-job``: the same job, same steps, no slowdown: the rerun the what-if is checked against.

``gpulse report node-a.jsonl node-b.jsonl --job ID`` must name rank 3 on node-b as the straggler
with cause ``data_wait``, book ranks 0-2's collective wait as ``straggler_wait`` naming rank 3,
hold all four ranks in its JSON, and estimate the GPU-hours saved at the median pace within 15 %
of what the even rerun actually saved; the even job has no straggler and no straggler_wait. The
HTML is rendered in headless Chromium and the screenshot kept beside the test's files. Bad
inputs (a truncated file, two jobs without --job, a file of another format) are clear errors
naming the file and line, and lose nothing else.

No root needed. Needs torch, chromium and the binaries ``cargo build --workspace`` makes; without
them it is skipped with the reason, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import require_torch
from e2e import (
    fail_or_skip,
    free_port,
    gpulse_report,
    rank_pids,
    start_gpulse_on_sim,
    start_sink,
    stop,
    torchrun,
)

WHAT = "the job report end-to-end test"
NODES = ("node-a", "node-b")
RANKS_PER_NODE = 2
SLOW_RANK = 3
STEPS = 40
DATA_DELAY = 0.3
SLEEP_PER_STEP = 0.1
JOBS = ("slow-job", "even-job")

# The per-node rules need not decide anything here; keep them quiet and quick.
CONFIG = """
[diagnosis]
clear_after_windows = 2

[diagnosis.idle_holder]
enabled = false
"""


def env_name(job: str, rank: int) -> str:
    return f"{job.replace('-', '_').upper()}_RANK{rank}_PID"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Dict[str, object]:
    """Both jobs run to the end on both nodes; returns the two nodes' files and the PIDs."""
    require_torch()
    tmp = tmp_path_factory.mktemp("job-report")
    go = tmp / "go"
    outs = [tmp / f"{node}.jsonl" for node in NODES]
    receivers = [free_port(), free_port()]
    agents: List[subprocess.Popen] = []
    gpulses: List[subprocess.Popen] = []
    sinks: List[subprocess.Popen] = []
    try:
        endpoints = []
        for out in outs:
            sink, endpoint = start_sink(out)
            sinks.append(sink)
            endpoints.append(endpoint)
        rendezvous = {job: free_port() for job in JOBS}
        for job in JOBS:
            slow = [f"--data-delay={DATA_DELAY}", f"--slow-rank={SLOW_RANK}"] if job == "slow-job" else []
            for node in range(len(NODES)):
                agents.append(
                    torchrun(
                        tmp,
                        job,
                        RANKS_PER_NODE,
                        receivers[node],
                        [
                            f"--steps-per-epoch={STEPS}",
                            f"--sleep-per-step={SLEEP_PER_STEP}",
                            f"--start-after={go}",
                            *slow,
                        ],
                        node=(len(NODES), node, rendezvous[job]),
                    )
                )
        ranks = RANKS_PER_NODE * len(NODES)
        pids = {job: rank_pids(tmp, job, ranks, agents) for job in JOBS}
        for node, name in enumerate(NODES):
            mine = range(RANKS_PER_NODE * node, RANKS_PER_NODE * (node + 1))
            gpulses.append(
                start_gpulse_on_sim(
                    tmp,
                    f"gpulse-{name}",
                    {env_name(job, r): pids[job][r] for job in JOBS for r in mine},
                    CONFIG,
                    receivers[node],
                    endpoints[node],
                    outs[node],
                    WHAT,
                    env={"OTEL_RESOURCE_ATTRIBUTES": f"host.name={name}"},
                )
            )
        go.touch()
        for agent in agents:
            try:
                agent.wait(240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"a torchrun agent still runs after 240 s; logs in {tmp}")
            assert agent.returncode == 0, "\n".join(p.read_text()[-2000:] for p in tmp.glob("*-node*.log"))
        time.sleep(2)
        for process in gpulses + sinks:
            stop(process)
        for process in gpulses:
            assert process.returncode == 0, (tmp / "gpulse-node-a.log").read_text()[-3000:]
    finally:
        for process in agents + gpulses + sinks:
            stop(process)
    return {"tmp": tmp, "outs": outs, "pids": pids}


def report_of(two_nodes, job: str, *extra: str) -> dict:
    done, report = gpulse_report(WHAT, two_nodes["outs"], two_nodes["tmp"], "--job", job, *extra)
    assert done.returncode == 0, done.stderr
    assert report is not None, done.stderr
    report["_text"] = done.stderr
    return report


def by_cause(report: dict) -> Dict[tuple, float]:
    return {(c["cause"], c["straggler_rank"]): c["gpu_hours"] for c in report["ledger"]["by_cause"]}


def test_the_straggler_on_node_b_is_named_with_its_cause_and_the_others_wait_for_it(two_nodes):
    report = report_of(two_nodes, "slow-job", "--cost-per-gpu-hour=2.5")
    text = report["_text"]
    assert {(r["rank"], r["node"]) for r in report["ranks"]} == {
        (0, "node-a"), (1, "node-a"), (2, "node-b"), (3, "node-b")}, text
    assert all(r["steps"] >= STEPS - 1 for r in report["ranks"]), text
    straggler = report["straggler"]
    assert straggler is not None, text
    assert (straggler["rank"], straggler["node"], straggler["cause"]) == (SLOW_RANK, "node-b", "data_wait"), text
    assert 0.6 * DATA_DELAY < straggler["excess_seconds"] < 1.5 * DATA_DELAY, straggler
    # Ranks 0-2 waited for rank 3: booked as straggler_wait naming it, on both nodes.
    causes = by_cause(report)
    assert causes.get(("straggler_wait", SLOW_RANK), 0) > 0, causes
    assert report["ledger"]["rebooked_gpu_hours"] > 0, report["ledger"]
    assert not [k for k in causes if k[0] == "straggler_wait" and k[1] != SLOW_RANK], causes
    # The causes add up to the job's held GPU time, and the nodes' shares too.
    assert sum(causes.values()) == pytest.approx(report["ledger"]["gpu_hours"], rel=1e-9)
    nodes = {n["node"]: n for n in report["ledger"]["by_node"]}
    assert set(nodes) == set(NODES)
    assert nodes["node-b"]["ranks"] == [2, 3]
    assert sum(n["gpu_hours"] for n in nodes.values()) == pytest.approx(report["ledger"]["gpu_hours"])
    assert report["ledger"]["cost"] == pytest.approx(2.5 * report["ledger"]["gpu_hours"], rel=1e-6)
    assert "straggler: rank 3 on node-b (cause data_wait)" in text, text
    assert "straggler_wait (waiting for rank 3)" in text, text


def test_the_even_job_has_no_straggler_and_no_straggler_wait(two_nodes):
    report = report_of(two_nodes, "even-job")
    assert len(report["ranks"]) == 4, report["_text"]
    assert report["straggler"] is None, report["_text"]
    assert report["what_if"] is None
    assert not [k for k in by_cause(report) if k[0] == "straggler_wait"], by_cause(report)
    assert "straggler: none" in report["_text"]


def test_what_if_is_within_15_percent_of_what_the_even_rerun_saved(two_nodes):
    slow, even = report_of(two_nodes, "slow-job"), report_of(two_nodes, "even-job")
    estimate = slow["what_if"]["saved_gpu_hours"]
    measured = slow["ledger"]["gpu_hours"] - even["ledger"]["gpu_hours"]
    assert measured > 0, (slow["ledger"], even["ledger"])
    assert estimate == pytest.approx(measured, rel=0.15), (
        f"estimated {estimate * 3600:.1f} GPU-s saved, the rerun saved {measured * 3600:.1f} GPU-s")


def test_the_html_renders_a_lane_per_rank_in_a_real_browser(two_nodes):
    report_of(two_nodes, "slow-job")
    html = two_nodes["tmp"] / "job.html"
    page = html.read_text()
    for node, rank in [("node-a", 0), ("node-a", 1), ("node-b", 2), ("node-b", 3)]:
        assert f"{node} · rank {rank}" in page
    assert "Straggler: rank 3 on node-b" in page
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        fail_or_skip(WHAT, "chromium is not installed (Debian package chromium)")
    shot = two_nodes["tmp"] / "job.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1100,1400", html.as_uri()],
        capture_output=True, timeout=120, check=False,
    )
    assert shot.exists() and shot.stat().st_size > 10_000, "chromium wrote no screenshot"
    # GPULSE_KEEP_SCREENSHOT=DIR keeps it for a person to look at.
    keep = os.environ.get("GPULSE_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, Path(keep) / "job-report.png")


def test_bad_inputs_are_named_by_file_and_line_and_lose_nothing_else(two_nodes):
    tmp, outs = two_nodes["tmp"], two_nodes["outs"]
    # A node's file cut short mid-line (its gpulse was killed): the line is named, the rest read.
    text = outs[1].read_text()
    lines = text.splitlines()
    truncated = tmp / "node-b-truncated.jsonl"
    truncated.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2] + "\n")
    done, report = gpulse_report(WHAT, [outs[0], truncated], tmp, "--job", "slow-job")
    assert done.returncode == 0, done.stderr
    assert f"problem: {truncated} line {len(lines)}: not OTLP/JSON" in done.stderr, done.stderr
    assert {r["rank"] for r in report["ranks"]} == {0, 1, 2, 3}, done.stderr
    assert report["problems"][0]["line"] == len(lines)
    # Two jobs without --job: the error lists both and says how to pick.
    done, _ = gpulse_report(WHAT, outs, tmp)
    assert done.returncode != 0
    assert "the recordings hold 2 jobs: even-job, slow-job. Pick one with --job ID" in done.stderr, done.stderr
    # A file of another format beside a good one: named, and the good one still reported.
    csv = tmp / "nvidia-smi.csv"
    csv.write_text("index, utilization.gpu [%]\n0, 50 %\n")
    done, report = gpulse_report(WHAT, [outs[0], outs[1], csv], tmp, "--job", "slow-job")
    assert done.returncode == 0, done.stderr
    assert f"{csv} line 1: not OTLP/JSON" in done.stderr, done.stderr
    assert f"{csv}: holds no OTLP/JSON line" in done.stderr, done.stderr
    assert report["straggler"]["rank"] == SLOW_RANK
    # Only files of another format: an error naming each, nothing written.
    done, report = gpulse_report(WHAT, [csv], tmp, "--job", "slow-job")
    assert done.returncode != 0 and report is None
    assert "no recording could be read" in done.stderr and str(csv) in done.stderr, done.stderr


def test_the_slurm_epilog_writes_the_report_of_the_job_that_ended(two_nodes, tmp_path):
    """examples/slurm/epilog.sh as slurmctld runs it: SLURM_JOB_ID and the node list set, each
    node's file under the shared recordings folder, `scontrol show hostnames` expanding the list
    (a stand-in on PATH, as on a machine without Slurm)."""
    from e2e import built_binaries

    gpulse_bin, _ = built_binaries(WHAT)
    recordings, reports, bin_dir = tmp_path / "recordings", tmp_path / "reports", tmp_path / "bin"
    day = time.strftime("%Y-%m-%d")
    for node, out in zip(NODES, two_nodes["outs"]):
        (recordings / node).mkdir(parents=True)
        shutil.copy(out, recordings / node / f"{day}.jsonl")
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && echo \"$3\" | tr ',' '\\n'\n")
    scontrol.chmod(0o755)
    epilog = Path(__file__).resolve().parents[2] / "slurm" / "epilog.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "slow-job",
           "SLURM_JOB_NODELIST": ",".join(NODES), "GPULSE_RECORDINGS": str(recordings),
           "GPULSE_REPORT_DIR": str(reports), "GPULSE_BIN": str(gpulse_bin)}
    done = subprocess.run(["bash", str(epilog)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = (reports / "slow-job" / "summary.txt").read_text()
    assert "straggler: rank 3 on node-b (cause data_wait)" in summary, summary
    assert (reports / "slow-job" / "job.html").stat().st_size > 1000
    report = json.loads((reports / "slow-job" / "job.json").read_text())
    assert len(report["ranks"]) == 4
