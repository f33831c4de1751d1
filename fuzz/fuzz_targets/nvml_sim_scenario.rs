//! Fuzz target: an nvml-sim scenario file (TOML), compiled as the simulator compiles
//! `NVML_SIM_SCENARIO`, then every device's values read at a few times as the NVML calls read
//! them. A bad scenario must end in a `ScenarioError`, never a panic.
#![no_main]

use nvidia_ml::model::Sim;
use nvidia_ml::scenario::{compile, Env};

/// No environment: a scenario's `${VAR}` references stay unset.
struct NoEnv;

impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match compile("fuzz.toml", text, &NoEnv) {
        Ok(sim) => read_everything(&sim),
        Err(e) => {
            let _ = e.to_string();
        }
    }
});

fn read_everything(sim: &Sim) {
    for t in [0.0, 0.5, 7.25, 60.0, 3600.0, 1e9] {
        let _ = sim.driver_error(t);
        for device in sim.devices.iter() {
            let _ = (
                device.is_lost(t),
                device.memory_used(t),
                device.energy_mj(t),
            );
            let s = &device.signals;
            for signal in [
                &s.gpu_util,
                &s.mem_util,
                &s.encoder_util,
                &s.decoder_util,
                &s.temperature_c,
                &s.power_w,
                &s.fan_percent,
                &s.pcie_tx_kbps,
                &s.pcie_rx_kbps,
                &s.throttle_reasons,
                &s.ecc_corrected,
                &s.ecc_uncorrected,
                &s.pstate,
                &device.hw.pcie_replays,
            ] {
                let _ = (signal.value(t), signal.integral(t));
            }
            for clock in &s.clocks_mhz {
                let _ = clock.value(t);
            }
            for policy in 0..9 {
                let _ = device.hw.violations.time_ns(policy, t);
            }
            for process in device.processes.iter() {
                let _ = (process.memory_bytes(t), process.active.contains(t));
                let _ = (process.sm_util.value(t), process.mem_util.value(t));
            }
            for mig in device.hw.mig.iter() {
                let _ = mig.memory_used_mib.as_ref().map(|m| m.value(t));
            }
        }
    }
}
