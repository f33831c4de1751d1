//! Integration tests of the library API (`gpulse::otel`, feature `otel-sdk`) through its example:
//! `examples/otel_sdk.rs`, built by `cargo test --features otel-sdk`, runs against nvml-sim with
//! its own PID listed as a GPU process and exports with opentelemetry-otlp to the real OTLP test
//! receiver, over gRPC and over HTTP/protobuf. The GPU metrics must arrive under the example's
//! own `service.name`, with the simulated values and the sidecar's names and attributes.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::run::{attr_str, metrics_of, points, value};
use crate::sampling::sim_lib;

const GPU: &str = "GPU-5e5e5e5e-1111-2222-3333-444444444444";

/// Frozen clock and constant signals, so every value is known; the example's own PID (given by
/// the shell that execs it) is the one GPU process.
const SCENARIO: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[clock]
freeze_at_s = 50

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-5e5e5e5e-1111-2222-3333-444444444444"
pci_bus_id = "00000000:18:00.0"
memory_total_mib = 81559
power_limit_w = 700

[device.signals]
gpu_util = 62
mem_util = 31
memory_used_mib = 30000
temperature_c = 58
power_w = 420

[[device.process]]
pid_env = "GPULSE_EXAMPLE_PID"
memory_used_mib = 10000
sm_util = 40
mem_util = 20
"#;

/// `target/<profile>/examples/otel_sdk`, which `cargo test --features otel-sdk` builds.
fn example_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>");
    let bin = profile_dir.join("examples").join("otel_sdk");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build --features otel-sdk --example otel_sdk` (a \
         `cargo test --features otel-sdk` builds it too)",
        bin.display()
    );
    bin
}

/// Runs the example for `seconds` against nvml-sim, exporting to `endpoint` with `protocol`,
/// and returns its PID and stderr once it has exited successfully.
fn run_example(protocol: &str, endpoint: &str, seconds: &str) -> (u32, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    let stderr = dir.path().join("stderr.log");
    // The shell exports its own PID, then execs the example under that same PID: the scenario
    // lists the example itself as the GPU process.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("export GPULSE_EXAMPLE_PID=$$; exec \"$0\"")
        .arg(example_bin())
        .env("GPULSE_NVML_LIB", sim_lib())
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("OTEL_SERVICE_NAME", "otel-sdk-example")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env("GPULSE_EXAMPLE_SECONDS", seconds)
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("start the otel_sdk example");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the example did not exit within 60 s; stderr:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(status.success(), "the example failed ({status}):\n{log}");
    (pid, log)
}

/// The accepted metrics requests' resources whose `service.name` is the example's.
fn example_resources(receiver: &Receiver) -> Vec<Value> {
    receiver
        .accepted()
        .into_iter()
        .filter(|r| r["signal"] == "metrics")
        .flat_map(|r| {
            r["request"]["resourceMetrics"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|rm| {
            attr_str(&rm["resource"]["attributes"], "service.name").as_deref()
                == Some("otel-sdk-example")
        })
        .collect()
}

/// The value of metric `name` in the last resource that has it, at the point whose attributes
/// include every `(key, value)` of `want`; with the metric's unit.
fn last_value(resources: &[Value], name: &str, want: &[(&str, &str)]) -> Option<(f64, String)> {
    resources.iter().rev().find_map(|rm| {
        let metric = metrics_of(rm).into_iter().find(|m| m["name"] == name)?;
        let point = points(metric).into_iter().find(|p| {
            want.iter()
                .all(|(k, v)| attr_str(&p["attributes"], k).as_deref() == Some(*v))
        })?;
        Some((
            value(point),
            metric["unit"].as_str().unwrap_or("").to_string(),
        ))
    })
}

fn check_gpu_metrics(receiver: &Receiver, example_pid: u32) {
    let resources = example_resources(receiver);
    assert!(
        !resources.is_empty(),
        "no metrics arrived under service.name=otel-sdk-example; the receiver got:\n{:#?}",
        receiver.requests()
    );
    let device = [("hw.id", GPU), ("hw.type", "gpu"), ("gpu.index", "0")];
    let expect = |name: &str, extra: &[(&str, &str)], want: f64, unit: &str| {
        let attrs: Vec<(&str, &str)> = device.iter().chain(extra).copied().collect();
        let (got, got_unit) = last_value(&resources, name, &attrs)
            .unwrap_or_else(|| panic!("no {name} point with {attrs:?} in {resources:#?}"));
        assert!(
            (got - want).abs() < 1e-6 * want.abs().max(1.0),
            "{name}: got {got}, want {want}"
        );
        assert_eq!(got_unit, unit, "{name}: unit");
    };
    expect(
        "hw.gpu.utilization",
        &[("hw.gpu.task", "general")],
        0.62,
        "1",
    );
    expect("hw.gpu.memory.utilization", &[], 0.31, "1");
    expect("hw.gpu.memory.usage", &[], 30000.0 * 1024.0 * 1024.0, "By");
    expect("hw.gpu.memory.limit", &[], 81559.0 * 1024.0 * 1024.0, "By");
    expect("hw.temperature", &[], 58.0, "Cel");
    expect("hw.power", &[], 420.0, "W");
    // The example's own process on the device.
    let own = [("hw.id", GPU), ("gpu.index", "0")];
    let (bytes, unit) =
        last_value(&resources, "process.gpu.memory.usage", &own).unwrap_or_else(|| {
            panic!(
                "no process.gpu.memory.usage for the example (PID {example_pid}) in {resources:#?}"
            )
        });
    assert_eq!(bytes, 10000.0 * 1024.0 * 1024.0);
    assert_eq!(unit, "By");
    let with_task = [
        ("hw.id", GPU),
        ("gpu.index", "0"),
        ("hw.gpu.task", "general"),
    ];
    let (util, _) = last_value(&resources, "process.gpu.utilization", &with_task)
        .expect("process.gpu.utilization for the example's own process");
    assert!(
        (util - 0.40).abs() < 1e-6,
        "process.gpu.utilization: {util}"
    );
}

#[test]
fn example_exports_gpu_metrics_over_grpc_under_its_own_service_name() {
    let receiver = Receiver::start(ReceiverOptions::default());
    let (pid, log) = run_example("grpc", &receiver.grpc_url(), "1.5");
    check_gpu_metrics(&receiver, pid);
    assert!(
        receiver
            .accepted()
            .iter()
            .all(|r| r["signal"] != "metrics" || r["transport"] == "grpc"),
        "expected gRPC requests only; example stderr:\n{log}"
    );
}

#[test]
fn example_exports_gpu_metrics_over_http_protobuf_and_flushes_at_shutdown() {
    let receiver = Receiver::start(ReceiverOptions::default());
    // Shorter than the 500 ms export interval: whatever arrives was sent by the shutdown flush.
    let (pid, log) = run_example("http/protobuf", &receiver.http_base(), "0.2");
    check_gpu_metrics(&receiver, pid);
    assert!(
        receiver
            .accepted()
            .iter()
            .all(|r| r["signal"] != "metrics" || r["transport"] == "http"),
        "expected HTTP requests only; example stderr:\n{log}"
    );
}

#[test]
fn example_refuses_an_unknown_protocol_with_what_to_use() {
    let bin = example_bin();
    let out = Command::new(bin)
        .env("GPULSE_NVML_LIB", sim_lib())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcc")
        .env("GPULSE_EXAMPLE_SECONDS", "0")
        .output()
        .expect("run the example");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"grpcc\"") && stderr.contains("`grpc` or `http/protobuf`"),
        "{stderr}"
    );
}
