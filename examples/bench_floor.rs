//! The floor for `benches/peers`: a process that makes only the NVML calls `gpulse run` makes
//! on a healthy device, every sample interval, and only the `/proc` reads its attribution makes
//! for every GPU process, every export interval, and nothing else (no aggregation, no
//! diagnosis, no OTLP). gpulse's whole-process CPU is reported as a multiple of this one's.
//!
//! ```text
//! cargo build --release --example bench_floor
//! target/release/examples/bench_floor --nvml-lib PATH [--sample-interval-ms 100]
//!     [--export-interval-ms 1000] [--proc-root /proc]
//! ```
//!
//! Per sample, per device, the calls of `Sampler::sample_device` in its order (a call that once
//! answered NOT_SUPPORTED is not made again, as gpulse's unsupported-field set does), GPM
//! included; not the XID event wait of gpulse's event thread (it blocks in the driver). The
//! counts per NVML function match `gpulse run`'s over the same time (BENCHMARKS.md says how
//! that was checked: uprobes on the library). Per export
//! window: the GPU PIDs of the last sample, and for each of them the files gpulse's attribution
//! reads for a process it has seen before, through gpulse's own reader (`stat` for its
//! identity, CPU ticks and RSS, the `children` files that find its descendants, whose CPU is
//! counted in the process tree's, their `stat`, and its parent's), the files kept open between
//! windows as gpulse keeps them. Runs until killed (SIGTERM).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, TemperatureSensor,
};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::{Device, Nvml};

use gpulse::attribution::procfiles::ProcFiles;
use gpulse::attribution::usage::ProcessTable;

/// The violation policies gpulse reads each tick (`sampling::health::VIOLATION_POLICIES`).
const POLICIES: [PerformancePolicy; 8] = [
    PerformancePolicy::Power,
    PerformancePolicy::Thermal,
    PerformancePolicy::SyncBoost,
    PerformancePolicy::BoardLimit,
    PerformancePolicy::LowUtilization,
    PerformancePolicy::Reliability,
    PerformancePolicy::TotalAppClocks,
    PerformancePolicy::TotalBaseClocks,
];

struct Args {
    nvml_lib: PathBuf,
    sample_interval: Duration,
    export_interval: Duration,
    proc_root: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut nvml_lib = None;
    let mut sample_ms = 100u64;
    let mut export_ms = 1000u64;
    let mut proc_root = PathBuf::from("/proc");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let ms = |v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} takes milliseconds (a positive integer), not {v:?}"))
        };
        match flag.as_str() {
            "--nvml-lib" => nvml_lib = Some(PathBuf::from(value()?)),
            "--sample-interval-ms" => sample_ms = ms(value()?)?,
            "--export-interval-ms" => export_ms = ms(value()?)?,
            "--proc-root" => proc_root = PathBuf::from(value()?),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: bench_floor --nvml-lib PATH \
                     [--sample-interval-ms N] [--export-interval-ms N] [--proc-root DIR]"
                ))
            }
        }
    }
    Ok(Args {
        nvml_lib: nvml_lib.ok_or("--nvml-lib PATH is required (the libnvidia-ml.so to load)")?,
        sample_interval: Duration::from_millis(sample_ms),
        export_interval: Duration::from_millis(export_ms),
        proc_root,
    })
}

/// The NVML calls of one sample; `skip` holds (device, call) pairs that answered NOT_SUPPORTED.
struct Floor {
    skip: HashSet<(u32, &'static str)>,
    process_util_seen: HashMap<u32, u64>,
    fans: HashMap<u32, u32>,
    gpm_checked: HashSet<u32>,
    gpm_previous: HashMap<u32, (nvml_wrapper_sys::bindings::nvmlGpmSample_t, Instant)>,
    pids: BTreeSet<u32>,
    checksum: u64,
}

impl Floor {
    fn call<T>(
        &mut self,
        index: u32,
        name: &'static str,
        f: impl FnOnce() -> Result<T, NvmlError>,
        value: impl FnOnce(T) -> u64,
    ) {
        if self.skip.contains(&(index, name)) {
            return;
        }
        match f() {
            Ok(v) => self.checksum = self.checksum.wrapping_add(value(v)),
            Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => {
                self.skip.insert((index, name));
            }
            Err(_) => {}
        }
    }

    fn sample(&mut self, nvml: &Nvml) {
        self.pids.clear();
        let count = nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            self.device(nvml, index, &d);
        }
    }

    fn device(&mut self, nvml: &Nvml, index: u32, d: &Device<'_>) {
        let u = u64::from;
        self.call(
            index,
            "util",
            || d.utilization_rates(),
            |r| u(r.gpu + r.memory),
        );
        self.call(
            index,
            "enc",
            || d.encoder_utilization(),
            |r| u(r.utilization),
        );
        self.call(
            index,
            "dec",
            || d.decoder_utilization(),
            |r| u(r.utilization),
        );
        self.call(index, "mem", || d.memory_info(), |m| m.used);
        self.call(index, "temp", || d.temperature(TemperatureSensor::Gpu), u);
        self.call(index, "power", || d.power_usage(), u);
        self.call(index, "limit", || d.enforced_power_limit(), u);
        self.call(index, "energy", || d.total_energy_consumption(), |e| e);
        self.call(index, "sm", || d.clock_info(Clock::SM), u);
        self.call(index, "memclk", || d.clock_info(Clock::Memory), u);
        self.call(index, "gfx", || d.clock_info(Clock::Graphics), u);
        let fans = *self
            .fans
            .entry(index)
            .or_insert_with(|| d.num_fans().unwrap_or(0));
        for fan in 0..fans {
            self.call(index, "fan", || d.fan_speed(fan), u);
        }
        self.call(index, "tx", || d.pcie_throughput(PcieUtilCounter::Send), u);
        self.call(
            index,
            "rx",
            || d.pcie_throughput(PcieUtilCounter::Receive),
            u,
        );
        self.call(
            index,
            "throttle",
            || d.current_throttle_reasons(),
            |r| r.bits(),
        );
        self.call(
            index,
            "ecc_c",
            || d.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate),
            |e| e,
        );
        self.call(
            index,
            "ecc_u",
            || d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
            |e| e,
        );
        self.call(index, "pstate", || d.performance_state(), |p| u(p.as_c()));
        self.call(index, "remap", || remapped_rows(nvml, d), |r| r);
        self.call(index, "replay", || d.pcie_replay_counter(), u);
        self.call(index, "link_gen", || d.current_pcie_link_gen(), u);
        self.call(index, "link_width", || d.current_pcie_link_width(), u);
        for policy in POLICIES {
            // gpulse asks every policy each tick and keeps the ones that answer.
            let _ = d
                .violation_status(policy)
                .map(|v| self.checksum = self.checksum.wrapping_add(v.violation_time));
        }
        self.gpm(nvml, index, d);
        let mut pids = Vec::new();
        self.call(
            index,
            "compute",
            || d.running_compute_processes(),
            |p| {
                pids.extend(p.iter().map(|p| p.pid));
                p.len() as u64
            },
        );
        self.call(
            index,
            "graphics",
            || d.running_graphics_processes(),
            |p| {
                pids.extend(p.iter().map(|p| p.pid));
                p.len() as u64
            },
        );
        if !pids.is_empty() {
            let seen = self.process_util_seen.get(&index).copied();
            if let Ok(samples) = d.process_utilization_stats(seen) {
                if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
                    self.process_util_seen.insert(index, newest);
                }
                self.checksum = self.checksum.wrapping_add(samples.len() as u64);
            }
        }
        self.pids.extend(pids);
    }
}

impl Floor {
    /// GPM as gpulse reads it: support asked once, then a sample each tick, and the metrics of
    /// the pair made with the previous sample once that one is at least 100 ms old.
    fn gpm<'n>(&mut self, nvml: &'n Nvml, index: u32, d: &Device<'n>) {
        if self.skip.contains(&(index, "gpm")) {
            return;
        }
        if !self.gpm_checked.contains(&index) {
            self.gpm_checked.insert(index);
            if !matches!(d.gpm_support(), Ok(true)) {
                self.skip.insert((index, "gpm"));
                return;
            }
        }
        let Ok(sample) = d.gpm_sample() else {
            return;
        };
        let now = Instant::now();
        match self.gpm_previous.remove(&index) {
            Some((handle, at)) if now.duration_since(at) >= Duration::from_millis(100) => {
                // SAFETY: `handle` came from `into_handle` on a sample of this `nvml` and was
                // not freed; `from_handle` takes it back and frees it on drop.
                let previous = unsafe { GpmSample::from_handle(nvml, handle) };
                if let Ok(values) = gpm_metrics_get(nvml, &previous, &sample, &GPM_METRICS) {
                    self.checksum = self.checksum.wrapping_add(values.len() as u64);
                }
                drop(previous);
                self.gpm_previous.insert(index, (sample.into_handle(), now));
            }
            Some(kept) => {
                // Too close to the previous one for a rate: keep the older sample.
                self.gpm_previous.insert(index, kept);
                drop(sample);
            }
            None => {
                self.gpm_previous.insert(index, (sample.into_handle(), now));
            }
        }
    }
}

/// The GPM metrics gpulse asks for (`sampling::gpm::METRICS`).
const GPM_METRICS: [GpmMetricId; 12] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::HmmaTensorUtil,
    GpmMetricId::ImmaTensorUtil,
    GpmMetricId::DfmaTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp16Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp64Util,
    GpmMetricId::IntegerUtil,
    GpmMetricId::GraphicsUtil,
];

/// `nvmlDeviceGetRemappedRows`, which nvml-wrapper 0.13 does not wrap (as gpulse calls it).
fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<u64, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut a, mut b, mut c, mut d) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: a live device handle and four valid out-pointers that outlive the call.
    let code = unsafe { sym(device.handle(), &mut a, &mut b, &mut c, &mut d) };
    nvml_wrapper::error::nvml_try(code)?;
    Ok(u64::from(a + b + c + d))
}

/// The per-window `/proc` reads, made by gpulse's own reader: `ProcessTable::scan_with` over
/// files kept open between windows (each GPU PID's `stat`, its main thread's `children` or,
/// when it has several threads, its `task/` listing and each thread's `children`, the `stat`
/// of each descendant found, and of each parent). Returns a checksum of what was read.
fn proc_window(files: &mut ProcFiles, pids: &BTreeSet<u32>) -> u64 {
    let pids: Vec<u32> = pids.iter().copied().collect();
    files.begin_window();
    let table = ProcessTable::scan_with(files, &pids).unwrap_or_default();
    files.end_window();
    pids.iter()
        .filter_map(|&pid| table.stat(pid))
        .map(|stat| stat.utime_ticks + stat.rss_pages)
        .fold(0, u64::wrapping_add)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("bench_floor: {e}");
            std::process::exit(2);
        }
    };
    let nvml = match Nvml::builder().lib_path(args.nvml_lib.as_os_str()).init() {
        Ok(nvml) => nvml,
        Err(e) => {
            eprintln!(
                "bench_floor: cannot open NVML from {}: {e}",
                args.nvml_lib.display()
            );
            std::process::exit(1);
        }
    };
    let mut floor = Floor {
        skip: HashSet::new(),
        process_util_seen: HashMap::new(),
        fans: HashMap::new(),
        gpm_checked: HashSet::new(),
        gpm_previous: HashMap::new(),
        pids: BTreeSet::new(),
        checksum: 0,
    };
    let mut files = ProcFiles::for_root(&args.proc_root);
    let start = Instant::now();
    let mut next_sample = start;
    let mut next_window = start + args.export_interval;
    loop {
        let now = Instant::now();
        if now >= next_sample {
            floor.sample(&nvml);
            next_sample += args.sample_interval;
            if next_sample < now {
                next_sample = now + args.sample_interval;
            }
        }
        if now >= next_window {
            floor.checksum = floor
                .checksum
                .wrapping_add(proc_window(&mut files, &floor.pids));
            next_window += args.export_interval;
        }
        // Keeps the calls and reads from being optimised away.
        std::hint::black_box(floor.checksum);
        let wake = next_sample.min(next_window);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}
