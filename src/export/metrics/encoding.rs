//! The wire encoding: a [`MetricsBatch`] (one export window's metrics, [`super::batch`]) as the
//! protobuf bytes of an `ExportMetricsServiceRequest`.
//!
//! A prost request of 64 GPUs × 1024 processes is ~300k heap objects: every metric owns its
//! name, description and unit, every data point its own copy of the device's attributes. Here a
//! metric is its [`METRICS`] row, a data point names a shared attribute list plus at most one
//! extra attribute, and the encoder writes each shared list's bytes once and copies them. The
//! encoding is byte for byte what `prost::Message::encode_to_vec` writes for
//! [`MetricsBatch::into_request`] (fields in tag order, proto3 defaults omitted); tests hold the
//! two equal, so the prost form stays the reference for tests and the OTLP/JSON path.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, AggregationTemporality,
};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, message, WireType};

pub use super::batch::MetricsBatch;
use super::batch::{metric_runs, ResourceBody};
pub(crate) use super::batch::{
    AttributeSetId, BatchPoint, EncodedResource, ExtraValue, PointAttributes,
};
use super::encode_cache::{EncodeCache, Scratch};
use crate::export::resource::gpulse_scope;
use crate::schema::{Instrument, METRICS};

impl MetricsBatch {
    /// The protobuf encoding of [`MetricsBatch::into_request`], written in two passes: sizes
    /// bottom-up once, then bytes. Each resource is encoded once, in the first pass (prost would
    /// otherwise size its nested attributes again while writing them), and each point's length
    /// is kept for the second.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with_first_resource_scopes(&[])
    }

    /// [`MetricsBatch::encode`] with `scopes`, already encoded `ResourceMetrics.scope_metrics`
    /// fields (field 2), written at the end of the first resource: how gpulse's own health joins
    /// the node resource of the window's request. Written in place as the request is, where
    /// adding them to the finished request would move all of it (about 480 KB at 8 GPUs × 64
    /// processes) at every export. Without a resource, `scopes` are left out.
    pub(crate) fn encode_with_first_resource_scopes(&self, scopes: &[u8]) -> Vec<u8> {
        self.encode_cached(scopes, &mut EncodeCache::new()).into()
    }

    /// [`MetricsBatch::encode_with_first_resource_scopes`], taking from `cache` what the last
    /// window already encoded (its unchanged attribute lists) and its scratch vectors, and
    /// leaving this window's there: what the exporter does every window. The bytes are the same
    /// as without the cache.
    ///
    /// A window shaped as the last one (see [`super::request_patch`]) is the last request with
    /// its timestamps and values written in place; any other is encoded in full and kept.
    pub(crate) fn encode_cached(&self, scopes: &[u8], cache: &mut EncodeCache) -> Bytes {
        let sets_changed = cache.refresh(&self.attribute_sets);
        if let Some(patched) = cache.last.patched(self, scopes, sets_changed) {
            #[cfg(debug_assertions)]
            assert_eq!(
                patched,
                self.encode_with_first_resource_scopes(scopes),
                "a patched request differs from a fresh encoding"
            );
            return patched;
        }
        cache.last.start_recording();
        let EncodeCache {
            encoded: sets,
            scratch,
            scope,
            last,
            ..
        } = cache;
        let sets = &sets[..];
        if scope.is_empty() {
            message::encode(1, &gpulse_scope(), scope);
        }
        let scope = &scope[..];
        scratch.clear();
        // Pass 1: per resource its encoded `Resource` (field 1, into `resources`, unless it was
        // kept encoded from an earlier window), its body
        // length and its scope-metrics body length; for each metric its body and data lengths;
        // each point's length; all in the order pass 2 writes them.
        let Scratch {
            sizes,
            point_lens,
            resources,
            resource_ends,
        } = scratch;
        let mut total = 0;
        for (index, r) in self.resources.iter().enumerate() {
            let slot = sizes.len();
            sizes.extend([0, 0]);
            let mut scope_len = scope.len();
            for run in metric_runs(&r.points) {
                let (metric_len, data_len) = metric_lens(run, sets, point_lens);
                sizes.extend([metric_len, data_len]);
                scope_len += delimited_len(2, metric_len);
            }
            let resource_len = match &r.resource {
                ResourceBody::Built(resource) => {
                    let resource_start = resources.len();
                    message::encode(1, resource, resources);
                    resources.len() - resource_start
                }
                ResourceBody::Encoded(e) => e.bytes.len(),
            };
            resource_ends.push(resources.len());
            let extra = if index == 0 { scopes.len() } else { 0 };
            let rm_len = resource_len + delimited_len(2, scope_len) + extra;
            sizes[slot] = rm_len;
            sizes[slot + 1] = scope_len;
            total += delimited_len(1, rm_len);
        }

        // Pass 2.
        let mut out = Vec::with_capacity(total);
        let mut sizes = sizes.iter().copied();
        let mut next = || {
            sizes
                .next()
                .expect("pass 1 sized every message pass 2 writes")
        };
        let mut point_lens = point_lens.iter().copied();
        let mut resource_start = 0;
        let mut scopes_at = 0;
        for (index, (r, &resource_end)) in self.resources.iter().zip(&*resource_ends).enumerate() {
            delimited_prefix(1, next(), &mut out);
            match &r.resource {
                ResourceBody::Built(_) => {
                    out.extend_from_slice(&resources[resource_start..resource_end])
                }
                ResourceBody::Encoded(e) => out.extend_from_slice(&e.bytes),
            }
            resource_start = resource_end;
            delimited_prefix(2, next(), &mut out);
            out.extend_from_slice(scope);
            for run in metric_runs(&r.points) {
                let spec = &METRICS[run[0].metric as usize];
                delimited_prefix(2, next(), &mut out);
                string_field(1, spec.name, &mut out);
                string_field(2, spec.description, &mut out);
                string_field(3, spec.unit, &mut out);
                let data_len = next();
                match spec.instrument {
                    Instrument::Gauge => delimited_prefix(5, data_len, &mut out),
                    Instrument::Counter | Instrument::UpDownCounter => {
                        delimited_prefix(7, data_len, &mut out)
                    }
                }
                for p in run {
                    let len = point_lens
                        .next()
                        .expect("pass 1 sized every point pass 2 writes");
                    // The point's key, its length, then its fixed-width fields.
                    last.fields_at
                        .push(out.len() + 1 + encoded_len_varint(len as u64));
                    write_point(p, len, sets, &mut out);
                }
                if spec.instrument != Instrument::Gauge {
                    varint_field(2, AggregationTemporality::Cumulative as u64, &mut out);
                    varint_field(
                        3,
                        u64::from(spec.instrument == Instrument::Counter),
                        &mut out,
                    );
                }
            }
            if index == 0 {
                scopes_at = out.len();
                out.extend_from_slice(scopes);
            }
        }
        debug_assert_eq!(out.len(), total, "sizing and writing passes disagree");
        let out = Bytes::from(out);
        if !self.resources.is_empty() {
            last.record(self, &out, (scopes_at, scopes.len()));
        }
        out
    }
}

/// The number of data points in a request: what the export queue counts when it drops one.
pub fn data_point_count(request: &ExportMetricsServiceRequest) -> usize {
    request
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .map(|m| match &m.data {
            Some(Data::Gauge(g)) => g.data_points.len(),
            Some(Data::Sum(s)) => s.data_points.len(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
            Some(Data::Summary(s)) => s.data_points.len(),
            None => 0,
        })
        .sum()
}

fn delimited_len(tag: u32, body: usize) -> usize {
    key_len(tag) + encoded_len_varint(body as u64) + body
}

fn delimited_prefix(tag: u32, body: usize, out: &mut Vec<u8>) {
    put_key(tag, WireType::LengthDelimited, out);
    put_varint(body as u64, out);
}

/// A field key; every tag this encoder writes is under 16, so one byte.
#[inline]
fn put_key(tag: u32, wire_type: WireType, out: &mut Vec<u8>) {
    if tag < 16 {
        out.push((tag << 3) as u8 | wire_type as u8);
    } else {
        encode_key(tag, wire_type, out);
    }
}

/// A varint, with the one- and two-byte cases (nearly every length here) written inline.
#[inline]
fn put_varint(v: u64, out: &mut Vec<u8>) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v < 0x4000 {
        out.extend_from_slice(&[v as u8 | 0x80, (v >> 7) as u8]);
    } else {
        encode_varint(v, out);
    }
}

/// A proto3 `string` field: omitted when empty.
fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(tag, s.len())
    }
}

fn string_field(tag: u32, s: &str, out: &mut Vec<u8>) {
    if !s.is_empty() {
        delimited_prefix(tag, s.len(), out);
        out.extend_from_slice(s.as_bytes());
    }
}

fn varint_field(tag: u32, v: u64, out: &mut Vec<u8>) {
    if v != 0 {
        put_key(tag, WireType::Varint, out);
        put_varint(v, out);
    }
}

/// Body length of the `KeyValue{key, AnyValue{string_value}}` that an extra attribute is.
fn extra_len(key: &str, value: &str) -> usize {
    // The value is a member of AnyValue's oneof: written even when empty.
    string_len(1, key) + delimited_len(2, delimited_len(1, value.len()))
}

/// Body length of a point: timestamps, value, attributes (no exemplars, no flags).
fn point_len(p: &BatchPoint, sets: &[Vec<u8>]) -> usize {
    let fixed64 = |v: u64| if v == 0 { 0 } else { key_len(2) + 8 };
    let mut len = fixed64(p.start) + fixed64(p.end) + key_len(4) + 8;
    if let Some(id) = p.attributes.set {
        len += sets[id.0 as usize].len();
    }
    if let Some((key, value)) = &p.attributes.extra {
        len += delimited_len(7, extra_len(key, value.as_str()));
    }
    len
}

/// (metric body, gauge/sum body) lengths of one metric's points; each point's own length is
/// appended to `point_lens`.
fn metric_lens(
    run: &[BatchPoint],
    sets: &[Vec<u8>],
    point_lens: &mut Vec<usize>,
) -> (usize, usize) {
    let spec = &METRICS[run[0].metric as usize];
    let mut data_len: usize = 0;
    for p in run {
        let len = point_len(p, sets);
        point_lens.push(len);
        data_len += delimited_len(1, len);
    }
    let data_tag = match spec.instrument {
        Instrument::Gauge => 5,
        Instrument::Counter => {
            data_len += 2 + 2; // temporality = cumulative (2), is_monotonic = true
            7
        }
        Instrument::UpDownCounter => {
            data_len += 2; // temporality only: is_monotonic = false is the default
            7
        }
    };
    let metric_len = string_len(1, spec.name)
        + string_len(2, spec.description)
        + string_len(3, spec.unit)
        + delimited_len(data_tag, data_len);
    (metric_len, data_len)
}

/// A point whose body is `len` bytes (from [`point_len`]). The key, length and the three
/// fixed64 fields go out as one copy: keys of fields 1 to 7 are single bytes.
fn write_point(p: &BatchPoint, len: usize, sets: &[Vec<u8>], out: &mut Vec<u8>) {
    const POINT: u8 = 1 << 3 | WireType::LengthDelimited as u8;
    const START: u8 = 2 << 3 | WireType::SixtyFourBit as u8;
    const END: u8 = 3 << 3 | WireType::SixtyFourBit as u8;
    const AS_DOUBLE: u8 = 4 << 3 | WireType::SixtyFourBit as u8;
    const AS_INT: u8 = 6 << 3 | WireType::SixtyFourBit as u8;
    let mut head = [0u8; 1 + 10 + 3 * 9];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        head[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&[POINT]);
    let mut varint = [0u8; 10];
    let mut n = 0;
    let mut v = len as u64;
    while v >= 0x80 {
        varint[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    varint[n] = v as u8;
    put(&varint[..=n]);
    if p.start != 0 {
        put(&[START]);
        put(&p.start.to_le_bytes());
    }
    if p.end != 0 {
        put(&[END]);
        put(&p.end.to_le_bytes());
    }
    match p.value {
        number_data_point::Value::AsDouble(v) => {
            put(&[AS_DOUBLE]);
            put(&v.to_le_bytes());
        }
        number_data_point::Value::AsInt(v) => {
            put(&[AS_INT]);
            put(&v.to_le_bytes());
        }
    }
    out.extend_from_slice(&head[..at]);
    if let Some(id) = p.attributes.set {
        out.extend_from_slice(&sets[id.0 as usize]);
    }
    if let Some((key, value)) = &p.attributes.extra {
        let value = value.as_str();
        delimited_prefix(7, extra_len(key, value), out);
        string_field(1, key, out);
        delimited_prefix(2, delimited_len(1, value.len()), out);
        delimited_prefix(1, value.len(), out);
        out.extend_from_slice(value.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
    use prost::Message;

    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use opentelemetry_proto::tonic::metrics::v1::{Metric, ScopeMetrics};
    use opentelemetry_proto::tonic::resource::v1::Resource;

    use super::*;
    use crate::export::resource::{kv_int, kv_str};
    use crate::schema::MetricId;

    fn point(metric: MetricId, attributes: PointAttributes, start: u64, value: f64) -> BatchPoint {
        BatchPoint {
            metric,
            attributes,
            start,
            end: 1_700_000_000_000_000_000,
            value: number_data_point::Value::AsDouble(value),
        }
    }

    /// Edge cases of every field the encoder writes itself: zero timestamps, negative and
    /// extreme integers, empty and 300-byte strings (two-byte length prefixes), an attribute
    /// list shared across resources, owned extras, a resource with no point, unsorted pushes.
    fn tricky_batch() -> MetricsBatch {
        let long = "x".repeat(300);
        let mut batch = MetricsBatch::default();
        let shared = batch.add_attribute_set(vec![
            kv_str("hw.id", long.as_str()),
            kv_int("gpu.index", -3),
            kv_str("empty", ""),
            KeyValue {
                key: "no.value".into(),
                value: Some(AnyValue { value: None }),
                key_strindex: 0,
            },
            KeyValue {
                key: "bool".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::BoolValue(true)),
                }),
                key_strindex: 0,
            },
        ]);
        let empty_set = batch.add_attribute_set(Vec::new());
        let node = Resource {
            attributes: vec![kv_str("service.name", long.as_str())],
            dropped_attributes_count: 2,
            entity_refs: Vec::new(),
        };
        batch.push_resource(
            node,
            vec![
                point(MetricId::Status, PointAttributes::of(shared), 0, 1.0),
                point(MetricId::GpuUtilization, PointAttributes::NONE, 5, -1.5),
                point(
                    MetricId::GpuUtilization,
                    PointAttributes::with(
                        Some(shared),
                        "hw.gpu.task",
                        ExtraValue::Static("general"),
                    ),
                    5,
                    0.0,
                ),
                point(
                    MetricId::Throttle,
                    PointAttributes::with(None, "k", ExtraValue::Owned(long.clone().into())),
                    7,
                    f64::MAX,
                ),
                point(
                    MetricId::Errors,
                    PointAttributes::with(Some(empty_set), "error.type", ExtraValue::Static("")),
                    7,
                    2.0,
                ),
                BatchPoint {
                    value: number_data_point::Value::AsInt(i64::MIN),
                    end: 0,
                    ..point(MetricId::Energy, PointAttributes::of(shared), 1, 0.0)
                },
            ],
        );
        batch.push_resource(Resource::default(), Vec::new());
        batch.push_resource(
            Resource::default(),
            vec![BatchPoint {
                value: number_data_point::Value::AsInt(-1),
                ..point(
                    MetricId::ProcessGpuMemoryUsage,
                    PointAttributes::of(shared),
                    3,
                    0.0,
                )
            }],
        );
        batch
    }

    #[test]
    fn encoding_is_prosts_byte_for_byte() {
        for batch in [MetricsBatch::default(), tricky_batch()] {
            let bytes = batch.encode();
            let request = batch.clone().into_request();
            assert_eq!(bytes, request.encode_to_vec());
            let back = ExportMetricsServiceRequest::decode(bytes.as_slice()).expect("decodes");
            assert_eq!(back, request);
        }
    }

    /// A node-sized resource (over the counting sort's threshold, with a scope body over 16 KiB
    /// so three-byte lengths are written too): the same bytes as prost, and each metric's points
    /// in push order.
    #[test]
    fn a_large_resource_is_sorted_stably_and_encoded_as_prost_does() {
        let metrics = [
            MetricId::Status,
            MetricId::GpuUtilization,
            MetricId::Energy,
            MetricId::Throttle,
            MetricId::ProcessGpuMemoryUsage,
            MetricId::Errors,
        ];
        let mut batch = MetricsBatch::default();
        let set = batch.add_attribute_set(vec![kv_str("hw.id", "GPU-0"), kv_int("gpu.index", 0)]);
        let points: Vec<BatchPoint> = (0..600u32)
            .map(|i| {
                let metric = metrics[(i as usize * 7 + i as usize / 5) % metrics.len()];
                point(
                    metric,
                    PointAttributes::of(set),
                    u64::from(i) + 1,
                    f64::from(i),
                )
            })
            .collect();
        let mut expected = points.clone();
        expected.sort_by_key(|p| p.metric as usize);
        batch.push_resource(Resource::default(), points);
        assert_eq!(batch.resources[0].points, expected);

        let bytes = batch.encode();
        assert!(bytes.len() > 16 * 1024, "{} bytes", bytes.len());
        assert_eq!(bytes, batch.clone().into_request().encode_to_vec());
    }

    /// Scopes given to the encoder end the first resource, byte for byte what prost writes for
    /// the request with them appended to its first `ResourceMetrics`; the other resources are as
    /// without them, and an empty batch leaves them out.
    #[test]
    fn scopes_given_to_the_encoder_end_the_first_resource() {
        use opentelemetry_proto::tonic::common::v1::InstrumentationScope;

        let health = ScopeMetrics {
            scope: Some(InstrumentationScope {
                name: "gpulse".into(),
                version: "health".into(),
                ..InstrumentationScope::default()
            }),
            metrics: vec![Metric {
                name: "gpulse.sample.stalled".into(),
                ..Metric::default()
            }],
            schema_url: String::new(),
        };
        let mut scopes = Vec::new();
        message::encode(2, &health, &mut scopes);

        let batch = tricky_batch();
        let bytes = batch.encode_with_first_resource_scopes(&scopes);
        let mut expected = batch.clone().into_request();
        assert!(
            expected.resource_metrics.len() >= 2,
            "a first and a later resource"
        );
        expected.resource_metrics[0].scope_metrics.push(health);
        assert_eq!(bytes, expected.encode_to_vec());
        assert!(MetricsBatch::default()
            .encode_with_first_resource_scopes(&scopes)
            .is_empty());
    }

    #[test]
    fn points_are_grouped_by_metric_in_table_order_keeping_push_order() {
        let request = tricky_batch().into_request();
        let names: Vec<&str> = request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "hw.gpu.utilization",
                "hw.energy",
                "nvidia.gpu.throttle",
                "hw.errors",
                "hw.status"
            ]
        );
        let util = &request.resource_metrics[0].scope_metrics[0].metrics[0];
        let Some(Data::Gauge(g)) = &util.data else {
            panic!("gauge expected: {util:?}");
        };
        assert_eq!(g.data_points[0].attributes.len(), 0);
        assert_eq!(g.data_points[1].attributes.len(), 6, "shared list + extra");
        assert_eq!(
            g.data_points[1].attributes[5],
            kv_str("hw.gpu.task", "general")
        );
    }
}
