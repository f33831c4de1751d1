//! Integration tests: per-signal exporters in a real `gpulse run` against nvml-sim.
//! Prometheus-only mode (`OTEL_METRICS_EXPORTER=prometheus`, `OTEL_LOGS_EXPORTER=none`) serves
//! `/metrics` on the `OTEL_EXPORTER_PROMETHEUS_*` address and never connects to an OTLP endpoint,
//! which a listening socket proves; logs-only mode sends no metrics to a real OTLP receiver.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::common::{h100_scenario, Receiver, ReceiverOptions};
use crate::reliability::{free_port, wait_http};
use crate::run::{metrics_requests, Gpulse};

fn scenario() -> String {
    h100_scenario(
        r#"
[device.signals]
gpu_util = 62
"#,
    )
}

/// `GET /metrics` with `Connection: close`; the status code, or `None` when nothing answers.
fn scrape(port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// Polls `/metrics` until it answers 200.
fn wait_for_metrics(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        last = scrape(port);
        if last == Some(200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("/metrics answered {last:?}, expected 200");
}

#[test]
fn prometheus_only_serves_metrics_and_never_connects_to_otlp() {
    // The OTLP endpoint is a real listening socket: any connection gpulse made would be seen.
    let otlp = TcpListener::bind("127.0.0.1:0").expect("bind the OTLP stand-in");
    otlp.set_nonblocking(true).expect("nonblocking");
    let otlp_url = format!("http://{}", otlp.local_addr().unwrap());
    let prom_port = free_port();
    let gpulse = Gpulse::start(
        &scenario(),
        &[],
        &["--sample-interval", "100ms", "--export-interval", "200ms"],
        &[
            ("OTEL_METRICS_EXPORTER", "prometheus".to_string()),
            ("OTEL_LOGS_EXPORTER", "none".to_string()),
            ("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1".to_string()),
            ("OTEL_EXPORTER_PROMETHEUS_PORT", prom_port.to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_url.clone()),
        ],
    );
    wait_for_metrics(prom_port);
    // Let several export intervals pass, checking the socket all along.
    let until = Instant::now() + Duration::from_secs(2);
    let mut scrapes = 0;
    while Instant::now() < until {
        if let Ok((_, peer)) = otlp.accept() {
            panic!("gpulse connected to the OTLP endpoint from {peer} in Prometheus-only mode");
        }
        assert_eq!(scrape(prom_port), Some(200), "/metrics stopped answering");
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(scrapes > 3, "{scrapes} scrapes");
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    // The shutdown flush would be the last chance to connect.
    assert!(
        otlp.accept().is_err(),
        "gpulse connected to the OTLP endpoint at shutdown"
    );
    assert!(
        !stderr.contains("OTLP") && !stderr.contains(&otlp_url),
        "no OTLP warning expected:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("prometheus http://127.0.0.1:{prom_port}/metrics")),
        "the start-up line names where metrics go:\n{stderr}"
    );
}

#[test]
fn logs_only_sends_no_metrics_to_the_otlp_receiver() {
    let receiver = Receiver::start(ReceiverOptions::default());
    let health_port = free_port();
    let health = format!("127.0.0.1:{health_port}");
    let gpulse = Gpulse::start(
        &scenario(),
        &[],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "200ms",
            "--health-addr",
            &health,
        ],
        &[
            ("OTEL_METRICS_EXPORTER", "none".to_string()),
            ("OTEL_LOGS_EXPORTER", "otlp".to_string()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
        ],
    );
    wait_http(health_port, "/readyz", 200);
    // Several windows, each of which would have sent a metrics request.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        wait_http(health_port, "/readyz", 200);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "exit {status}: {stderr}");
    let requests = receiver.requests();
    assert!(
        metrics_requests(&requests).is_empty(),
        "metrics set to none, yet the receiver got {} metrics request(s)",
        metrics_requests(&requests).len()
    );
    assert!(
        stderr.contains("logs=\"otlp\"") || stderr.contains("logs=otlp"),
        "{stderr}"
    );
}
