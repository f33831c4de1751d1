//! What the request encoder keeps from one export window to the next, so that encoding a window
//! costs about what changed in it: the last request, for a window of the same shape to be
//! patched from (see [`super::request_patch`]); each shared attribute list's encoded bytes (a
//! device's nine hardware attributes, a process's on one device), the `gpulse` scope's bytes,
//! and the sizing pass's scratch vectors, which keep their capacity instead of growing afresh
//! every window.
//!
//! Owned by whoever encodes one request per window (the exporter) and passed to
//! [`MetricsBatch::encode_cached`](super::MetricsBatch::encode_cached). The bytes it hands out are
//! always those of the window being encoded: a list is reused only when it equals, attribute for
//! attribute, the list registered at the same place in the last window (the builder registers
//! them in a stable order: devices in window order, then processes by PID), and encoded again
//! otherwise. Depends on nothing of gpulse's.

use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::encoding::message;

use super::request_patch::LastRequest;

/// `NumberDataPoint.attributes`.
const POINT_ATTRIBUTES_FIELD: u32 = 7;

/// The encoder's state between windows; empty (and equivalent to encoding from scratch) until
/// the first window.
#[derive(Debug, Default)]
pub struct EncodeCache {
    /// The attribute lists of the last window, by registration index.
    lists: Vec<Vec<KeyValue>>,
    /// Each of `lists` as `NumberDataPoint.attributes` entries, ready to copy.
    pub(super) encoded: Vec<Vec<u8>>,
    /// The `gpulse` scope as `ScopeMetrics.scope`, written at the first window.
    pub(super) scope: Vec<u8>,
    pub(super) scratch: Scratch,
    /// The last window's request, for a window of the same shape to be patched from.
    pub(super) last: LastRequest,
}

/// The sizing pass's vectors, cleared (capacity kept) at each window.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Per resource its body and scope-metrics lengths, per metric its body and data lengths.
    pub(super) sizes: Vec<usize>,
    /// Each point's body length.
    pub(super) point_lens: Vec<usize>,
    /// The resources built this window, encoded back to back.
    pub(super) resources: Vec<u8>,
    /// Where each of them ends in `resources`.
    pub(super) resource_ends: Vec<usize>,
}

impl Scratch {
    pub(super) fn clear(&mut self) {
        self.sizes.clear();
        self.point_lens.clear();
        self.resources.clear();
        self.resource_ends.clear();
    }
}

impl EncodeCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the encoding of each of `lists` (this window's attribute lists, in registration
    /// order) available to [`EncodeCache::encoded`], reusing the last window's bytes for every
    /// list that is unchanged. Equality is checked on the attributes themselves, so a changed
    /// value (a driver update, a renamed pod) is never sent with stale bytes. Returns whether
    /// any list changed, came or went.
    pub(super) fn refresh(&mut self, lists: &[Vec<KeyValue>]) -> bool {
        let mut changed = self.lists.len() != lists.len();
        self.lists.truncate(lists.len());
        self.encoded.truncate(lists.len());
        for (index, list) in lists.iter().enumerate() {
            if self.lists.get(index) == Some(list) {
                continue;
            }
            changed = true;
            let mut bytes = Vec::new();
            encode_attributes_into(list, &mut bytes);
            if index < self.lists.len() {
                self.lists[index].clone_from(list);
                self.encoded[index] = bytes;
            } else {
                self.lists.push(list.clone());
                self.encoded.push(bytes);
            }
        }
        changed
    }
}

/// Each attribute as a `NumberDataPoint.attributes` entry, appended to `out`: the bytes a point
/// that shares the list copies.
pub(super) fn encode_attributes_into(list: &[KeyValue], out: &mut Vec<u8>) {
    message::encode_repeated(POINT_ATTRIBUTES_FIELD, list, out);
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::number_data_point;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message as _;

    use super::*;
    use crate::export::metrics::encoding::{
        AttributeSetId, BatchPoint, ExtraValue, MetricsBatch, PointAttributes,
    };
    use crate::export::resource::{kv_int, kv_str};
    use crate::schema::MetricId;

    /// One device's attribute list, as the builder registers it.
    fn device_list(index: i64, driver: &str) -> Vec<KeyValue> {
        vec![
            kv_str("hw.id", format!("GPU-{index:04}")),
            kv_str("hw.driver_version", driver),
            kv_int("gpu.index", index),
        ]
    }

    fn point(metric: MetricId, set: AttributeSetId, end: u64, value: f64) -> BatchPoint {
        BatchPoint {
            metric,
            attributes: PointAttributes::of(set),
            start: end - 1_000_000_000,
            end,
            value: number_data_point::Value::AsDouble(value),
        }
    }

    /// A window shaped as the builder's: a node resource with a list per device, then a
    /// resource per process whose points share a process-on-device list. `end` and `value` move
    /// every window, as timestamps and readings do.
    fn window(devices: &[(i64, &str)], pids: &[i64], end: u64, value: f64) -> MetricsBatch {
        let mut batch = MetricsBatch::default();
        let mut node_points = Vec::new();
        for &(index, driver) in devices {
            let set = batch.add_attribute_set(device_list(index, driver));
            node_points.push(point(
                MetricId::GpuUtilization,
                set,
                end,
                value + index as f64,
            ));
            node_points.push(BatchPoint {
                attributes: PointAttributes::with(
                    Some(set),
                    "hw.gpu.task",
                    ExtraValue::Static("general"),
                ),
                ..point(MetricId::GpuUtilization, set, end, value)
            });
        }
        let node = Resource {
            attributes: vec![kv_str("host.name", "node-a")],
            ..Resource::default()
        };
        batch.push_resource(node, node_points);
        for &pid in pids {
            let set = batch.add_attribute_set(vec![
                kv_str("hw.id", format!("GPU-{:04}", pid % 2)),
                kv_int("process.pid", pid),
            ]);
            let resource = Resource {
                attributes: vec![kv_int("process.pid", pid)],
                ..Resource::default()
            };
            batch.push_resource(
                resource,
                vec![point(
                    MetricId::ProcessGpuMemoryUsage,
                    set,
                    end,
                    value * 2.0,
                )],
            );
        }
        batch
    }

    /// Window after window through one kept cache (values and timestamps moving, a process
    /// leaving so every later list shifts place, one joining, a device's driver version
    /// changing inside an otherwise equal list), the request is byte for byte the one encoded
    /// without a cache, and decodes to the same request as the batch's prost form.
    #[test]
    fn a_kept_cache_encodes_each_window_as_a_fresh_encoder_does() {
        let scopes = {
            let mut scopes = Vec::new();
            message::encode(2, &Resource::default(), &mut scopes);
            scopes
        };
        let second = 1_700_000_000_000_000_000u64;
        let windows = [
            window(&[(0, "550.54"), (1, "550.54")], &[10, 20, 30], second, 1.0),
            window(
                &[(0, "550.54"), (1, "550.54")],
                &[10, 20, 30],
                second * 2,
                2.5,
            ),
            window(&[(0, "550.54"), (1, "550.54")], &[20, 30], second * 3, 3.5),
            window(
                &[(0, "550.54"), (1, "570.12")],
                &[20, 30, 40],
                second * 4,
                4.5,
            ),
            window(&[(0, "550.54")], &[], second * 5, 5.5),
            window(
                &[(0, "550.54"), (1, "570.12")],
                &[20, 30, 40],
                second * 6,
                6.5,
            ),
        ];
        let mut cache = EncodeCache::new();
        let mut previous: Option<ExportMetricsServiceRequest> = None;
        for (n, batch) in windows.iter().enumerate() {
            let cached = batch.encode_cached(&[], &mut cache);
            assert_eq!(
                cached,
                batch.encode(),
                "window {n}: bytes differ from a fresh encoding"
            );
            let decoded = ExportMetricsServiceRequest::decode(&cached[..])
                .unwrap_or_else(|e| panic!("window {n} does not decode: {e}"));
            assert_eq!(decoded, batch.clone().into_request(), "window {n}");
            assert_ne!(
                Some(&decoded),
                previous.as_ref(),
                "window {n} repeats the last one"
            );
            previous = Some(decoded);

            let with_scopes = batch.encode_cached(&scopes, &mut cache);
            assert_eq!(
                with_scopes,
                batch.encode_with_first_resource_scopes(&scopes),
                "window {n} with scopes"
            );
        }
    }

    /// What is kept is reused: an unchanged list keeps its bytes (the same allocation), a
    /// changed one is encoded again, and lists past the window's last are forgotten.
    #[test]
    fn only_changed_lists_are_encoded_again() {
        let mut cache = EncodeCache::new();
        let first = [device_list(0, "550.54"), device_list(1, "550.54")];
        cache.refresh(&first);
        let kept: Vec<*const u8> = cache.encoded.iter().map(|b| b.as_ptr()).collect();

        cache.refresh(&[device_list(0, "550.54"), device_list(1, "570.12")]);
        assert_eq!(
            cache.encoded[0].as_ptr(),
            kept[0],
            "an unchanged list is reused"
        );
        let mut expected = Vec::new();
        encode_attributes_into(&device_list(1, "570.12"), &mut expected);
        assert_eq!(
            cache.encoded[1], expected,
            "a changed list is encoded again"
        );

        cache.refresh(&[device_list(0, "550.54")]);
        assert_eq!(cache.encoded.len(), 1);
        assert_eq!(cache.lists.len(), 1);
    }
}
