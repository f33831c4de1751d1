"""scripts/device-check, fields only, on a machine without a GPU: gpulse reads the independent
NVML (tests/fixtures/other-nvml), then nvml-sim, while NVIDIA's binding and a stand-in nvidia-smi
read the same library, so every compared value is real; every field of docs/schema.json must be
compared through its pynvml reading; then a mismatch, or a schema field the check has no
pynvml reading for, must fail the check."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _find_cdylib() -> Path:
    # conftest.py has the same lookup, but pytest run over several test folders (as
    # scripts/test does) may import another folder's conftest under that name.
    target = os.environ.get("GPULSE_TARGET_DIR")
    candidates = ([Path(target) / "debug" / "libnvidia_ml.so"] if target else []) + [
        REPO / "target/debug/libnvidia_ml.so"
    ]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"libnvidia_ml.so not built (looked in {candidates}); run `cargo build -p nvml-sim`", pytrace=False)

OTHER_NVML = REPO / "tests" / "fixtures" / "other-nvml" / "other_nvml.c"
STANDIN = REPO / "tests" / "fixtures" / "nvidia-smi"


def _gpulse() -> Path:
    target = os.environ.get("GPULSE_TARGET_DIR")
    candidates = ([Path(target) / "debug" / "gpulse"] if target else []) + [REPO / "target/debug/gpulse"]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"gpulse not built (looked in {candidates}); run `cargo build` first", pytrace=False)


@pytest.fixture(scope="module")
def other_nvml(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("other-nvml")
    lib = d / "libnvidia-ml.so.1"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(OTHER_NVML)], check=True)
    return lib


@pytest.fixture
def holder():
    """A real process listed on GPU 0, so the PID comparison has something to compare."""
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def _device_check(lib: Path, gpulse_lib: Path, out: Path, pid: int, **extra_env) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        **extra_env,
        LD_LIBRARY_PATH=str(lib.parent),
        OTHER_NVML_PIDS=f"{pid}:1048576",
        # the stand-in is a Python script that needs this interpreter's pynvml
        PATH=f"{STANDIN}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHON=sys.executable,
    )
    return subprocess.run(
        [str(REPO / "scripts/device-check"), "--gpulse", str(_gpulse()), "--nvml-lib", str(gpulse_lib),
         "--no-workload", "--gpm-seconds", "0.2", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )


def _rows(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return summary, {(r["device"], r["name"], r["source"]): r for r in summary["rows"]}


def test_fields_agree_on_the_independent_nvml(other_nvml, holder, tmp_path):
    out = tmp_path / "check"
    proc = _device_check(other_nvml, other_nvml, out, holder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary, rows = _rows(out)
    assert summary["passed"] and summary["failed"] == 0
    gpu0 = "GPU GPU-0ther000-1111-2222-3333-444444444444"
    # Values other_nvml.c documents, seen by both sides.
    assert rows[(gpu0, "sm_activity", "pynvml GPM")]["gpulse"] == pytest.approx(0.62)
    assert rows[(gpu0, "sm_activity", "pynvml GPM")]["ok"] is True
    assert rows[(gpu0, "tensor_activity", "pynvml GPM")]["reference"] == pytest.approx(0.125)
    assert rows[(gpu0, "temperature_celsius", "nvidia-smi")]["ok"] is True
    # The field-id row: GPU 0's HBM temperature on both sides; GPU 1 answers NOT_SUPPORTED for
    # that value alone, so neither side has it and its other fields are still compared.
    assert rows[(gpu0, "memory_temperature_celsius", "pynvml")]["gpulse"] == 68
    assert rows[(gpu0, "memory_temperature_celsius", "pynvml")]["ok"] is True
    assert rows[(gpu0, "compute PIDs", "pynvml")]["gpulse"] == [holder]
    compared = sum(1 for r in summary["rows"] if r["ok"] is True)
    assert compared >= 60, f"only {compared} values compared"
    # A device run returns at most 8 files from its output folder.
    assert len(list(out.iterdir())) <= 8
    assert "| sm_activity | 0.62 | 0.62 |" in (out / "report.md").read_text()


def test_a_disagreeing_gpulse_fails_the_check(other_nvml, holder, tmp_path):
    # gpulse reads the simulator's default node while the references read other-nvml.
    sim = tmp_path / "sim"
    sim.mkdir()
    shutil.copy(_find_cdylib(), sim / "libnvidia_ml.so")
    out = tmp_path / "check"
    env_scenario = REPO / "nvml-sim" / "scenarios" / "default.toml"
    os.environ["NVML_SIM_SCENARIO"] = str(env_scenario)
    try:
        proc = _device_check(other_nvml, sim / "libnvidia_ml.so", out, holder)
    finally:
        del os.environ["NVML_SIM_SCENARIO"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary, _ = _rows(out)
    assert not summary["passed"]
    assert any("missing from gpulse" in r["note"] for r in summary["rows"]), summary["rows"][:5]
    assert "FAIL" in proc.stdout


def _gauge_line(name, points, attrs=()):
    return {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": name, "gauge": {"dataPoints": [
        {"startTimeUnixNano": str(s), "timeUnixNano": str(e), "asDouble": v,
         "attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-x"}}]
         + [{"key": k, "value": {"stringValue": val}} for k, val in attrs]}
        for s, e, v in points]}}]}]}]}


def test_activity_must_rise_while_the_matmul_runs():
    sys.path.insert(0, str(REPO / "scripts"))
    import device_check

    idle = [(0, 10, 0.01), (10, 20, 0.02)]
    busy = [(30, 40, 0.9), (40, 50, 0.85)]
    flat = [(30, 40, 0.05), (40, 50, 0.04)]
    for points, tensor, expected in ((busy, busy, [True, True]), (flat, busy, [False, True]),
                                     (busy, [], [True, False])):
        lines = [_gauge_line("nvidia.gpu.sm.activity", idle + points),
                 _gauge_line("nvidia.gpu.pipe.activity", idle + tensor, [("nvidia.gpu.pipe", "tensor")])]
        report = device_check.Report()
        device_check.activity_checks(report, lines, 25, 55)
        assert [r.ok for r in report.rows] == expected, [r.__dict__ for r in report.rows]


# Every device field given (fans, ECC, encoder, PCIe traffic and replays, a P-state, BAR1) and
# constant, so pynvml's reading a moment after gpulse's must agree; only energy counts on.
SIM_SCENARIO = """
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-dc000000-1111-4111-8111-111111111111"
fans = 2
energy_start_j = 1000
bar1_used_mib = 300
[device.signals]
gpu_util = 62
mem_util = 31
encoder_util = 7
decoder_util = 9
temperature_c = 58
memory_temperature_c = 66
power_w = 412.5
clock_sm_mhz = 1755
clock_mem_mhz = 2619
clock_graphics_mhz = 1740
fan_percent = 44
pcie_tx_kbps = 123456
pcie_rx_kbps = 654321
ecc_corrected = 5
ecc_uncorrected = 1
pstate = 2
pcie_replays = 3
[device.gpm]
sm_activity = 0.5
sm_occupancy = 0.375
tensor_activity = 0.25
dram_activity = 0.125
fp16_activity = 0.0625
fp32_activity = 0.5
fp64_activity = 0.25
integer_activity = 0.125
graphics_activity = 0.75
[[device.process]]
pid_env = "DEVICE_CHECK_PID"
memory_used_mib = 1024
"""


def _schema() -> dict:
    return json.loads((REPO / "docs" / "schema.json").read_text())


def test_every_schema_field_agrees_with_pynvml_on_nvml_sim(holder, tmp_path):
    sim = tmp_path / "sim"
    sim.mkdir()
    lib = sim / "libnvidia-ml.so.1"
    shutil.copy(_find_cdylib(), lib)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SIM_SCENARIO)
    out = tmp_path / "check"
    proc = _device_check(lib, lib, out, holder, NVML_SIM_SCENARIO=str(scenario),
                         DEVICE_CHECK_PID=str(holder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary, rows = _rows(out)
    gpu = "GPU GPU-dc000000-1111-4111-8111-111111111111"
    schema = _schema()
    for field in schema["device_fields"]:
        row = rows.get((gpu, field["key"], "pynvml"))
        assert row is not None, f"{field['key']} was not compared with pynvml"
        # Compared, not "absent on both": the scenario gives every field.
        assert row["ok"] is True, row
    for field in schema["gpm_fields"]:
        assert rows[(gpu, field["key"], "pynvml GPM")]["ok"] is True, field["key"]
    # Values the scenario sets, through pynvml's member and the schema's factor.
    assert rows[(gpu, "bar1_used_bytes", "pynvml")]["reference"] == 300 * 1024 * 1024
    assert rows[(gpu, "fan_speed", "pynvml")]["reference"] == pytest.approx(0.44)
    assert rows[(gpu, "pcie_tx_bytes_per_second", "pynvml")]["reference"] == 123456 * 1024
    assert rows[(gpu, "power_watts", "pynvml")]["reference"] == pytest.approx(412.5)
    # A field-id row: read by pynvml through nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP).
    assert rows[(gpu, "memory_temperature_celsius", "pynvml")]["reference"] == 66
    assert rows[(gpu, "graphics_activity", "pynvml GPM")]["reference"] == pytest.approx(0.75)


def test_a_schema_field_without_a_pynvml_reading_stops_the_check(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import device_check

    # The committed schema: every field has its reading and its tolerance.
    assert device_check.mapping_problems(_schema()) == []
    schema = _schema()
    new = json.loads(json.dumps(schema["device_fields"][0]))
    new["key"] = "shiny_new_field"
    new["source"]["call"] = "ShinyNewCall"
    new["source"]["function"] = "nvmlDeviceGetShinyNew"
    schema["device_fields"].append(new)
    problems = device_check.mapping_problems(schema)
    assert len(problems) == 2 and all("shiny_new_field" in p for p in problems), problems
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/device_check.py"), "--gpulse", str(_gpulse()),
         "--schema", str(path), "--no-workload", "--out", str(tmp_path / "check")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no pynvml reading for ShinyNewCall" in proc.stderr, proc.stderr
