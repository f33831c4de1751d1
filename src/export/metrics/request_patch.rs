//! The last window's encoded request, kept so that a window shaped as the last one (the same
//! resources, the same points of the same metrics with the same attributes, in the same order)
//! is encoded by copying those bytes and writing its timestamps and values in place: at a fixed
//! node that is every window but the ones where a process comes, goes or changes its
//! attributes.
//!
//! Why it is exact: every byte of an OTLP request outside the points' `start_time_unix_nano`,
//! `time_unix_nano` and value fields (`fixed64`/`sfixed64`/`double`: eight bytes whatever the
//! value) is determined by the shape this module compares, so a window of equal shape encodes
//! to equal bytes everywhere else, and the fields' positions are those recorded while the last
//! window was written. gpulse's own health (the scope metrics ending the first resource) is
//! copied in when its length is the last window's. Debug builds check every patched request
//! against a fresh encoding.
//!
//! The last request is kept as the [`Bytes`] handed to the export queue, not as a copy: while
//! the queue holds it, it costs no memory of its own, and once delivered (the queue dropped
//! it) the next window writes into that buffer in place. A request still queued (a backend
//! down, a retry pending) is never written to: the window then patches a copy.
//!
//! Owned by [`EncodeCache`](super::EncodeCache); used by
//! [`MetricsBatch::encode_cached`](super::MetricsBatch::encode_cached).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use opentelemetry_proto::tonic::metrics::v1::number_data_point;

use super::batch::{BatchPoint, MetricsBatch, PointAttributes, ResourceBody};
use crate::schema::MetricId;

/// What a point's bytes depend on besides its timestamps' and value's eight-byte payloads.
#[derive(Debug, Clone, PartialEq)]
struct PointShape {
    metric: MetricId,
    attributes: PointAttributes,
    /// Whether each timestamp is written (a zero one is left out, as proto3 does).
    start: bool,
    end: bool,
    /// `as_int` rather than `as_double` (another field tag).
    int: bool,
}

impl PointShape {
    fn of(p: &BatchPoint) -> Self {
        Self {
            metric: p.metric,
            attributes: p.attributes.clone(),
            start: p.start != 0,
            end: p.end != 0,
            int: matches!(p.value, number_data_point::Value::AsInt(_)),
        }
    }

    /// `PointShape::of(p) == *self`, without building one.
    fn fits(&self, p: &BatchPoint) -> bool {
        self.metric == p.metric
            && self.start == (p.start != 0)
            && self.end == (p.end != 0)
            && self.int == matches!(p.value, number_data_point::Value::AsInt(_))
            && self.attributes == p.attributes
    }
}

/// A resource as the last window had it. An encoded one is held by its `Arc`, so the
/// allocation it is compared by cannot be freed and reused by another resource meanwhile.
fn same_resource(kept: &ResourceBody, now: &ResourceBody) -> bool {
    match (kept, now) {
        (ResourceBody::Encoded(a), ResourceBody::Encoded(b)) => Arc::ptr_eq(a, b),
        (ResourceBody::Built(a), ResourceBody::Built(b)) => a == b,
        _ => false,
    }
}

/// The last window's request and what its bytes were encoded from.
#[derive(Debug, Default)]
pub(super) struct LastRequest {
    /// Empty until a window was recorded (and after a window with no resource).
    bytes: Bytes,
    resources: Vec<ResourceBody>,
    /// How many points each of `resources` had.
    point_counts: Vec<usize>,
    /// Every point, in the order written.
    shapes: Vec<PointShape>,
    /// For every point, where its first fixed-width field (its key byte) is in `bytes`.
    pub(super) fields_at: Vec<usize>,
    /// Where gpulse's health scopes were written, and their length.
    scopes_at: usize,
    scopes_len: usize,
    /// How many windows were encoded afresh (the others were patched).
    fresh: u64,
}

impl LastRequest {
    /// This window's request made from the last one, or `None` when its shape differs (the
    /// caller encodes it afresh and records it). `sets_changed`: whether any shared attribute
    /// list changed since the last window (their bytes are inside the points).
    pub(super) fn patched(
        &mut self,
        batch: &MetricsBatch,
        scopes: &[u8],
        sets_changed: bool,
    ) -> Option<Bytes> {
        let resources = batch.resources();
        if sets_changed
            || self.bytes.is_empty()
            || scopes.len() != self.scopes_len
            || resources.len() != self.resources.len()
        {
            return None;
        }
        // The last request's buffer itself when nothing else holds it; else a copy. From here
        // on, a window that turns out to be shaped otherwise is encoded afresh, so the
        // half-written buffer is simply dropped.
        let mut out = match std::mem::take(&mut self.bytes).try_into_mut() {
            Ok(own) => own,
            Err(queued) => BytesMut::from(&queued[..]),
        };
        let mut shapes = self.shapes.iter();
        let mut fields_at = self.fields_at.iter();
        for ((resource, kept), &count) in resources
            .iter()
            .zip(&self.resources)
            .zip(&self.point_counts)
        {
            if resource.points.len() != count || !same_resource(kept, &resource.resource) {
                return None;
            }
            for p in &resource.points {
                if !shapes.next()?.fits(p) {
                    return None;
                }
                write_fixed_fields(p, *fields_at.next()?, &mut out);
            }
        }
        out[self.scopes_at..self.scopes_at + scopes.len()].copy_from_slice(scopes);
        let out = out.freeze();
        self.bytes = out.clone();
        Some(out)
    }

    /// Forgets the last window and readies `fields_at` for the one about to be encoded afresh.
    pub(super) fn start_recording(&mut self) {
        self.fresh += 1;
        self.bytes = Bytes::new();
        self.fields_at.clear();
    }

    /// Keeps `bytes`, the request just encoded from `batch` (its points' fields recorded in
    /// `fields_at` meanwhile), with gpulse's health at `scopes_at..scopes_at + scopes_len`.
    pub(super) fn record(
        &mut self,
        batch: &MetricsBatch,
        bytes: &Bytes,
        (scopes_at, scopes_len): (usize, usize),
    ) {
        let resources = batch.resources();
        self.resources.clear();
        self.resources
            .extend(resources.iter().map(|r| r.resource.clone()));
        self.point_counts.clear();
        self.point_counts
            .extend(resources.iter().map(|r| r.points.len()));
        self.shapes.clear();
        self.shapes
            .extend(resources.iter().flat_map(|r| &r.points).map(PointShape::of));
        debug_assert_eq!(self.fields_at.len(), self.shapes.len());
        self.bytes = bytes.clone();
        self.scopes_at = scopes_at;
        self.scopes_len = scopes_len;
    }
}

impl LastRequest {
    /// How many windows were encoded afresh rather than patched.
    #[cfg(test)]
    pub(super) fn fresh_encodings(&self) -> u64 {
        self.fresh
    }
}

/// Writes `p`'s timestamps and value over the eight-byte payloads of the fields starting at
/// `at` (each field is its one-byte key, then the payload), in the order the encoder writes
/// them: start, end, value.
fn write_fixed_fields(p: &BatchPoint, mut at: usize, out: &mut [u8]) {
    let mut put = |payload: [u8; 8]| {
        out[at + 1..at + 9].copy_from_slice(&payload);
        at += 9;
    };
    if p.start != 0 {
        put(p.start.to_le_bytes());
    }
    if p.end != 0 {
        put(p.end.to_le_bytes());
    }
    put(match p.value {
        number_data_point::Value::AsDouble(v) => v.to_le_bytes(),
        number_data_point::Value::AsInt(v) => v.to_le_bytes(),
    });
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message as _;

    use super::*;
    use crate::export::metrics::batch::{EncodedResource, ExtraValue};
    use crate::export::metrics::EncodeCache;
    use crate::export::resource::{kv_int, kv_str};

    const SECOND: u64 = 1_000_000_000;

    /// What a window's shape is made of, each part changeable on its own.
    #[derive(Clone)]
    struct Shape {
        metric: MetricId,
        task: &'static str,
        pod: Option<String>,
        start: u64,
        int: bool,
        node: &'static str,
        device: &'static str,
        process: Arc<EncodedResource>,
    }

    fn process_resource(pid: i64) -> Arc<EncodedResource> {
        Arc::new(EncodedResource::new(Resource {
            attributes: vec![kv_int("process.pid", pid)],
            ..Resource::default()
        }))
    }

    fn shape() -> Shape {
        Shape {
            metric: MetricId::GpuUtilization,
            task: "general",
            pod: None,
            start: 5 * SECOND,
            int: false,
            node: "node-a",
            device: "GPU-0000",
            process: process_resource(42),
        }
    }

    /// A node resource with a device list and two points, then a process resource with one;
    /// `n` moves every timestamp and value.
    fn window(s: &Shape, n: u64) -> MetricsBatch {
        let mut batch = MetricsBatch::default();
        let device =
            batch.add_attribute_set(vec![kv_str("hw.id", s.device), kv_int("gpu.index", 0)]);
        let value = |v: f64| {
            if s.int {
                number_data_point::Value::AsInt(v as i64)
            } else {
                number_data_point::Value::AsDouble(v)
            }
        };
        let end = s.start + n * SECOND;
        let node_points = vec![
            BatchPoint {
                metric: s.metric,
                attributes: PointAttributes::of(device),
                start: s.start,
                end,
                value: value(n as f64 * 1.5),
            },
            BatchPoint {
                metric: MetricId::GpuUtilization,
                attributes: PointAttributes::with(
                    Some(device),
                    "hw.gpu.task",
                    ExtraValue::Static(s.task),
                ),
                start: s.start,
                end,
                value: value(n as f64 * 2.5),
            },
        ];
        let node = Resource {
            attributes: vec![kv_str("host.name", s.node)],
            ..Resource::default()
        };
        batch.push_resource(node, node_points);
        let attributes = match &s.pod {
            Some(pod) => PointAttributes::with(
                Some(device),
                "k8s.pod.name",
                ExtraValue::Owned(pod.as_str().into()),
            ),
            None => PointAttributes::of(device),
        };
        batch.push_encoded_resource(
            Arc::clone(&s.process),
            vec![BatchPoint {
                metric: MetricId::ProcessGpuMemoryUsage,
                attributes,
                start: s.start,
                end,
                value: value(n as f64 * 1024.0),
            }],
        );
        batch
    }

    fn scopes(len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::message::encode(
            2,
            &Resource {
                attributes: vec![kv_str("health", "x".repeat(len))],
                ..Resource::default()
            },
            &mut out,
        );
        out
    }

    /// Encodes `batch` through `cache` and checks it against a fresh encoding and the prost
    /// form; returns whether it was encoded afresh.
    fn encode(batch: &MetricsBatch, scopes: &[u8], cache: &mut EncodeCache, what: &str) -> bool {
        let before = cache.last.fresh_encodings();
        let bytes = batch.encode_cached(scopes, cache);
        assert_eq!(
            bytes,
            batch.encode_with_first_resource_scopes(scopes),
            "{what}: bytes differ from a fresh encoding"
        );
        if scopes.is_empty() {
            let decoded = ExportMetricsServiceRequest::decode(&bytes[..]).unwrap();
            assert_eq!(decoded, batch.clone().into_request(), "{what}");
        }
        cache.last.fresh_encodings() > before
    }

    /// Windows that differ from the last only in timestamps, values and the health's bytes
    /// are patched; each change of shape is encoded afresh, and the window after it patched
    /// again. The bytes always equal a fresh encoding's.
    #[test]
    fn a_window_is_patched_exactly_when_only_its_values_moved() {
        let mut cache = EncodeCache::new();
        let base = shape();
        assert!(encode(&window(&base, 1), &[], &mut cache, "first window"));
        assert!(!encode(&window(&base, 2), &[], &mut cache, "values moved"));
        assert!(!encode(
            &window(&base, 3),
            &[],
            &mut cache,
            "values moved again"
        ));

        let health = scopes(10);
        assert!(encode(
            &window(&base, 4),
            &health,
            &mut cache,
            "health joins"
        ));
        let other_health = {
            let mut h = scopes(10);
            let at = h.len() - 1;
            h[at] = b'y';
            h
        };
        assert!(!encode(
            &window(&base, 5),
            &other_health,
            &mut cache,
            "health's values moved"
        ));
        assert!(encode(
            &window(&base, 6),
            &scopes(11),
            &mut cache,
            "health grew"
        ));

        let changes: Vec<(&str, Shape)> = vec![
            (
                "another metric",
                Shape {
                    metric: MetricId::GpuMemoryUsage,
                    ..base.clone()
                },
            ),
            (
                "another extra value",
                Shape {
                    task: "compute",
                    ..base.clone()
                },
            ),
            (
                "an owned extra",
                Shape {
                    pod: Some("train-0".into()),
                    ..base.clone()
                },
            ),
            (
                "another owned extra",
                Shape {
                    pod: Some("train-1".into()),
                    ..base.clone()
                },
            ),
            (
                "no start time",
                Shape {
                    start: 0,
                    ..base.clone()
                },
            ),
            (
                "integer values",
                Shape {
                    int: true,
                    ..base.clone()
                },
            ),
            (
                "a device renamed (its attribute list changed)",
                Shape {
                    device: "GPU-0001",
                    ..base.clone()
                },
            ),
            (
                "another node resource",
                Shape {
                    node: "node-b",
                    ..base.clone()
                },
            ),
            (
                "an equal process resource, encoded anew",
                Shape {
                    process: process_resource(42),
                    ..base.clone()
                },
            ),
        ];
        for (what, changed) in changes {
            let health = scopes(11);
            assert!(
                encode(&window(&changed, 7), &health, &mut cache, what),
                "{what}: encoded afresh"
            );
            assert!(
                !encode(&window(&changed, 8), &health, &mut cache, what),
                "{what}: the next window patched"
            );
        }
    }

    /// A delivered request's buffer (nothing else holds it) is written in place by the next
    /// window; one still held by the queue is left as it was, and the window patches a copy.
    #[test]
    fn a_queued_request_is_never_written_to() {
        let mut cache = EncodeCache::new();
        let s = shape();
        let first = window(&s, 1).encode_cached(&[], &mut cache);
        let first_at = first.as_ptr();
        drop(first);
        let second = window(&s, 2).encode_cached(&[], &mut cache);
        assert_eq!(second.as_ptr(), first_at, "the delivered buffer is reused");

        let held = second.clone();
        let third = window(&s, 3).encode_cached(&[], &mut cache);
        assert_ne!(third.as_ptr(), held.as_ptr(), "a queued buffer is copied");
        assert_eq!(
            held,
            window(&s, 2).encode(),
            "the queued request is unchanged"
        );
        assert_eq!(third, window(&s, 3).encode());
        assert_eq!(cache.last.fresh_encodings(), 1);
    }
}
