//! gpulse as the local OTLP endpoint of the applications beside it: receivers for OTLP/gRPC
//! and OTLP/HTTP (`--otlp-receiver-grpc`, `--otlp-receiver-http`; off unless asked for, on
//! loopback unless told otherwise) that take traces, metrics and logs, add to each span the GPU
//! usage of the process that sent it over the span's own time, and forward everything upstream
//! through gpulse's own delivery queue and exporter.
//!
//! - `sample_history`: the bounded per-process GPU sample ring the pipeline feeds with every snapshot.
//! - `identity`, `peer`: which process a span's resource, or else its connection, belongs to.
//! - `span_attributes`: the `gpulse.gpu.*` span attributes, added to each span of a known process.
//! - `intake`: validation, enrichment, back-pressure and queueing, shared by both carriers.
//! - `framework_intake`: the training framework's allocator gauges and step spans, kept for diagnosis.
//! - `live_intake`: the companion's live-state log records, kept for diagnosis beside them.
//! - `grpc`, `http`: the two servers.
//!
//! docs/enrich.md is the user's description of the whole.

pub(crate) mod framework_intake;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod identity;
pub mod intake;
pub(crate) mod live_intake;
pub(crate) mod peer;
pub(crate) mod sample_history;
pub mod span_attributes;

use std::net::SocketAddr;
use std::sync::Arc;

pub use intake::{Accepted, Intake, IntakeError, IntakeSettings, Peer, SpanObserver};
pub use sample_history::{GpuUsage, ProcessIdentity, SampleHistory, SampleHistoryHandle};

/// Why the receivers could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    #[error(
        "could not listen for OTLP/{carrier} on {addr}: {source}. Another collector or agent may \
         hold the port; pick another with --otlp-receiver-{flag}",
        flag = carrier.to_ascii_lowercase()
    )]
    Bind {
        carrier: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The running receivers; dropping this leaves them running, [`Receivers::stop`] ends them.
#[derive(Debug)]
pub(crate) struct Receivers {
    pub intake: Arc<Intake>,
    /// The bound addresses (port 0 resolved), gRPC then HTTP.
    pub grpc_addr: Option<SocketAddr>,
    pub http_addr: Option<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Receivers {
    /// Binds the configured addresses and starts serving.
    ///
    /// # Errors
    /// [`ReceiverError::Bind`] when an address cannot be bound.
    pub(crate) async fn start(
        grpc: Option<SocketAddr>,
        http: Option<SocketAddr>,
        intake: Arc<Intake>,
    ) -> Result<Self, ReceiverError> {
        let mut receivers = Receivers {
            intake,
            grpc_addr: None,
            http_addr: None,
            tasks: Vec::new(),
        };
        let bind = |carrier, addr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ReceiverError::Bind {
                    carrier,
                    addr,
                    source,
                })
        };
        if let Some(addr) = grpc {
            let listener = bind("gRPC", addr).await?;
            receivers.grpc_addr = listener.local_addr().ok();
            receivers
                .tasks
                .push(grpc::serve(listener, Arc::clone(&receivers.intake)));
        }
        if let Some(addr) = http {
            let listener = bind("HTTP", addr).await?;
            receivers.http_addr = listener.local_addr().ok();
            receivers
                .tasks
                .push(http::serve(listener, Arc::clone(&receivers.intake)));
        }
        if receivers.intake.forwards() {
            tracing::info!(
                grpc = ?receivers.grpc_addr,
                http = ?receivers.http_addr,
                "OTLP receiver listening: spans are enriched with GPU usage and forwarded upstream"
            );
        } else {
            tracing::info!(
                grpc = ?receivers.grpc_addr,
                http = ?receivers.http_addr,
                "OTLP receiver listening: the framework's spans feed diagnosis, nothing is forwarded"
            );
        }
        Ok(receivers)
    }

    /// Stops accepting, then waits (at most the intake's wait for a sample, and a second) for
    /// the requests already answered to be queued; the queue's flush delivers them.
    pub(crate) async fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
        let deadline = tokio::time::Instant::now()
            + self.intake.max_wait()
            + std::time::Duration::from_secs(1);
        let waiting = self.intake.settle(deadline).await;
        if waiting > 0 {
            tracing::warn!(
                requests = waiting,
                "stopping with trace requests accepted but not yet queued; their spans are lost"
            );
        }
    }
}
