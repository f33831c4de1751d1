//! Adds scope metrics to the first resource of an already encoded
//! `ExportMetricsServiceRequest`, without decoding the request: only the first resource's length
//! prefix is rewritten, the rest is copied as is. This is how gpulse's health joins the node
//! resource of a window request that the export builder encoded on its own (protobuf appends
//! repeated fields, so extra `scope_metrics` at the end of a `ResourceMetrics` body are simply
//! more elements).

use opentelemetry_proto::tonic::metrics::v1::ScopeMetrics;
use prost::encoding::{decode_varint, encode_varint};

/// `ExportMetricsServiceRequest.resource_metrics` is field 1 and
/// `ResourceMetrics.scope_metrics` field 2, both length-delimited (wire type 2).
const RESOURCE_METRICS_TAG: u64 = 1 << 3 | 2;
const SCOPE_METRICS_FIELD: u32 = 2;

/// Appends `scopes` to the first `resource_metrics` element of `request`, in place; `false`
/// (and `request` untouched) when the request does not start with one (empty, or another field
/// first).
///
/// In place because a window request is large (about 400 KB at 8 GPUs × 64 processes, nearly
/// all of it the per-process resources after the first): a copy into a new buffer would hold
/// two of them at once, at every export, and peak RSS is one of gpulse's targets. The buffer
/// grows by what is added and the resources after the first move up within it.
pub(super) fn into_first_resource<'a>(
    request: &mut Vec<u8>,
    scopes: impl Iterator<Item = &'a ScopeMetrics>,
) -> bool {
    let mut rest = request.as_slice();
    if decode_varint(&mut rest).ok() != Some(RESOURCE_METRICS_TAG) {
        return false;
    }
    let Some(len) = decode_varint(&mut rest)
        .ok()
        .and_then(|len| usize::try_from(len).ok())
    else {
        return false;
    };
    if rest.len() < len {
        return false;
    }
    let header_len = request.len() - rest.len();
    let first_end = header_len + len;

    let mut extra = Vec::new();
    for scope in scopes {
        prost::encoding::message::encode(SCOPE_METRICS_FIELD, scope, &mut extra);
    }
    let mut header = Vec::with_capacity(header_len + 2);
    encode_varint(RESOURCE_METRICS_TAG, &mut header);
    encode_varint((len + extra.len()) as u64, &mut header);
    // The new length is larger, so its varint is at least as long: nothing shrinks.
    let grow_header = header.len() - header_len;
    let old_len = request.len();
    request.resize(old_len + grow_header + extra.len(), 0);
    // The resources after the first move up by everything added, then the first resource by
    // what the header grew; then the new header and the scopes go into the gaps.
    request.copy_within(first_end..old_len, first_end + grow_header + extra.len());
    request.copy_within(header_len..first_end, header.len());
    request[..header.len()].copy_from_slice(&header);
    let scopes_at = header.len() + len;
    request[scopes_at..scopes_at + extra.len()].copy_from_slice(&extra);
    true
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::encoding::encoded_len_varint;
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
        let health = scope(
            "gpulse",
            &["gpulse.export.queue.size", "gpulse.nvml.errors"],
        );
        // First resources whose length varint stays one byte, grows from one byte to two, and
        // stays two bytes when the scopes are added.
        let mut varint_lengths = std::collections::BTreeSet::new();
        for node_metrics in [1, 2, 3, 4, 40] {
            let window = ExportMetricsServiceRequest {
                resource_metrics: vec![
                    resource("node", &vec!["hw.gpu.utilization"; node_metrics]),
                    resource("app", &["hw.gpu.memory.usage"]),
                ],
            };
            let mut body = window.encode_to_vec();
            let before = encoded_len_varint(window.resource_metrics[0].encoded_len() as u64);
            assert!(into_first_resource(&mut body, [&health].into_iter()));
            let got = ExportMetricsServiceRequest::decode(body.as_slice()).expect("still valid");

            let mut want = window.clone();
            want.resource_metrics[0].scope_metrics.push(health.clone());
            let after = encoded_len_varint(want.resource_metrics[0].encoded_len() as u64);
            varint_lengths.insert((before, after));
            assert_eq!(got, want, "{node_metrics} node metrics");
            assert_eq!(body, want.encode_to_vec(), "the bytes prost writes");
        }
        assert_eq!(
            varint_lengths,
            [(1, 1), (1, 2), (2, 2)].into_iter().collect(),
            "every case of the header's growth is covered"
        );
    }

    #[test]
    fn a_body_without_a_first_resource_is_refused() {
        let health = scope("gpulse", &["gpulse.export.queue.size"]);
        let mut empty = Vec::new();
        assert!(!into_first_resource(&mut empty, [&health].into_iter()));
        assert!(empty.is_empty());
        // A truncated first resource (length past the end).
        let window = ExportMetricsServiceRequest {
            resource_metrics: vec![resource("node", &["hw.gpu.utilization"])],
        }
        .encode_to_vec();
        let mut truncated = window[..window.len() - 1].to_vec();
        assert!(!into_first_resource(&mut truncated, [&health].into_iter()));
        assert_eq!(truncated, window[..window.len() - 1], "untouched");
    }
}
