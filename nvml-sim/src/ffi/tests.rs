//! Unit tests of the exported functions, called directly through the rlib. Each test installs
//! its own scenario under a process-wide lock (the library state is global, as in the driver).

use std::os::raw::{c_char, c_uint};
use std::ptr::{null, null_mut};

use crate::abi::{self, *};
use crate::ffi::device::*;
use crate::ffi::events::*;
use crate::ffi::process::*;
use crate::ffi::system::*;
use crate::runtime;
use crate::scenario::{compile, Env};

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// Installs `scenario` (not yet initialised) and holds the test lock.
pub(super) fn with(scenario: &str) -> std::sync::MutexGuard<'static, ()> {
    let guard = runtime::test_lock();
    let sim = compile("unit-test", scenario, &NoEnv).unwrap_or_else(|e| panic!("{e}"));
    runtime::replace_for_tests(sim);
    guard
}

pub(super) fn handle(i: u32) -> nvmlDevice_t {
    let mut h: nvmlDevice_t = null_mut();
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut h) }, SUCCESS);
    h
}

const TWO_GPUS: &str = r#"
[driver]
version = "570.1.2"
[clock]
freeze_at_s = 50
[[device]]
count = 2
memory_total_mib = 1000
memory_reserved_mib = 100
[device.signals]
gpu_util = 77
power_w = 300
[[device.process]]
pid = 100
count = 3
memory_used_mib = 10
[[device.process]]
pid = 900
kind = "graphics"
memory_used_mib = 5
active_from_s = 60
"#;

#[test]
fn calls_before_init_are_uninitialized_and_init_is_reference_counted() {
    let _g = with(TWO_GPUS);
    let mut n: c_uint = 0;
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, UNINITIALIZED);
    assert_eq!(nvmlShutdown(), UNINITIALIZED);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    assert_eq!(nvmlInitWithFlags(0), SUCCESS);
    assert_eq!(nvmlShutdown(), SUCCESS);
    assert_eq!(
        unsafe { nvmlDeviceGetCount_v2(&mut n) },
        SUCCESS,
        "one reference left"
    );
    assert_eq!(n, 2);
    assert_eq!(nvmlShutdown(), SUCCESS);
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, UNINITIALIZED);
    assert_eq!(nvmlShutdown(), UNINITIALIZED);
}

#[test]
fn null_pointers_and_foreign_handles_are_invalid_arguments() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit(), SUCCESS);
    assert_eq!(
        unsafe { nvmlDeviceGetCount_v2(null_mut()) },
        INVALID_ARGUMENT
    );
    let h = handle(0);
    assert_eq!(
        unsafe { nvmlDeviceGetPowerUsage(h, null_mut()) },
        INVALID_ARGUMENT
    );
    let mut v: c_uint = 0;
    let bogus = 0x1234usize as nvmlDevice_t;
    assert_eq!(
        unsafe { nvmlDeviceGetPowerUsage(bogus, &mut v) },
        INVALID_ARGUMENT
    );
    let misaligned = (h as usize + 1) as nvmlDevice_t;
    assert_eq!(
        unsafe { nvmlDeviceGetPowerUsage(misaligned, &mut v) },
        INVALID_ARGUMENT
    );
    let mut out: nvmlDevice_t = null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(2, &mut out) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByUUID(null(), &mut out) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut out) },
        NOT_FOUND
    );
    assert_eq!(unsafe { nvmlDeviceGetPowerUsage(h, &mut v) }, SUCCESS);
    assert_eq!(v, 300_000);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn strings_need_room_for_the_terminator() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut buf = [0 as c_char; 80];
    assert_eq!(
        unsafe { nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 7) },
        INSUFFICIENT_SIZE
    );
    assert_eq!(
        unsafe { nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 8) },
        SUCCESS
    );
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(s.to_str().unwrap(), "570.1.2");
    let msg = unsafe { std::ffi::CStr::from_ptr(nvmlErrorString(GPU_IS_LOST)) };
    assert_eq!(msg.to_str().unwrap(), "GPU is lost");
    let msg = unsafe { std::ffi::CStr::from_ptr(nvmlErrorString(12345)) };
    assert_eq!(msg.to_str().unwrap(), "Unknown Error");
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn process_lists_follow_the_two_call_protocol() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(1);
    let mut count: c_uint = 0;
    let r = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, null_mut()) };
    assert_eq!((r, count), (INSUFFICIENT_SIZE, 3));
    let mut buf = vec![unsafe { std::mem::zeroed::<nvmlProcessInfo_t>() }; 2];
    count = 2;
    let r = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, buf.as_mut_ptr()) };
    assert_eq!((r, count), (INSUFFICIENT_SIZE, 3), "too small a buffer");
    let mut buf = vec![unsafe { std::mem::zeroed::<nvmlProcessInfo_t>() }; 8];
    count = 8;
    let r = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, buf.as_mut_ptr()) };
    assert_eq!((r, count), (SUCCESS, 3));
    // Copy 1 of the template: PIDs shifted by the 4 literal PIDs the template declares.
    let pids: Vec<u32> = buf[..3].iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![104, 105, 106]);
    assert_eq!(buf[0].usedGpuMemory, 10 << 20);
    assert_eq!(buf[0].gpuInstanceId, NO_INSTANCE);
    // The graphics process only starts at t=60; the clock is frozen at 50: empty list.
    count = 0;
    let r = unsafe { nvmlDeviceGetGraphicsRunningProcesses_v3(h, &mut count, null_mut()) };
    assert_eq!((r, count), (SUCCESS, 0));
    // v1 layout: 16-byte entries.
    let mut v1 = vec![unsafe { std::mem::zeroed::<nvmlProcessInfo_v1_t>() }; 3];
    count = 3;
    let r = unsafe { nvmlDeviceGetComputeRunningProcesses(h, &mut count, v1.as_mut_ptr()) };
    assert_eq!(
        (r, v1[2].pid, v1[2].usedGpuMemory),
        (SUCCESS, 106, 10 << 20)
    );
    assert_eq!(
        unsafe { nvmlDeviceGetComputeRunningProcesses_v3(h, null_mut(), null_mut()) },
        INVALID_ARGUMENT
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn process_utilization_counts_first_then_fills_and_honours_last_seen() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(0);
    let mut count: c_uint = 0;
    let r = unsafe { nvmlDeviceGetProcessUtilization(h, null_mut(), &mut count, 0) };
    assert_eq!((r, count), (INSUFFICIENT_SIZE, 3));
    let mut buf = vec![unsafe { std::mem::zeroed::<nvmlProcessUtilizationSample_t>() }; 3];
    let r = unsafe { nvmlDeviceGetProcessUtilization(h, buf.as_mut_ptr(), &mut count, 0) };
    assert_eq!(r, SUCCESS);
    let stamp = buf[0].timeStamp;
    assert!(
        stamp > 1_600_000_000_000_000,
        "µs since the epoch, got {stamp}"
    );
    let r = unsafe { nvmlDeviceGetProcessUtilization(h, buf.as_mut_ptr(), &mut count, stamp) };
    assert_eq!(r, NOT_FOUND, "no sample newer than the last one seen");
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn memory_v2_checks_its_version_and_v1_counts_reserved_as_used() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(0);
    let mut m2: nvmlMemory_v2_t = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { nvmlDeviceGetMemoryInfo_v2(h, &mut m2) },
        ARGUMENT_VERSION_MISMATCH
    );
    m2.version = 40 | 1 << 24;
    assert_eq!(
        unsafe { nvmlDeviceGetMemoryInfo_v2(h, &mut m2) },
        ARGUMENT_VERSION_MISMATCH
    );
    m2.version = MEMORY_V2_VERSION;
    assert_eq!(unsafe { nvmlDeviceGetMemoryInfo_v2(h, &mut m2) }, SUCCESS);
    // Used memory defaults to the sum of the active processes: 3 x 10 MiB.
    assert_eq!(
        (m2.total, m2.reserved, m2.used),
        (1000 << 20, 100 << 20, 30 << 20)
    );
    assert_eq!(m2.free, (1000 - 100 - 30) << 20);
    let mut m1: nvmlMemory_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { nvmlDeviceGetMemoryInfo(h, &mut m1) }, SUCCESS);
    assert_eq!((m1.used, m1.free), (130 << 20, 870 << 20));
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn pci_info_versions_write_their_own_layouts() {
    let _g = with(TWO_GPUS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let h = handle(1);
    let mut p: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { nvmlDeviceGetPciInfo_v3(h, &mut p) }, SUCCESS);
    let bus = unsafe { std::ffi::CStr::from_ptr(p.busId.as_ptr()) };
    assert_eq!(bus.to_str().unwrap(), "00000000:13:00.0");
    let legacy = unsafe { std::ffi::CStr::from_ptr(p.busIdLegacy.as_ptr()) };
    assert_eq!(legacy.to_str().unwrap(), "0000:13:00.0");
    // v1 writes 32 bytes and not one more: a sentinel right after survives.
    #[repr(C)]
    struct Guarded {
        v1: abi::PciInfoV1,
        sentinel: u32,
    }
    let mut g = Guarded {
        v1: unsafe { std::mem::zeroed() },
        sentinel: 0xDEAD_BEEF,
    };
    assert_eq!(unsafe { nvmlDeviceGetPciInfo(h, &mut g.v1) }, SUCCESS);
    assert_eq!((g.v1.bus, g.sentinel), (0x13, 0xDEAD_BEEF));
    let mut out: nvmlDevice_t = null_mut();
    for spelling in [c"0000:13:00.0", c"00000000:13:00.0", c"13:00.0"] {
        assert_eq!(
            unsafe { nvmlDeviceGetHandleByPciBusId_v2(spelling.as_ptr(), &mut out) },
            SUCCESS
        );
        assert_eq!(out, h);
    }
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn faults_lost_devices_and_init_errors_return_the_scenario_codes() {
    let _g = with(
        r#"
        [clock]
        freeze_at_s = 100
        [[device]]
        count = 3
        fans = 2
        [[fault]]
        kind = "error"
        device = 0
        function = "nvmlDeviceGetFanSpeed_v2"
        [[fault]]
        kind = "error"
        device = 0
        field = "temperature"
        error = "no_permission"
        [[fault]]
        kind = "gpu_lost"
        device = 1
        from_s = 90
        [[fault]]
        kind = "error"
        field = "power_usage"
        error = "unknown"
        from_s = 200
        [[fault]]
        kind = "init_error"
        error = "driver_not_loaded"
        attempts = 1
        "#,
    );
    assert_eq!(nvmlInit_v2(), DRIVER_NOT_LOADED);
    assert_eq!(nvmlInit_v2(), SUCCESS, "only the first attempt fails");
    let mut v: c_uint = 0;
    let h0 = handle(0);
    assert_eq!(
        unsafe { nvmlDeviceGetFanSpeed_v2(h0, 0, &mut v) },
        NOT_SUPPORTED
    );
    assert_eq!(
        unsafe { nvmlDeviceGetFanSpeed(h0, &mut v) },
        SUCCESS,
        "only _v2 is hit"
    );
    assert_eq!(
        unsafe { nvmlDeviceGetFanSpeed_v2(handle(2), 2, &mut v) },
        INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { nvmlDeviceGetTemperature(h0, 0, &mut v) },
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION
    );
    assert_eq!(
        unsafe { nvmlDeviceGetPowerUsage(h0, &mut v) },
        SUCCESS,
        "before from_s"
    );
    let mut out: nvmlDevice_t = null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(1, &mut out) },
        GPU_IS_LOST
    );
    assert_eq!(
        unsafe { nvmlDeviceGetTemperature(handle(2), 0, &mut v) },
        SUCCESS
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn driver_gone_fails_calls_and_init_until_it_is_back_and_reinit_recovers() {
    let _g = with(
        r#"
        [clock]
        time_scale = 2000
        [[device]]
        [[fault]]
        kind = "driver_gone"
        from_s = 20
        until_s = 1000
        "#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut n: c_uint = 0;
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, SUCCESS);
    // 2000x: gone from 10 ms to 500 ms of real time.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, UNKNOWN);
    assert_eq!(nvmlInit_v2(), DRIVER_NOT_LOADED);
    std::thread::sleep(std::time::Duration::from_millis(520));
    assert_eq!(
        unsafe { nvmlDeviceGetCount_v2(&mut n) },
        UNKNOWN,
        "stale session: the client must initialise again"
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
    assert_eq!(nvmlInit_v2(), SUCCESS);
    assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, SUCCESS);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn event_wait_sleeps_until_the_event_or_times_out() {
    let _g = with(
        r#"
        [clock]
        time_scale = 100
        [[device]]
        count = 2
        [[event]]
        at_s = 3
        device = 1
        xid = 79
        [[event]]
        at_s = 2
        device = 0
        xid = 13
        "#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut set: nvmlEventSet_t = null_mut();
    assert_eq!(unsafe { nvmlEventSetCreate(&mut set) }, SUCCESS);
    let xid = nvmlEventTypeXidCriticalError as u64;
    assert_eq!(
        unsafe { nvmlDeviceRegisterEvents(handle(1), xid, set) },
        SUCCESS
    );
    assert_eq!(
        unsafe { nvmlDeviceRegisterEvents(handle(1), 1 << 40, set) },
        NOT_SUPPORTED
    );
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { nvmlEventSetWait_v2(set, &mut data, 0) }, TIMEOUT);
    let started = std::time::Instant::now();
    assert_eq!(
        unsafe { nvmlEventSetWait_v2(set, &mut data, 5000) },
        SUCCESS
    );
    let waited = started.elapsed();
    // Device 0's XID at t=2 is not registered; device 1's at t=3 arrives after ~30 ms.
    assert_eq!(
        (data.device, data.eventType, data.eventData),
        (handle(1), xid, 79)
    );
    assert!(
        waited.as_millis() >= 15 && waited.as_millis() < 1000,
        "{waited:?}"
    );
    let started = std::time::Instant::now();
    assert_eq!(unsafe { nvmlEventSetWait_v2(set, &mut data, 60) }, TIMEOUT);
    assert!(
        started.elapsed().as_millis() >= 55,
        "waits the whole timeout"
    );
    assert_eq!(unsafe { nvmlEventSetFree(set) }, SUCCESS);
    assert_eq!(unsafe { nvmlEventSetFree(set) }, INVALID_ARGUMENT);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn energy_is_the_integral_of_power() {
    let _g = with(
        r#"
        [clock]
        freeze_at_s = 30
        [[device]]
        energy_start_j = 1000
        [device.signals]
        power_w = { steps = [[0, 100], [10, 400]] }
        "#,
    );
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let mut e: u64 = 0;
    assert_eq!(
        unsafe { nvmlDeviceGetTotalEnergyConsumption(handle(0), &mut e) },
        SUCCESS
    );
    // 1000 J + 10 s x 100 W + 20 s x 400 W = 10000 J.
    assert_eq!(e, 10_000_000);
    assert_eq!(nvmlShutdown(), SUCCESS);
}

#[test]
fn the_call_counter_counts_each_function_by_name() {
    let _g = with(TWO_GPUS);
    let count_of = |wanted: &str| -> u64 {
        let mut index = 0;
        loop {
            let mut name = [0 as c_char; 96];
            let mut count = 0u64;
            let rc = unsafe {
                nvmlSimGetCallCount(index, name.as_mut_ptr(), name.len() as c_uint, &mut count)
            };
            assert_eq!(rc, SUCCESS, "{wanted} is not listed");
            let got = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
            if got.to_str() == Ok(wanted) {
                return count;
            }
            index += 1;
        }
    };
    assert_eq!(nvmlInit_v2(), SUCCESS);
    let before = count_of("nvmlDeviceGetPowerUsage");
    let other = count_of("nvmlDeviceGetTemperature");
    let h = handle(0);
    let mut mw = 0;
    for _ in 0..3 {
        assert_eq!(unsafe { nvmlDeviceGetPowerUsage(h, &mut mw) }, SUCCESS);
    }
    // A call that fails (NULL output) is counted too: it was made.
    assert_eq!(
        unsafe { nvmlDeviceGetPowerUsage(h, null_mut()) },
        INVALID_ARGUMENT
    );
    assert_eq!(count_of("nvmlDeviceGetPowerUsage"), before + 4);
    assert_eq!(count_of("nvmlDeviceGetTemperature"), other);
    let (mut name, mut count) = ([0 as c_char; 8], 0u64);
    // Past the last function; and a name that does not fit.
    assert_eq!(
        unsafe { nvmlSimGetCallCount(10_000, name.as_mut_ptr(), 8, &mut count) },
        NOT_FOUND
    );
    assert_eq!(
        unsafe { nvmlSimGetCallCount(0, name.as_mut_ptr(), 8, &mut count) },
        INSUFFICIENT_SIZE
    );
    assert_eq!(nvmlShutdown(), SUCCESS);
}
