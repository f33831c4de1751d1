//! The OTLP metrics of one export window, in the stages they pass through: the [`builder`] (a
//! `Window` and its workloads turned into data points, one function per collector family, each
//! metric named by its typed [`MetricId`](crate::schema::MetricId)) and the [`encoding`] (those
//! points as a [`MetricsBatch`] and its protobuf bytes). Names, instruments and units are the
//! schema's ([`crate::schema::METRICS`]). Dependencies run one way: builder → encoding → schema.
//! The OTLP/JSON form is `crate::export::json`'s.

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
