//! Integration tests: gpulse's telemetry judged by OpenTelemetry's own tool, Weaver. gpulse's
//! registry (generated from the schema, `registry/`) passes `weaver registry check`, and what
//! `gpulse run` sends, on nvml-sim scenarios that between them make every metric (processes and
//! findings, MIG, NVLink, GPM, HBM temperature and fans, training steps through the receiver,
//! whose enriched spans go upstream too), is live-checked against it by
//! `weaver registry live-check` over OTLP/gRPC: no violation, and every metric of the registry
//! seen. The report (improvements and information included) stays in
//! `target/tmp/weaver-live-check/live_check.json`.
//!
//! Weaver is not on crates.io: `GPULSE_WEAVER` names the binary (default
//! `../shared/weaver/weaver` beside the repository, as CI provides it; elsewhere a Weaver 0.25.1
//! from its GitHub releases) and `GPULSE_SEMCONV_MODEL` the semantic conventions' `model/`
//! folder it depends on (default `../shared/weaver/semconv/model`). Without them the tests fail
//! and say so; they never skip.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpulse::schema::health::HEALTH_METRICS;
use gpulse::schema::registry::{files, RESTATED_SEMCONV_METRICS, SEMCONV_METRICS};
use gpulse::schema::METRICS;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message as _;
use serde_json::Value;

use crate::framework::{free_port, http, now_nanos, step};
use crate::kernel::ChildGuard;
use crate::run::Gpulse;

/// Metrics no scenario here makes, each with why: the check asserts every other one was seen.
const NOT_EXERCISED: [(&str, &str); 1] = [(
    "gpulse.export.failures",
    "needs a backend that refuses exports, and live-check accepts everything",
)];

fn from_env_or_shared(var: &str, shared: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(shared)
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: set {var} (Weaver 0.25.1 comes from \
         https://github.com/open-telemetry/weaver/releases, the semantic conventions' model/ \
         folder from open-telemetry/semantic-conventions; CI provides both in ../shared/weaver)",
        path.display()
    );
    path.canonicalize().expect("an absolute path")
}

fn weaver() -> PathBuf {
    from_env_or_shared("GPULSE_WEAVER", "shared/weaver/weaver")
}

/// gpulse's registry, depending on the local semantic conventions, in a fresh folder.
fn registry() -> tempfile::TempDir {
    let model = from_env_or_shared("GPULSE_SEMCONV_MODEL", "shared/weaver/semconv/model");
    // Weaver skips hidden folders, which tempfile's default names are.
    let dir = tempfile::Builder::new()
        .prefix("gpulse-registry-")
        .tempdir()
        .expect("temp dir");
    for (name, content) in files(model.to_str().expect("a UTF-8 path")) {
        std::fs::write(dir.path().join(name), content).expect("write the registry");
    }
    dir
}

#[test]
fn registry_passes_weavers_checks() {
    let registry = registry();
    let output = Command::new(weaver())
        .args(["registry", "check", "-r"])
        .arg(registry.path())
        .output()
        .expect("run weaver registry check");
    assert!(
        output.status.success(),
        "weaver registry check failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `weaver registry live-check` listening for OTLP/gRPC; its report goes to `out`.
struct LiveCheck {
    child: Child,
    grpc_port: u16,
    admin_port: u16,
    out: PathBuf,
}

impl LiveCheck {
    fn start(registry: &Path, out: &Path) -> LiveCheck {
        let _ = std::fs::remove_dir_all(out);
        std::fs::create_dir_all(out).expect("report folder");
        let (grpc_port, admin_port) = (free_port(), free_port());
        let log = std::fs::File::create(out.join("weaver.log")).expect("weaver log");
        let child = Command::new(weaver())
            .args(["registry", "live-check", "--input-source", "otlp"])
            .args(["--otlp-grpc-address", "127.0.0.1", "--otlp-grpc-port"])
            .arg(grpc_port.to_string())
            .arg("--admin-port")
            .arg(admin_port.to_string())
            .args([
                "--inactivity-timeout",
                "120",
                "--format",
                "json",
                "--no-stream",
            ])
            .arg("-r")
            .arg(registry)
            .arg("-o")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start weaver registry live-check");
        let mut live = LiveCheck {
            child,
            grpc_port,
            admin_port,
            out: out.to_path_buf(),
        };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", grpc_port)).is_err() {
            if let Some(status) = live.child.try_wait().expect("wait") {
                panic!("weaver live-check exited with {status}: {}", live.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "weaver live-check did not listen within 30 s: {}",
                live.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        live
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.out.join("weaver.log")).unwrap_or_default()
    }

    /// Stops the listener through its admin endpoint and reads the report.
    fn finish(mut self) -> Value {
        let (status, body) = http(self.admin_port, "POST", "/stop", b"");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "weaver live-check did not finish within 60 s of /stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let path = self.out.join("live_check.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "no report at {} ({e}); weaver exited with {status}: {}",
                path.display(),
                self.log()
            )
        });
        serde_json::from_str(&text).expect("a JSON report")
    }
}

impl Drop for LiveCheck {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An H100 whose HBM reports its temperature and which has a fan, with a real process (a
/// sleeping child) that sends training steps through gpulse's receiver.
const TRAINER_SCENARIO: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-7e7e7e7e-1111-2222-3333-444444444444"
fans = 1

[device.signals]
gpu_util = 80
power_w = 500
memory_temperature_c = 71
fan_percent = 40

[device.gpm]
sm_activity = 0.7
tensor_activity = 0.4

[[device.process]]
pids_env = "GPULSE_TEST_PIDS"
kind = "compute"
memory_used_mib = 20000
sm_util = 75
mem_util = 40
"#;

/// The demo's config: idle_holder speaks after 3 s, so findings start within the run.
const FAST_FINDINGS: &str = "[diagnosis.idle_holder]\nmin_duration = \"3s\"\n";

fn scenario(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("nvml-sim/scenarios")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every violation in the report, as `signal: message` lines.
fn violations(report: &Value) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(advice) = map
                    .get("live_check_result")
                    .and_then(|r| r["all_advice"].as_array())
                {
                    for a in advice.iter().filter(|a| a["level"] == "violation") {
                        out.push(format!("{}: {}", a["signal_name"], a["message"]));
                    }
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&report["samples"], &mut out);
    out
}

#[test]
fn gpulse_run_live_checks_clean_against_its_registry() {
    let registry = registry();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weaver-live-check");
    let live = LiveCheck::start(registry.path(), &out);
    let endpoint = format!("http://127.0.0.1:{}", live.grpc_port);
    let otlp = |extra: &[(&'static str, String)]| {
        let mut env = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
        ];
        env.extend_from_slice(extra);
        env
    };
    let windows = ["--sample-interval", "100ms", "--export-interval", "1s"];
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(&config, FAST_FINDINGS).expect("write config");
    let config = config.to_str().expect("UTF-8 temp path");

    // The demo node: processes (one busy, one idle holder), findings, GPM, throttling.
    let (trainer, idle) = (sleeper(), sleeper());
    let demo = Gpulse::start(
        &scenario("demo.toml"),
        &[],
        &[&windows[..], &["--config", config]].concat(),
        &otlp(&[
            ("GPULSE_DEMO_TRAINER", trainer.pid().to_string()),
            ("GPULSE_DEMO_IDLE", idle.pid().to_string()),
        ]),
    );
    // MIG instances with a process alone on each; NVLink links, one down.
    let mig = Gpulse::start(&scenario("mig-2-instances.toml"), &[], &windows, &otlp(&[]));
    let nvlink = Gpulse::start(&scenario("nvlink-4-links.toml"), &[], &windows, &otlp(&[]));
    // A trainer whose step spans reach gpulse's receiver, which enriches and forwards them.
    let steps = sleeper();
    let receiver_port = free_port();
    let training = Gpulse::start(
        TRAINER_SCENARIO,
        &[steps.pid()],
        &[
            &windows[..],
            &["--otlp-receiver-http", &receiver_port.to_string()],
        ]
        .concat(),
        &otlp(&[]),
    );
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", receiver_port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "gpulse's OTLP receiver did not come up: {}",
            training.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut step_start = now_nanos();
    for n in 0..24 {
        std::thread::sleep(Duration::from_millis(250));
        let at = now_nanos();
        let mut spans = step(steps.pid(), n, step_start, at, 0.3);
        // The step's time in collectives, as the companion sets it on a distributed rank.
        spans.scope_spans[0].spans[0].attributes.push(KeyValue {
            key: "pytorch.distributed.collective.wait".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::DoubleValue(0.05)),
            }),
            ..Default::default()
        });
        let traces = ExportTraceServiceRequest {
            resource_spans: vec![spans],
        };
        let (status, body) = http(receiver_port, "POST", "/v1/traces", &traces.encode_to_vec());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        step_start = at;
    }
    for gpulse in [demo, mig, nvlink, training] {
        let (status, stderr) = gpulse.terminate();
        assert!(
            status.success(),
            "gpulse run exited with {status}: {stderr}"
        );
    }
    let report = live.finish();

    let found = violations(&report);
    let stats = &report["statistics"];
    assert!(
        found.is_empty(),
        "{} violations (report: {}):\n{}",
        found.len(),
        out.join("live_check.json").display(),
        found[..found.len().min(40)].join("\n")
    );
    assert_eq!(
        stats["advice_level_counts"]["violation"]
            .as_u64()
            .unwrap_or(0),
        0
    );
    let seen = |name: &str| stats["seen_registry_metrics"][name].as_u64().unwrap_or(0) > 0;
    let expected: Vec<&str> = METRICS
        .iter()
        .map(|m| m.name)
        .chain(HEALTH_METRICS.iter().map(|m| m.name))
        .filter(|name| !NOT_EXERCISED.iter().any(|(n, _)| n == name))
        .collect();
    let unseen: Vec<&&str> = expected.iter().filter(|name| !seen(name)).collect();
    assert!(
        unseen.is_empty(),
        "metrics of the registry that no scenario made: {unseen:?}"
    );
    for name in SEMCONV_METRICS.iter().chain(&RESTATED_SEMCONV_METRICS) {
        assert!(seen(name), "{name}");
    }
    let non_registry = stats["seen_non_registry_metrics"]
        .as_object()
        .map_or(0, |m| m.len());
    assert_eq!(non_registry, 0, "{}", stats["seen_non_registry_metrics"]);
    assert!(
        stats["seen_registry_events"]["gpulse.diagnosis.finding"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "no finding's log record reached live-check: {}",
        stats["seen_registry_events"]
    );
    drop((trainer, idle, steps));
}

fn sleeper() -> ChildGuard {
    ChildGuard::spawn(Command::new("sleep").arg("300")).expect("spawn sleep")
}
