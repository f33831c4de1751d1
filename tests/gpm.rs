//! GPM through `gpulse run` against nvml-sim: a GPU without GPM exports no GPM metric and logs
//! no warning; a driver that starts refusing GPM (NO_PERMISSION, from 5 s in the scenario) gets
//! exactly one warning naming the fix, and every other metric keeps arriving.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::run::{metrics_of, metrics_requests, Gpulse};

const GPM_NAMES: [&str; 5] = [
    "nvidia.gpu.sm.activity",
    "nvidia.gpu.sm.occupancy",
    "nvidia.gpu.dram.activity",
    "nvidia.gpu.graphics.activity",
    "nvidia.gpu.pipe.activity",
];

fn scenario(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("nvml-sim/scenarios")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Node metric names of one metrics request.
fn node_names(request: &Value) -> Vec<String> {
    metrics_of(&request["request"]["resourceMetrics"][0])
        .into_iter()
        .filter_map(|m| m["name"].as_str().map(str::to_string))
        .collect()
}

/// The metrics requests that carry device windows (a request at shutdown may carry only
/// gpulse's own health metrics).
fn device_windows<'a>(requests: &[&'a Value]) -> Vec<&'a Value> {
    requests
        .iter()
        .copied()
        .filter(|r| node_names(r).iter().any(|n| n == "hw.status"))
        .collect()
}

/// Runs `scenario_file` until `done` holds for the metrics requests (or 90 s), then stops gpulse.
fn run(scenario_file: &str, done: impl Fn(&[&Value]) -> bool) -> (Vec<Value>, String) {
    let receiver = Receiver::start(ReceiverOptions::default());
    let gpulse = Gpulse::start(
        &scenario(scenario_file),
        &[],
        &["--sample-interval", "200ms", "--export-interval", "1s"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
        ],
    );
    receiver.wait_for(
        |r| done(&device_windows(&metrics_requests(r))),
        Duration::from_secs(90),
    );
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    (receiver.requests(), stderr)
}

#[test]
fn gpm_unsupported_exports_no_gpm_metric_and_no_warning() {
    let (requests, stderr) = run("gpm-unsupported.toml", |m| m.len() >= 3);
    let metrics = device_windows(&metrics_requests(&requests));
    assert!(
        metrics.len() >= 3,
        "{} device windows: {stderr}",
        metrics.len()
    );
    for request in &metrics {
        let names = node_names(request);
        assert!(names.iter().any(|n| n == "hw.power"), "{names:?}");
        for gpm in GPM_NAMES {
            assert!(
                !names.iter().any(|n| n == gpm),
                "{gpm} on an A100: {names:?}"
            );
        }
    }
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("WARN") || l.contains("ERROR")),
        "no warning for a GPU without GPM: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .filter(|l| l.contains("gives no GPM metrics"))
            .count()
            == 2,
        "said once per GPU at info: {stderr}"
    );
}

#[test]
fn gpm_permission_denied_warns_once_and_other_metrics_keep_arriving() {
    // GPM flows until 5 s (scenario time), then the driver refuses it. Wait for three windows
    // without GPM after it was seen.
    let after_denial = |m: &[&Value]| {
        let first_with = m
            .iter()
            .position(|r| node_names(r).iter().any(|n| n == "nvidia.gpu.sm.activity"));
        first_with.is_some_and(|i| {
            m[i..]
                .iter()
                .filter(|r| !node_names(r).iter().any(|n| n == "nvidia.gpu.sm.activity"))
                .count()
                >= 3
        })
    };
    let (requests, stderr) = run("gpm-permission-denied.toml", after_denial);
    let metrics = device_windows(&metrics_requests(&requests));
    assert!(
        after_denial(&metrics),
        "GPM never seen, or never stopped: {} requests: {stderr}",
        metrics.len()
    );
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "exactly one warning: {stderr}");
    assert!(
        warnings[0].contains("NVreg_RestrictProfilingToAdminUsers=0")
            && warnings[0].contains("privileged"),
        "the warning names the fix: {}",
        warnings[0]
    );
    // The windows after the denial still have the other device metrics.
    let last = metrics.last().expect("a device window");
    let names = node_names(last);
    for needed in [
        "hw.power",
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.status",
    ] {
        assert!(
            names.iter().any(|n| n == needed),
            "{needed} missing after the denial: {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n == "nvidia.gpu.sm.activity"),
        "{names:?}"
    );
}
