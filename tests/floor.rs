//! The benchmark floor (`gpulse::sampling::floor::Floor`, which examples/bench_floor.rs and the
//! hot-path benchmarks run) must make exactly the NVML calls `Sampler::sample` makes, function
//! by function, or gpulse's cost "as a multiple of the floor" means nothing. Both run in this
//! process against one nvml-sim instance, a tick each in turn, and the simulator's own counter
//! (`nvmlSimGetCallCount`) says what each asked. The scenario has what changes the calls: fans
//! (one call per fan), a GPU without ECC and without GPM (calls it says "not supported" to,
//! which neither asks again), a field id one GPU gives and two answer "not supported" for, GPM,
//! NVLink, MIG instances with their processes, and compute and graphics processes (per-process
//! utilisation is asked only when some process runs).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_uint, c_ulonglong};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpulse::sampling::floor::Floor;
use gpulse::sampling::Sampler;

use crate::sampling::sim_lib;

const SCENARIO: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-aaaaaaaa-1111-4111-8111-111111111111"
fans = 2
[device.signals]
gpu_util = 70
power_w = 400
memory_temperature_c = 64
[device.gpm]
sm_activity = 0.5
[device.nvlink]
links = 4
tx_kibps = 1024
rx_kibps = 2048
[[device.process]]
pid = 7001
name = "python3"
memory_used_mib = 1024
[[device.process]]
pid = 7002
name = "Xorg"
kind = "graphics"
memory_used_mib = 64

[[device]]
name = "NVIDIA A10"
uuid = "GPU-bbbbbbbb-2222-4222-8222-222222222222"
architecture = "ampere"
ecc = false

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-cccccccc-3333-4333-8333-333333333333"
mig = true
[device.gpm]
sm_activity = 0.4
[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 1
compute_instance_id = 0
uuid = "MIG-dddddddd-4444-5444-8444-444444444444"
memory_total_mib = 40192
[device.mig_instance.gpm]
sm_activity = 0.8
[[device.process]]
pid = 7003
name = "python3"
memory_used_mib = 2048
gpu_instance_id = 1
compute_instance_id = 0
"#;

/// The scenario is read from the environment at the first init of a library instance.
static ENV_LOCK: Mutex<()> = Mutex::new(());

type CallCount = unsafe extern "C" fn(c_uint, *mut c_char, c_uint, *mut c_ulonglong) -> u32;

/// Calls per NVML function so far, read from the simulator instance loaded from `lib`.
fn call_counts(lib: &Path) -> BTreeMap<String, u64> {
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).expect("library path");
    // SAFETY: `path` is a NUL-terminated string; RTLD_NOLOAD only returns the instance this
    // process already loaded (a reference to drop with dlclose).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "{} is not loaded", lib.display());
    // SAFETY: a live handle and a NUL-terminated symbol name.
    let sym = unsafe { libc::dlsym(handle, c"nvmlSimGetCallCount".as_ptr()) };
    assert!(!sym.is_null(), "nvml-sim has no nvmlSimGetCallCount");
    // SAFETY: nvml-sim exports it with this signature (nvml-sim/src/ffi/system.rs).
    let get: CallCount = unsafe { std::mem::transmute::<*mut libc::c_void, CallCount>(sym) };
    let mut counts = BTreeMap::new();
    for index in 0.. {
        let mut name = [0 as c_char; 96];
        let mut count: c_ulonglong = 0;
        // SAFETY: a buffer of the length given and a valid out-pointer.
        let rc = unsafe { get(index, name.as_mut_ptr(), name.len() as c_uint, &mut count) };
        if rc != 0 {
            break;
        }
        // SAFETY: the simulator wrote a NUL-terminated name into `name`.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) };
        counts.insert(name.to_string_lossy().into_owned(), count);
    }
    // SAFETY: drops the reference RTLD_NOLOAD took.
    unsafe { libc::dlclose(handle) };
    assert!(counts.len() > 50, "nvml-sim listed only {counts:?}");
    counts
}

/// The calls made between two counts, by function.
fn made(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn the_floor_makes_exactly_the_samplers_nvml_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A copy is a library instance of its own: its own scenario and its own call counts.
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(sim_lib(), &lib).expect("copy the simulator");
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write the scenario");
    let mut sampler = {
        let _env = ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        std::env::set_var("NVML_SIM_SCENARIO", &scenario);
        let sampler = Sampler::open(&lib);
        std::env::remove_var("NVML_SIM_SCENARIO");
        sampler.unwrap_or_else(|e| panic!("gpulse cannot open nvml-sim: {e}"))
    };
    let mut floor = Floor::new(Arc::clone(sampler.nvml()));

    // The first tick of each reads what is read once per device (identity, fan and link
    // counts, GPM support); from the second on, each tick asks the same.
    let mut sampled = BTreeMap::new();
    let mut floored = BTreeMap::new();
    for tick in 0..4 {
        let start = call_counts(&lib);
        let snapshot = sampler.sample().expect("the sampler reads nvml-sim");
        let between = call_counts(&lib);
        floor.tick();
        let end = call_counts(&lib);
        if tick == 0 {
            assert_eq!(snapshot.devices.len(), 3);
            assert_eq!(snapshot.processes.len(), 3, "{:?}", snapshot.processes);
            continue;
        }
        let (s, f) = (made(&start, &between), made(&between, &end));
        assert!(!s.is_empty(), "the sampler made no call");
        assert_eq!(
            s, f,
            "tick {tick}: the sampler's calls (left) and the floor's (right) differ: make \
             gpulse::sampling::floor make every call Sampler::sample makes"
        );
        sampled = s;
        floored = f;
        // GPM rates need samples at least 100 ms apart.
        std::thread::sleep(Duration::from_millis(120));
    }
    // The scenario reaches what it is there for.
    for (call, per_tick) in [
        // Every schema field's call, BAR1 included, on each of the three GPUs.
        ("nvmlDeviceGetBAR1MemoryInfo", 3),
        ("nvmlDeviceGetPcieReplayCounter", 3),
        // Two fans on GPU 0 only.
        ("nvmlDeviceGetFanSpeed_v2", 2),
        // Not asked of the MIG GPU, which said "not supported".
        ("nvmlDeviceGetUtilizationRates", 2),
        // The A10 said "not supported" once and is not asked again.
        ("nvmlDeviceGetTotalEccErrors", 4),
        // GPU 0, the MIG GPU and its GPU instance; nothing on the A10.
        ("nvmlGpmMetricsGet", 3),
        ("nvmlGpmMigSampleGet", 1),
        // GPU 0's NVLink counters and its field-id rows (the HBM temperature) in one call
        // each; the other two GPUs said their memory temperature is not supported on the first
        // tick, which leaves their batches empty: no call.
        ("nvmlDeviceGetFieldValues", 2),
        ("nvmlDeviceGetMigDeviceHandleByIndex", 7),
        // Asked only of the GPUs running a process (not of the A10).
        ("nvmlDeviceGetProcessUtilization", 2),
        // nvml-wrapper asks for a list twice when it is not empty (its size, then the list):
        // GPU 0's graphics list, then once each of the others.
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", 4),
        // The MIG device's memory, beside the three GPUs'.
        ("nvmlDeviceGetMemoryInfo_v2", 4),
    ] {
        assert_eq!(
            sampled.get(call).copied(),
            Some(per_tick),
            "{call} per tick: {sampled:?}"
        );
    }
    assert_eq!(sampled, floored);
}
