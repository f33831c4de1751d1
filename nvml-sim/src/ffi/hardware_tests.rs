//! Unit tests of the GPM, MIG, NVLink and health entry points, called through the rlib.

use std::os::raw::c_uint;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use super::tests::{handle, with};
use crate::abi::{self, *};
use crate::ffi::device::*;
use crate::ffi::field_values::*;
use crate::ffi::gpm::*;
use crate::ffi::health::*;
use crate::ffi::mig::*;
use crate::ffi::nvlink::*;
use crate::ffi::process::*;
use crate::ffi::system::*;
use crate::runtime;

fn sample() -> nvmlGpmSample_t {
    let mut s: nvmlGpmSample_t = null_mut();
    assert_eq!(unsafe { nvmlGpmSampleAlloc(&mut s) }, SUCCESS);
    assert!(!s.is_null());
    s
}

/// `nvmlGpmMetricsGet` for `ids` between two samples: (call result, per-metric results).
fn metrics(s1: nvmlGpmSample_t, s2: nvmlGpmSample_t, ids: &[u32]) -> (Ret, Vec<(Ret, f64)>) {
    let mut mg: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    mg.version = NVML_GPM_METRICS_GET_VERSION;
    mg.numMetrics = ids.len() as u32;
    mg.sample1 = s1;
    mg.sample2 = s2;
    for (m, id) in mg.metrics.iter_mut().zip(ids) {
        m.metricId = *id;
    }
    let r = unsafe { nvmlGpmMetricsGet(&mut mg) };
    let out = mg.metrics[..ids.len()]
        .iter()
        .map(|m| (m.nvmlReturn, m.value))
        .collect();
    (r, out)
}

/// A successful metric within floating-point error of `expected`.
#[track_caller]
fn assert_close((r, v): (Ret, f64), expected: f64) {
    assert_eq!(r, SUCCESS);
    assert!((v - expected).abs() < 1e-6, "{v} != {expected}");
}

const SM: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
const TENSOR: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL;
const HMMA: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL;
const NVLINK_TX: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC;
const PCIE_RX: u32 = nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC;

#[test]
fn gpm_metrics_are_means_over_the_interval_between_two_samples() {
    // Real time, scale 1: SM activity steps from 0.2 to 0.8 at 1 s (wide for loaded hosts).
    let _g = with(
        r#"
[[device]]
[device.gpm]
sm_activity = { steps = [[0, 0.2], [1, 0.8]] }
tensor_activity = 0.4
[device.signals]
pcie_rx_kbps = 2048
"#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(0);
    let sim = runtime::sim().unwrap();
    let (s1, s2, s3) = (sample(), sample(), sample());
    assert_eq!(unsafe { nvmlGpmSampleGet(h, s1) }, SUCCESS);
    assert!(
        sim.clock.now() < 0.2,
        "the first sample must precede the step"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while sim.clock.now() < 1.5 {
        assert!(Instant::now() < deadline, "simulated clock did not advance");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(unsafe { nvmlGpmSampleGet(h, s2) }, SUCCESS);
    let (r, v) = metrics(s1, s2, &[SM, TENSOR, HMMA, PCIE_RX, NVLINK_TX, 8, 0]);
    assert_eq!(r, SUCCESS);
    assert_eq!(v[0].0, SUCCESS);
    assert!(
        v[0].1 > 20.5 && v[0].1 < 79.5,
        "straddling the step gives a mean between 20 % and 80 %, got {}",
        v[0].1
    );
    assert_close(v[1], 40.0);
    assert_close(v[2], 40.0); // HMMA follows `tensor_activity` by default
    assert_close(v[3], 2.0); // 2048 KiB/s is 2 MiB/s
    assert_eq!(v[4].0, NOT_SUPPORTED, "no NVLink on this GPU");
    assert_eq!(v[5].0, NOT_SUPPORTED, "metric 8 is not one NVML defines");
    assert_eq!(v[6].0, INVALID_ARGUMENT, "metric 0 does not exist");
    // Both after the step: exactly 80 %, in either order.
    assert_eq!(unsafe { nvmlGpmSampleGet(h, s3) }, SUCCESS);
    assert_close(metrics(s3, s2, &[SM]).1[0], 80.0);
    // An unfilled or freed sample is refused.
    let empty = sample();
    assert_eq!(metrics(s1, empty, &[SM]).0, INVALID_ARGUMENT);
    for s in [s1, s2, s3, empty] {
        assert_eq!(unsafe { nvmlGpmSampleFree(s) }, SUCCESS);
    }
    assert_eq!(
        unsafe { nvmlGpmSampleFree(s1) },
        INVALID_ARGUMENT,
        "double free"
    );
    assert_eq!(metrics(s2, s3, &[SM]).0, INVALID_ARGUMENT);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn gpm_support_follows_the_architecture_and_permission_faults_hit_samples() {
    let _g = with(
        r#"
[clock]
freeze_at_s = 10
[[device]]
architecture = "ampere"
[[device]]
architecture = "hopper"
[[device]]
architecture = "hopper"
[[fault]]
kind = "error"
field = "gpm"
error = "no_permission"
device = 2
from_s = 5
"#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut support = nvmlGpmSupport_t {
        version: NVML_GPM_SUPPORT_VERSION,
        isSupportedDevice: 9,
    };
    for (i, expected) in [(0, 0), (1, 1), (2, 1)] {
        assert_eq!(
            unsafe { nvmlGpmQueryDeviceSupport(handle(i), &mut support) },
            SUCCESS
        );
        assert_eq!(support.isSupportedDevice, expected, "GPU {i}");
    }
    support.version = 2;
    assert_eq!(
        unsafe { nvmlGpmQueryDeviceSupport(handle(1), &mut support) },
        ARGUMENT_VERSION_MISMATCH
    );
    let s = sample();
    assert_eq!(unsafe { nvmlGpmSampleGet(handle(0), s) }, NOT_SUPPORTED);
    assert_eq!(unsafe { nvmlGpmSampleGet(handle(1), s) }, SUCCESS);
    assert_eq!(
        unsafe { nvmlGpmSampleGet(handle(2), s) },
        NO_PERMISSION_CODE
    );
    assert_eq!(unsafe { nvmlGpmSampleFree(s) }, SUCCESS);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

const NO_PERMISSION_CODE: Ret = nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;

const MIG: &str = r#"
[clock]
freeze_at_s = 10
[[device]]
name = "NVIDIA H100 80GB HBM3"
mig = true
[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 1
uuid = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
memory_total_mib = 40192
[device.mig_instance.gpm]
sm_activity = 0.9
[[device.mig_instance]]
profile = "2g.20gb"
gpu_instance_id = 5
compute_instance_id = 0
memory_total_mib = 20096
[[device.process]]
pid = 11
memory_used_mib = 1024
gpu_instance_id = 1
compute_instance_id = 0
[[device.process]]
pid = 12
memory_used_mib = 512
gpu_instance_id = 5
compute_instance_id = 0
[[device]]
"#;

#[test]
fn mig_devices_have_their_own_handles_identity_memory_and_processes() {
    let _g = with(MIG);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let gpu = handle(0);
    let mut n: c_uint = 0;
    assert_eq!(
        unsafe { nvmlDeviceGetMaxMigDeviceCount(gpu, &mut n) },
        SUCCESS
    );
    assert_eq!(n, 7);
    let mut m: nvmlDevice_t = null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2, &mut m) },
        NOT_FOUND
    );
    assert_eq!(
        unsafe { nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7, &mut m) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0, &mut m) },
        SUCCESS
    );
    let mut is_mig: c_uint = 9;
    assert_eq!(
        unsafe { nvmlDeviceIsMigDeviceHandle(m, &mut is_mig) },
        SUCCESS
    );
    assert_eq!(is_mig, 1);
    assert_eq!(
        unsafe { nvmlDeviceIsMigDeviceHandle(gpu, &mut is_mig) },
        SUCCESS
    );
    assert_eq!(is_mig, 0);
    let mut parent: nvmlDevice_t = null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &mut parent) },
        SUCCESS
    );
    assert_eq!(parent, gpu);
    let (mut gi, mut ci) = (0, 9);
    assert_eq!(unsafe { nvmlDeviceGetGpuInstanceId(m, &mut gi) }, SUCCESS);
    assert_eq!(
        unsafe { nvmlDeviceGetComputeInstanceId(m, &mut ci) },
        SUCCESS
    );
    assert_eq!((gi, ci), (1, 0));
    assert_eq!(
        unsafe { nvmlDeviceGetGpuInstanceId(gpu, &mut gi) },
        NOT_SUPPORTED
    );

    let mut buf = [0 as std::os::raw::c_char; 96];
    assert_eq!(
        unsafe { nvmlDeviceGetUUID(m, buf.as_mut_ptr(), 96) },
        SUCCESS
    );
    let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(
        uuid.to_str().unwrap(),
        "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    );
    assert_eq!(
        unsafe { nvmlDeviceGetName(m, buf.as_mut_ptr(), 96) },
        SUCCESS
    );
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
    let mut mem = nvmlMemory_v2_t {
        version: abi::MEMORY_V2_VERSION,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(unsafe { nvmlDeviceGetMemoryInfo_v2(m, &mut mem) }, SUCCESS);
    assert_eq!(mem.total, 40192 << 20);
    assert_eq!(mem.used, 1024 << 20, "only the instance's process");

    // The instance lists its own process; the parent lists both with their instance ids.
    let mut infos = [nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    }; 4];
    let mut count: c_uint = 4;
    assert_eq!(
        unsafe { nvmlDeviceGetComputeRunningProcesses_v3(m, &mut count, infos.as_mut_ptr()) },
        SUCCESS
    );
    assert_eq!((count, infos[0].pid, infos[0].gpuInstanceId), (1, 11, 1));
    count = 4;
    assert_eq!(
        unsafe { nvmlDeviceGetComputeRunningProcesses_v3(gpu, &mut count, infos.as_mut_ptr()) },
        SUCCESS
    );
    assert_eq!(count, 2);
    assert_eq!((infos[1].pid, infos[1].gpuInstanceId), (12, 5));

    // Calls that do not answer for MIG devices say so.
    let mut p: c_uint = 0;
    assert_eq!(unsafe { nvmlDeviceGetPowerUsage(m, &mut p) }, NOT_SUPPORTED);
    // A GPU with MIG devices has no device-wide utilisation; the GPU without MIG has.
    let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
    assert_eq!(
        unsafe { nvmlDeviceGetUtilizationRates(gpu, &mut u) },
        NOT_SUPPORTED
    );
    assert_eq!(
        unsafe { nvmlDeviceGetUtilizationRates(handle(1), &mut u) },
        SUCCESS
    );

    // Per-instance GPM through the parent.
    let (s1, s2) = (sample(), sample());
    assert_eq!(unsafe { nvmlGpmMigSampleGet(gpu, 1, s1) }, SUCCESS);
    assert_eq!(unsafe { nvmlGpmMigSampleGet(gpu, 1, s2) }, SUCCESS);
    assert_eq!(unsafe { nvmlGpmMigSampleGet(gpu, 3, s2) }, NOT_FOUND);
    let (r, v) = metrics(s1, s2, &[SM, PCIE_RX]);
    assert_eq!(r, SUCCESS);
    assert_eq!(v[0], (SUCCESS, 90.0));
    assert_eq!(v[1].0, NOT_SUPPORTED, "no PCIe metric per instance");
    let whole = sample();
    assert_eq!(unsafe { nvmlGpmSampleGet(gpu, whole) }, SUCCESS);
    assert_eq!(
        metrics(s1, whole, &[SM]).0,
        INVALID_ARGUMENT,
        "mixed samples"
    );
    // The GPU without MIG mode has no instances.
    assert_eq!(
        unsafe { nvmlDeviceGetMigDeviceHandleByIndex(handle(1), 0, &mut m) },
        NOT_FOUND
    );
    assert_eq!(
        unsafe { nvmlGpmMigSampleGet(handle(1), 1, s1) },
        NOT_SUPPORTED
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
}

fn field_values(h: nvmlDevice_t, ids: &[(u32, u32)]) -> Vec<nvmlFieldValue_t> {
    let mut v: Vec<nvmlFieldValue_t> = ids
        .iter()
        .map(|(f, s)| {
            let mut x: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            x.fieldId = *f;
            x.scopeId = *s;
            x
        })
        .collect();
    assert_eq!(
        unsafe { nvmlDeviceGetFieldValues(h, v.len() as i32, v.as_mut_ptr()) },
        SUCCESS
    );
    v
}

#[test]
fn nvlink_field_values_honour_the_scope_and_count_per_link() {
    let _g = with(
        r#"
[clock]
freeze_at_s = 100
[[device]]
[device.nvlink]
links = 4
down = [2]
tx_kibps = { steps = [[0, 10], [50, 30]] }
rx_kibps = 5
crc_flit = 3
replay = 1
[device.signals]
pcie_replays = 7
[device.violation]
power = 0.5
[[device]]
"#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(0);
    use abi::field_id::*;
    let v = field_values(
        h,
        &[
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 2),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 4),
            (NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1, 0),
            (NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0),
            (NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 3),
            (NVML_FI_DEV_NVLINK_LINK_COUNT, 0),
            (NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0),
            (NVML_FI_DEV_ENERGY, 0),
        ],
    );
    let ull = |i: usize| {
        assert_eq!(v[i].nvmlReturn, SUCCESS, "field {i}");
        assert_eq!(
            v[i].valueType,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        );
        unsafe { v[i].value.ullVal }
    };
    assert_eq!(ull(0), 10 * 50 + 30 * 50, "KiB sent by link 0 in 100 s");
    assert_eq!(ull(1), 2000);
    assert_eq!(ull(2), 0, "link 2 is down");
    assert_eq!(ull(3), 500);
    assert_eq!(v[4].nvmlReturn, INVALID_ARGUMENT, "no link 4");
    assert_eq!(ull(5), 3);
    assert_eq!(ull(6), 9, "three active links with 3 each");
    assert_eq!(ull(7), 1);
    assert_eq!(unsafe { v[8].value.uiVal }, 4);
    assert_eq!(unsafe { v[9].value.uiVal }, 7);
    assert_eq!(v[10].nvmlReturn, NOT_SUPPORTED, "not modelled");
    assert!(v[0].timestamp > 0);

    let mut state = 9;
    assert_eq!(
        unsafe { nvmlDeviceGetNvLinkState(h, 1, &mut state) },
        SUCCESS
    );
    assert_eq!(state, nvmlEnableState_enum_NVML_FEATURE_ENABLED);
    assert_eq!(
        unsafe { nvmlDeviceGetNvLinkState(h, 2, &mut state) },
        SUCCESS
    );
    assert_eq!(state, nvmlEnableState_enum_NVML_FEATURE_DISABLED);
    assert_eq!(
        unsafe { nvmlDeviceGetNvLinkState(h, 4, &mut state) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { nvmlDeviceGetNvLinkState(handle(1), 0, &mut state) },
        NOT_SUPPORTED
    );

    let mut replays = 0;
    assert_eq!(
        unsafe { nvmlDeviceGetPcieReplayCounter(h, &mut replays) },
        SUCCESS
    );
    assert_eq!(replays, 7);
    let mut vt = nvmlViolationTime_t {
        referenceTime: 0,
        violationTime: 0,
    };
    let power = nvmlPerfPolicyType_enum_NVML_PERF_POLICY_POWER;
    assert_eq!(
        unsafe { nvmlDeviceGetViolationStatus(h, power, &mut vt) },
        SUCCESS
    );
    assert_eq!(vt.violationTime, 50_000_000_000, "half of 100 s, in ns");
    assert_eq!(
        unsafe { nvmlDeviceGetViolationStatus(h, 7, &mut vt) },
        INVALID_ARGUMENT
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn memory_temperature_is_a_field_value_only_where_the_scenario_sets_it() {
    let _g = with(
        r#"
[clock]
freeze_at_s = 100
[[device]]
[device.signals]
memory_temperature_c = { steps = [[0, 40], [50, 71.4]] }
[[device]]
"#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    use abi::field_id::*;
    let ids = [
        (NVML_FI_DEV_MEMORY_TEMP, 0),
        (NVML_FI_DEV_ENERGY, 0),
        (NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0),
    ];
    let v = field_values(handle(0), &ids);
    assert_eq!(v[0].nvmlReturn, SUCCESS);
    assert_eq!(
        v[0].valueType,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT
    );
    assert_eq!(unsafe { v[0].value.uiVal }, 71, "the step at 50 s, rounded");
    assert_eq!(v[0].fieldId, NVML_FI_DEV_MEMORY_TEMP);
    // One value the device lacks does not stop the others.
    assert_eq!(v[1].nvmlReturn, NOT_SUPPORTED);
    assert_eq!(v[2].nvmlReturn, SUCCESS);
    // A device whose scenario has no memory temperature: the value, not the call, fails.
    let v = field_values(handle(1), &ids[..1]);
    assert_eq!(v[0].nvmlReturn, NOT_SUPPORTED);
    assert_eq!(nvmlShutdown(), SUCCESS);
}
