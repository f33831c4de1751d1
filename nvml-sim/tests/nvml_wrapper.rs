//! The built cdylib loaded through `nvml-wrapper` itself (`Nvml::builder().lib_path(..)`), as
//! gpulse loads it: every field gpulse reads must come back as the scenario sets it, and faults
//! must surface as the wrapper's error variants.
//!
//! Each test copies the library to its own temporary file: a distinct file is a distinct
//! `dlopen` instance, so each test gets fresh library state and its own scenario.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Brand, Clock, ClockId, ComputeMode, EccCounter, MemoryError, PcieUtilCounter, PerformanceState,
    RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enums::device::{DeviceArchitecture, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

/// The cdylib cargo built for this package: `$CARGO_TARGET_DIR/debug`, else next to the test
/// executable's `deps/` directory.
fn cdylib() -> PathBuf {
    let name = "libnvidia_ml.so";
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        candidates.push(Path::new(&dir).join("debug").join(name));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join(name));
        }
    }
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!("{name} not found in {candidates:?}; build it with `cargo build -p nvml-sim`")
        })
}

/// Serialises the moment the scenario is chosen: it is read from the environment at init.
static ENV_LOCK: Mutex<()> = Mutex::new(());

struct Loaded {
    nvml: Nvml,
    _dir: tempfile::TempDir,
}

fn try_load(scenario: &str) -> (Result<Nvml, NvmlError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(cdylib(), &lib).expect("copy the cdylib");
    let file = dir.path().join("scenario.toml");
    std::fs::write(&file, scenario).expect("write the scenario");
    let _g = ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("NVML_SIM_SCENARIO", &file);
    let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init();
    std::env::remove_var("NVML_SIM_SCENARIO");
    (nvml, dir)
}

fn load(scenario: &str) -> Loaded {
    let (nvml, dir) = try_load(scenario);
    Loaded {
        nvml: nvml.expect("init through nvml-wrapper"),
        _dir: dir,
    }
}

const FULL: &str = r#"
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
minor = 3
memory_total_mib = 81559
memory_reserved_mib = 542
power_limit_w = 700
energy_start_j = 5000
max_clocks_mhz = { graphics = 1980, sm = 1981, mem = 2619, video = 1965 }
fans = 2
ecc = true
persistence = true
mig = false
compute_capability = "9.0"
architecture = "hopper"
brand = "nvidia"
retired_pages = { single_bit = 2, double_bit = 1, pending = true }

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
kind = "compute"
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

[[device.process]]
pid = 7003
kind = "mps"
memory_used_mib = 256

[[device.process]]
pid = 7004
memory_used_mib = 100
active_from_s = 200

[[device]]
count = 2
"#;

#[test]
fn every_field_reads_as_the_scenario_sets_it() {
    let l = load(FULL);
    let n = &l.nvml;
    assert_eq!(n.sys_driver_version().unwrap(), "575.57.08");
    assert_eq!(n.sys_nvml_version().unwrap(), "12.575.57.08");
    assert_eq!(n.sys_cuda_driver_version().unwrap(), 12090);
    assert_eq!(n.device_count().unwrap(), 3);
    assert_eq!(n.sys_process_name(7001, 64).unwrap(), "trainer");
    assert_eq!(
        n.sys_process_name(7001, 4).unwrap(),
        "tra",
        "cropped to the length"
    );

    let d = n.device_by_index(0).unwrap();
    let uuid = "GPU-11111111-2222-4333-8444-555555555555";
    assert_eq!(d.uuid().unwrap(), uuid);
    assert_eq!(n.device_by_uuid(uuid).unwrap().index().unwrap(), 0);
    assert_eq!(
        n.device_by_pci_bus_id("0000:18:00.0")
            .unwrap()
            .index()
            .unwrap(),
        0
    );
    #[allow(deprecated)]
    let by_serial = n.device_by_serial("1650000000077").unwrap();
    assert_eq!(by_serial.index().unwrap(), 0);
    assert!(matches!(
        n.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
    assert_eq!(d.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(d.serial().unwrap(), "1650000000077");
    assert_eq!(d.minor_number().unwrap(), 3);
    let pci = d.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:18:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x18, 0));
    assert_eq!(pci.pci_device_id, 0x2330_10DE);

    let mem = d.memory_info().unwrap();
    assert_eq!(mem.total, 81559 << 20);
    assert_eq!(mem.reserved, 542 << 20);
    assert_eq!(mem.used, 40000 << 20);
    assert_eq!(mem.free, (81559 - 542 - 40000) << 20);

    let u = d.utilization_rates().unwrap();
    assert_eq!(
        (u.gpu, u.memory),
        (50, 45),
        "ramp half way at t=100; step at 90"
    );
    assert_eq!(d.encoder_utilization().unwrap().utilization, 7);
    assert_eq!(d.decoder_utilization().unwrap().utilization, 9);
    assert_eq!(
        d.temperature(TemperatureSensor::Gpu).unwrap(),
        70,
        "sine peak at P/4"
    );
    assert_eq!(d.power_usage().unwrap(), 350_000);
    assert_eq!(d.enforced_power_limit().unwrap(), 700_000);
    assert_eq!(d.power_management_limit().unwrap(), 700_000);
    assert_eq!(
        d.total_energy_consumption().unwrap(),
        5_000_000 + 350 * 100 * 1000,
        "start + 350 W x 100 s, in mJ"
    );
    assert_eq!(d.clock_info(Clock::Graphics).unwrap(), 1500);
    assert_eq!(d.clock_info(Clock::SM).unwrap(), 1600);
    assert_eq!(d.clock_info(Clock::Memory).unwrap(), 2600);
    assert_eq!(d.clock_info(Clock::Video).unwrap(), 1400);
    assert_eq!(d.max_clock_info(Clock::SM).unwrap(), 1981);
    assert_eq!(d.clock(Clock::SM, ClockId::Current).unwrap(), 1600);
    assert_eq!(d.clock(Clock::SM, ClockId::CustomerMaxBoost).unwrap(), 1981);
    assert_eq!(d.num_fans().unwrap(), 2);
    assert_eq!(d.fan_speed(1).unwrap(), 41);
    assert!(matches!(d.fan_speed(2), Err(NvmlError::InvalidArg)));
    assert_eq!(d.pcie_throughput(PcieUtilCounter::Send).unwrap(), 1234);
    assert_eq!(d.pcie_throughput(PcieUtilCounter::Receive).unwrap(), 5678);
    assert_eq!(
        d.current_throttle_reasons().unwrap(),
        ThrottleReasons::SW_POWER_CAP | ThrottleReasons::SW_THERMAL_SLOWDOWN
    );
    assert_eq!(d.supported_throttle_reasons().unwrap().bits(), 0x1FF);
    assert_eq!(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap(),
        5
    );
    assert_eq!(
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        1
    );
    let ecc = d.is_ecc_enabled().unwrap();
    assert!(ecc.currently_enabled && ecc.pending_enabled);
    assert_eq!(d.performance_state().unwrap(), PerformanceState::Two);
    assert!(d.is_in_persistent_mode().unwrap());
    let mig = d.mig_mode().unwrap();
    assert_eq!((mig.current, mig.pending), (0, 0));
    let cc = d.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (9, 0));
    assert_eq!(d.compute_mode().unwrap(), ComputeMode::Default);
    assert_eq!(d.architecture().unwrap(), DeviceArchitecture::Hopper);
    assert_eq!(d.brand().unwrap(), Brand::Nvidia);

    let compute = d.running_compute_processes().unwrap();
    let got: Vec<(u32, UsedGpuMemory)> = compute
        .iter()
        .map(|p| (p.pid, p.used_gpu_memory.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(7001, UsedGpuMemory::Used(30000 << 20))],
        "7004 starts at 200"
    );
    assert_eq!(compute[0].gpu_instance_id, None, "MIG off");
    let graphics = d.running_graphics_processes().unwrap();
    assert_eq!(
        graphics.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![7002]
    );
    let mps = d.mps_running_compute_processes().unwrap();
    assert_eq!(mps.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![7003]);

    let samples = d.process_utilization_stats(None).unwrap();
    let mut by_pid: Vec<(u32, u32, u32, u32, u32)> = samples
        .iter()
        .map(|s| (s.pid, s.sm_util, s.mem_util, s.enc_util, s.dec_util))
        .collect();
    by_pid.sort_unstable();
    assert_eq!(
        by_pid,
        vec![(7001, 80, 40, 1, 2), (7002, 3, 0, 0, 0), (7003, 0, 0, 0, 0)]
    );
    let last = samples.iter().map(|s| s.timestamp).max().unwrap();
    assert!(matches!(
        d.process_utilization_stats(last),
        Err(NvmlError::NotFound)
    ));

    let sbe = d
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .unwrap();
    assert_eq!(sbe.len(), 2);
    assert_ne!(sbe[0].address, sbe[1].address);
    assert_eq!(
        d.retired_pages(RetirementCause::DoubleBitEccError)
            .unwrap()
            .len(),
        1
    );
    assert!(d.are_pages_pending_retired().unwrap());
    assert!(d
        .supported_event_types()
        .unwrap()
        .contains(EventTypes::CRITICAL_XID_ERROR));

    // The template devices derive their identity from their index.
    let d2 = n.device_by_index(2).unwrap();
    assert_eq!(d2.minor_number().unwrap(), 2);
    assert_eq!(d2.pci_info().unwrap().bus_id, "00000000:16:00.0");
    assert_ne!(
        d2.uuid().unwrap(),
        n.device_by_index(1).unwrap().uuid().unwrap()
    );
    assert!(matches!(n.device_by_index(3), Err(NvmlError::InvalidArg)));
    assert!(
        matches!(d2.fan_speed(0), Err(NvmlError::NotSupported)),
        "no fans"
    );

    l.nvml.shutdown().expect("nvmlShutdown");
}

#[test]
fn faults_surface_as_the_wrapper_error_variants() {
    let l = load(
        r#"
        [clock]
        freeze_at_s = 50
        [[device]]
        count = 3
        [[fault]]
        kind = "error"
        device = 0
        field = "temperature"
        [[fault]]
        kind = "error"
        device = 0
        field = "power_usage"
        error = "no_permission"
        [[fault]]
        kind = "gpu_lost"
        device = 1
        from_s = 40
        [[fault]]
        kind = "gpu_lost"
        device = 2
        from_s = 10
        until_s = 20
        "#,
    );
    let n = &l.nvml;
    let d0 = n.device_by_index(0).unwrap();
    assert!(matches!(
        d0.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d0.power_usage(), Err(NvmlError::NoPermission)));
    assert!(
        d0.utilization_rates().is_ok(),
        "other fields are unaffected"
    );
    assert!(matches!(n.device_by_index(1), Err(NvmlError::GpuLost)));
    let d2 = n.device_by_index(2).unwrap();
    assert!(
        d2.temperature(TemperatureSensor::Gpu).is_ok(),
        "back at 20 s"
    );
}

#[test]
fn xid_events_arrive_through_the_event_set() {
    let l = load(
        r#"
        [clock]
        time_scale = 50
        [[device]]
        count = 2
        [[event]]
        at_s = 1
        device = 1
        xid = 79
        "#,
    );
    let n = &l.nvml;
    let d1 = n.device_by_index(1).unwrap();
    let set = n.create_event_set().unwrap();
    let set = d1
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .map_err(|e| e.error)
        .unwrap();
    let started = std::time::Instant::now();
    let ev = set.wait(5000).expect("the XID at t=1 s (20 ms real)");
    assert!(started.elapsed().as_millis() < 2000);
    assert_eq!(ev.event_data, Some(XidError::Value(79)));
    assert_eq!(ev.device.index().unwrap(), 1);
    assert!(matches!(set.wait(30), Err(NvmlError::Timeout)));
    set.release_events().unwrap();
}

#[test]
fn init_failure_faults_reach_the_caller() {
    let (r, _dir) = try_load(
        r#"
        [[device]]
        [[fault]]
        kind = "init_error"
        error = "no_permission"
        "#,
    );
    assert!(matches!(r, Err(NvmlError::NoPermission)), "{r:?}");
}

/// The simulator reads its scenario once per process and keeps a bad one's error, so the bad
/// scenario is loaded in a child process: this same test, run again with `NVML_SIM_TEST_CHILD`
/// set. The child asserts that init fails (twice); the parent, that it succeeded and printed the
/// parse error once.
#[test]
fn bad_scenario_prints_one_message_and_init_fails_unknown() {
    if std::env::var_os("NVML_SIM_TEST_CHILD").is_some() {
        load_the_bad_scenario_twice();
    } else {
        run_this_test_as_a_child_and_check_its_stderr();
    }
}

fn load_the_bad_scenario_twice() {
    let (r, dir) = try_load("[[device]]\nname = \"x\"\nfans = \"two\"\n");
    assert!(matches!(r, Err(NvmlError::Unknown)), "{r:?}");
    // A second init attempt fails the same way without printing again.
    let again = Nvml::builder()
        .lib_path(OsStr::new(&dir.path().join("libnvidia-ml.so.1")))
        .init();
    assert!(matches!(again, Err(NvmlError::Unknown)), "{again:?}");
}

fn run_this_test_as_a_child_and_check_its_stderr() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "bad_scenario_prints_one_message_and_init_fails_unknown",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NVML_SIM_TEST_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    // The child must have run the test, not filtered it out (a renamed test would pass vacuously).
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test:\n{stdout}"
    );
    let msgs: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("nvml-sim:"))
        .collect();
    assert_eq!(msgs.len(), 1, "exactly one message:\n{stderr}");
    assert!(
        msgs[0].contains("scenario.toml line 3, column 8"),
        "{}",
        msgs[0]
    );
    assert!(msgs[0].contains("invalid type"), "{}", msgs[0]);
}

#[test]
fn reinit_after_the_driver_comes_back_keeps_the_scenario_clock() {
    // 1000x: the driver is gone from 20 ms to 500 ms of real time (wide, for loaded CI hosts).
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(cdylib(), &lib).unwrap();
    let file = dir.path().join("scenario.toml");
    std::fs::write(
        &file,
        "[clock]\ntime_scale = 1000\n[[device]]\n[[fault]]\nkind = \"driver_gone\"\nfrom_s = 20\nuntil_s = 500\n",
    )
    .unwrap();
    let init = || {
        let _g = ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        std::env::set_var("NVML_SIM_SCENARIO", &file);
        let r = Nvml::builder().lib_path(OsStr::new(&lib)).init();
        std::env::remove_var("NVML_SIM_SCENARIO");
        r
    };
    let nvml = init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 1);
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(matches!(nvml.device_count(), Err(NvmlError::Unknown)));
    drop(nvml); // nvmlShutdown + dlclose; the library stays loaded (-z nodelete).
    assert!(matches!(init(), Err(NvmlError::DriverNotLoaded)));
    std::thread::sleep(std::time::Duration::from_millis(520));
    let nvml = init().expect("the driver is back at t=500 s");
    assert_eq!(nvml.device_count().unwrap(), 1);
}

const HOPPER: &str = r#"
[clock]
freeze_at_s = 100

[[device]]
name = "NVIDIA H100 80GB HBM3"
mig = true
remapped_rows = { corrected = 2, uncorrected = 1, pending = true }
[device.signals]
pcie_replays = 12
[device.violation]
power = 0.1
[device.gpm]
sm_activity = 0.8
tensor_activity = 0.0
dram_activity = 0.35
fp32_activity = 0.6
[device.nvlink]
links = 4
tx_kibps = { steps = [[0, 100], [50, 300]] }
rx_kibps = 50
crc_flit = 5
[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 1
uuid = "MIG-11111111-2222-5333-8444-555555555555"
memory_total_mib = 40192
[device.mig_instance.gpm]
sm_activity = 0.9
tensor_activity = 0.5
[[device.mig_instance]]
profile = "3g.40gb"
gpu_instance_id = 2
memory_total_mib = 40192
[[device.process]]
pid = 31
memory_used_mib = 2048
gpu_instance_id = 1
compute_instance_id = 0

[[device]]
name = "NVIDIA A100-SXM4-80GB"
architecture = "ampere"
"#;

#[test]
fn gpm_mig_nvlink_and_health_read_back_through_the_wrapper() {
    use nvml_wrapper::enum_wrappers::device::PerformancePolicy;
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::enums::gpm::GpmMetricId;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper::sys_exports::field_id::*;

    let l = load(HOPPER);
    let nvml = &l.nvml;
    let gpu = nvml.device_by_index(0).unwrap();
    let old = nvml.device_by_index(1).unwrap();

    // GPM.
    assert!(gpu.gpm_support().unwrap());
    assert!(!old.gpm_support().unwrap());
    assert!(matches!(old.gpm_sample(), Err(NvmlError::NotSupported)));
    let (s1, s2) = (gpu.gpm_sample().unwrap(), gpu.gpm_sample().unwrap());
    let ids = [
        GpmMetricId::SmUtil,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::DramBwUtil,
        GpmMetricId::Fp32Util,
    ];
    let got: Vec<f64> = nvml_wrapper::gpm::gpm_metrics_get(nvml, &s1, &s2, &ids)
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().value)
        .collect();
    let want = [80.0, 0.0, 35.0, 60.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} != {want:?}");
    }
    let m1 = gpu.gpm_mig_sample(1).unwrap();
    let m2 = gpu.gpm_mig_sample(1).unwrap();
    let r = nvml_wrapper::gpm::gpm_metrics_get(nvml, &m1, &m2, &[GpmMetricId::SmUtil])
        .unwrap()
        .remove(0)
        .unwrap();
    assert!((r.value - 90.0).abs() < 1e-6, "instance 1's own activity");
    assert_eq!(r.metric_info.unit, "%");
    assert!(matches!(gpu.gpm_mig_sample(3), Err(NvmlError::NotFound)));

    // MIG.
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    let mig = gpu.mig_device_by_index(0).unwrap();
    assert!(mig.mig_is_mig_device_handle().unwrap());
    assert!(!gpu.mig_is_mig_device_handle().unwrap());
    assert_eq!(
        mig.uuid().unwrap(),
        "MIG-11111111-2222-5333-8444-555555555555"
    );
    assert_eq!(mig.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
    assert_eq!(mig.memory_info().unwrap().total, 40192 << 20);
    assert_eq!(
        mig.mig_parent_device().unwrap().uuid().unwrap(),
        gpu.uuid().unwrap()
    );
    let procs = mig.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(
        (
            procs[0].pid,
            procs[0].gpu_instance_id,
            procs[0].compute_instance_id
        ),
        (31, Some(1), Some(0))
    );
    assert!(matches!(
        gpu.mig_device_by_index(2),
        Err(NvmlError::NotFound)
    ));
    // No safe wrapper for the instance ids: the -sys symbols, as gpulse will call them.
    let (mut gi, mut ci) = (0u32, 9u32);
    unsafe {
        let lib = nvml.lib();
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceId.as_ref().unwrap()(mig.handle(), &mut gi),
            0
        );
        assert_eq!(
            lib.nvmlDeviceGetComputeInstanceId.as_ref().unwrap()(mig.handle(), &mut ci),
            0
        );
    }
    assert_eq!((gi, ci), (1, 0));

    // NVLink: field_values_for never sets scopeId, so it reads link 0 only.
    assert!(gpu.link_wrapper_for(3).is_active().unwrap());
    let samples = gpu
        .field_values_for(&[
            FieldId(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
            FieldId(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
            FieldId(NVML_FI_DEV_PCIE_REPLAY_COUNTER),
        ])
        .unwrap();
    let values: Vec<SampleValue> = samples
        .into_iter()
        .map(|s| s.unwrap().value.unwrap())
        .collect();
    assert!(
        matches!(values[0], SampleValue::U64(20000)),
        "{:?}",
        values[0]
    );
    assert!(matches!(values[1], SampleValue::U64(20)), "{:?}", values[1]);
    assert!(matches!(values[2], SampleValue::U32(12)), "{:?}", values[2]);
    // Other links: nvmlDeviceGetFieldValues with scopeId set.
    let mut raw: nvml_wrapper_sys::bindings::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    raw.fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
    raw.scopeId = 3;
    unsafe {
        let f = nvml.lib().nvmlDeviceGetFieldValues.as_ref().unwrap();
        assert_eq!(f(gpu.handle(), 1, &mut raw), 0);
        assert_eq!((raw.nvmlReturn, raw.value.ullVal), (0, 5000));
    }

    // Health.
    assert_eq!(gpu.pcie_replay_counter().unwrap(), 12);
    let v = gpu.violation_status(PerformancePolicy::Power).unwrap();
    assert_eq!(v.violation_time, 10_000_000_000, "10 % of 100 s, in ns");
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 9u32);
    unsafe {
        let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().unwrap();
        assert_eq!(
            f(
                gpu.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failure
            ),
            0
        );
    }
    assert_eq!((corr, unc, pending, failure), (2, 1, 1, 0));
}

#[test]
fn gpm_permission_denied_appears_at_its_time_and_spares_other_calls() {
    let l = load(
        "[clock]\ntime_scale = 100\n[[device]]\n[device.signals]\npower_w = 300\n\
         [[fault]]\nkind = \"error\"\nfield = \"gpm\"\nerror = \"no_permission\"\nfrom_s = 100\n",
    );
    let gpu = l.nvml.device_by_index(0).unwrap();
    gpu.gpm_sample()
        .expect("allowed before t = 200 s (0.2 s of real time)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match gpu.gpm_sample() {
            Err(NvmlError::NoPermission) => break,
            Ok(_) => assert!(
                std::time::Instant::now() < deadline,
                "no NO_PERMISSION in 30 s"
            ),
            Err(e) => panic!("unexpected {e:?}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        gpu.power_usage().unwrap(),
        300_000,
        "other calls keep answering"
    );
    assert!(gpu.gpm_support().unwrap(), "support is unchanged");
}
