//! Integration tests: the framework layer of diagnosis end to end. `gpulse run` against nvml-sim,
//! whose scenario lists real processes (sleeping children of this test, so their CPU is idle)
//! as GPU processes; this test sends, through gpulse's own OTLP/HTTP receiver, what the PyTorch
//! companion sends for each of them (resources naming the child's `process.pid`, matched as
//! spans are for enrichment): the allocator gauges `pytorch.cuda.memory.*` with `hw.id`, and
//! `step` spans with `data_wait` children. A real OTLP receiver upstream gets the findings'
//! log records; `/status` on the health address is read as the companion reads it.
//!
//! - GPU 0, busy, NVML memory flat for both processes: LEAK's `allocated` grows 32 MiB/s →
//!   `memory_growth` at that rate (NVML alone would see nothing); FLAT's stays flat → nothing.
//! - GPU 1, 25 % busy: INPUT waits on data 70 % of each step with an idle CPU → `input_bound`,
//!   I/O-bound, `data_wait_ratio` ≈ 0.7 (the CPU-only inference would not fire); NOWAIT waits
//!   10 % → nothing.
//! - GPU 2, 88 % of its memory used: FRAG reserves 38 GiB for 20 GiB of tensors →
//!   `memory_fragmentation`; TIGHT reserves 28 GiB for 27 GiB → nothing.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use serde_json::Value;

use crate::common::{Receiver, ReceiverOptions};
use crate::kernel::ChildGuard;
use crate::run::{attr, attr_str, Gpulse};

const GPU0: &str = "GPU-f0f0f0f0-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-f1f1f1f1-0000-0000-0000-000000000001";
const GPU2: &str = "GPU-f2f2f2f2-0000-0000-0000-000000000002";

const SCENARIO: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f0f0f0f0-0000-0000-0000-000000000000"
memory_total_mib = 81559
memory_reserved_mib = 512
[device.signals]
gpu_util = 90
power_w = 500
[[device.process]]
pid_env = "FW_LEAK_PID"
name = "python3"
memory_used_mib = 20480
sm_util = 80
[[device.process]]
pid_env = "FW_FLAT_PID"
name = "python3"
memory_used_mib = 20480
sm_util = 10

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f1f1f1f1-0000-0000-0000-000000000001"
memory_total_mib = 81559
memory_reserved_mib = 512
[device.signals]
gpu_util = 25
power_w = 150
[[device.process]]
pid_env = "FW_INPUT_PID"
name = "python3"
memory_used_mib = 8192
sm_util = 20
[[device.process]]
pid_env = "FW_NOWAIT_PID"
name = "python3"
memory_used_mib = 8192
sm_util = 20

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-f2f2f2f2-0000-0000-0000-000000000002"
memory_total_mib = 81559
memory_reserved_mib = 512
[device.signals]
gpu_util = 90
power_w = 600
[[device.process]]
pid_env = "FW_FRAG_PID"
name = "python3"
memory_used_mib = 40960
sm_util = 50
[[device.process]]
pid_env = "FW_TIGHT_PID"
name = "python3"
memory_used_mib = 30720
sm_util = 40
"#;

/// Short durations so every finding starts within seconds of 1 s windows.
const CONFIG: &str = r#"
[diagnosis]
clear_after_windows = 2

[diagnosis.memory_growth]
min_duration = "4s"
min_windows = 4
min_rate_bytes_per_second = 1048576

[diagnosis.input_bound]
step_lookback = "10s"
min_steps = 5

[diagnosis.memory_fragmentation]
min_duration = "3s"

[diagnosis.idle_holder]
enabled = false
"#;

const GIB: i64 = 1024 * 1024 * 1024;
/// LEAK's allocated growth.
const LEAK_RATE: f64 = 32.0 * 1024.0 * 1024.0;
/// Every finding must have started by then, on a loaded 2-core CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The resource the companion's SDK would send for a process of this PID namespace.
fn resource(pid: u32) -> Option<Resource> {
    Some(Resource {
        attributes: vec![
            kv(
                "service.name",
                any_value::Value::StringValue("trainer".into()),
            ),
            kv("process.pid", any_value::Value::IntValue(i64::from(pid))),
        ],
        ..Default::default()
    })
}

/// The three allocator gauges of one process on one device at `at`.
fn allocator(pid: u32, hw_id: &str, at: u64, allocated: i64, reserved: i64) -> ResourceMetrics {
    let gauge = |name: &str, value: i64| Metric {
        name: name.into(),
        unit: "By".into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![NumberDataPoint {
                time_unix_nano: at,
                value: Some(number_data_point::Value::AsInt(value)),
                attributes: vec![kv("hw.id", any_value::Value::StringValue(hw_id.into()))],
                ..Default::default()
            }],
        })),
        ..Default::default()
    };
    ResourceMetrics {
        resource: resource(pid),
        scope_metrics: vec![ScopeMetrics {
            metrics: vec![
                gauge("pytorch.cuda.memory.allocated", allocated),
                gauge("pytorch.cuda.memory.reserved", reserved),
                gauge("pytorch.cuda.memory.max_allocated", allocated),
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One `step` span over `[start, end]` whose `data_wait` child takes `wait` of it, and a run
/// span with the DataLoader settings.
pub fn step(pid: u32, n: u64, start: u64, end: u64, wait: f64) -> ResourceSpans {
    let trace_id = vec![9; 16];
    let step_id = (n * 2 + 1).to_be_bytes().to_vec();
    let wait_end = start + ((end - start) as f64 * wait) as u64;
    ResourceSpans {
        resource: resource(pid),
        scope_spans: vec![ScopeSpans {
            spans: vec![
                Span {
                    trace_id: trace_id.clone(),
                    span_id: step_id.clone(),
                    name: "step".into(),
                    start_time_unix_nano: start,
                    end_time_unix_nano: end,
                    ..Default::default()
                },
                Span {
                    trace_id: trace_id.clone(),
                    span_id: (n * 2 + 2).to_be_bytes().to_vec(),
                    parent_span_id: step_id,
                    name: "data_wait".into(),
                    start_time_unix_nano: start,
                    end_time_unix_nano: wait_end,
                    ..Default::default()
                },
                Span {
                    trace_id,
                    span_id: u64::MAX.to_be_bytes().to_vec(),
                    name: "epoch".into(),
                    start_time_unix_nano: start,
                    end_time_unix_nano: end,
                    attributes: vec![
                        kv(
                            "pytorch.dataloader.num_workers",
                            any_value::Value::IntValue(2),
                        ),
                        kv(
                            "pytorch.dataloader.pin_memory",
                            any_value::Value::BoolValue(false),
                        ),
                    ],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One HTTP/1.1 request over a fresh connection; the status and the body.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to gpulse");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-protobuf\r\n\
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
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    (status, body)
}

fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16)
            .expect("chunk size");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

/// A finding's log record with its resource.
#[derive(Debug)]
struct Record {
    resource: Value,
    record: Value,
}

impl Record {
    fn attr(&self, key: &str) -> Option<String> {
        attr_str(&self.record["attributes"], key)
    }

    fn double(&self, key: &str) -> f64 {
        attr(&self.record["attributes"], key)
            .and_then(|v| v["doubleValue"].as_f64())
            .unwrap_or_else(|| panic!("{key} missing or not a double: {:?}", self.record))
    }

    fn is(&self, rule: &str, pid: u32) -> bool {
        self.attr("gpulse.diagnosis.rule").as_deref() == Some(rule)
            && self.attr("process.pid") == Some(pid.to_string())
    }
}

fn records(requests: &[Value]) -> Vec<Record> {
    requests
        .iter()
        .filter(|r| r["signal"] == "logs" && r["answer"] == "ok")
        .flat_map(|r| {
            r["request"]["resourceLogs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|rl| {
            let resource = rl["resource"].clone();
            rl["scopeLogs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .flat_map(|sl| sl["logRecords"].as_array().cloned().unwrap_or_default())
                .map(move |record| Record {
                    resource: resource.clone(),
                    record,
                })
        })
        .filter(|r| r.attr("gpulse.diagnosis.rule").is_some())
        .collect()
}

fn listing(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| {
            format!(
                "{:?} {:?} pid={:?}: {}",
                r.attr("gpulse.diagnosis.rule"),
                r.attr("gpulse.diagnosis.state"),
                r.attr("process.pid"),
                r.record["body"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sleeper() -> ChildGuard {
    ChildGuard::spawn(Command::new("sleep").arg("300")).expect("spawn sleep")
}

#[test]
fn framework_telemetry_through_the_receiver_drives_the_rules() {
    let children: Vec<ChildGuard> = (0..6).map(|_| sleeper()).collect();
    let [leak, flat, input, nowait, frag, tight] = [0, 1, 2, 3, 4, 5].map(|i| children[i].pid());
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gpulse.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    let upstream = Receiver::start(ReceiverOptions::default());
    let (receiver_port, health_port) = (free_port(), free_port());
    let gpulse = Gpulse::start(
        SCENARIO,
        &[],
        &[
            "--config",
            config.to_str().expect("UTF-8 temp path"),
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--otlp-receiver-http",
            &receiver_port.to_string(),
            "--health-addr",
            &format!("127.0.0.1:{health_port}"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", upstream.http_base()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
            ("FW_LEAK_PID", leak.to_string()),
            ("FW_FLAT_PID", flat.to_string()),
            ("FW_INPUT_PID", input.to_string()),
            ("FW_NOWAIT_PID", nowait.to_string()),
            ("FW_FRAG_PID", frag.to_string()),
            ("FW_TIGHT_PID", tight.to_string()),
        ],
    );
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", receiver_port)).is_err() {
        if started.elapsed() > Duration::from_secs(20) {
            let (_, stderr) = gpulse.terminate();
            panic!("gpulse's OTLP receiver did not come up: {stderr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Before the first window closes, /status says so in JSON.
    let (status, body) = http(health_port, "GET", "/status", b"");
    if status == 503 {
        let json: Value = serde_json::from_slice(&body).expect("a JSON error");
        assert!(
            json["error"].as_str().unwrap_or("").contains("pending"),
            "{json}"
        );
    }

    let t0 = now_nanos();
    let mut step_start = t0;
    let mut n = 0u64;
    let wanted = |r: &[Record]| {
        r.iter().any(|r| r.is("memory_growth", leak))
            && r.iter().any(|r| r.is("input_bound", input))
            && r.iter().any(|r| r.is("memory_fragmentation", frag))
    };
    // Send as the companion would, every 250 ms, until every finding has started, then 3 s
    // more, so that a finding that should not start has had as long as those that did.
    let mut all_started: Option<Instant> = None;
    loop {
        let at = now_nanos();
        let elapsed = (at - t0) as f64 / 1e9;
        let metrics = ExportMetricsServiceRequest {
            resource_metrics: vec![
                allocator(
                    leak,
                    GPU0,
                    at,
                    4 * GIB + (LEAK_RATE * elapsed) as i64,
                    16 * GIB,
                ),
                allocator(flat, GPU0, at, 4 * GIB, 16 * GIB),
                allocator(frag, GPU2, at, 20 * GIB, 38 * GIB),
                allocator(tight, GPU2, at, 27 * GIB, 28 * GIB),
            ],
        };
        let (status, body) = http(
            receiver_port,
            "POST",
            "/v1/metrics",
            &metrics.encode_to_vec(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let traces = ExportTraceServiceRequest {
            resource_spans: vec![
                step(input, n, step_start, at, 0.7),
                step(nowait, n, step_start, at, 0.1),
            ],
        };
        let (status, body) = http(receiver_port, "POST", "/v1/traces", &traces.encode_to_vec());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        step_start = at;
        n += 1;

        if all_started.is_none() && wanted(&records(&upstream.requests())) {
            all_started = Some(Instant::now());
        }
        if all_started.is_some_and(|at| at.elapsed() > Duration::from_secs(3)) {
            break;
        }
        if started.elapsed() > DEADLINE {
            let got = records(&upstream.requests());
            let (status, stderr) = gpulse.terminate();
            panic!(
                "not every framework finding started within {DEADLINE:?}. Records:\n{}\n\
                 gpulse ({status}) stderr:\n{stderr}",
                listing(&got)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    // /status: the snapshot contract from the running pipeline, this process's findings in it.
    let (status, body) = http(health_port, "GET", "/status", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let view: Value = serde_json::from_slice(&body).expect("/status is JSON");
    let leak_process = view["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == leak)
        .unwrap_or_else(|| panic!("pid {leak} not in /status: {view}"));
    assert_eq!(leak_process["device_uuid"], GPU0);
    assert_eq!(leak_process["workload"]["vpid"], leak, "{leak_process}");
    assert!(leak_process["usage"].is_object(), "{leak_process}");
    let growth = view["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["rule"] == "memory_growth" && f["subject"]["pid"] == leak)
        .unwrap_or_else(|| panic!("no memory_growth of {leak} in /status: {view}"));
    assert_eq!(growth["evidence"], serde_json::json!(["nvml", "metrics"]));
    assert!(view["window"]["end"].as_f64().is_some(), "{view}");
    assert_eq!(view["devices"].as_array().map(Vec::len), Some(3));

    let (exit, stderr) = gpulse.terminate();
    assert!(exit.success(), "gpulse run exited with {exit}: {stderr}");
    let got = records(&upstream.requests());
    let all = listing(&got);

    // memory_growth: on LEAK's own resource, at the rate sent.
    let growth = got
        .iter()
        .find(|r| r.is("memory_growth", leak))
        .expect("checked above");
    assert_eq!(
        attr_str(&growth.resource["attributes"], "process.pid"),
        Some(leak.to_string()),
        "the finding goes under the process's resource"
    );
    let rate = growth.double("gpulse.diagnosis.value.allocated_growth_bytes_per_second");
    assert!(
        (rate - LEAK_RATE).abs() <= LEAK_RATE * 0.02,
        "allocated growth {rate} B/s, sent {LEAK_RATE} B/s"
    );
    assert_eq!(
        growth.attr("gpulse.diagnosis.evidence").as_deref(),
        Some("nvml,metrics")
    );
    // About 40 GiB free at 32 MiB/s fills the device in about 21 minutes: within the default
    // urgent_time_to_full (1 h), so an error.
    let time_to_full = growth.double("gpulse.diagnosis.value.time_to_full_seconds");
    assert!(
        (900.0..1800.0).contains(&time_to_full),
        "time to full {time_to_full} s"
    );
    assert_eq!(
        growth.attr("gpulse.diagnosis.severity").as_deref(),
        Some("error")
    );
    assert!(
        !got.iter().any(|r| r.is("memory_growth", flat)),
        "flat allocated memory must give no memory_growth:\n{all}"
    );

    // input_bound: the spans decide, with an idle CPU: an I/O-bound loader.
    let input_bound = got
        .iter()
        .find(|r| r.is("input_bound", input))
        .expect("checked above");
    assert_eq!(input_bound.attr("hw.id").as_deref(), Some(GPU1));
    let ratio = input_bound.double("gpulse.diagnosis.value.data_wait_ratio");
    assert!((ratio - 0.7).abs() < 0.03, "data_wait_ratio {ratio}");
    assert_eq!(
        input_bound
            .attr("gpulse.diagnosis.value.loader_bound")
            .as_deref(),
        Some("io"),
        "{:?}",
        input_bound.record
    );
    let advice = input_bound
        .attr("gpulse.diagnosis.advice")
        .unwrap_or_default();
    assert!(
        advice.contains("num_workers=2") && advice.contains("pin_memory=false"),
        "the advice names the loader settings the run reported: {advice}"
    );
    assert!(input_bound
        .attr("gpulse.diagnosis.evidence")
        .is_some_and(|e| e.contains("spans")));
    assert!(
        !got.iter().any(|r| r.is("input_bound", nowait)),
        "10 % data wait is not input-bound:\n{all}"
    );

    // memory_fragmentation: 18 GiB of 38 GiB reserved unused on a device 88 % full.
    let frag_record = got
        .iter()
        .find(|r| r.is("memory_fragmentation", frag))
        .expect("checked above");
    assert_eq!(
        frag_record
            .attr("gpulse.diagnosis.value.unused_reserved_bytes")
            .as_deref(),
        Some((18 * GIB).to_string().as_str())
    );
    assert!(frag_record
        .attr("gpulse.diagnosis.advice")
        .is_some_and(|a| a.contains("expandable_segments:True")));
    assert!(
        !got.iter().any(|r| r.is("memory_fragmentation", tight)),
        "1 GiB unused of 28 GiB is not fragmentation:\n{all}"
    );
}
