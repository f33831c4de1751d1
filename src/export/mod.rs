//! Export: `Window`s and `Workload`s turned into OTLP requests (one `ResourceMetrics` for the
//! node's devices and one per GPU process), the transports that carry them, and the bounded
//! retry queue between the two; and the same windows exposed for Prometheus to scrape
//! (`prometheus`, `/metrics`).

pub mod json;
pub mod logs;
pub mod metrics;
pub mod prometheus;
pub mod queue;
pub mod resource;
pub mod transport;
