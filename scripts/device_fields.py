"""How NVIDIA's Python binding (pynvml) reads each field of gpulse's schema, for
scripts/device_check.py: ``docs/schema.json`` (generated from gpulse's src/schema) names each
device field's NVML call, the member of its answer and the factor to its unit, or its NVML field
id (``source.kind`` = ``field_id``); ``PYNVML_CALLS`` says how pynvml makes each call (field ids
need nothing: they are read together through ``nvmlDeviceGetFieldValues``, by pynvml's constant
of the same name), and ``TOLERANCES`` how far gpulse's reading and pynvml's, a moment apart, may
differ. ``mapping_problems`` names any schema field without either, and the
device check refuses to run until it has them, so a new field cannot go unchecked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "docs" / "schema.json"


def _fan_mean(nv, h):
    fans = nv.nvmlDeviceGetNumFans(h)
    if fans == 0:
        return None  # a board without fans: gpulse does not ask either
    return sum(nv.nvmlDeviceGetFanSpeed_v2(h, i) for i in range(fans)) / fans


def _memory_v2(nv, h):
    try:
        return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    except nv.NVMLError_FunctionNotFound:
        return nv.nvmlDeviceGetMemoryInfo(h)  # drivers before R510: no `reserved`, as in gpulse


# How pynvml makes each NVML call of the schema (docs/schema.json `source.call`): a function of
# (pynvml, handle) returning NVML's answer, a struct whose members the rows name or one number.
# The schema's `factor` turns it into the field's unit, as gpulse does. A schema call missing
# here stops the check (`mapping_problems`), so a new field cannot go unchecked.
PYNVML_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "MemoryInfo": _memory_v2,
    "Bar1MemoryInfo": lambda nv, h: nv.nvmlDeviceGetBAR1MemoryInfo(h),
    "UtilizationRates": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h),
    "EncoderUtilization": lambda nv, h: nv.nvmlDeviceGetEncoderUtilization(h)[0],
    "DecoderUtilization": lambda nv, h: nv.nvmlDeviceGetDecoderUtilization(h)[0],
    "GpuTemperature": lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
    "PowerUsage": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h),
    "EnforcedPowerLimit": lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h),
    "TotalEnergyConsumption": lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h),
    "SmClock": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
    "MemoryClock": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
    "GraphicsClock": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS),
    "FanSpeeds": _fan_mean,
    "PcieTxThroughput": lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
    "PcieRxThroughput": lambda nv, h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
    "CorrectedEccErrors": lambda nv, h: nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
    "UncorrectedEccErrors": lambda nv, h: nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
    # NVML_PSTATE_UNKNOWN (32) is no value, as in gpulse.
    "PerformanceState": lambda nv, h: (lambda p: p if p <= 15 else None)(nv.nvmlDeviceGetPerformanceState(h)),
    "PcieReplayCounter": lambda nv, h: nv.nvmlDeviceGetPcieReplayCounter(h),
    "CurrPcieLinkGeneration": lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "CurrPcieLinkWidth": lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
}

MIB = 1024 * 1024


def exact(a, b) -> bool:
    return a == b


def within(abs_tol: float, rel_tol: float = 0.0):
    return lambda a, b: abs(float(a) - float(b)) <= max(abs_tol, rel_tol * abs(float(b)))


# How each schema field is compared with pynvml's reading (gpulse's snapshot and pynvml read a
# moment apart): exact for what does not move, a stated tolerance for live values. A schema
# field missing here stops the check, like a missing call.
TOLERANCES: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "memory_total_bytes": ("exact", exact),
    "memory_used_bytes": ("±256 MiB (moves)", within(256 * MIB)),
    "memory_free_bytes": ("±256 MiB (moves)", within(256 * MIB)),
    "memory_reserved_bytes": ("exact", exact),
    "bar1_total_bytes": ("exact", exact),
    "bar1_used_bytes": ("±64 MiB (moves)", within(64 * MIB)),
    "bar1_free_bytes": ("±64 MiB (moves)", within(64 * MIB)),
    "utilization_gpu": ("±0.15", within(0.15)),
    "utilization_memory": ("±0.15", within(0.15)),
    "utilization_encoder": ("±0.15", within(0.15)),
    "utilization_decoder": ("±0.15", within(0.15)),
    "temperature_celsius": ("±3 °C", within(3)),
    "power_watts": ("±20 W or 15 %", within(20, 0.15)),
    "power_limit_watts": ("±0.5 W", within(0.5)),
    "energy_joules": ("±5 kJ (counts on between reads)", within(5000)),
    "sm_clock_mhz": ("±15 % (idle clocks move)", within(1, 0.15)),
    "memory_clock_mhz": ("±15 % (idle clocks move)", within(1, 0.15)),
    "graphics_clock_mhz": ("±15 % (idle clocks move)", within(1, 0.15)),
    "fan_speed": ("±0.05", within(0.05)),
    "pcie_tx_bytes_per_second": ("±64 MiB/s or 50 % (traffic moves)", within(64 * MIB, 0.5)),
    "pcie_rx_bytes_per_second": ("±64 MiB/s or 50 % (traffic moves)", within(64 * MIB, 0.5)),
    "ecc_corrected_total": ("exact", exact),
    "ecc_uncorrected_total": ("exact", exact),
    "performance_state": ("±2 (moves with load)", within(2)),
    "pcie_replays_total": ("exact", exact),
    "pcie_link_generation": ("±3 (an idle link trains down)", within(3)),
    "pcie_link_width": ("exact", exact),
    "memory_temperature_celsius": ("±3 °C", within(3)),
}

GPM_TOLERANCE = ("±0.10 (different sample pairs)", within(0.10))


def load_schema(path: Path = SCHEMA) -> dict:
    """docs/schema.json; OSError or ValueError when it cannot be read."""
    return json.loads(path.read_text())


def mapping_problems(schema: dict) -> list[str]:
    """What the schema has that this check cannot compare: a call pynvml is not taught to make,
    or a field without a tolerance."""
    problems = []
    for row in schema["device_fields"]:
        source = row["source"]
        if source.get("kind") == "field_id":
            name = source["field_id"]["name"]
            if not name.startswith("NVML_FI_"):
                problems.append(f"{row['key']}: {name} is not an NVML field id")
            if row["key"] not in TOLERANCES:
                problems.append(f"{row['key']}: no tolerance; add it to TOLERANCES")
            continue
        call = source["call"]
        if call not in PYNVML_CALLS:
            problems.append(f"{row['key']}: no pynvml reading for {call} ({row['source']['function']}); add it to PYNVML_CALLS")
        if row["key"] not in TOLERANCES:
            problems.append(f"{row['key']}: no tolerance; add it to TOLERANCES")
    return problems


def _field_id_values(nv, h, rows: list) -> dict:
    """The field-id rows, read together in one nvmlDeviceGetFieldValues call as gpulse reads
    them: each value scaled by its factor, or {"error": ...} for the call's error or the value's
    own nvmlReturn (NOT_SUPPORTED where the device lacks the field)."""
    if not rows:
        return {}
    ids = []
    for row in rows:
        fid = row["source"]["field_id"]
        ours = getattr(nv, fid["name"], None)
        if ours != fid["id"]:
            raise ValueError(f"{row['key']}: pynvml's {fid['name']} is {ours}, the schema's {fid['id']}")
        ids.append(ours)
    try:
        values = nv.nvmlDeviceGetFieldValues(h, ids)
    except nv.NVMLError as e:
        return {row["key"]: {"error": str(e)} for row in rows}
    out: dict[str, Any] = {}
    for row, v in zip(rows, values):
        if v.nvmlReturn != nv.NVML_SUCCESS:
            out[row["key"]] = {"error": str(nv.NVMLError(v.nvmlReturn))}
            continue
        member = {
            nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            getattr(nv, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
            getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
        }.get(v.valueType)
        if member is None:
            out[row["key"]] = {"error": f"value type {v.valueType}"}
            continue
        out[row["key"]] = getattr(v.value, member) * row["source"]["factor"]
    return out


def schema_fields(nv, h, schema: dict) -> dict:
    """Every device field of the schema as pynvml reads it: each call made once, each row's
    member scaled by its factor, the field-id rows in one nvmlDeviceGetFieldValues call; an
    error as {"error": ...}."""
    answers: dict[str, Any] = {}
    fields: dict[str, Any] = _field_id_values(
        nv, h, [r for r in schema["device_fields"] if r["source"].get("kind") == "field_id"])
    for row in schema["device_fields"]:
        source = row["source"]
        if source.get("kind") == "field_id":
            continue
        call = source["call"]
        if call not in answers:
            try:
                answers[call] = PYNVML_CALLS[call](nv, h)
            except nv.NVMLError as e:
                answers[call] = {"error": str(e)}
        answer = answers[call]
        if isinstance(answer, dict):
            fields[row["key"]] = answer
            continue
        value = getattr(answer, source["member"], None) if source["member"] else answer
        fields[row["key"]] = None if value is None else value * source["factor"]
    return fields
