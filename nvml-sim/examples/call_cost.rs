//! Measures what one NVML call costs through nvml-sim, loaded through nvml-wrapper as gpulse
//! loads it: a full sample sweep over every device of a scenario (identity lookups excluded,
//! as a sampler caches them), repeated, with the mean time per sweep and per call.
//!
//! `cargo build -p nvml-sim --release && cargo run -p nvml-sim --release --example call_cost [scenario.toml] [sweeps]`
//! (`cargo run --example` builds only the rlib, hence the explicit build of the cdylib)
//! (default: scenarios/bench-64x1024.toml, 200 sweeps).

use std::ffi::OsStr;
use std::path::Path;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::Nvml;

fn main() {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/bench-64x1024.toml").to_string()
    });
    let sweeps: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200);
    let exe = std::env::current_exe().expect("current exe");
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("libnvidia_ml.so"))
        .filter(|p| p.exists())
        .expect("no libnvidia_ml.so in the profile directory: run `cargo build -p nvml-sim --release` first");
    std::env::set_var("NVML_SIM_SCENARIO", &scenario);
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .expect("init");
    let n = nvml.device_count().expect("count");
    let mut calls = 0u64;
    let mut procs = 0usize;
    let started = Instant::now();
    for _ in 0..sweeps {
        for i in 0..n {
            let d = nvml.device_by_index(i).expect("handle");
            let _ = d.memory_info();
            let _ = d.utilization_rates();
            let _ = d.encoder_utilization();
            let _ = d.decoder_utilization();
            let _ = d.temperature(TemperatureSensor::Gpu);
            let _ = d.power_usage();
            let _ = d.enforced_power_limit();
            let _ = d.total_energy_consumption();
            let _ = d.clock_info(Clock::SM);
            let _ = d.clock_info(Clock::Memory);
            let _ = d.clock_info(Clock::Graphics);
            let _ = d.fan_speed(0);
            let _ = d.pcie_throughput(PcieUtilCounter::Send);
            let _ = d.pcie_throughput(PcieUtilCounter::Receive);
            let _ = d.current_throttle_reasons();
            let _ = d.performance_state();
            // Two-call protocols: count, then fill.
            procs += d.running_compute_processes().map_or(0, |p| p.len());
            procs += d.running_graphics_processes().map_or(0, |p| p.len());
            let _ = d.process_utilization_stats(None);
            calls += 17 + 2 * 2 + 2;
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{scenario}: {n} GPUs, {} processes listed per sweep; {sweeps} sweeps in {:.3} s: \
         {:.1} µs per sweep, {:.0} ns per NVML call ({calls} calls)",
        procs / sweeps as usize,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / sweeps as f64,
        elapsed.as_secs_f64() * 1e9 / calls as f64,
    );
}
