//! Validates scenario files the way the library does at init, and prints a summary of each
//! (devices, processes, events, faults) or the error with its line and column.
//!
//! `cargo run -p nvml-sim --example check_scenario -- nvml-sim/scenarios/*.toml`

use nvidia_ml::scenario::{compile, ProcessEnv};

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{path}: cannot read: {e}");
                failed = true;
                continue;
            }
        };
        match compile(&path, &text, &ProcessEnv) {
            Ok(sim) => {
                let procs: usize = sim.devices.iter().map(|d| d.processes.len()).sum();
                let faulty = sim.devices.iter().filter(|d| !d.faults.is_empty()).count();
                let lost = sim.devices.iter().filter(|d| !d.lost.is_empty()).count();
                println!(
                    "{path}: ok: {} devices, {procs} processes, {} events, {faulty} devices with \
                     field faults, {lost} with lost windows, driver {}",
                    sim.devices.len(),
                    sim.events.len(),
                    sim.driver_version
                );
            }
            Err(e) => {
                eprintln!("{e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
