#!/usr/bin/env python3
"""Summarise OTLP/JSON lines (gpulse --exporter stdout, or a collector's file exporter): one block
per request; for metrics one line per resource with its identity and a few headline values, for
logs each finding with its state, rule, resource, evidence and advice. Reads stdin."""
import json
import sys

HEADLINE = ("hw.gpu.utilization", "hw.power", "hw.gpu.memory.usage",
            "process.gpu.utilization", "process.gpu.memory.usage")


def attrs(items):
    out = {}
    for kv in items or []:
        v = kv.get("value", {})
        out[kv["key"]] = next(iter(v.values()), None) if v else None
    return out


def value(point):
    if "asDouble" in point:
        return point["asDouble"]
    return float(point.get("asInt", 0))


def fmt(name, v):
    if name.endswith("memory.usage"):
        return f"{v / 2**30:.1f}GiB"
    if name == "hw.power":
        return f"{v:.0f}W"
    return f"{v * 100:.0f}%"


def print_log_record(resource, record):
    """A finding (event gpulse.diagnosis.finding) with its state, rule, evidence and advice;
    any other record by its body."""
    a = attrs(record.get("attributes"))
    body = record.get("body", {}).get("stringValue", "")
    if "gpulse.diagnosis.rule" not in a:
        print(f"  log: {body}")
        return
    where = (f"service {resource.get('service.name')} pid {resource['process.pid']}"
             if "process.pid" in resource else f"node {resource.get('host.name')}")
    print(f"  finding {a.get('gpulse.diagnosis.state')} [{a.get('gpulse.diagnosis.severity')}] "
          f"{a['gpulse.diagnosis.rule']} on {where}: {body}")
    evidence = a.get("gpulse.diagnosis.evidence")
    figures = {k.removeprefix("gpulse.diagnosis.value."): v for k, v in a.items()
               if k.startswith("gpulse.diagnosis.value.")}
    if evidence or figures:
        shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in figures.items())
        print(f"      evidence ({evidence}): {shown}")
    if "gpulse.diagnosis.advice" in a:
        print(f"      what to do: {a['gpulse.diagnosis.advice']}")


for n, line in enumerate(sys.stdin, 1):
    line = line.strip()
    if not line:
        continue
    request = json.loads(line)
    if "resourceLogs" in request:
        records = [(rl, rec) for rl in request["resourceLogs"]
                   for sl in rl.get("scopeLogs", []) for rec in sl.get("logRecords", [])]
        print(f"request {n}: {len(records)} log record{'' if len(records) == 1 else 's'}")
        for rl, rec in records:
            print_log_record(attrs(rl.get("resource", {}).get("attributes")), rec)
        continue
    rms = request.get("resourceMetrics", [])
    points = sum(len(m.get("gauge", m.get("sum", {})).get("dataPoints", []))
                 for rm in rms for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", []))
    print(f"request {n}: {len(rms)} resources, {points} data points")
    for rm in rms:
        a = attrs(rm.get("resource", {}).get("attributes"))
        who = (f"pid {a['process.pid']} vpid {a.get('process.vpid', '?')} "
               f"service {a.get('service.name')} container {str(a.get('container.id', '-'))[:12]}"
               if "process.pid" in a else f"node {a.get('host.name')} service {a.get('service.name')}")
        values = []
        for sm in rm.get("scopeMetrics", []):
            for m in sm.get("metrics", []):
                if m["name"] not in HEADLINE:
                    continue
                pts = m.get("gauge", m.get("sum", {})).get("dataPoints", [])
                pts = [p for p in pts if attrs(p.get("attributes")).get("hw.gpu.task", "general") == "general"]
                if pts:
                    values.append(f"{m['name']}=" + "/".join(fmt(m["name"], value(p)) for p in pts))
        print(f"  {who}: {' '.join(values)}")
