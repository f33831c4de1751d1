//! OTLP transports: how one already-encoded export request reaches a collector. This module owns
//! the `Transport` contract (send the prost-encoded bytes of an `ExportMetricsServiceRequest`,
//! `ExportLogsServiceRequest` or forwarded `ExportTraceServiceRequest`, report the server's partial success, or fail with an error that
//! says whether a retry can help), the three carriers (`grpc`: tonic with a pass-through codec;
//! `http`: OTLP/HTTP protobuf POSTs over hyper and rustls; `stdout`: one OTLP JSON line per
//! request), and the OTLP specification's retry classification (`classify`).
//!
//! Requests are encoded once by the export model and retried as the same bytes; nothing here
//! decodes a request again except the stdout carrier, which has to render JSON.

mod classify;
pub mod grpc;
mod gzip;
pub mod http;
pub mod stdout;
mod tls;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;

use crate::config::otlp::{ExporterKind, Protocol, SignalEndpoint};
use crate::config::{SignalSinks, Sink};

pub use classify::{
    classify_grpc, classify_http, parse_retry_after, retry_info_delay, rpc_status_message,
    Retryability,
};
// The local OTLP receiver (`enrich`) answers with these messages too.
pub(crate) use classify::{ProtoAny, ProtoDuration, RetryInfo, RpcStatus};
pub use grpc::GrpcTransport;
pub use http::HttpTransport;
pub use stdout::{render_otlp_json, RenderFn, StdoutTransport};

/// Which OTLP signal a request carries; it picks the gRPC service and the response type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    Metrics,
    Logs,
    /// Spans received from applications (`gpulse run --otlp-receiver-*`) and forwarded.
    Traces,
}

impl Signal {
    /// Lower-case name, as used in logs and self-telemetry labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
            Signal::Traces => "traces",
        }
    }

    /// The gRPC method an OTLP/gRPC export of this signal calls.
    pub const fn grpc_path(self) -> &'static str {
        match self {
            Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One export request as it goes on the wire: the protobuf encoding of an
/// `Export{Metrics,Logs}ServiceRequest`, and how many data points or log records it holds (for the
/// drop counters). `Bytes` makes the retries' clones free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRequest {
    body: Bytes,
    items: u64,
}

impl EncodedRequest {
    /// Wraps bytes that are already a prost-encoded export request.
    pub fn new(body: impl Into<Bytes>, items: u64) -> Self {
        Self {
            body: body.into(),
            items,
        }
    }

    /// Encodes `message` once; every retry then sends these same bytes.
    pub fn from_message<M: prost::Message>(message: &M, items: u64) -> Self {
        Self::new(message.encode_to_vec(), items)
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Data points (metrics) or log records (logs) in the request.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Encoded size in bytes, before compression: what the queue's byte bound counts.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// The server's `partial_success`: it accepted the request but rejected part of it (or, with
/// `rejected == 0`, sent a warning). Retrying would not help, so it is logged and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialSuccess {
    /// `rejected_data_points` or `rejected_log_records`.
    pub rejected: i64,
    pub error_message: String,
}

/// What a successful export returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOutcome {
    /// Present only when the server set a non-empty `partial_success`.
    pub partial_success: Option<PartialSuccess>,
}

/// Why an export attempt failed. Each variant says whether a retry can help through
/// [`SendError::retryability`], and names the failure for the counters through
/// [`SendError::reason`]. No variant carries header values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The server answered with a gRPC status other than OK.
    #[error(
        "OTLP/gRPC export of {signal} to {endpoint} failed with status {}: {message}",
        classify::grpc_code_name(*code)
    )]
    GrpcStatus {
        signal: Signal,
        endpoint: String,
        code: tonic::Code,
        message: String,
        /// The server's `google.rpc.RetryInfo` delay, when it sent one.
        retry_after: Option<Duration>,
    },
    /// The server answered with an HTTP status outside 2xx.
    #[error("OTLP/HTTP export of {signal} to {endpoint} was answered HTTP {status}: {message}")]
    HttpStatus {
        signal: Signal,
        endpoint: String,
        status: u16,
        /// The `google.rpc.Status` message of the body, or the start of a text body.
        message: String,
        /// The `Retry-After` header, when present and readable.
        retry_after: Option<Duration>,
    },
    /// No connection could be made (refused, DNS, TLS handshake).
    #[error(
        "could not reach the OTLP endpoint {endpoint} for {signal}: {detail}; check that the \
         collector is running and that the URL, port and TLS settings are right"
    )]
    Connect {
        signal: Signal,
        endpoint: String,
        detail: String,
    },
    /// The connection broke while the request or the answer was in transit.
    #[error(
        "the connection to the OTLP endpoint {endpoint} failed while exporting {signal}: {detail}"
    )]
    Network {
        signal: Signal,
        endpoint: String,
        detail: String,
    },
    /// No answer within the configured timeout.
    #[error(
        "OTLP export of {signal} to {endpoint} got no answer within {timeout:?}; the collector \
         may be overloaded or unreachable (OTEL_EXPORTER_OTLP_TIMEOUT sets the limit)"
    )]
    Timeout {
        signal: Signal,
        endpoint: String,
        timeout: Duration,
    },
    /// The stdout exporter could not write its line (a closed pipe, a full disk).
    #[error("writing the {signal} request to standard output failed: {source}")]
    Stdout {
        signal: Signal,
        #[source]
        source: std::io::Error,
    },
    /// The stdout exporter could not turn the request into OTLP JSON.
    #[error("could not render the {signal} request as OTLP JSON: {detail}")]
    Render { signal: Signal, detail: String },
    /// The signal's exporter is `none`: callers do not queue such requests, so one reaching
    /// the transport is a gpulse bug, dropped rather than retried.
    #[error("{signal} has no exporter (it is set to none); the request was dropped")]
    Disabled { signal: Signal },
    /// gzip failed (memory): nothing was sent.
    #[error("could not gzip the {signal} request: {source}")]
    Compress {
        signal: Signal,
        #[source]
        source: std::io::Error,
    },
}

impl SendError {
    /// Whether sending the same bytes again may succeed, per the OTLP specification.
    pub fn retryability(&self) -> Retryability {
        match self {
            SendError::GrpcStatus {
                code, retry_after, ..
            } => classify_grpc(*code, *retry_after),
            SendError::HttpStatus {
                status,
                retry_after,
                ..
            } => classify_http(*status, *retry_after),
            SendError::Connect { .. } | SendError::Network { .. } | SendError::Timeout { .. } => {
                Retryability::Retryable { after: None }
            }
            // A closed stdout, a request that cannot be rendered or gzipped: the same bytes
            // fail the same way next time.
            SendError::Stdout { .. }
            | SendError::Render { .. }
            | SendError::Compress { .. }
            | SendError::Disabled { .. } => Retryability::Permanent,
        }
    }

    /// A short stable name for the failure-by-reason counters.
    pub fn reason(&self) -> FailureReason {
        match self {
            SendError::GrpcStatus { code, .. } => FailureReason::Grpc(*code as i32),
            SendError::HttpStatus { status, .. } => FailureReason::Http(*status),
            SendError::Connect { .. } => FailureReason::Connect,
            SendError::Network { .. } => FailureReason::Network,
            SendError::Timeout { .. } => FailureReason::Timeout,
            SendError::Stdout { .. } => FailureReason::Stdout,
            SendError::Render { .. } => FailureReason::Render,
            SendError::Compress { .. } => FailureReason::Compress,
            SendError::Disabled { .. } => FailureReason::Disabled,
        }
    }
}

/// A failure's label for self-telemetry: `connect`, `timeout`, `grpc_unavailable`, `http_503`...
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureReason {
    Connect,
    Network,
    Timeout,
    /// A gRPC status code (`tonic::Code as i32`).
    Grpc(i32),
    /// An HTTP status code.
    Http(u16),
    Stdout,
    Render,
    Compress,
    Disabled,
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::Connect => f.write_str("connect"),
            FailureReason::Network => f.write_str("network"),
            FailureReason::Timeout => f.write_str("timeout"),
            FailureReason::Grpc(code) => write!(
                f,
                "grpc_{}",
                classify::grpc_code_name(tonic::Code::from_i32(*code))
            ),
            FailureReason::Http(status) => write!(f, "http_{status}"),
            FailureReason::Stdout => f.write_str("stdout"),
            FailureReason::Render => f.write_str("render"),
            FailureReason::Compress => f.write_str("compress"),
            FailureReason::Disabled => f.write_str("disabled"),
        }
    }
}

/// Why a transport could not be built from its settings. Raised at start-up, before any sample.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportBuildError {
    /// The endpoint URL does not parse, or has a scheme other than http/https.
    #[error(
        "the OTLP {signal} endpoint {url:?} is not usable: {reason}; expected e.g. \
         http://localhost:4317 for gRPC or http://localhost:4318/v1/{signal} for HTTP"
    )]
    InvalidUrl {
        signal: Signal,
        url: String,
        reason: String,
    },
    /// A configured header cannot be put on the wire. The value is not shown on purpose.
    #[error(
        "the OTLP header {name:?} cannot be sent: {reason}; names must be lower-case ASCII \
         tokens and values visible ASCII (check OTEL_EXPORTER_OTLP_HEADERS)"
    )]
    InvalidHeader { name: String, reason: &'static str },
    /// A TLS file could not be read.
    #[error(
        "could not read the TLS {what} file {}: {source}; check the path given in \
         OTEL_EXPORTER_OTLP_CERTIFICATE / _CLIENT_CERTIFICATE / _CLIENT_KEY",
        path.display()
    )]
    TlsFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A TLS file was read but holds nothing usable.
    #[error("the TLS {what} file {} is not usable: {detail}", path.display())]
    TlsPem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    /// Only one half of the client identity was configured.
    #[error(
        "a TLS client certificate needs its private key and the other way round: set both \
         OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY, or neither"
    )]
    HalfClientIdentity,
    /// rustls or tonic refused the TLS configuration.
    #[error("the TLS configuration for the OTLP {signal} endpoint was refused: {detail}")]
    Tls { signal: Signal, detail: String },
}

/// Something that can carry an encoded export request to its destination.
///
/// Implementations must be cancel safe: the queue abandons an attempt at its shutdown deadline,
/// and the request then counts as undelivered (it may still have arrived: delivery is at least
/// once).
pub trait Transport: Send + Sync {
    /// Sends `request` once. Retrying is the caller's business (see `export::queue`).
    fn send(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> impl Future<Output = Result<SendOutcome, SendError>> + Send;
}

/// One configured carrier, chosen by the endpoint's protocol or the stdout exporter.
#[derive(Debug)]
pub enum AnyTransport {
    Grpc(GrpcTransport),
    // Boxed: the hyper client is several times the size of the others, and one transport per
    // signal is built once, so the indirection costs nothing.
    Http(Box<HttpTransport>),
    Stdout(StdoutTransport),
}

impl AnyTransport {
    /// Builds the carrier for one signal's endpoint.
    ///
    /// # Errors
    /// [`TransportBuildError`] when the URL, a header or the TLS files are unusable.
    ///
    /// # Panics
    /// The gRPC carrier must be built inside a tokio runtime (tonic spawns its connection task).
    pub fn for_endpoint(
        signal: Signal,
        endpoint: &SignalEndpoint,
    ) -> Result<Self, TransportBuildError> {
        Ok(match endpoint.protocol {
            Protocol::Grpc => AnyTransport::Grpc(GrpcTransport::new(signal, endpoint)?),
            Protocol::HttpProtobuf => {
                AnyTransport::Http(Box::new(HttpTransport::new(signal, endpoint)?))
            }
        })
    }
}

impl Transport for AnyTransport {
    async fn send(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        match self {
            AnyTransport::Grpc(t) => t.send(signal, request).await,
            AnyTransport::Http(t) => t.send(signal, request).await,
            AnyTransport::Stdout(t) => t.send(signal, request).await,
        }
    }
}

/// The carriers of the signals: metrics, logs and forwarded traces may go to different
/// endpoints (the `_METRICS_`/`_LOGS_`/`_TRACES_` variables), so each has its own; a signal that
/// goes nowhere (`OTEL_*_EXPORTER=none`) has none, and nothing is ever connected for it.
#[derive(Debug)]
pub struct SignalTransports {
    pub metrics: Option<AnyTransport>,
    pub logs: Option<AnyTransport>,
    pub traces: Option<AnyTransport>,
}

impl SignalTransports {
    /// Builds the carrier of each lane the sinks use, from the resolved exporter settings.
    ///
    /// # Errors
    /// [`TransportBuildError`] from an endpoint.
    ///
    /// # Panics
    /// Outside a tokio runtime when an endpoint uses gRPC.
    pub fn from_exporter(
        kind: &ExporterKind,
        sinks: &SignalSinks,
    ) -> Result<Self, TransportBuildError> {
        // The signals share the one stdout, so their lines never interleave.
        let out = sinks.uses_stdout().then(StdoutTransport::stdout);
        let endpoints = match kind {
            ExporterKind::Otlp {
                metrics,
                logs,
                traces,
            } => Some((metrics, logs, traces)),
            ExporterKind::Stdout | ExporterKind::Off => None,
        };
        let build = |sink: Sink,
                     signal: Signal,
                     endpoint: Option<&SignalEndpoint>|
         -> Result<Option<AnyTransport>, TransportBuildError> {
            Ok(match (sink, endpoint) {
                (Sink::Otlp, Some(endpoint)) => Some(AnyTransport::for_endpoint(signal, endpoint)?),
                (Sink::Stdout, _) => out.clone().map(AnyTransport::Stdout),
                // Config resolves endpoints whenever a lane uses OTLP; without them the lane
                // stays unbuilt rather than guessing a destination.
                (Sink::Otlp, None) | (Sink::Off, _) => None,
            })
        };
        let metrics = build(
            sinks.metrics_lane(),
            Signal::Metrics,
            endpoints.map(|e| e.0),
        )?;
        let logs = build(sinks.logs_lane(), Signal::Logs, endpoints.map(|e| e.1))?;
        // Forwarded spans share the metrics' gRPC connection when they go to the same place, as
        // they usually do (one origin for all signals).
        let traces = match (&metrics, endpoints) {
            (Some(AnyTransport::Grpc(grpc)), Some((m, _, t)))
                if t == m && sinks.traces_lane() == Sink::Otlp =>
            {
                Some(AnyTransport::Grpc(grpc.clone()))
            }
            _ => build(sinks.traces_lane(), Signal::Traces, endpoints.map(|e| e.2))?,
        };
        Ok(SignalTransports {
            metrics,
            logs,
            traces,
        })
    }

    /// Whether requests of `signal` have somewhere to go.
    pub fn carries(&self, signal: Signal) -> bool {
        self.lane(signal).is_some()
    }

    fn lane(&self, signal: Signal) -> Option<&AnyTransport> {
        match signal {
            Signal::Metrics => self.metrics.as_ref(),
            Signal::Logs => self.logs.as_ref(),
            Signal::Traces => self.traces.as_ref(),
        }
    }
}

impl Transport for SignalTransports {
    async fn send(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        match self.lane(signal) {
            Some(transport) => transport.send(signal, request).await,
            None => Err(SendError::Disabled { signal }),
        }
    }
}

/// The OTLP export responses, read for their `partial_success`.
pub(crate) trait ExportResponse: prost::Message + Default + Send + Sync + 'static {
    fn into_partial_success(self) -> Option<PartialSuccess>;
}

impl ExportResponse for ExportMetricsServiceResponse {
    fn into_partial_success(self) -> Option<PartialSuccess> {
        self.partial_success
            .map(|p| PartialSuccess {
                rejected: p.rejected_data_points,
                error_message: p.error_message,
            })
            .filter(|p| p.rejected != 0 || !p.error_message.is_empty())
    }
}

impl ExportResponse for ExportLogsServiceResponse {
    fn into_partial_success(self) -> Option<PartialSuccess> {
        self.partial_success
            .map(|p| PartialSuccess {
                rejected: p.rejected_log_records,
                error_message: p.error_message,
            })
            .filter(|p| p.rejected != 0 || !p.error_message.is_empty())
    }
}

impl ExportResponse for ExportTraceServiceResponse {
    fn into_partial_success(self) -> Option<PartialSuccess> {
        self.partial_success
            .map(|p| PartialSuccess {
                rejected: p.rejected_spans,
                error_message: p.error_message,
            })
            .filter(|p| p.rejected != 0 || !p.error_message.is_empty())
    }
}

/// Logs a server's partial success, at most once per interval so a misconfigured pipeline that
/// rejects every request does not flood the log.
pub(crate) fn log_partial_success(signal: Signal, endpoint: &str, partial: &PartialSuccess) {
    static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(60));
    if let Some(suppressed) = LIMIT.permit() {
        tracing::warn!(
            %signal,
            endpoint,
            rejected = partial.rejected,
            suppressed_since_last = suppressed,
            "the OTLP endpoint accepted the request only in part: {}",
            partial.error_message
        );
    }
}

/// At most one log line per interval; counts what it held back so the next line can say so.
pub(crate) struct WarnLimiter {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnLimiter {
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last line)` when a line may be written now.
    pub(crate) fn permit(&self) -> Option<u64> {
        self.permit_at(Instant::now())
    }

    fn permit_at(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means another thread panicked mid-log; the counter is still fine.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.0 {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                state.1 += 1;
                None
            }
            _ => {
                let suppressed = state.1;
                *state = (Some(now), 0);
                Some(suppressed)
            }
        }
    }
}

/// An error and its sources on one line: hyper's and tonic's top-level messages alone
/// ("client error (Connect)") do not say what happened.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The URL as it may appear in logs: any `user:password@` is cut out.
pub(crate) fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.rsplit_once('@').map_or(url, |(_, h)| h).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warn_limiter_lets_one_line_through_per_interval_and_counts_the_rest() {
        let limiter = WarnLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limiter.permit_at(t0), Some(0));
        assert_eq!(limiter.permit_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(limiter.permit_at(t0 + Duration::from_secs(9)), None);
        assert_eq!(limiter.permit_at(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(limiter.permit_at(t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn redact_url_drops_credentials_only() {
        for (input, want) in [
            (
                "https://user:pw@otel.example:4318/v1/metrics",
                "https://otel.example:4318/v1/metrics",
            ),
            ("http://localhost:4317", "http://localhost:4317"),
            ("http://a@b/c@d", "http://b/c@d"),
            ("key@host:4317", "host:4317"),
        ] {
            assert_eq!(redact_url(input), want, "{input}");
        }
    }

    #[test]
    fn failure_reasons_have_stable_labels() {
        assert_eq!(
            FailureReason::Grpc(tonic::Code::Unavailable as i32).to_string(),
            "grpc_unavailable"
        );
        assert_eq!(
            FailureReason::Grpc(tonic::Code::ResourceExhausted as i32).to_string(),
            "grpc_resource_exhausted"
        );
        assert_eq!(FailureReason::Http(503).to_string(), "http_503");
        assert_eq!(FailureReason::Timeout.to_string(), "timeout");
    }

    #[test]
    fn partial_success_that_is_empty_counts_as_full_success() {
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsPartialSuccess;
        let empty = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess::default()),
        };
        assert_eq!(empty.into_partial_success(), None);
        let some = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: 3,
                error_message: "bad unit".into(),
            }),
        };
        assert_eq!(
            some.into_partial_success(),
            Some(PartialSuccess {
                rejected: 3,
                error_message: "bad unit".into()
            })
        );
    }
}
