"""Two nodes, one job: the cross-node straggler rule on the real Prometheus.

Two `gpulse run` instances stand in for two nodes, each with its own nvml-sim scenario listing
its own ranks (real processes, tests/backends/rank.py) and its own OTLP receiver, to which those
ranks send their step spans like the PyTorch companion does. Both export OTLP to Prometheus 3's
own receiver, which evaluates the PrometheusRule's `gpulse.distributed` group as shipped
(examples/kubernetes/prometheus-operator/prometheusrule.yaml). Job `slow`: ranks 0 and 1 on node
A wait in all-reduce for rank 2 on node B, which waits for nobody. Neither gpulse alone can
compare rank 2 with the others (node B has one rank); Prometheus, from the exported
gpulse.training.step.* series, names rank 2 on node B, and only it. Every panel query of the
shipped Grafana dashboard's "Distributed training" row runs against that Prometheus and must
answer for each rank."""

import json
import os
import sys

import pytest
import yaml

from backend_stack import HERE, REPO, free_port, gpulse_paths, promql, start_prometheus
from test_compose_stack import DASHBOARD, grafana

PROMETHEUS_RULE = REPO / "examples" / "kubernetes" / "prometheus-operator" / "prometheusrule.yaml"
RANK = HERE / "rank.py"
STEP_S = 0.2

DEVICE = """
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-{node}0000000-1111-2222-3333-00000000000{index}"
pci_bus_id = "00000000:{bus}:00.0"
memory_total_mib = 81559

[device.signals]
gpu_util = 60
power_w = 400

[[device.process]]
pid_env = "GPULSE_RANK_{index}"
name = "python3"
kind = "compute"
memory_used_mib = 2048
sm_util = 50
"""


def scenario(tmp, node, indexes):
    text = '[driver]\nversion = "570.124.06"\nnvml_version = "12.570.124.06"\ncuda_version = "12.8"\n'
    for i in indexes:
        text += DEVICE.format(node="a" if node == "node-a" else "b", index=i, bus=f"{0x18 + i:02X}")
    path = tmp / f"{node}.toml"
    path.write_text(text)
    return path


def distributed_rules(tmp):
    """The shipped PrometheusRule's cross-node group, as a plain Prometheus rule file."""
    (rule,) = [d for d in yaml.safe_load_all(PROMETHEUS_RULE.read_text()) if d and d["kind"] == "PrometheusRule"]
    groups = [g for g in rule["spec"]["groups"] if g["name"] == "gpulse.distributed"]
    assert groups, "prometheusrule.yaml has no gpulse.distributed group"
    path = tmp / "distributed-rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path, groups[0]


def distributed_row_queries():
    """(panel title, expr) of every panel in the dashboard's "Distributed training" row: the
    panels after its row header until the next row, or inside it when the row is collapsed."""
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out, in_row = [], False
    for panel in dash["panels"]:
        if panel["type"] == "row":
            in_row = panel["title"].startswith("Distributed training")
            children = panel.get("panels", [])
        else:
            children = [panel]
        if in_row:
            out += [(p["title"], t["expr"]) for p in children for t in p.get("targets", [])]
    return out


def alert_expr(group, name):
    return next(r["expr"] for r in group["rules"] if r.get("alert") == name)


@pytest.fixture(scope="module")
def two_nodes(stack):
    rules_path, group = distributed_rules(stack.tmp)
    _, prom = start_prometheus(stack, otlp=True, rule_files=[rules_path])
    gpulse, lib = gpulse_paths()
    config = stack.tmp / "gpulse.toml"
    config.write_text("")
    # (node, rank, collective wait per step): the slow rank 2 waits for nobody.
    layout = [("node-a", 0, 0.12), ("node-a", 1, 0.12), ("node-b", 2, 0.0)]
    receivers = {node: free_port() for node in ("node-a", "node-b")}
    ranks = {}
    for node, rank, wait in layout:
        ranks[rank] = stack.start(f"rank{rank}", [sys.executable, RANK, f"http://127.0.0.1:{receivers[node]}",
                                                  "slow", rank, STEP_S, wait])
    for node, indexes in (("node-a", [0, 1]), ("node-b", [2])):
        env = {
            "NVML_SIM_SCENARIO": str(scenario(stack.tmp, node, indexes)),
            "GPULSE_KUBELET_SOCKET": "none",
            "GPULSE_LOG": "info",
            "OTEL_SERVICE_NAME": "gpulse",
            "OTEL_RESOURCE_ATTRIBUTES": f"host.name={node}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{prom}/api/v1/otlp/v1/metrics",
            **{f"GPULSE_RANK_{i}": str(ranks[i].pid) for i in indexes},
        }
        unset = [k for k in os.environ if k.startswith(("OTEL_", "GPULSE_"))]
        stack.start(f"gpulse-{node}", [gpulse, "run", "--nvml-lib", lib, "--config", config,
                                       "--sample-interval", "200ms", "--export-interval", "1s",
                                       "--otlp-receiver-http", str(receivers[node])], env=env, unset=unset)
    stack.wait_until("every rank's step time in Prometheus",
                     lambda: len(promql(prom, "gpulse:training_step_busy_seconds")) == 3)
    return prom, group, ranks


def test_each_rank_is_a_series_with_its_job_rank_and_node(two_nodes):
    prom, _, ranks = two_nodes
    steps = promql(prom, "gpulse_training_step_duration_seconds")
    seen = {(s["metric"]["pytorch_distributed_rank"], s["metric"]["host_name"], s["metric"]["process_pid"])
            for s in steps if s["metric"].get("pytorch_distributed_job_id") == "slow"}
    assert seen == {("0", "node-a", str(ranks[0].pid)), ("1", "node-a", str(ranks[1].pid)),
                    ("2", "node-b", str(ranks[2].pid))}, steps
    for s in steps:
        # Each rank sleeps STEP_S per step; the figure is the mean of its step spans' durations.
        assert float(s["value"][1]) == pytest.approx(STEP_S, abs=1e-6), s
    wait = {s["metric"]["pytorch_distributed_rank"]: float(s["value"][1])
            for s in promql(prom, "gpulse_training_step_collective_wait_seconds")}
    assert wait == pytest.approx({"0": 0.12, "1": 0.12, "2": 0.0}), wait


def test_the_cross_node_rule_names_the_straggler_on_the_other_node(two_nodes, stack):
    prom, group, _ = two_nodes
    expr = alert_expr(group, "GpulseRankStragglerAcrossNodes")
    found = stack.wait_until("the straggler expression to name a rank", lambda: promql(prom, expr))
    assert [(s["metric"]["pytorch_distributed_rank"], s["metric"]["host_name"],
             s["metric"]["pytorch_distributed_job_id"]) for s in found] == [("2", "node-b", "slow")], found
    # Its value is its excess busy time per step over the job's median rank: 0.2 s against 0.08 s.
    assert float(found[0]["value"][1]) == pytest.approx(STEP_S - (STEP_S - 0.12), abs=1e-6), found
    # Prometheus evaluates the shipped alert too: pending (its `for` is minutes) on rank 2 only.
    alerts = stack.wait_until("the alert to be pending",
                              lambda: promql(prom, 'ALERTS{alertname="GpulseRankStragglerAcrossNodes"}'))
    assert {(a["metric"]["pytorch_distributed_rank"], a["metric"]["host_name"]) for a in alerts} == {("2", "node-b")}


def test_every_panel_of_the_distributed_training_row_answers_for_each_rank(two_nodes, stack):
    prom, _, _ = two_nodes
    queries = distributed_row_queries()
    assert len(queries) >= 3, f"the row has fewer panel queries than expected: {queries}"
    answers = {}

    def each_rank_answers():
        for title, expr in queries:
            answers[title] = {(s["metric"].get("pytorch_distributed_job_id"), s["metric"].get("pytorch_distributed_rank"),
                               s["metric"].get("host_name")): float(s["value"][1])
                              for s in promql(prom, grafana(expr))}
        return all({key[1] for key in a if key[0] == "slow"} == {"0", "1", "2"} for a in answers.values())

    try:
        stack.wait_until("every panel of the row to answer for ranks 0, 1 and 2", each_rank_answers)
    except pytest.fail.Exception as e:
        pytest.fail(f"panels without every rank: {json.dumps({t: str(a) for t, a in answers.items()}, indent=1)}\n{e}")
    by_title = {title: {key[1:]: value for key, value in a.items() if key[0] == "slow"} for title, a in answers.items()}
    step = next(a for t, a in by_title.items() if t.startswith("Step time"))
    assert step == pytest.approx({("0", "node-a"): STEP_S, ("1", "node-a"): STEP_S, ("2", "node-b"): STEP_S}), step
    share = next(a for t, a in by_title.items() if t.startswith("Collective wait share"))
    assert share == pytest.approx({("0", "node-a"): 0.6, ("1", "node-a"): 0.6, ("2", "node-b"): 0.0}), share
    # Busy time over the job's median rank: 0.2 s / 0.08 s for rank 2, 1 for the others.
    straggler = next(a for t, a in by_title.items() if t.startswith("Straggler"))
    assert straggler == pytest.approx({("0", "node-a"): 1.0, ("1", "node-a"): 1.0, ("2", "node-b"): 2.5}), straggler


def test_the_ledger_row_gives_the_jobs_gpu_hours_by_cause(two_nodes, stack):
    """The dashboard's "Ledger" row against the same Prometheus: job `slow` has GPU-hours in
    compute and, for ranks 0 and 1 waiting 0.12 s of each 0.2 s step (no straggler on either
    node's own view: node A's two ranks wait alike), in collective_wait; its causes add up to the
    job's held time; the stacked rate panel answers per cause."""
    prom, _, ranks = two_nodes
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = {p["title"]: p for p in dash["panels"]}
    by_job = panels["GPU-hours by cause per job"]["targets"][0]["expr"]
    by_cause = panels["GPUs held by cause"]["targets"][0]["expr"]
    rank_of = {str(proc.pid): str(r) for r, proc in ranks.items()}
    by_rank_and_cause = grafana('sum by (process_pid, gpulse_gpu_cause) '
                                '(increase(process_gpu_time_seconds_total{gpulse_job_id="slow"}[$__range]))')
    seen, per_rank = {}, {}

    def every_rank_has_its_causes():
        # `increase` needs two samples of a series in range; node B's gpulse may start a few
        # exports after node A's, so the job-wide figures alone can be ready without rank 2.
        seen.clear()
        per_rank.clear()
        for s in promql(prom, grafana(by_job)):
            if s["metric"].get("gpulse_job_id") == "slow":
                seen[s["metric"]["gpulse_gpu_cause"]] = float(s["value"][1])
        for s in promql(prom, by_rank_and_cause):
            rank_causes = per_rank.setdefault(rank_of[s["metric"]["process_pid"]], {})
            rank_causes[s["metric"]["gpulse_gpu_cause"]] = float(s["value"][1])
        return (seen.get("collective_wait", 0) > 0 and seen.get("compute", 0) > 0
                and set(per_rank) == {"0", "1", "2"}
                and all(per_rank[r].get("collective_wait", 0) > 0 for r in ("0", "1")))

    try:
        stack.wait_until("job slow's GPU-hours by cause for ranks 0, 1 and 2", every_rank_has_its_causes)
    except pytest.fail.Exception as e:
        pytest.fail(f"job-wide {seen}, per rank {per_rank}\n{e}")
    assert set(seen) <= {"compute", "collective_wait", "host", "unused"}, seen
    assert "straggler_wait" not in seen and "input_wait" not in seen, seen
    held = promql(prom, grafana('sum(increase(process_gpu_time_seconds_total{gpulse_job_id="slow"}[$__range])) / 3600'))
    assert sum(seen.values()) == pytest.approx(float(held[0]["value"][1]), rel=0.05), (seen, held)
    # Ranks 0 and 1 wait 60 % of each step, rank 2 never. Each rank's causes come from one query
    # (one evaluation instant), so the check does not depend on which node's gpulse started first:
    # the two nodes' held times differ by their start skew, which a job-wide 40 % bound missed.
    assert set(per_rank) == {"0", "1", "2"}, per_rank
    assert "collective_wait" not in per_rank["2"], per_rank
    for r in ("0", "1"):
        # At most 60 % (the time before the first span and between steps is no wait); over a
        # few steps, well above 0.
        assert 0.2 < per_rank[r]["collective_wait"] / sum(per_rank[r].values()) <= 0.61, per_rank
    causes = {s["metric"].get("gpulse_gpu_cause") for s in promql(prom, grafana(by_cause))}
    assert {"compute", "collective_wait"} <= causes, causes
