//! Integration tests: the sampler, through the real nvml-wrapper path, against nvml-sim.
//!
//! nvml-sim reads its scenario once per library instance, so most tests run the `gpulse`
//! binary as a subprocess with its own `NVML_SIM_SCENARIO` and read `gpulse snapshot --format
//! json`, the stable contract, comparing every field with what the scenario sets. What only the
//! sampler itself knows (its NVML error counts, the calls it makes) is read in this process
//! instead, from a `Sampler` opened on a copy of the simulator ([`sampler_in_process`]): a copy
//! is a library instance of its own, with its own scenario and its own call counts
//! ([`call_counts`]).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_uint, c_ulonglong};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use gpulse::sampling::{Sampler, Snapshot};
use gpulse::schema::DeviceField;
use serde_json::Value;

/// The simulated `libnvidia-ml.so.1` cargo built next to the test binary.
pub fn sim_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/tests-<hash> → target/debug/libnvidia_ml.so
    let debug_dir = exe.parent().and_then(Path::parent).expect("target/debug");
    let lib = debug_dir.join("libnvidia_ml.so");
    assert!(
        lib.exists(),
        "{} is missing: build the simulator first with `cargo build -p nvml-sim` \
         (scripts/test does it)",
        lib.display()
    );
    lib
}

pub fn gpulse_bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpulse")
}

/// Writes `scenario` to a temporary file and runs `gpulse <args>` against the simulator.
pub fn gpulse_with_scenario(scenario: &str, args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    let output = Command::new(gpulse_bin())
        .args(args)
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", &path)
        .env("GPULSE_LOG", "warn")
        .env("GPULSE_KUBELET_SOCKET", "none")
        .output()
        .expect("run gpulse");
    (output, dir)
}

/// The scenario is read from the environment at the first init of a library instance, so the
/// tests that open one in this process set `NVML_SIM_SCENARIO` under this lock.
static ENV_LOCK: Mutex<()> = Mutex::new(());

/// A `Sampler` in this process on a copy of the simulator in `dir` that reads `scenario`, and
/// the copy's path, whose calls [`call_counts`] reads.
pub fn sampler_in_process(dir: &Path, scenario: &str) -> (Sampler, PathBuf) {
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(sim_lib(), &lib).expect("copy the simulator");
    let path = dir.join("scenario.toml");
    std::fs::write(&path, scenario).expect("write the scenario");
    let _env = ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("NVML_SIM_SCENARIO", &path);
    let sampler = Sampler::open(&lib);
    std::env::remove_var("NVML_SIM_SCENARIO");
    let sampler = sampler.unwrap_or_else(|e| panic!("gpulse cannot open nvml-sim: {e}"));
    (sampler, lib)
}

type CallCount = unsafe extern "C" fn(c_uint, *mut c_char, c_uint, *mut c_ulonglong) -> u32;

/// Calls per NVML function so far, read from the simulator instance loaded from `lib`.
pub fn call_counts(lib: &Path) -> BTreeMap<String, u64> {
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
pub fn made(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// One sample of an in-process sampler and the NVML calls it made, per function.
fn sample_counting_calls(sampler: &mut Sampler, lib: &Path) -> (Snapshot, BTreeMap<String, u64>) {
    let before = call_counts(lib);
    let snapshot = sampler.sample().expect("the sampler reads nvml-sim");
    (snapshot, made(&before, &call_counts(lib)))
}

fn snapshot_json(scenario: &str) -> Value {
    let (out, _dir) = gpulse_with_scenario(scenario, &["snapshot", "--format", "json"]);
    assert!(
        out.status.success(),
        "gpulse snapshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "snapshot JSON did not parse ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

const MIB: u64 = 1024 * 1024;

/// Two GPUs with constant signals and time frozen, so every value is exact.
const CONSTANT: &str = r#"
[driver]
version = "550.54.15"
nvml_version = "12.550.54.15"
cuda_version = "12.4"

[clock]
freeze_at_s = 100

[[device]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
pci_bus_id = "00000000:3B:00.0"
memory_total_mib = 81920
memory_reserved_mib = 512
power_limit_w = 400
max_clocks_mhz = { graphics = 1410, sm = 1410, mem = 1593, video = 1290 }
fans = 2
energy_start_j = 5000
pcie_generation = 3
pcie_max_generation = 4
pcie_width = 8

[device.signals]
gpu_util = 73
mem_util = 41
encoder_util = 3
decoder_util = 5
memory_used_mib = 20480
temperature_c = 61
power_w = 250
clock_sm_mhz = 1305
clock_mem_mhz = 1593
fan_percent = 47
pcie_tx_kbps = 1000
pcie_rx_kbps = 2000
throttle_reasons = 0x24
ecc_corrected = 7
ecc_uncorrected = 1
pstate = 2

[[device.process]]
pid = 4242
kind = "compute"
memory_used_mib = 12288
sm_util = 66
mem_util = 30

[[device.process]]
pid = 4243
kind = "graphics"
memory_used_mib = 1024
sm_util = 2

[[device]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-99999999-2222-3333-4444-555555555555"
pci_bus_id = "00000000:5E:00.0"
memory_total_mib = 81920
memory_reserved_mib = 512
power_limit_w = 300

[device.signals]
gpu_util = 0
power_w = 60
temperature_c = 35
"#;

#[test]
fn snapshot_reports_exactly_what_the_scenario_sets() {
    let s = snapshot_json(CONSTANT);
    assert_eq!(s["driver_version"], "550.54.15");
    assert_eq!(s["cuda_driver_version"], "12.4");
    assert_eq!(s["nvml_version"], "12.550.54.15");
    let devices = s["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2);
    let d = &devices[0];
    assert_eq!(d["index"], 0);
    assert_eq!(d["uuid"], "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(d["name"], "NVIDIA A100-SXM4-80GB");
    assert_eq!(d["pci_bus_id"], "00000000:3B:00.0");
    assert_eq!(d["status"], "ok");
    assert_eq!(d["memory_total_bytes"], 81920 * MIB);
    assert_eq!(d["memory_used_bytes"], 20480 * MIB);
    assert_eq!(d["memory_reserved_bytes"], 512 * MIB);
    assert_eq!(d["memory_free_bytes"], (81920 - 20480 - 512) * MIB);
    assert_eq!(d["utilization_gpu"], 0.73);
    assert_eq!(d["utilization_memory"], 0.41);
    assert_eq!(d["utilization_encoder"], 0.03);
    assert_eq!(d["utilization_decoder"], 0.05);
    assert_eq!(d["temperature_celsius"], 61.0);
    assert_eq!(d["power_watts"], 250.0);
    assert_eq!(d["power_limit_watts"], 400.0);
    // energy_start_j + 250 W × 100 s.
    assert_eq!(d["energy_joules"], 30000.0);
    assert_eq!(d["sm_clock_mhz"], 1305);
    assert_eq!(d["memory_clock_mhz"], 1593);
    assert_eq!(d["fan_speed"], 0.47);
    assert_eq!(d["pcie_tx_bytes_per_second"], 1000.0 * 1024.0);
    assert_eq!(d["pcie_rx_bytes_per_second"], 2000.0 * 1024.0);
    assert_eq!(
        d["throttle_reasons"],
        serde_json::json!(["sw_power_cap", "sw_thermal_slowdown"])
    );
    assert_eq!(d["ecc_corrected_total"], 7);
    assert_eq!(d["ecc_uncorrected_total"], 1);
    assert_eq!(d["performance_state"], 2);
    // The link trained below its maximum (Gen 3 x8 of Gen 4 x16): what the scenario says.
    assert_eq!(d["pcie_link_generation"], 3);
    assert_eq!(d["pcie_link_width"], 8);

    // The second board has no fans: fan speed is unknown, not 0.
    let d1 = &devices[1];
    assert_eq!(d1["fan_speed"], Value::Null);
    assert_eq!(d1["power_limit_watts"], 300.0);

    let processes = s["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 2, "{processes:?}");
    let trainer = processes
        .iter()
        .find(|p| p["pid"] == 4242)
        .expect("pid 4242");
    assert_eq!(
        trainer["device_uuid"],
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(trainer["kind"], "compute");
    assert_eq!(trainer["gpu_memory_bytes"], 12288 * MIB);
    assert_eq!(trainer["sm_utilization"], 0.66);
    assert_eq!(trainer["memory_utilization"], 0.30);
    let viewer = processes
        .iter()
        .find(|p| p["pid"] == 4243)
        .expect("pid 4243");
    assert_eq!(viewer["kind"], "graphics");
    assert_eq!(viewer["gpu_memory_bytes"], 1024 * MIB);
    // SW thermal slowdown in every sample: the throttling rule speaks up, about GPU 0 only.
    let findings = s["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0]["rule"], "throttling");
    assert!(
        findings[0]["summary"]
            .as_str()
            .unwrap_or("")
            .contains("sw_thermal_slowdown"),
        "{findings:?}"
    );
}

#[test]
fn unsupported_and_forbidden_fields_are_null_never_zero() {
    let scenario = format!(
        "{CONSTANT}
[[fault]]
kind = \"error\"
device = 0
field = \"temperature\"

[[fault]]
kind = \"error\"
device = 0
field = \"power_usage\"
error = \"no_permission\"

[[fault]]
kind = \"error\"
device = 0
field = \"process_utilization\"
"
    );
    let s = snapshot_json(&scenario);
    let d = &s["devices"][0];
    assert_eq!(d["temperature_celsius"], Value::Null);
    assert_eq!(d["power_watts"], Value::Null);
    // The rest of the device is untouched.
    assert_eq!(d["utilization_gpu"], 0.73);
    assert_eq!(d["power_limit_watts"], 400.0);
    // The other GPU still reports temperature: a fault is per device.
    assert_eq!(s["devices"][1]["temperature_celsius"], 35.0);
    let trainer = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == 4242)
        .expect("pid 4242")
        .clone();
    assert_eq!(trainer["sm_utilization"], Value::Null);
    assert_eq!(trainer["gpu_memory_bytes"], 12288 * MIB);
}

#[test]
fn a_lost_gpu_does_not_hide_the_others() {
    let scenario = format!(
        "{CONSTANT}
[[fault]]
kind = \"gpu_lost\"
device = 0
from_s = 0
"
    );
    let s = snapshot_json(&scenario);
    let devices = s["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["status"], "lost");
    assert_eq!(devices[0]["utilization_gpu"], Value::Null);
    assert_eq!(devices[1]["status"], "ok");
    assert_eq!(devices[1]["power_watts"], 60.0);
    assert_eq!(
        devices[1]["uuid"],
        "GPU-99999999-2222-3333-4444-555555555555"
    );
    // Processes of the lost GPU are not listed; nothing else is invented.
    assert!(s["processes"].as_array().expect("processes").is_empty());
}

#[test]
fn a_failing_init_gives_one_clear_error_and_no_panic() {
    let scenario = format!(
        "{CONSTANT}
[[fault]]
kind = \"init_error\"
error = \"driver_not_loaded\"
"
    );
    let (out, _dir) = gpulse_with_scenario(&scenario, &["snapshot"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("driver is not loaded"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("RUST_BACKTRACE"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one message: {stderr}");
}

#[test]
fn a_missing_library_says_what_to_install() {
    let out = Command::new(gpulse_bin())
        .args(["snapshot", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env("GPULSE_LOG", "warn")
        .output()
        .expect("run gpulse");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(stderr.contains("Install the NVIDIA driver"), "{stderr}");
    assert!(stderr.contains("--nvml-lib"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn snapshot_table_reads_like_nvidia_smi_with_processes() {
    let (out, _dir) = gpulse_with_scenario(CONSTANT, &["snapshot"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("Driver 550.54.15"), "{table}");
    assert!(table.contains("NVIDIA A100-SXM4-80GB"), "{table}");
    assert!(table.contains("20480MiB/81920MiB"), "{table}");
    assert!(table.contains("73%"), "{table}");
    assert!(
        table.contains("throttled: sw_power_cap, sw_thermal_slowdown"),
        "{table}"
    );
    assert!(table.contains("4242"), "{table}");
    assert!(table.contains("12288MiB"), "{table}");
}

/// NVLink through nvml-sim with time frozen at 10 s: each active link of GPU 0 has sent
/// 20 GiB/s × 10 s and received half that, GPU 1's link 3 is down (state false, no traffic),
/// every link of GPU 0 counts the scenario's one replay; a GPU without NVLink has no `nvlink`.
#[test]
fn snapshot_reports_nvlink_per_link_from_the_scoped_field_values() {
    let scenario = r#"
[clock]
freeze_at_s = 10

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-00000000-0000-4000-8000-0000000000a0"
[device.nvlink]
links = 4
tx_kibps = 20971520
rx_kibps = 10485760
replay = 1

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-00000000-0000-4000-8000-0000000000a1"
[device.nvlink]
links = 4
down = [3]
tx_kibps = 1024

[[device]]
name = "NVIDIA A10"
uuid = "GPU-00000000-0000-4000-8000-0000000000a2"
"#;
    let s = snapshot_json(scenario);
    let devices = s["devices"].as_array().expect("devices");
    let links = |i: usize| devices[i]["nvlink"].as_array().cloned().unwrap_or_default();
    let gib = 1024 * MIB;
    let a = links(0);
    assert_eq!(a.len(), 4, "{a:?}");
    for (n, l) in a.iter().enumerate() {
        assert_eq!(l["link"], n as u64);
        assert_eq!(l["active"], true);
        assert_eq!(l["tx_bytes_total"], 200 * gib, "link {n}");
        assert_eq!(l["rx_bytes_total"], 100 * gib, "link {n}");
        assert_eq!(l["replay_errors"], 1, "link {n}");
        assert_eq!(l["recovery_errors"], 0, "link {n}");
    }
    let b = links(1);
    assert_eq!(b[2]["tx_bytes_total"], 10 * 1024 * 1024, "10 s at 1 MiB/s");
    assert_eq!(b[3]["active"], false, "link 3 is down");
    assert_eq!(b[3]["tx_bytes_total"], 0);
    assert!(devices[2].get("nvlink").is_none(), "{}", devices[2]);
}

/// Four H100s and the three answers `nvmlDeviceGetFieldValues` can give for the HBM
/// temperature (the one field-id row): GPU 0 says "not supported" for the whole call (a board or
/// driver that gives no field ids), GPU 1's call fails ("unknown"), GPU 2's call succeeds with
/// the value's own "not supported" (no memory temperature in the scenario), GPU 3 gives it.
const FIELD_VALUES: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f0000000-1111-4111-8111-111111111111"
[device.signals]
memory_temperature_c = 60

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f1111111-1111-4111-8111-111111111111"
[device.signals]
memory_temperature_c = 61

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f2222222-1111-4111-8111-111111111111"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f3333333-1111-4111-8111-111111111111"
[device.signals]
memory_temperature_c = 63

[[fault]]
kind = "error"
device = 0
field = "field_values"
error = "not_supported"

[[fault]]
kind = "error"
device = 1
field = "field_values"
error = "unknown"
"#;

/// One rule for a field read by field id: the device not giving it, whether
/// `nvmlDeviceGetFieldValues` says so for the whole call or in the value's own return code, is
/// absence (left out, not asked again, no NVML error counted), and only a failure is counted (and
/// asked again every tick).
#[test]
fn a_field_id_the_device_does_not_give_is_absent_whole_call_or_per_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut sampler, lib) = sampler_in_process(dir.path(), FIELD_VALUES);
    const TICKS: u64 = 4;
    let mut per_tick = Vec::new();
    for tick in 0..TICKS {
        let (snapshot, calls) = sample_counting_calls(&mut sampler, &lib);
        per_tick.push(calls);
        let temperatures: Vec<Option<f64>> = snapshot
            .devices
            .iter()
            .map(|d| d.fields.get(DeviceField::MemoryTemperature))
            .collect();
        assert_eq!(
            temperatures,
            [None, None, None, Some(63.0)],
            "tick {tick}: only GPU 3 gives its memory temperature"
        );
    }
    // Absence, whole call (GPU 0) or per value (GPU 2), is no NVML error; GPU 1's failure is one
    // on every tick, twice: its field-id call and its NVLink link count, the other caller of
    // nvmlDeviceGetFieldValues, which asks again after a failure.
    assert_eq!(
        sampler.error_counts().clone(),
        BTreeMap::from([("unknown", 2 * TICKS)]),
        "NVML errors by kind"
    );
    // The first tick asks each GPU its field-id rows and its NVLink link count. From then on
    // nothing is asked of GPUs 0 and 2, which said they do not give them (and have no NVLink):
    // GPU 3's field-id call and GPU 1's two retries make three calls a tick.
    assert_eq!(per_tick[0].get("nvmlDeviceGetFieldValues"), Some(&(4 * 2)));
    for (tick, calls) in per_tick.iter().enumerate().skip(1) {
        assert_eq!(
            calls.get("nvmlDeviceGetFieldValues"),
            Some(&3),
            "tick {tick}: {calls:?}"
        );
    }
}

/// Two H100s with NVLink; GPU 0 refuses `nvmlDeviceGetFieldValues` (`NO_PERMISSION`, as a
/// driver does for an unprivileged container on some fields). NVLink follows the same rule as
/// the field-id rows: a refusal is the device not giving it, so GPU 0's links are left out,
/// not asked again and not counted as an NVML error, while GPU 1's links are read every tick.
const NVLINK_REFUSED: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-e0000000-1111-4111-8111-111111111111"
[device.nvlink]
links = 4
tx_kibps = 1024

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-e1111111-1111-4111-8111-111111111111"
[device.nvlink]
links = 4
tx_kibps = 1024

[[fault]]
kind = "error"
device = 0
field = "field_values"
error = "no_permission"
"#;

#[test]
fn nvlink_refused_with_no_permission_is_absent_not_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut sampler, lib) = sampler_in_process(dir.path(), NVLINK_REFUSED);
    const TICKS: usize = 4;
    let mut per_tick = Vec::new();
    for tick in 0..TICKS {
        let (snapshot, calls) = sample_counting_calls(&mut sampler, &lib);
        per_tick.push(calls);
        let links: Vec<usize> = snapshot.devices.iter().map(|d| d.nvlink.len()).collect();
        assert_eq!(links, [0, 4], "tick {tick}: only GPU 1 gives its links");
    }
    assert_eq!(
        sampler.error_counts().clone(),
        BTreeMap::new(),
        "a refusal is absence, not an NVML error"
    );
    // The first tick asks GPU 0 its field-id rows and its link count (both refused) and GPU 1
    // those and its links' counters. Then GPU 0 is asked nothing, and GPU 1 only its links'
    // counters (its field-id row, the HBM temperature, is absent in the scenario).
    assert_eq!(per_tick[0].get("nvmlDeviceGetFieldValues"), Some(&5));
    for (tick, calls) in per_tick.iter().enumerate().skip(1) {
        assert_eq!(
            calls.get("nvmlDeviceGetFieldValues"),
            Some(&1),
            "tick {tick}: {calls:?}"
        );
    }
}
