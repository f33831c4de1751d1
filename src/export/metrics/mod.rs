//! The OTLP metrics of one export window, in the stages they pass through: the [`builder`] (a
//! `Window` and its workloads turned into data points, one function per collector family, each
//! metric named by its typed [`MetricId`](crate::schema::MetricId)), the [`batch`] (those points
//! as a [`MetricsBatch`]: resources, points and the attribute lists they share) and the
//! [`encoding`] (its protobuf bytes), with the [`EncodeCache`] the exporter keeps between windows
//! (unchanged attribute lists, and the last request, which a window of the same shape patches in
//! place). Names, instruments and units are the schema's ([`crate::schema::METRICS`]).
//! Dependencies run one way: builder → encoding → encode_cache → request_patch → batch →
//! schema. The OTLP/JSON form is `crate::export::json`'s.

pub mod batch;
pub mod builder;
pub mod encode_cache;
pub mod encoding;
mod request_patch;

pub use batch::MetricsBatch;
pub use builder::{
    metrics_batch, metrics_batch_cached, metrics_batch_with_training, metrics_request,
    metrics_request_switched, metrics_request_with_training, Extremes, ProcessResources,
};
pub use encode_cache::EncodeCache;
pub use encoding::data_point_count;
