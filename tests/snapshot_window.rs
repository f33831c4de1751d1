//! Integration tests: `gpulse snapshot --window`, through the binary against nvml-sim with real
//! processes. One sample cannot support the rules that need CPU figures or a duration; a window
//! can, and its JSON says which window it summarises.

use std::process::Command;

use serde_json::Value;

use crate::findings::{sleeper, SpinningTree};
use crate::sampling::{gpulse_bin, sim_lib};

/// One idle H100 listing a CPU-bound process tree (`GPULSE_SPIN_PID`, 4 GiB, 3 % SM: input-bound)
/// and a sleeper holding 2 GiB at 0 % SM (an idle holder).
const SCENARIO: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-5a5a5a5a-0000-4000-8000-000000000001"

[device.signals]
gpu_util = 4

[[device.process]]
pid_env = "GPULSE_SPIN_PID"
memory_used_mib = 4096
sm_util = 3

[[device.process]]
pid_env = "GPULSE_SLEEP_PID"
memory_used_mib = 2048
sm_util = 0
"#;

/// Idle for 1 s counts; the CPU threshold is low because CI shares 2 cores among the tests (see
/// `findings::CONFIG`: 0.17-0.30 cores measured for the spinner under load, 0.00 for a sleeper).
const CONFIG: &str = r#"
[diagnosis.idle_holder]
min_duration = "1s"

[diagnosis.input_bound]
tree_cpu_cores_at_least = 0.05
"#;

fn snapshot(extra: &[&str], spin: u32, sleep: u32) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("scenario.toml");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    std::fs::write(&config, CONFIG).expect("write config");
    let out = Command::new(gpulse_bin())
        .args(["snapshot", "--format", "json", "--config"])
        .arg(&config)
        .arg("--nvml-lib")
        .arg(sim_lib())
        .args(extra)
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("GPULSE_KUBELET_SOCKET", "none")
        .env("GPULSE_SPIN_PID", spin.to_string())
        .env("GPULSE_SLEEP_PID", sleep.to_string())
        .output()
        .expect("run gpulse snapshot");
    assert!(
        out.status.success(),
        "gpulse snapshot {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snapshot JSON")
}

fn findings(json: &Value) -> Vec<(String, u64)> {
    json["findings"]
        .as_array()
        .expect("findings array")
        .iter()
        .map(|f| {
            let pid = f["subject"]["pid"].as_u64().unwrap_or(0);
            (f["rule"].as_str().unwrap_or("").to_string(), pid)
        })
        .collect()
}

#[test]
fn a_window_supports_the_rules_one_sample_cannot() {
    let spinner = SpinningTree::start();
    let spin = spinner.0.pid();
    let sleeping = sleeper();
    let sleep = sleeping.pid();

    let one = snapshot(&[], spin, sleep);
    assert!(
        one.get("window").is_none(),
        "one sample has no window: {one}"
    );
    assert_eq!(findings(&one), vec![], "one sample: {one:#}");

    let json = snapshot(&["--window", "2s"], spin, sleep);
    let window = &json["window"];
    let seconds = window["end"].as_f64().unwrap() - window["start"].as_f64().unwrap();
    assert!(
        (1.5..4.0).contains(&seconds),
        "a 2 s window sampled every 100 ms spans about 1.9 s, got {seconds}: {window}"
    );
    assert!(window["samples"].as_u64().unwrap() >= 15, "{window}");
    assert!(json["nvml_version"].is_string(), "{json}");
    let process = |pid: u32| {
        json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} missing: {json:#}"))
            .clone()
    };
    // CPU figures exist for both (the first sample primed the counters), busy for the spinner.
    let spin_cpu = process(spin)["usage"]["tree_cpu_utilization"].as_f64();
    let sleep_cpu = process(sleep)["usage"]["tree_cpu_utilization"].as_f64();
    assert!(spin_cpu.is_some_and(|c| c > 0.05), "{spin_cpu:?}: {json:#}");
    assert!(
        sleep_cpu.is_some_and(|c| c < 0.05),
        "{sleep_cpu:?}: {json:#}"
    );

    let mut found = findings(&json);
    found.sort();
    assert_eq!(
        found,
        vec![
            ("idle_holder".to_string(), u64::from(sleep)),
            ("input_bound".to_string(), u64::from(spin)),
        ],
        "{json:#}"
    );
}
