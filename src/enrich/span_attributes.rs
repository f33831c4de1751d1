//! Span enrichment proper: for each span of a resource whose process is known, the GPU usage
//! over the span's `[start, end]` is added as span attributes under `gpulse.gpu.*`. Resources,
//! scopes, span fields and the attributes already there are left as they are; an attribute of
//! the same name the application set itself is not overwritten.
//!
//! | attribute | type | meaning |
//! | --- | --- | --- |
//! | `gpulse.gpu.ids` | string[] | `hw.id` (UUID) of the GPUs the process used during the span |
//! | `gpulse.gpu.utilization.mean`, `.max` | double, 0–1 | device utilisation of those GPUs |
//! | `gpulse.gpu.process.utilization.mean`, `.max` | double, 0–1 | the process's own SM share |
//! | `gpulse.gpu.memory.peak` | int, By | largest GPU memory the process held (all its GPUs) |
//! | `gpulse.gpu.power.mean` | double, W | power attributable to the process |
//! | `gpulse.gpu.energy` | double, J | energy attributable to the process over the span |
//! | `gpulse.gpu.samples` | int | NVML samples the figures come from |
//! | `gpulse.gpu.match` | string | how the process was found: `resource` or `connection` |

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;

use super::sample_history::{GpuUsage, SampleHistory};
use crate::schema::attributes::AttributeId as A;

pub(crate) const IDS: &str = A::SpanGpuIds.key();
pub(crate) const UTILIZATION_MEAN: &str = A::SpanGpuUtilizationMean.key();
pub(crate) const UTILIZATION_MAX: &str = A::SpanGpuUtilizationMax.key();
pub(crate) const PROCESS_UTILIZATION_MEAN: &str = A::SpanProcessUtilizationMean.key();
pub(crate) const PROCESS_UTILIZATION_MAX: &str = A::SpanProcessUtilizationMax.key();
pub(crate) const MEMORY_PEAK: &str = A::SpanMemoryPeak.key();
pub(crate) const POWER_MEAN: &str = A::SpanPowerMean.key();
pub(crate) const ENERGY: &str = A::SpanEnergy.key();
pub(crate) const SAMPLES: &str = A::SpanSamples.key();
pub(crate) const MATCH: &str = A::SpanMatch.key();

/// How a resource was tied to its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    Resource,
    Connection,
}

impl MatchedBy {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            MatchedBy::Resource => "resource",
            MatchedBy::Connection => "connection",
        }
    }
}

/// The process of each `resource_spans` entry, in order (`None`: not known).
pub(crate) type ResourcePids = Vec<Option<(u32, MatchedBy)>>;

/// Spans in a request.
pub(crate) fn span_count(request: &ExportTraceServiceRequest) -> usize {
    request
        .resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .map(|ss| ss.spans.len())
        .sum()
}

/// The latest end time among the spans of resources whose process is known, to know how long
/// to wait for the sample that covers it.
pub(crate) fn latest_end(request: &ExportTraceServiceRequest, pids: &ResourcePids) -> Option<u64> {
    request
        .resource_spans
        .iter()
        .zip(pids)
        .filter(|(_, pid)| pid.is_some())
        .flat_map(|(rs, _)| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .map(|s| s.end_time_unix_nano.max(s.start_time_unix_nano))
        .max()
}

/// Adds the GPU attributes to every span whose process and period the history covers.
/// Returns how many spans got them.
pub fn enrich_request(
    request: &mut ExportTraceServiceRequest,
    pids: &ResourcePids,
    history: &SampleHistory,
) -> u64 {
    let mut enriched = 0;
    for (rs, pid) in request.resource_spans.iter_mut().zip(pids) {
        let Some((pid, by)) = *pid else { continue };
        for span in rs.scope_spans.iter_mut().flat_map(|ss| ss.spans.iter_mut()) {
            if span.start_time_unix_nano == 0 {
                continue;
            }
            let end = if span.end_time_unix_nano == 0 {
                span.start_time_unix_nano
            } else {
                span.end_time_unix_nano
            };
            if let Some(usage) = history.usage(pid, span.start_time_unix_nano, end) {
                add_attributes(span, &usage, by);
                enriched += 1;
            }
        }
    }
    enriched
}

/// Appends the `gpulse.gpu.*` attributes of `usage`, skipping names the span already has.
pub(crate) fn add_attributes(span: &mut Span, usage: &GpuUsage, by: MatchedBy) {
    let mut new: Vec<(&'static str, Value)> = Vec::with_capacity(10);
    new.push((
        IDS,
        Value::ArrayValue(ArrayValue {
            values: usage
                .devices
                .iter()
                .map(|d| AnyValue {
                    value: Some(Value::StringValue(d.clone())),
                })
                .collect(),
        }),
    ));
    let doubles = [
        (UTILIZATION_MEAN, usage.utilization_mean),
        (UTILIZATION_MAX, usage.utilization_max),
        (PROCESS_UTILIZATION_MEAN, usage.process_utilization_mean),
        (PROCESS_UTILIZATION_MAX, usage.process_utilization_max),
        (POWER_MEAN, usage.power_mean_watts),
        (ENERGY, usage.energy_joules),
    ];
    for (key, value) in doubles {
        if let Some(v) = value.filter(|v| v.is_finite()) {
            new.push((key, Value::DoubleValue(v)));
        }
    }
    if let Some(bytes) = usage.memory_peak_bytes {
        new.push((
            MEMORY_PEAK,
            Value::IntValue(i64::try_from(bytes).unwrap_or(i64::MAX)),
        ));
    }
    new.push((SAMPLES, Value::IntValue(i64::from(usage.samples))));
    new.push((MATCH, Value::StringValue(by.as_str().into())));
    for (key, value) in new {
        if span.attributes.iter().any(|kv| kv.key == key) {
            continue;
        }
        span.attributes.push(KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    use super::*;
    use crate::enrich::sample_history::tests::{device, process, snapshot, S};

    fn span(start: u64, end: u64) -> Span {
        Span {
            name: "step".into(),
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: vec![KeyValue {
                key: UTILIZATION_MEAN.into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue("mine".into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn known_processes_get_attributes_and_others_pass_untouched() {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=104 {
            h.record(&snapshot(
                t,
                vec![device("GPU-a", 0.5, 80.0)],
                vec![process(42, "GPU-a", 2048, Some(0.5))],
            ));
        }
        let mut request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: vec![span(101 * S, 103 * S), span(10 * S, 11 * S)],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: vec![span(101 * S, 103 * S)],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        };
        let untouched = request.resource_spans[1].clone();
        let pids = vec![Some((42, MatchedBy::Connection)), None];
        assert_eq!(latest_end(&request, &pids), Some(103 * S));
        assert_eq!(span_count(&request), 3);
        assert_eq!(enrich_request(&mut request, &pids, &h), 1);

        let spans = &request.resource_spans[0].scope_spans[0].spans;
        let s = &spans[0];
        assert_eq!(attr(s, MEMORY_PEAK), Some(&Value::IntValue(2048)));
        assert_eq!(attr(s, SAMPLES), Some(&Value::IntValue(2)));
        assert_eq!(
            attr(s, MATCH),
            Some(&Value::StringValue("connection".into()))
        );
        assert_eq!(attr(s, UTILIZATION_MAX), Some(&Value::DoubleValue(0.5)));
        // The application's own attribute of that name wins.
        assert_eq!(
            attr(s, UTILIZATION_MEAN),
            Some(&Value::StringValue("mine".into()))
        );
        // 80 W × its 50 % busy share × 2 s: the idle half is charged to no one.
        match attr(s, ENERGY) {
            Some(Value::DoubleValue(j)) => assert!((j - 80.0).abs() < 1e-3, "{j}"),
            other => panic!("{other:?}"),
        }
        match attr(s, IDS) {
            Some(Value::ArrayValue(a)) => assert_eq!(a.values.len(), 1),
            other => panic!("{other:?}"),
        }
        // Older than the history: unchanged.
        assert_eq!(spans[1].attributes.len(), 1);
        assert_eq!(request.resource_spans[1], untouched);
    }
}
