//! Adds scope metrics to the first resource of an already encoded
//! `ExportMetricsServiceRequest`, without decoding the request: only the first resource's length
//! prefix is rewritten, the rest is copied as is. This is how gpulse's health joins the node
//! resource of a window request that the export builder encoded on its own (protobuf appends
//! repeated fields, so extra `scope_metrics` at the end of a `ResourceMetrics` body are simply
//! more elements).

use opentelemetry_proto::tonic::metrics::v1::ScopeMetrics;
use prost::encoding::{decode_varint, encode_varint, encoded_len_varint};

/// `ExportMetricsServiceRequest.resource_metrics` is field 1 and
/// `ResourceMetrics.scope_metrics` field 2, both length-delimited (wire type 2).
const RESOURCE_METRICS_TAG: u64 = 1 << 3 | 2;
const SCOPE_METRICS_FIELD: u32 = 2;

/// `request` with `scopes` appended to its first `resource_metrics` element; `None` when the
/// request does not start with one (empty, or another field first).
pub(super) fn into_first_resource<'a>(
    request: &[u8],
    scopes: impl Iterator<Item = &'a ScopeMetrics>,
) -> Option<Vec<u8>> {
    let mut rest = request;
    if decode_varint(&mut rest).ok()? != RESOURCE_METRICS_TAG {
        return None;
    }
    let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
    if rest.len() < len {
        return None;
    }
    let (first, after) = rest.split_at(len);
    let mut extra = Vec::new();
    for scope in scopes {
        prost::encoding::message::encode(SCOPE_METRICS_FIELD, scope, &mut extra);
    }
    let new_len = (len + extra.len()) as u64;
    let mut out = Vec::with_capacity(request.len() + extra.len() + encoded_len_varint(new_len) + 1);
    encode_varint(RESOURCE_METRICS_TAG, &mut out);
    encode_varint(new_len, &mut out);
    out.extend_from_slice(first);
    out.extend_from_slice(&extra);
    out.extend_from_slice(after);
    Some(out)
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message as _;

    use super::*;

    fn resource(name: &str, metrics: &[&str]) -> ResourceMetrics {
        ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                        value: Some(
                            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                                name.into(),
                            ),
                        ),
                    }),
                    ..KeyValue::default()
                }],
                ..Resource::default()
            }),
            scope_metrics: vec![scope("gpulse", metrics)],
            ..ResourceMetrics::default()
        }
    }

    fn scope(name: &str, metrics: &[&str]) -> ScopeMetrics {
        ScopeMetrics {
            scope: Some(InstrumentationScope {
                name: name.into(),
                ..InstrumentationScope::default()
            }),
            metrics: metrics
                .iter()
                .map(|m| Metric {
                    name: (*m).into(),
                    ..Metric::default()
                })
                .collect(),
            ..ScopeMetrics::default()
        }
    }

    #[test]
    fn the_scopes_join_the_first_resource_and_the_others_are_untouched() {
        let window = ExportMetricsServiceRequest {
            resource_metrics: vec![
                resource("node", &["hw.gpu.utilization"; 40]),
                resource("app", &["hw.gpu.memory.usage"]),
            ],
        };
        let health = scope(
            "gpulse",
            &["gpulse.export.queue.size", "gpulse.nvml.errors"],
        );
        let body =
            into_first_resource(&window.encode_to_vec(), [&health].into_iter()).expect("spliced");
        let got = ExportMetricsServiceRequest::decode(body.as_slice()).expect("still valid");

        let mut want = window.clone();
        want.resource_metrics[0].scope_metrics.push(health);
        assert_eq!(got, want);
    }

    #[test]
    fn a_body_without_a_first_resource_is_refused() {
        let health = scope("gpulse", &["gpulse.export.queue.size"]);
        assert_eq!(into_first_resource(&[], [&health].into_iter()), None);
        // A truncated first resource (length past the end).
        let window = ExportMetricsServiceRequest {
            resource_metrics: vec![resource("node", &["hw.gpu.utilization"])],
        }
        .encode_to_vec();
        assert_eq!(
            into_first_resource(&window[..window.len() - 1], [&health].into_iter()),
            None
        );
    }
}
