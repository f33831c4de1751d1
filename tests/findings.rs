//! Integration tests: diagnosis end to end. `gpulse run` samples nvml-sim scenarios in which each
//! rule's condition holds for a few seconds and then ends, attributes real processes listed as the
//! GPU processes, and exports to a real OTLP receiver; the tests read what arrived: the finding's
//! log record under the right resource, its `cleared` record, the `gpulse.diagnosis.active` gauge
//! going up and back to 0, and the absence of records where a rule must stay quiet. Also
//! `gpulse check` through the binary, with its exit codes and JSON.
//!
//! Two runs cover the seven rules (device rules in `diagnosis-node.toml`, process and job rules in
//! `diagnosis-workloads.toml`); thresholds are shortened through a `[diagnosis]` config table so a
//! run takes about 15 s, and the two run in parallel.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::kernel::ChildGuard;
use crate::run::{attr, attr_str, metrics_of, metrics_requests, points, value, Gpulse};
use crate::sampling::gpulse_bin;

const SERVICE: &str = "gpulse-findings-under-test";

/// Short durations so a finding starts within seconds: 1 s windows, a 5-window history (so a
/// leak that stopped leaves the trend within 5 s), idle for 2 s, growth seen over 3 s. The input
/// rule's CPU threshold is low because CI shares 2 cores among the tests: measured at 0.17–0.30
/// cores for the spinner with five CPU-bound processes running, against 0.00 for a sleeper.
const CONFIG: &str = r#"
[diagnosis]
clear_after_windows = 2

[diagnosis.history]
max_windows = 5

[diagnosis.input_bound]
tree_cpu_cores_at_least = 0.05

[diagnosis.memory_growth]
min_duration = "3s"
min_windows = 4
min_rate_bytes_per_second = 67108864

[diagnosis.idle_holder]
min_duration = "2s"

[diagnosis.hardware_errors]
ignore_xids = [45]

[diagnosis.tensor_cores_idle]
min_duration = "2s"
"#;

/// The GPM runs' additions to [`CONFIG`]. Not in `CONFIG` itself: the two diagnosis scenarios'
/// H100s give GPM with nvml-sim's default activity of 0, so a GPU-Util of 90 % there would make
/// `low_sm_efficiency` a third finding of runs that are about other rules.
const GPM_CONFIG: &str = r#"
[diagnosis.low_sm_efficiency]
min_duration = "2s"

[diagnosis.interconnect_bound]
min_duration = "2s"
"#;

/// Every condition of both scenarios ends by 8 s; clearing takes a few windows more. Generous for
/// a loaded CI machine, where windows stretch but the order of events does not change.
const RUN_TIMEOUT: Duration = Duration::from_secs(75);

fn scenario(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("nvml-sim/scenarios")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn sleeper() -> ChildGuard {
    ChildGuard::spawn(Command::new("sleep").arg("120")).expect("spawn sleep")
}

/// `sh` waiting on a child that spins a CPU core, in a process group of its own so the spinning
/// grandchild is killed with it.
pub struct SpinningTree(pub ChildGuard);

impl SpinningTree {
    pub fn start() -> Self {
        use std::os::unix::process::CommandExt as _;
        let child = ChildGuard::spawn(
            Command::new("sh")
                .args(["-c", "(while :; do :; done) & wait"])
                .process_group(0),
        )
        .expect("spawn the spinning process tree");
        SpinningTree(child)
    }
}

impl Drop for SpinningTree {
    fn drop(&mut self) {
        if let Ok(group) = libc::pid_t::try_from(self.0.pid()) {
            // SAFETY: killpg has no memory-safety preconditions; the group is our child's.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
    }
}

/// One received log record with the resource it arrived under.
#[derive(Debug, Clone)]
struct Record {
    resource: Value,
    record: Value,
}

impl Record {
    fn attr(&self, key: &str) -> Option<String> {
        attr_str(&self.record["attributes"], key)
    }

    fn rule(&self) -> String {
        self.attr("gpulse.diagnosis.rule").unwrap_or_default()
    }

    fn state(&self) -> String {
        self.attr("gpulse.diagnosis.state").unwrap_or_default()
    }

    fn gpu_index(&self) -> Option<u32> {
        self.attr("gpu.index")?.parse().ok()
    }

    fn pid(&self) -> Option<u32> {
        self.attr("process.pid")?.parse().ok()
    }

    fn resource_attr(&self, key: &str) -> Option<String> {
        attr_str(&self.resource["attributes"], key)
    }

    /// The integers of an array attribute (`gpulse.diagnosis.pids`).
    fn int_array(&self, key: &str) -> Vec<u64> {
        attr(&self.record["attributes"], key)
            .and_then(|v| v["arrayValue"]["values"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v["intValue"].as_str()?.parse().ok())
            .collect()
    }

    fn describe(&self) -> String {
        format!(
            "{} {} gpu={:?} pid={:?} resource.pid={:?}: {}",
            self.rule(),
            self.state(),
            self.gpu_index(),
            self.pid(),
            self.resource_attr("process.pid"),
            self.record["body"]["stringValue"].as_str().unwrap_or("")
        )
    }
}

/// Every diagnosis record the receiver accepted, in arrival order.
fn records(requests: &[Value]) -> Vec<Record> {
    let mut out = Vec::new();
    for r in requests
        .iter()
        .filter(|r| r["signal"] == "logs" && r["answer"] == "ok")
    {
        for rl in r["request"]["resourceLogs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                for lr in sl["logRecords"].as_array().into_iter().flatten() {
                    let rec = Record {
                        resource: rl["resource"].clone(),
                        record: lr.clone(),
                    };
                    if rec.attr("gpulse.diagnosis.rule").is_some() {
                        out.push(rec);
                    }
                }
            }
        }
    }
    out
}

fn listing(records: &[Record]) -> String {
    records
        .iter()
        .map(Record::describe)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `gpulse.diagnosis.active{gpulse.diagnosis.rule=rule}` values, in arrival order.
fn active_gauge(requests: &[Value], rule: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for request in metrics_requests(requests) {
        for rm in request["request"]["resourceMetrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for m in metrics_of(rm) {
                if m["name"] != "gpulse.diagnosis.active" {
                    continue;
                }
                for p in points(m) {
                    if attr_str(&p["attributes"], "gpulse.diagnosis.rule").as_deref() == Some(rule)
                    {
                        out.push(value(p));
                    }
                }
            }
        }
    }
    out
}

/// The gauge was at least 1 at some point and is 0 in the last window, after it.
fn assert_gauge_up_then_down(requests: &[Value], rule: &str) {
    let values = active_gauge(requests, rule);
    let first_up = values.iter().position(|&v| v >= 1.0);
    assert!(
        first_up.is_some(),
        "gpulse.diagnosis.active{{rule={rule}}} never reached 1: {values:?}"
    );
    assert_eq!(
        values.last().copied(),
        Some(0.0),
        "gpulse.diagnosis.active{{rule={rule}}} did not drop back to 0: {values:?}"
    );
}

fn assert_gauge_stays_zero(requests: &[Value], rule: &str) {
    let values = active_gauge(requests, rule);
    assert!(
        !values.is_empty(),
        "no gpulse.diagnosis.active point for {rule}: every rule should have a series"
    );
    assert!(
        values.iter().all(|&v| v == 0.0),
        "gpulse.diagnosis.active{{rule={rule}}} should stay 0: {values:?}"
    );
}

/// Whether `records` hold a started and, after it, a cleared record matching `pred`.
fn started_then_cleared(records: &[Record], pred: impl Fn(&Record) -> bool) -> bool {
    let started = records
        .iter()
        .position(|r| pred(r) && r.state() == "started");
    let cleared = records
        .iter()
        .rposition(|r| pred(r) && r.state() == "cleared");
    matches!((started, cleared), (Some(s), Some(c)) if s < c)
}

/// A device finding is under the node resource: gpulse's own service, no process.
fn assert_node_resource(r: &Record) {
    assert_eq!(
        r.resource_attr("service.name").as_deref(),
        Some(SERVICE),
        "{}",
        r.describe()
    );
    assert_eq!(r.resource_attr("process.pid"), None, "{}", r.describe());
}

/// A process finding is under that workload's resource.
fn assert_workload_resource(r: &Record, pid: u32) {
    assert_eq!(
        r.resource_attr("process.pid"),
        Some(pid.to_string()),
        "{}",
        r.describe()
    );
    assert_eq!(r.pid(), Some(pid), "{}", r.describe());
}

/// Starts a receiver and `gpulse run` on `scenario_file` with the test config, waits until
/// `done(records)` holds, stops gpulse with SIGTERM (which flushes) and returns every request.
fn run_until(
    scenario_file: &str,
    env: &[(&str, String)],
    done: impl Fn(&[Record]) -> bool,
) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    let config = config.to_str().expect("UTF-8 temp path").to_string();
    let receiver = Receiver::start(ReceiverOptions::default());
    let mut env = env.to_vec();
    env.extend([
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_url()),
        ("OTEL_SERVICE_NAME", SERVICE.to_string()),
    ]);
    let gpulse = Gpulse::start(
        &scenario(scenario_file),
        &[],
        &[
            "--config",
            &config,
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
        ],
        &env,
    );
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !done(&records(&receiver.requests())) {
        if Instant::now() >= deadline {
            let got = records(&receiver.requests());
            let (status, stderr) = gpulse.terminate();
            panic!(
                "{scenario_file}: the expected findings did not all start and clear within \
                 {RUN_TIMEOUT:?}. Records received:\n{}\ngpulse ({status}) stderr:\n{stderr}",
                listing(&got)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    // The shutdown flush is delivered before gpulse exits; what arrived is final.
    receiver.requests()
}

#[test]
fn device_rules_fire_on_the_node_resource_and_clear() {
    let pressure = sleeper();
    let even = sleeper();
    let (pressure_pid, even_pid) = (pressure.pid(), even.pid());
    let done = |r: &[Record]| {
        started_then_cleared(r, |x| x.rule() == "throttling" && x.gpu_index() == Some(0))
            && started_then_cleared(r, |x| {
                x.rule() == "hardware_errors" && x.gpu_index() == Some(1)
            })
            && started_then_cleared(r, |x| {
                x.rule() == "memory_pressure" && x.gpu_index() == Some(2) && x.pid().is_none()
            })
            && started_then_cleared(r, |x| {
                x.rule() == "memory_pressure" && x.pid() == Some(pressure_pid)
            })
    };
    let requests = run_until(
        "diagnosis-node.toml",
        &[
            ("GPULSE_PRESSURE_PID", pressure_pid.to_string()),
            ("GPULSE_EVEN_PID", even_pid.to_string()),
        ],
        done,
    );
    let all = records(&requests);
    let list = listing(&all);

    // True positives, each under the right resource and with its facts.
    for r in all.iter().filter(|r| r.rule() == "throttling") {
        assert_eq!(r.gpu_index(), Some(0), "only GPU 0 throttles:\n{list}");
        assert_node_resource(r);
    }
    let throttled = all
        .iter()
        .find(|r| r.rule() == "throttling" && r.state() == "started")
        .expect("throttling started");
    assert_eq!(
        throttled.attr("gpulse.diagnosis.value.reasons").as_deref(),
        Some("hw_thermal_slowdown,sw_thermal_slowdown"),
        "GPU 3's sw_power_cap is not reported by default:\n{list}"
    );
    assert_eq!(
        throttled.attr("gpulse.diagnosis.severity").as_deref(),
        Some("error")
    );
    assert_eq!(throttled.record["severityText"], "ERROR");
    assert!(
        throttled
            .attr("gpulse.diagnosis.advice")
            .is_some_and(|a| a.contains("cooling")),
        "{list}"
    );

    let xid: Vec<&Record> = all
        .iter()
        .filter(|r| r.rule() == "hardware_errors")
        .collect();
    for r in &xid {
        assert_eq!(
            r.gpu_index(),
            Some(1),
            "XID 45 on GPU 3 is ignored:\n{list}"
        );
        assert_node_resource(r);
    }
    // XID 13 then 79: started as error and escalated, or critical at once when one window
    // held both. Either way the worst record is critical and names XID 79.
    let worst = xid
        .iter()
        .filter(|r| r.state() != "cleared")
        .max_by_key(|r| r.record["severityNumber"].as_u64().unwrap_or(0))
        .expect("a hardware_errors record");
    assert_eq!(
        worst.attr("gpulse.diagnosis.severity").as_deref(),
        Some("critical"),
        "{list}"
    );
    assert_eq!(worst.record["severityText"], "FATAL", "{list}");
    assert!(
        worst
            .attr("gpulse.diagnosis.value.xids")
            .is_some_and(|x| x.split(',').any(|c| c == "79")),
        "{list}"
    );
    let cleared = xid
        .iter()
        .rfind(|r| r.state() == "cleared")
        .expect("cleared");
    assert_eq!(
        cleared.record["severityText"], "INFO",
        "clearing is good news"
    );
    assert_eq!(cleared.attr("gpulse.diagnosis.advice"), None, "{list}");
    assert!(
        cleared.record["body"]["stringValue"]
            .as_str()
            .is_some_and(|b| b.starts_with("Cleared: ")),
        "{list}"
    );

    for r in all.iter().filter(|r| r.rule() == "memory_pressure") {
        match r.pid() {
            Some(pid) => {
                assert_eq!(pid, pressure_pid, "only the pressure process:\n{list}");
                assert_workload_resource(r, pressure_pid);
                assert_eq!(r.gpu_index(), Some(2));
            }
            None => {
                assert_eq!(r.gpu_index(), Some(2), "only GPU 2 is full:\n{list}");
                assert_node_resource(r);
            }
        }
    }

    // True negatives: the healthy GPU 3, the evenly busy process, the rules without a
    // condition in this scenario.
    let rules: BTreeSet<String> = all.iter().map(Record::rule).collect();
    let expected: BTreeSet<String> = ["throttling", "hardware_errors", "memory_pressure"]
        .map(String::from)
        .into();
    assert_eq!(rules, expected, "{list}");
    assert!(
        all.iter()
            .all(|r| r.gpu_index() != Some(3) && r.pid() != Some(even_pid)),
        "{list}"
    );

    for rule in ["throttling", "hardware_errors", "memory_pressure"] {
        assert_gauge_up_then_down(&requests, rule);
    }
    for rule in [
        "input_bound",
        "memory_growth",
        "idle_holder",
        "uneven_multi_gpu",
    ] {
        assert_gauge_stays_zero(&requests, rule);
    }
}

#[test]
fn process_and_job_rules_fire_on_the_workload_resource_and_clear() {
    // A real CPU-bound process tree, so input_bound reads it from /proc: the listed process
    // waits while its child spins, as a training process waits on its DataLoader workers.
    let spin = SpinningTree::start();
    let idle = sleeper();
    let small = sleeper();
    let leak = sleeper();
    let step = sleeper();
    let uneven = sleeper();
    let even = sleeper();
    let pid = |c: &ChildGuard| c.pid();
    let spin_pid = spin.0.pid();
    let (idle_pid, small_pid, leak_pid, step_pid, uneven_pid, even_pid) = (
        pid(&idle),
        pid(&small),
        pid(&leak),
        pid(&step),
        pid(&uneven),
        pid(&even),
    );
    let done = |r: &[Record]| {
        started_then_cleared(r, |x| {
            x.rule() == "input_bound" && x.pid() == Some(spin_pid)
        }) && started_then_cleared(r, |x| {
            x.rule() == "idle_holder" && x.pid() == Some(idle_pid)
        }) && started_then_cleared(r, |x| {
            x.rule() == "memory_growth" && x.pid() == Some(leak_pid)
        }) && started_then_cleared(r, |x| {
            x.rule() == "uneven_multi_gpu"
                && x.int_array("gpulse.diagnosis.pids")
                    .contains(&u64::from(uneven_pid))
        })
    };
    let requests = run_until(
        "diagnosis-workloads.toml",
        &[
            ("GPULSE_SPIN_PID", spin_pid.to_string()),
            ("GPULSE_IDLE_PID", idle_pid.to_string()),
            ("GPULSE_SMALL_PID", small_pid.to_string()),
            ("GPULSE_LEAK_PID", leak_pid.to_string()),
            ("GPULSE_STEP_PID", step_pid.to_string()),
            ("GPULSE_UNEVEN_PID", uneven_pid.to_string()),
            ("GPULSE_EVEN_PID", even_pid.to_string()),
        ],
        done,
    );
    drop(spin);
    let all = records(&requests);
    let list = listing(&all);

    // input_bound: the spinning process on the idle GPU, once; not the sleeping holder on an
    // idle GPU, and not the same spinner once its GPU got busy (it clears and stays cleared).
    let input: Vec<&Record> = all.iter().filter(|r| r.rule() == "input_bound").collect();
    let states: Vec<String> = input.iter().map(|r| r.state()).collect();
    assert_eq!(states, ["started", "cleared"], "{list}");
    for r in &input {
        assert_workload_resource(r, spin_pid);
        assert_eq!(r.gpu_index(), Some(0));
    }
    let cores = attr(
        &input[0].record["attributes"],
        "gpulse.diagnosis.value.tree_cpu_cores",
    )
    .and_then(|v| v["doubleValue"].as_f64())
    .unwrap_or(0.0);
    assert!(cores >= 0.05, "tree CPU {cores} cores:\n{list}");
    let own = attr(
        &input[0].record["attributes"],
        "gpulse.diagnosis.value.process_cpu_cores",
    )
    .and_then(|v| v["doubleValue"].as_f64())
    .unwrap_or(f64::NAN);
    assert!(
        own < cores,
        "the waiting parent ({own} cores) is not what keeps the CPU busy ({cores}):\n{list}"
    );
    assert!(
        input[0]
            .attr("gpulse.diagnosis.advice")
            .is_some_and(|a| a.contains("num_workers")),
        "{list}"
    );

    // idle_holder: the sleeping 8 GiB holder (and the spinner, idle on its GPU too); not the
    // 128 MiB probe, not the busy processes.
    let idle_pids: BTreeSet<u32> = all
        .iter()
        .filter(|r| r.rule() == "idle_holder")
        .filter_map(Record::pid)
        .collect();
    assert_eq!(idle_pids, BTreeSet::from([spin_pid, idle_pid]), "{list}");
    for r in all.iter().filter(|r| r.rule() == "idle_holder") {
        assert_workload_resource(r, r.pid().unwrap_or(0));
        assert_eq!(
            r.record["severityText"].as_str(),
            Some(if r.state() == "cleared" {
                "INFO"
            } else {
                "WARN"
            })
        );
    }

    // memory_growth: the steady leak, not the single allocator step.
    let growth: Vec<&Record> = all.iter().filter(|r| r.rule() == "memory_growth").collect();
    assert!(!growth.is_empty(), "{list}");
    for r in &growth {
        assert_workload_resource(r, leak_pid);
        assert_eq!(r.gpu_index(), Some(2));
    }

    // uneven_multi_gpu: a job record under the node resource naming the 10 % GPU 4 as the
    // least busy; never a job of the evenly busy process alone.
    let jobs: Vec<&Record> = all
        .iter()
        .filter(|r| r.rule() == "uneven_multi_gpu")
        .collect();
    for r in &jobs {
        assert_node_resource(r);
        let pids = r.int_array("gpulse.diagnosis.pids");
        assert!(pids.contains(&u64::from(uneven_pid)), "{list}");
        assert_ne!(pids, [u64::from(even_pid)], "{list}");
    }
    let job = jobs
        .iter()
        .find(|r| r.state() == "started")
        .expect("started");
    assert_eq!(
        job.attr("gpulse.diagnosis.value.least_gpu_index")
            .as_deref(),
        Some("4"),
        "{list}"
    );

    let rules: BTreeSet<String> = all.iter().map(Record::rule).collect();
    let expected: BTreeSet<String> = [
        "input_bound",
        "idle_holder",
        "memory_growth",
        "uneven_multi_gpu",
    ]
    .map(String::from)
    .into();
    assert_eq!(rules, expected, "{list}");
    assert!(
        all.iter()
            .all(|r| ![small_pid, step_pid, even_pid].contains(&r.pid().unwrap_or(0))),
        "{list}"
    );

    for rule in [
        "input_bound",
        "idle_holder",
        "memory_growth",
        "uneven_multi_gpu",
    ] {
        assert_gauge_up_then_down(&requests, rule);
    }
    for rule in ["memory_pressure", "throttling", "hardware_errors"] {
        assert_gauge_stays_zero(&requests, rule);
    }
}

/// Two healthy GPUs: every check passes.
const CHECK_HEALTHY: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
count = 2
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
memory_reserved_mib = 512

[device.signals]
gpu_util = 60
temperature_c = 50
power_w = 400
"#;

/// The same node with persistence mode off on GPU 1: a warning, nothing failing.
const CHECK_WARN: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
memory_reserved_mib = 512

[[device]]
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
memory_reserved_mib = 512
persistence = false
"#;

/// `gpulse check --format json` against `scenario`: (exit status, parsed report, stderr).
fn check_json(scenario: &str) -> (Option<i32>, Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    let out = Command::new(gpulse_bin())
        .args(["check", "--format", "json", "--nvml-lib"])
        .arg(crate::sampling::sim_lib())
        .env("NVML_SIM_SCENARIO", &path)
        .env("GPULSE_LOG", "warn")
        .env("GPULSE_KUBELET_SOCKET", "none")
        .output()
        .expect("run gpulse check");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gpulse check printed no JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code(), json, stderr)
}

fn statuses(json: &Value, status: &str) -> Vec<String> {
    json["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == status)
        .map(|c| format!("{} {}", c["device"], c["name"].as_str().unwrap_or("")))
        .collect()
}

#[test]
fn check_binary_exit_codes_and_json() {
    let (code, json, stderr) = check_json(CHECK_HEALTHY);
    assert_eq!(code, Some(0), "{json:#}\n{stderr}");
    assert_eq!(json["status"], "pass");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(
        statuses(&json, "pass").len(),
        json["checks"].as_array().map_or(0, Vec::len)
    );
    assert!(statuses(&json, "pass").len() >= 2 * 10, "{json:#}");

    let (code, json, stderr) = check_json(CHECK_WARN);
    assert_eq!(code, Some(1), "{json:#}\n{stderr}");
    assert_eq!(json["status"], "warn");
    assert_eq!(json["exit_code"], 1);
    assert_eq!(statuses(&json, "warn"), ["1 Persistence mode"], "{json:#}");
    assert!(statuses(&json, "fail").is_empty(), "{json:#}");

    // GPU 1 lost, GPU 2 hot with an uncorrectable ECC error: failures.
    let (code, json, stderr) = check_json(&scenario("diagnosis-check.toml"));
    assert_eq!(code, Some(2), "{json:#}\n{stderr}");
    assert_eq!(json["status"], "fail");
    assert_eq!(json["exit_code"], 2);
    let fails = statuses(&json, "fail");
    for expected in ["1 Device reachable", "2 Throttling", "2 ECC errors"] {
        assert!(fails.iter().any(|f| f == expected), "{expected}: {fails:?}");
    }
    let reason = json["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["device"] == 1 && c["name"] == "Device reachable")
        .and_then(|c| c["reason"].as_str())
        .unwrap_or("");
    assert!(!reason.is_empty(), "a failed check says why: {json:#}");
}

/// Runs `scenario_file` with a real sleeping process as `$GPULSE_TRAINER_PID` until `windows`
/// metrics requests arrived, and returns everything received plus the trainer's PID.
fn run_gpm_windows(scenario_file: &str, windows: usize) -> (Vec<Value>, u32) {
    let trainer = sleeper();
    let pid = trainer.pid();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(&config, format!("{CONFIG}{GPM_CONFIG}")).expect("write config");
    let config = config.to_str().expect("UTF-8 temp path").to_string();
    let receiver = Receiver::start(ReceiverOptions::default());
    let gpulse = Gpulse::start(
        &scenario(scenario_file),
        &[],
        &[
            "--config",
            &config,
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
        ],
        &[
            ("GPULSE_TRAINER_PID", pid.to_string()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_url()),
            ("OTEL_SERVICE_NAME", SERVICE.to_string()),
        ],
    );
    receiver.wait_for(|r| metrics_requests(r).len() >= windows, RUN_TIMEOUT);
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    let requests = receiver.requests();
    assert!(
        metrics_requests(&requests).len() >= windows,
        "{scenario_file}: fewer than {windows} windows arrived within {RUN_TIMEOUT:?}: {stderr}"
    );
    (requests, pid)
}

/// The newest `nvidia.gpu.pipe.activity{nvidia.gpu.pipe=tensor}` and `nvidia.gpu.sm.activity`
/// values of the node resource.
fn last_gpm(requests: &[Value]) -> (Option<f64>, Option<f64>) {
    let mut out = (None, None);
    for request in metrics_requests(requests) {
        let node = &request["request"]["resourceMetrics"][0];
        for m in metrics_of(node) {
            for p in points(m) {
                let pipe = attr_str(&p["attributes"], "nvidia.gpu.pipe");
                if m["name"] == "nvidia.gpu.sm.activity" {
                    out.1 = Some(value(p));
                } else if m["name"] == "nvidia.gpu.pipe.activity"
                    && pipe.as_deref() == Some("tensor")
                {
                    out.0 = Some(value(p));
                }
            }
        }
    }
    out
}

#[test]
fn tensor_cores_idle_fires_on_the_trainer_with_sm_0_8_and_tensor_0() {
    // min_duration is 2 s in CONFIG: 6 one-second windows leave room for it to fire.
    let (requests, pid) = run_gpm_windows("gpm-tensor-idle.toml", 6);
    let (tensor, sm) = last_gpm(&requests);
    assert_eq!(tensor, Some(0.0), "tensor activity exported as simulated");
    assert!(
        sm.is_some_and(|v| (v - 0.8).abs() < 1e-9),
        "SM activity 0.8, got {sm:?}"
    );
    let found = records(&requests);
    let hits: Vec<&Record> = found
        .iter()
        .filter(|r| r.rule() == "tensor_cores_idle" && r.state() == "started")
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "one start of tensor_cores_idle:\n{}",
        listing(&found)
    );
    assert_eq!(hits[0].pid(), Some(pid), "on the process holding the GPU");
    assert_eq!(hits[0].gpu_index(), Some(0));
}

#[test]
fn tensor_cores_idle_stays_quiet_with_tensor_activity_0_4() {
    let (requests, _) = run_gpm_windows("gpm-tensor-busy.toml", 6);
    let (tensor, sm) = last_gpm(&requests);
    assert!(
        tensor.is_some_and(|v| (v - 0.4).abs() < 1e-9),
        "tensor 0.4, got {tensor:?}"
    );
    assert!(
        sm.is_some_and(|v| (v - 0.8).abs() < 1e-9),
        "SM activity 0.8, got {sm:?}"
    );
    let found = records(&requests);
    assert!(
        !found.iter().any(|r| r.rule() == "tensor_cores_idle"),
        "no tensor_cores_idle with the tensor cores at 40 %:\n{}",
        listing(&found)
    );
}

/// The `started` records of `rule`.
fn starts<'a>(found: &'a [Record], rule: &str) -> Vec<&'a Record> {
    found
        .iter()
        .filter(|r| r.rule() == rule && r.state() == "started")
        .collect()
}

#[test]
fn low_sm_efficiency_fires_on_the_trainer_at_util_95_with_sm_0_15() {
    let (requests, pid) = run_gpm_windows("gpm-few-sms.toml", 6);
    let (_, sm) = last_gpm(&requests);
    assert!(
        sm.is_some_and(|v| (v - 0.15).abs() < 1e-9),
        "SM activity 0.15, got {sm:?}"
    );
    let found = records(&requests);
    let hits = starts(&found, "low_sm_efficiency");
    assert_eq!(
        hits.len(),
        1,
        "one start of low_sm_efficiency:\n{}",
        listing(&found)
    );
    assert_eq!(hits[0].pid(), Some(pid), "on the process holding the GPU");
    assert_eq!(hits[0].gpu_index(), Some(0));
    assert_workload_resource(hits[0], pid);
}

#[test]
fn low_sm_efficiency_stays_quiet_at_util_95_with_sm_0_6() {
    let (requests, _) = run_gpm_windows("gpm-many-sms.toml", 6);
    let (_, sm) = last_gpm(&requests);
    assert!(
        sm.is_some_and(|v| (v - 0.6).abs() < 1e-9),
        "SM activity 0.6, got {sm:?}"
    );
    let found = records(&requests);
    assert!(
        !found.iter().any(|r| r.rule() == "low_sm_efficiency"),
        "no low_sm_efficiency with 60 % of the SMs active:\n{}",
        listing(&found)
    );
}

/// The newest `nvidia.gpu.nvlink.io` value of each (GPU index, link, direction).
fn last_nvlink_io(requests: &[Value]) -> std::collections::BTreeMap<(i64, i64, String), f64> {
    let mut out = std::collections::BTreeMap::new();
    for request in metrics_requests(requests) {
        let node = &request["request"]["resourceMetrics"][0];
        for m in metrics_of(node) {
            if m["name"] != "nvidia.gpu.nvlink.io" {
                continue;
            }
            for p in points(m) {
                let int = |k: &str| {
                    attr(&p["attributes"], k)
                        .and_then(|v| v["intValue"].as_str()?.parse::<i64>().ok())
                        .unwrap_or(-1)
                };
                let direction =
                    attr_str(&p["attributes"], "network.io.direction").unwrap_or_default();
                out.insert(
                    (int("gpu.index"), int("nvidia.gpu.nvlink.link"), direction),
                    value(p),
                );
            }
        }
    }
    out
}

#[test]
fn interconnect_bound_fires_on_a_two_gpu_job_at_its_nvlink_peak_with_idle_sms() {
    let (requests, pid) = run_gpm_windows("interconnect-bound.toml", 6);
    let io = last_nvlink_io(&requests);
    assert_eq!(
        io.len(),
        2 * 4 * 2,
        "2 GPUs x 4 links x 2 directions: {io:?}"
    );
    assert!(io.values().all(|b| *b > 0.0), "{io:?}");
    let found = records(&requests);
    let hits = starts(&found, "interconnect_bound");
    assert_eq!(
        hits.len(),
        1,
        "one start of interconnect_bound for the job:\n{}",
        listing(&found)
    );
    assert_eq!(hits[0].int_array("gpulse.diagnosis.pids"), [u64::from(pid)]);
    assert_node_resource(hits[0]);
    let body = hits[0].record["body"]["stringValue"].as_str().unwrap_or("");
    assert!(body.contains("NVLink"), "{body}");
    // 4 links x 20 GiB/s each way: 160 GiB/s per GPU, the value the finding carries.
    let per_gpu = attr(
        &hits[0].record["attributes"],
        "gpulse.diagnosis.value.gpu_0_bytes_per_second",
    )
    .and_then(|v| v["doubleValue"].as_f64());
    let expected = 160.0 * 1024.0 * 1024.0 * 1024.0;
    assert!(
        per_gpu.is_some_and(|v| (v - expected).abs() / expected < 0.05),
        "GPU 0 traffic {per_gpu:?}, expected about {expected}: {}",
        hits[0].describe()
    );
    assert!(
        starts(&found, "low_sm_efficiency").is_empty(),
        "GPU-Util is 60 %:\n{}",
        listing(&found)
    );
}

#[test]
fn interconnect_bound_stays_quiet_when_the_sms_work() {
    let (requests, _) = run_gpm_windows("interconnect-compute.toml", 6);
    assert_eq!(last_nvlink_io(&requests).len(), 2 * 4 * 2);
    let found = records(&requests);
    assert!(
        !found.iter().any(|r| r.rule() == "interconnect_bound"),
        "no interconnect_bound with the SMs at 70 %:\n{}",
        listing(&found)
    );
}

/// Two ranks of a torchrun job and one process outside any job hold GPUs: `gpulse check` lists
/// the job with its ranks (from their real environments) in one passing line that says the
/// ranks were not compared, and the exit status stays 0.
#[test]
fn check_lists_the_distributed_jobs_ranks_and_says_it_does_not_compare_them() {
    let torchrun = |rank: &'static str| {
        crate::attribution::sleeper_with_env(&[
            ("TORCHELASTIC_RUN_ID", "run-7"),
            ("RANK", rank),
            ("LOCAL_RANK", rank),
            ("WORLD_SIZE", "2"),
        ])
    };
    let (rank0, rank1) = (torchrun("0"), torchrun("1"));
    let alone = sleeper();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("scenario.toml");
    let mut text = String::from("[driver]\nversion = \"550.54.15\"\ncuda_version = \"12.4\"\n");
    for i in 0..3 {
        text.push_str(&format!(
            "\n[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total_mib = 81559\n\
             memory_reserved_mib = 512\n\n[[device.process]]\npid_env = \"CHECK_PID_{i}\"\n\
             name = \"python3\"\nkind = \"compute\"\nmemory_used_mib = 1024\n"
        ));
    }
    std::fs::write(&path, text).expect("write scenario");
    let run = |format: &str| {
        Command::new(gpulse_bin())
            .args(["check", "--format", format, "--nvml-lib"])
            .arg(crate::sampling::sim_lib())
            .env("NVML_SIM_SCENARIO", &path)
            .env("CHECK_PID_0", rank1.pid().to_string())
            .env("CHECK_PID_1", alone.pid().to_string())
            .env("CHECK_PID_2", rank0.pid().to_string())
            .env("GPULSE_LOG", "warn")
            .env("GPULSE_KUBELET_SOCKET", "none")
            .output()
            .expect("run gpulse check")
    };
    let out = run("json");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(out.status.code(), Some(0), "{json:#}");
    let lines: Vec<&Value> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "Distributed training")
        .collect();
    assert_eq!(lines.len(), 1, "{json:#}");
    assert_eq!(lines[0]["status"], "pass");
    let reason = lines[0]["reason"].as_str().unwrap();
    let expected = format!(
        "n/a: job run-7 (rank 0 pid {}, rank 1 pid {}) on this node; ranks NOT compared",
        rank0.pid(),
        rank1.pid()
    );
    assert!(reason.starts_with(&expected), "{reason}");
    assert!(!reason.contains(&alone.pid().to_string()), "{reason}");
    let table = String::from_utf8_lossy(&run("table").stdout).into_owned();
    assert!(
        table.lines().any(|l| l.starts_with("PASS")
            && l.contains("Distributed training")
            && l.contains(&expected)),
        "{table}"
    );
}

/// `nccl-spin.toml`'s two ranks of one torchrun job (real processes whose environment gives
/// their job and rank) through `gpulse run`: with both GPUs spinning (busy at 85 W of 700 W,
/// SM activity 0.01) one `collective_stall` starts, on the job, cause `nccl_spin`; with the same
/// GPUs working (SM activity 0.7 at 550 W), none.
fn run_two_ranks(scenario_text: &str) -> Vec<Record> {
    let rank = |rank: &str| {
        let mut command = Command::new("sleep");
        command
            .arg("120")
            .env("TORCHELASTIC_RUN_ID", "spin-job")
            .env("RANK", rank)
            .env("WORLD_SIZE", "2");
        ChildGuard::spawn(&mut command).expect("spawn a rank")
    };
    let (rank0, rank1) = (rank("0"), rank("1"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(
        &config,
        "[diagnosis]\nclear_after_windows = 2\n\n[diagnosis.collective_stall]\nmin_duration = \"2s\"\n",
    )
    .expect("write config");
    let receiver = Receiver::start(ReceiverOptions::default());
    let gpulse = Gpulse::start(
        scenario_text,
        &[],
        &[
            "--config",
            config.to_str().expect("UTF-8 temp path"),
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
        ],
        &[
            ("GPULSE_RANK0_PID", rank0.pid().to_string()),
            ("GPULSE_RANK1_PID", rank1.pid().to_string()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_url()),
        ],
    );
    receiver.wait_for(|r| metrics_requests(r).len() >= 6, RUN_TIMEOUT);
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    let requests = receiver.requests();
    assert!(
        metrics_requests(&requests).len() >= 6,
        "six windows: {stderr}"
    );
    let found = records(&requests);
    let pids: Vec<u64> = vec![rank0.pid().into(), rank1.pid().into()];
    for r in found.iter().filter(|r| r.rule() == "collective_stall") {
        assert_eq!(
            r.int_array("gpulse.diagnosis.pids"),
            pids,
            "{}",
            r.describe()
        );
    }
    found
}

#[test]
fn collective_stall_names_a_job_whose_gpus_spin_and_not_one_whose_gpus_work() {
    let spinning = scenario("nccl-spin.toml");
    let found = run_two_ranks(&spinning);
    let stalls: Vec<&Record> = found
        .iter()
        .filter(|r| r.rule() == "collective_stall" && r.state() == "started")
        .collect();
    assert_eq!(stalls.len(), 1, "one start:\n{}", listing(&found));
    assert_eq!(
        stalls[0].attr("gpulse.diagnosis.cause").as_deref(),
        Some("nccl_spin")
    );
    assert_eq!(
        stalls[0].attr("gpulse.diagnosis.job").as_deref(),
        Some("job spin-job")
    );

    let working = spinning
        .replace("sm_activity = 0.01", "sm_activity = 0.7")
        .replace("power_w = 85", "power_w = 550");
    assert_ne!(working, spinning);
    let found = run_two_ranks(&working);
    assert!(
        !found.iter().any(|r| r.rule() == "collective_stall"),
        "a working job is no stall:\n{}",
        listing(&found)
    );
}
