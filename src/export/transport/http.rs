//! OTLP/HTTP with protobuf bodies: one POST per request to the signal's URL
//! (`.../v1/metrics`, `.../v1/logs`), over hyper 1 and, for https, rustls on the ring provider.
//! The answer is read as the specification says: 2xx with an `Export*ServiceResponse` body
//! (partial success), or an error status with a `google.rpc.Status` body and, for 429/503, maybe
//! a `Retry-After`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER, USER_AGENT,
};
use http::{HeaderMap, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;

use super::gzip::Gzip;
use super::{
    error_chain, log_partial_success, parse_retry_after, redact_url, rpc_status_message, tls,
    EncodedRequest, ExportResponse, PartialSuccess, SendError, SendOutcome, Signal, Transport,
    TransportBuildError, WarnLimiter,
};
use crate::config::otlp::{Compression, SignalEndpoint};

/// The largest response body read; OTLP answers are tiny, a misrouted proxy page need not be.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// How much of a non-protobuf error body makes it into the error message.
const MAX_ERROR_TEXT: usize = 300;
const PROTOBUF: &str = "application/x-protobuf";

/// An OTLP/HTTP carrier for one signal's URL. Cloning shares the connection pool.
#[derive(Clone)]
pub struct HttpTransport {
    client: Pool,
    url: Uri,
    /// For messages: the URL without credentials.
    endpoint: String,
    headers: HeaderMap,
    timeout: Duration,
    /// With `Content-Encoding: gzip`: the compressor, kept between requests.
    gzip: Option<Arc<Gzip>>,
}

/// The connection pool: plain TCP for an `http` URL, rustls for `https`. The TLS configuration
/// is built only for `https` (as OTLP/gRPC does, TLS files with an `http` URL are warned about
/// and not used): building it reads the ~150 webpki roots and pages in rustls and ring, memory
/// a sidecar sending to a plain-HTTP node Collector has no use for.
#[derive(Clone)]
enum Pool {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Pool {
    async fn request(
        &self,
        post: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Pool::Plain(client) => client.request(post).await,
            Pool::Tls(client) => client.request(post).await,
        }
    }
}

impl std::fmt::Debug for HttpTransport {
    // Header values are secrets (API keys); only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("HttpTransport")
            .field("endpoint", &self.endpoint)
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field("gzip", &self.gzip.is_some())
            .finish()
    }
}

impl HttpTransport {
    /// Builds the carrier; nothing is connected until the first export.
    ///
    /// # Errors
    /// [`TransportBuildError`] for an unusable URL, header or TLS file.
    pub fn new(signal: Signal, settings: &SignalEndpoint) -> Result<Self, TransportBuildError> {
        let invalid = |reason: String| TransportBuildError::InvalidUrl {
            signal,
            url: redact_url(&settings.url),
            reason,
        };
        let url: Uri = settings
            .url
            .trim()
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        match url.scheme_str() {
            Some("http") | Some("https") => {}
            other => {
                return Err(invalid(format!(
                    "the scheme must be http or https, not {}",
                    other.unwrap_or("(none)")
                )))
            }
        }
        if url.host().is_none() {
            return Err(invalid("the URL has no host".into()));
        }

        let mut headers = HeaderMap::new();
        for (name, value) in &settings.headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                TransportBuildError::InvalidHeader {
                    name: name.clone(),
                    reason: "not a valid HTTP header name",
                }
            })?;
            let mut value = HeaderValue::from_str(value.expose()).map_err(|_| {
                TransportBuildError::InvalidHeader {
                    name: name.clone(),
                    reason: "the value holds characters an HTTP header cannot carry",
                }
            })?;
            // Keeps the value out of hyper's own debug logging.
            value.set_sensitive(true);
            headers.append(header, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("gpulse/", env!("CARGO_PKG_VERSION"))),
        );
        let gzip = (settings.compression == Compression::Gzip).then(|| Arc::new(Gzip::new()));
        if gzip.is_some() {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }

        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.timeout));
        connector.set_nodelay(true);
        let https = url.scheme_str() == Some("https");
        if !https && settings.tls != Default::default() {
            tracing::warn!(
                %signal,
                endpoint = %redact_url(&settings.url),
                "TLS files are configured but the OTLP endpoint is plain http://, so they are \
                 not used; write https:// to use TLS"
            );
        }
        let client = if https {
            let tls = tls::rustls_client_config(signal, &settings.tls)?;
            connector.enforce_http(false);
            let connector = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector);
            Pool::Tls(Client::builder(TokioExecutor::new()).build(connector))
        } else {
            Pool::Plain(Client::builder(TokioExecutor::new()).build(connector))
        };

        Ok(Self {
            client,
            endpoint: redact_url(&settings.url),
            url,
            headers,
            timeout: settings.timeout,
            gzip,
        })
    }

    async fn export<R: ExportResponse>(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        let body = match &self.gzip {
            Some(gzip) => Bytes::from(
                gzip.compress(request.body())
                    .map_err(|source| SendError::Compress { signal, source })?,
            ),
            None => request.body().clone(),
        };
        let mut post = http::Request::new(Full::new(body));
        *post.method_mut() = http::Method::POST;
        *post.uri_mut() = self.url.clone();
        *post.headers_mut() = self.headers.clone();

        let exchange = async {
            let response = self
                .client
                .request(post)
                .await
                .map_err(|e| self.client_error(signal, &e))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| SendError::Network {
                    signal,
                    endpoint: self.endpoint.clone(),
                    detail: format!("reading the response body: {}", error_chain(&*e)),
                })?
                .to_bytes();
            Ok::<_, SendError>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout {
                signal,
                endpoint: self.endpoint.clone(),
                timeout: self.timeout,
            })??;

        if parts.status.is_success() {
            let partial_success = self.read_success::<R>(signal, &body);
            if let Some(partial) = &partial_success {
                log_partial_success(signal, &self.endpoint, partial);
            }
            return Ok(SendOutcome { partial_success });
        }
        let retry_after = parts
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        Err(SendError::HttpStatus {
            signal,
            endpoint: self.endpoint.clone(),
            status: parts.status.as_u16(),
            message: error_message(&parts.headers, &body),
            retry_after,
        })
    }

    fn read_success<R: ExportResponse>(
        &self,
        signal: Signal,
        body: &[u8],
    ) -> Option<PartialSuccess> {
        if body.is_empty() {
            return None;
        }
        match R::decode(body) {
            Ok(response) => response.into_partial_success(),
            Err(e) => {
                // The data was accepted (2xx); an unreadable answer only loses the partial
                // success, so it is worth a warning, not a retry.
                static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(300));
                if let Some(suppressed) = LIMIT.permit() {
                    tracing::warn!(
                        %signal,
                        endpoint = %self.endpoint,
                        suppressed_since_last = suppressed,
                        "the OTLP/HTTP endpoint accepted the request but its answer is not an \
                         OTLP protobuf response ({e}); is the URL a real OTLP receiver?"
                    );
                }
                None
            }
        }
    }

    fn client_error(&self, signal: Signal, err: &hyper_util::client::legacy::Error) -> SendError {
        let detail = error_chain(err);
        if err.is_connect() {
            SendError::Connect {
                signal,
                endpoint: self.endpoint.clone(),
                detail,
            }
        } else {
            SendError::Network {
                signal,
                endpoint: self.endpoint.clone(),
                detail,
            }
        }
    }
}

impl Transport for HttpTransport {
    async fn send(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        match signal {
            Signal::Metrics => {
                self.export::<ExportMetricsServiceResponse>(signal, request)
                    .await
            }
            Signal::Logs => {
                self.export::<ExportLogsServiceResponse>(signal, request)
                    .await
            }
            Signal::Traces => {
                self.export::<ExportTraceServiceResponse>(signal, request)
                    .await
            }
        }
    }
}

/// What the server said about an error: the `google.rpc.Status` message the specification asks
/// for, else the start of whatever text came back.
fn error_message(headers: &HeaderMap, body: &[u8]) -> String {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with(PROTOBUF) || content_type.is_empty() {
        if let Some(message) = rpc_status_message(body) {
            return message;
        }
    }
    if body.is_empty() {
        return "(empty body)".into();
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(MAX_ERROR_TEXT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::otlp::{Protocol, TlsFiles};
    use crate::export::transport::classify::RpcStatus;
    use crate::values::SecretString;
    use prost::Message as _;

    fn settings(url: &str) -> SignalEndpoint {
        SignalEndpoint {
            protocol: Protocol::HttpProtobuf,
            url: url.into(),
            headers: vec![("authorization".into(), SecretString::new("Bearer s3cr3t"))],
            timeout: Duration::from_secs(1),
            compression: Compression::Gzip,
            tls: TlsFiles::default(),
            insecure: false,
        }
    }

    /// TLS is set up for `https` only: there a missing CA file is an error at start; with an
    /// `http` URL the files are not read (a warning says they are unused) and the pool is plain.
    #[test]
    fn tls_is_built_for_https_urls_only() {
        let mut with_files = settings("https://collector.example:4318/v1/metrics");
        with_files.tls.ca_certificate = Some("/nonexistent/gpulse-ca.pem".into());
        let err = HttpTransport::new(Signal::Metrics, &with_files)
            .expect_err("an https URL reads its CA file");
        assert!(err.to_string().contains("gpulse-ca.pem"), "{err}");

        with_files.url = "http://collector.example:4318/v1/metrics".into();
        let plain = HttpTransport::new(Signal::Metrics, &with_files)
            .expect("an http URL does not read TLS files");
        assert!(matches!(plain.client, Pool::Plain(_)));
        let tls = HttpTransport::new(
            Signal::Metrics,
            &settings("https://collector.example:4318/v1/metrics"),
        )
        .expect("https with the webpki roots");
        assert!(matches!(tls.client, Pool::Tls(_)));
    }

    #[test]
    fn error_messages_prefer_the_rpc_status() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
        let body = RpcStatus {
            code: 3,
            message: "bad metric".into(),
            details: vec![],
        }
        .encode_to_vec();
        assert_eq!(error_message(&headers, &body), "bad metric");

        let mut text = HeaderMap::new();
        text.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
        assert_eq!(
            error_message(&text, b"  <h1>Bad gateway</h1>\n"),
            "<h1>Bad gateway</h1>"
        );
        let long = "x".repeat(1000);
        assert_eq!(
            error_message(&text, long.as_bytes()).chars().count(),
            MAX_ERROR_TEXT + 1
        );
        assert_eq!(error_message(&text, b""), "(empty body)");
    }

    #[test]
    fn urls_without_http_scheme_or_host_are_refused() {
        for url in [
            "localhost:4318/v1/metrics",
            "ftp://host/v1/metrics",
            "/v1/metrics",
            "http://",
        ] {
            let err = HttpTransport::new(Signal::Metrics, &settings(url));
            assert!(
                matches!(err, Err(TransportBuildError::InvalidUrl { .. })),
                "{url}: {err:?}"
            );
        }
    }

    #[test]
    fn debug_output_never_shows_header_values() {
        let t = HttpTransport::new(
            Signal::Metrics,
            &settings("https://user:pw@otel.example:4318/v1/metrics"),
        )
        .unwrap();
        let text = format!("{t:?}");
        assert!(text.contains("authorization"), "{text}");
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_retryable_connect_failure() {
        let t = HttpTransport::new(Signal::Logs, &settings("http://127.0.0.1:1/v1/logs")).unwrap();
        let err = t
            .send(Signal::Logs, &EncodedRequest::new(vec![1, 2, 3], 1))
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Connect { .. }), "{err}");
        assert!(matches!(
            err.retryability(),
            super::super::Retryability::Retryable { .. }
        ));
    }
}
