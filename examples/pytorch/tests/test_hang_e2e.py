"""A stuck job named end to end: real torchrun jobs, the companion's live states, gpulse's rules.

A data-parallel job runs under ``torchrun`` (gloo on the CPU, 4 ranks, train.py's MLP under DDP
with the companion's comm hook); every rank sends its spans and live states to ``gpulse run``'s
OTLP/HTTP receiver; gpulse samples nvml-sim, whose scenario puts each rank's real PID on a GPU of
its own, and forwards its findings to otlp_sink.py.

- Rank 2 blocks (sleeps) inside step 30 for 15 s, in a phase ``stuck``: the other ranks wait for
  it in their all-reduce. gpulse raises one ``distributed_hang`` on rank 2's resource, with the
  phase, the collective the others wait in, the waiting ranks and rank 2's stack (the frame where
  it sleeps), no finding on the others but their stacks as evidence records on their resources,
  and clears it once rank 2 goes on.
- Rank 0 writes a "checkpoint" for 10 s while the others wait: ``long_phase_wait`` (info) on rank
  0, and no ``distributed_hang``. Then the job is stopped with SIGTERM: nothing more is raised.
- Two torchrun agents stand in for two nodes, each with its own gpulse: the one with rank 2 names
  it; the other says all its ranks wait and the culprit is among ranks 2-3.
- Rank 2 of a job whose collective never notices a dead peer (as NCCL's; gloo's does) is killed
  outright: the finding is on rank 2, cause ``exited``.
- A DDP model the companion does not watch: ``collectives_unseen`` on every rank, with the line
  that fixes it.

The detection bound is a configuration value here (3 s), so each job takes well under a minute.
No root needed. Needs torch and the binaries ``cargo build --workspace`` makes; without them it
is skipped with the reason, and under ``CI=true`` it fails.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
import subprocess
import sys
import time
from pathlib import Path

from conftest import require_torch
from e2e import (
    built_binaries,
    describe,
    findings,
    free_port,
    gpulse_report,
    rank_pids,
    start_gpulse_on_sim,
    start_sink,
    stop,
    torchrun,
    wait_until,
)

WHAT = "the hang end-to-end test"
RANKS = 4

CONFIG = """
[diagnosis]
clear_after_windows = 2

[diagnosis.distributed_hang]
min_stall = "3s"
live_fresh_for = "3s"

[diagnosis.collectives_unseen]
min_steps = 10

[diagnosis.idle_holder]
enabled = false
"""

# The companion reports a state after 1 s in it, every 0.5 s, with the stacks after 2 s.
LIVE = {
    "OTEL_LOGS_EXPORTER": "otlp",
    "OTEL_BLRP_SCHEDULE_DELAY": "200",
    "OTEL_TORCH_TRAIN_LIVE_INTERVAL": "0.5",
    "OTEL_TORCH_TRAIN_LIVE_REPORT_AFTER": "1",
    "OTEL_TORCH_TRAIN_LIVE_STACK_AFTER": "2",
}


def run_job(tmp_path: Path, job: str, train_args, until=None, while_hung=None):
    """Runs ``job`` under gpulse to its end (or until ``until(out)`` holds, then SIGTERM);
    ``while_hung(health address)`` is called once a ``distributed_hang`` has started. Returns
    (findings, rank PIDs, job's exit status)."""
    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    receiver_port = free_port()
    health = f"127.0.0.1:{free_port()}"
    sink = gpulse = process = None
    try:
        sink, sink_endpoint = start_sink(out)
        process = torchrun(
            tmp_path,
            job,
            RANKS,
            receiver_port,
            ["--steps-per-epoch=60", "--sleep-per-step=0.05", f"--start-after={go}", *train_args],
            env=LIVE,
        )
        pids = rank_pids(tmp_path, job, RANKS, [process])
        gpulse = start_gpulse_on_sim(
            tmp_path,
            "gpulse",
            {f"RANK{rank}_PID": pid for rank, pid in enumerate(pids)},
            CONFIG,
            receiver_port,
            sink_endpoint,
            out,
            WHAT,
            ["--health-addr", health],
        )
        go.touch()
        if while_hung is not None:
            wait_until(
                lambda: bool(of_rule(findings(out), "distributed_hang", "started")),
                120,
                f"waiting for {job} to hang",
                [process, gpulse],
            )
            while_hung(health)
        if until is not None:
            wait_until(lambda: until(out), 120, f"waiting in {job}", [process, gpulse])
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{job} still running after 180 s: {tmp_path / (job + '.log')}")
        time.sleep(4)  # two more windows: a finding that would still rise, rises
        stop(gpulse)
        assert gpulse.returncode == 0, (tmp_path / "gpulse.log").read_text()[-3000:]
        stop(sink)
    finally:
        stop(process)
        stop(gpulse)
        stop(sink)
    return findings(out), pids, process.returncode


def of_rule(records, rule, state):
    return [
        r
        for r in records
        if r["attributes"]["gpulse.diagnosis.rule"] == rule
        and r["attributes"].get("gpulse.diagnosis.state") == state
    ]


def test_the_rank_that_blocks_is_named_with_its_stack_and_the_finding_clears(tmp_path):
    require_torch()
    seen = {}

    def ask(health: str) -> None:
        # /status carries the active finding, and `gpulse check --agent` says the job is hung.
        with urllib.request.urlopen(f"http://{health}/status", timeout=5) as answer:
            seen["status"] = json.load(answer)
        gpulse_bin, sim_lib = built_binaries(WHAT)
        check = subprocess.run(
            [str(gpulse_bin), "check", "--format", "json", "--nvml-lib", str(sim_lib), "--agent", health],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NVML_SIM_SCENARIO": str(tmp_path / "gpulse-scenario.toml"), **seen_pids()},
        )
        seen["check"] = check

    def seen_pids():
        return {
            f"RANK{rank}_PID": (tmp_path / f"hang-job-rank{rank}.pid").read_text()
            for rank in range(RANKS)
        }

    records, pids, status = run_job(
        tmp_path,
        "hang-job",
        ["--block-rank=2", "--block-at-step=30", "--block-seconds=15", "--block-phase=stuck"],
        while_hung=ask,
    )
    listing = describe(records)
    assert status == 0, (tmp_path / "hang-job.log").read_text()[-3000:]
    started = of_rule(records, "distributed_hang", "started")
    assert started, f"no distributed_hang finding started. Findings:\n{listing}"
    assert {r["resource"].get("process.pid") for r in started} == {pids[2]}, listing
    finding = started[0]["attributes"]
    assert finding["gpulse.diagnosis.severity"] == "critical"
    assert finding["pytorch.distributed.rank"] == 2
    assert finding["pytorch.distributed.job.id"] == "hang-job"
    assert finding["gpulse.diagnosis.cause"] == "phase", finding
    assert finding["gpulse.diagnosis.value.phase"] == "stuck"
    assert finding["gpulse.diagnosis.value.step"] == 30
    assert finding["gpulse.diagnosis.value.collective_op"] == "all_reduce"
    assert finding["gpulse.diagnosis.value.waiting_ranks"] == "0,1,3"
    stack = finding.get("code.stacktrace", "")
    assert "train.py" in stack and "time.sleep(args.block_seconds)" in stack, stack
    assert "logs" in finding["gpulse.diagnosis.evidence"]
    # The waiting ranks' stacks, once, each on its own resource, naming the finding.
    evidence = [r for r in records if r["body"].get("eventName") == "gpulse.diagnosis.evidence"]
    assert sorted(r["resource"].get("process.pid") for r in evidence) == sorted(
        pids[r] for r in (0, 1, 3)
    ), listing
    for record in evidence:
        attributes = record["attributes"]
        assert attributes["gpulse.diagnosis.subject"] == finding["gpulse.diagnosis.subject"]
        assert attributes["gpulse.diagnosis.rule"] == "distributed_hang"
        assert "backward" in attributes["code.stacktrace"], attributes["code.stacktrace"]
    cleared = of_rule(records, "distributed_hang", "cleared")
    assert [r["resource"].get("process.pid") for r in cleared] == [pids[2]], listing
    assert not of_rule(records, "long_phase_wait", "started"), listing
    assert not of_rule(records, "collectives_unseen", "started"), listing
    active = [f["rule"] for f in seen["status"]["findings"]]
    assert "distributed_hang" in active, active
    check = seen["check"]
    assert check.returncode == 2, check.stdout + check.stderr
    lines = {line["name"]: line for line in json.loads(check.stdout)["checks"]}
    stuck = lines["Stuck jobs"]
    assert stuck["status"] == "fail", stuck
    assert "HUNG" in stuck["reason"] and "stuck on rank 2" in stuck["reason"], stuck


def test_a_long_checkpoint_is_no_hang_and_a_stopped_job_raises_nothing(tmp_path):
    require_torch()

    def checkpoint_seen(out: Path) -> bool:
        return out.exists() and bool(of_rule(findings(out), "long_phase_wait", "started"))

    records, pids, status = run_job(
        tmp_path,
        "checkpoint-job",
        ["--block-rank=0", "--block-at-step=20", "--block-seconds=10", "--block-phase=checkpoint"],
        until=checkpoint_seen,
    )
    listing = describe(records)
    assert status != 0, "the job was stopped with SIGTERM before its end"
    assert not of_rule(records, "distributed_hang", "started"), listing
    started = of_rule(records, "long_phase_wait", "started")
    assert [r["resource"].get("process.pid") for r in started] == [pids[0]], listing
    finding = started[0]["attributes"]
    assert finding["gpulse.diagnosis.severity"] == "info"
    assert finding["gpulse.diagnosis.value.phase"] == "checkpoint"


def test_two_nodes_the_culprits_names_it_and_the_other_says_it_is_elsewhere(tmp_path):
    """Two torchrun agents stand in for two nodes (ranks 0-1 and 2-3, one rendezvous), each with
    its own gpulse that sees only its node's ranks; rank 2 blocks."""
    require_torch()
    job = "two-node-job"
    go = tmp_path / "go"
    rendezvous = free_port()
    nodes, gpulses, sinks = [], [], []
    outs = [tmp_path / "otlp-node0.jsonl", tmp_path / "otlp-node1.jsonl"]
    try:
        endpoints = []
        for out in outs:
            sink, endpoint = start_sink(out)
            sinks.append(sink)
            endpoints.append(endpoint)
        receivers = [free_port(), free_port()]
        for node in (0, 1):
            nodes.append(
                torchrun(
                    tmp_path,
                    job,
                    2,
                    receivers[node],
                    [
                        "--steps-per-epoch=60",
                        "--sleep-per-step=0.05",
                        f"--start-after={go}",
                        "--block-rank=2",
                        "--block-at-step=30",
                        "--block-seconds=12",
                    ],
                    env=LIVE,
                    node=(2, node, rendezvous),
                )
            )
        pids = rank_pids(tmp_path, job, RANKS, nodes)
        for node in (0, 1):
            gpulses.append(
                start_gpulse_on_sim(
                    tmp_path,
                    f"gpulse-node{node}",
                    {f"RANK{rank}_PID": pids[rank] for rank in (2 * node, 2 * node + 1)},
                    CONFIG,
                    receivers[node],
                    endpoints[node],
                    outs[node],
                    WHAT,
                    env={"OTEL_RESOURCE_ATTRIBUTES": f"host.name=node-{node}"},
                )
            )
        go.touch()
        for node, process in enumerate(nodes):
            try:
                process.wait(180)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"node {node} of {job} still running after 180 s")
            log = (tmp_path / f"{job}-node{node}.log").read_text()
            assert process.returncode == 0, log[-3000:]
        time.sleep(2)
        for process in gpulses + sinks:
            stop(process)
    finally:
        for process in nodes + gpulses + sinks:
            stop(process)
    here, there = (of_rule(findings(out), "distributed_hang", "started") for out in outs)
    listing = "node 0:\n" + describe(findings(outs[0])) + "\nnode 1:\n" + describe(findings(outs[1]))
    # The node that hosts the culprit names it.
    assert {r["resource"].get("process.pid") for r in there} == {pids[2]}, listing
    assert there[0]["attributes"]["gpulse.diagnosis.cause"] == "phase", listing
    # The other says every rank of its own waits, and the culprit is among the ranks elsewhere.
    assert {r["resource"].get("process.pid") for r in here} == {pids[0]}, listing
    finding = here[0]["attributes"]
    assert finding["gpulse.diagnosis.cause"] == "remote", listing
    assert finding["gpulse.diagnosis.value.ranks_elsewhere"] == "2,3"
    assert finding["gpulse.diagnosis.value.waiting_ranks"] == "0,1"
    # One report for the job from both nodes' files names the culprit once, with the node
    # that hosts it, and lists the ranks waiting on each node.
    done, report = gpulse_report(WHAT, outs, tmp_path, "--job", job)
    assert done.returncode == 0, done.stderr
    hang = report["hang"]
    assert (hang["culprit_rank"], hang["culprit_node"], hang["cause"]) == (2, "node-1", "phase"), done.stderr
    assert ["node-0", "0,1"] in hang["waiting"], hang
    assert done.stderr.count("hang: rank 2 on node-1 holds the job") == 1, done.stderr
    assert "remote" not in done.stderr.split("hang:")[1].split("where the job")[0], done.stderr


def test_a_rank_killed_outright_is_named_as_exited(tmp_path):
    """Four ranks of tests/apps/file_barrier_rank.py (a collective that, like NCCL's, never
    notices a dead peer); rank 2 is killed with SIGKILL at step 20, the others wait for it."""
    require_torch()  # the companion's venv
    app = Path(__file__).parent / "apps" / "file_barrier_rank.py"
    job = "barrier-job"
    out = tmp_path / "otlp.jsonl"
    go = tmp_path / "go"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    receiver_port = free_port()
    ranks, sink, gpulse = [], None, None
    try:
        sink, sink_endpoint = start_sink(out)
        for rank in range(RANKS):
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            env.update(LIVE)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(RANKS),
                LOCAL_RANK=str(rank),
                TORCHELASTIC_RUN_ID=job,
                OTEL_SERVICE_NAME=job,
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver_port}",
                OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_METRICS_EXPORTER="none",
                OTEL_BSP_SCHEDULE_DELAY="200",
            )
            ranks.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(app),
                        f"--barrier-dir={barrier}",
                        f"--pid-file={tmp_path}/{job}-rank{rank}.pid",
                        f"--start-after={go}",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp_path / f"rank{rank}.log").open("w"),
                    env=env,
                )
            )
        pids = rank_pids(tmp_path, job, RANKS, ranks)
        gpulse = start_gpulse_on_sim(
            tmp_path,
            "gpulse",
            {f"RANK{rank}_PID": pid for rank, pid in enumerate(pids)},
            CONFIG,
            receiver_port,
            sink_endpoint,
            out,
            WHAT,
        )
        go.touch()
        wait_until(lambda: (barrier / "20-2").exists(), 60, "waiting for step 20", ranks)
        ranks[2].kill()
        ranks[2].wait()

        def exited_named() -> bool:
            return bool(of_rule(findings(out), "distributed_hang", "started"))

        wait_until(exited_named, 30, "waiting for distributed_hang", [gpulse])
        time.sleep(1)
    finally:
        for process in ranks + [gpulse, sink]:
            stop(process)
    records = findings(out)
    listing = describe(records)
    started = of_rule(records, "distributed_hang", "started")
    assert len(started) == 1, listing
    finding = started[0]
    assert finding["resource"].get("process.pid") == pids[2], listing
    # The resource the process had while it ran: its service and rank.
    assert finding["resource"].get("service.name") == job, finding["resource"]
    assert finding["resource"].get("pytorch.distributed.rank") == 2, finding["resource"]
    attributes = finding["attributes"]
    assert attributes["gpulse.diagnosis.cause"] == "exited", attributes
    assert attributes["pytorch.distributed.rank"] == 2
    assert attributes["gpulse.diagnosis.value.collective_op"] == "barrier"
    assert attributes["gpulse.diagnosis.value.waiting_ranks"] == "0,1,3"
    assert f"rank 2 (pid {pids[2]}) exited" in finding["body"]["body"]["stringValue"]


def test_a_ddp_model_the_companion_does_not_watch_is_named_on_every_rank(tmp_path):
    require_torch()
    records, pids, status = run_job(tmp_path, "unwatched-job", ["--no-watch-ddp"])
    listing = describe(records)
    assert status == 0, (tmp_path / "unwatched-job.log").read_text()[-3000:]
    unseen = of_rule(records, "collectives_unseen", "started")
    assert sorted(r["resource"].get("process.pid") for r in unseen) == sorted(pids), listing
    finding = unseen[0]["attributes"]
    assert finding["gpulse.diagnosis.severity"] == "info"
    assert finding["gpulse.diagnosis.cause"] == "not_watched"
    assert "tel.watch_ddp(" in finding["gpulse.diagnosis.advice"]
