"""The Grafana dashboard (examples/compose/grafana/dashboards/gpulse.json) against the metric
reference: every metric a panel queries must be a metric gpulse documents in docs/metrics.md,
mapped through the Prometheus translation in promnames.py, and every label it filters or groups
by must be a documented attribute. A renamed metric, a changed unit (which changes the suffix)
or a misspelt label fails here instead of leaving an empty panel. Until docs/metrics.md exists the
table in DESIGN.md stands in; under CI=true a missing docs/metrics.md is a failure."""

import json
import re

import pytest
import yaml

import promnames
import reference
from conftest import REPO, absent

DASHBOARD = REPO / "examples" / "compose" / "grafana" / "dashboards" / "gpulse.json"
DATASOURCES = REPO / "examples" / "compose" / "grafana" / "provisioning" / "datasources" / "datasources.yaml"

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "atan2",
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "inf", "nan",
}
PROM_OWN_LABELS = {"job", "instance", "le", "__name__"}

# What the panels must cover (OpenTelemetry names; their Prometheus names come from the reference).
REQUIRED = {
    "hw.gpu.utilization", "hw.gpu.utilization.max", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.power",
    "hw.temperature", "nvidia.gpu.throttle", "hw.errors", "hw.status", "process.gpu.memory.usage",
    "process.gpu.utilization", "gpulse.diagnosis.active",
}


def strip_promql(expr: str) -> str:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return re.sub(r"\$\w+", " ", expr)


def metric_names(expr: str) -> set[str]:
    out = set()
    text = strip_promql(expr)
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d.*", word):
            continue
        out.add(word)
    return out


def label_names(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    out = set()
    for sel in re.findall(r"\{([^}]*)\}", expr):
        out.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
    for grp in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        out.update(x.strip() for x in grp.split(",") if x.strip())
    return out


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend or ""))


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(dash):
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield p["title"], t.get("expr", ""), t.get("legendFormat", "")
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q or "")
        if m:
            yield f"variable {v['name']}", m.group(1), "{{" + m.group(2) + "}}"


@pytest.fixture(scope="module")
def dash():
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ref():
    src, defs = reference.load_reference()
    assert defs, f"no metric rows parsed from {src}"
    return src, defs


@pytest.fixture(scope="module")
def prom_names(ref):
    _, defs = ref
    return {n: d for d in defs for n in d.prometheus_names()}


@pytest.fixture(scope="module")
def known_labels(ref):
    src, _ = ref
    attrs = reference.documented_attributes(src.read_text(encoding="utf-8"))
    # The resource attributes the deployment itself sets (OTEL_RESOURCE_ATTRIBUTES from the
    # Downward API) and service.name, which every resource carries.
    attrs |= {"host.name", "service.name", "k8s.node.name", "k8s.pod.name", "k8s.namespace.name", "k8s.pod.uid"}
    return {promnames.label_name(a) for a in attrs} | PROM_OWN_LABELS


def test_reference_is_docs_metrics_md(ref):
    src, _ = ref
    if src != reference.METRICS_MD:
        absent(f"docs/metrics.md is missing; the dashboard was checked against {src} instead")


def test_every_queried_metric_is_documented(dash, prom_names, ref):
    src, _ = ref
    unknown = {}
    for title, expr, _ in queries(dash):
        for name in metric_names(expr):
            if name not in prom_names:
                unknown.setdefault(name, []).append(title)
    assert not unknown, (
        f"panels query metrics that {src.name} does not document (after the Prometheus translation): "
        + "; ".join(f"{n} in {sorted(set(t))}" for n, t in sorted(unknown.items()))
        + f". Documented: {sorted(prom_names)}")


def test_every_label_is_a_documented_attribute(dash, known_labels):
    bad = {}
    for title, expr, legend in queries(dash):
        for label in label_names(expr) | legend_labels(legend):
            if label not in known_labels:
                bad.setdefault(label, set()).add(title)
    assert not bad, f"labels that are no documented attribute: {bad}"


def test_required_signals_have_panels(dash, ref):
    _, defs = ref
    by_name = {d.name: d for d in defs}
    queried = set().union(*(metric_names(e) for _, e, _ in queries(dash)))
    missing = []
    for otel in sorted(REQUIRED):
        d = by_name.get(otel)
        if d is None:
            missing.append(f"{otel} (not in the reference)")
        elif not d.prometheus_names() & queried:
            missing.append(f"{otel} -> {sorted(d.prometheus_names())}")
    assert not missing, f"no panel shows: {missing}"


def test_workload_panels_link_to_traces_by_the_join_key(dash):
    links = [l for p in all_panels(dash) for l in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
    assert links, "no data links"
    for l in links:
        url = l["url"]
        for part in ("container.id", "process.pid"):
            assert part.replace(".", "%2E") in url or part in url, f"{l['title']}: link lacks {part}"
        assert re.search(r"\$\{__(field\.labels|data\.fields)\.process_vpid\}", url), "process.pid in traces = process.vpid here"
        assert re.search(r"\$\{__(field\.labels|data\.fields)\.container_id\}", url)
        assert re.search(r"\$\{__(field\.labels|data\.fields)\.service_name\}", url)
    # A panel per workload (its series keep process_pid); one that sums workloads away, by job or
    # by cause (the ledger row), has no one workload's traces to link to.
    workload = [p for p in all_panels(dash)
                if any("process_gpu" in t.get("expr", "") and "process_pid" in t.get("expr", "")
                       for t in p.get("targets", []))]
    assert workload and all(p.get("fieldConfig", {}).get("defaults", {}).get("links") for p in workload), (
        "every per-workload panel should link to its traces")


def test_panels_use_provisioned_data_sources(dash):
    uids = {d["uid"] for d in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    for p in all_panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] in uids, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] in uids, p["title"]


def test_panel_ids_and_layout(dash):
    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in all_panels(dash):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{p['title']} overflows the 24-column grid"
    assert dash["uid"] and dash["title"]


# --- the helpers themselves -------------------------------------------------------------------

@pytest.mark.parametrize(
    "name, unit, kind, expected",
    [
        ("http.server.duration", "s", promnames.HISTOGRAM, "http_server_duration_seconds"),
        ("requests.count", "1", promnames.COUNTER, "requests_count_total"),
        ("memory.usage", "By", promnames.GAUGE, "memory_usage_bytes"),
        ("hw.gpu.utilization", "1", promnames.GAUGE, "hw_gpu_utilization_ratio"),
        ("hw.gpu.utilization.max", "1", promnames.GAUGE, "hw_gpu_utilization_max_ratio"),
        ("hw.status", "1", promnames.UPDOWN, "hw_status"),
        ("hw.gpu.memory.usage", "By", promnames.UPDOWN, "hw_gpu_memory_usage_bytes"),
        ("hw.energy", "J", promnames.COUNTER, "hw_energy_joules_total"),
        ("hw.errors", "{error}", promnames.COUNTER, "hw_errors_total"),
        ("hw.gpu.io", "By", promnames.COUNTER, "hw_gpu_io_bytes_total"),
        ("hw.temperature", "Cel", promnames.GAUGE, "hw_temperature_celsius"),
        ("nvidia.gpu.clock", "MHz", promnames.GAUGE, "nvidia_gpu_clock_MHz"),
        ("net.throughput", "By/s", promnames.GAUGE, "net_throughput_bytes_per_second"),
        ("queue.size", "{request}", promnames.UPDOWN, "queue_size"),
        ("cpu.seconds.total", "s", promnames.COUNTER, "cpu_seconds_total"),
    ],
)
def test_prometheus_translation(name, unit, kind, expected):
    assert promnames.metric_name(name, unit, kind) == expected


def test_label_translation():
    assert promnames.label_name("k8s.pod.name") == "k8s_pod_name"
    assert promnames.label_name("hw.gpu.task") == "hw_gpu_task"


def test_reference_parser_reads_both_table_styles():
    text = """
| name | instrument | unit | attributes | NVML source | notes |
| --- | --- | --- | --- | --- | --- |
| `hw.gpu.utilization` | Gauge | `1` | `hw.gpu.task` | x | mean |
| `hw.errors` | Counter | `{error}` | `error.type` | | |
| hw.gpu.memory.usage / .limit | updowncounter | By | MemoryInfo | |
| process.cpu.utilization, process.memory.usage | gauge | 1, By | /proc | |
| hw.temperature (hw.type=gpu) or nvidia.gpu.temperature | gauge | Cel | Temperature |

| attribute | meaning |
| --- | --- |
| `not.a.metric` | x |
"""
    got = {(d.name, d.instrument, d.unit) for d in reference.parse_reference_table(text)}
    assert got == {
        ("hw.gpu.utilization", "gauge", "1"),
        ("hw.errors", "counter", "{error}"),
        ("hw.gpu.memory.usage", "updowncounter", "By"),
        ("hw.gpu.memory.limit", "updowncounter", "By"),
        ("process.cpu.utilization", "gauge", "1"),
        ("process.memory.usage", "gauge", "By"),
        ("hw.temperature", "gauge", "Cel"),
        ("nvidia.gpu.temperature", "gauge", "Cel"),
    }


def test_promql_parsing():
    expr = 'sum by (host_name, gpu_index) (increase(hw_errors_total{error_type="xid", hw_id=~"$gpu"}[$__rate_interval])) / 3.6e6 > 0'
    assert metric_names(expr) == {"hw_errors_total"}
    assert label_names(expr) == {"host_name", "gpu_index", "error_type", "hw_id"}


def test_a_renamed_metric_is_caught(dash, ref):
    # Control: rename one documented metric the dashboard uses, or change its unit, and the
    # dashboard check must see queries it no longer covers.
    _, defs = ref
    for change in (lambda d: reference.MetricDef(d.name + ".usage", d.instrument, d.unit),
                   lambda d: reference.MetricDef(d.name, d.instrument, "mW")):
        changed = [change(d) if d.name == "hw.power" else d for d in defs]
        names = {n for d in changed for n in d.prometheus_names()}
        queried = set().union(*(metric_names(e) for _, e, _ in queries(dash)))
        assert queried - names == {"hw_power_watts"}


def test_reference_parser_keeps_escaped_pipes_in_one_cell():
    text = "| name | instrument | unit | attributes |\n| --- | --- | --- | --- |\n" \
           "| `hw.status` | updowncounter | `1` | `hw.state` = `ok` \\| `failed` |\n"
    assert [(d.name, d.unit) for d in reference.parse_reference_table(text)] == [("hw.status", "1")]
