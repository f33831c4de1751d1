"""ABI cross-check: NVIDIA's pynvml (nvidia-ml-py) must read from nvml-sim exactly the values a
scenario sets, through the same struct layouts and entry points it uses with a real driver.
Run: `cargo build -p nvml-sim && pytest tests/python` (see conftest.py for how the library is
found)."""

MIB = 1 << 20

SCENARIO = """
[driver]
version = "575.57.08"
nvml_version = "12.575.57.08"
cuda_version = "12.9"

[clock]
freeze_at_s = 100

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-11111111-2222-4333-8444-555555555555"
pci_bus_id = "00000000:18:00.0"
serial = "1650000000077"
minor = 0
memory_total_mib = 81559
memory_reserved_mib = 542
bar1_total_mib = 65536
bar1_used_mib = 300
power_limit_w = 700
energy_start_j = 5000
max_clocks_mhz = { graphics = 1980, sm = 1981, mem = 2619, video = 1965 }
fans = 2
ecc = true
pcie_generation = 4
pcie_width = 8

[device.signals]
gpu_util = { from = 0, to = 100, over = 200 }
mem_util = { steps = [[0, 10], [90, 45]] }
encoder_util = 7
decoder_util = 9
memory_used_mib = 40000
temperature_c = { mean = 60, amplitude = 10, period = 400 }
power_w = 350
clock_graphics_mhz = 1500
clock_sm_mhz = 1600
clock_mem_mhz = 2600
clock_video_mhz = 1400
fan_percent = 41
pcie_tx_kbps = 1234
pcie_rx_kbps = 5678
throttle_reasons = 0x24
ecc_corrected = 5
ecc_uncorrected = 1
pstate = 2

[[device.process]]
pid = 7001
name = "trainer"
memory_used_mib = 30000
sm_util = 80
mem_util = 40
enc_util = 1
dec_util = 2

[[device.process]]
pid = 7002
kind = "graphics"
memory_used_mib = 512
sm_util = 3

[[device]]
name = "NVIDIA H100 80GB HBM3"

[[fault]]
kind = "error"
device = 1
field = "temperature"

[[fault]]
kind = "error"
device = 1
field = "power_usage"
error = "no_permission"

[[fault]]
kind = "gpu_lost"
device = 1
from_s = 100
until_s = 101
"""


def test_identity_versions_and_pci(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        pci = nvmlDeviceGetPciInfo(h)
        result.update(
            driver=nvmlSystemGetDriverVersion(),
            nvml=nvmlSystemGetNVMLVersion(),
            cuda=nvmlSystemGetCudaDriverVersion(),
            cuda_v2=nvmlSystemGetCudaDriverVersion_v2(),
            count=nvmlDeviceGetCount(),
            name=nvmlDeviceGetName(h),
            uuid=nvmlDeviceGetUUID(h),
            serial=nvmlDeviceGetSerial(h),
            minor=nvmlDeviceGetMinorNumber(h),
            index=nvmlDeviceGetIndex(h),
            bus_id=pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
            bus_id_legacy=pci.busIdLegacy.decode() if isinstance(pci.busIdLegacy, bytes) else pci.busIdLegacy,
            pci=[pci.domain, pci.bus, pci.device, pci.pciDeviceId, pci.pciSubSystemId],
            by_uuid=nvmlDeviceGetIndex(nvmlDeviceGetHandleByUUID("GPU-11111111-2222-4333-8444-555555555555")),
            by_pci=nvmlDeviceGetIndex(nvmlDeviceGetHandleByPciBusId("0000:18:00.0")),
            arch=nvmlDeviceGetArchitecture(h),
            cc=list(nvmlDeviceGetCudaComputeCapability(h)),
            proc_name=nvmlSystemGetProcessName(7001),
        )
        nvmlShutdown()
        """,
    )
    assert r["driver"] == "575.57.08"
    assert r["nvml"] == "12.575.57.08"
    assert r["cuda"] == r["cuda_v2"] == 12090
    assert r["count"] == 2
    assert r["name"] == "NVIDIA H100 80GB HBM3"
    assert r["uuid"] == "GPU-11111111-2222-4333-8444-555555555555"
    assert r["serial"] == "1650000000077"
    assert (r["minor"], r["index"]) == (0, 0)
    assert r["bus_id"] == "00000000:18:00.0"
    assert r["bus_id_legacy"] == "0000:18:00.0"
    assert r["pci"] == [0, 0x18, 0, 0x233010DE, 0x16C110DE]
    assert (r["by_uuid"], r["by_pci"]) == (0, 0)
    assert r["arch"] == 9  # NVML_DEVICE_ARCH_HOPPER
    assert r["cc"] == [9, 0]
    assert r["proc_name"] == "trainer"


def test_memory_v1_and_v2(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        m1 = nvmlDeviceGetMemoryInfo(h)
        m2 = nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)
        result.update(v1=[m1.total, m1.free, m1.used],
                      v2=[m2.total, m2.reserved, m2.free, m2.used])
        """,
    )
    total, reserved, used = 81559 * MIB, 542 * MIB, 40000 * MIB
    assert r["v2"] == [total, reserved, total - reserved - used, used]
    # v1: reserved memory counts as used, as the driver reports it.
    assert r["v1"] == [total, total - reserved - used, used + reserved]


def test_bar1_memory(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        b = nvmlDeviceGetBAR1MemoryInfo(nvmlDeviceGetHandleByIndex(0))
        result.update(bar1=[b.bar1Total, b.bar1Free, b.bar1Used])
        """,
    )
    # nvmlBAR1Memory_t is total, free, used: a field order or width wrong in nvml-sim's
    # struct would move the 300 MiB elsewhere.
    assert r["bar1"] == [65536 * MIB, (65536 - 300) * MIB, 300 * MIB]


def test_telemetry_values(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        u = nvmlDeviceGetUtilizationRates(h)
        result.update(
            util=[u.gpu, u.memory],
            enc=list(nvmlDeviceGetEncoderUtilization(h)),
            dec=list(nvmlDeviceGetDecoderUtilization(h)),
            temp=nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU),
            temp_v=nvmlDeviceGetTemperatureV(h, NVML_TEMPERATURE_GPU),
            power=nvmlDeviceGetPowerUsage(h),
            limit=nvmlDeviceGetEnforcedPowerLimit(h),
            mgmt_limit=nvmlDeviceGetPowerManagementLimit(h),
            energy=nvmlDeviceGetTotalEnergyConsumption(h),
            clocks=[nvmlDeviceGetClockInfo(h, c) for c in
                    (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO)],
            max_sm=nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM),
            clock_current=nvmlDeviceGetClock(h, NVML_CLOCK_SM, NVML_CLOCK_ID_CURRENT),
            fans=nvmlDeviceGetNumFans(h),
            fan=nvmlDeviceGetFanSpeed(h),
            fan_v2=nvmlDeviceGetFanSpeed_v2(h, 1),
            pcie=[nvmlDeviceGetPcieThroughput(h, NVML_PCIE_UTIL_TX_BYTES),
                  nvmlDeviceGetPcieThroughput(h, NVML_PCIE_UTIL_RX_BYTES)],
            pcie_link=[nvmlDeviceGetCurrPcieLinkGeneration(h), nvmlDeviceGetCurrPcieLinkWidth(h)],
            throttle=nvmlDeviceGetCurrentClocksThrottleReasons(h),
            event_reasons=nvmlDeviceGetCurrentClocksEventReasons(h),
            supported=nvmlDeviceGetSupportedClocksThrottleReasons(h),
            ecc=[nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
                 nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC)],
            ecc_mode=list(nvmlDeviceGetEccMode(h)),
            pstate=nvmlDeviceGetPerformanceState(h),
            persistence=nvmlDeviceGetPersistenceMode(h),
            mig=list(nvmlDeviceGetMigMode(h)),
        )
        """,
    )
    assert r["util"] == [50, 45]  # ramp half way at t=100; the step at t=90
    assert r["enc"][0] == 7 and r["dec"][0] == 9
    assert r["enc"][1] > 0  # a sampling period in µs
    assert r["temp"] == r["temp_v"] == 70  # sine peak at a quarter period
    assert r["power"] == 350_000
    assert r["limit"] == r["mgmt_limit"] == 700_000
    assert r["energy"] == 5_000_000 + 350 * 100 * 1000  # mJ: start + 350 W x 100 s
    assert r["clocks"] == [1500, 1600, 2600, 1400]
    assert r["max_sm"] == 1981 and r["clock_current"] == 1600
    assert r["fans"] == 2 and r["fan"] == r["fan_v2"] == 41
    assert r["pcie"] == [1234, 5678]
    assert r["pcie_link"] == [4, 8]
    assert r["throttle"] == r["event_reasons"] == 0x24
    assert r["supported"] == 0x1FF
    assert r["ecc"] == [5, 1]
    assert r["ecc_mode"] == [1, 1]
    assert r["pstate"] == 2
    assert r["persistence"] == 1
    assert r["mig"] == [0, 0]


def test_process_lists_and_process_utilization(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        compute = nvmlDeviceGetComputeRunningProcesses(h)
        graphics = nvmlDeviceGetGraphicsRunningProcesses(h)
        samples = nvmlDeviceGetProcessUtilization(h, 0)
        result.update(
            compute=[[p.pid, p.usedGpuMemory] for p in compute],
            graphics=[[p.pid, p.usedGpuMemory] for p in graphics],
            mps=len(nvmlDeviceGetMPSComputeRunningProcesses(h)),
            samples=sorted([s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil] for s in samples),
            stamps=[s.timeStamp for s in samples],
        )
        result["newer"] = err(nvmlDeviceGetProcessUtilization, h, max(result["stamps"]))
        """,
    )
    assert r["compute"] == [[7001, 30000 * MIB]]
    assert r["graphics"] == [[7002, 512 * MIB]]
    assert r["mps"] == 0
    assert r["samples"] == [[7001, 80, 40, 1, 2], [7002, 3, 0, 0, 0]]
    assert min(r["stamps"]) > 1_600_000_000_000_000  # µs since the epoch
    assert r["newer"][0] == "NVMLError_NotFound"


def test_faults_raise_pynvml_exception_classes(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        result["lost_handle"] = err(nvmlDeviceGetHandleByIndex, 1)
        result["other_ok"] = err(nvmlDeviceGetHandleByIndex, 0)
        """,
    )
    assert r["lost_handle"][0] == "NVMLError_GpuIsLost"
    assert r["lost_handle"][2] == "GPU is lost"
    assert r["other_ok"] is None

    # The same device outside its lost window: field faults instead.
    faults = SCENARIO.replace("freeze_at_s = 100", "freeze_at_s = 50")
    r = pynvml_run(
        faults,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(1)
        result.update(
            temp=err(nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU),
            power=err(nvmlDeviceGetPowerUsage, h),
            util_ok=err(nvmlDeviceGetUtilizationRates, h),
            fan_none=err(nvmlDeviceGetFanSpeed, h),
        )
        """,
    )
    assert r["temp"][0] == "NVMLError_NotSupported" and r["temp"][2] == "Not Supported"
    assert r["power"][0] == "NVMLError_NoPermission"
    assert r["util_ok"] is None
    assert r["fan_none"][0] == "NVMLError_NotSupported"  # no fans on this board


def test_error_strings_and_init_refcount(pynvml_run):
    r = pynvml_run(
        SCENARIO,
        """
        nvmlInit()
        # pynvml looks symbols up only once the library is loaded (by the first init).
        result["strings"] = {str(c): nvmlErrorString(c) for c in (0, 1, 2, 3, 4, 7, 9, 15, 25, 999, 4242)}
        nvmlInit()
        nvmlShutdown()
        result["after_one_shutdown"] = nvmlDeviceGetCount()
        nvmlShutdown()
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
        c = c_uint()
        result["after_two"] = fn(byref(c))
        result["extra_shutdown"] = pynvml._nvmlGetFunctionPointer("nvmlShutdown")()
        """,
    )
    s = r["strings"]
    assert s["0"] == "Success"
    assert s["1"] == "Uninitialized"
    assert s["2"] == "Invalid Argument"
    assert s["3"] == "Not Supported"
    assert s["4"] == "Insufficient Permissions"
    assert s["7"] == "Insufficient Size"
    assert s["9"] == "Driver Not Loaded"
    assert s["15"] == "GPU is lost"
    assert s["25"] == "Argument version mismatch"
    assert s["999"] == s["4242"] == "Unknown Error"
    assert r["after_one_shutdown"] == 2
    assert r["after_two"] == 1  # NVML_ERROR_UNINITIALIZED
    assert r["extra_shutdown"] == 1


def test_xid_event_through_event_set(pynvml_run):
    scenario = """
    [clock]
    time_scale = 50
    [[device]]
    [[event]]
    at_s = 1
    device = 0
    xid = 79
    """
    r = pynvml_run(
        scenario,
        """
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        es = nvmlEventSetCreate()
        nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, es)
        d = nvmlEventSetWait(es, 5000)
        result.update(type=d.eventType, data=d.eventData,
                      same_device=nvmlDeviceGetUUID(d.device) == nvmlDeviceGetUUID(h),
                      timeout=err(nvmlEventSetWait, es, 20))
        nvmlEventSetFree(es)
        """,
    )
    assert r["type"] == 8  # nvmlEventTypeXidCriticalError
    assert r["data"] == 79
    assert r["same_device"] is True
    assert r["timeout"][0] == "NVMLError_Timeout"


def test_bad_scenario_fails_init_with_one_message(pynvml_run):
    r = pynvml_run(
        "[[device]]\nname = 3\n",
        """
        result["first"] = err(nvmlInit)
        result["second"] = err(nvmlInit)
        """,
    )
    assert r["first"][0] == r["second"][0] == "NVMLError_Unknown"
    msgs = [l for l in r["__stderr__"].splitlines() if l.startswith("nvml-sim:")]
    assert len(msgs) == 1, r["__stderr__"]
    assert "scenario.toml line 2, column 8" in msgs[0]


def test_real_pid_from_the_environment_and_start_offset(pynvml_run):
    scenario = """
    [[device]]
    [device.signals]
    gpu_util = { steps = [[0, 10], [100, 60], [100000, 90]] }
    [[device.process]]
    pid_env = "SIM_TEST_PID"
    memory_used_mib = 64
    """
    r = pynvml_run(
        scenario,
        """
        import os
        # Read by the library at init, so a test can put a real process on a GPU.
        os.environ["SIM_TEST_PID"] = str(os.getpid())
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        result.update(
            me=os.getpid(),
            comm=open("/proc/self/comm").read().strip(),
            procs=[[p.pid, p.usedGpuMemory] for p in nvmlDeviceGetComputeRunningProcesses(h)],
            name=nvmlSystemGetProcessName(os.getpid()),
            util=nvmlDeviceGetUtilizationRates(h).gpu,
        )
        """,
        env={"NVML_SIM_START_OFFSET": "150"},
    )
    assert r["procs"] == [[r["me"], 64 * MIB]]
    assert r["name"] == r["comm"]  # unnamed in the scenario: /proc/<pid>/comm, like the driver
    assert r["util"] == 60  # the clock started at 150 s


def test_time_scale_fast_forwards_the_scenario(pynvml_run):
    scenario = """
    [[device]]
    [device.signals]
    gpu_util = { steps = [[0, 10], [20, 60]] }
    """
    r = pynvml_run(
        scenario,
        """
        import time
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        result["before"] = nvmlDeviceGetUtilizationRates(h).gpu
        time.sleep(0.4)  # 40 simulated seconds at 100x
        result["after"] = nvmlDeviceGetUtilizationRates(h).gpu
        """,
        env={"NVML_SIM_TIME_SCALE": "100"},
    )
    assert (r["before"], r["after"]) == (10, 60)


# --- GPM, MIG, NVLink and health --------------------------------------------------------------

HOPPER = """
[clock]
freeze_at_s = 100

[[device]]
name = "NVIDIA H100 80GB HBM3"
mig = true
remapped_rows = { corrected = 2, uncorrected = 1, pending = true }

[device.signals]
pcie_tx_kbps = 3072
pcie_replays = 12
memory_temperature_c = 71

[device.violation]
power = 0.1
thermal = 0.02

[device.gpm]
sm_activity = 0.8
sm_occupancy = 0.5
tensor_activity = 0.0
dram_activity = 0.35
fp32_activity = 0.6

[device.nvlink]
links = 4
down = [2]
tx_kibps = { steps = [[0, 100], [50, 300]] }
rx_kibps = 50
crc_flit = 5
replay = 1

[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 1
uuid = "MIG-11111111-2222-5333-8444-555555555555"
memory_total_mib = 40192
[device.mig_instance.gpm]
sm_activity = 0.9
tensor_activity = 0.4

[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 2
uuid = "MIG-66666666-7777-5888-9999-aaaaaaaaaaaa"
memory_total_mib = 40192

[[device.process]]
pid = 8101
memory_used_mib = 2048
gpu_instance_id = 1
compute_instance_id = 0

[[device.process]]
pid = 8102
memory_used_mib = 1024
gpu_instance_id = 2
compute_instance_id = 0

[[device]]
name = "NVIDIA A100-SXM4-80GB"
architecture = "ampere"
"""

# Shared by the nvml-sim and other-nvml checks: reads everything back through pynvml.
READ_BACK = """
IDS = [NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_ANY_TENSOR_UTIL,
       NVML_GPM_METRIC_HMMA_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL, NVML_GPM_METRIC_FP32_UTIL,
       NVML_GPM_METRIC_PCIE_TX_PER_SEC, NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
       NVML_GPM_METRIC_NVLINK_L1_TX_PER_SEC]

def metrics(take):
    s1, s2 = nvmlGpmSampleAlloc(), nvmlGpmSampleAlloc()
    take(s1)
    take(s2)
    mg = c_nvmlGpmMetricsGet_t()
    mg.version = NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(IDS)
    mg.sample1, mg.sample2 = s1, s2
    for i, m in enumerate(IDS):
        mg.metrics[i].metricId = m
    nvmlGpmMetricsGet(mg)
    out = {}
    for i, m in enumerate(IDS):
        r = mg.metrics[i]
        unit = r.metricInfo.unit.decode() if r.metricInfo.unit else None
        out[str(m)] = [r.nvmlReturn, round(r.value, 6), unit]
    nvmlGpmSampleFree(s1)
    nvmlGpmSampleFree(s2)
    return out

nvmlInit()
gpu, other = nvmlDeviceGetHandleByIndex(0), nvmlDeviceGetHandleByIndex(1)
result["gpm_support"] = [nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in (gpu, other)]
result["gpm_gpu"] = metrics(lambda s: nvmlGpmSampleGet(gpu, s))
result["gpm_other"] = err(nvmlGpmSampleGet, other, nvmlGpmSampleAlloc())

result["mig_mode"] = list(nvmlDeviceGetMigMode(gpu))
result["max_mig"] = nvmlDeviceGetMaxMigDeviceCount(gpu)
migs = []
for i in range(result["max_mig"]):
    try:
        m = nvmlDeviceGetMigDeviceHandleByIndex(gpu, i)
    except NVMLError_NotFound:
        continue
    gi = nvmlDeviceGetGpuInstanceId(m)
    mem = nvmlDeviceGetMemoryInfo(m)
    parent = nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
    migs.append(dict(
        index=i,
        is_mig=nvmlDeviceIsMigDeviceHandle(m).value,
        gi=gi,
        ci=nvmlDeviceGetComputeInstanceId(m),
        uuid=nvmlDeviceGetUUID(m),
        name=nvmlDeviceGetName(m),
        total=mem.total,
        used=mem.used,
        parent_uuid=nvmlDeviceGetUUID(parent),
        procs=[[p.pid, p.gpuInstanceId, p.computeInstanceId]
               for p in nvmlDeviceGetComputeRunningProcesses(m)],
        gpm=metrics(lambda s: nvmlGpmMigSampleGet(gpu, gi, s)),
        temperature=err(nvmlDeviceGetTemperature, m, NVML_TEMPERATURE_GPU),
    ))
result["migs"] = migs
result["gpu_is_mig"] = nvmlDeviceIsMigDeviceHandle(gpu).value
result["gpu_uuid"] = nvmlDeviceGetUUID(gpu)
result["gpu_procs"] = [[p.pid, p.gpuInstanceId, p.computeInstanceId]
                       for p in nvmlDeviceGetComputeRunningProcesses(gpu)]

result["link_state"] = [nvmlDeviceGetNvLinkState(gpu, l) for l in range(4)]
result["link_state_other"] = err(nvmlDeviceGetNvLinkState, other, 0)
fields = [(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, l) for l in range(4)] + \\
         [(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, l) for l in range(4)] + \\
         [(NVML_FI_DEV_NVLINK_ERROR_DL_CRC, l) for l in range(4)] + \\
         [(NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, l) for l in range(4)] + \\
         [(NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, l) for l in range(4)] + \\
         [NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
          NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_LINK_COUNT,
          NVML_FI_DEV_PCIE_REPLAY_COUNTER, (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 9)]
vals = nvmlDeviceGetFieldValues(gpu, fields)
result["fields"] = [
    [v.nvmlReturn, v.valueType, v.value.ullVal if v.valueType == 3 else v.value.uiVal, v.scopeId]
    for v in vals
]
result["field_stamp"] = vals[0].timestamp
# The HBM temperature by field id, beside a field the library does not give: each value has its
# own nvmlReturn, and the one the device lacks does not stop the other.
result["memory_temp"] = [
    [[v.nvmlReturn, v.valueType, v.value.uiVal if v.nvmlReturn == 0 else None]
     for v in nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_ENERGY])]
    for h in (gpu, other)
]

result["remapped"] = [list(nvmlDeviceGetRemappedRows(h)) for h in (gpu, other)]
result["pcie_replays"] = [nvmlDeviceGetPcieReplayCounter(h) for h in (gpu, other)]
result["violation"] = [
    [nvmlDeviceGetViolationStatus(h, p).violationTime
     for p in (NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL, NVML_PERF_POLICY_SYNC_BOOST)]
    for h in (gpu, other)
]
result["violation_ref"] = nvmlDeviceGetViolationStatus(gpu, NVML_PERF_POLICY_POWER).referenceTime
nvmlShutdown()
"""

OK, NOT_SUPPORTED, INVALID_ARGUMENT, NO_PERMISSION = 0, 3, 2, 4
UINT, ULL = 1, 3


def gpm_ids(r):
    """Metric results keyed by pynvml's constant names' values, as strings (JSON keys)."""
    return {int(k): v for k, v in r.items()}


def test_nvml_sim_gpm_mig_nvlink_and_health_through_pynvml(pynvml_run):
    r = pynvml_run(HOPPER, READ_BACK)
    assert r["gpm_support"] == [1, 0]
    g = gpm_ids(r["gpm_gpu"])
    # SM, occupancy, tensor, HMMA, DRAM, FP32 in %, PCIe TX MiB/s, NVLink TX all / link 1.
    assert g[2] == [OK, 80.0, "%"]
    assert g[3] == [OK, 50.0, "%"]
    assert g[5] == [OK, 0.0, "%"]
    assert g[7] == [OK, 0.0, "%"]
    assert g[10] == [OK, 35.0, "%"]
    assert g[12] == [OK, 60.0, "%"]
    assert g[20] == [OK, 3.0, "MiB/sec"]
    # At t = 100 each active link sends 300 KiB/s; 3 of 4 links are up.
    assert g[61] == [OK, round(3 * 300 / 1024, 6), "MiB/sec"]
    assert g[65] == [OK, round(300 / 1024, 6), "MiB/sec"]
    assert r["gpm_other"][1] == NOT_SUPPORTED

    assert r["mig_mode"] == [1, 1]
    assert r["max_mig"] == 7
    assert r["gpu_is_mig"] == 0
    assert [m["gi"] for m in r["migs"]] == [1, 2]
    m1, m2 = r["migs"]
    assert m1["is_mig"] == 1 and m1["ci"] == 0
    assert m1["uuid"] == "MIG-11111111-2222-5333-8444-555555555555"
    assert m1["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert m1["total"] == 40192 * MIB and m1["used"] == 2048 * MIB
    assert m1["parent_uuid"] == r["gpu_uuid"]
    assert m1["procs"] == [[8101, 1, 0]] and m2["procs"] == [[8102, 2, 0]]
    assert r["gpu_procs"] == [[8101, 1, 0], [8102, 2, 0]]
    assert gpm_ids(m1["gpm"])[2] == [OK, 90.0, "%"]
    assert gpm_ids(m1["gpm"])[5] == [OK, 40.0, "%"]
    assert gpm_ids(m2["gpm"])[2] == [OK, 0.0, "%"]
    assert gpm_ids(m1["gpm"])[20][0] == NOT_SUPPORTED, "no PCIe per instance"
    assert m1["temperature"][1] == NOT_SUPPORTED

    assert r["link_state"] == [1, 1, 0, 1]
    assert r["link_state_other"][1] == NOT_SUPPORTED
    f = r["fields"]
    kib_tx = 100 * 50 + 300 * 50
    assert [x[2] for x in f[0:4]] == [kib_tx, kib_tx, 0, kib_tx], "scopeId picks the link"
    assert [x[3] for x in f[0:4]] == [0, 1, 2, 3]
    assert [x[2] for x in f[4:8]] == [5000, 5000, 0, 5000]
    assert [x[2] for x in f[8:12]] == [5, 5, 0, 5]
    assert [x[2] for x in f[12:16]] == [1, 1, 0, 1]
    assert [x[2] for x in f[16:20]] == [0, 0, 0, 0]
    assert all(x[0] == OK and x[1] == ULL for x in f[:20])
    assert f[20][2] == 5 and f[21][2] == 15 and f[22][2] == 3
    assert f[23][:3] == [OK, UINT, 4]
    assert f[24][:3] == [OK, UINT, 12]
    assert f[25][0] == INVALID_ARGUMENT, "no link 9"
    assert r["field_stamp"] > 1_600_000_000_000_000, "µs since the epoch"
    assert r["memory_temp"][0] == [[OK, UINT, 71], [NOT_SUPPORTED, ULL, None]]
    assert r["memory_temp"][1][0][0] == NOT_SUPPORTED, "no memory_temperature_c: no HBM reading"

    assert r["remapped"] == [[2, 1, 1, 0], [0, 0, 0, 0]]
    assert r["pcie_replays"] == [12, 0]
    assert r["violation"] == [[10_000_000_000, 2_000_000_000, 0], [0, 0, 0]]
    assert r["violation_ref"] > 1_600_000_000_000_000


def test_gpm_permission_denied_appears_at_its_time(pynvml_run):
    r = pynvml_run(
        """
        [clock]
        time_scale = 100
        [[device]]
        [device.signals]
        gpu_util = 50
        [[fault]]
        kind = "error"
        field = "gpm"
        error = "no_permission"
        from_s = 100
        """,
        """
        import time
        nvmlInit()
        h = nvmlDeviceGetHandleByIndex(0)
        s = nvmlGpmSampleAlloc()
        result["before"] = err(nvmlGpmSampleGet, h, s)
        deadline = time.monotonic() + 30
        while err(nvmlGpmSampleGet, h, s) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        result["after"] = err(nvmlGpmSampleGet, h, s)
        result["util"] = nvmlDeviceGetUtilizationRates(h).gpu
        result["support"] = nvmlGpmQueryDeviceSupport(h).isSupportedDevice
        nvmlShutdown()
        """,
    )
    assert r["before"] is None
    assert r["after"][1] == NO_PERMISSION
    assert r["util"] == 50 and r["support"] == 1


def test_other_nvml_gpm_mig_nvlink_and_health_through_pynvml(pynvml_run, other_nvml):
    """The same read-back against the independent C library, compared with the values its header
    comment documents."""
    r = pynvml_run("", READ_BACK, lib=other_nvml)
    assert r["gpm_support"] == [1, 0]
    g = gpm_ids(r["gpm_gpu"])
    assert [g[i][1] for i in (2, 3, 5, 7, 10, 12)] == [62.0, 31.5, 12.5, 11.0, 44.25, 27.0]
    assert g[20] == [OK, 1536.0, "MiB/sec"]
    assert g[61][1] == 10000.0 and g[65][1] == 2500.0
    assert r["gpm_other"][1] == NOT_SUPPORTED
    assert r["mig_mode"] == [1, 1] and r["max_mig"] == 7
    m1, m2 = r["migs"]
    assert (m1["gi"], m1["ci"], m2["gi"], m2["ci"]) == (3, 0, 5, 0)
    assert m1["uuid"] == "MIG-0ther000-aaaa-5bbb-8ccc-dddddddddd01"
    assert m2["name"] == "Other Board A MIG 1g.6gb"
    assert (m1["total"], m2["total"]) == (12 << 30, 6 << 30)
    assert m1["procs"] == [[4242, 3, 0]] and m2["procs"] == [[4343, 5, 0]]
    assert m1["used"] == 536870912 and m2["used"] == 268435456
    assert m1["parent_uuid"] == r["gpu_uuid"] == "GPU-0ther000-1111-2222-3333-444444444444"
    assert gpm_ids(m1["gpm"])[2][1] == 80.5 and gpm_ids(m2["gpm"])[5][1] == 0.0
    assert m1["temperature"][1] == NOT_SUPPORTED
    assert r["gpu_procs"] == [[4242, 3, 0], [4343, 5, 0]]
    assert r["link_state"] == [1, 1, 1, 1]
    assert r["link_state_other"][1] == NOT_SUPPORTED
    f = r["fields"]
    assert [x[2] for x in f[0:4]] == [1000000, 2000000, 3000000, 4000000]
    assert [x[2] for x in f[4:8]] == [500000, 1000000, 1500000, 2000000]
    assert [x[2] for x in f[8:12]] == [0, 1, 2, 3]
    assert [x[2] for x in f[12:16]] == [0, 2, 0, 0]
    assert [x[2] for x in f[16:20]] == [0, 0, 0, 1]
    assert f[20][2] == 1 and f[21][2] == 6 and f[22][2] == 2
    assert f[23][:3] == [OK, UINT, 4]
    assert f[24][:3] == [OK, UINT, 4]
    assert f[25][0] == INVALID_ARGUMENT
    assert r["memory_temp"][0][0] == [OK, UINT, 68]
    assert r["memory_temp"][0][1][0] == NOT_SUPPORTED
    assert r["memory_temp"][1][0][0] == NOT_SUPPORTED, "GPU 1 has no HBM reading"
    assert r["remapped"] == [[3, 0, 0, 0], [0, 2, 1, 0]]
    assert r["pcie_replays"] == [4, 0]
    assert r["violation"] == [[1500000000, 250000000, 0], [0, 7000000000, 0]]
