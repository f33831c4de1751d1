//! gpulse's own health (`gpulse.*` metrics) on the OpenTelemetry SDK: an `SdkMeterProvider` with
//! the node's resource whose observable instruments read one [`HealthReading`] per collection.
//! The provider's reader is a `ManualReader`: the pipeline collects once per export window, on
//! its own tick, and the health rides in that window's metrics request (written into the node
//! resource as the request is encoded, [`SelfTelemetry::window_request`]), so one request per
//! window goes out, as before the SDK, and no reader thread wakes on a timer of its own.
//!
//! This module owns the instrument names, units and attributes of the health metrics and when
//! they are read; where the numbers come from is the caller's ([`super::exporter`]), given as a
//! closure, so this module depends on neither the sampler thread nor the analyzer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::metrics::{AsyncInstrument, Meter, MeterProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};
use opentelemetry_sdk::Resource;
use prost::Message as _;

use crate::export::metrics::{data_point_count, EncodeCache, MetricsBatch};
use crate::export::resource::{NodeIdentity, GPULSE_VERSION, SCOPE_NAME};
use crate::schema::attributes::AttributeId;
use crate::schema::attributes::AttributeId as A;

mod receiver;
pub use receiver::{ReceiverCounters, ReceiverReading, Refusal};

/// `ResourceMetrics.scope_metrics`: the field the health's scopes are written as.
const SCOPE_METRICS_FIELD: u32 = 2;

/// gpulse's health at one collection. Totals are since gpulse started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthReading {
    /// Requests waiting in the delivery queue, and their encoded bytes.
    pub queue_requests: u64,
    pub queue_bytes: u64,
    /// Requests (and their data points) dropped: over the byte bound, past the age bound, or
    /// refused for good.
    pub dropped_requests_total: u64,
    pub dropped_points_total: u64,
    /// Failed export attempts by reason (`error.type`).
    pub export_failures_total: BTreeMap<String, u64>,
    /// Duration of the last export attempt, when there was one.
    pub export_duration_last_seconds: Option<f64>,
    /// Mean and longest NVML sampling pass since the previous reading, when there was one.
    pub sample_duration_mean_seconds: Option<f64>,
    pub sample_duration_max_seconds: Option<f64>,
    /// NVML call errors by kind.
    pub nvml_errors_total: BTreeMap<String, u64>,
    pub stalled_ticks_total: u64,
    /// Active findings by rule, every rule present.
    pub findings_active: BTreeMap<String, u64>,
    /// What the OTLP receiver accepted and refused; `None` when it is off.
    pub receiver: Option<ReceiverReading>,
}

/// Reads gpulse's health; called once per collection.
pub type HealthSource = Box<dyn FnMut() -> HealthReading + Send>;

/// The running self-telemetry: a `MeterProvider` collected on demand, once per export window.
pub struct SelfTelemetry {
    provider: SdkMeterProvider,
    reader: Arc<ManualReader>,
    collection: Arc<Collection>,
}

impl std::fmt::Debug for SelfTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfTelemetry").finish_non_exhaustive()
    }
}

/// The provider owns its readers; this lets `SelfTelemetry` keep a handle on the same
/// `ManualReader` to collect from.
#[derive(Debug)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

impl SelfTelemetry {
    /// Registers the health instruments under the node resource; nothing is read until
    /// [`SelfTelemetry::collect`].
    pub fn start(node: &NodeIdentity, source: HealthSource) -> Self {
        let collection = Arc::new(Collection::new(source));
        // Cumulative, as the hand-built health metrics were (totals since start).
        let reader = Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        );
        let provider = SdkMeterProvider::builder()
            .with_resource(node_resource(node))
            .with_reader(SharedReader(Arc::clone(&reader)))
            .build();
        let scope = InstrumentationScope::builder(SCOPE_NAME)
            .with_version(GPULSE_VERSION)
            .build();
        register(&provider.meter_with_scope(scope), &collection);
        Self {
            provider,
            reader,
            collection,
        }
    }

    /// Reads the health once (every instrument sees the same [`HealthReading`]) and returns it
    /// as an OTLP request on the node resource, with its data-point count. `None` when the
    /// collection failed (logged) or produced no point.
    pub fn collect(&self) -> Option<(ExportMetricsServiceRequest, u64)> {
        let mut rm = ResourceMetrics::default();
        let collected = self.reader.collect(&mut rm);
        // The next collection's callbacks read afresh, whatever happened to this one.
        self.collection.finish();
        if let Err(e) = collected {
            tracing::warn!("gpulse's own health metrics could not be collected: {e}");
            return None;
        }
        let request = ExportMetricsServiceRequest::from(&rm);
        let points = point_count(&request);
        (points > 0).then_some((request, points))
    }

    /// One export window's metrics request, encoded, with gpulse's health added, and its data
    /// points (0: nothing to send). The health's scope metrics end the window's first resource,
    /// the node's (the window builder always writes it first), so a backend sees one node entity
    /// and one request per window; a window without points sends the health alone on the node
    /// resource. `cache` is the encoder's state kept between windows (the exporter's).
    pub fn window_request(&self, window: &MetricsBatch, cache: &mut EncodeCache) -> (Bytes, u64) {
        let points = window.point_count() as u64;
        let Some((health, health_points)) = self.collect() else {
            return if points > 0 {
                (window.encode_cached(&[], cache), points)
            } else {
                (Bytes::new(), 0)
            };
        };
        if points == 0 {
            return (health.encode_to_vec().into(), health_points);
        }
        let mut scopes = Vec::new();
        for scope in health
            .resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
        {
            prost::encoding::message::encode(SCOPE_METRICS_FIELD, scope, &mut scopes);
        }
        (window.encode_cached(&scopes, cache), points + health_points)
    }

    /// Stops the provider. The last window (`window_request` at shutdown) already carried the
    /// last health reading.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!("gpulse's own health metrics provider did not shut down cleanly: {e}");
        }
    }
}

/// The node resource, attribute for attribute as `export::resource::node_resource` writes it,
/// so a backend sees the health metrics and the device metrics on one entity. Built empty: the
/// SDK's default detectors would add `telemetry.sdk.name = opentelemetry` and read the
/// environment again, which `config` already did.
fn node_resource(node: &NodeIdentity) -> Resource {
    let mut attrs = vec![
        KeyValue::new(A::ServiceName.key(), node.service_name.clone()),
        KeyValue::new(A::ServiceInstanceId.key(), node.service_instance_id.clone()),
        KeyValue::new(A::ServiceVersion.key(), node.service_version.clone()),
        KeyValue::new(A::HostName.key(), node.host_name.clone()),
        KeyValue::new(A::TelemetrySdkName.key(), "gpulse"),
        KeyValue::new(A::TelemetrySdkLanguage.key(), "rust"),
        KeyValue::new(A::TelemetrySdkVersion.key(), GPULSE_VERSION),
    ];
    for (key, value) in &node.extra_attributes {
        if !attrs.iter().any(|kv| kv.key.as_str() == key) {
            attrs.push(KeyValue::new(key.clone(), value.clone()));
        }
    }
    Resource::builder_empty().with_attributes(attrs).build()
}

/// One `HealthReading` per collection: the first callback of a collection reads the source, the
/// others reuse it, and the exporter marks the collection finished. Reading once matters: the
/// sample durations are drained by the read, and the mean and the max must see the same ones.
struct Collection {
    state: Mutex<CollectionState>,
}

struct CollectionState {
    source: HealthSource,
    /// The reading of the collection in progress; `None` between collections.
    current: Option<Arc<HealthReading>>,
}

impl Collection {
    fn new(source: HealthSource) -> Self {
        Self {
            state: Mutex::new(CollectionState {
                source,
                current: None,
            }),
        }
    }

    fn reading(&self) -> Arc<HealthReading> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(reading) = &state.current {
            return Arc::clone(reading);
        }
        let reading = Arc::new((state.source)());
        state.current = Some(Arc::clone(&reading));
        reading
    }

    fn finish(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).current = None;
    }
}

type Observe<T> = fn(&HealthReading, &dyn AsyncInstrument<T>);

/// The health instruments: the names, units and attributes of the hand-built health metrics
/// they replace.
fn register(meter: &Meter, collection: &Arc<Collection>) {
    use crate::schema::health::HealthMetricId as H;
    let up_down = |id: H, observe: Observe<i64>| {
        let spec = id.spec();
        meter
            .i64_observable_up_down_counter(spec.name)
            .with_unit(spec.unit)
            .with_description(spec.description)
            .with_callback(callback(collection, observe))
            .build();
    };
    let counter = |id: H, observe: Observe<u64>| {
        let spec = id.spec();
        meter
            .u64_observable_counter(spec.name)
            .with_unit(spec.unit)
            .with_description(spec.description)
            .with_callback(callback(collection, observe))
            .build();
    };
    let gauge = |id: H, observe: Observe<f64>| {
        let spec = id.spec();
        meter
            .f64_observable_gauge(spec.name)
            .with_unit(spec.unit)
            .with_description(spec.description)
            .with_callback(callback(collection, observe))
            .build();
    };

    up_down(H::QueueSize, |h, out| {
        out.observe(saturating_i64(h.queue_requests), &[])
    });
    up_down(H::QueueBytes, |h, out| {
        out.observe(saturating_i64(h.queue_bytes), &[])
    });
    counter(H::Dropped, |h, out| {
        out.observe(h.dropped_requests_total, &[])
    });
    counter(H::DataPointsDropped, |h, out| {
        out.observe(h.dropped_points_total, &[])
    });
    counter(H::ExportFailures, |h, out| {
        by_key(out, AttributeId::ErrorType.key(), &h.export_failures_total)
    });
    gauge(H::ExportDuration, |h, out| {
        if let Some(s) = h.export_duration_last_seconds {
            out.observe(s, &[]);
        }
    });
    gauge(H::SampleDuration, |h, out| {
        if let Some(s) = h.sample_duration_mean_seconds {
            out.observe(s, &[]);
        }
    });
    gauge(H::SampleDurationMax, |h, out| {
        if let Some(s) = h.sample_duration_max_seconds {
            out.observe(s, &[]);
        }
    });
    counter(H::NvmlErrors, |h, out| {
        by_key(out, AttributeId::ErrorType.key(), &h.nvml_errors_total)
    });
    counter(H::SampleStalled, |h, out| {
        out.observe(h.stalled_ticks_total, &[])
    });
    counter(H::ReceiverSpans, |h, out| {
        if let Some(receiver) = &h.receiver {
            out.observe(receiver.spans_total, &[]);
        }
    });
    counter(H::ReceiverRefused, |h, out| {
        if let Some(receiver) = &h.receiver {
            by_key(out, AttributeId::ErrorType.key(), &receiver.refused_total);
        }
    });
    up_down(H::DiagnosisActive, |h, out| {
        for (rule, count) in &h.findings_active {
            out.observe(
                saturating_i64(*count),
                &[KeyValue::new(
                    AttributeId::DiagnosisRule.key(),
                    rule.clone(),
                )],
            );
        }
    });
}

/// An instrument's callback: `observe` on the reading of the collection in progress.
fn callback<T: 'static>(
    collection: &Arc<Collection>,
    observe: Observe<T>,
) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let collection = Arc::clone(collection);
    move |out| observe(&collection.reading(), out)
}

fn by_key(out: &dyn AsyncInstrument<u64>, key: &'static str, values: &BTreeMap<String, u64>) {
    for (value, count) in values {
        out.observe(*count, &[KeyValue::new(key, value.clone())]);
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Data points in a request, for the queue's drop accounting.
fn point_count(request: &ExportMetricsServiceRequest) -> u64 {
    data_point_count(request) as u64
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
    use opentelemetry_proto::tonic::common::v1::KeyValue as ProtoKeyValue;
    use opentelemetry_proto::tonic::metrics::v1::{number_data_point, Metric};

    use super::*;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;

    /// A data point's value and its attributes as `key=value`.
    type Point = (f64, Vec<String>);

    fn node() -> NodeIdentity {
        NodeIdentity::resolve(
            "gpulse".into(),
            &[("k8s.cluster.name".into(), "prod".into())],
            "node-1".into(),
            "instance-1".into(),
            Some("node-1".into()),
        )
    }

    fn reading() -> HealthReading {
        HealthReading {
            queue_requests: 3,
            queue_bytes: 4096,
            dropped_requests_total: 2,
            dropped_points_total: 40,
            export_failures_total: [("timeout".to_string(), 5)].into(),
            export_duration_last_seconds: Some(0.25),
            sample_duration_mean_seconds: Some(0.002),
            sample_duration_max_seconds: Some(0.004),
            nvml_errors_total: [("gpu_lost".to_string(), 1)].into(),
            stalled_ticks_total: 7,
            findings_active: [
                ("idle_holder".to_string(), 2),
                ("throttling".to_string(), 0),
            ]
            .into(),
            receiver: Some(ReceiverReading {
                spans_total: 900,
                refused_total: [("queue_full".to_string(), 4)].into(),
            }),
        }
    }

    /// Each `collect` is one collection.
    fn started(source: HealthSource) -> SelfTelemetry {
        SelfTelemetry::start(&node(), source)
    }

    /// One collection, checked to be a valid request whose point count is right.
    fn collected(telemetry: &SelfTelemetry) -> ExportMetricsServiceRequest {
        let (request, points) = telemetry.collect().expect("collected");
        let decoded = ExportMetricsServiceRequest::decode(request.encode_to_vec().as_slice())
            .expect("a valid ExportMetricsServiceRequest");
        assert_eq!(points, point_count(&decoded));
        decoded
    }

    fn metric<'a>(request: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
        request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn text(attributes: &[ProtoKeyValue]) -> Vec<String> {
        attributes
            .iter()
            .map(
                |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(AnyValue::StringValue(s)) => format!("{}={s}", kv.key),
                    other => format!("{}={other:?}", kv.key),
                },
            )
            .collect()
    }

    /// (value, attributes as key=value) of every point of `m`.
    fn points(m: &Metric) -> Vec<Point> {
        let points = match m.data.as_ref().expect("data") {
            Data::Gauge(g) => &g.data_points,
            Data::Sum(s) => &s.data_points,
            other => panic!("unexpected {other:?}"),
        };
        points
            .iter()
            .map(|p| {
                let value = match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => v,
                    Some(number_data_point::Value::AsInt(v)) => v as f64,
                    None => f64::NAN,
                };
                (value, text(&p.attributes))
            })
            .collect()
    }

    #[test]
    fn health_is_exported_with_the_old_names_units_and_the_node_resource() {
        let telemetry = started(Box::new(reading));
        let request = &collected(&telemetry);
        assert_eq!(request.resource_metrics.len(), 1);
        let rm = &request.resource_metrics[0];
        let resource = text(&rm.resource.as_ref().expect("resource").attributes);
        for want in [
            "service.name=gpulse",
            "service.instance.id=instance-1",
            "host.name=node-1",
            "telemetry.sdk.name=gpulse",
            "k8s.cluster.name=prod",
            "k8s.node.name=node-1",
        ] {
            assert!(
                resource.iter().any(|a| a == want),
                "{want} not in {resource:?}"
            );
        }
        let scope = rm.scope_metrics[0].scope.as_ref().expect("scope");
        assert_eq!(
            (scope.name.as_str(), scope.version.as_str()),
            (SCOPE_NAME, GPULSE_VERSION)
        );

        let none = Vec::<String>::new;
        let cases: [(&str, &str, Vec<Point>); 13] = [
            ("gpulse.export.queue.size", "{request}", vec![(3.0, none())]),
            ("gpulse.export.queue.bytes", "By", vec![(4096.0, none())]),
            ("gpulse.export.dropped", "{request}", vec![(2.0, none())]),
            (
                "gpulse.export.data_points.dropped",
                "{data_point}",
                vec![(40.0, none())],
            ),
            (
                "gpulse.export.failures",
                "{request}",
                vec![(5.0, vec!["error.type=timeout".into()])],
            ),
            ("gpulse.export.duration", "s", vec![(0.25, none())]),
            ("gpulse.sample.duration", "s", vec![(0.002, none())]),
            ("gpulse.sample.duration.max", "s", vec![(0.004, none())]),
            (
                "gpulse.nvml.errors",
                "{error}",
                vec![(1.0, vec!["error.type=gpu_lost".into()])],
            ),
            ("gpulse.sample.stalled", "{tick}", vec![(7.0, none())]),
            (
                "gpulse.diagnosis.active",
                "{finding}",
                vec![
                    (2.0, vec!["gpulse.diagnosis.rule=idle_holder".into()]),
                    (0.0, vec!["gpulse.diagnosis.rule=throttling".into()]),
                ],
            ),
            ("gpulse.receiver.spans", "{span}", vec![(900.0, none())]),
            (
                "gpulse.receiver.refused",
                "{request}",
                vec![(4.0, vec!["error.type=queue_full".into()])],
            ),
        ];
        for (name, unit, want) in cases {
            let m = metric(request, name);
            assert_eq!(m.unit, unit, "{name}");
            let mut got = points(m);
            got.sort_by(|a, b| a.1.cmp(&b.1));
            assert_eq!(got, want, "{name}");
        }
        // Counters are monotonic cumulative sums, levels non-monotonic ones, as before.
        let Some(Data::Sum(dropped)) = &metric(request, "gpulse.export.dropped").data else {
            panic!("gpulse.export.dropped is not a sum");
        };
        assert!(dropped.is_monotonic);
        let Some(Data::Sum(size)) = &metric(request, "gpulse.export.queue.size").data else {
            panic!("gpulse.export.queue.size is not a sum");
        };
        assert!(!size.is_monotonic);
        assert!(matches!(
            metric(request, "gpulse.sample.duration").data,
            Some(Data::Gauge(_))
        ));
        // Without a receiver, its metrics are left out rather than exported as zeros.
        let telemetry = started(Box::new(|| HealthReading {
            receiver: None,
            ..reading()
        }));
        let request = collected(&telemetry);
        let names: Vec<&str> = request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("gpulse.receiver.")),
            "{names:?}"
        );
    }

    #[test]
    fn the_source_is_read_once_per_collection() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reads);
        let telemetry = started(Box::new(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) as f64;
            // Each read drains its own durations: mean and max must come from the same read.
            HealthReading {
                sample_duration_mean_seconds: Some(n),
                sample_duration_max_seconds: Some(n),
                ..HealthReading::default()
            }
        }));
        collected(&telemetry);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "eleven instruments, one read"
        );
        let last = collected(&telemetry);
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert_eq!(points(metric(&last, "gpulse.sample.duration"))[0].0, 1.0);
        assert_eq!(
            points(metric(&last, "gpulse.sample.duration.max"))[0].0,
            1.0
        );
    }

    #[test]
    fn the_health_joins_the_windows_node_resource_in_one_request() {
        use crate::export::metrics::encoding::{BatchPoint, PointAttributes};
        use crate::schema::MetricId;
        use opentelemetry_proto::tonic::metrics::v1::number_data_point;

        let telemetry = started(Box::new(reading));
        let node = collected(&telemetry).resource_metrics[0]
            .resource
            .clone()
            .expect("the health's node resource");
        // A window of two resources, the node's device metrics and then a process's, one point
        // each.
        let point = |metric| BatchPoint {
            metric,
            attributes: PointAttributes::NONE,
            start: 1,
            end: 2,
            value: number_data_point::Value::AsDouble(0.5),
        };
        let mut window = MetricsBatch::default();
        window.push_resource(node, vec![point(MetricId::GpuUtilization)]);
        window.push_resource(
            opentelemetry_proto::tonic::resource::v1::Resource::default(),
            vec![point(MetricId::ProcessGpuMemoryUsage)],
        );
        let (body, points_sent) = telemetry.window_request(&window, &mut EncodeCache::new());
        let sent = ExportMetricsServiceRequest::decode(&body[..]).expect("valid");
        let expected = window.clone().into_request();
        assert_eq!(points_sent, point_count(&sent));
        assert_eq!(sent.resource_metrics.len(), 2, "no resource of its own");
        assert_eq!(sent.resource_metrics[0].scope_metrics.len(), 2);
        assert_eq!(
            sent.resource_metrics[0].scope_metrics[0],
            expected.resource_metrics[0].scope_metrics[0],
            "the window's own scope first, as it was"
        );
        assert_eq!(sent.resource_metrics[1], expected.resource_metrics[1]);
        let health = &sent.resource_metrics[0].scope_metrics[1];
        assert!(health
            .metrics
            .iter()
            .any(|m| m.name == "gpulse.sample.stalled"));

        // A window without points: the health alone, on the node resource.
        let (body, points_sent) =
            telemetry.window_request(&MetricsBatch::default(), &mut EncodeCache::new());
        let sent = ExportMetricsServiceRequest::decode(&body[..]).expect("valid");
        assert!(points_sent > 0);
        assert_eq!(sent.resource_metrics.len(), 1);
        assert_eq!(points(metric(&sent, "gpulse.sample.stalled"))[0].0, 7.0);
    }

    /// The health instruments are exactly the rows of docs/metrics.md's "Health metrics"
    /// section, with the same instrument and unit (the request builder's metrics are checked
    /// against the other sections by tests/export.rs).
    #[test]
    fn health_metrics_match_the_health_section_of_docs_metrics_md() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
        let doc = std::fs::read_to_string(path).expect("docs/metrics.md must exist");
        let mut documented = BTreeMap::new();
        let mut in_health = false;
        for line in doc.lines() {
            if line.starts_with('#') {
                in_health = line.trim_start_matches('#').trim() == "Health metrics (node resource)";
                continue;
            }
            let cells: Vec<&str> = line
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let is_metric_row = line.starts_with('|')
                && cells.len() > 2
                && ["gauge", "counter", "updowncounter"].contains(&cells[1]);
            if in_health && is_metric_row {
                let unit = cells[2].trim_matches('`').to_string();
                documented.insert(
                    cells[0].trim_matches('`').to_string(),
                    (cells[1].to_string(), unit),
                );
            }
        }
        assert!(documented.len() >= 10, "parsed only {documented:?}");

        let telemetry = started(Box::new(reading));
        let sent = collected(&telemetry);
        let exported: BTreeMap<String, (String, String)> = sent.resource_metrics[0].scope_metrics
            [0]
        .metrics
        .iter()
        .map(|m| {
            let instrument = match &m.data {
                Some(Data::Gauge(_)) => "gauge",
                Some(Data::Sum(s)) if s.is_monotonic => "counter",
                Some(Data::Sum(_)) => "updowncounter",
                other => panic!("{}: unexpected {other:?}", m.name),
            };
            (m.name.clone(), (instrument.to_string(), m.unit.clone()))
        })
        .collect();
        assert_eq!(exported, documented);
    }
}
