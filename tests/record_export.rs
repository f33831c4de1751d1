//! Integration tests: `gpulse record` exporting while it records. With an OTLP endpoint set
//! (flag or variable) it sends what `gpulse run` sends, to a real OTLP receiver, and forwards the
//! spans its own receiver takes; against an endpoint that never answers it still exits within
//! its flush bound, writes its report and JSON, and says what was lost; with no endpoint set it
//! opens no connection at all (checked in a network namespace with listeners on the default
//! ports, and against a control run that does connect there).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{python, Receiver, ReceiverOptions};
use crate::enrich::received_spans;
use crate::kernel::require_root;
use crate::record::{companion_sending_spans, free_port, output, record, text, wait};
use crate::run::{is_health_request, metrics_of, window_requests};
use crate::sampling::gpulse_bin;

/// `gpulse record`'s flush bound at exit (`commands::record::EXPORT_FLUSH`).
const EXPORT_FLUSH: Duration = Duration::from_secs(3);

fn summary(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("the JSON summary"))
        .expect("the summary is JSON")
}

fn span_names(requests: &[Value]) -> Vec<String> {
    received_spans(requests)
        .into_iter()
        .filter_map(|(_, span)| span["name"].as_str().map(str::to_string))
        .collect()
}

/// The command sends its spans to gpulse's receiver and lives 2 s more: gpulse exports GPU
/// windows (every 500 ms) and its own health to the upstream receiver while the command runs,
/// and forwards every span it received, the ones the report leaves out included.
#[test]
fn with_an_endpoint_record_exports_while_recording_and_forwards_the_spans() {
    let upstream = Receiver::start(ReceiverOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let json = dir.path().join("summary.json");
    let out = output({
        let mut c = record(
            dir.path(),
            "",
            &[
                "--sample-interval",
                "100ms",
                "--export-interval",
                "500ms",
                "--report",
                "none",
            ],
        );
        c.arg("--otlp-receiver-http")
            .arg(port.to_string())
            .arg("--otlp-endpoint")
            .arg(upstream.http_base())
            .arg("--json")
            .arg(&json)
            .arg("--")
            .arg(python())
            .arg("-c")
            .arg(companion_sending_spans(port, 2.0));
        c
    });
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary = summary(&json);
    let command_ended = summary["ended"].as_f64().expect("ended");

    let requests = upstream.requests();
    let windows = window_requests(&requests);
    let during: Vec<&&Value> = windows
        .iter()
        .filter(|r| r["received_at"].as_f64().unwrap() < command_ended)
        .collect();
    assert!(
        during.len() >= 2,
        "GPU windows must arrive while the command runs (2.5 s at 500 ms), got {} of {} before \
         it ended\n{stderr}",
        during.len(),
        windows.len()
    );
    let names: Vec<&str> = metrics_of(&during[0]["request"]["resourceMetrics"][0])
        .into_iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        names.contains(&"hw.gpu.utilization.max"),
        "the node's GPU metrics, as run sends them: {names:?}"
    );
    assert!(
        requests.iter().any(is_health_request),
        "gpulse's own health metrics are exported too"
    );

    let mut spans = span_names(&requests);
    spans.sort();
    assert_eq!(
        spans,
        ["data_wait", "data_wait", "epoch", "forward", "step", "step"],
        "every received span is forwarded upstream, once"
    );

    let export = &summary["export"];
    assert_eq!(export["lost_requests"], 0, "{export}");
    assert!(
        export["delivered_requests"].as_u64().unwrap() >= 3,
        "{export}"
    );
    assert_eq!(
        export["destinations"][0],
        format!("{}/v1/metrics", upstream.http_base())
    );
    assert!(
        stderr.contains("  export: ") && stderr.contains("delivered to http://127.0.0.1:"),
        "the summary says where the export went: {stderr}"
    );
}

/// An endpoint that accepts connections and never answers (a listener nobody reads, so requests
/// hang until their 10 s timeout): gpulse leaves within its 3 s flush bound once the command
/// ended, still writes the report and the JSON, and says on standard error what was not
/// delivered, where to, and why.
#[test]
fn a_dead_endpoint_costs_at_most_the_flush_bound_and_is_reported() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://127.0.0.1:{}", dead.local_addr().unwrap().port());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("summary.json");
    let report = dir.path().join("report.html");
    let mut child = record(
        dir.path(),
        "",
        &["--sample-interval", "100ms", "--export-interval", "500ms"],
    )
    .arg("--otlp-endpoint")
    .arg(&endpoint)
    .arg("--json")
    .arg(&json)
    .arg("--report")
    .arg(&report)
    .args(["--", "sleep", "1.5"])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let status = wait(&mut child, Duration::from_secs(30));
    let exited = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");

    let summary = summary(&json);
    let after_command = exited - summary["ended"].as_f64().unwrap();
    assert!(
        after_command < EXPORT_FLUSH.as_secs_f64() + 1.5,
        "gpulse took {after_command:.1} s after the command ended; the bound is {EXPORT_FLUSH:?}"
    );
    assert!(
        after_command > EXPORT_FLUSH.as_secs_f64() - 0.5,
        "the flush gave up after {after_command:.1} s, before its {EXPORT_FLUSH:?} bound"
    );
    assert!(std::fs::read_to_string(&report).unwrap().contains("<svg"));
    let export = &summary["export"];
    assert!(export["lost_requests"].as_u64().unwrap() >= 1, "{export}");
    assert_eq!(export["delivered_requests"], 0, "{export}");
    for said in [
        "export FAILED: ",
        &format!("NOT delivered to {endpoint}\n"),
        "still queued when the 3s flush bound ran out",
        "nothing was delivered",
        "--otlp-endpoint",
    ] {
        assert!(stderr.contains(said), "{said:?} missing from:\n{stderr}");
    }
    drop(dead);
}

/// Listens on 127.0.0.1:4317 and :4318 (the default OTLP endpoints), appending one line to
/// `argv[1]` per connection, and writes `argv[1].ready` once listening.
const DEFAULT_PORT_LISTENER: &str = r#"
import selectors, socket, sys
out = sys.argv[1]
sel = selectors.DefaultSelector()
for port in (4317, 4318):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    sel.register(s, selectors.EVENT_READ)
open(out + ".ready", "w").write("ready")
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        with open(out, "a") as f:
            f.write("%d\n" % key.fileobj.getsockname()[1])
        conn.close()
"#;

/// Runs `gpulse record ... -- sleep 1.5` in a fresh network namespace where a listener holds
/// the default OTLP ports, and returns how many connections it got. `endpoint_env`: an
/// `OTEL_EXPORTER_OTLP_ENDPOINT` for the run.
fn connections_to_default_ports(endpoint_env: Option<&str>) -> usize {
    require_root("create a network namespace");
    let dir = tempfile::tempdir().unwrap();
    let connections = dir.path().join("connections");
    let command = record(
        dir.path(),
        "",
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "500ms",
            "--report",
            "none",
            "--",
            "sleep",
            "1.5",
        ],
    );
    let script = String::from(
        "set -e; ip link set lo up; \"$GPULSE_TEST_PY\" -c \"$LISTENER\" \"$CONNECTIONS\" & \
         listener=$!; while [ ! -e \"$CONNECTIONS.ready\" ]; do sleep 0.05; done; set +e; \"$@\"; \
         status=$?; kill $listener; exit $status",
    );
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--net", "sh", "-c", &script, "sh", gpulse_bin()])
        .args(command.get_args())
        .env("LISTENER", DEFAULT_PORT_LISTENER)
        .env("CONNECTIONS", &connections)
        .env("GPULSE_TEST_PY", python())
        .current_dir(dir.path());
    for (k, v) in command.get_envs() {
        match v {
            Some(v) => unshare.env(k, v),
            None => unshare.env_remove(k),
        };
    }
    unshare.env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    unshare.env_remove("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT");
    unshare.env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    unshare.env_remove("GPULSE_CONFIG");
    if let Some(endpoint) = endpoint_env {
        unshare.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    let started = Instant::now();
    let out = unshare.output().expect("run unshare (util-linux)");
    assert_eq!(
        out.status.code(),
        Some(0),
        "record in a network namespace: {}",
        text(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    std::fs::read_to_string(&connections)
        .unwrap_or_default()
        .lines()
        .count()
}

/// With no endpoint set, recording stays offline: the default endpoints (where `run` would
/// send) get no connection. The control run sets `OTEL_EXPORTER_OTLP_ENDPOINT` to that same
/// default address, and the listener sees it connect, so the first count is not zero for want
/// of a listener.
#[test]
#[ignore = "needs root (creates a network namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn without_an_endpoint_record_opens_no_connection() {
    assert_eq!(
        connections_to_default_ports(None),
        0,
        "record with no endpoint connected to a default OTLP port"
    );
    assert!(
        connections_to_default_ports(Some("http://127.0.0.1:4318")) > 0,
        "the control run, with the endpoint set to the default address, must connect there"
    );
}
