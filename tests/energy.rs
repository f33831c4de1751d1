//! GPU energy and time per process over the real export paths (issue 24): `gpulse run` exporting
//! OTLP to the real receiver and serving `/metrics`, with real processes as the listed PIDs.
//! Against nvml-sim's `shared-gpus.toml` (a time-sliced GPU and a MIG GPU) and against the
//! independent NVML of tests/fixtures/other-nvml, whose power figure the simulator never sees:
//! the processes' `process.gpu.energy` never adds up to more than the device's
//! `gpulse.gpu.energy`, whose `attributed` part is exactly what the processes were charged.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::{points_where, run_against, Receiver, ReceiverOptions};
use crate::kernel::ChildGuard;
use crate::run::{attr_str, metrics_of, process_resource, value, window_requests, Gpulse};
use crate::sampling::gpulse_bin;

const SLICED_GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000001";
const MIG_GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000000";
const MIG_ALONE: &str = "MIG-5a4ed000-0001-5000-8000-000000000001";
const MIG_PAIR: &str = "MIG-5a4ed000-0002-5000-8000-000000000002";

const OTHER_GPU0: &str = "GPU-0ther000-1111-2222-3333-444444444444";
const OTHER_GI5: &str = "MIG-0ther000-aaaa-5bbb-8ccc-dddddddddd02";
/// GPU 0's power in the other library (123456 mW).
const OTHER_POWER_W: f64 = 123.456;

pub(crate) fn sleeper() -> ChildGuard {
    ChildGuard::spawn(Command::new("sleep").arg("300")).expect("spawn sleep")
}

fn process(request: &Value, pid: u32) -> &Value {
    process_resource(request, pid).unwrap_or_else(|| panic!("no resource for pid {pid}"))
}

/// A process's time on its device summed by `key` (`gpulse.gpu.time.state`, `gpulse.gpu.cause`).
fn time_by(resource: &Value, key: &str) -> Vec<(String, f64)> {
    sum_by(points_where(resource, "process.gpu.time", "", ""), key)
}

/// The points' values summed by the attribute `key`, sorted by its value.
fn sum_by(points: Vec<&Value>, key: &str) -> Vec<(String, f64)> {
    let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
    for p in points {
        let at = attr_str(&p["attributes"], key).unwrap_or_else(|| panic!("no {key}: {p}"));
        *sums.entry(at).or_default() += value(p);
    }
    sums.into_iter().collect()
}

/// A process's time on its device, by `gpulse.gpu.time.state`.
fn time_states(resource: &Value) -> Vec<(String, f64)> {
    time_by(resource, "gpulse.gpu.time.state")
}

/// A process's energy on its device: its sum over `gpulse.gpu.cause`, checked to be split
/// by the ledger's cause.
fn energy_of(resource: &Value, device: &str) -> Option<f64> {
    let points = points_where(resource, "process.gpu.energy", "hw.id", device);
    let by_cause = sum_by(points.clone(), "gpulse.gpu.cause");
    (!points.is_empty()).then(|| by_cause.iter().map(|(_, v)| v).sum())
}

/// The seconds from a process's first window to this one, as its `process.gpu.time` says.
fn held_span(resource: &Value) -> f64 {
    let point = points_where(resource, "process.gpu.time", "", "")[0];
    let nanos = |key: &str| -> f64 { point[key].as_str().expect(key).parse().expect(key) };
    (nanos("timeUnixNano") - nanos("startTimeUnixNano")) / 1e9
}

/// Item 4 of the ledger: a process's causes add up to its held time (all of the time since it
/// was first seen, as the sleepers are listed in every sample) and, summed by state, to the
/// states. Returns its time by cause.
fn causes_add_up(resource: &Value) -> Vec<(String, f64)> {
    let causes = time_by(resource, "gpulse.gpu.cause");
    let held: f64 = causes.iter().map(|(_, v)| v).sum();
    let by_state: f64 = time_states(resource).iter().map(|(_, v)| v).sum();
    assert!(close(held, by_state, 1e-9), "{causes:?}");
    let span = held_span(resource);
    assert!(
        close(held, span, 0.01),
        "causes {held} s, held {span} s: {causes:?}"
    );
    causes
}

fn cause(causes: &[(String, f64)], name: &str) -> f64 {
    causes
        .iter()
        .find(|(c, _)| c == name)
        .map_or(0.0, |(_, v)| *v)
}

/// The GPU's own energy counter (`hw.energy`, its increase since gpulse first saw it).
fn device_counter(request: &Value, uuid: &str) -> f64 {
    let node = &request["request"]["resourceMetrics"][0];
    points_where(node, "hw.energy", "hw.id", uuid)
        .first()
        .map(|p| value(p))
        .unwrap_or_else(|| panic!("no hw.energy for {uuid}"))
}

/// The device's `gpulse.gpu.energy`: (attributed, unattributed).
fn device_energy(request: &Value, uuid: &str) -> (f64, f64) {
    let node = &request["request"]["resourceMetrics"][0];
    let part = |state: &str| {
        points_where(
            node,
            "gpulse.gpu.energy",
            "gpulse.energy.attribution",
            state,
        )
        .into_iter()
        .find(|p| attr_str(&p["attributes"], "hw.id").as_deref() == Some(uuid))
        .map(value)
        .unwrap_or_else(|| panic!("no {state} gpulse.gpu.energy for {uuid}"))
    };
    (part("attributed"), part("unattributed"))
}

fn start_time(resource: &Value, name: &str) -> String {
    points_where(resource, name, "", "")[0]["startTimeUnixNano"]
        .as_str()
        .expect("a start time")
        .to_string()
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * a.abs().max(b.abs()) + 1e-9
}

/// The port `gpulse run` says it serves `/metrics` on.
pub(crate) fn metrics_port(gpulse: &Gpulse) -> u16 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
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
            std::time::Instant::now() < deadline,
            "gpulse did not say where /metrics is:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn run_exports_energy_and_time_per_process_and_the_unattributed_rest() {
    let (slice_a, slice_b, alone) = (sleeper(), sleeper(), sleeper());
    let pair = [sleeper(), sleeper()];
    let (a, b) = (slice_a.pid(), slice_b.pid());
    let receiver = Receiver::start(ReceiverOptions::default());
    let scenario = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/nvml-sim/scenarios/shared-gpus.toml"
    ))
    .expect("scenario shared-gpus.toml");
    let gpulse = Gpulse::start(
        &scenario,
        &[],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--prometheus-addr",
            "127.0.0.1:0",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
            ("SHARED_SLICE_A_PID", a.to_string()),
            ("SHARED_SLICE_B_PID", b.to_string()),
            ("SHARED_MIG_ALONE_PID", alone.pid().to_string()),
            (
                "SHARED_MIG_PAIR_PIDS",
                format!("{},{}", pair[0].pid(), pair[1].pid()),
            ),
        ],
    );
    let port = metrics_port(&gpulse);
    let requests = receiver.wait_for(|r| window_requests(r).len() >= 3, Duration::from_secs(60));
    let scrape = crate::prometheus::scrape_until(port, |body| {
        body.contains("process_gpu_energy_joules_total")
    });
    let (exit, stderr) = gpulse.terminate();
    assert!(exit.success(), "gpulse run exited with {exit}: {stderr}");
    let windows = window_requests(&requests);
    let last = windows[windows.len() - 1];

    // Time-sliced GPU: A is busy 40 %, B 20 %: A is charged twice B's energy, and the two add
    // up to what the device says it charged; the 40 % idle rest is unattributed.
    let energy = |pid| {
        energy_of(process(last, pid), SLICED_GPU)
            .unwrap_or_else(|| panic!("no process.gpu.energy for {pid}"))
    };
    let (energy_a, energy_b) = (energy(a), energy(b));
    assert!(energy_a > 0.0);
    assert!(
        close(energy_a / energy_b, 2.0, 1e-6),
        "{energy_a} / {energy_b}"
    );
    let (attributed, unattributed) = device_energy(last, SLICED_GPU);
    assert!(
        close(attributed, energy_a + energy_b, 1e-9),
        "{attributed} != {energy_a} + {energy_b}"
    );
    assert!(energy_a + energy_b <= attributed + unattributed);
    let share = unattributed / (attributed + unattributed);
    assert!((share - 0.4).abs() < 0.02, "unattributed share {share}");
    // Per GPU, what its processes were charged and the unattributed rest are the device's
    // energy counter's increase.
    for uuid in [SLICED_GPU, MIG_GPU] {
        let (attributed, unattributed) = device_energy(last, uuid);
        let counter = device_counter(last, uuid);
        assert!(
            close(attributed + unattributed, counter, 0.01),
            "{uuid}: {attributed} + {unattributed} against the counter's {counter}"
        );
    }
    // Both are busy above the threshold all the time: held time is all active, none idle. No
    // step spans: the ledger splits it into compute (the busy share) and unused, and charges the
    // energy to compute alone.
    for (pid, busy) in [(a, 0.4), (b, 0.2)] {
        let resource = process(last, pid);
        let states = time_states(resource);
        assert_eq!(states.len(), 1, "{pid}: {states:?}");
        assert_eq!(states[0].0, "active");
        assert!(states[0].1 > 1.0, "{pid}: {states:?}");
        let causes = causes_add_up(resource);
        assert_eq!(causes.len(), 2, "only compute and unused: {causes:?}");
        let held = states[0].1;
        assert!(
            close(cause(&causes, "compute"), busy * held, 0.01),
            "{causes:?}"
        );
        assert!(
            close(cause(&causes, "unused"), (1.0 - busy) * held, 0.01),
            "{causes:?}"
        );
        let energy = points_where(resource, "process.gpu.energy", "", "");
        assert_eq!(energy.len(), 1, "{energy:?}");
        assert_eq!(
            attr_str(&energy[0]["attributes"], "gpulse.gpu.cause").as_deref(),
            Some("compute")
        );
    }

    // MIG: the lone process is charged 0.6 (activity) × 0.5 (its slice) of the GPU's energy,
    // on its instance's hw.id; the pair on the other instance gets unknown time and no energy.
    let alone_resource = process(last, alone.pid());
    let alone_energy =
        energy_of(alone_resource, MIG_ALONE).expect("the lone process's energy on its instance");
    let alone_causes = causes_add_up(alone_resource);
    let alone_held = alone_causes.iter().map(|(_, v)| v).sum::<f64>();
    assert!(
        close(cause(&alone_causes, "compute"), 0.6 * alone_held, 0.01),
        "{alone_causes:?}"
    );
    let (mig_attributed, mig_unattributed) = device_energy(last, MIG_GPU);
    assert!(close(mig_attributed, alone_energy, 1e-9));
    let alone_share = alone_energy / (mig_attributed + mig_unattributed);
    assert!((alone_share - 0.3).abs() < 0.02, "{alone_share}");
    for child in &pair {
        let resource = process(last, child.pid());
        assert!(
            points_where(resource, "process.gpu.energy", "", "").is_empty(),
            "no invented split: {resource}"
        );
        let states = time_states(resource);
        assert_eq!(states.len(), 1, "{states:?}");
        assert_eq!(states[0].0, "unknown");
        assert!(states[0].1 > 1.0);
        let causes = causes_add_up(resource);
        assert_eq!(causes, [("unknown".to_string(), states[0].1)]);
        assert_eq!(
            attr_str(
                &points_where(resource, "process.gpu.time", "", "")[0]["attributes"],
                "hw.id"
            )
            .as_deref(),
            Some(MIG_PAIR)
        );
    }

    // Cumulative sums from a fixed start: growing window after window.
    let mut previous = 0.0;
    for w in &windows[1..] {
        let resource = process(w, a);
        let joules = energy_of(resource, SLICED_GPU).expect("energy");
        assert!(joules >= previous, "{joules} after {previous}");
        previous = joules;
        assert_eq!(
            start_time(resource, "process.gpu.energy"),
            start_time(process(last, a), "process.gpu.energy")
        );
    }
    let energy_metric = metrics_of(process(last, a))
        .into_iter()
        .find(|m| m["name"] == "process.gpu.energy")
        .expect("process.gpu.energy");
    assert_eq!(energy_metric["unit"], "J");
    assert_eq!(energy_metric["sum"]["isMonotonic"], true);
    assert_eq!(
        energy_metric["sum"]["aggregationTemporality"],
        "AGGREGATION_TEMPORALITY_CUMULATIVE"
    );

    // /metrics: Prometheus's names; within the scrape, the processes on the sliced GPU never
    // add up to more than the GPU's energy.
    let on_sliced = |name: &str| -> Vec<(String, f64)> {
        crate::prometheus::series(&scrape, name)
            .into_iter()
            .filter(|(labels, _)| labels.contains(&format!("hw_id=\"{SLICED_GPU}\"")))
            .map(|(labels, v)| (labels.to_string(), v))
            .collect()
    };
    let processes = on_sliced("process_gpu_energy_joules_total");
    assert_eq!(processes.len(), 2, "{scrape}");
    let device = on_sliced("gpulse_gpu_energy_joules_total");
    assert_eq!(device.len(), 2, "attributed and unattributed: {scrape}");
    assert!(device
        .iter()
        .any(|(l, _)| l.contains("gpulse_energy_attribution=\"unattributed\"")));
    let process_sum: f64 = processes.iter().map(|(_, v)| v).sum();
    let device_sum: f64 = device.iter().map(|(_, v)| v).sum();
    assert!(process_sum > 0.0 && process_sum <= device_sum, "{scrape}");
    // Each state's time split by cause: the two processes' active compute and active unused time.
    let time = on_sliced("process_gpu_time_seconds_total");
    assert_eq!(time.len(), 4, "{scrape}");
    for cause in ["compute", "unused"] {
        let active: Vec<f64> = time
            .iter()
            .filter(|(l, _)| {
                l.contains("gpulse_gpu_time_state=\"active\"")
                    && l.contains(&format!("gpulse_gpu_cause=\"{cause}\""))
            })
            .map(|(_, v)| *v)
            .collect();
        assert!(
            active.len() == 2 && active.iter().all(|v| *v > 0.0),
            "{cause}: {scrape}"
        );
    }
    assert!(
        scrape.contains("# TYPE process_gpu_energy_joules_total counter"),
        "{scrape}"
    );
}

#[test]
fn another_nvmls_power_is_split_by_instance_activity_and_never_over_the_device() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = crate::other_nvml::build_library(dir.path());
    // The library's rule: GPU 0's process i runs in instance i % 2. So `shared` and `shared_too`
    // are two on GI 3 (2g.12gb), and `alone` is alone on GI 5 (1g.6gb: 6 of 24 GiB, 9 % busy).
    let (shared, alone, shared_too) = (sleeper(), sleeper(), sleeper());
    let pids = format!(
        "{}:1073741824,{}:1073741824,{}:1073741824",
        shared.pid(),
        alone.pid(),
        shared_too.pid()
    );
    let (requests, _) = run_against(&lib, &pids, 3, Duration::from_secs(60));
    let windows = window_requests(&requests);
    let last = windows[windows.len() - 1];

    // The library has no energy counter: the GPU's energy is its power × the time accounted,
    // from the account's start to this window's end.
    let (attributed, unattributed) = device_energy(last, OTHER_GPU0);
    let node = &last["request"]["resourceMetrics"][0];
    let point = points_where(node, "gpulse.gpu.energy", "hw.id", OTHER_GPU0)[0];
    let nanos = |key: &str| -> f64 { point[key].as_str().expect(key).parse().expect(key) };
    let seconds = (nanos("timeUnixNano") - nanos("startTimeUnixNano")) / 1e9;
    let total = attributed + unattributed;
    assert!(
        close(total, OTHER_POWER_W * seconds, 1e-6),
        "{total} J over {seconds} s"
    );

    // Alone on GI 5: charged its instance's 9 % graphics activity × its 0.25 slice; 9 % is over
    // the 5 % threshold, so its held time is active.
    let alone_resource = process(last, alone.pid());
    let alone_energy =
        energy_of(alone_resource, OTHER_GI5).expect("the lone process's energy on GI 5");
    assert!(
        close(alone_energy, total * 0.09 * 0.25, 1e-6),
        "{alone_energy} of {total}: {alone_resource}"
    );
    assert!(close(attributed, alone_energy, 1e-9), "only it is charged");
    let states = time_states(alone_resource);
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0].0, "active");
    assert!(
        close(states[0].1, seconds, 1e-6),
        "{states:?} over {seconds} s"
    );
    let causes = causes_add_up(alone_resource);
    assert!(
        close(cause(&causes, "compute"), 0.09 * seconds, 0.01),
        "{causes:?}"
    );
    assert!(
        close(cause(&causes, "unused"), 0.91 * seconds, 0.01),
        "{causes:?}"
    );

    // Two on GI 3: NVML cannot tell their split, so neither is charged; their held time is
    // unknown time, and the sum of every process stays below the device's.
    for pid in [shared.pid(), shared_too.pid()] {
        let resource = process(last, pid);
        assert!(
            points_where(resource, "process.gpu.energy", "", "").is_empty(),
            "{pid}: {resource}"
        );
        let states = time_states(resource);
        assert_eq!(states.len(), 1, "{states:?}");
        assert_eq!(states[0].0, "unknown");
        assert!(
            close(states[0].1, seconds, 1e-6),
            "{states:?} over {seconds} s"
        );
    }
    let sum: f64 = last["request"]["resourceMetrics"]
        .as_array()
        .expect("resources")
        .iter()
        .skip(1)
        .flat_map(|r| points_where(r, "process.gpu.energy", "", ""))
        .map(value)
        .sum();
    assert!(
        close(sum, alone_energy, 1e-9) && sum <= total,
        "{sum} of {total}"
    );
}

/// `sleep` with `SLURM_JOB_ID` in its environment, once it has exec'd (its environ is then its
/// own, not the test's).
pub(crate) fn slurm_sleeper(job: &str) -> ChildGuard {
    let child = ChildGuard::spawn(Command::new("sleep").arg("300").env("SLURM_JOB_ID", job))
        .expect("spawn sleep");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read(format!("/proc/{}/environ", child.pid()))
        .map(|e| e.windows(12).any(|w| w == b"SLURM_JOB_ID"))
        .unwrap_or(false)
    {
        assert!(std::time::Instant::now() < deadline, "sleep never exec'd");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn snapshot_window_rolls_the_time_sliced_job_up_with_its_cost() {
    let (a, b) = (slurm_sleeper("7001"), slurm_sleeper("7001"));
    let (alone, pair) = (sleeper(), [sleeper(), sleeper()]);
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("scenario.toml");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/nvml-sim/scenarios/shared-gpus.toml"
        ),
        &scenario,
    )
    .expect("copy scenario");
    let run = |format: &str| {
        let out = Command::new(gpulse_bin())
            .args(["snapshot", "--window", "1s", "--format", format])
            .args(["--cost-per-gpu-hour", "3.6", "--nvml-lib"])
            .arg(crate::sampling::sim_lib())
            .env("NVML_SIM_SCENARIO", &scenario)
            .env("GPULSE_KUBELET_SOCKET", "none")
            .env("SHARED_SLICE_A_PID", a.pid().to_string())
            .env("SHARED_SLICE_B_PID", b.pid().to_string())
            .env("SHARED_MIG_ALONE_PID", alone.pid().to_string())
            .env(
                "SHARED_MIG_PAIR_PIDS",
                format!("{},{}", pair[0].pid(), pair[1].pid()),
            )
            .output()
            .expect("run gpulse snapshot");
        assert!(
            out.status.success(),
            "gpulse snapshot failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    };

    let json: Value = serde_json::from_str(&run("json")).expect("snapshot JSON");
    let held = |pid: u32| {
        json["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .and_then(|p| p["accounting"]["held_seconds"].as_f64())
            .unwrap_or_else(|| panic!("no held time for {pid}: {json:#}"))
    };
    let job = json["accounting"]["rollups"]
        .as_array()
        .expect("rollups")
        .iter()
        .find(|r| r["kind"] == "job" && r["id"] == "slurm-7001")
        .unwrap_or_else(|| panic!("no job slurm-7001: {json:#}"));
    assert_eq!(job["processes"], 2);
    let hours = job["gpu_hours"].as_f64().expect("GPU-hours");
    let held_seconds = held(a.pid()) + held(b.pid());
    assert!(held_seconds > 0.5, "about a second each: {held_seconds}");
    assert!(close(hours, held_seconds / 3600.0, 1e-9), "{job}");
    assert!(close(
        job["cost"].as_f64().expect("cost"),
        hours * 3.6,
        1e-9
    ));
    assert_eq!(job["idle_share"], 0.0, "both are busy: {job}");
    assert!(job["energy_kwh"].as_f64().expect("kWh") > 0.0);
    // The ledger's roll-up of the same job: the same GPU-hours by cause. No step spans: A busy
    // 40 % and B 20 % of the same time make 30 % compute and 70 % unused, all the energy compute.
    let causes = json["accounting"]["cause_rollups"]
        .as_array()
        .expect("cause_rollups")
        .iter()
        .find(|r| r["kind"] == "job" && r["id"] == "slurm-7001")
        .unwrap_or_else(|| panic!("no causes for slurm-7001: {json:#}"));
    assert!(
        close(causes["gpu_hours"].as_f64().unwrap(), hours, 1e-9),
        "{causes}"
    );
    let share = |cause: &str| {
        causes["causes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["cause"] == cause)
            .unwrap_or_else(|| panic!("no {cause}: {causes}"))
    };
    let busy = |pid: u32| {
        json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .and_then(|p| p["accounting"]["activity"].as_f64())
            .unwrap_or_else(|| panic!("no activity for {pid}: {json:#}"))
    };
    let compute = (busy(a.pid()) * held(a.pid()) + busy(b.pid()) * held(b.pid())) / held_seconds;
    assert!(compute > 0.05, "{json:#}");
    let compute_share = share("compute")["share"].as_f64().unwrap();
    assert!(close(compute_share, compute, 1e-6), "{compute}: {causes}");
    let unused_share = share("unused")["share"].as_f64().unwrap();
    assert!(close(unused_share, 1.0 - compute, 1e-6), "{causes}");
    assert_eq!(share("unused")["energy_kwh"], 0.0, "{causes}");
    assert!(close(
        share("compute")["cost"].as_f64().unwrap() + share("unused")["cost"].as_f64().unwrap(),
        hours * 3.6,
        1e-9
    ));
    let process_causes = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == a.pid())
        .map(|p| &p["causes"])
        .expect("the process's causes");
    let held_by_cause: f64 = process_causes["total"]
        .as_array()
        .expect("total")
        .iter()
        .map(|c| c["seconds"].as_f64().unwrap())
        .sum();
    assert!(
        close(held_by_cause, held(a.pid()), 1e-9),
        "{process_causes}"
    );

    let table = run("table");
    let line = table
        .lines()
        .find(|l| l.starts_with("job ") && l.contains(" slurm-7001 "))
        .unwrap_or_else(|| panic!("no job line in the table:\n{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    // KIND ID NAME PROCS GPU-HOURS KWH IDLE COST
    assert_eq!(cells.len(), 8, "{line}");
    assert_eq!((cells[3], cells[6]), ("2", "0%"), "{line}");
    let cost: f64 = cells[7].parse().expect("a cost");
    let table_hours: f64 = cells[4].parse().expect("GPU-hours");
    assert!((cost - table_hours * 3.6).abs() < 1e-3, "{line}");
    assert!(table.contains("Roll-ups over the"), "{table}");
    let (_, by_cause) = table
        .split_once("Where the GPU-hours went")
        .unwrap_or_else(|| panic!("no causes in the table:\n{table}"));
    let line = by_cause
        .lines()
        .find(|l| l.starts_with("job ") && l.contains(" slurm-7001 "))
        .unwrap_or_else(|| panic!("no job line by cause:\n{table}"));
    // KIND ID COMPUTE INPUT COLL STRAG HOST UNUSED UNKN
    let cells: Vec<&str> = line.split_whitespace().collect();
    let pct = |share: f64| format!("{:.0}%", share * 100.0);
    let (compute, unused) = (pct(compute_share), pct(unused_share));
    assert_eq!(
        cells[2..],
        [
            compute.as_str(),
            "0%",
            "0%",
            "0%",
            "0%",
            unused.as_str(),
            "0%"
        ],
        "{line}"
    );
}
