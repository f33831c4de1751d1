//! Integration tests: `gpulse record -- CMD` with real child processes (exit statuses, signal
//! forwarding, untouched standard streams), a recording of the simulator with the command's own
//! processes on a GPU (in a PID namespace, where the command's PIDs are known in advance), the
//! run without NVML, and the HTML report rendered by a real headless Chromium whose screenshot
//! is checked pixel by pixel. `gpulse report` is checked against `gpulse run --exporter stdout`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::h100_scenario;
use crate::kernel::{require_root, ChildGuard, KillOnDrop};
use crate::sampling::{gpulse_bin, sim_lib};
use crate::terminal::Tmux;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: u64 = 1024 * 1024;

/// One GPU, constant signals, time frozen; the command's processes (PIDs 2 and 3 of a fresh PID
/// namespace) and another process (PID 4000, not in the namespace) hold memory on it.
fn scenario_text() -> String {
    h100_scenario(
        r#"
[device.signals]
gpu_util = 62
mem_util = 31
memory_used_mib = 30000
power_w = 420
clock_sm_mhz = 1755

[[device.process]]
pids_env = "RECORD_TEST_PIDS"
memory_used_mib = 10000
sm_util = 40

[[device.process]]
pid = 4000
memory_used_mib = 2000
"#,
    )
}

/// `gpulse record` against the simulator with `scenario_text()`, in `dir`.
pub fn record(dir: &Path, pids: &str, args: &[&str]) -> Command {
    let scenario = dir.join("scenario.toml");
    std::fs::write(&scenario, scenario_text()).expect("write scenario");
    let mut command = Command::new(gpulse_bin());
    command
        .arg("record")
        .arg("--nvml-lib")
        .arg(sim_lib())
        .args(args)
        .current_dir(dir)
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("RECORD_TEST_PIDS", pids)
        .env("GPULSE_KUBELET_SOCKET", "none")
        .env_remove("GPULSE_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

pub fn output(mut command: Command) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .expect("gpulse record runs")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_exit_status_is_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    for (script, code) in [("exit 0", 0), ("exit 7", 7), ("kill -KILL $$", 128 + 9)] {
        let out = output({
            let mut c = record(dir.path(), "", &["--report", "none", "--", "sh", "-c"]);
            c.arg(script);
            c
        });
        assert_eq!(
            out.status.code(),
            Some(code),
            "{script}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_command_that_cannot_start_is_named_with_the_shells_status() {
    let dir = tempfile::tempdir().unwrap();
    let out = output({
        let mut c = record(dir.path(), "", &["--report", "none", "--"]);
        c.arg("gpulse-test-no-such-command");
        c
    });
    assert_eq!(out.status.code(), Some(127));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("gpulse-test-no-such-command: command not found"),
        "{stderr}"
    );
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let out = output({
        let mut c = record(dir.path(), "", &["--report", "none", "--"]);
        c.arg(&script);
        c
    });
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot be executed"));
}

/// Standard output carries the command's bytes only, and standard input reaches it.
#[test]
fn standard_streams_pass_through_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = record(
        dir.path(),
        "",
        &[
            "--report",
            "none",
            "--",
            "sh",
            "-c",
            "read line; echo \"got $line\"; echo err >&2",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        text(&out.stdout),
        "got hello\n",
        "nothing of gpulse on stdout"
    );
    assert!(
        text(&out.stderr).starts_with("err\n"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
}

/// Waits for gpulse's exit, SIGKILLing it after `limit`.
pub fn wait(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gpulse record did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM sent to gpulse reaches the command, whose own exit status gpulse then returns; a
/// command the signal kills makes gpulse exit 128 + N.
#[test]
fn signals_sent_to_gpulse_are_forwarded_to_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = record(
        dir.path(),
        "",
        &["--report", "none", "--", "sh", "-c", script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let _guard = KillOnDrop(child.id());
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill has no memory-safety preconditions; the PID is our child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = wait(&mut child, Duration::from_secs(20));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "got TERM\n", "the command's trap ran");
    assert_eq!(status.code(), Some(42));

    let mut child = record(
        dir.path(),
        "",
        &[
            "--report",
            "none",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let _guard = KillOnDrop(child.id());
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = wait(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(128 + libc::SIGINT));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("killed by SIGINT"), "{stderr}");
}

/// Without NVML the command still runs and the summary says why there are no GPU figures.
#[test]
fn without_nvml_the_command_runs_and_the_summary_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("summary.json");
    let out = Command::new(gpulse_bin())
        .args([
            "record",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--report",
            "none",
        ])
        .arg("--json")
        .arg(&json)
        .args(["--", "sh", "-c", "echo ran; exit 3"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "ran\n");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no GPU figures:"), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    let summary: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(summary["no_gpu_reason"]
        .as_str()
        .unwrap()
        .contains("could not load"));
    assert_eq!(summary["devices"], serde_json::json!([]));
    assert!(summary["energy_wh"].is_null(), "unknown is null, never 0");
    assert!(summary["idle_ratio"].is_null());
    assert_eq!(summary["exit_code"], 3);
}

/// A bad output path fails before the command starts, not after a long run.
#[test]
fn an_unwritable_report_path_fails_before_the_command_starts() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = output({
        let mut c = record(
            dir.path(),
            "",
            &["--report", "/nonexistent-dir/r.html", "--", "touch"],
        );
        c.arg(&marker);
        c
    });
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--report"),
        "{}",
        text(&out.stderr)
    );
    assert!(!marker.exists(), "the command must not have run");
}

/// The recording of a command whose processes hold GPU memory. In a fresh PID namespace (with
/// its own /proc) gpulse is PID 1; its runtime's threads take the next PIDs (before the command
/// starts: the export's endpoints are checked first), then the command and its child get theirs,
/// after those of gpulse's other threads on a loaded machine (a full CI run once gave the child
/// a PID above 24). The simulator lists PIDs 2 to 199 before any exists; gpulse must find the
/// command's among them by its process tree. PID 4000 is another process.
fn namespaced_recording(dir: &Path) -> (Output, Value) {
    namespaced_recording_of(dir, &["sh", "-c", "sleep 3 & wait"])
}

/// [`namespaced_recording`] of `command`.
fn namespaced_recording_of(dir: &Path, command_line: &[&str]) -> (Output, Value) {
    require_root("create a PID namespace");
    let json = dir.join("summary.json");
    let report = dir.join("report.html");
    let command = record(
        dir,
        &(2..200)
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(","),
        &["--sample-interval", "100ms", "--export-interval", "500ms"],
    );
    let args: Vec<std::ffi::OsString> = command.get_args().map(ToOwned::to_owned).collect();
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(gpulse_bin())
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(command_line);
    for (k, v) in command.get_envs() {
        match v {
            Some(v) => unshare.env(k, v),
            None => unshare.env_remove(k),
        };
    }
    unshare.current_dir(dir).stdin(Stdio::null());
    let out = unshare.output().expect("run unshare (util-linux)");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = serde_json::from_slice(&std::fs::read(&json).expect("the JSON summary"))
        .expect("the summary is JSON");
    (out, summary)
}

#[test]
#[ignore = "needs root (creates a PID namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn the_commands_processes_are_told_from_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (out, summary) = namespaced_recording(dir.path());
    let stderr = text(&out.stderr);
    let device = &summary["devices"][0];
    assert!(
        (device["utilization_gpu_mean"].as_f64().unwrap() - 0.62).abs() < 1e-6,
        "{device}"
    );
    assert!((device["power_mean_watts"].as_f64().unwrap() - 420.0).abs() < 1e-6);
    assert_eq!(device["memory_used_peak_bytes"], 30000 * MIB);
    assert!(device["energy_joules"].as_f64().unwrap() > 0.0);
    assert!(
        device["held_by_command_seconds"].as_f64().unwrap() > 2.0,
        "{device}"
    );
    assert_eq!(device["idle_ratio"], 0.0, "62 % busy is never idle");
    let pids = |key: &str| -> Vec<u64> {
        summary[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    };
    let mine = pids("processes");
    assert_eq!(mine.len(), 2, "sh and its sleep: {mine:?}");
    assert_eq!(summary["processes"][0]["name"], "sh", "the command itself");
    assert!(pids("other_processes").contains(&4000));
    let others = pids("other_processes");
    assert!(
        mine.iter().all(|pid| !others.contains(pid)),
        "{mine:?} in {others:?}"
    );
    let sleep = &summary["processes"][1];
    assert_eq!(sleep["name"], "sleep", "{sleep}");
    assert_eq!(sleep["gpu_memory_peak_bytes"], 10000 * MIB);
    assert!(
        stderr.contains(" sleep on GPU 0: memory peak 9.8 GiB"),
        "{stderr}"
    );
    assert!(stderr.contains("other process pid 4000"), "{stderr}");
    assert!(
        stderr.contains("idle (utilisation under 5 %) 0% of that time"),
        "{stderr}"
    );
}

/// The JSON names devices and processes as `snapshot --format json` does: the device's PCI bus
/// id, and each process's `workload` (host PID, namespaced PID, container, pod, service). The
/// command puts its `sleep` in a PID namespace of its own, where it is PID 1: gpulse knows it by
/// the PID of its own namespace and gives the inner one as `vpid`.
#[test]
#[ignore = "needs root (creates PID namespaces); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn the_json_names_devices_and_processes_as_snapshot_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_, summary) =
        namespaced_recording_of(dir.path(), &["unshare", "--pid", "--fork", "sleep", "3"]);
    assert_eq!(summary["devices"][0]["pci_bus_id"], "00000000:18:00.0");
    let sleep = summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sleep")
        .unwrap_or_else(|| panic!("no sleep among {}", summary["processes"]));
    let workload = &sleep["workload"];
    assert_eq!(workload["pid"], sleep["pid"], "{workload}");
    assert_ne!(sleep["pid"], 1, "PID 1 of gpulse's namespace is gpulse");
    assert_eq!(
        workload["vpid"], 1,
        "PID 1 in its own namespace: {workload}"
    );
    assert_eq!(workload["executable_name"], "sleep");
    assert_eq!(workload["attributed_by"], "host_pid");
    for key in [
        "container_id",
        "pod_uid",
        "pod_name",
        "service_name",
        "job_id",
    ] {
        assert!(workload.get(key).is_some(), "{key} missing from {workload}");
    }
}

/// Pixels of `colour` (within a small tolerance: anti-aliasing) in rows `rows` of `image`.
fn count_colour(image: &Screenshot, rows: std::ops::Range<u32>, colour: (u8, u8, u8)) -> usize {
    let close = |a: u8, b: u8| a.abs_diff(b) <= 24;
    rows.flat_map(|y| (0..image.width).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let (r, g, b) = image.pixel(x, y);
            close(r, colour.0) && close(g, colour.1) && close(b, colour.2)
        })
        .count()
}

struct Screenshot {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
    channels: usize,
}

impl Screenshot {
    fn read(path: &Path) -> Screenshot {
        let decoder = png::Decoder::new(BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().expect("a PNG");
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).expect("a PNG frame");
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("unexpected PNG colour type {other:?}"),
        };
        buf.truncate(info.buffer_size());
        Screenshot {
            width: info.width,
            height: info.height,
            rgb: buf,
            channels,
        }
    }

    fn pixel(&self, x: u32, y: u32) -> (u8, u8, u8) {
        let i = (y as usize * self.width as usize + x as usize) * self.channels;
        (self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }

    /// Rows in which more than half the pixels are not white: the charts' plot areas are
    /// white with grid lines, so this finds nothing there; used to check the page is not blank.
    fn non_white(&self) -> usize {
        (0..self.height)
            .flat_map(|y| (0..self.width).map(move |x| (x, y)))
            .filter(|&(x, y)| self.pixel(x, y) != (255, 255, 255))
            .count()
    }
}

/// Chromium, headless, as Debian installs it.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let path = Path::new(dir).join(name);
            if path.exists() {
                return path;
            }
        }
    }
    panic!(
        "Chromium is needed to check the HTML report as a browser draws it: apt-get install \
         chromium (.ci/run installs it)"
    );
}

fn screenshot(html: &Path, png: &Path, height: u32) {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--window-size=1000,{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(png.exists(), "no screenshot: {}", text(&out.stderr));
}

/// The report as Chromium draws it: the utilisation line (blue), the power line (red) and the
/// command's process memory (pink) are on the page as drawn lines, not only in the markup.
#[test]
#[ignore = "needs root (creates a PID namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn chromium_draws_the_reports_charts() {
    let dir = tempfile::tempdir().unwrap();
    let _ = namespaced_recording(dir.path());
    let report = dir.path().join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(!html.contains("<script"), "no script in the report");
    // SVG's xmlns names a namespace and is never fetched; nothing else may point outside.
    for fetch in [
        "src=", "href=", "url(", "@import", "<link", "<img", "<iframe",
    ] {
        assert!(
            !html.contains(fetch),
            "{fetch} in the report: it must load nothing at view time"
        );
    }
    let png = dir.path().join("report.png");
    screenshot(&report, &png, 2600);
    if let Some(keep) = std::env::var_os("GPULSE_KEEP_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
    let shot = Screenshot::read(&png);
    assert!(shot.non_white() > 50_000, "the page is not blank");
    let whole = 0..shot.height;
    // A legend swatch is 14x4 px; a drawn line across a 900 px chart is well over 1000.
    for (name, colour) in [
        ("utilisation", (0x1f, 0x77, 0xb4)),
        ("power", (0xd6, 0x27, 0x28)),
        ("the command's memory", (0xe3, 0x77, 0xc2)),
        ("SM clock", (0x17, 0xbe, 0xcf)),
    ] {
        let pixels = count_colour(&shot, whole.clone(), colour);
        assert!(
            pixels > 1000,
            "{name}: only {pixels} pixels of its colour on the page"
        );
    }
    // The utilisation line sits at 62 %: find its row in the first chart and check the height.
    let blue = (0x1f, 0x77, 0xb4);
    let rows: Vec<u32> = (0..shot.height)
        .filter(|&y| count_colour(&shot, y..y + 1, blue) > 500)
        .collect();
    assert!(
        !rows.is_empty(),
        "no horizontal blue line (utilisation at a constant 62 %)"
    );
}

/// `gpulse report` rebuilds the figures from what `gpulse run --exporter stdout` wrote.
#[test]
fn report_reads_what_run_exports_as_otlp_json() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, scenario_text()).unwrap();
    let sleeper = ChildGuard::spawn(Command::new("sleep").arg("30")).expect("sleep runs");
    let lines = dir.path().join("run.jsonl");
    let mut run = Command::new(gpulse_bin())
        .args([
            "run",
            "--exporter",
            "stdout",
            "--sample-interval",
            "100ms",
            "--export-interval",
            "500ms",
        ])
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("RECORD_TEST_PIDS", sleeper.pid().to_string())
        .env("GPULSE_KUBELET_SOCKET", "none")
        .stdout(std::fs::File::create(&lines).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _run_guard = KillOnDrop(run.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&lines)
        .unwrap_or_default()
        .lines()
        .count()
        < 4
    {
        assert!(Instant::now() < deadline, "gpulse run wrote too few lines");
        std::thread::sleep(Duration::from_millis(100));
    }
    unsafe { libc::kill(run.id() as libc::pid_t, libc::SIGTERM) };
    wait(&mut run, Duration::from_secs(20));

    let html = dir.path().join("past.html");
    let json = dir.path().join("past.json");
    let out = Command::new(gpulse_bin())
        .arg("report")
        .arg(&lines)
        .arg("-o")
        .arg(&html)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let device = &summary["devices"][0];
    assert!(
        (device["utilization_gpu_mean"].as_f64().unwrap() - 0.62).abs() < 1e-6,
        "{device}"
    );
    assert!((device["power_peak_watts"].as_f64().unwrap() - 420.0).abs() < 1e-6);
    assert_eq!(device["memory_used_peak_bytes"], 30000 * MIB);
    let processes = summary["processes"].as_array().unwrap();
    let sleeper_row = processes
        .iter()
        .find(|p| p["pid"] == sleeper.pid())
        .expect("the listed process");
    assert_eq!(sleeper_row["gpu_memory_peak_bytes"], 10000 * MIB);
    // Named as `snapshot --format json` names them, from the resources `run` exported.
    assert_eq!(device["pci_bus_id"], "00000000:18:00.0");
    let snapshot = Command::new(gpulse_bin())
        .args(["snapshot", "--format", "json", "--nvml-lib"])
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("RECORD_TEST_PIDS", sleeper.pid().to_string())
        .env("GPULSE_KUBELET_SOCKET", "none")
        .output()
        .unwrap();
    assert!(snapshot.status.success(), "{}", text(&snapshot.stderr));
    let snapshot: Value = serde_json::from_slice(&snapshot.stdout).unwrap();
    let snapshot_row = snapshot["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == sleeper.pid())
        .expect("snapshot lists the process");
    assert_eq!(sleeper_row["workload"], snapshot_row["workload"]);
    assert_eq!(device["pci_bus_id"], snapshot["devices"][0]["pci_bus_id"]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("polyline"),
        "charts drawn"
    );
    let _ = GIB;

    // Not OTLP: the line is named.
    std::fs::write(&lines, "{\"resourceMetrics\":[]}\nnot json\n").unwrap();
    let out = Command::new(gpulse_bin())
        .arg("report")
        .arg(&lines)
        .arg("-o")
        .arg(&html)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("line 2: not OTLP/JSON"),
        "{}",
        text(&out.stderr)
    );
}

/// A free loopback port (for gpulse's receiver).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Python companion that sends one trace request to `http://127.0.0.1:PORT/v1/traces` (an
/// epoch, two steps, two data waits and a `forward` span the report does not show), retrying
/// until gpulse's receiver answers, then sleeps `linger_s` seconds.
pub fn companion_sending_spans(port: u16, linger_s: f64) -> String {
    format!(
        r#"
import os, time, urllib.request
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
now = time.time_ns()
def span(name, start_s, end_s):
    return Span(trace_id=os.urandom(16), span_id=os.urandom(8), name=name,
                start_time_unix_nano=now - int(start_s * 1e9), end_time_unix_nano=now - int(end_s * 1e9))
spans = [span("epoch", 1.0, 0.0), span("step", 1.0, 0.5), span("step", 0.5, 0.0),
         span("data_wait", 1.0, 0.9), span("data_wait", 0.5, 0.4), span("forward", 0.3, 0.2)]
body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()
for attempt in range(100):
    try:
        urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:{port}/v1/traces", data=body,
                               headers={{"Content-Type": "application/x-protobuf"}}), timeout=5).read()
        break
    except OSError:
        time.sleep(0.1)
else:
    raise SystemExit("the receiver never answered")
time.sleep({linger_s})
"#
    )
}

/// `record` as the job's OTLP endpoint: the spans a training loop sends to its receiver appear in
/// the report's training-steps strip.
#[test]
fn the_companions_spans_sent_to_the_receiver_join_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let report = dir.path().join("r.html");
    let out = output({
        let mut c = record(
            dir.path(),
            "",
            &["--sample-interval", "100ms", "--otlp-receiver-http"],
        );
        c.arg(port.to_string())
            .arg("--report")
            .arg(&report)
            .arg("--")
            .arg(crate::common::python())
            .arg("-c")
            .arg(companion_sending_spans(port, 0.0));
        c
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&report).unwrap();
    for legend in ["epochs (1)", "steps (2)", "data wait (2)"] {
        assert!(page.contains(legend), "{legend} missing from the report");
    }
    assert!(!page.contains("No companion spans"));
    assert!(
        !text(&out.stderr).contains("\n  export"),
        "no endpoint set, so nothing exported and no export line: {}",
        text(&out.stderr)
    );
}

/// The command of the Ctrl-C test: Python with SIGINT blocked, so every SIGINT that reaches it
/// is taken with `sigwaitinfo` and counted with its sender (`si_pid` 0: the kernel, for the
/// terminal). After the first it listens a second longer (a duplicate forwarded by gpulse would
/// arrive in that second, unless it merged with the first while still pending), as a training
/// script's cleanup takes time, then dies of SIGINT as an interrupted Python does.
const CTRL_C_CHILD: &str = r#"
import os, signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print("child-ready", flush=True)
seen = [signal.sigwaitinfo({signal.SIGINT})]
deadline = time.monotonic() + 1.0
while (left := deadline - time.monotonic()) > 0:
    info = signal.sigtimedwait({signal.SIGINT}, left)
    if info is not None:
        seen.append(info)
print("child: %d SIGINT from %s; cleaning up" % (len(seen), ",".join("pid %d" % i.si_pid for i in seen)), flush=True)
time.sleep(0.3)
print("child: done", flush=True)
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
os.kill(os.getpid(), signal.SIGINT)
"#;

/// Ctrl-C typed at a real terminal (tmux, an interactive bash with job control, gpulse the
/// foreground job) reaches the command once, from the terminal (the command counts what it
/// gets, and gpulse's debug log says it did not forward it); gpulse, which got the same
/// SIGINT, outlives the command's cleanup, prints the summary after the command's last line,
/// writes the report and the JSON, and exits 130 as the shell reports for a SIGINT death.
#[test]
fn ctrl_c_at_a_terminal_reaches_the_command_once_and_gpulse_reports_then_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let probe = record(&dir_path, "", &[]);
    let child = dir_path.join("child.py");
    std::fs::write(&child, CTRL_C_CHILD).unwrap();
    let script = dir_path.join("record.sh");
    // `exec`: the foreground job is gpulse itself (with the command in its process group), not
    // a shell that the terminal's SIGINT would also stop.
    let mut env = String::new();
    for (k, v) in probe.get_envs() {
        if let Some(v) = v {
            env.push_str(&format!(
                "export {}='{}'\n",
                k.to_string_lossy(),
                v.to_string_lossy()
            ));
        } else {
            env.push_str(&format!("unset {}\n", k.to_string_lossy()));
        }
    }
    std::fs::write(
        &script,
        format!(
            "{env}export GPULSE_LOG=warn,gpulse::record::child=debug\ncd '{dir}'\nexec '{bin}' record --nvml-lib '{lib}' --sample-interval 100ms \
             --export-interval 500ms --report report.html --json summary.json -- '{python}' \
             child.py\n",
            dir = dir_path.display(),
            bin = gpulse_bin(),
            lib = sim_lib().display(),
            python = crate::common::python(),
        ),
    )
    .unwrap();
    let tmux = Tmux::new("record");
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "record",
        "-x",
        "200",
        "-y",
        "50",
        "-e",
        "PS1=$ ",
        "bash",
        "--norc",
        "--noprofile",
    ]);
    tmux.wait_for("the shell's prompt", Duration::from_secs(10), |s| {
        s.starts_with('$')
    });
    tmux.keys(&[
        "-l",
        &format!("sh {}; echo gpulse-exit=$?", script.display()),
    ]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the command to start", Duration::from_secs(30), |s| {
        s.contains("child-ready")
    });
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(30), |s| {
        s.lines().any(|l| l.starts_with("gpulse-exit="))
    });
    let line = |needle: &str| {
        screen
            .lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} on the screen:\n{screen}"))
    };
    assert!(
        screen.contains("child: 1 SIGINT from pid 0;"),
        "the command must get the terminal's SIGINT (from the kernel, pid 0) exactly once:\n{screen}"
    );
    // A second SIGINT sent while the first is still pending merges with it, so the count alone
    // cannot always see one; gpulse's own account of its decision can.
    line("SIGINT from the terminal reached the command directly");
    assert!(
        !screen.contains("forwarding SIGINT"),
        "gpulse must not send the terminal's SIGINT a second time:\n{screen}"
    );
    let done = line("child: done");
    let summary = line("gpulse record: ");
    assert!(
        summary > done,
        "gpulse must outlive the command's cleanup and summarise after it:\n{screen}"
    );
    assert!(
        screen
            .lines()
            .nth(summary)
            .unwrap()
            .contains("(killed by SIGINT)"),
        "{screen}"
    );
    line("GPU 0 NVIDIA H100 80GB HBM3");
    let report = dir_path.join("report.html");
    // Absolute, though `--report` was relative: to copy it off the machine as printed.
    line(&format!("report: {}", report.display()));
    line(&format!(
        "summary JSON: {}",
        dir_path.join("summary.json").display()
    ));
    assert!(
        screen.lines().any(|l| l == "gpulse-exit=130"),
        "gpulse exits 128 + SIGINT:\n{screen}"
    );
    let html = std::fs::read_to_string(&report).expect("the report is written");
    assert!(html.contains("<svg"), "the report has its charts");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir_path.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["exit_signal"], "SIGINT");
    assert_eq!(json["report"], report.display().to_string());
    assert!(json["exit_code"].is_null());
    assert!(json["samples"].as_u64().unwrap() > 0, "{json}");
}
