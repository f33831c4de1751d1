//! The schema: what gpulse reads from NVML and how it reports it, as tables of rows that sit
//! below both sampling and export. [`METRICS`] lists every OTLP metric (name, instrument, unit,
//! description, docs columns) under a typed [`MetricId`]; [`DEVICE_FIELDS`] lists every scalar
//! device field (its typed NVML [`Source`], JSON key, window kind, metric and attribute,
//! `.max`/`.min` companions, dcgm-exporter series); [`GPM_FIELDS`] the GPM activity ratios likewise. Each
//! table and its enum are declared by one macro, so counts are derived and a row cannot be out
//! of place.
//!
//! Sampling makes each row's [`Source`] call (the benchmark floor makes the same list), the
//! window aggregates by each row's [`WindowKind`], the metrics builder and the Prometheus
//! families name by the typed ids, and the generated parts of docs/metrics.md,
//! docs/prometheus.md and docs/schema.json (which the device check reads) come from [`docs`]
//! (the dcgm-exporter and Prometheus name tables from `export::prometheus::docs`). A new NVML
//! field is one row here, plus its call in `sampling::calls::read_call` when the call is new
//! (or its `NVML_FI_*` id in [`NvmlFieldId`] when NVML gives it only by field id);
//! CONTRIBUTING.md walks through it, and a test (`checklist`) names each hand-written copy
//! outside the schema (nvml-sim, the independent C NVML, the pynvml check, the recorded
//! `/status` fixture) that lacks one of its calls or field ids.
//!
//! Pure data: depends on nothing else in gpulse.

pub mod attribute_keys;
pub mod attributes;
#[cfg(test)]
mod checklist;
pub mod dcgm;
pub(crate) mod device;
pub mod docs;
pub(crate) mod field_values;
pub(crate) mod gpm;
pub mod health;
#[cfg(test)]
mod literals;
pub(crate) mod metrics;
pub mod registry;
pub(crate) mod signals;
pub(crate) mod source;
pub mod switches;
pub(crate) mod throttle;

pub use dcgm::{
    dcgm_series, family_series, DcgmFamily, DcgmReading, DcgmScale, DcgmSeries, DcgmType,
    DcgmValue, DCGM_FAMILY_SERIES, DRIVER_VERSION_LABEL,
};
pub use device::{
    field_calls, field_id_reads, DeviceField, FieldMetric, FieldRead, FieldSpec, WindowKind,
    DEVICE_FIELDS, FIELD_COUNT,
};
pub(crate) use field_values::serialize_keyed;
pub use field_values::{FieldReport, FieldValues, ReportValue};
pub(crate) use gpm::MIG_PROCESS_GPM;
pub use gpm::{
    gpm_metric_name, GpmField, GpmFieldSpec, GPM_FIELDS, GPM_FIELD_COUNT, GPM_METRIC_NAMES,
};
pub use metrics::{Instrument, MetricId, MetricSpec, Section, METRICS, METRIC_COUNT};
pub use source::{NvmlCall, NvmlFieldId, Scale, Source, SourceKind};
pub use switches::{nearest_metric_names, MetricSet, MetricSwitches, OFF_BY_DEFAULT};
pub(crate) use throttle::{throttle_reason_names, throttle_reasons};
