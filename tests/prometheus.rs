//! Integration tests: `gpulse run --prometheus-addr` end to end — the binary against nvml-sim,
//! GPU processes that are real processes in real cgroups, `/metrics` read over HTTP, then checked
//! by the real `promtool` and scraped by a real Prometheus that answers the queries of NVIDIA's
//! dcgm-exporter Grafana dashboard (id 12239).
//!
//! `promtool` and `prometheus` come from `scripts/backends`
//! (`${GPULSE_BACKENDS_DIR:-$HOME/.cache/gpulse/backends}/bin/`), or from `GPULSE_PROMTOOL_BIN` /
//! `GPULSE_PROMETHEUS_BIN`. Like every test that needs root and real cgroups they are `#[ignore]`d
//! for an unprivileged `cargo test`; `scripts/test` runs them as root and always under `CI=true`,
//! where a missing binary fails the run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::common::{h100_scenario, H100_UUID};
use crate::kernel::ChildGuard;
use crate::run::{Gpulse, Workloads, DOCKER_ID};

const GPU0: &str = H100_UUID;

/// Constant signals: every value on `/metrics` is known exactly. The test's real processes are
/// listed on GPU 0 through `GPULSE_TEST_PIDS`; the one in `GPULSE_EXITING_PIDS` leaves NVML's
/// list after `EXITS_AT_S` simulated seconds (the simulator's clock starts with gpulse), as an
/// exited process does.
fn scenario() -> String {
    h100_scenario(
        r#"
[device.signals]
gpu_util = 62
mem_util = 31
memory_used_mib = 30000
temperature_c = 58
power_w = 420

[device.gpm]
sm_activity = 0.7
tensor_activity = 0.25
dram_activity = 0.4

[[device.process]]
pids_env = "GPULSE_TEST_PIDS"
memory_used_mib = 10000
sm_util = 40

[[device.process]]
pids_env = "GPULSE_EXITING_PIDS"
memory_used_mib = 2000
sm_util = 10
active_until_s = 15

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-1b1b1b1b-1111-2222-3333-444444444444"
pci_bus_id = "00000000:2A:00.0"
memory_total_mib = 81559
power_limit_w = 700

[device.signals]
gpu_util = 5
temperature_c = 35
power_w = 90
"#,
    )
}

/// Generous: a debug build on a loaded 2-core machine.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// The real processes of tests/run.rs; these checks need real cgroups, so a machine without
/// them fails here instead of passing without checking (CI runs as root).
fn workloads() -> Workloads {
    Workloads::start()
}

/// `gpulse run` with `/metrics` on a port the kernel picks, and that port. `pids` stay on GPU 0,
/// `exiting` leaves it after 15 s.
fn start_gpulse(pids: &[u32], exiting: &[u32], names: &str) -> (Gpulse, u16) {
    let exiting: Vec<String> = exiting.iter().map(u32::to_string).collect();
    let mut args = SCRAPED_RUN.to_vec();
    args.extend(["--prometheus-names", names]);
    let gpulse = Gpulse::start(
        &scenario(),
        pids,
        &args,
        &[("GPULSE_EXITING_PIDS", exiting.join(","))],
    );
    let port = metrics_port(&gpulse);
    (gpulse, port)
}

/// The flags of a `gpulse run` these tests scrape: fast windows, `/metrics` on a port the
/// kernel picks, no OTLP backend.
pub(crate) const SCRAPED_RUN: [&str; 8] = [
    "--exporter",
    "stdout",
    "--sample-interval",
    "100ms",
    "--export-interval",
    "500ms",
    "--prometheus-addr",
    "127.0.0.1:0",
];

/// The port `/metrics` is on, once gpulse says it.
pub(crate) fn metrics_port(gpulse: &Gpulse) -> u16 {
    let start = Instant::now();
    loop {
        let log = gpulse.stderr_so_far();
        if let Some(port) = log
            .split("Prometheus metrics on http://127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|p| p.parse().ok())
        {
            return port;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "gpulse did not say where /metrics is:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.1 GET on loopback: status, headers (lower-cased) and body.
pub(crate) fn get(port: u16, path: &str, accept: Option<&str>) -> (u16, String, String) {
    try_get(port, path, accept).unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"))
}

fn try_get(port: u16, path: &str, accept: Option<&str>) -> std::io::Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no response head"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, head.to_ascii_lowercase(), body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// `/metrics` once it shows a window (the first appears after one export interval).
pub fn scrape_until(port: u16, ready: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let (status, _, body) = get(port, "/metrics", None);
        assert_eq!(status, 200, "{body}");
        if ready(&body) {
            return body;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "/metrics never showed what the test waits for:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sample lines of `name` (exactly that name), as (labels text, value).
pub fn series<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => r.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn metrics_carry_dcgm_names_and_each_process_container() {
    let workloads = workloads();
    let docker_pid = workloads.docker.pid();
    let pids = workloads.pids();
    let (staying, exiting) = (&pids[..1], &pids[1..2]);
    let exiting_label = format!("process_pid=\"{}\"", exiting[0]);
    let (gpulse, port) = start_gpulse(staying, exiting, "dcgm");
    let text = scrape_until(port, |t| t.contains(&exiting_label));

    let util = series(&text, "DCGM_FI_DEV_GPU_UTIL");
    let gpu0: Vec<_> = util
        .iter()
        .filter(|(l, _)| l.starts_with(&format!("gpu=\"0\",UUID=\"{GPU0}\"")))
        .collect();
    assert_eq!(gpu0.len(), 1, "{util:?}");
    assert_eq!(gpu0[0].1, 62.0, "the simulated utilisation, in %");
    for (name, gpu0_value) in [
        ("DCGM_FI_DEV_FB_USED", 30000.0),
        ("DCGM_FI_DEV_GPU_TEMP", 58.0),
        ("DCGM_FI_DEV_POWER_USAGE", 420.0),
    ] {
        let s = series(&text, name);
        let v = s
            .iter()
            .find(|(l, _)| l.contains(&format!("UUID=\"{GPU0}\"")))
            .unwrap_or_else(|| panic!("{name} for GPU 0 in:\n{text}"));
        assert_eq!(v.1, gpu0_value, "{name}");
    }
    for label in [
        "device=\"nvidia0\"",
        "modelName=\"NVIDIA H100 80GB HBM3\"",
        "Hostname=\"",
    ] {
        assert!(gpu0[0].0.contains(label), "{label} in {}", gpu0[0].0);
    }

    // Per-process series: the process in the Docker cgroup carries its container id.
    let process = series(&text, "process_gpu_memory_usage_bytes");
    let docker = process
        .iter()
        .find(|(l, _)| l.contains(&format!("process_pid=\"{docker_pid}\"")))
        .unwrap_or_else(|| panic!("no series of PID {docker_pid} in:\n{text}"));
    assert!(
        docker.0.contains(&format!("container_id=\"{DOCKER_ID}\"")),
        "{}",
        docker.0
    );
    assert!(
        docker.0.contains("service_name=\"trainer-in-docker\""),
        "{}",
        docker.0
    );
    assert_eq!(docker.1, 10000.0 * 1024.0 * 1024.0);
    // The OTLP names are there too, as Prometheus's OTLP translation spells them: every family
    // is in docs/prometheus.md's table (held to that translation by tests/deploy).
    assert!(!series(&text, "hw_gpu_utilization_ratio").is_empty());
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus.md"))
        .expect("docs/prometheus.md");
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = family.split_whitespace().next().unwrap_or("");
        if name.starts_with("DCGM_FI_") || name.starts_with("gpulse_prometheus_") {
            continue;
        }
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "{name} is not in docs/prometheus.md"
        );
    }

    // OpenMetrics when asked for, as Prometheus asks.
    let (status, head, om) = get(
        port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(om.ends_with("# EOF\n"));
    let (status, _, body) = get(port, "/nope", None);
    assert_eq!(status, 404);
    assert!(body.contains("/metrics"), "{body}");

    // The series of a process that left NVML's list vanish with the next window; the others stay.
    let after = scrape_until(port, |t| !t.contains(&exiting_label));
    assert!(
        after.contains(&format!("process_pid=\"{docker_pid}\"")),
        "{after}"
    );
    assert!(after.contains("DCGM_FI_DEV_GPU_UTIL{"), "{after}");
    let (status, log) = gpulse.terminate();
    assert!(status.success(), "{log}");
}

/// A binary of `scripts/backends`, or the one an environment variable names.
pub(crate) fn backend(name: &str, var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let dir = std::env::var_os("GPULSE_BACKENDS_DIR").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gpulse/backends"),
        PathBuf::from,
    );
    let path = dir.join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with scripts/backends, or point {var} at one",
        path.display()
    );
    path
}

fn promtool_check(promtool: &PathBuf, text: &str) -> (i32, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), said)
}

#[test]
#[ignore = "needs promtool from scripts/backends (or GPULSE_PROMTOOL_BIN); scripts/test runs it"]
fn promtool_finds_the_exposition_clean() {
    let promtool = backend("promtool", "GPULSE_PROMTOOL_BIN");
    let workloads = workloads();

    let (gpulse, port) = start_gpulse(&workloads.pids(), &[], "otel");
    let text = scrape_until(port, |t| t.contains("process_gpu_memory_usage_bytes{"));
    let (code, said) = promtool_check(&promtool, &text);
    assert_eq!(code, 0, "promtool check metrics:\n{said}\non:\n{text}");
    drop(gpulse);

    // dcgm-exporter's own label names (UUID, modelName, Hostname) are camelCase, and its
    // counters carry no `_total` (and one is named `…_REPLAY_COUNTER`), which promtool's
    // lint flags (exit 3) on dcgm-exporter as well; they must stay for its dashboards and alerts to work. Everything else must be
    // clean, and the text must parse.
    let (gpulse, port) = start_gpulse(&workloads.pids(), &[], "dcgm");
    let text = scrape_until(port, |t| t.contains("process_gpu_memory_usage_bytes{"));
    let (code, said) = promtool_check(&promtool, &text);
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        .filter(|l| !l.ends_with("counter metrics should have \"_total\" suffix"))
        .filter(|l| !l.ends_with("metric name should not include type 'counter'"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        code == 0 || code == 3,
        "promtool could not parse it ({code}):\n{said}"
    );
    assert!(problems.is_empty(), "promtool check metrics:\n{said}");
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.starts_with("DCGM_FI_"), "only dcgm names: {line}");
    }
    drop(gpulse);
}

/// A real Prometheus in `dir` scraping `/metrics` on `port` every second, evaluating the rule
/// file `rules` (when given) every second; its log is `dir/prometheus.log`. Returns it and its
/// web port.
pub(crate) fn start_prometheus(
    bin: &Path,
    dir: &Path,
    port: u16,
    rules: Option<&Path>,
) -> (ChildGuard, u16) {
    let rule_files = rules.map_or(String::new(), |r| {
        format!(
            "  evaluation_interval: 1s\nrule_files:\n  - {}\n",
            r.display()
        )
    });
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n{rule_files}scrape_configs:\n  - job_name: gpulse\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let web = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let prometheus = ChildGuard::spawn(
        Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log),
    )
    .expect("start prometheus");
    (prometheus, web)
}

/// A PromQL instant query: the result vector, or `None` while Prometheus is not answering yet.
pub(crate) fn query(port: u16, promql: &str) -> Option<Vec<Value>> {
    let path = format!(
        "/api/v1/query?query={}",
        utf8_percent_encode(promql, NON_ALPHANUMERIC)
    );
    let (status, _, body) = try_get(port, &path, None).ok()?;
    if status == 503 {
        return None; // still starting
    }
    assert_eq!(status, 200, "{promql}: {body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["status"], "success", "{promql}: {body}");
    Some(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
#[ignore = "needs prometheus from scripts/backends (or GPULSE_PROMETHEUS_BIN); scripts/test runs it"]
fn prometheus_answers_the_dcgm_dashboard_queries() {
    let prometheus_bin = backend("prometheus", "GPULSE_PROMETHEUS_BIN");
    let workloads = workloads();
    let (gpulse, port) = start_gpulse(&workloads.pids(), &[], "dcgm");
    scrape_until(port, |t| t.contains("DCGM_FI_DEV_GPU_UTIL{"));

    let dir = tempfile::tempdir().expect("temp dir");
    let (_prometheus, web) = start_prometheus(&prometheus_bin, dir.path(), port, None);

    let instance = format!("127.0.0.1:{port}");
    // The panels of dashboard 12239, with its $instance and $gpu variables set.
    let sel = format!("instance=\"{instance}\", gpu=\"0\"");
    let panels = [
        (format!("DCGM_FI_DEV_GPU_TEMP{{{sel}}}"), 58.0),
        (format!("avg(DCGM_FI_DEV_GPU_TEMP{{{sel}}})"), 58.0),
        (format!("DCGM_FI_DEV_POWER_USAGE{{{sel}}}"), 420.0),
        (format!("sum(DCGM_FI_DEV_POWER_USAGE{{{sel}}})"), 420.0),
        (format!("DCGM_FI_DEV_SM_CLOCK{{{sel}}} * 1000000"), f64::NAN),
        (format!("DCGM_FI_DEV_GPU_UTIL{{{sel}}}"), 62.0),
        (format!("DCGM_FI_DEV_FB_USED{{{sel}}}"), 30000.0),
    ];
    let start = Instant::now();
    let mut pending: Vec<(String, f64)> = panels.to_vec();
    while !pending.is_empty() {
        pending.retain(|(promql, want)| {
            let Some(result) = query(web, promql) else {
                return true;
            };
            let Some(first) = result.first() else {
                return true;
            };
            let got: f64 = first["value"][1].as_str().unwrap_or("NaN").parse().unwrap();
            if !want.is_nan() {
                assert_eq!(got, *want, "{promql}");
            } else {
                assert!(got > 0.0, "{promql}: {got}");
            }
            false
        });
        assert!(
            start.elapsed() < DEADLINE,
            "Prometheus never answered {pending:?}; its log:\n{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The $gpu variable's values (label_values(gpu)) come from the same series.
    let gpus = query(web, "count by (gpu) (DCGM_FI_DEV_GPU_UTIL)").expect("answering");
    let mut gpus: Vec<&str> = gpus
        .iter()
        .filter_map(|r| r["metric"]["gpu"].as_str())
        .collect();
    gpus.sort_unstable();
    assert_eq!(gpus, ["0", "1"]);
    // The tensor-core panel: GPM's tensor activity of GPU 0, as a 0–1 ratio.
    let tensor =
        query(web, &format!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{sel}}}")).expect("answering");
    assert_eq!(tensor.len(), 1, "{tensor:?}");
    let value: f64 = tensor[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!((value - 0.25).abs() < 1e-6, "{tensor:?}");
    // Per-process series reach Prometheus with their container.
    let per_process = query(
        web,
        &format!("process_gpu_memory_usage_bytes{{container_id=\"{DOCKER_ID}\"}}"),
    )
    .expect("answering");
    assert_eq!(per_process.len(), 1, "{per_process:?}");
    drop(gpulse);
}
