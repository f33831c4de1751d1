//! One export window's metrics between the request builder and the encoder: the shape of an
//! `ExportMetricsServiceRequest` without its per-point allocations. A metric is its
//! [`METRICS`] row, a data point names a shared attribute list plus at most one extra
//! attribute, a resource is built for the window or kept encoded from an earlier one. The
//! prost form ([`MetricsBatch::into_request`]) is the reference for tests and OTLP/JSON; the
//! protobuf encoding is [`super::encoding`]'s. Depends only on the schema.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::encoding::message;

use crate::export::resource::{gpulse_scope, kv_str};
use crate::schema::{Instrument, MetricId, METRICS, METRIC_COUNT};

/// Index of a shared attribute list in its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AttributeSetId(pub(super) u32);

/// The value of a data point's extra attribute: nearly always a constant of the builder.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExtraValue {
    Static(&'static str),
    Owned(Box<str>),
}

impl ExtraValue {
    pub(super) fn as_str(&self) -> &str {
        match self {
            ExtraValue::Static(s) => s,
            ExtraValue::Owned(s) => s,
        }
    }
}

/// A data point's attributes: a shared list (if any), then one more string attribute (if any).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PointAttributes {
    pub set: Option<AttributeSetId>,
    pub extra: Option<(&'static str, ExtraValue)>,
}

impl PointAttributes {
    pub const NONE: PointAttributes = PointAttributes {
        set: None,
        extra: None,
    };

    pub fn of(set: AttributeSetId) -> Self {
        Self {
            set: Some(set),
            extra: None,
        }
    }

    pub fn with(set: Option<AttributeSetId>, key: &'static str, value: ExtraValue) -> Self {
        Self {
            set,
            extra: Some((key, value)),
        }
    }
}

/// One data point of the metric `metric`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchPoint {
    pub metric: MetricId,
    pub attributes: PointAttributes,
    pub start: u64,
    pub end: u64,
    pub value: number_data_point::Value,
}

/// A resource with its protobuf encoding as the `resource` field (field 1) of a
/// `ResourceMetrics`, ready to copy: what the builder's `ProcessResources` keeps between windows
/// so a process that stays is neither rebuilt nor encoded again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EncodedResource {
    resource: Resource,
    pub(super) bytes: Box<[u8]>,
}

impl EncodedResource {
    pub(crate) fn new(resource: Resource) -> Self {
        let mut bytes = Vec::new();
        message::encode(1, &resource, &mut bytes);
        Self {
            resource,
            bytes: bytes.into_boxed_slice(),
        }
    }
}

/// A resource of the batch: built for this window, or kept encoded from an earlier one.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ResourceBody {
    Built(Resource),
    Encoded(Arc<EncodedResource>),
}

impl ResourceBody {
    fn into_resource(self) -> Resource {
        match self {
            ResourceBody::Built(r) => r,
            ResourceBody::Encoded(e) => e.resource.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct BatchResource {
    pub(super) resource: ResourceBody,
    /// Grouped by metric, in [`METRICS`] order; within a metric, in the order pushed.
    pub(super) points: Vec<BatchPoint>,
}

/// The metrics of one export window: resources in request order, each with its data points.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsBatch {
    pub(super) resources: Vec<BatchResource>,
    pub(super) attribute_sets: Vec<Vec<KeyValue>>,
}

impl MetricsBatch {
    pub(crate) fn with_capacity(resources: usize) -> Self {
        Self {
            resources: Vec::with_capacity(resources),
            attribute_sets: Vec::new(),
        }
    }

    /// Registers an attribute list that data points of any resource of this batch can share.
    pub(crate) fn add_attribute_set(&mut self, attributes: Vec<KeyValue>) -> AttributeSetId {
        let id = AttributeSetId(self.attribute_sets.len() as u32);
        self.attribute_sets.push(attributes);
        id
    }

    /// Registers the attribute list `base` extended by `more` (a point with two attributes beyond
    /// a shared list: `process.gpu.time` by state and cause).
    pub(crate) fn extend_attribute_set(
        &mut self,
        base: AttributeSetId,
        more: impl IntoIterator<Item = KeyValue>,
    ) -> AttributeSetId {
        let mut attributes = self.attribute_sets[base.0 as usize].clone();
        attributes.extend(more);
        self.add_attribute_set(attributes)
    }

    /// Appends a resource; `points` are sorted into metric order here.
    pub(crate) fn push_resource(&mut self, resource: Resource, mut points: Vec<BatchPoint>) {
        sort_by_metric(&mut points);
        self.resources.push(BatchResource {
            resource: ResourceBody::Built(resource),
            points,
        });
    }

    /// [`MetricsBatch::push_resource`] for a resource encoded earlier: its bytes are copied, not
    /// encoded again.
    pub(crate) fn push_encoded_resource(
        &mut self,
        resource: Arc<EncodedResource>,
        mut points: Vec<BatchPoint>,
    ) {
        sort_by_metric(&mut points);
        self.resources.push(BatchResource {
            resource: ResourceBody::Encoded(resource),
            points,
        });
    }

    /// The resources in request order.
    pub(super) fn resources(&self) -> &[BatchResource] {
        &self.resources
    }

    /// Whether the batch has no resource yet.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// The number of data points: what the export queue counts when it drops the request.
    pub fn point_count(&self) -> usize {
        self.resources.iter().map(|r| r.points.len()).sum()
    }

    /// The same metrics as a prost request (tests, OTLP/JSON).
    pub fn into_request(self) -> ExportMetricsServiceRequest {
        let sets = &self.attribute_sets;
        let resource_metrics = self
            .resources
            .into_iter()
            .map(|r| ResourceMetrics {
                resource: Some(r.resource.into_resource()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(gpulse_scope()),
                    metrics: to_metrics(&r.points, sets),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            })
            .collect();
        ExportMetricsServiceRequest { resource_metrics }
    }
}

/// Stable, so points of one metric keep the order they were pushed in. A counting sort for the
/// node resource (hundreds of points, a few dozen metrics): each point moves once, where a
/// comparison sort moves the ~90-byte points many times through a scratch buffer.
fn sort_by_metric(points: &mut [BatchPoint]) {
    const SMALL: usize = 32;
    if points.len() <= SMALL {
        points.sort_by_key(|p| p.metric as usize);
        return;
    }
    // Where each metric's points start in the sorted order, then each point's destination.
    let mut next = [0usize; METRIC_COUNT];
    for p in points.iter() {
        next[p.metric as usize] += 1;
    }
    let mut start = 0;
    for slot in &mut next {
        let count = *slot;
        *slot = start;
        start += count;
    }
    let mut destination: Vec<usize> = points
        .iter()
        .map(|p| {
            let slot = &mut next[p.metric as usize];
            *slot += 1;
            *slot - 1
        })
        .collect();
    // Apply the permutation in place, one cycle at a time.
    for i in 0..points.len() {
        while destination[i] != i {
            let j = destination[i];
            points.swap(i, j);
            destination.swap(i, j);
        }
    }
}

/// The points of each metric in turn (each slice non-empty, one metric).
pub(super) fn metric_runs(points: &[BatchPoint]) -> impl Iterator<Item = &[BatchPoint]> {
    points.chunk_by(|a, b| a.metric as usize == b.metric as usize)
}

/// Prost metrics of one resource's points.
fn to_metrics(points: &[BatchPoint], sets: &[Vec<KeyValue>]) -> Vec<Metric> {
    metric_runs(points)
        .map(|run| {
            let spec = &METRICS[run[0].metric as usize];
            let data_points = run
                .iter()
                .map(|p| NumberDataPoint {
                    attributes: point_attributes(&p.attributes, sets),
                    start_time_unix_nano: p.start,
                    time_unix_nano: p.end,
                    exemplars: Vec::new(),
                    flags: 0,
                    value: Some(p.value),
                })
                .collect();
            let data = match spec.instrument {
                Instrument::Gauge => Data::Gauge(Gauge { data_points }),
                Instrument::Counter | Instrument::UpDownCounter => Data::Sum(Sum {
                    data_points,
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: spec.instrument == Instrument::Counter,
                }),
            };
            Metric {
                name: spec.name.to_string(),
                description: spec.description.to_string(),
                unit: spec.unit.to_string(),
                metadata: Vec::new(),
                data: Some(data),
            }
        })
        .collect()
}

fn point_attributes(attributes: &PointAttributes, sets: &[Vec<KeyValue>]) -> Vec<KeyValue> {
    let base = attributes.set.map_or(&[][..], |id| &sets[id.0 as usize]);
    let mut out = Vec::with_capacity(base.len() + 1);
    out.extend_from_slice(base);
    if let Some((key, value)) = &attributes.extra {
        out.push(kv_str(key, value.as_str()));
    }
    out
}
