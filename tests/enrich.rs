//! Integration tests: gpulse as the local OTLP endpoint. `gpulse run` against nvml-sim, whose
//! scenario lists this test process as a GPU process with utilisation, power and memory that
//! step at a known second; the test sends spans to gpulse's receivers (hand-built OTLP protobuf
//! over HTTP and over gRPC), and a real OTLP receiver upstream gets them with the GPU attributes
//! of the step each span lay in. Also: spans of an unknown process or older than the history go
//! through unchanged, malformed requests are refused with a clear status, and an upstream that
//! is down gets the spans later, while a full queue answers 429 with Retry-After.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::run::{attr, attr_str, metrics_of, window_requests, Gpulse};

const GPU0: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";

/// Not frozen: at simulated second 6 everything steps up. This test process is the one GPU
/// process (listed through `GPULSE_TEST_PIDS`), alone on the device, so all of the device's
/// power is its.
const SCENARIO: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-0a0a0a0a-1111-2222-3333-444444444444"
pci_bus_id = "00000000:18:00.0"

[device.signals]
gpu_util = { steps = [[0, 20], [6, 80]] }
power_w = { steps = [[0, 100], [6, 300]] }

[[device.process]]
pids_env = "GPULSE_TEST_PIDS"
memory_used_mib = { steps = [[0, 1000], [6, 3000]] }
sm_util = { steps = [[0, 15], [6, 70]] }
"#;

const MIB: i64 = 1024 * 1024;
const STEP_S: f64 = 6.0;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

fn kv_str(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// One resource with `spans` (name, start, end in Unix nanoseconds).
fn request(resource: Vec<KeyValue>, spans: &[(&str, u64, u64)]) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "gpulse-test".into(),
                    version: "1.0".into(),
                    ..Default::default()
                }),
                spans: spans
                    .iter()
                    .enumerate()
                    .map(|(i, (name, start, end))| Span {
                        trace_id: vec![7; 16],
                        span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                        name: (*name).into(),
                        start_time_unix_nano: *start,
                        end_time_unix_nano: *end,
                        attributes: vec![kv_str("app.attr", name)],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// One HTTP/1.1 POST over a fresh connection from this process.
fn post(port: u16, path: &str, content_type: &str, body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to gpulse");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: {content_type}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send head");
    stream.write_all(body).expect("send body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    Answer {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    }
}

/// The `google.rpc.Status` message of an error body.
fn rpc_message(body: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    RpcStatus::decode(body)
        .map(|s| s.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).to_string())
}

/// Waits until gpulse's HTTP receiver accepts connections; by then NVML (the simulator) is
/// initialised, since the receivers start after the sampler.
fn wait_listening(port: u16, gpulse: Gpulse) -> (Gpulse, Instant) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (gpulse, Instant::now());
        }
        if Instant::now() > deadline {
            let (_, stderr) = gpulse.terminate();
            panic!("gpulse's OTLP receiver did not come up on {port}: {stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every span the upstream receiver accepted, with its resource's attributes.
pub fn received_spans(requests: &[Value]) -> Vec<(Value, Value)> {
    requests
        .iter()
        .filter(|r| r["signal"] == "traces" && r["answer"] == "ok")
        .flat_map(|r| {
            r["request"]["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|rs| {
            let resource = rs["resource"]["attributes"].clone();
            rs["scopeSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
                .map(move |span| (resource.clone(), span))
        })
        .collect()
}

fn span_named<'a>(spans: &'a [(Value, Value)], name: &str) -> &'a (Value, Value) {
    spans
        .iter()
        .find(|(_, s)| s["name"] == name)
        .unwrap_or_else(|| panic!("span {name} did not arrive upstream; got {spans:?}"))
}

fn double(span: &Value, key: &str) -> f64 {
    attr(&span["attributes"], key)
        .and_then(|v| v["doubleValue"].as_f64())
        .unwrap_or_else(|| panic!("{key} missing or not a double in {span}"))
}

fn has_gpu_attributes(span: &Value) -> bool {
    span["attributes"].as_array().is_some_and(|a| {
        a.iter()
            .any(|kv| kv["key"].as_str().is_some_and(|k| k.starts_with("gpulse.")))
    })
}

/// Checks a span of the first step (util 0.2, SM 0.15, 1000 MiB, 100 W) or the second.
fn assert_step(span: &Value, second: bool, seconds: f64) {
    let (util, sm, mib, watts) = if second {
        (0.8, 0.7, 3000, 300.0)
    } else {
        (0.2, 0.15, 1000, 100.0)
    };
    let close = |got: f64, want: f64| (got - want).abs() <= want * 0.02 + 1e-6;
    for key in ["gpulse.gpu.utilization.mean", "gpulse.gpu.utilization.max"] {
        assert!(close(double(span, key), util), "{key}: {span}");
    }
    for key in [
        "gpulse.gpu.process.utilization.mean",
        "gpulse.gpu.process.utilization.max",
    ] {
        assert!(close(double(span, key), sm), "{key}: {span}");
    }
    assert_eq!(
        attr_str(&span["attributes"], "gpulse.gpu.memory.peak"),
        Some((mib * MIB).to_string()),
        "{span}"
    );
    // Charged as the exported process.gpu.energy is: the process's busy share of the power
    // (alone on the GPU, its SM utilisation); the idle rest is charged to no span.
    let watts = watts * sm;
    assert!(
        close(double(span, "gpulse.gpu.power.mean"), watts),
        "{span}"
    );
    let energy = double(span, "gpulse.gpu.energy");
    assert!(
        (energy - watts * seconds).abs() <= watts * seconds * 0.05,
        "energy {energy} J, expected ~{} J: {span}",
        watts * seconds
    );
    let ids = attr(&span["attributes"], "gpulse.gpu.ids").expect("gpulse.gpu.ids");
    assert_eq!(
        ids["arrayValue"]["values"][0]["stringValue"], GPU0,
        "{span}"
    );
    // What the application set is still there.
    assert!(
        attr_str(&span["attributes"], "app.attr").is_some(),
        "{span}"
    );
}

/// Sends a request from another process (Python), so that the connection's peer is not a GPU
/// process either.
fn post_from_another_process(port: u16, body: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("body.bin");
    std::fs::write(&file, body).expect("write body");
    let python = std::env::var("GPULSE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "import urllib.request;r=urllib.request.Request('http://127.0.0.1:{port}/v1/traces',\
         data=open('{}','rb').read(),headers={{'Content-Type':'application/x-protobuf'}});\
         print(urllib.request.urlopen(r).status)",
        file.display()
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .output()
        .expect("run python");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "200",
        "python sender: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The newest point time (ns since the epoch) in gpulse's exported windows; 0 before the first.
fn newest_point_nanos(requests: &[Value]) -> u64 {
    window_requests(requests)
        .into_iter()
        .flat_map(|r| {
            r["request"]["resourceMetrics"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .flat_map(metrics_of)
        .flat_map(|m| m.as_object().into_iter().flat_map(|o| o.values()))
        .flat_map(|data| data["dataPoints"].as_array().into_iter().flatten())
        .filter_map(|p| p["timeUnixNano"].as_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn spans_get_the_gpu_usage_of_their_process_during_the_span() {
    let upstream = Receiver::start(ReceiverOptions::default());
    let http_port = free_port();
    let grpc_port = free_port();
    let me = std::process::id();
    let t0 = Instant::now();
    let gpulse = Gpulse::start(
        SCENARIO,
        &[me],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--otlp-receiver-http",
            &http_port.to_string(),
            "--otlp-receiver-grpc",
            &grpc_port.to_string(),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", upstream.http_base()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
        ],
    );
    let (gpulse, ready) = wait_listening(http_port, gpulse);
    // Simulated second 0 lies between t0 and `ready`: each span keeps clear of the step by more
    // than that uncertainty.
    let uncertainty = ready.duration_since(t0).as_secs_f64();
    assert!(
        uncertainty < 4.0,
        "gpulse took {uncertainty:.1}s to start; the spans' margins assume under 4s"
    );
    let wall_ready = now_nanos();
    let at = |s: f64| wall_ready + (s * 1e9) as u64;
    // Step 1 is simulated [0, 6) s, i.e. wall [ready, ready + 6 - uncertainty) at the least;
    // span a ends 1.5 s after `ready`, span b starts 0.5 s after the step at the latest.
    let a = (at(0.3), at(1.5));
    let b = (at(STEP_S + 0.5), at(STEP_S + 2.0));
    // The spans are sent once gpulse has data past span b's end: an exported window with a point
    // at or after it (a fixed sleep assumed the sampler keeps up, which a loaded machine breaks).
    upstream.wait_for(
        |r| newest_point_nanos(r) >= b.1,
        Duration::from_secs_f64(STEP_S + 60.0),
    );

    let pid_resource = || {
        vec![
            kv_str("service.name", "trainer"),
            kv_int("process.pid", i64::from(me)),
        ]
    };
    // By resource: process.pid is this process, a GPU process of the scenario.
    let by_resource = request(
        pid_resource(),
        &[("step-a", a.0, a.1), ("step-b", b.0, b.1)],
    );
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &by_resource.encode_to_vec(),
    );
    assert_eq!(
        answer.status,
        200,
        "{} {}",
        answer.head,
        rpc_message(&answer.body)
    );
    // By connection: the resource names no process, the TCP peer is this process.
    let by_peer = request(
        vec![kv_str("service.name", "trainer")],
        &[("peer-b", b.0, b.1)],
    );
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &by_peer.encode_to_vec(),
    );
    assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));
    // Older than the history (ten minutes before gpulse started): unchanged.
    let old = now_nanos() - 600_000_000_000;
    let stale = request(pid_resource(), &[("too-old", old, old + 1_000_000)]);
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &stale.encode_to_vec(),
    );
    assert_eq!(answer.status, 200);
    // A process gpulse does not know, over a connection from a process it does not know.
    let stranger = request(
        vec![
            kv_str("service.name", "web"),
            kv_int("process.pid", 999_999),
        ],
        &[("stranger", b.0, b.1)],
    );
    post_from_another_process(http_port, &stranger.encode_to_vec());
    // Over gRPC, with the generated tonic client.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = TraceServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
            .await
            .expect("connect over gRPC");
        client
            .export(request(pid_resource(), &[("grpc-b", b.0, b.1)]))
            .await
            .expect("gRPC export accepted");
    });

    // Metrics and logs of the application are forwarded as they came.
    let metrics = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "app.queue.depth".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            time_unix_nano: now_nanos(),
                            value: Some(number_data_point::Value::AsInt(17)),
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let answer = post(
        http_port,
        "/v1/metrics",
        "application/x-protobuf",
        &metrics.encode_to_vec(),
    );
    assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: now_nanos(),
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("epoch 3 done".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let answer = post(
        http_port,
        "/v1/logs",
        "application/x-protobuf",
        &logs.encode_to_vec(),
    );
    assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));

    // Malformed: refused, with a status and a message saying what is wrong.
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &[0xff, 0xff, 0xff],
    );
    assert_eq!(answer.status, 400);
    let message = rpc_message(&answer.body);
    assert!(
        message.contains("not a valid OTLP traces export request"),
        "{message}"
    );
    let answer = post(http_port, "/v1/traces", "application/json", b"{}");
    assert_eq!(answer.status, 415);
    assert!(rpc_message(&answer.body).contains("http/protobuf"));
    let answer = post(http_port, "/v2/traces", "application/x-protobuf", b"");
    assert_eq!(answer.status, 404);
    let malformed_grpc = runtime.block_on(async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))
                .expect("url")
                .connect()
                .await
                .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        // A metrics request that is not protobuf: the raw codec of the test sends bytes.
        grpc.unary(
            tonic::Request::new(vec![0xffu8, 0xff, 0xff]),
            http::uri::PathAndQuery::from_static(
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            ),
            tonic_prost::ProstCodec::<Vec<u8>, ExportTraceServiceRequest>::default(),
        )
        .await
    });
    let status = malformed_grpc.expect_err("malformed gRPC request refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    let forwarded = |r: &[Value], signal: &str, needle: &str| {
        r.iter().any(|q| {
            q["signal"] == signal
                && q["answer"] == "ok"
                && q["request"].to_string().contains(needle)
        })
    };
    let requests = upstream.wait_for(
        |r| {
            received_spans(r).len() >= 6
                && forwarded(r, "metrics", "app.queue.depth")
                && forwarded(r, "logs", "epoch 3 done")
        },
        Duration::from_secs(20),
    );
    assert!(
        forwarded(&requests, "metrics", "app.queue.depth"),
        "metrics not forwarded"
    );
    assert!(
        forwarded(&requests, "logs", "epoch 3 done"),
        "logs not forwarded"
    );
    let spans = received_spans(&requests);
    let (_, a_span) = span_named(&spans, "step-a");
    assert_step(a_span, false, 1.2);
    assert_eq!(
        attr_str(&a_span["attributes"], "gpulse.gpu.match").as_deref(),
        Some("resource")
    );
    let (resource, b_span) = span_named(&spans, "step-b");
    assert_step(b_span, true, 1.5);
    // The resource passed through untouched.
    assert_eq!(
        attr_str(resource, "service.name").as_deref(),
        Some("trainer")
    );
    assert_eq!(resource.as_array().map(Vec::len), Some(2), "{resource}");
    let (_, peer_span) = span_named(&spans, "peer-b");
    assert_step(peer_span, true, 1.5);
    assert_eq!(
        attr_str(&peer_span["attributes"], "gpulse.gpu.match").as_deref(),
        Some("connection")
    );
    let (_, grpc_span) = span_named(&spans, "grpc-b");
    assert_step(grpc_span, true, 1.5);
    for name in ["too-old", "stranger"] {
        let (_, span) = span_named(&spans, name);
        assert!(
            !has_gpu_attributes(span),
            "{name} should be unchanged: {span}"
        );
        assert_eq!(
            span["attributes"].as_array().map(Vec::len),
            Some(1),
            "{span}"
        );
    }
    // gpulse's own metrics still flow over the same exporter.
    assert!(requests
        .iter()
        .any(|r| r["signal"] == "metrics" && r["answer"] == "ok"));
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "{stderr}");
}

#[test]
fn spans_wait_in_the_queue_while_upstream_is_down_and_a_full_queue_says_429() {
    let dir = tempfile::tempdir().expect("temp dir");
    let down = dir.path().join("upstream-down");
    std::fs::write(&down, b"").expect("flag file");
    let upstream = Receiver::start(ReceiverOptions {
        fail_status: Some("unavailable"),
        fail_until_file: Some(down.clone()),
        ..Default::default()
    });
    let http_port = free_port();
    let gpulse = Gpulse::start(
        SCENARIO,
        &[std::process::id()],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--otlp-receiver-http",
            &http_port.to_string(),
            "--queue-max-bytes",
            "600KiB",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", upstream.http_base()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
        ],
    );
    let (gpulse, _) = wait_listening(http_port, gpulse);
    let now = now_nanos();
    let small = request(
        vec![kv_str("service.name", "trainer")],
        &[("queued", now, now + 1000)],
    );
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &small.encode_to_vec(),
    );
    assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));

    // ~300 KB requests: the first fits in the 450 KiB the receiver may fill of the 600 KiB queue
    // (the last quarter is gpulse's own), the next cannot, so the application is told to retry.
    let names: Vec<String> = (0..1500)
        .map(|i| format!("bulk-{i:04}-{}", "x".repeat(60)))
        .collect();
    let bulk: Vec<(&str, u64, u64)> = names
        .iter()
        // Older than the history, so forwarded as sent: the size stays what it is here.
        .map(|n| (n.as_str(), now - 3_600_000_000_000, now - 3_599_000_000_000))
        .collect();
    let big = request(vec![kv_str("service.name", "trainer")], &bulk).encode_to_vec();
    assert!(big.len() > 250_000 && big.len() < 400_000, "{}", big.len());
    let first = post(http_port, "/v1/traces", "application/x-protobuf", &big);
    assert_eq!(first.status, 200, "{}", rpc_message(&first.body));
    let second = post(http_port, "/v1/traces", "application/x-protobuf", &big);
    assert_eq!(second.status, 429, "{}", second.head);
    assert!(
        second.head.to_ascii_lowercase().contains("retry-after: 5"),
        "{}",
        second.head
    );
    assert!(
        rpc_message(&second.body).contains("queue is full"),
        "{}",
        rpc_message(&second.body)
    );

    // Upstream stays down until it has refused gpulse's forwarding of the queued spans.
    upstream.wait_for(
        |r| {
            r.iter()
                .any(|r| r["signal"] == "traces" && r["answer"] != "ok")
        },
        Duration::from_secs(30),
    );
    std::fs::remove_file(&down).expect("bring upstream back");
    let requests = upstream.wait_for(
        |r| {
            let spans = received_spans(r);
            spans.iter().any(|(_, s)| s["name"] == "queued")
                && spans
                    .iter()
                    .any(|(_, s)| s["name"].as_str().is_some_and(|n| n.starts_with("bulk-")))
        },
        Duration::from_secs(30),
    );
    let failed_first = requests
        .iter()
        .any(|r| r["signal"] == "traces" && r["answer"] != "ok");
    assert!(
        failed_first,
        "upstream should have refused traces while down"
    );
    let delivered = received_spans(&requests)
        .iter()
        .filter(|(_, s)| s["name"].as_str().is_some_and(|n| n.starts_with("bulk-")))
        .count();
    // Delivered at least once; the refused copy was never queued.
    assert!(delivered >= 1500, "{delivered}");
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "{stderr}");
}

/// The upstream refuses every traces request (HTTP 503 or gRPC UNAVAILABLE) for the whole run
/// while an application sends a span through gpulse's receiver every 200 ms: metrics still
/// reach the upstream every export interval, because each signal has its own delivery lane.
fn refused_traces_never_delay_metrics(protocol: &str) {
    let upstream = Receiver::start(ReceiverOptions {
        fail_status: Some("unavailable"),
        fail_signal: Some("traces"),
        ..Default::default()
    });
    let endpoint = match protocol {
        "grpc" => upstream.grpc_url(),
        _ => upstream.http_base(),
    };
    let http_port = free_port();
    let gpulse = Gpulse::start(
        SCENARIO,
        &[std::process::id()],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--otlp-receiver-http",
            &http_port.to_string(),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.into()),
        ],
    );
    let (gpulse, listening) = wait_listening(http_port, gpulse);
    let run_for = Duration::from_secs(9);
    let mut sent = 0;
    while listening.elapsed() < run_for {
        let end = now_nanos();
        let spans = request(
            vec![kv_int("process.pid", i64::from(std::process::id()))],
            &[("step", end - 100_000_000, end)],
        );
        let answer = post(
            http_port,
            "/v1/traces",
            "application/x-protobuf",
            &spans.encode_to_vec(),
        );
        assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));
        sent += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let requests = upstream.requests();
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "{stderr}");

    let refused_traces = requests
        .iter()
        .filter(|r| r["signal"] == "traces" && r["answer"] == "unavailable")
        .count();
    assert!(
        refused_traces >= 2,
        "the upstream should have refused traces during the run ({sent} span requests sent): \
         {refused_traces} refusals"
    );
    assert!(
        received_spans(&requests).is_empty(),
        "no span can have been accepted upstream"
    );
    // Metrics arrived every export interval while the traces lane was backing off. The first
    // second is start-up; after it, at 1 s intervals, no gap may exceed 2.5 s (slack for a
    // loaded CI machine, well below the traces lane's backoff of up to 30 s).
    let start = requests
        .first()
        .and_then(|r| r["received_at"].as_f64())
        .expect("the upstream got requests");
    let metrics_at: Vec<f64> = requests
        .iter()
        .filter(|r| r["signal"] == "metrics" && r["answer"] == "ok")
        .filter_map(|r| r["received_at"].as_f64())
        .collect();
    assert!(
        metrics_at.len() >= 6,
        "{} metrics requests in a {run_for:?} run with refused traces: {stderr}",
        metrics_at.len()
    );
    let gaps: Vec<f64> = metrics_at.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "{protocol}: {} metrics requests and {refused_traces} refused traces requests in {run_for:?} \
         ({sent} span requests sent); largest gap between metrics {:.2} s",
        metrics_at.len(),
        gaps.iter().copied().fold(0.0, f64::max)
    );
    assert!(
        gaps.iter().all(|&gap| gap < 2.5),
        "metrics waited behind refused traces: gaps {gaps:?} (s), first trace request at {start}"
    );
    let last = *metrics_at.last().expect("checked above");
    let last_traces = requests
        .iter()
        .filter(|r| r["signal"] == "traces")
        .filter_map(|r| r["received_at"].as_f64())
        .fold(f64::MIN, f64::max);
    assert!(
        last + 2.5 > last_traces,
        "metrics stopped arriving while traces were still being refused (last metrics at {last}, \
         last traces at {last_traces})"
    );
}

#[test]
fn refused_traces_never_delay_metrics_over_http() {
    refused_traces_never_delay_metrics("http/protobuf");
}

#[test]
fn refused_traces_never_delay_metrics_over_grpc() {
    refused_traces_never_delay_metrics("grpc");
}

#[test]
fn spans_are_forwarded_over_grpc_on_the_metrics_connection() {
    let upstream = Receiver::start(ReceiverOptions::default());
    let http_port = free_port();
    let gpulse = Gpulse::start(
        SCENARIO,
        &[std::process::id()],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--otlp-receiver-http",
            &http_port.to_string(),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", upstream.grpc_url()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
        ],
    );
    let (gpulse, _) = wait_listening(http_port, gpulse);
    // Once the first export window has reached upstream, gpulse has sampled for a second: the
    // span below, the last 300 ms, lies inside its history.
    upstream.wait_for(
        |r| r.iter().any(|r| r["signal"] == "metrics"),
        Duration::from_secs(30),
    );
    let end = now_nanos();
    let spans = request(
        vec![kv_int("process.pid", i64::from(std::process::id()))],
        &[("over-grpc", end - 300_000_000, end)],
    );
    let answer = post(
        http_port,
        "/v1/traces",
        "application/x-protobuf",
        &spans.encode_to_vec(),
    );
    assert_eq!(answer.status, 200, "{}", rpc_message(&answer.body));
    let requests = upstream.wait_for(|r| !received_spans(r).is_empty(), Duration::from_secs(15));
    let trace_requests: Vec<_> = requests
        .iter()
        .filter(|r| r["signal"] == "traces")
        .collect();
    assert!(
        trace_requests.iter().all(|r| r["transport"] == "grpc"),
        "{trace_requests:?}"
    );
    let spans = received_spans(&requests);
    let (_, span) = span_named(&spans, "over-grpc");
    assert!(has_gpu_attributes(span), "{span}");
    let (status, stderr) = gpulse.terminate();
    assert!(status.success(), "{stderr}");
}

mod config {
    //! The receiver's settings and the traces endpoint, resolved like every other setting.

    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    use clap::Parser;
    use gpulse::cli::{Cli, Command};
    use gpulse::config::otlp::ExporterKind;
    use gpulse::config::{Config, ConfigError, LoadedFile};

    fn resolve(
        args: &[&str],
        env: &[(&str, &str)],
        file: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let mut argv = vec!["gpulse", "run"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).expect("flags parse");
        let Command::Run(run) = cli.command else {
            panic!("run expected")
        };
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |name: &str| env.get(name).cloned();
        let file = file.map(|text| {
            LoadedFile::parse(Path::new("/etc/gpulse.toml"), text.to_string()).expect("file")
        });
        Config::resolve_with_file(&cli.global, &run, &lookup, file.as_ref())
    }

    #[test]
    fn off_by_default_with_a_ten_minute_history() {
        let c = resolve(&[], &[], None).unwrap();
        assert!(!c.otlp_receiver.enabled());
        assert_eq!(c.otlp_receiver.history, Duration::from_secs(600));
    }

    #[test]
    fn a_bare_port_binds_loopback_and_flags_beat_env_beat_file() {
        let file = "[otlp_receiver]\ngrpc = \"0.0.0.0:14317\"\nhttp = \"14318\"\nenrich_history = \"2m\"\n";
        let c = resolve(
            &["--otlp-receiver-http", "24318"],
            &[("GPULSE_OTLP_RECEIVER_GRPC", ":24317")],
            Some(file),
        )
        .unwrap();
        assert_eq!(
            c.otlp_receiver.http,
            Some("127.0.0.1:24318".parse().unwrap())
        );
        assert_eq!(
            c.otlp_receiver.grpc,
            Some("127.0.0.1:24317".parse().unwrap())
        );
        assert_eq!(c.otlp_receiver.history, Duration::from_secs(120));
        let c = resolve(&[], &[], Some(file)).unwrap();
        assert_eq!(c.otlp_receiver.grpc, Some("0.0.0.0:14317".parse().unwrap()));
        assert_eq!(
            c.otlp_receiver.http,
            Some("127.0.0.1:14318".parse().unwrap())
        );
    }

    #[test]
    fn a_receiver_on_the_exporters_own_address_is_refused() {
        // The default exporter endpoint is http://localhost:4318.
        let err = resolve(&["--otlp-receiver-http", "4318"], &[], None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--otlp-receiver-http") && text.contains("forwarded to gpulse itself"),
            "{text}"
        );
        let err = resolve(
            &["--otlp-receiver-grpc", "4317"],
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("forwarded to gpulse itself"),
            "{err}"
        );
        // Another port, or an upstream elsewhere, is fine.
        resolve(
            &["--otlp-receiver-http", "4318"],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
            None,
        )
        .unwrap();
        let err = resolve(
            &[
                "--otlp-receiver-http",
                "4318",
                "--otlp-receiver-grpc",
                "4318",
            ],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("same address"), "{err}");
    }

    #[test]
    fn bad_values_name_the_setting() {
        let err = resolve(&["--otlp-receiver-http", "nope"], &[], None).unwrap_err();
        assert!(err.to_string().contains("--otlp-receiver-http"), "{err}");
        let err = resolve(&[], &[("GPULSE_ENRICH_HISTORY", "0s")], None).unwrap_err();
        assert!(err.to_string().contains("GPULSE_ENRICH_HISTORY"), "{err}");
        let err = LoadedFile::parse(
            Path::new("/etc/gpulse.toml"),
            "[otlp_receiver]\nport = 1\n".into(),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("/etc/gpulse.toml:2:1"), "{err}");
    }

    #[test]
    fn traces_go_to_v1_traces_or_their_own_endpoint() {
        let traces = |env: &[(&str, &str)]| match resolve(&[], env, None).unwrap().export.exporter {
            ExporterKind::Otlp { traces, .. } => traces,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            traces(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/base/")]).url,
            "http://c:4318/base/v1/traces"
        );
        let t = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://tempo:4318/otlp/traces",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=a"),
        ]);
        assert_eq!(t.url, "http://tempo:4318/otlp/traces");
        assert_eq!(t.headers.len(), 1);
        let from_file = match resolve(
            &[],
            &[],
            Some("[otlp.traces]\nendpoint = \"http://jaeger:4318/v1/traces\"\n"),
        )
        .unwrap()
        .export
        .exporter
        {
            ExporterKind::Otlp {
                traces, metrics, ..
            } => {
                assert_eq!(metrics.url, "http://localhost:4318/v1/metrics");
                traces
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(from_file.url, "http://jaeger:4318/v1/traces");
    }
}
