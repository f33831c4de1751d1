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
power_limit_w = 700
energy_start_j = 5000
max_clocks_mhz = { graphics = 1980, sm = 1981, mem = 2619, video = 1965 }
fans = 2
ecc = true

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
