//! OTLP exporter settings: the resolved form of the standard `OTEL_EXPORTER_OTLP_*` variables
//! (and their `_METRICS_`/`_LOGS_` forms), the config file's `[otlp]` table and the flags.

use std::path::PathBuf;
use std::time::Duration;

use crate::values::SecretString;

/// Which OTLP transport carries the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`grpc`), default port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`), default port 4318.
    HttpProtobuf,
}

/// Body compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// TLS material, as paths to PEM files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`: CA bundle to verify the server with.
    pub ca_certificate: Option<PathBuf>,
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`.
    pub client_certificate: Option<PathBuf>,
    /// `OTEL_EXPORTER_OTLP_CLIENT_KEY`.
    pub client_key: Option<PathBuf>,
}

/// Where and how one signal (metrics or logs) is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalEndpoint {
    pub protocol: Protocol,
    /// Full URL the requests go to. For HTTP this already ends in `/v1/metrics` or `/v1/logs`
    /// when it came from the generic endpoint, as the specification says; a signal-specific
    /// endpoint is used as given. For gRPC it is the server's origin (`http://host:4317`).
    pub url: String,
    /// Header names lower-cased; values secret.
    pub headers: Vec<(String, SecretString)>,
    pub timeout: Duration,
    pub compression: Compression,
    pub tls: TlsFiles,
    /// `OTEL_EXPORTER_OTLP_INSECURE` for gRPC: plaintext even with an `https` scheme absent.
    pub insecure: bool,
}

/// The exporter gpulse sends its data through.
// Built once at start and moved into the export task: boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ExporterKind {
    /// OTLP to a collector or backend.
    Otlp {
        metrics: SignalEndpoint,
        logs: SignalEndpoint,
        /// Spans received by the local OTLP receiver (`enrich`) are forwarded here.
        traces: SignalEndpoint,
    },
    /// One line of OTLP JSON per request on standard output (the OTLP file-exporter format).
    Stdout,
    /// Neither OTLP nor stdout carries any signal (e.g. Prometheus-only: metrics on `/metrics`,
    /// findings off): no endpoint is resolved, no connection made.
    Off,
}
