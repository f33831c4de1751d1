//! Export: `Window`s and `Workload`s turned into OTLP requests (one `ResourceMetrics` for the
//! node's devices and one per GPU process), and the transports that carry them.
