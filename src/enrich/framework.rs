//! The framework's own telemetry, taken from what the receivers accept: the PyTorch companion's
//! allocator gauges (`pytorch.cuda.memory.allocated`, `.reserved`, `.max_allocated`, each point
//! with `hw.id`), its `step` and `data_wait` spans, and the DataLoader settings on its run and
//! epoch spans. Each resource is tied to its process as spans are for enrichment (`identity`,
//! then the connection's peer); what belongs to a known GPU process goes into the diagnosis
//! stage's [`FrameworkHistory`]. The requests themselves are forwarded unchanged.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, NumberDataPoint};

use super::spans::ResourcePids;
use crate::diagnosis::framework::{
    AllocatorPoint, FrameworkHistory, LoaderSettings, SpanTiming, ALLOCATED, DATA_WAIT_SPAN,
    LOADER_ATTRIBUTES, MAX_ALLOCATED, RESERVED, STEP_SPAN,
};

/// Whether a metrics request carries any allocator gauge (so resolving its resources is worth
/// it).
pub fn has_allocator_metrics(request: &ExportMetricsServiceRequest) -> bool {
    request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .any(|m| matches!(m.name.as_str(), ALLOCATED | RESERVED | MAX_ALLOCATED))
}

/// Whether a traces request carries a span the framework history keeps.
pub fn has_framework_spans(request: &ExportTraceServiceRequest) -> bool {
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
pub fn record_metrics(
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
                    .find(|kv| kv.key == "hw.id")
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
pub fn record_spans(
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
                STEP_SPAN => history.record_step(pid, timing),
                DATA_WAIT_SPAN => history.record_data_wait(pid, timing),
                _ => continue,
            }
            recorded += 1;
        }
    }
    recorded
}

fn time_of(nanos: u64) -> SystemTime {
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

fn string(kv: &KeyValue) -> Option<String> {
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
mod tests {
    use super::*;
    use crate::enrich::spans::MatchedBy;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::metrics::v1::{Gauge, Metric, ResourceMetrics, ScopeMetrics};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(key: &str, value: Value) -> KeyValue {
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
}
