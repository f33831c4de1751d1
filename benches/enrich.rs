//! Cost of the local OTLP receiver's span enrichment (`gpulse::enrich`), on a node of 8 GPUs ×
//! 64 processes with a full 10-minute history of 1 s samples:
//!
//! - `enrich/record_8x64`: adding one snapshot to the history (done once per sample).
//! - `enrich/spans_512`: enriching a 512-span batch (an SDK's default batch) of one process,
//!   in memory: throughput in spans/s.
//! - `enrich/intake_512/{enriched,unmatched}`: the whole path a received batch takes before it
//!   is answered (decode, match, enrich, re-encode, queue), for a batch of a known process and
//!   for one gpulse does not know (decoded and queued as received): the difference is the
//!   latency enrichment adds per forwarded batch.
//!
//! The history's memory is printed once (`approx_bytes`), for 1 s and 100 ms sampling.
//! Run: `cargo bench --bench enrich`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpulse::enrich::span_attributes::{enrich_request, MatchedBy};
use gpulse::enrich::{Intake, IntakeSettings, SampleHistory, SampleHistoryHandle};
use gpulse::export::queue::{BackoffPolicy, DeliveryQueue, QueueLimits};
use gpulse::export::transport::{EncodedRequest, SendError, SendOutcome, Signal, Transport};
use gpulse::sampling::{
    DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample, Snapshot,
};
use gpulse::schema::DeviceField;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;

const GPUS: usize = 8;
const PROCS: u32 = 64;
const SPANS: usize = 512;
const T0: u64 = 1_700_000_000;

fn devices() -> Vec<Arc<DeviceInfo>> {
    (0..GPUS)
        .map(|i| {
            Arc::new(DeviceInfo {
                index: i as u32,
                uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
                serial: None,
                minor_number: Some(i as u32),
                memory_total_bytes: Some(80 << 30),
                max_sm_clock_mhz: None,
                max_memory_clock_mhz: None,
                compute_capability: None,
                fan_count: None,
            })
        })
        .collect()
}

fn snapshot(infos: &[Arc<DeviceInfo>], at: SystemTime, tick: u64) -> Snapshot {
    let devices = infos
        .iter()
        .map(|info| {
            let mut d = DeviceSample::empty(Arc::clone(info), DeviceStatus::Ok);
            d.set(
                DeviceField::UtilizationGpu,
                Some(((tick % 100) as f64) / 100.0),
            );
            d.set(DeviceField::Power, Some(300.0 + (tick % 50) as f64));
            d
        })
        .collect();
    let processes = (0..PROCS)
        .map(|p| {
            let info = &infos[p as usize % GPUS];
            ProcessSample {
                pid: 10_000 + p,
                device_index: info.index,
                device_uuid: info.uuid.clone(),
                kind: ProcessKind::Compute,
                gpu_memory_bytes: Some(u64::from(p + 1) << 28),
                sm_utilization: Some(0.1),
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
                mig: None,
            }
        })
        .collect();
    Snapshot {
        at,
        driver_version: None,
        cuda_driver_version: None,
        nvml_version: None,
        devices,
        processes,
        events: Vec::new(),
    }
}

/// Ten minutes of 1 s samples ending at `T0 + 600`.
fn full_history(interval: Duration) -> SampleHistory {
    let infos = devices();
    let mut history = SampleHistory::new(Duration::from_secs(600), interval);
    let n = (600.0 / interval.as_secs_f64()) as u64;
    for tick in 0..=n {
        let at = UNIX_EPOCH + Duration::from_secs(T0) + interval * tick as u32;
        history.record(&snapshot(&infos, at, tick));
    }
    history
}

/// 512 spans of 50 ms each over the last minute, from process 10 007.
fn batch(pid: u32) -> ExportTraceServiceRequest {
    let start = (T0 + 540) * 1_000_000_000;
    let spans = (0..SPANS)
        .map(|i| Span {
            trace_id: vec![1; 16],
            span_id: (i as u64 + 1).to_be_bytes().to_vec(),
            name: "train_step".into(),
            start_time_unix_nano: start + i as u64 * 100_000_000,
            end_time_unix_nano: start + i as u64 * 100_000_000 + 50_000_000,
            attributes: vec![KeyValue {
                key: "step".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(i as i64)),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "process.pid".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::IntValue(i64::from(pid))),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Accepts everything at once: the bench measures gpulse's side only.
struct Discard;

impl Transport for Discard {
    async fn send(&self, _: Signal, _: &EncodedRequest) -> Result<SendOutcome, SendError> {
        Ok(SendOutcome::default())
    }
}

fn benches(c: &mut Criterion) {
    for interval in [Duration::from_secs(1), Duration::from_millis(100)] {
        let h = full_history(interval);
        eprintln!(
            "history of 10 min at {interval:?}, {GPUS} GPUs x {PROCS} processes: {} frames, ~{:.2} MiB",
            h.len(),
            h.approx_bytes() as f64 / ((1u64 << 20) as f64)
        );
    }

    let infos = devices();
    let mut group = c.benchmark_group("enrich");
    {
        let mut history = full_history(Duration::from_secs(1));
        let mut tick = 601u64;
        group.bench_function("record_8x64", |b| {
            b.iter(|| {
                tick += 1;
                let at = UNIX_EPOCH + Duration::from_secs(T0 + tick);
                history.record(black_box(&snapshot(&infos, at, tick)));
            })
        });
    }

    let history = full_history(Duration::from_secs(1));
    let request = batch(10_007);
    let pids = vec![Some((10_007, MatchedBy::Resource))];
    group.throughput(Throughput::Elements(SPANS as u64));
    group.bench_function("spans_512", |b| {
        b.iter_batched(
            || request.clone(),
            |mut r| black_box(enrich_request(&mut r, &pids, &history)),
            criterion::BatchSize::SmallInput,
        )
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (queue, sender) = DeliveryQueue::new(
        QueueLimits {
            max_bytes: 512 << 20,
            max_age: Duration::from_secs(60),
        },
        BackoffPolicy::default(),
        Discard,
    );
    runtime.spawn(sender.run());
    let handle = SampleHistoryHandle::new(Duration::from_secs(600), Duration::from_secs(1));
    {
        let infos = devices();
        for tick in 0..=600u64 {
            let at = UNIX_EPOCH + Duration::from_secs(T0 + tick);
            handle.record(&snapshot(&infos, at, tick));
        }
    }
    let intake = Arc::new(Intake::new(
        queue,
        handle,
        IntakeSettings {
            proc_root: "/nonexistent".into(),
            max_queue_bytes: 512 << 20,
            max_wait: Duration::ZERO,
        },
    ));
    for (name, pid) in [
        ("intake_512/enriched", 10_007),
        ("intake_512/unmatched", 99_999),
    ] {
        let body = Bytes::from(batch(pid).encode_to_vec());
        group.bench_function(name, |b| {
            b.iter(|| {
                let accepted = runtime
                    .block_on(intake.accept(Signal::Traces, body.clone(), None))
                    .expect("accepted");
                black_box(accepted)
            })
        });
    }
    group.finish();
}

criterion_group!(enrich, benches);
criterion_main!(enrich);
