//! Entry points for the coverage-guided fuzz targets in `fuzz/` (cargo-fuzz, libFuzzer): one
//! function per parser of input that comes from outside gpulse, taking the fuzzer's bytes and
//! driving the same code the running program does. Every bad input must end in an error or be
//! ignored, never in a panic; a crash the fuzzer finds becomes a regression test beside the
//! parser it hit (docs/reliability.md, "Fuzzing").
//!
//! Hidden from the documentation: it exists for `fuzz/`, whose targets cannot reach the crate's
//! private parsers otherwise, and is no API.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use crate::attribution::podresources::{flatten, proto::ListPodResourcesResponse, PodIndex};
use crate::attribution::{cgroup, devicefile, environ, procfs};
use crate::cli::{GlobalArgs, InspectArgs, RunArgs};
use crate::config::{env, Config, InspectConfig, LoadedFile};
use crate::diagnosis::framework::{FrameworkHandle, FrameworkLimits};
use crate::enrich::grpc::OtlpGrpc;
use crate::enrich::{Intake, IntakeSettings, ProcessIdentity, SampleHistoryHandle, SpanObserver};
use crate::export::queue::{BackoffPolicy, DeliveryQueue, QueueLimits};
use crate::export::transport::{EncodedRequest, SendError, SendOutcome, Signal, Transport};
use crate::sampling::{
    DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample, Snapshot,
};
use crate::schema::DeviceField;

/// One request to the OTLP receiver: the first byte picks the carrier, signal and encoding, the
/// rest is the body (for gRPC with its own 5-byte message framing, as on the wire).
///
/// Selector bits: 0–1 the signal (traces, metrics, logs; 3 is a path that is none of them),
/// 2 gRPC instead of HTTP, 3 compressed (`Content-Encoding: gzip` or `grpc-encoding: gzip`),
/// 4 (HTTP) `Content-Type: application/json`. The intake forwards into a queue that is never
/// drained, and enriches against a history of two GPU processes (see [`receiver_history`]), so
/// decoding, resource matching, framework bookkeeping and re-encoding all run.
pub fn otlp_receiver(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let signal = match selector & 0b11 {
        0 => Some(Signal::Traces),
        1 => Some(Signal::Metrics),
        2 => Some(Signal::Logs),
        _ => None,
    };
    let grpc = selector & 0b100 != 0;
    let compressed = selector & 0b1000 != 0;
    let json = selector & 0b1_0000 != 0;
    let intake = receiver_intake();
    let body = Bytes::copy_from_slice(body);
    runtime().block_on(async move {
        if grpc {
            let path = signal.map_or(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Nope",
                |s| s.grpc_path(),
            );
            let mut request = http::Request::builder()
                .method(http::Method::POST)
                .uri(path)
                .header(http::header::CONTENT_TYPE, "application/grpc");
            if compressed {
                request = request.header("grpc-encoding", "gzip");
            }
            let request = request.body(Full::new(body)).expect("a fixed request");
            let mut service = OtlpGrpc::new(intake);
            let response = tower::Service::call(&mut service, request)
                .await
                .expect("infallible");
            let _ = response.into_body().collect().await;
        } else {
            let path = match signal {
                Some(Signal::Traces) => "/v1/traces",
                Some(Signal::Metrics) => "/v1/metrics",
                Some(Signal::Logs) => "/v1/logs",
                None => "/v1/profiles",
            };
            let content_type = if json {
                "application/json"
            } else {
                "application/x-protobuf"
            };
            let mut request = http::Request::builder()
                .method(http::Method::POST)
                .uri(path)
                .header(http::header::CONTENT_TYPE, content_type);
            if compressed {
                request = request.header(http::header::CONTENT_ENCODING, "gzip");
            }
            let request = request.body(Full::new(body)).expect("a fixed request");
            let _ = crate::enrich::http::handle(&intake, request, None).await;
        }
    });
}

/// The runtime the receiver's async handlers run on, made once per fuzzing process.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// A transport that is never called: the queue's sender task is not spawned.
struct Unsent;

impl Transport for Unsent {
    async fn send(&self, _: Signal, _: &EncodedRequest) -> Result<SendOutcome, SendError> {
        Ok(SendOutcome::default())
    }
}

/// A fresh intake per input (so its queue never fills across inputs), forwarding into a queue of
/// 64 MiB, with framework bookkeeping and `gpulse record`'s span observer as `gpulse run
/// --otlp-receiver-*` and `gpulse record` have them.
fn receiver_intake() -> Arc<Intake> {
    let max_bytes = 64 << 20;
    let (queue, _sender) = DeliveryQueue::new(
        QueueLimits {
            max_bytes,
            max_age: Duration::from_secs(3600),
        },
        BackoffPolicy::default(),
        Unsent,
    );
    let settings = IntakeSettings {
        // Every history PID is identified up front, so nothing is read from here.
        proc_root: "/nonexistent/gpulse-fuzz-proc".into(),
        max_queue_bytes: max_bytes,
        // A span ending after the newest sample must not make the fuzzer wait.
        max_wait: Duration::ZERO,
    };
    let observer = SpanObserver(Arc::new(|request: &ExportTraceServiceRequest| {
        let _ = crate::record::training_spans::training_spans(request);
    }));
    Arc::new(
        Intake::new(queue, receiver_history().clone(), settings)
            .with_framework(FrameworkHandle::new(FrameworkLimits::default()))
            .with_span_observer(observer),
    )
}

/// The container of the receiver's known process (fuzz/make_seeds.py names it too).
const RECEIVER_CONTAINER_ID: &str =
    "c0ffee0000000000000000000000000000000000000000000000000000000000";

/// GPU processes the seeds' spans name: PID 42 (PID 7 in its namespace, container
/// [`RECEIVER_CONTAINER_ID`], `service.instance.id` `trainer-0`) on GPU-a and PID 43 on GPU-b,
/// sampled every second from t = 100 s to 110 s after the epoch.
fn receiver_history() -> &'static SampleHistoryHandle {
    static HISTORY: OnceLock<SampleHistoryHandle> = OnceLock::new();
    HISTORY.get_or_init(|| {
        let history = SampleHistoryHandle::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=110 {
            history.record(&Snapshot {
                at: UNIX_EPOCH + Duration::from_secs(t),
                driver_version: None,
                cuda_driver_version: None,
                nvml_version: None,
                devices: vec![device(0, "GPU-a", 0.5), device(1, "GPU-b", 0.9)],
                processes: vec![process(42, 0, "GPU-a"), process(43, 1, "GPU-b")],
                events: Vec::new(),
            });
        }
        {
            let mut writer = history.write();
            writer.note_identity(
                42,
                ProcessIdentity {
                    vpid: Some(7),
                    container_id: Some(RECEIVER_CONTAINER_ID.into()),
                    service_instance_id: Some("trainer-0".into()),
                },
            );
            writer.note_identity(43, ProcessIdentity::default());
        }
        history
    })
}

fn device(index: u32, uuid: &str, util: f64) -> DeviceSample {
    let info = Arc::new(DeviceInfo {
        index,
        uuid: uuid.into(),
        name: "fuzz".into(),
        pci_bus_id: format!("0000000{index}:00:00.0"),
        serial: None,
        minor_number: Some(index),
        memory_total_bytes: Some(80 << 30),
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        compute_capability: None,
        fan_count: None,
    });
    let mut sample = DeviceSample::empty(info, DeviceStatus::Ok);
    sample.set(DeviceField::UtilizationGpu, Some(util));
    sample.set(DeviceField::Power, Some(300.0));
    sample
}

fn process(pid: u32, device_index: u32, uuid: &str) -> ProcessSample {
    ProcessSample {
        pid,
        device_index,
        device_uuid: uuid.into(),
        kind: ProcessKind::Compute,
        gpu_memory_bytes: Some(4 << 30),
        sm_utilization: Some(0.5),
        memory_utilization: None,
        encoder_utilization: None,
        decoder_utilization: None,
        mig: None,
    }
}

/// The configuration sources: environment variables (`NAME=value` lines) before the first NUL
/// byte, the config file (TOML) after it; without a NUL, all of it is the file. Resolved as
/// `gpulse run` and `gpulse snapshot` resolve them, errors rendered as the user would read
/// them. `GPULSE_CONFIG` is left out: the file is the input's, not one named on disk.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (env_text, file_text) = text.split_once('\0').unwrap_or(("", &text));
    let vars: HashMap<&str, &str> = env_text
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| *name != env::CONFIG)
        .collect();
    let lookup = |name: &str| vars.get(name).map(|v| (*v).to_string());
    let file = match LoadedFile::parse(Path::new("fuzz.toml"), file_text.to_string()) {
        Ok(file) => Some(file),
        Err(e) => {
            let _ = e.to_string();
            None
        }
    };
    let global = GlobalArgs::default();
    if let Err(e) = Config::resolve_with_file(&global, &RunArgs::default(), &lookup, file.as_ref())
    {
        let _ = e.to_string();
    }
    if let Err(e) =
        InspectConfig::resolve_with_file(&global, &InspectArgs::default(), &lookup, file.as_ref())
    {
        let _ = e.to_string();
    }
}

/// The `/proc` files attribution, usage, span enrichment and `gpulse record` read: every parser
/// is given the whole input, as if it were that file (`<pid>/stat`, `status`, `cmdline`,
/// `cgroup`, `environ` and the identity resolved from it, `/proc/stat`'s `btime`, `passwd`,
/// `net/tcp`, a `fd` link target, a cgroup's `cpu.max`/`cpu.cfs_*`).
pub fn proc_files(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(stat) = procfs::parse_stat(&text) {
        let _ = procfs::creation_time(1_700_000_000, stat.start_time_ticks, 100);
    }
    if let Some(boot) = procfs::parse_boot_time(&text) {
        let _ = procfs::creation_time(boot, u64::MAX, 100);
    }
    let _ = procfs::parse_status(&text).vpid();
    let _ = procfs::parse_cmdline(data);
    let _ = procfs::parse_passwd(&text);
    let _ = procfs::executable_name(Path::new(text.as_ref()));
    let _ = cgroup::parse_cgroup(&text);
    let _ = environ::resolve_identity(&environ::scan_environ(data));
    let _ = devicefile::nvidia_minor_of_link(Path::new(text.as_ref()));
    let _ = crate::attribution::cpu_quota::parse_cpu_max(&text);
    let _ = crate::attribution::cpu_quota::parse_cfs_value(&text);
    let local = "127.0.0.1:4317".parse().expect("an address");
    let remote = "127.0.0.1:40000".parse().expect("an address");
    let _ = crate::enrich::peer::find_socket_inode(&text, local, remote);
    for line in text.lines() {
        let _ = crate::enrich::peer::parse_proc_addr(line);
    }
}

/// The kubelet's `List` answer (`v1.ListPodResourcesResponse` protobuf), flattened, indexed and
/// matched against every device id it names, as attribution does.
pub fn pod_resources(data: &[u8]) {
    let Ok(response) = ListPodResourcesResponse::decode(data) else {
        return;
    };
    let containers = flatten(response);
    let index = PodIndex::new(&containers);
    for entry in &containers {
        let _ = index.match_devices(entry.device_ids.iter().map(String::as_str));
    }
}

/// `gpulse report`'s readers of OTLP/JSON lines (one node's, and the job report's), then the
/// reports they render from what they read, or the error messages they would print.
pub fn otlp_json(data: &[u8]) {
    match crate::record::otlp_json_reader::read(data, Path::new("fuzz.jsonl")) {
        Ok(recording) => {
            let _ = crate::record::html::render(&recording);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // The job report's reader of the same lines, its answers, summary and page.
    let read = crate::record::job::node::read(data, Path::new("fuzz.jsonl"));
    let nodes = read.node.into_iter().collect();
    match crate::record::job::report_of(nodes, read.problems, None, &Default::default()) {
        Ok(report) => {
            let _ = report.render_text();
            let _ = crate::record::job::page::render(&report);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// A dcgm-exporter counters CSV (`--dcgm-counters`), read as `gpulse run` reads it, under
/// both `--dcgm-counters-unknown` modes, errors rendered as printed.
pub fn dcgm_counters(data: &[u8]) {
    use crate::config::dcgm_counters::{parse, UnknownCounters};
    for unknown in [UnknownCounters::Error, UnknownCounters::Warn] {
        let mut warnings = Vec::new();
        if let Err(e) = parse(data, Path::new("fuzz.csv"), unknown, &mut warnings) {
            let _ = e.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The committed seeds, and the inputs of crashes found (fuzz/regressions/), of one target.
    fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut found = Vec::new();
        for dir in [
            root.join("seeds").join(target),
            root.join("regressions").join(target),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let data = std::fs::read(&path).expect("a readable input");
                found.push((path, data));
            }
        }
        found
    }

    #[test]
    fn every_seed_and_past_crash_runs_through_its_target() {
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 6] = [
            ("otlp_receiver", otlp_receiver),
            ("config", config),
            ("proc_files", proc_files),
            ("pod_resources", pod_resources),
            ("otlp_json", otlp_json),
            ("dcgm_counters", dcgm_counters),
        ];
        for (target, run) in targets {
            let inputs = inputs(target);
            assert!(!inputs.is_empty(), "fuzz/seeds/{target} has no seeds");
            for (path, data) in inputs {
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{} panicked in {target}", path.display());
            }
        }
    }

    /// The receiver target reaches enrichment: the seed of two spans of PID 42 inside the
    /// history's time has both given GPU attributes, so the fuzzer explores that code and not
    /// only the decoder.
    #[test]
    fn the_receiver_target_enriches_spans_of_its_known_process() {
        let seed = inputs("otlp_receiver")
            .into_iter()
            .find(|(path, _)| path.ends_with("traces-pid-http"))
            .expect("the seed fuzz/seeds/otlp_receiver/traces-pid-http");
        let (selector, body) = seed.1.split_first().expect("a selector byte");
        assert_eq!(*selector, 0, "HTTP, traces, uncompressed");
        let accepted = runtime()
            .block_on(receiver_intake().accept(Signal::Traces, Bytes::copy_from_slice(body), None))
            .expect("accepted");
        assert_eq!((accepted.items, accepted.enriched), (2, 2));
    }
}
