//! The framework's own telemetry, taken from what the receivers accept: the PyTorch companion's
//! allocator gauges (`pytorch.cuda.memory.allocated`, `.reserved`, `.max_allocated`, each point
//! with `hw.id`), its `step` and `data_wait` spans, and the DataLoader settings on its run and
//! epoch spans, the `pytorch.distributed.collective.wait` of each step span and the resource's
//! `pytorch.distributed.*` rank and job, and what every resource says of its process's
//! identity (`service.name`, `service.*`, its rank: `record_identities`). Each resource is tied to its process as spans are for enrichment (`identity`,
//! then the connection's peer); what belongs to a known GPU process goes into the diagnosis
//! stage's [`FrameworkHistory`]. The requests themselves are forwarded unchanged.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, NumberDataPoint};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_semantic_conventions::resource::SERVICE_NAME;

use super::span_attributes::ResourcePids;
use crate::attribution::sent_identity::{SentIdentity, ADOPTED_ATTRIBUTES};
use crate::diagnosis::framework::{
    AllocatorPoint, DistributedIdentity, FrameworkHistory, LoaderSettings, SpanTiming, ALLOCATED,
    BACKEND, COLLECTIVE_COUNT_ATTRIBUTE, COLLECTIVE_WAIT_ATTRIBUTE, DATA_WAIT_SPAN, JOB_ID,
    LOADER_ATTRIBUTES, LOCAL_RANK, MAX_ALLOCATED, RANK, RESERVED, STEP_SPAN, WORLD_SIZE,
};
use crate::schema::attributes::AttributeId as A;

/// Whether a metrics request carries any allocator gauge (so resolving its resources is worth
/// it).
pub(crate) fn has_allocator_metrics(request: &ExportMetricsServiceRequest) -> bool {
    request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .any(|m| matches!(m.name.as_str(), ALLOCATED | RESERVED | MAX_ALLOCATED))
}

/// Whether a traces request carries a span the framework history keeps.
pub(crate) fn has_framework_spans(request: &ExportTraceServiceRequest) -> bool {
    request
        .resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .any(|s| {
            s.name == STEP_SPAN
                || s.name == DATA_WAIT_SPAN
                || s.attributes
                    .iter()
                    .any(|kv| LOADER_ATTRIBUTES.contains(&kv.key.as_str()))
        })
}

/// Records the allocator gauges of every resource whose process is known. Returns the points
/// recorded.
pub(crate) fn record_metrics(
    history: &mut FrameworkHistory,
    request: &ExportMetricsServiceRequest,
    pids: &ResourcePids,
) -> usize {
    let mut recorded = 0;
    for (rm, pid) in request.resource_metrics.iter().zip(pids) {
        let Some((pid, _)) = *pid else { continue };
        for m in rm.scope_metrics.iter().flat_map(|sm| &sm.metrics) {
            let points: &[NumberDataPoint] = match &m.data {
                Some(metric::Data::Gauge(g)) => &g.data_points,
                Some(metric::Data::Sum(s)) => &s.data_points,
                _ => continue,
            };
            for dp in points {
                let Some(bytes) = bytes_of(dp) else { continue };
                let mut point = AllocatorPoint {
                    at: time_of(dp.time_unix_nano),
                    allocated_bytes: None,
                    reserved_bytes: None,
                    max_allocated_bytes: None,
                };
                match m.name.as_str() {
                    ALLOCATED => point.allocated_bytes = Some(bytes),
                    RESERVED => point.reserved_bytes = Some(bytes),
                    MAX_ALLOCATED => point.max_allocated_bytes = Some(bytes),
                    _ => continue,
                }
                let hw_id = dp
                    .attributes
                    .iter()
                    .find(|kv| kv.key == A::HwId.key())
                    .and_then(string)
                    .unwrap_or_default();
                history.record_allocator(pid, &hw_id, point);
                recorded += 1;
            }
        }
    }
    recorded
}

/// Records the `step` and `data_wait` spans and the DataLoader settings of every resource whose
/// process is known. Returns the spans recorded.
pub(crate) fn record_spans(
    history: &mut FrameworkHistory,
    request: &ExportTraceServiceRequest,
    pids: &ResourcePids,
) -> usize {
    let mut recorded = 0;
    for (rs, pid) in request.resource_spans.iter().zip(pids) {
        let Some((pid, _)) = *pid else { continue };
        for span in rs.scope_spans.iter().flat_map(|ss| &ss.spans) {
            let end = span.end_time_unix_nano;
            let start = span.start_time_unix_nano;
            let loader = LoaderSettings {
                settings: span
                    .attributes
                    .iter()
                    .filter(|kv| LOADER_ATTRIBUTES.contains(&kv.key.as_str()))
                    .filter_map(|kv| Some((kv.key.clone(), text(kv)?)))
                    .collect(),
            };
            history.record_loader(pid, loader, time_of(end.max(start)));
            if end == 0 || start == 0 || end < start {
                continue;
            }
            let timing = SpanTiming {
                end: time_of(end),
                duration: Duration::from_nanos(end - start),
            };
            match span.name.as_str() {
                STEP_SPAN => {
                    history.record_step(pid, timing);
                    let wait = span
                        .attributes
                        .iter()
                        .find(|kv| kv.key == COLLECTIVE_WAIT_ATTRIBUTE)
                        .and_then(seconds);
                    if let Some(wait) = wait {
                        history.record_collective_wait(pid, timing.end, wait);
                    }
                    let count = span
                        .attributes
                        .iter()
                        .find(|kv| kv.key == COLLECTIVE_COUNT_ATTRIBUTE)
                        .and_then(unsigned)
                        .unwrap_or(0);
                    let seen = count > 0 || wait.is_some_and(|w| !w.is_zero());
                    history.record_step_collectives(pid, timing.end, wait.is_some(), seen);
                }
                DATA_WAIT_SPAN => history.record_data_wait(pid, timing),
                _ => continue,
            }
            recorded += 1;
        }
    }
    recorded
}

/// Records what each resource whose process is known says about that process (its service,
/// rank and job: `SentIdentity`), whatever the signal; `resources` in the order of `pids`.
pub(crate) fn record_identities<'a>(
    history: &mut FrameworkHistory,
    resources: impl IntoIterator<Item = Option<&'a Resource>>,
    pids: &ResourcePids,
) {
    let now = SystemTime::now();
    for (resource, pid) in resources.into_iter().zip(pids) {
        let (Some(resource), Some((pid, _))) = (resource, *pid) else {
            continue;
        };
        history.record_sent_identity(pid, sent_identity(&resource.attributes), now);
    }
}

/// What one resource says about its process.
fn sent_identity(attributes: &[KeyValue]) -> SentIdentity {
    let strings = attributes
        .iter()
        .filter(|kv| ADOPTED_ATTRIBUTES.contains(&kv.key.as_str()))
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(value) => Some((kv.key.as_str(), value.as_str())),
            _ => None,
        });
    let service_name = attributes
        .iter()
        .find(|kv| kv.key == SERVICE_NAME)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(name) => Some(name.as_str()),
            _ => None,
        });
    SentIdentity::from_resource(service_name, strings, distributed(attributes))
}

/// The process's rank and job from the companion's resource attributes; `None` without a rank.
fn distributed(attributes: &[KeyValue]) -> Option<DistributedIdentity> {
    let find = |key: &str| attributes.iter().find(|kv| kv.key == key);
    let rank = find(RANK).and_then(unsigned)?;
    Some(DistributedIdentity {
        rank,
        local_rank: find(LOCAL_RANK).and_then(unsigned),
        world_size: find(WORLD_SIZE).and_then(unsigned),
        backend: find(BACKEND).and_then(string),
        job_id: find(JOB_ID).and_then(text).filter(|id| !id.is_empty()),
    })
}

/// A rank or a count: an int (or an int written as text, as `OTEL_RESOURCE_ATTRIBUTES` gives).
pub(super) fn unsigned(kv: &KeyValue) -> Option<u32> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => u32::try_from(*i).ok(),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A duration in seconds (double or int), non-negative and finite.
pub(super) fn seconds(kv: &KeyValue) -> Option<Duration> {
    let value = match kv.value.as_ref()?.value.as_ref()? {
        Value::DoubleValue(d) => *d,
        Value::IntValue(i) => *i as f64,
        _ => return None,
    };
    Duration::try_from_secs_f64(value).ok()
}

pub(super) fn time_of(nanos: u64) -> SystemTime {
    if nanos == 0 {
        // No time on the point: it was observed when it arrived.
        SystemTime::now()
    } else {
        UNIX_EPOCH + Duration::from_nanos(nanos)
    }
}

fn bytes_of(dp: &NumberDataPoint) -> Option<u64> {
    match dp.value? {
        number_data_point::Value::AsInt(i) => u64::try_from(i).ok(),
        number_data_point::Value::AsDouble(d) if d.is_finite() && d >= 0.0 => Some(d as u64),
        number_data_point::Value::AsDouble(_) => None,
    }
}

pub(super) fn string(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// An attribute value as text (`2`, `true`, `2.5`, `cuda`).
fn text(kv: &KeyValue) -> Option<String> {
    Some(match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::enrich::span_attributes::MatchedBy;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    /// One attribute (the live states' tests use it too).
    pub(in crate::enrich) fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    const T0: u64 = 1_700_000_000_000_000_000;

    #[test]
    fn allocator_gauges_of_a_known_process_are_kept_by_device() {
        let gauge = |name: &str, value: i64| Metric {
            name: name.into(),
            data: Some(metric::Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint {
                    time_unix_nano: T0,
                    value: Some(number_data_point::Value::AsInt(value)),
                    attributes: vec![kv("hw.id", Value::StringValue("GPU-a".into()))],
                    ..Default::default()
                }],
            })),
            ..Default::default()
        };
        let rm = ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![
                    gauge(ALLOCATED, 100),
                    gauge(RESERVED, 300),
                    gauge("app.other", 5),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![rm.clone(), rm],
        };
        assert!(has_allocator_metrics(&request));
        let mut h = FrameworkHistory::default();
        // The second resource's process is not known: nothing of it is kept.
        let n = record_metrics(
            &mut h,
            &request,
            &vec![Some((42, MatchedBy::Resource)), None],
        );
        assert_eq!(n, 2);
        let e = h.evidence(&[42], time_of(T0), Duration::from_secs(60));
        let points = e.process(42).unwrap().allocator_on("GPU-a", false).unwrap();
        assert_eq!(points.len(), 1, "one export time, one point");
        assert_eq!(
            (points[0].allocated_bytes, points[0].reserved_bytes),
            (Some(100), Some(300))
        );
    }

    #[test]
    fn step_and_data_wait_spans_give_the_ratio_and_run_spans_the_loader() {
        let mut spans = Vec::new();
        for i in 0..6u64 {
            let start = T0 + i * 1_000_000_000;
            spans.push(Span {
                name: STEP_SPAN.into(),
                start_time_unix_nano: start,
                end_time_unix_nano: start + 1_000_000_000,
                ..Default::default()
            });
            spans.push(Span {
                name: DATA_WAIT_SPAN.into(),
                start_time_unix_nano: start,
                end_time_unix_nano: start + 700_000_000,
                ..Default::default()
            });
        }
        spans.push(Span {
            name: "training run".into(),
            start_time_unix_nano: T0,
            end_time_unix_nano: T0 + 6_000_000_000,
            attributes: vec![
                kv("pytorch.dataloader.num_workers", Value::IntValue(4)),
                kv("pytorch.dataloader.pin_memory", Value::BoolValue(true)),
            ],
            ..Default::default()
        });
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        assert!(has_framework_spans(&request));
        let mut h = FrameworkHistory::default();
        assert_eq!(
            record_spans(&mut h, &request, &vec![Some((7, MatchedBy::Connection))]),
            12
        );
        let e = h.evidence(&[7], time_of(T0 + 7_000_000_000), Duration::from_secs(60));
        let p = e.process(7).unwrap();
        let steps = p.steps.unwrap();
        assert!((steps.data_wait_ratio - 0.7).abs() < 1e-9, "{steps:?}");
        assert_eq!(p.loader.describe(), "num_workers=4, pin_memory=true");
    }

    #[test]
    fn the_resource_gives_rank_and_job_and_step_spans_their_collective_wait() {
        use opentelemetry_proto::tonic::resource::v1::Resource;
        let spans = (0..4u64)
            .map(|i| Span {
                name: STEP_SPAN.into(),
                start_time_unix_nano: T0 + i * 1_000_000_000,
                end_time_unix_nano: T0 + (i + 1) * 1_000_000_000,
                attributes: vec![kv(COLLECTIVE_WAIT_ATTRIBUTE, Value::DoubleValue(0.25))],
                ..Default::default()
            })
            .collect();
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv(RANK, Value::IntValue(3)),
                        // From OTEL_RESOURCE_ATTRIBUTES everything is text.
                        kv(WORLD_SIZE, Value::StringValue("4".into())),
                        kv(BACKEND, Value::StringValue("gloo".into())),
                        kv(JOB_ID, Value::StringValue("run-7".into())),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut h = FrameworkHistory::default();
        let pids = vec![Some((9, MatchedBy::Resource))];
        let resources = request.resource_spans.iter().map(|rs| rs.resource.as_ref());
        record_identities(&mut h, resources, &pids);
        record_spans(&mut h, &request, &pids);
        let e = h.evidence(&[9], time_of(T0 + 5_000_000_000), Duration::from_secs(60));
        let p = e.process(9).unwrap();
        let identity = p.distributed.as_ref().unwrap();
        assert_eq!(
            (identity.rank, identity.local_rank, identity.world_size),
            (3, None, Some(4))
        );
        assert_eq!(identity.job_id.as_deref(), Some("run-7"));
        let steps = p.steps.unwrap();
        assert!((steps.step_seconds_mean - 1.0).abs() < 1e-9, "{steps:?}");
        assert_eq!(steps.collective_wait_seconds_mean, Some(0.25));
        assert_eq!(steps.busy_seconds_mean(), Some(0.75));
        assert!((steps.heard_seconds - 3.0).abs() < 1e-9);
        // Without a rank there is no identity, whatever else the resource says.
        assert_eq!(
            distributed(&[kv(JOB_ID, Value::StringValue("x".into()))]),
            None
        );
    }
}
