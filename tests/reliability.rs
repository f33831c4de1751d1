//! Integration tests: reliability and security of `gpulse run`, end to end (issue 6). The real
//! binary runs against nvml-sim scenarios with faults (`nvml-sim/scenarios/reliability-*.toml`)
//! and exports either to standard output (fast, no Python) or to the real OTLP receiver when
//! the backend's behaviour matters (outages, refusals). Each test asserts what an operator
//! would see: the metrics that arrive, gpulse's own health metrics, the exit status and the log.
//!
//! Timing: every wait is "until it shows up, within a generous deadline", never "exactly after
//! N ms", so a loaded 2-core CI machine makes the tests slower, not flaky.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::kernel::ChildGuard;
use crate::run::{
    attr_str, is_health_request, metrics_of, metrics_requests, points, value, Gpulse,
};
use crate::sampling::{gpulse_bin, sim_lib};

const GPU0: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-1b1b1b1b-1111-2222-3333-444444444444";

const GPU_LOST: &str = include_str!("../nvml-sim/scenarios/reliability-gpu-lost.toml");
const DRIVER_GONE: &str = include_str!("../nvml-sim/scenarios/reliability-driver-gone.toml");
const HUNG_CALL: &str = include_str!("../nvml-sim/scenarios/reliability-hung-call.toml");
const UNSUPPORTED: &str = include_str!("../nvml-sim/scenarios/reliability-unsupported.toml");
const INIT_ERROR: &str = include_str!("../nvml-sim/scenarios/reliability-init-error.toml");
const CHURN: &str = include_str!("../nvml-sim/scenarios/reliability-churn.toml");

/// Time frozen, one GPU, the test's real processes listed through `GPULSE_TEST_PIDS`.
const STEADY: &str = r#"
[clock]
freeze_at_s = 30

[[device]]
uuid = "GPU-0a0a0a0a-1111-2222-3333-444444444444"

[device.signals]
gpu_util = 40
power_w = 250

[[device.process]]
pids_env = "GPULSE_TEST_PIDS"
memory_used_mib = 1024
"#;

const FAST: [&str; 4] = ["--sample-interval", "100ms", "--export-interval", "500ms"];

/// Generous: a debug build on a loaded CI machine.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// A `gpulse run --exporter stdout` whose OTLP/JSON lines a test reads back.

struct Sidecar {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Sidecar {
    fn start(scenario: &str, args: &[&str], env: &[(&str, &str)]) -> Sidecar {
        Self::spawn(scenario, args, env, true)
    }

    fn spawn(scenario: &str, args: &[&str], env: &[(&str, &str)], stdout_exporter: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, scenario).expect("write scenario");
        let mut command = Command::new(gpulse_bin());
        command.arg("run");
        if stdout_exporter {
            command.args(["--exporter", "stdout"]);
        }
        command
            .args(args)
            .arg("--nvml-lib")
            .arg(sim_lib())
            .env("NVML_SIM_SCENARIO", &path)
            .env("GPULSE_TEST_PIDS", "")
            .env("GPULSE_KUBELET_SOCKET", "none")
            .env("GPULSE_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("OTEL_RESOURCE_ATTRIBUTES")
            .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("stdout.jsonl")).expect("stdout"))
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).expect("stderr"));
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("start gpulse run");
        Sidecar {
            child: Some(child),
            dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The metrics requests printed so far (complete lines only).
    fn metrics(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.dir.path().join("stdout.jsonl")).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|v| v.get("resourceMetrics").is_some())
            .collect()
    }

    fn stderr(&self) -> String {
        strip_ansi(&std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default())
    }

    /// Waits until `done` holds for the requests so far; panics with the log when it never does.
    fn wait_for(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let requests = self.metrics();
            if done(&requests) {
                return requests;
            }
            if let Some(child) = &self.child {
                let pid = child.id();
                assert!(
                    Path::new(&format!("/proc/{pid}")).exists(),
                    "gpulse exited while waiting for {what}: {}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {PATIENCE:?} ({} requests). stderr:\n{}",
                requests.len(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then the exit status and the log.
    fn terminate(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill has no memory-safety preconditions; the PID is our child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let status =
            wait_exit(&mut child, Duration::from_secs(20)).expect("gpulse stops on SIGTERM");
        (status, self.stderr())
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_exit(child: &mut Child, patience: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// tracing colours its output when it thinks it may; the tests compare plain text.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Reading requests (stdout lines and receiver records have the same `resourceMetrics` shape).

/// The `ExportMetricsServiceRequest` of a stdout line or of a receiver record.
fn body(request: &Value) -> &Value {
    request.get("request").unwrap_or(request)
}

fn node(request: &Value) -> &Value {
    &body(request)["resourceMetrics"][0]
}

fn resources(request: &Value) -> usize {
    body(request)["resourceMetrics"]
        .as_array()
        .map_or(0, Vec::len)
}

fn metric<'a>(rm: &'a Value, name: &str) -> Option<&'a Value> {
    metrics_of(rm).into_iter().find(|m| m["name"] == name)
}

/// The sum of a node metric's points (every attribute set): `None` when the metric is absent.
fn node_total(request: &Value, name: &str) -> Option<f64> {
    metric(node(request), name).map(|m| points(m).into_iter().map(value).sum())
}

/// A node metric's points by one attribute's value.
fn node_by(request: &Value, name: &str, key: &str) -> BTreeMap<String, f64> {
    metric(node(request), name)
        .map(|m| {
            points(m)
                .into_iter()
                .map(|p| {
                    (
                        attr_str(&p["attributes"], key).unwrap_or_default(),
                        value(p),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value of a device metric for GPU `hw_id` (and an extra attribute when given).
fn device_value(
    request: &Value,
    name: &str,
    hw_id: &str,
    extra: Option<(&str, &str)>,
) -> Option<f64> {
    let m = metric(node(request), name)?;
    points(m)
        .into_iter()
        .find(|p| {
            let a = &p["attributes"];
            attr_str(a, "hw.id").as_deref() == Some(hw_id)
                && extra.is_none_or(|(k, v)| attr_str(a, k).as_deref() == Some(v))
        })
        .map(value)
}

fn has_device_metrics(request: &Value) -> bool {
    metric(node(request), "hw.gpu.utilization").is_some()
}

/// The latest `timeUnixNano` of any data point in a request (0 when it has none).
fn latest_point_time(request: &Value) -> u64 {
    fn walk(v: &Value, latest: &mut u64) {
        match v {
            Value::Object(map) => {
                for (key, value) in map {
                    if key == "timeUnixNano" {
                        let t = value
                            .as_str()
                            .and_then(|t| t.parse().ok())
                            .or_else(|| value.as_u64())
                            .unwrap_or(0);
                        *latest = (*latest).max(t);
                    } else {
                        walk(value, latest);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, latest)),
            _ => {}
        }
    }
    let mut latest = 0;
    walk(request, &mut latest);
    latest
}

fn last_total(requests: &[Value], name: &str) -> f64 {
    requests
        .iter()
        .rev()
        .find_map(|r| node_total(r, name))
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// 1. Backend outages and the delivery queue (real receiver).

fn http_env(receiver: &Receiver) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
    ]
}

#[test]
fn http_outage_with_503_and_retry_after_is_waited_out_and_delivered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let outage = dir.path().join("backend-down");
    std::fs::write(&outage, "").expect("outage flag");
    let receiver = Receiver::start(ReceiverOptions {
        fail_status: Some("unavailable"),
        fail_until_file: Some(outage.clone()),
        retry_after: Some(2),
        ..ReceiverOptions::default()
    });
    let gpulse = Gpulse::start(STEADY, &[], &FAST, &http_env(&receiver));
    let refused = receiver.wait_for(
        |r| r.iter().filter(|r| r["answer"] == "unavailable").count() >= 2,
        PATIENCE,
    );
    std::fs::remove_file(&outage).expect("end the outage");
    let requests = receiver.wait_for(
        |r| {
            metrics_requests(r)
                .iter()
                .any(|r| node_total(r, "gpulse.export.failures").unwrap_or(0.0) >= 2.0)
        },
        Duration::from_secs(60),
    );
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");

    // The server asked for 2 s between attempts: no two refused attempts closer than that
    // (with a little slack for the receiver's own clock reading).
    let times: Vec<f64> = refused
        .iter()
        .filter(|r| r["answer"] == "unavailable" && r["transport"] == "http")
        .filter_map(|r| r["received_at"].as_f64())
        .collect();
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= 1.8,
            "Retry-After: 2 not honoured, attempts {:.2} s apart: {times:?}",
            pair[1] - pair[0]
        );
    }
    // Counted by reason, on gpulse's own node resource, and delivered once the backend is back.
    let delivered = metrics_requests(&requests);
    let failures = delivered
        .iter()
        .rev()
        .map(|r| node_by(r, "gpulse.export.failures", "error.type"))
        .find(|f| !f.is_empty())
        .expect("gpulse.export.failures");
    assert!(
        failures.values().sum::<f64>() >= 2.0,
        "failures by reason: {failures:?}"
    );
    assert!(stderr.contains("will retry"), "{stderr}");
    // Nothing was dropped: an outage of a few seconds fits the default queue.
    assert_eq!(last_total(&requests, "gpulse.export.dropped"), 0.0);
    assert!(delivered.iter().any(|r| has_device_metrics(r)));
}

#[test]
fn a_permanent_refusal_is_dropped_counted_and_logged_with_the_servers_message() {
    let receiver = Receiver::start(ReceiverOptions {
        fail_status: Some("invalid_argument"),
        fail_count: Some(2),
        ..ReceiverOptions::default()
    });
    let gpulse = Gpulse::start(STEADY, &[], &FAST, &http_env(&receiver));
    let requests = receiver.wait_for(
        |r| {
            metrics_requests(r)
                .iter()
                .any(|r| node_total(r, "gpulse.export.dropped").unwrap_or(0.0) >= 2.0)
        },
        PATIENCE,
    );
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let refused: Vec<&Value> = requests
        .iter()
        .filter(|r| r["answer"] == "invalid_argument")
        .collect();
    assert_eq!(refused.len(), 2, "a 400 is never retried");
    let delivered = metrics_requests(&requests);
    let last = delivered
        .iter()
        .rev()
        .find(|r| is_health_request(r))
        .expect("gpulse's health delivered after the refusals");
    assert!(node_total(last, "gpulse.export.data_points.dropped").unwrap_or(0.0) > 0.0);
    let failures = node_by(last, "gpulse.export.failures", "error.type");
    assert!(failures.values().sum::<f64>() >= 2.0, "{failures:?}");
    assert!(
        stderr.contains("refused it for good")
            && stderr.contains("test receiver answers invalid_argument"),
        "the log must carry the server's own message: {stderr}"
    );
}

/// An outage with a queue too small to hold it: the oldest requests go, are counted, and what
/// is left arrives once the backend is back.
#[test]
fn a_full_queue_drops_the_oldest_and_counts_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let outage = dir.path().join("backend-down");
    std::fs::write(&outage, "").expect("outage flag");
    let receiver = Receiver::start(ReceiverOptions {
        fail_until_file: Some(outage.clone()),
        ..ReceiverOptions::default()
    });
    let gpulse = Gpulse::start(
        STEADY,
        &[],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "200ms",
            "--queue-max-bytes",
            "64KiB",
        ],
        &http_env(&receiver),
    );
    let down_since = std::time::SystemTime::now();
    let down_ns = down_since
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    // The outage lasts until gpulse retries a window that ends more than 1.2 s into it: the queue
    // is retried oldest first and nothing was delivered, so every older window was dropped to
    // make room by then.
    receiver.wait_for(
        |r| {
            refused_window_ends(r)
                .into_iter()
                .any(|end| end > down_ns + 1_200_000_000)
        },
        Duration::from_secs(60),
    );
    std::fs::remove_file(&outage).expect("end the outage");
    // Both kinds of request: gpulse's health (with the drops) and a surviving window.
    let requests = receiver.wait_for(
        |r| {
            let delivered = metrics_requests(r);
            delivered
                .iter()
                .any(|r| node_total(r, "gpulse.export.dropped").unwrap_or(0.0) >= 3.0)
                && delivered.iter().any(|r| has_device_metrics(r))
        },
        Duration::from_secs(60),
    );
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(stderr.contains("queue is full"), "{stderr}");
    let delivered = metrics_requests(&requests);
    let last = delivered
        .iter()
        .rev()
        .find(|r| is_health_request(r))
        .expect("gpulse's health delivered");
    assert!(node_total(last, "gpulse.export.data_points.dropped").unwrap_or(0.0) > 0.0);
    // Oldest first: no window from the first second of the outage survived.
    let first_window_end = delivered
        .iter()
        .find_map(|r| {
            let m = metric(node(r), "hw.gpu.utilization")?;
            points(m)[0]["timeUnixNano"].as_str()?.parse::<u64>().ok()
        })
        .expect("a delivered window");
    assert!(
        first_window_end > down_ns + 1_000_000_000,
        "the oldest windows should have been dropped, yet one ending {} ms into the outage arrived",
        (first_window_end.saturating_sub(down_ns)) / 1_000_000
    );
}

#[test]
fn queued_requests_older_than_max_age_expire_and_are_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let outage = dir.path().join("backend-down");
    std::fs::write(&outage, "").expect("outage flag");
    let receiver = Receiver::start(ReceiverOptions {
        fail_until_file: Some(outage.clone()),
        ..ReceiverOptions::default()
    });
    let mut args = FAST.to_vec();
    args.extend(["--queue-max-age", "1s"]);
    let gpulse = Gpulse::start(STEADY, &[], &args, &http_env(&receiver));
    // The outage lasts until gpulse retries a window made 1.5 s after the first one it tried:
    // the windows between (three at this export interval) were older than the 1 s max age and
    // expired, since nothing was delivered and the queue is far from full.
    receiver.wait_for(
        |r| {
            let ends = refused_window_ends(r);
            let first = ends.iter().min().copied().unwrap_or(u64::MAX);
            ends.iter()
                .any(|&end| end > first.saturating_add(1_500_000_000))
        },
        Duration::from_secs(60),
    );
    std::fs::remove_file(&outage).expect("end the outage");
    let requests = receiver.wait_for(
        |r| {
            metrics_requests(r)
                .iter()
                .any(|r| node_total(r, "gpulse.export.dropped").unwrap_or(0.0) >= 2.0)
        },
        Duration::from_secs(60),
    );
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    // Nothing that arrived had waited much longer than the max age (plus one retry delay).
    for r in metrics_requests(&requests) {
        let Some(m) = metric(node(r), "gpulse.export.queue.size") else {
            continue;
        };
        let made: u64 = points(m)[0]["timeUnixNano"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("timeUnixNano");
        let waited = r["received_at"].as_f64().expect("received_at") - made as f64 / 1e9;
        assert!(
            waited < 4.0,
            "a request arrived {waited:.1} s after it was made"
        );
    }
}

/// gpulse's own health, on its own (node) resource, with the metrics a dashboard needs.
#[test]
fn own_health_metrics_are_on_the_node_resource() {
    let gpulse = Sidecar::start(UNSUPPORTED, &FAST, &[]);
    let requests = gpulse.wait_for("two windows with health", |r| {
        r.iter()
            .filter(|r| node_total(r, "gpulse.export.duration").is_some())
            .count()
            >= 2
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let r = requests
        .iter()
        .rev()
        .find(|r| node_total(r, "gpulse.export.duration").is_some())
        .expect("health");
    let node = node(r);
    assert!(
        attr_str(&node["resource"]["attributes"], "process.pid").is_none(),
        "health belongs to the node resource, not to a process"
    );
    assert_eq!(
        attr_str(&node["resource"]["attributes"], "service.name").as_deref(),
        Some("gpulse")
    );
    for name in [
        "gpulse.export.queue.size",
        "gpulse.export.queue.bytes",
        "gpulse.export.dropped",
        "gpulse.export.data_points.dropped",
        "gpulse.export.duration",
        "gpulse.sample.duration",
        "gpulse.sample.duration.max",
        "gpulse.sample.stalled",
        "gpulse.nvml.errors",
    ] {
        assert!(metric(node, name).is_some(), "{name} missing from {node}");
    }
    let sample = node_total(r, "gpulse.sample.duration").expect("sample duration");
    assert!(sample > 0.0 && sample < 5.0, "sample duration {sample} s");
    // The scenario's unsupported power reading, by kind.
    let errors = node_by(r, "gpulse.nvml.errors", "error.type");
    assert!(
        errors.get("not_supported").copied().unwrap_or(0.0) >= 1.0,
        "NVML errors by kind: {errors:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. NVML faults.

#[test]
fn a_missing_nvml_library_fails_at_start_with_what_to_install() {
    let started = Instant::now();
    let out = Command::new(gpulse_bin())
        .args([
            "run",
            "--exporter",
            "stdout",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ])
        .env("GPULSE_KUBELET_SOCKET", "none")
        .stdin(Stdio::null())
        .output()
        .expect("run gpulse");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it must not hang"
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = strip_ansi(&String::from_utf8_lossy(&out.stderr));
    assert!(
        stderr.contains("/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(stderr.contains("Install the NVIDIA driver"), "{stderr}");
    assert!(stderr.contains("--nvml-lib"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing exported");
}

#[test]
fn a_wrong_nvml_lib_path_fails_at_once_even_with_wait_for_gpu() {
    // Waiting helps a driver that is not loaded yet, not a path that names nothing.
    let started = Instant::now();
    let out = Command::new(gpulse_bin())
        .args([
            "run",
            "--exporter",
            "stdout",
            "--wait-for-gpu",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ])
        .env("GPULSE_KUBELET_SOCKET", "none")
        .stdin(Stdio::null())
        .output()
        .expect("run gpulse");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it must not wait for a library path that does not exist"
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = strip_ansi(&String::from_utf8_lossy(&out.stderr));
    assert!(
        stderr.contains("/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--wait-for-gpu waits for a driver"),
        "says why it did not wait: {stderr}"
    );
    assert!(!stderr.contains("Waiting for the GPU"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing exported");
}

#[test]
fn init_failure_without_wait_for_gpu_exits_non_zero() {
    let mut sidecar = Sidecar::start(INIT_ERROR, &FAST, &[]);
    let mut child = sidecar.child.take().expect("child");
    let status = wait_exit(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let status = status.expect("gpulse exits on its own when NVML cannot be opened");
    assert_eq!(status.code(), Some(2));
    let stderr = sidecar.stderr();
    assert!(stderr.contains("driver is not loaded"), "{stderr}");
    assert!(
        stderr.contains("nvidia-smi"),
        "says what to check: {stderr}"
    );
    assert!(sidecar.metrics().is_empty(), "nothing exported");
}

/// The end (`timeUnixNano` of `hw.gpu.utilization`) of each export window the receiver refused:
/// what gpulse was retrying at the head of its queue while the backend was down.
fn refused_window_ends(requests: &[Value]) -> Vec<u64> {
    requests
        .iter()
        .filter(|r| r["signal"] == "metrics" && r["answer"] != "ok")
        .filter_map(|r| {
            let m = metric(node(r), "hw.gpu.utilization")?;
            points(m).first()?["timeUnixNano"]
                .as_str()?
                .parse::<u64>()
                .ok()
        })
        .collect()
}

/// Free loopback port for the health endpoint.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET path` on the health endpoint: the status code, or `None` when nothing answers.
fn http_get(port: u16, path: &str) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: the endpoint answers from the first read of the connection.
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `GET path` on the health endpoint until it answers `want` (panics after PATIENCE).
pub(crate) fn wait_http(port: u16, path: &str, want: u16) {
    let deadline = Instant::now() + PATIENCE;
    let mut last = None;
    while Instant::now() < deadline {
        last = http_get(port, path);
        if last == Some(want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{path} answered {last:?}, expected {want}");
}

#[test]
fn wait_for_gpu_exports_health_and_is_not_ready_until_nvml_opens() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = FAST.to_vec();
    args.extend(["--wait-for-gpu", "--health-addr", &addr]);
    let gpulse = Sidecar::start(INIT_ERROR, &args, &[]);
    wait_http(port, "/healthz", 200);
    // The first retry is 1 s after the failed start: a probe right away sees NVML down.
    let first_ready = http_get(port, "/readyz");
    let early = gpulse.wait_for("health while NVML is down", |r| {
        r.iter().any(|r| !has_device_metrics(r))
    });
    wait_http(port, "/readyz", 200);
    let requests = gpulse.wait_for("device metrics once NVML opens", |r| {
        r.iter().any(has_device_metrics)
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let first = &early[0];
    assert!(!has_device_metrics(first), "the first window had no GPU");
    let errors = node_by(first, "gpulse.nvml.errors", "error.type");
    assert!(
        errors.get("driver_not_loaded").copied().unwrap_or(0.0) >= 1.0,
        "{errors:?}"
    );
    assert!(
        first_ready == Some(503) || requests.iter().any(has_device_metrics),
        "readyz: {first_ready:?}"
    );
    assert!(stderr.contains("Waiting for the GPU"), "{stderr}");
    assert!(stderr.contains("NVML session opened"), "{stderr}");
}

#[test]
fn readyz_is_503_while_nvml_is_down() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = FAST.to_vec();
    args.extend(["--wait-for-gpu", "--health-addr", &addr]);
    // Init always fails: NVML never comes up.
    let scenario = INIT_ERROR.replace("attempts = 2", "");
    let gpulse = Sidecar::start(&scenario, &args, &[]);
    wait_http(port, "/healthz", 200);
    for _ in 0..3 {
        assert_eq!(http_get(port, "/readyz"), Some(503));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(http_get(port, "/nope"), Some(404));
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
}

#[test]
fn driver_gone_for_a_while_is_reopened_and_metrics_resume() {
    let gpulse = Sidecar::start(DRIVER_GONE, &FAST, &[]);
    // A window without samples carries gpulse's health alone; a request during the gap counts
    // the NVML failures.
    let failing = |r: &Value| {
        is_health_request(r) && node_total(r, "gpulse.nvml.errors").unwrap_or(0.0) >= 1.0
    };
    // The first request counting failures may still carry device metrics sampled before the
    // gap: "again" means device metrics sampled after it.
    let requests = gpulse.wait_for("metrics, a gap, then metrics again", |r| {
        let first = r.iter().position(has_device_metrics);
        let gap = first.and_then(|f| r[f..].iter().find(|r| failing(r)));
        gap.is_some_and(|gap| {
            let gap_at = latest_point_time(gap);
            r.iter()
                .any(|r| has_device_metrics(r) && latest_point_time(r) > gap_at)
        })
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    // The gap carried gpulse's health, with the failures by kind.
    let gap = requests
        .iter()
        .skip_while(|r| !has_device_metrics(r))
        .find(|r| failing(r))
        .expect("gap");
    assert!(metric(node(gap), "gpulse.export.queue.size").is_some());
    let errors = last_total(&requests, "gpulse.nvml.errors");
    assert!(errors >= 1.0, "NVML errors: {errors}");
    assert!(stderr.contains("NVML stopped answering"), "{stderr}");
    assert!(stderr.contains("NVML session opened"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_lost_gpu_is_failed_while_the_other_continues_and_ok_after_it_returns() {
    let gpulse = Sidecar::start(GPU_LOST, &FAST, &[]);
    let failed =
        |r: &Value| device_value(r, "hw.status", GPU1, Some(("hw.state", "failed"))) == Some(1.0);
    let requests = gpulse.wait_for("GPU 1 failed, then ok again", |r| {
        r.iter().position(failed).is_some_and(|f| {
            r[f..]
                .iter()
                .any(|r| device_value(r, "hw.status", GPU1, Some(("hw.state", "ok"))) == Some(1.0))
        })
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let lost = requests.iter().find(|r| failed(r)).expect("failed window");
    assert_eq!(
        device_value(lost, "hw.status", GPU1, Some(("hw.state", "ok"))),
        Some(0.0)
    );
    // The healthy GPU goes on, with its values, in the same request.
    assert_eq!(
        device_value(lost, "hw.status", GPU0, Some(("hw.state", "ok"))),
        Some(1.0)
    );
    assert_eq!(device_value(lost, "hw.power", GPU0, None), Some(300.0));
    let back = requests
        .iter()
        .skip_while(|r| !failed(r))
        .find(|r| device_value(r, "hw.status", GPU1, Some(("hw.state", "ok"))) == Some(1.0))
        .expect("back");
    assert_eq!(device_value(back, "hw.power", GPU1, None), Some(300.0));
    let errors = node_by(
        requests
            .iter()
            .rev()
            .find(|r| is_health_request(r))
            .expect("gpulse's health"),
        "gpulse.nvml.errors",
        "error.type",
    );
    assert!(
        errors.get("gpu_lost").copied().unwrap_or(0.0) >= 1.0,
        "{errors:?}"
    );
}

#[test]
fn a_hung_call_skips_ticks_reports_them_and_recovers() {
    let gpulse = Sidecar::start(HUNG_CALL, &FAST, &[]);
    let requests = gpulse.wait_for("stalled ticks, then samples again", |r| {
        r.iter()
            .position(|r| node_total(r, "gpulse.sample.stalled").unwrap_or(0.0) >= 5.0)
            .is_some_and(|s| r[s..].iter().any(has_device_metrics))
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    // While the call hung (2.5 s, five export intervals), health kept being exported.
    let stalled_windows = requests
        .iter()
        .skip_while(|r| !has_device_metrics(r))
        .filter(|r| !has_device_metrics(r))
        .count();
    assert!(
        stalled_windows >= 2,
        "health exports during the hang: {stalled_windows}"
    );
    let max = requests
        .iter()
        .filter_map(|r| node_total(r, "gpulse.sample.duration.max"))
        .fold(0.0, f64::max);
    assert!(max >= 2.0, "the hung pass took {max} s");
    assert!(stderr.contains("an NVML call is hanging"), "{stderr}");
    assert!(stderr.contains("skipped"), "{stderr}");
}

#[test]
fn an_unsupported_field_is_omitted_and_logged_once() {
    let gpulse = Sidecar::start(UNSUPPORTED, &FAST, &[]);
    let requests = gpulse.wait_for("five windows", |r| {
        r.iter().filter(|r| has_device_metrics(r)).count() >= 5
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    for r in requests.iter().filter(|r| has_device_metrics(r)) {
        assert_eq!(device_value(r, "hw.power", GPU0, None), Some(300.0));
        assert_eq!(
            device_value(r, "hw.power", GPU1, None),
            None,
            "unsupported is omitted, never 0 W"
        );
        assert!(device_value(
            r,
            "hw.gpu.utilization",
            GPU1,
            Some(("hw.gpu.task", "general"))
        )
        .is_some());
    }
    let mentions = stderr
        .lines()
        .filter(|l| l.contains("GPU 1 does not give") && l.contains("Power"))
        .count();
    assert_eq!(mentions, 1, "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// 3. Process churn.

#[test]
fn churn_of_hundreds_of_processes_exports_each_only_while_it_runs() {
    let gpulse = Sidecar::start(CHURN, &FAST, &[]);
    let requests = gpulse.wait_for("the waves, then only the node", |r| {
        let busy = r.iter().position(|r| resources(r) > 50);
        busy.is_some_and(|b| {
            r[b..]
                .iter()
                .filter(|r| has_device_metrics(r) && resources(r) == 1)
                .count()
                >= 3
        })
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let counts: Vec<usize> = requests.iter().map(resources).collect();
    // At most 100 processes at once; a 500 ms window can see three overlapping waves (150).
    assert!(
        counts.iter().all(|&n| n <= 1 + 150),
        "resources per request: {counts:?}"
    );
    let mut pids = std::collections::BTreeSet::new();
    for r in &requests {
        for rm in body(r)["resourceMetrics"]
            .as_array()
            .into_iter()
            .flatten()
            .skip(1)
        {
            let pid: u32 = attr_str(&rm["resource"]["attributes"], "process.pid")
                .and_then(|p| p.parse().ok())
                .expect("each workload resource has its process.pid");
            assert!((4_100_000..4_100_300).contains(&pid), "{pid}");
            pids.insert(pid);
        }
    }
    assert!(pids.len() >= 250, "{} of 300 processes seen", pids.len());
    // No errors, and the missing PIDs (invisible to gpulse, as in a sidecar) are not one
    // warning each.
    assert!(!stderr.contains(" ERROR "), "{stderr}");
    let warnings = stderr.lines().filter(|l| is_warning_about_input(l)).count();
    assert!(warnings <= 3, "{warnings} warnings: {stderr}");
}

/// A warning line other than "skipped tick(s)": a loaded test machine can deschedule gpulse
/// long enough for that one, which says nothing about the input under test.
fn is_warning_about_input(line: &str) -> bool {
    line.contains(" WARN ") && !line.contains("tick(s)")
}

// ---------------------------------------------------------------------------------------------
// 4. Bad input, through the real binary.

/// `gpulse run` with `args`/`env` that must be refused at start: (exit code, stderr).
fn refused(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(gpulse_bin());
    command
        .arg("run")
        .args(args)
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("GPULSE_KUBELET_SOCKET", "none")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
        .stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpulse");
    let status = wait_exit(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gpulse run {args:?} {env:?} kept running instead of refusing the setting");
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status.and_then(|s| s.code()), strip_ansi(&stderr))
}

fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn config_file_errors_exit_2_with_one_line_naming_file_line_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let syntax = write_config(
        dir.path(),
        "syntax.toml",
        "sample_interval = \"1s\"\nexport_interval = = 5\n",
    );
    let (code, stderr) = refused(&["--config", syntax.to_str().expect("utf-8")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    // path:line:column, as compilers write it, so editors can jump there.
    assert!(stderr.contains("syntax.toml:2:"), "{stderr}");

    let unknown = write_config(
        dir.path(),
        "unknown.toml",
        "sample_interval = \"1s\"\nsampel_rate = 5\n",
    );
    let (code, stderr) = refused(&["--config", unknown.to_str().expect("utf-8")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("sampel_rate"), "{stderr}");
    assert!(stderr.contains("unknown.toml:2:"), "{stderr}");

    let (code, stderr) = refused(&["--config", "/nonexistent/gpulse.toml"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/gpulse.toml"), "{stderr}");
}

/// Flags, environment, and the flag or variable the error message must name.
type BadSetting = (
    Vec<&'static str>,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

#[test]
fn invalid_settings_name_the_flag_or_variable() {
    let cases: Vec<BadSetting> = vec![
        (
            vec!["--sample-interval", "ten"],
            vec![],
            "--sample-interval",
        ),
        (
            vec![],
            vec![("GPULSE_SAMPLE_INTERVAL", "10 parsecs")],
            "GPULSE_SAMPLE_INTERVAL",
        ),
        (vec!["--queue-max-age", "0s"], vec![], "--queue-max-age"),
        (
            vec![],
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            vec!["--otlp-endpoint", "ftp://collector:4317"],
            vec![],
            "--otlp-endpoint",
        ),
        (
            vec![],
            vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")],
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        (
            vec![],
            vec![("OTEL_EXPORTER_OTLP_HEADERS", "authorization")],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            vec![],
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")],
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        (vec!["--health-addr", "everywhere"], vec![], "--health-addr"),
        (
            vec!["--proc-root", "/nonexistent/proc"],
            vec![],
            "--proc-root",
        ),
    ];
    for (args, env, names) in cases {
        let (code, stderr) = refused(&args, &env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains(names),
            "{args:?} {env:?} must name {names}: {stderr}"
        );
        // clap adds a "For more information, try '--help'." line to its own errors.
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
            .collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
    }
}

#[test]
fn an_empty_proc_root_and_a_missing_kubelet_socket_degrade_with_one_warning() {
    // A proc root that exists but shows no process (a sidecar without the host's PID
    // namespace): what gpulse cannot read there it must do without.
    let empty = tempfile::tempdir().expect("temp dir");
    let proc_root = empty.path().to_str().expect("utf-8").to_string();
    let gpulse = Sidecar::start(
        STEADY,
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "300ms",
            "--proc-root",
            &proc_root,
            "--kubelet-socket",
            "/nonexistent/kubelet.sock",
        ],
        // A listed GPU process the proc root cannot describe.
        &[("GPULSE_TEST_PIDS", "4100000")],
    );
    let requests = gpulse.wait_for("five windows", |r| {
        r.iter().filter(|r| has_device_metrics(r)).count() >= 5
    });
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    // Still attributed by PID, and still exported.
    assert!(
        requests.iter().any(|r| resources(r) == 2),
        "{:?}",
        requests.iter().map(resources).collect::<Vec<_>>()
    );
    // One warning about the proc root at start; missing /proc/<pid> entries after that are
    // ordinary churn (the process exited): not one warning per PID per window.
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| is_warning_about_input(l))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains(&proc_root), "{stderr}");
    assert!(!stderr.contains(" ERROR "), "{stderr}");
    let socket_notes = stderr
        .lines()
        .filter(|l| l.contains("/nonexistent/kubelet.sock"))
        .count();
    assert_eq!(socket_notes, 1, "the kubelet socket, said once: {stderr}");
}

// ---------------------------------------------------------------------------------------------
// 5. Security.

/// Socket inodes of `pid` in LISTEN state (TCP over IPv4 and IPv6).
fn listening_sockets(pid: u32) -> Vec<u64> {
    let own: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd directory of our child")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let mut listening = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... inode (field 10); 0A is LISTEN.
            if fields.get(3) == Some(&"0A") {
                if let Some(inode) = fields.get(9).and_then(|i| i.parse().ok()) {
                    if own.contains(&inode) {
                        listening.push(inode);
                    }
                }
            }
        }
    }
    listening
}

#[test]
fn no_listening_port_by_default_and_one_with_health_addr() {
    let quiet = Sidecar::start(STEADY, &FAST, &[]);
    quiet.wait_for("two windows", |r| r.len() >= 2);
    assert_eq!(listening_sockets(quiet.pid()), Vec::<u64>::new());
    let (status, stderr) = quiet.terminate();
    assert!(status.success(), "exit {status}: {stderr}");

    // The check can fail: with --health-addr there is exactly one.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = FAST.to_vec();
    args.extend(["--health-addr", &addr]);
    let served = Sidecar::start(STEADY, &args, &[]);
    wait_http(port, "/readyz", 200);
    assert_eq!(listening_sockets(served.pid()).len(), 1);
    assert_eq!(http_get(port, "/healthz"), Some(200));
    let (status, stderr) = served.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
}

#[test]
fn header_values_are_never_logged_even_at_debug() {
    const SECRET: &str = "s3cr3t-header-value-42";
    let receiver = Receiver::start(ReceiverOptions {
        fail_status: Some("invalid_argument"),
        fail_count: Some(1),
        ..ReceiverOptions::default()
    });
    for protocol in ["http/protobuf", "grpc"] {
        let endpoint = match protocol {
            "grpc" => receiver.grpc_url(),
            _ => receiver.http_base(),
        };
        let gpulse = Gpulse::start(
            STEADY,
            &[],
            &FAST,
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    format!("authorization=Bearer%20{SECRET},x-tenant=t1"),
                ),
                ("GPULSE_LOG", "debug".to_string()),
            ],
        );
        let transport = if protocol == "grpc" { "grpc" } else { "http" };
        let requests = receiver.wait_for(
            |r| {
                metrics_requests(r)
                    .iter()
                    .any(|r| r["transport"] == transport)
            },
            PATIENCE,
        );
        let (status, stderr) = gpulse.terminate();
        assert!(status.success(), "exit {status}: {stderr}");
        // The header was sent (so the check below is about a value that really was in use)...
        let sent = requests
            .iter()
            .filter(|r| r["transport"] == transport)
            .any(|r| r["headers"]["authorization"] == format!("Bearer {SECRET}"));
        assert!(
            sent,
            "the receiver never saw the authorization header over {protocol}"
        );
        // ...at debug level, through a refused request too, and it is nowhere in the log.
        assert!(
            stderr.contains("DEBUG"),
            "the log level was not debug: {stderr}"
        );
        assert!(
            !stderr.contains(SECRET),
            "{protocol}: the header value leaked into the log"
        );
    }
}

/// A real process listed as a GPU process, with secrets in its environment and command line.
fn secret_holder() -> ChildGuard {
    ChildGuard::spawn(
        Command::new("sleep")
            .arg("987654")
            .env("OTEL_SERVICE_NAME", "trainer")
            .env("OTEL_RESOURCE_ATTRIBUTES", "team=ml")
            .env("API_TOKEN", "tok-never-exported")
            .env(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=also-never-exported",
            ),
    )
    .expect("spawn sleep")
}

#[test]
fn only_the_two_otel_keys_are_read_from_environ_and_command_lines_only_on_request() {
    let holder = secret_holder();
    let pid = holder.pid().to_string();
    for include in [false, true] {
        let mut args = FAST.to_vec();
        if include {
            args.push("--include-command-line");
        }
        let gpulse = Sidecar::start(
            STEADY,
            &args,
            &[("GPULSE_TEST_PIDS", pid.as_str()), ("GPULSE_LOG", "debug")],
        );
        let requests = gpulse.wait_for("the process resource", |r| {
            r.iter().any(|r| resources(r) == 2)
        });
        let (status, stderr) = gpulse.terminate();
        assert!(status.success(), "exit {status}: {stderr}");
        let request = requests
            .iter()
            .find(|r| resources(r) == 2)
            .expect("resource");
        let attributes = &body(request)["resourceMetrics"][1]["resource"]["attributes"];
        assert_eq!(
            attr_str(attributes, "process.pid").as_deref(),
            Some(pid.as_str())
        );
        assert_eq!(
            attr_str(attributes, "service.name").as_deref(),
            Some("trainer")
        );
        assert_eq!(attr_str(attributes, "team").as_deref(), Some("ml"));
        let everything = format!("{requests:?}{stderr}");
        for secret in ["tok-never-exported", "also-never-exported"] {
            assert!(!everything.contains(secret), "{secret} leaked");
        }
        let command_line = attr_str(attributes, "process.command_line");
        if include {
            assert_eq!(command_line.as_deref(), Some("sleep 987654"));
        } else {
            assert_eq!(command_line, None);
            assert!(!everything.contains("987654"), "the command line leaked");
        }
    }
}
