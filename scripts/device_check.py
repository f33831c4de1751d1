#!/usr/bin/env python3
"""Check gpulse against a real NVIDIA GPU: what it reports, and what it joins.

One command (``scripts/device-check``), under 8 minutes, writing everything to one directory:

1. **Fields.** ``gpulse snapshot --format json`` is compared, device by device and field by
   field, with NVIDIA's Python binding (``pynvml`` from ``nvidia-ml-py``) for **every** device
   and GPM field of ``docs/schema.json`` (the schema gpulse is built from: each row names its
   NVML call, member and scale, and ``device_fields.py`` says how pynvml makes each call; a
   row without one stops the check), and with ``nvidia-smi --query-gpu=…`` for the fields it
   shows. Static facts must match exactly; live values (temperature, power, clocks,
   utilisation, memory used) within the tolerance written next to each row (``TOLERANCES``),
   because each tool reads at a slightly different moment.
2. **Activity.** With ``gpulse run`` sampling every 200 ms, a bf16 matrix-product loop runs on
   CUDA: GPM SM and tensor activity must rise well above the idle baseline while it runs.
3. **Join.** ``examples/pytorch/train.py`` trains on CUDA with the companion, sending its spans
   through gpulse's OTLP receiver; every ``epoch`` span must come back enriched with GPU usage
   (``gpulse.gpu.*``), and ``correlate.py`` must join it with gpulse's metrics for the same
   process.

Output (``--out``, at most 8 files so a device run can return them all): ``report.md``,
``summary.json``, ``snapshot.json``, ``nvidia-smi.csv``, ``pynvml.json``, ``gpulse-run.jsonl``,
``gpulse-run.log``, ``workload.log``. Exit status 0 when every check passed, 1 when one failed,
2 when the check could not run (the message says what is missing).

``--no-workload`` runs step 1 only; the test suite uses it against the independent NVML
(tests/fixtures/other-nvml) with a stand-in ``nvidia-smi``, since no CUDA is there.
Standard library only, plus ``pynvml`` (and torch + the OpenTelemetry SDK for steps 2–3).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from device_fields import (  # noqa: E402 (the sibling module; scripts/ is on sys.path)
    GPM_TOLERANCE,
    MIB,
    SCHEMA,
    TOLERANCES,
    exact,
    load_schema,
    mapping_problems,
    schema_fields,
    within,
)

REPO = Path(__file__).resolve().parents[1]

# nvidia-smi query fields, in the order asked for; `None` = read for the report, not compared.
SMI_FIELDS = [
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "clocks.sm",
    "clocks.mem",
    "clocks.gr",
    "pstate",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "fan.speed",
]

class CheckError(Exception):
    """The check cannot run at all (missing tool or library); exit status 2."""


@dataclass
class Row:
    """One compared value: a device field, or one of the workload checks."""

    device: str
    name: str
    gpulse: Any
    reference: Any
    source: str
    tolerance: str
    ok: Optional[bool]  # None: not comparable (both sides absent), reported but not failed
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.ok is False]


# ---------------------------------------------------------------------------------------------
# Step 1: fields


def run_snapshot(gpulse: str, nvml_lib: str, out: Path) -> dict:
    proc = subprocess.run(
        [gpulse, "snapshot", "--format", "json", "--nvml-lib", nvml_lib],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise CheckError(
            f"`gpulse snapshot` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    (out / "snapshot.json").write_text(proc.stdout)
    return json.loads(proc.stdout)


def run_nvidia_smi(nvidia_smi: str, out: Path) -> list[dict[str, str]]:
    if shutil.which(nvidia_smi) is None and not Path(nvidia_smi).is_file():
        raise CheckError(f"`{nvidia_smi}` not found: install the NVIDIA driver utilities or pass --nvidia-smi")
    proc = subprocess.run(
        [nvidia_smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise CheckError(f"`{nvidia_smi} --query-gpu` exited {proc.returncode}: {proc.stderr.strip()}")
    (out / "nvidia-smi.csv").write_text(",".join(SMI_FIELDS) + "\n" + proc.stdout)
    rows = []
    for values in csv.reader(io.StringIO(proc.stdout), skipinitialspace=True):
        if values:
            rows.append(dict(zip(SMI_FIELDS, (v.strip() for v in values))))
    return rows


def read_pynvml(gpm_seconds: float, schema: dict) -> dict:
    """Every device as NVIDIA's binding reads it: each schema field from its call, member and
    factor; GPM over `gpm_seconds` between two samples."""
    try:
        import pynvml as nv
    except ImportError as e:
        raise CheckError("pynvml is missing: pip install nvidia-ml-py") from e

    def get(fn: Callable, *args):
        try:
            return fn(*args)
        except nv.NVMLError as e:
            return {"error": str(e)}

    nv.nvmlInit()
    try:
        result: dict[str, Any] = {
            "driver_version": _text(get(nv.nvmlSystemGetDriverVersion)),
            "cuda_driver_version": get(nv.nvmlSystemGetCudaDriverVersion),
            "devices": [],
        }
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        gpm_samples, gpm_errors = {}, {}
        for i, h in enumerate(handles):
            support = get(nv.nvmlGpmQueryDeviceSupport, h)
            if not isinstance(support, dict) and support.isSupportedDevice:
                s = nv.nvmlGpmSampleAlloc()
                try:
                    nv.nvmlGpmSampleGet(h, s)
                    gpm_samples[i] = s
                except nv.NVMLError as e:
                    nv.nvmlGpmSampleFree(s)
                    gpm_errors[i] = str(e)
        time.sleep(gpm_seconds)
        for i, h in enumerate(handles):
            procs = get(nv.nvmlDeviceGetComputeRunningProcesses, h)
            device = {
                "index": i,
                "uuid": _text(get(nv.nvmlDeviceGetUUID, h)),
                "name": _text(get(nv.nvmlDeviceGetName, h)),
                "pci_bus_id": _text(getattr(get(nv.nvmlDeviceGetPciInfo, h), "busId", None)),
                "fields": schema_fields(nv, h, schema),
                "pids": sorted(p.pid for p in procs) if isinstance(procs, list) else procs,
            }
            if i in gpm_samples:
                device["gpm"] = _gpm_metrics(nv, h, gpm_samples[i], schema)
            elif i in gpm_errors:
                device["gpm"] = {"error": gpm_errors[i]}
            result["devices"].append(device)
        return result
    finally:
        nv.nvmlShutdown()


def _gpm_metrics(nv, handle, first, schema: dict) -> dict:
    second = nv.nvmlGpmSampleAlloc()
    gpm = [(row["key"], row["source"]["gpm_metric_id"], row["source"]["factor"]) for row in schema["gpm_fields"]]
    try:
        nv.nvmlGpmSampleGet(handle, second)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(gpm)
        mg.sample1, mg.sample2 = first, second
        for i, (_, metric_id, _) in enumerate(gpm):
            mg.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(mg)
        out = {}
        for i, (key, _, factor) in enumerate(gpm):
            m = mg.metrics[i]
            out[key] = None if m.nvmlReturn != 0 else m.value * factor
        return out
    except nv.NVMLError as e:
        return {"error": str(e)}
    finally:
        nv.nvmlGpmSampleFree(first)
        nv.nvmlGpmSampleFree(second)


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _num(v):
    return None if isinstance(v, dict) or v is None else float(v)


def _smi_number(text: Optional[str]) -> Optional[float]:
    if text is None or text.startswith("[") or text in ("", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _pstate(text: Optional[str]) -> Optional[float]:
    if text and text.startswith("P") and text[1:].isdigit():
        return float(text[1:])
    return None


Comparator = Callable[[Any, Any], bool]


def compare(report: Report, device: str, name: str, ours, theirs, source: str, tol: str, cmp: Comparator):
    if ours is None and theirs is None:
        report.add(Row(device, name, None, None, source, tol, None, "absent on both"))
    elif ours is None or theirs is None:
        report.add(Row(device, name, ours, theirs, source, tol, False, "only one side has it"))
    else:
        report.add(Row(device, name, ours, theirs, source, tol, bool(cmp(ours, theirs))))


def compare_fields(report: Report, snap: dict, smi: list[dict], nvml: dict, schema: dict) -> None:
    ours = {d["uuid"]: d for d in snap["devices"]}
    smi_by_uuid = {r["uuid"]: r for r in smi}
    ref_by_uuid = {d["uuid"]: d for d in nvml["devices"]}
    compare(report, "node", "driver_version", snap.get("driver_version"), nvml["driver_version"],
            "pynvml", "exact", exact)
    if smi:
        compare(report, "node", "driver_version", snap.get("driver_version"),
                smi[0].get("driver_version"), "nvidia-smi", "exact", exact)
    cuda = nvml.get("cuda_driver_version")
    if isinstance(cuda, int):
        cuda = f"{cuda // 1000}.{cuda % 1000 // 10}"
    compare(report, "node", "cuda_driver_version", snap.get("cuda_driver_version"),
            cuda if isinstance(cuda, str) else None, "pynvml", "exact", exact)
    for uuid in sorted(set(ours) | set(smi_by_uuid) | set(ref_by_uuid)):
        d, s, r = ours.get(uuid), smi_by_uuid.get(uuid), ref_by_uuid.get(uuid)
        label = f"GPU {uuid}"
        if d is None or s is None or r is None:
            missing = [n for n, v in (("gpulse", d), ("nvidia-smi", s), ("pynvml", r)) if v is None]
            report.add(Row(label, "device listed", bool(d), bool(s and r), "all", "exact", False,
                           f"missing from {', '.join(missing)}"))
            continue
        # Static facts: exact.
        compare(report, label, "index", d["index"], int(s["index"]), "nvidia-smi", "exact", exact)
        compare(report, label, "name", d["name"], s["name"], "nvidia-smi", "exact", exact)
        compare(report, label, "name", d["name"], r["name"], "pynvml", "exact", exact)
        compare(report, label, "pci_bus_id", d["pci_bus_id"].upper(), r["pci_bus_id"].upper(),
                "pynvml", "exact", exact)
        compare(report, label, "pci_bus_id", d["pci_bus_id"].upper()[-12:], s["pci.bus_id"].upper()[-12:],
                "nvidia-smi", "exact (domain width differs)", exact)
        compare(report, label, "memory_total_bytes", d["memory_total_bytes"],
                _mib(s["memory.total"]), "nvidia-smi", "±1 MiB (MiB rounding)", within(MIB))
        compare(report, label, "power_limit_watts", d["power_limit_watts"],
                _smi_number(s["enforced.power.limit"]), "nvidia-smi", "±0.5 W", within(0.5))
        compare(report, label, "ecc_corrected_total", d.get("ecc_corrected_total"),
                _int(s["ecc.errors.corrected.aggregate.total"]), "nvidia-smi", "exact", exact)
        compare(report, label, "ecc_uncorrected_total", d.get("ecc_uncorrected_total"),
                _int(s["ecc.errors.uncorrected.aggregate.total"]), "nvidia-smi", "exact", exact)
        fan = _smi_number(s["fan.speed"])
        compare(report, label, "fan_speed", d.get("fan_speed"), None if fan is None else fan / 100.0,
                "nvidia-smi", "±0.05", within(0.05))
        # Live values: read a moment apart, so compared within a tolerance.
        compare(report, label, "memory_used_bytes", d["memory_used_bytes"], _mib(s["memory.used"]),
                "nvidia-smi", "±256 MiB (moves)", within(256 * MIB))
        compare(report, label, "utilization_gpu", d["utilization_gpu"],
                _pct(s["utilization.gpu"]), "nvidia-smi", "±0.15", within(0.15))
        compare(report, label, "temperature_celsius", d["temperature_celsius"],
                _smi_number(s["temperature.gpu"]), "nvidia-smi", "±3 °C", within(3))
        compare(report, label, "power_watts", d["power_watts"], _smi_number(s["power.draw"]),
                "nvidia-smi", "±20 W or 15 %", within(20, 0.15))
        for key, smi_key in (("sm_clock_mhz", "clocks.sm"), ("memory_clock_mhz", "clocks.mem"),
                             ("graphics_clock_mhz", "clocks.gr")):
            compare(report, label, key, _num(d[key]), _smi_number(s[smi_key]),
                    "nvidia-smi", "±15 % (idle clocks move)", within(1, 0.15))
        compare(report, label, "performance_state", _num(d["performance_state"]),
                _pstate(s["pstate"]), "nvidia-smi", "±2 (moves with load)", within(2))
        # Every device field of the schema, as pynvml reads it.
        for row in schema["device_fields"]:
            key = row["key"]
            theirs = r["fields"].get(key)
            if isinstance(theirs, dict):
                report.notes.append(f"{label}: pynvml could not read {key}: {theirs['error']}")
                theirs = None
            tol, cmp = TOLERANCES[key]
            compare(report, label, key, d.get(key), theirs, "pynvml", tol, cmp)
        ref_gpm = r.get("gpm") or {}
        if "error" in ref_gpm:
            report.notes.append(f"{label}: pynvml GPM read failed: {ref_gpm['error']}")
            ref_gpm = {}
        for row in schema["gpm_fields"]:
            key = row["key"]
            compare(report, label, key, d.get(key), ref_gpm.get(key), "pynvml GPM", *GPM_TOLERANCE)
        ours_pids = sorted({p["pid"] for p in snap["processes"] if p["device_uuid"] == uuid})
        if isinstance(r["pids"], list):
            compare(report, label, "compute PIDs", ours_pids, r["pids"], "pynvml",
                    "same set (a process may start or stop between reads)", _same_pids)


def _same_pids(ours, theirs) -> bool:
    # gpulse lists graphics processes too; every compute process pynvml sees must be there.
    return set(theirs) <= set(ours)


def _mib(text: Optional[str]) -> Optional[int]:
    v = _smi_number(text)
    return None if v is None else int(v * MIB)


def _pct(text: Optional[str]) -> Optional[float]:
    v = _smi_number(text)
    return None if v is None else v / 100.0


def _int(text: Optional[str]) -> Optional[int]:
    v = _smi_number(text)
    return None if v is None else int(v)


# ---------------------------------------------------------------------------------------------
# Steps 2 and 3: activity and join


BURN = """
import sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    n += 10
print(f"{n} bf16 8192^3 products in {seconds:.0f} s", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload_checks(report: Report, args, out: Path) -> None:
    python = args.python
    probe = subprocess.run(
        [python, "-c", "import torch, opentelemetry.sdk; print(torch.cuda.is_available())"],
        capture_output=True, text=True, timeout=120,
    )
    if probe.returncode != 0:
        raise CheckError(
            f"{python} cannot import torch and the OpenTelemetry SDK ({probe.stderr.strip().splitlines()[-1:]}); "
            "install examples/pytorch's requirements (carry wheels to a machine without network), "
            "or pass --no-workload to check the fields only"
        )
    if probe.stdout.strip() != "True":
        raise CheckError(f"{python}: torch.cuda.is_available() is False; the workload checks need CUDA")

    port = free_port()
    run_log = open(out / "gpulse-run.log", "w")
    run_out = open(out / "gpulse-run.jsonl", "w")
    workload_log = open(out / "workload.log", "w")
    gpulse = subprocess.Popen(
        [args.gpulse, "run", "--nvml-lib", args.nvml_lib, "--exporter", "stdout",
         "--sample-interval", "200ms", "--export-interval", "1s", "--kubelet-socket", "none",
         "--otlp-receiver-http", f"127.0.0.1:{port}"],
        stdout=run_out, stderr=run_log,
    )
    try:
        _wait_port(port, 30)
        time.sleep(args.idle_seconds)
        t_burn = time.time_ns()
        subprocess.run([python, "-c", BURN, str(args.burn_seconds)], stdout=workload_log,
                       stderr=subprocess.STDOUT, check=True, timeout=args.burn_seconds + 120)
        t_burn_end = time.time_ns()
        env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                   OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_SERVICE_NAME="gpulse-device-check",
                   OTEL_METRIC_EXPORT_INTERVAL="1000", OTEL_BSP_SCHEDULE_DELAY="500")
        train = subprocess.run(
            [python, str(REPO / "examples/pytorch/train.py"), "--device", "cuda", "--epochs", "3",
             "--steps-per-epoch", str(args.steps_per_epoch), "--batch-size", "2048",
             "--autocast", "bf16", "--sleep-per-step", "0.02"],
            env=env, stdout=workload_log, stderr=subprocess.STDOUT, timeout=300,
        )
        if train.returncode != 0:
            report.add(Row("workload", "train.py exit status", train.returncode, 0, "train.py",
                           "exact", False, "see workload.log"))
        time.sleep(3)  # one more export window, then a last flush at SIGTERM
    finally:
        gpulse.send_signal(signal.SIGTERM)
        try:
            gpulse.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gpulse.kill()
        run_out.close()
        run_log.close()
        workload_log.close()

    lines = [json.loads(l) for l in (out / "gpulse-run.jsonl").read_text().splitlines() if l.strip()]
    activity_checks(report, lines, t_burn, t_burn_end)
    join_checks(report, lines, out)
    companion_cuda_tests(report, python, out)


def companion_cuda_tests(report: Report, python: str, out: Path) -> None:
    """The companion's tests marked `cuda` (deselected everywhere else): the allocator gauges of
    a real device. They fail, not skip, when torch sees no device."""
    # Appended to workload.log: the output folder keeps to its 8 files.
    with open(out / "workload.log", "a") as log:
        log.write("\n--- examples/pytorch: pytest -m cuda ---\n")
        log.flush()
        tests = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"],
            cwd=REPO / "examples/pytorch", stdout=log, stderr=subprocess.STDOUT, timeout=600,
        )
    # pytest's exit status 5 is "no test selected": a marker that matched nothing is a failure too.
    report.add(Row("workload", "companion tests marked cuda (pytest -m cuda)", tests.returncode, 0,
                   "examples/pytorch/tests", "exact", tests.returncode == 0,
                   "see the end of workload.log"))


def _wait_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise CheckError(f"gpulse's OTLP receiver did not listen on 127.0.0.1:{port} within {seconds:.0f} s; see gpulse-run.log")


def _points(lines: list[dict], name: str, attr: Optional[tuple[str, str]] = None):
    """(hw.id, start, end, value) of every gauge point named `name` on a node resource."""
    for line in lines:
        for rm in line.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    if m.get("name") != name:
                        continue
                    for p in (m.get("gauge") or m.get("sum") or {}).get("dataPoints", []):
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in p.get("attributes", [])}
                        if attr and attrs.get(attr[0]) != attr[1]:
                            continue
                        value = p.get("asDouble", p.get("asInt"))
                        yield attrs.get("hw.id"), int(p.get("startTimeUnixNano", 0)), int(p["timeUnixNano"]), float(value)


def activity_checks(report: Report, lines: list[dict], start: int, end: int) -> None:
    for label, metric, attr, rise in (
        ("SM activity", "nvidia.gpu.sm.activity", None, 0.3),
        ("tensor activity", "nvidia.gpu.pipe.activity", ("nvidia.gpu.pipe", "tensor"), 0.2),
    ):
        during = [v for _, s, e, v in _points(lines, metric, attr) if s >= start and e <= end]
        before = [v for _, s, e, v in _points(lines, metric, attr) if e < start]
        if not during or not before:
            report.add(Row("workload", f"{label} rises under bf16 matmul", None, None, metric,
                           f"+{rise}", False, f"{len(before)} idle and {len(during)} busy points exported"))
            continue
        idle, busy = max(before), max(during)
        report.add(Row("workload", f"{label} rises under bf16 matmul", round(busy, 3), round(idle, 3),
                       f"{metric} busy vs idle max", f"busy ≥ idle + {rise}", busy >= idle + rise))


def join_checks(report: Report, lines: list[dict], out: Path) -> None:
    epochs = []
    for line in lines:
        for rs in line.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    if span.get("name") == "epoch":
                        keys = {a["key"] for a in span.get("attributes", [])}
                        epochs.append(keys)
    report.add(Row("join", "epoch spans forwarded", len(epochs), 3, "gpulse-run.jsonl", "= 3",
                   len(epochs) == 3))
    enriched = sum(1 for keys in epochs if "gpulse.gpu.utilization.mean" in keys)
    report.add(Row("join", "epoch spans enriched with gpulse.gpu.*", enriched, len(epochs),
                   "span attributes", "all", bool(epochs) and enriched == len(epochs)))
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples/pytorch/correlate.py"), "--format", "json",
         str(out / "gpulse-run.jsonl")],
        capture_output=True, text=True, timeout=60,
    )
    rows = []
    if proc.returncode == 0:
        rows = json.loads(proc.stdout)
        rows = rows if isinstance(rows, list) else rows.get("rows", [])
    joined = [r for r in rows if r.get("coverage") not in (None, 0)]
    report.add(Row("join", "epoch spans joined to the process's GPU metrics (correlate.py)",
                   len(joined), len(epochs), "correlate.py", "all, coverage > 0",
                   bool(epochs) and len(joined) == len(epochs),
                   "" if proc.returncode == 0 else proc.stderr.strip()[:300]))


# ---------------------------------------------------------------------------------------------
# Report


def write_report(report: Report, out: Path, started: float, args) -> None:
    summary = {
        "passed": not report.failed,
        "checks": len(report.rows),
        "failed": len(report.failed),
        "not_comparable": sum(1 for r in report.rows if r.ok is None),
        "seconds": round(time.monotonic() - started, 1),
        "workload": not args.no_workload,
        "rows": [r.__dict__ for r in report.rows],
        "notes": report.notes,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    lines = [
        "# gpulse device check",
        "",
        f"{summary['checks']} checks, {summary['failed']} failed, "
        f"{summary['not_comparable']} absent on both sides; {summary['seconds']} s."
        + ("" if not args.no_workload else " Fields only (--no-workload)."),
        "",
        "| device | value | gpulse | reference | source | tolerance | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        verdict = {True: "ok", False: "**FAIL**", None: "n/a"}[r.ok]
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.device} | {r.name} | {r.gpulse} | {r.reference} | {r.source} | {r.tolerance} | {verdict}{note} |")
    lines += [""] + [f"- {n}" for n in report.notes]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))
    for r in report.failed:
        print(f"FAIL {r.device} {r.name}: gpulse {r.gpulse} vs {r.source} {r.reference} ({r.tolerance}) {r.note}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpulse", default=str(REPO / "target/release/gpulse"))
    parser.add_argument("--nvml-lib", default=os.environ.get("GPULSE_NVML_LIB", "libnvidia-ml.so.1"))
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--python", default=sys.executable, help="Python with torch and the OTel SDK")
    parser.add_argument("--out", default=f"device-check-{time.strftime('%Y%m%dT%H%M%S')}")
    parser.add_argument("--no-workload", action="store_true", help="compare the fields only")
    parser.add_argument("--gpm-seconds", type=float, default=1.0)
    parser.add_argument("--schema", default=str(SCHEMA), help="gpulse's field schema (docs/schema.json)")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--burn-seconds", type=float, default=20.0)
    parser.add_argument("--steps-per-epoch", type=int, default=150)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = Report()
    try:
        if not Path(args.gpulse).is_file():
            raise CheckError(f"no gpulse binary at {args.gpulse}: build it (cargo build --release) or pass --gpulse")
        try:
            schema = load_schema(Path(args.schema))
        except (OSError, ValueError) as e:
            raise CheckError(f"cannot read the field schema {args.schema}: {e} "
                             "(`cargo run --example schema_docs` writes it)") from e
        problems = mapping_problems(schema)
        if problems:
            raise CheckError("the schema has fields this check cannot compare:\n  " + "\n  ".join(problems))
        snap = run_snapshot(args.gpulse, args.nvml_lib, out)
        smi = run_nvidia_smi(args.nvidia_smi, out)
        nvml = read_pynvml(args.gpm_seconds, schema)
        (out / "pynvml.json").write_text(json.dumps(nvml, indent=1, default=str) + "\n")
        compare_fields(report, snap, smi, nvml, schema)
        if not args.no_workload:
            workload_checks(report, args, out)
    except CheckError as e:
        write_report(report, out, started, args)
        print(f"device-check: {e}", file=sys.stderr)
        return 2
    write_report(report, out, started, args)
    print(f"everything is in {out}/")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
