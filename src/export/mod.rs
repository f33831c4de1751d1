//! Export: `Window`s and `Workload`s turned into OTLP requests (one `ResourceMetrics` for the
//! node's devices and one per GPU process), the transports that carry them, and the bounded
//! retry queue between the two; gpulse's own health metrics on the OpenTelemetry SDK
//! (`telemetry`), riding in each window's request; the [`Exporter`] that ties these together for
//! `gpulse run` and `gpulse record`; and the same windows exposed for Prometheus to scrape
//! (`prometheus`, `/metrics`).

pub mod exporter;
pub mod json;
pub mod logs;
pub mod metrics;
pub mod prometheus;
pub mod queue;
pub mod resource;
pub mod telemetry;
pub mod transport;

pub use exporter::{ExportOutcome, Exporter};
