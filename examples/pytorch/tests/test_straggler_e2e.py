"""A straggler named end to end: real torchrun jobs, the companion, gpulse's receiver and rules.

Two data-parallel jobs run at once under ``torchrun`` (gloo on the CPU, 4 ranks each, train.py's
MLP under DDP with the companion's comm hook): in ``slow-job`` rank 2's DataLoader sleeps 250 ms a
batch, in ``even-job`` no rank is slowed. Every rank sends its spans to ``gpulse run``'s own OTLP/HTTP
receiver; gpulse samples nvml-sim, whose scenario puts each rank's real PID on a GPU of its own,
and forwards what it receives and its findings to otlp_sink.py. The test checks that gpulse
reports ``rank_straggler`` on slow-job's rank 2 (its process resource, ``pytorch.distributed.rank``
= 2, the job id, cause ``data_wait``), and nothing on any other rank of either job: the two jobs
are on the same node and must never be compared with each other.

No root needed. Needs torch and the binaries ``cargo build --workspace`` makes; without them it
is skipped with the reason, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import subprocess
import time
from typing import Dict

import pytest

from conftest import require_torch
from e2e import (
    MetricsWindow,
    describe,
    findings,
    free_port,
    rank_pids,
    requests,
    start_gpulse_on_sim,
    start_sink,
    stop,
    torchrun,
)

WHAT = "the straggler end-to-end test"
RANKS = 4
SLOW_RANK = 2
JOBS = ("slow-job", "even-job")

# Short enough that the rule decides within the run; the defaults are 1 min.
CONFIG = """
[diagnosis]
clear_after_windows = 2

[diagnosis.input_bound]
step_lookback = "8s"
min_steps = 5

[diagnosis.rank_straggler]
min_duration = "3s"
min_steps = 5

[diagnosis.collective_bound]
min_duration = "3s"
min_steps = 5

[diagnosis.idle_holder]
enabled = false
"""


def env_name(job: str, rank: int) -> str:
    return f"{job.replace('-', '_').upper()}_RANK{rank}_PID"


def test_the_slow_rank_is_named_with_cause_data_wait_and_even_ranks_are_not(tmp_path):
    require_torch()
    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    receiver_port = free_port()
    sink = gpulse = None
    jobs: Dict[str, subprocess.Popen] = {}
    try:
        sink, sink_endpoint = start_sink(out)
        for job in JOBS:
            slow = ["--data-delay=0.25", f"--slow-rank={SLOW_RANK}"] if job == "slow-job" else []
            steps = 45 if job == "slow-job" else 110
            train_args = [
                f"--steps-per-epoch={steps}",
                "--sleep-per-step=0.1",
                f"--start-after={go}",
                *slow,
            ]
            jobs[job] = torchrun(tmp_path, job, RANKS, receiver_port, train_args)
        pids = {j: rank_pids(tmp_path, j, RANKS, list(jobs.values())) for j in JOBS}
        # One GPU per rank, listed while the rank runs; the ranks wait on `go` until gpulse exports.
        rank_envs = {env_name(j, r): pid for j in JOBS for r, pid in enumerate(pids[j])}
        gpulse = start_gpulse_on_sim(
            tmp_path, "gpulse", rank_envs, CONFIG, receiver_port, sink_endpoint, out, WHAT
        )
        go.touch()
        for job, process in jobs.items():
            try:
                process.wait(240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{job} still running after 240 s: {tmp_path / (job + '.log')}")
            log = (tmp_path / f"{job}.log").read_text()
            assert process.returncode == 0, log[-3000:]
        time.sleep(2)
        stop(gpulse)
        assert gpulse.returncode == 0, (tmp_path / "gpulse.log").read_text()[-3000:]
        stop(sink)
    finally:
        for process in jobs.values():
            stop(process)
        stop(gpulse)
        stop(sink)

    records = findings(out)
    listing = describe(records)
    stragglers = [
        r
        for r in records
        if r["attributes"]["gpulse.diagnosis.rule"] == "rank_straggler"
        and r["attributes"]["gpulse.diagnosis.state"] == "started"
    ]
    slow_pid = pids["slow-job"][SLOW_RANK]
    assert stragglers, f"no rank_straggler finding started. Findings:\n{listing}"
    assert {r["resource"].get("process.pid") for r in stragglers} == {slow_pid}, listing
    finding = stragglers[0]["attributes"]
    assert finding["pytorch.distributed.rank"] == SLOW_RANK
    assert finding["pytorch.distributed.job.id"] == "slow-job"
    assert finding["gpulse.diagnosis.cause"] == "data_wait", listing
    # Rank 2 waits ~250 ms per step on its loader; the others wait about that in all-reduce.
    assert 0.15 < finding["gpulse.diagnosis.value.excess_seconds"] < 0.4, finding
    assert finding["gpulse.diagnosis.value.others_collective_wait_ratio"] > 0.3, finding
    assert "spans" in finding["gpulse.diagnosis.evidence"]
    assert not [
        r for r in records if r["attributes"]["gpulse.diagnosis.rule"] == "collective_bound"
    ], listing

    # The ledger: once the straggler is named, the other ranks of slow-job wait for rank 2 in
    # straggler_wait (the rank on the point); rank 2 itself waits on its loader; even-job's ranks,
    # with no rank named, never have straggler_wait time.
    windows = [MetricsWindow(r) for r in requests(out) if "resourceMetrics" in r]
    last: Dict[int, MetricsWindow] = {}
    for window in windows:
        for pid in pids["slow-job"] + pids["even-job"]:
            if window.process(pid):
                last[pid] = window
    ledger = {pid: w.by_cause_and_rank(pid, "process.gpu.time") for pid, w in last.items()}
    for rank, pid in enumerate(pids["slow-job"]):
        causes = ledger[pid]
        waited = {r for (cause, r), v in causes.items() if cause == "straggler_wait" and v > 0}
        if rank == SLOW_RANK:
            assert not waited, f"the straggler waits for nobody: {causes}"
            assert causes.get(("input_wait", None), 0.0) > 1.0, causes
        else:
            assert waited == {SLOW_RANK}, f"rank {rank}: {causes}"
    for rank, pid in enumerate(pids["even-job"]):
        causes = ledger[pid]
        assert not [c for (c, _) in causes if c == "straggler_wait"], f"rank {rank}: {causes}"
