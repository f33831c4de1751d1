//! The OTLP metrics of one export window, in the stages they pass through: the [`catalogue`]
//! (what each metric is called, its instrument and unit), the [`builder`] (a `Window` and its
//! workloads turned into data points, one function per collector family) and the
//! [`encoding`] (those points as a [`MetricsBatch`] and its protobuf bytes). Dependencies run
//! one way: builder → encoding → catalogue. The OTLP/JSON form is `crate::export::json`'s.

pub mod builder;
pub mod catalogue;
pub mod encoding;

pub use builder::{metrics_batch, metrics_request};
pub use catalogue::{throttle_reason_names, throttle_reasons, Instrument, MetricSpec, METRICS};
pub use encoding::{data_point_count, MetricsBatch};
