//! Shared GPUs (issue 24) end to end: `gpulse run` against nvml-sim's `shared-gpus.toml`, real
//! processes as the listed PIDs, `/status` read as a platform team's tool would. A time-sliced
//! GPU's energy is split by the processes' busy time with the idle rest left unattributed; a
//! process alone on its MIG instance takes the instance's activity; two on one instance get no
//! invented split; processes roll up by the job id in their environment, with a cost.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::framework::{free_port, http};
use crate::kernel::ChildGuard;
use crate::run::Gpulse;

const SLICED_GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000001";
const MIG_GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000000";
const MIG_ALONE: &str = "MIG-5a4ed000-0001-5000-8000-000000000001";
const MIG_PAIR: &str = "MIG-5a4ed000-0002-5000-8000-000000000002";

fn scenario() -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios/shared-gpus.toml");
    std::fs::read_to_string(path).expect("scenario shared-gpus.toml")
}

fn sleeper(env: &[(&str, &str)]) -> ChildGuard {
    let mut command = Command::new("sleep");
    command.arg("300");
    for (key, value) in env {
        command.env(key, value);
    }
    ChildGuard::spawn(&mut command).expect("spawn sleep")
}

fn account(status: &Value, pid: u32) -> &Value {
    status["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .map(|p| &p["accounting"])
        .unwrap_or_else(|| panic!("pid {pid} not in /status: {status}"))
}

fn number(value: &Value, what: &str) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

#[test]
fn run_accounts_time_sliced_and_mig_processes_and_rolls_them_up_by_job() {
    // The two time-sliced processes are one SLURM job; the MIG ones are in none.
    let slice_a = sleeper(&[("SLURM_JOB_ID", "7001")]);
    let slice_b = sleeper(&[("SLURM_JOB_ID", "7001")]);
    let alone = sleeper(&[]);
    let pair = [sleeper(&[]), sleeper(&[])];
    let (a, b) = (slice_a.pid(), slice_b.pid());
    // `sleep` may not have exec'd yet: wait until its environment is its own.
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in [a, b] {
        while !std::fs::read(format!("/proc/{pid}/environ"))
            .map(|e| e.windows(12).any(|w| w == b"SLURM_JOB_ID"))
            .unwrap_or(false)
        {
            assert!(Instant::now() < deadline, "sleep {pid} never exec'd");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let health = free_port();
    let gpulse = Gpulse::start(
        &scenario(),
        &[],
        &[
            "--exporter",
            "stdout",
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--health-addr",
            &format!("127.0.0.1:{health}"),
            "--cost-per-gpu-hour",
            "3.6",
        ],
        &[
            ("SHARED_SLICE_A_PID", a.to_string()),
            ("SHARED_SLICE_B_PID", b.to_string()),
            ("SHARED_MIG_ALONE_PID", alone.pid().to_string()),
            (
                "SHARED_MIG_PAIR_PIDS",
                format!("{},{}", pair[0].pid(), pair[1].pid()),
            ),
        ],
    );
    // Three windows: the accounts are sums over more than one.
    let started = Instant::now();
    let status = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no third window in /status: {}",
            gpulse.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(200));
        let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", health)) else {
            continue;
        };
        drop(stream);
        let (code, body) = http(health, "GET", "/status", b"");
        if code != 200 {
            continue;
        }
        let status: Value = serde_json::from_slice(&body).expect("/status is JSON");
        let held = account(&status, a)["held_seconds"].as_f64().unwrap_or(0.0);
        if held >= 2.5 {
            break status;
        }
    };
    let (exit, stderr) = gpulse.terminate();
    assert!(exit.success(), "gpulse run exited with {exit}: {stderr}");

    // Time-sliced GPU: busy 40 % and 20 % of the time, so A gets twice B's energy, both are
    // active all the time, and the 40 % idle rest is the device's own.
    let (acct_a, acct_b) = (account(&status, a), account(&status, b));
    assert_eq!(acct_a["activity_source"], "process_utilization");
    assert!((number(&acct_a["activity"], "A's activity") - 0.4).abs() < 1e-9);
    let (energy_a, energy_b) = (
        number(&acct_a["energy_joules"], "A's energy"),
        number(&acct_b["energy_joules"], "B's energy"),
    );
    assert!(energy_a > 0.0);
    assert!(
        (energy_a / energy_b - 2.0).abs() < 1e-6,
        "{energy_a} / {energy_b}"
    );
    let held_a = number(&acct_a["held_seconds"], "A's held time");
    assert!((number(&acct_a["active_seconds"], "A's active time") - held_a).abs() < 1e-9);
    let devices = status["accounting"]["devices"].as_array().expect("devices");
    let device = |uuid: &str| {
        devices
            .iter()
            .find(|d| d["device_uuid"] == uuid)
            .unwrap_or_else(|| panic!("{uuid} not accounted: {devices:?}"))
    };
    let sliced = device(SLICED_GPU);
    let total = number(&sliced["energy_joules"], "GPU energy");
    let unattributed = number(&sliced["unattributed_joules"], "unattributed");
    assert!(energy_a + energy_b <= total * (1.0 + 1e-9));
    assert!(
        (unattributed / total - 0.4).abs() < 0.02,
        "{unattributed} of {total}"
    );
    // nvml-sim's energy counter integrates 300 W: the window energy is 300 J a second.
    assert!(
        (total / 300.0 - held_a).abs() < 0.5,
        "{total} J over {held_a} s"
    );

    // MIG: the process alone on GI 1 takes the instance's activity and half the GPU's share.
    let alone_acct = account(&status, alone.pid());
    assert_eq!(alone_acct["activity_source"], "mig_instance");
    assert_eq!(alone_acct["mig_uuid"], MIG_ALONE);
    assert!((number(&alone_acct["activity"], "instance activity") - 0.6).abs() < 1e-6);
    assert!((number(&alone_acct["gpu_share"], "share") - 0.5).abs() < 1e-9);
    let mig = device(MIG_GPU);
    let mig_total = number(&mig["energy_joules"], "MIG GPU energy");
    let alone_energy = number(&alone_acct["energy_joules"], "alone's energy");
    assert!(
        (alone_energy / mig_total - 0.3).abs() < 0.02,
        "{alone_energy} of {mig_total}"
    );
    // Two on GI 2: held time, no activity or energy of their own.
    for child in &pair {
        let shared = account(&status, child.pid());
        assert_eq!(shared["mig_uuid"], MIG_PAIR);
        assert!(shared["activity"].is_null(), "{shared}");
        assert!(shared["energy_joules"].is_null(), "{shared}");
        assert!(number(&shared["held_seconds"], "held") > 0.0);
    }
    assert!(
        (number(&mig["attributed_joules"], "attributed") - alone_energy).abs() < 1e-6,
        "only the lone process is charged: {mig}"
    );

    // The job: both sliced processes, their GPU-hours, no idle time, costed at 3.6 a GPU-hour.
    let job = status["accounting"]["rollups"]
        .as_array()
        .expect("rollups")
        .iter()
        .find(|r| r["kind"] == "job" && r["id"] == "slurm-7001")
        .unwrap_or_else(|| panic!("no job slurm-7001: {status}"));
    assert_eq!(job["processes"], 2);
    let hours = number(&job["gpu_hours"], "job GPU-hours");
    let held_b = number(&acct_b["held_seconds"], "B's held time");
    assert!((hours - (held_a + held_b) / 3600.0).abs() < 1e-9);
    assert_eq!(job["idle_share"], 0.0);
    assert!((number(&job["energy_kwh"], "kWh") - (energy_a + energy_b) / 3.6e6).abs() < 1e-12);
    assert!((number(&job["cost"], "cost") - hours * 3.6).abs() < 1e-9);
    let workload = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == a)
        .map(|p| &p["workload"])
        .unwrap();
    assert_eq!(workload["job_id"], "slurm-7001");
    assert_eq!(workload["job_id_source"], "slurm");
}
