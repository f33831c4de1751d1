//! The health metric table: gpulse's own metrics (its export queue, sampling passes, NVML
//! errors, active findings), which `crate::export::telemetry` registers as OpenTelemetry SDK
//! instruments on the node resource. Beside [`METRICS`](super::METRICS) because they are not
//! built from a window: the SDK observes them. Declared like it, enum and rows in one macro, so
//! the instruments, the Prometheus exposition and the Weaver registry name each one once.

use super::attributes::{req, AttributeId as A, Uses};
use super::metrics::Instrument;

/// One row of the health metric table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthMetricSpec {
    pub id: HealthMetricId,
    pub name: &'static str,
    pub instrument: Instrument,
    pub unit: &'static str,
    pub description: &'static str,
    pub attributes: &'static [Uses],
}

impl HealthMetricId {
    /// This metric's row of [`HEALTH_METRICS`].
    pub const fn spec(self) -> &'static HealthMetricSpec {
        &HEALTH_METRICS[self as usize]
    }
}

macro_rules! health_table {
    ($( $id:ident: $name:literal, $instrument:ident, $unit:literal, $description:literal,
        [$($uses:expr),*]; )*) => {
        /// Index of a health metric in [`HEALTH_METRICS`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum HealthMetricId {
            $( $id, )*
        }

        /// Every health metric gpulse exports.
        pub static HEALTH_METRICS: [HealthMetricSpec; [$( HealthMetricId::$id ),*].len()] = [$(
            HealthMetricSpec {
                id: HealthMetricId::$id,
                name: $name,
                instrument: Instrument::$instrument,
                unit: $unit,
                description: $description,
                attributes: &[$($uses),*],
            },
        )*];
    };
}

health_table! {
    QueueSize: "gpulse.export.queue.size", UpDownCounter, "{request}",
        "Requests waiting in the export queue.", [];
    QueueBytes: "gpulse.export.queue.bytes", UpDownCounter, "By",
        "Encoded bytes waiting in the export queue.", [];
    Dropped: "gpulse.export.dropped", Counter, "{request}",
        "Requests dropped: oldest first at the queue bound, expired past the age bound, or refused for good by the backend.", [];
    DataPointsDropped: "gpulse.export.data_points.dropped", Counter, "{data_point}",
        "Data points in the dropped requests.", [];
    ExportFailures: "gpulse.export.failures", Counter, "{request}",
        "Failed export attempts, by reason.", [req(A::ErrorType)];
    ExportDuration: "gpulse.export.duration", Gauge, "s",
        "Duration of the last export attempt.", [];
    SampleDuration: "gpulse.sample.duration", Gauge, "s",
        "Mean duration of one NVML sampling pass since the previous export.", [];
    SampleDurationMax: "gpulse.sample.duration.max", Gauge, "s",
        "Longest NVML sampling pass since the previous export.", [];
    NvmlErrors: "gpulse.nvml.errors", Counter, "{error}",
        "NVML calls that failed, by kind.", [req(A::ErrorType)];
    SampleStalled: "gpulse.sample.stalled", Counter, "{tick}",
        "Sampling ticks skipped because a pass overran.", [];
    DiagnosisActive: "gpulse.diagnosis.active", UpDownCounter, "{finding}",
        "Diagnosis findings active now, by rule.", [req(A::DiagnosisRule)];
    ReceiverSpans: "gpulse.receiver.spans", Counter, "{span}",
        "Spans the OTLP receiver accepted for forwarding.", [];
    ReceiverRefused: "gpulse.receiver.refused", Counter, "{request}",
        "Requests the OTLP receiver refused, by reason: queue_full (the sender retries later), malformed, shutting_down.", [req(A::ErrorType)];
}
