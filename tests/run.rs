//! Integration tests: `gpulse run` end to end — the binary against nvml-sim, exporting to a real
//! OTLP receiver process, with GPU processes that are real processes in real cgroups and PID
//! namespaces, so the resources that arrive carry what the kernel says.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::kernel::{child_of, join_cgroup, require_cgroups, CgroupGuard, ChildGuard, KillOnDrop};
use crate::reliability::{free_port, wait_http};
use crate::sampling::{gpulse_bin, sim_lib};

pub const DOCKER_ID: &str = "d0c4e2f1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2";
const CRI_ID: &str = "c41e2f1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e";
const POD_UID: &str = "7b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d";
const GPU0: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-1b1b1b1b-1111-2222-3333-444444444444";

/// Time frozen, constant signals: every exported value is known exactly. The test's real
/// processes are listed on GPU 0 through `GPULSE_TEST_PIDS`.
const SCENARIO: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[clock]
freeze_at_s = 50

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-0a0a0a0a-1111-2222-3333-444444444444"
pci_bus_id = "00000000:18:00.0"
memory_total_mib = 81559
power_limit_w = 700
energy_start_j = 1000

[device.signals]
gpu_util = 62
mem_util = 31
memory_used_mib = 30000
temperature_c = 58
power_w = 420
pcie_tx_kbps = 4096

[[device.process]]
pids_env = "GPULSE_TEST_PIDS"
memory_used_mib = 10000
sm_util = 40
mem_util = 20

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-1b1b1b1b-1111-2222-3333-444444444444"
pci_bus_id = "00000000:2A:00.0"
memory_total_mib = 81559
power_limit_w = 700

[device.signals]
gpu_util = 5
power_w = 90
"#;

/// A running `gpulse run` against nvml-sim with `scenario`; the PIDs are listed to the scenario
/// as `GPULSE_TEST_PIDS` (use `pids_env = "GPULSE_TEST_PIDS"`). SIGKILLed on drop if a test did
/// not stop it. Other test modules start gpulse through this too.
pub struct Gpulse {
    child: Option<Child>,
    _dir: tempfile::TempDir,
    stderr: std::path::PathBuf,
}

impl Gpulse {
    pub fn start(scenario: &str, pids: &[u32], args: &[&str], env: &[(&str, String)]) -> Gpulse {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, scenario).expect("write scenario");
        let stderr = dir.path().join("stderr.log");
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let mut command = Command::new(gpulse_bin());
        command
            .arg("run")
            .args(args)
            .arg("--nvml-lib")
            .arg(sim_lib())
            .env("NVML_SIM_SCENARIO", &path)
            .env("GPULSE_TEST_PIDS", pids.join(","))
            .env("GPULSE_KUBELET_SOCKET", "none")
            .env("GPULSE_LOG", "info")
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("OTEL_RESOURCE_ATTRIBUTES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"));
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("start gpulse run");
        Gpulse {
            child: Some(child),
            _dir: dir,
            stderr,
        }
    }

    /// What gpulse has logged so far.
    pub fn stderr_so_far(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill has no memory-safety preconditions; the PID is our child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "gpulse did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        (
            status,
            std::fs::read_to_string(&self.stderr).unwrap_or_default(),
        )
    }
}

impl Drop for Gpulse {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn metrics_requests(requests: &[Value]) -> Vec<&Value> {
    requests
        .iter()
        .filter(|r| r["signal"] == "metrics" && r["answer"] == "ok")
        .collect()
}

/// The names of every metric in a request, whatever its resource.
fn metric_names(request: &Value) -> Vec<&str> {
    let body = request.get("request").unwrap_or(request);
    body["resourceMetrics"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(metrics_of)
        .filter_map(|m| m["name"].as_str())
        .collect()
}

fn is_health_metric(name: &str) -> bool {
    const HEALTH: [&str; 4] = [
        "gpulse.export.",
        "gpulse.sample.",
        "gpulse.nvml.",
        "gpulse.diagnosis.",
    ];
    HEALTH.iter().any(|h| name.starts_with(h))
}

/// Whether a request carries gpulse's own health (`src/export/telemetry`: on the node resource of each
/// export window's request, or alone when a window had no sample).
pub fn is_health_request(request: &Value) -> bool {
    metric_names(request).into_iter().any(is_health_metric)
}

/// The accepted metrics requests that carry an export window's GPU metrics (requests with
/// gpulse's own health alone left out).
pub fn window_requests(requests: &[Value]) -> Vec<&Value> {
    metrics_requests(requests)
        .into_iter()
        .filter(|r| metric_names(r).into_iter().any(|n| !is_health_metric(n)))
        .collect()
}

pub fn attr<'a>(attributes: &'a Value, key: &str) -> Option<&'a Value> {
    attributes
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)
        .map(|kv| &kv["value"])
}

pub fn attr_str(attributes: &Value, key: &str) -> Option<String> {
    let v = attr(attributes, key)?;
    v.get("stringValue")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            v.get("intValue")
                .map(|i| i.as_str().map_or(i.to_string(), str::to_string))
        })
}

/// The resource of `request` whose `process.pid` is `pid`.
pub fn process_resource(request: &Value, pid: u32) -> Option<&Value> {
    request["request"]["resourceMetrics"]
        .as_array()?
        .iter()
        .find(|rm| attr_str(&rm["resource"]["attributes"], "process.pid") == Some(pid.to_string()))
}

/// Every metric of a resource, by name.
pub fn metrics_of(resource_metrics: &Value) -> Vec<&Value> {
    resource_metrics["scopeMetrics"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|sm| sm["metrics"].as_array().into_iter().flatten())
        .collect()
}

pub fn points(metric: &Value) -> Vec<&Value> {
    let data = metric
        .get("gauge")
        .or_else(|| metric.get("sum"))
        .expect("gauge or sum");
    data["dataPoints"]
        .as_array()
        .into_iter()
        .flatten()
        .collect()
}

pub fn value(point: &Value) -> f64 {
    point
        .get("asDouble")
        .and_then(Value::as_f64)
        .or_else(|| point.get("asInt").and_then(|v| v.as_str()?.parse().ok()))
        .expect("a number")
}

/// The processes the test lists as GPU processes: one in a Docker scope (systemd driver), one in
/// a containerd pod scope (kubelet's systemd driver), both on the host's cgroup2 hierarchy
/// wherever it is mounted (pure v2 or hybrid), and one in its own PID namespace. Dropped in
/// order: children first, then their cgroups. Never skips: what is missing panics.
pub struct Workloads {
    pub docker: ChildGuard,
    pod: ChildGuard,
    namespaced_host_pid: u32,
    _namespaced: (KillOnDrop, ChildGuard),
    _cgroups: CgroupGuard,
    /// Held until the cgroups are gone: the fixed cgroup paths allow one `Workloads` at a time
    /// on the machine (tests run in parallel threads, and test binaries of other checkouts may
    /// run at the same time). Declared last, so it is released after the cgroups are removed.
    _serial: std::fs::File,
}

/// An exclusive `flock` on a well-known file: blocks until no other `Workloads` (in this process
/// or another) holds it. Released when the file is closed.
fn lock_fixed_cgroups() -> std::fs::File {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("gpulse-test-workloads-cgroups.lock"))
        .expect("open the cgroup lock file");
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    file
}

impl Workloads {
    pub fn start() -> Workloads {
        let layout = require_cgroups();
        let serial = lock_fixed_cgroups();
        let mut cgroups = CgroupGuard::default();
        let docker_dir = cgroups
            .create(
                &layout.unified,
                &format!("system.slice/docker-{DOCKER_ID}.scope"),
            )
            .expect("docker cgroup");
        let pod_slice = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CRI_ID}.scope",
            POD_UID.replace('-', "_")
        );
        let pod_dir = cgroups
            .create(&layout.unified, &pod_slice)
            .expect("pod cgroup");
        let docker = ChildGuard::spawn(
            Command::new("sleep")
                .arg("60")
                .env("OTEL_SERVICE_NAME", "trainer-in-docker")
                .env(
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.namespace=ml,deployment.environment=test",
                )
                .env("API_TOKEN", "s3cr3t-never-exported"),
        )
        .expect("spawn docker child");
        join_cgroup(&docker_dir, docker.pid()).expect("join docker cgroup");
        let pod = ChildGuard::spawn(Command::new("sleep").arg("60")).expect("spawn pod child");
        join_cgroup(&pod_dir, pod.pid()).expect("join pod cgroup");
        let unshare =
            ChildGuard::spawn(Command::new("unshare").args(["--pid", "--fork", "sleep", "60"]))
                .expect("spawn unshare");
        let inner = child_of(unshare.pid()).expect("unshare forks the namespaced child");
        Workloads {
            docker,
            pod,
            namespaced_host_pid: inner,
            _namespaced: (KillOnDrop(inner), unshare),
            _cgroups: cgroups,
            _serial: serial,
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        vec![self.docker.pid(), self.pod.pid(), self.namespaced_host_pid]
    }
}

fn end_to_end(protocol: &str) {
    let workloads = Workloads::start();
    let receiver = Receiver::start(ReceiverOptions::default());
    let endpoint = match protocol {
        "grpc" => receiver.grpc_url(),
        _ => receiver.http_base(),
    };
    let gpulse = Gpulse::start(
        SCENARIO,
        &workloads.pids(),
        &["--sample-interval", "100ms", "--export-interval", "1s"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_SERVICE_NAME", "gpulse-under-test".to_string()),
        ],
    );
    let started = Instant::now();
    let requests = receiver.wait_for(|r| window_requests(r).len() >= 3, Duration::from_secs(30));
    let elapsed = started.elapsed();
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    let metrics = window_requests(&requests);
    assert!(
        metrics.len() >= 3,
        "{} metrics requests: {stderr}",
        metrics.len()
    );
    // One request per interval: three 1 s intervals cannot arrive in much less than 3 s.
    assert!(
        elapsed >= Duration::from_millis(2500),
        "3 requests in {elapsed:?}: more than one per interval"
    );
    assert!(metrics
        .iter()
        .all(|r| r["transport"] == protocol_transport(protocol)));

    let request = metrics[1];
    let rms = request["request"]["resourceMetrics"]
        .as_array()
        .expect("resources");
    // The node resource, then one per GPU process.
    assert_eq!(rms.len(), 1 + 3, "{request}");
    let node = &rms[0];
    assert_eq!(
        attr_str(&node["resource"]["attributes"], "service.name").as_deref(),
        Some("gpulse-under-test")
    );
    let node_metrics = metrics_of(node);
    let utilization = node_metrics
        .iter()
        .find(|m| m["name"] == "hw.gpu.utilization")
        .expect("hw.gpu.utilization");
    assert_eq!(utilization["unit"], "1");
    let general: Vec<(String, f64)> = points(utilization)
        .into_iter()
        .filter(|p| attr_str(&p["attributes"], "hw.gpu.task").as_deref() == Some("general"))
        .map(|p| {
            (
                attr_str(&p["attributes"], "hw.id").expect("hw.id"),
                value(p),
            )
        })
        .collect();
    assert_eq!(
        general,
        vec![(GPU0.to_string(), 0.62), (GPU1.to_string(), 0.05)]
    );
    let power = node_metrics
        .iter()
        .find(|m| m["name"] == "hw.power")
        .expect("hw.power");
    assert_eq!(power["unit"], "W");
    assert_eq!(value(points(power)[0]), 420.0);
    let memory = node_metrics
        .iter()
        .find(|m| m["name"] == "hw.gpu.memory.usage")
        .expect("hw.gpu.memory.usage");
    assert_eq!(memory["unit"], "By");
    assert_eq!(value(points(memory)[0]), 30000.0 * 1024.0 * 1024.0);
    let energy = node_metrics
        .iter()
        .find(|m| m["name"] == "hw.energy")
        .expect("hw.energy");
    assert_eq!(energy["sum"]["isMonotonic"], true);
    assert_eq!(energy["unit"], "J");

    // Every process under its own resource, with what the kernel says about it.
    let docker =
        process_resource(request, workloads.docker.pid()).expect("docker process resource");
    let a = &docker["resource"]["attributes"];
    assert_eq!(attr_str(a, "container.id").as_deref(), Some(DOCKER_ID));
    assert_eq!(
        attr_str(a, "container.runtime.name").as_deref(),
        Some("docker")
    );
    assert_eq!(
        attr_str(a, "process.executable.name").as_deref(),
        Some("sleep")
    );
    assert_eq!(
        attr_str(a, "process.vpid"),
        Some(workloads.docker.pid().to_string())
    );
    // Adopted from the process's own environment, so it lands under the app's service.
    assert_eq!(
        attr_str(a, "service.name").as_deref(),
        Some("trainer-in-docker")
    );
    assert_eq!(attr_str(a, "service.namespace").as_deref(), Some("ml"));
    assert!(
        !request.to_string().contains("s3cr3t"),
        "an unrelated environment variable leaked"
    );
    let process_metrics = metrics_of(docker);
    let process_memory = process_metrics
        .iter()
        .find(|m| m["name"] == "process.gpu.memory.usage")
        .expect("process.gpu.memory.usage");
    assert_eq!(value(points(process_memory)[0]), 10000.0 * 1024.0 * 1024.0);
    assert_eq!(
        attr_str(&points(process_memory)[0]["attributes"], "hw.id").as_deref(),
        Some(GPU0)
    );
    // Per-process utilisation comes from NVML's sample buffer; with the scenario's clock frozen
    // only the first window gets a sample, so look for it in any window.
    let sm_values: Vec<f64> = metrics
        .iter()
        .filter_map(|r| process_resource(r, workloads.docker.pid()))
        .flat_map(metrics_of)
        .filter(|m| m["name"] == "process.gpu.utilization")
        .flat_map(points)
        .filter(|p| attr_str(&p["attributes"], "hw.gpu.task").as_deref() == Some("general"))
        .map(value)
        .collect();
    assert!(
        sm_values.contains(&0.40),
        "process SM utilisation: {sm_values:?}"
    );

    let pod = process_resource(request, workloads.pod.pid()).expect("pod process resource");
    let a = &pod["resource"]["attributes"];
    assert_eq!(attr_str(a, "container.id").as_deref(), Some(CRI_ID));
    assert_eq!(
        attr_str(a, "container.runtime.name").as_deref(),
        Some("containerd")
    );
    assert_eq!(attr_str(a, "k8s.pod.uid").as_deref(), Some(POD_UID));
    assert_eq!(
        attr_str(a, "service.name").as_deref(),
        Some("unknown_service:sleep")
    );

    let namespaced =
        process_resource(request, workloads.namespaced_host_pid).expect("namespaced resource");
    let a = &namespaced["resource"]["attributes"];
    assert_eq!(attr_str(a, "process.vpid").as_deref(), Some("1"));
    assert_eq!(
        attr_str(a, "process.pid"),
        Some(workloads.namespaced_host_pid.to_string())
    );
}

fn protocol_transport(protocol: &str) -> &'static str {
    match protocol {
        "grpc" => "grpc",
        _ => "http",
    }
}

#[test]
#[ignore = "needs root (creates cgroups and a PID namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn run_exports_each_process_under_its_own_resource_over_grpc() {
    end_to_end("grpc");
}

#[test]
#[ignore = "needs root (creates cgroups and a PID namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn run_exports_each_process_under_its_own_resource_over_http() {
    end_to_end("http/protobuf");
}

#[test]
fn sigterm_flushes_the_partial_window_and_exits_zero() {
    let receiver = Receiver::start(ReceiverOptions::default());
    let port = free_port();
    let health = format!("127.0.0.1:{port}");
    let gpulse = Gpulse::start(
        SCENARIO,
        &[],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1m",
            "--health-addr",
            &health,
        ],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
        ],
    );
    // Ready once the sampler has ticked: the window SIGTERM cuts short then holds a sample.
    wait_http(port, "/readyz", 200);
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let requests = receiver.wait_for(
        |r| {
            !window_requests(r).is_empty()
                && metrics_requests(r).iter().any(|r| is_health_request(r))
        },
        Duration::from_secs(10),
    );
    let metrics = window_requests(&requests);
    assert_eq!(
        metrics.len(),
        1,
        "the one partial window, flushed at SIGTERM"
    );
    // gpulse's own health, collected at SIGTERM into that same request (one request per
    // window), on the node resource.
    let health: Vec<&Value> = metrics_requests(&requests)
        .into_iter()
        .filter(|r| is_health_request(r))
        .collect();
    assert_eq!(health.len(), 1, "the health flushed at SIGTERM");
    assert_eq!(
        metrics_requests(&requests).len(),
        1,
        "the health rides in the window's request"
    );
    let health_names: BTreeSet<&str> = metrics_of(&health[0]["request"]["resourceMetrics"][0])
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        health_names.contains("gpulse.export.queue.size"),
        "{health_names:?}"
    );
    let names: BTreeSet<&str> = metrics_of(&metrics[0]["request"]["resourceMetrics"][0])
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(names.contains("hw.gpu.utilization"), "{names:?}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
}

#[test]
fn every_interval_of_an_outage_arrives_after_it_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let outage = dir.path().join("backend-down");
    std::fs::write(&outage, "").expect("outage flag");
    let receiver = Receiver::start(ReceiverOptions {
        fail_status: Some("unavailable"),
        fail_until_file: Some(outage.clone()),
        ..ReceiverOptions::default()
    });
    let gpulse = Gpulse::start(
        SCENARIO,
        &[],
        &["--sample-interval", "100ms", "--export-interval", "500ms"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_url()),
        ],
    );
    // The outage lasts for three refused attempts: the first export and two retries, 1 s and
    // 2 s of backoff later, so about seven intervals queue up behind them.
    receiver.wait_for(
        |r| {
            r.iter()
                .filter(|r| r["signal"] == "metrics" && r["answer"] != "ok")
                .count()
                >= 3
        },
        Duration::from_secs(60),
    );
    std::fs::remove_file(&outage).expect("end the outage");
    // Backoff is capped at 30 s with jitter; everything queued must then arrive.
    receiver.wait_for(|r| metrics_requests(r).len() >= 10, Duration::from_secs(60));
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let requests = receiver.requests();
    let metrics = metrics_requests(&requests);
    assert!(metrics.len() >= 10, "{} delivered: {stderr}", metrics.len());
    // In order, and no interval missing: each window's end is after the previous one's and
    // no gap between them is longer than about two intervals.
    // A request without device metrics is gpulse's own health for an interval with no sample
    // (the last one, cut short by SIGTERM, say): it carries no window.
    let ends: Vec<u64> = metrics
        .iter()
        .filter_map(|r| {
            let node = &r["request"]["resourceMetrics"][0];
            let utilization = metrics_of(node)
                .into_iter()
                .find(|m| m["name"] == "hw.gpu.utilization")?;
            points(utilization)[0]["timeUnixNano"]
                .as_str()
                .and_then(|s| s.parse().ok())
        })
        .collect();
    assert!(
        ends.len() >= 9,
        "{} windows delivered: {ends:?}",
        ends.len()
    );
    for pair in ends.windows(2) {
        assert!(pair[1] > pair[0], "out of order: {ends:?}");
        let gap = Duration::from_nanos(pair[1] - pair[0]);
        assert!(
            gap < Duration::from_millis(1500),
            "an interval is missing ({gap:?}): {ends:?}"
        );
    }
}

/// `.max`/`.min` companions ride only when the configuration puts two or more samples in every
/// window: at a 200 ms sample with a 200 ms export no window has them (each holds one sample,
/// whose extremes are its mean), at 200 ms / 400 ms every window does. Real processes hold GPU 0.
#[test]
fn companions_follow_the_samples_a_window_holds() {
    let workloads = [Command::new("sleep").arg("30").spawn().expect("sleep")];
    let pids: Vec<u32> = workloads.iter().map(Child::id).collect();
    let companions_per_window = |export: &str| {
        let receiver = Receiver::start(ReceiverOptions::default());
        let gpulse = Gpulse::start(
            SCENARIO,
            &pids,
            &["--sample-interval", "200ms", "--export-interval", export],
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
            ],
        );
        let requests =
            receiver.wait_for(|r| window_requests(r).len() >= 4, Duration::from_secs(30));
        let (status, stderr) = gpulse.terminate();
        assert!(status.success(), "exit {status}: {stderr}");
        let windows = window_requests(&requests);
        // The process's own gauges are among them (NVML gives its utilisation from the
        // second sample on, so not in the first window).
        assert!(
            windows
                .iter()
                .any(|r| metric_names(r).contains(&"process.gpu.utilization")),
            "no window with the process's utilisation"
        );
        windows
            .iter()
            .map(|request| {
                metric_names(request)
                    .into_iter()
                    .filter(|n| !is_health_metric(n))
                    .filter(|n| n.ends_with(".max") || n.ends_with(".min"))
                    .count()
            })
            .collect::<Vec<usize>>()
    };
    let one_sample = companions_per_window("200ms");
    assert!(one_sample.iter().all(|&n| n == 0), "{one_sample:?}");
    let two_samples = companions_per_window("400ms");
    assert!(two_samples.iter().all(|&n| n > 0), "{two_samples:?}");
    for mut workload in workloads {
        let _ = workload.kill();
        let _ = workload.wait();
    }
}

/// A metric switched off is not in the requests, and its NVML call is not made when no rule
/// needs it. nvml-sim answers `nvmlDeviceGetBAR1MemoryInfo` with an unexpected error, which
/// gpulse warns about whenever it makes the call: the control run (no switch) shows the warning
/// and `hw.temperature`; with the three BAR1 metrics and `hw.temperature` switched off, no call
/// fails and `hw.temperature` (which the throttling rule still reads) is not exported.
#[test]
fn a_switched_off_metric_is_neither_exported_nor_read() {
    let scenario = format!(
        "{SCENARIO}\n[[fault]]\nkind = \"error\"\nfield = \"bar1_memory\"\nerror = \"unknown\"\n"
    );
    let workloads = [Command::new("sleep").arg("30").spawn().expect("sleep")];
    let pids: Vec<u32> = workloads.iter().map(Child::id).collect();
    let run = |disabled: Option<&str>| -> (BTreeSet<String>, String) {
        let receiver = Receiver::start(ReceiverOptions::default());
        let mut env = vec![
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
        ];
        if let Some(names) = disabled {
            env.push(("GPULSE_METRICS_DISABLED", names.to_string()));
        }
        let gpulse = Gpulse::start(
            &scenario,
            &pids,
            &["--sample-interval", "200ms", "--export-interval", "400ms"],
            &env,
        );
        let requests =
            receiver.wait_for(|r| window_requests(r).len() >= 3, Duration::from_secs(30));
        let (status, stderr) = gpulse.terminate();
        assert!(status.success(), "exit {status}: {stderr}");
        let names = window_requests(&requests)
            .iter()
            .flat_map(|r| metric_names(r))
            .map(str::to_string)
            .collect();
        (names, stderr)
    };
    let failed_read = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter(|l| l.contains("NVML failed to read a field"))
            .map(str::to_string)
            .collect()
    };

    let (names, stderr) = run(None);
    assert!(names.contains("hw.temperature"), "{names:?}");
    assert!(names.contains("hw.temperature.max"), "{names:?}");
    let failed = failed_read(&stderr);
    assert!(
        failed.iter().any(|l| l.to_lowercase().contains("bar1")),
        "the control run should have made the failing BAR1 call: {stderr}"
    );

    let (names, stderr) = run(Some(
        "hw.temperature,nvidia.gpu.bar1.memory.usage,nvidia.gpu.bar1.memory.limit,\
         nvidia.gpu.bar1.memory.free",
    ));
    assert!(!names.contains("hw.temperature"), "{names:?}");
    assert!(!names.contains("hw.temperature.max"), "{names:?}");
    assert!(
        names.contains("hw.power"),
        "the rest is exported: {names:?}"
    );
    assert_eq!(failed_read(&stderr), Vec::<String>::new(), "{stderr}");
    for mut workload in workloads {
        let _ = workload.kill();
        let _ = workload.wait();
    }
}

/// A misspelt metric name stops the start, naming it and the nearest known names.
#[test]
fn an_unknown_metric_name_stops_the_start() {
    let receiver = Receiver::start(ReceiverOptions::default());
    let gpulse = Gpulse::start(
        SCENARIO,
        &[],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
            ("GPULSE_METRICS_DISABLED", "hw.temprature".to_string()),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !gpulse.stderr_so_far().contains("no metric named") {
        assert!(Instant::now() < deadline, "{}", gpulse.stderr_so_far());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, stderr) = gpulse.terminate();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "GPULSE_METRICS_DISABLED=\"hw.temprature\": gpulse exports no metric named \
             \"hw.temprature\"; the nearest are hw.temperature"
        ),
        "{stderr}"
    );
}
