//! OTLP/gRPC: unary `Export` calls over a tonic `Channel`. The request is already protobuf, so a
//! pass-through codec writes its bytes as the message and only the (small) response is decoded;
//! decoding the request back into prost types just to let tonic encode it again would double the
//! export's CPU and memory for nothing.
//!
//! Scheme and TLS: `https://` means TLS, `http://` plaintext; an endpoint without a scheme is TLS
//! unless `insecure` is set (the specification's `OTEL_EXPORTER_OTLP_INSECURE`).

use std::marker::PhantomData;
use std::time::Duration;

use bytes::{BufMut as _, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use tonic::codec::{
    BufferSettings, Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder,
};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{
    error_chain, log_partial_success, redact_url, retry_info_delay, tls, EncodedRequest,
    ExportResponse, SendError, SendOutcome, Signal, Transport, TransportBuildError,
};
use crate::config::otlp::{Compression, SignalEndpoint};

/// The largest response accepted; an OTLP response is a few bytes of partial success.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// An OTLP/gRPC carrier. Cloning shares the connection.
#[derive(Clone)]
pub struct GrpcTransport {
    channel: Channel,
    /// For messages: the URL without credentials.
    endpoint: String,
    metadata: MetadataMap,
    timeout: Duration,
    compression: Option<CompressionEncoding>,
}

impl std::fmt::Debug for GrpcTransport {
    // Metadata values are secrets (API keys); only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self
            .metadata
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str(),
            })
            .collect();
        f.debug_struct("GrpcTransport")
            .field("endpoint", &self.endpoint)
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field("compression", &self.compression)
            .finish()
    }
}

impl GrpcTransport {
    /// Builds the carrier; the connection is made on the first export, so a collector that
    /// starts after gpulse is no start-up error.
    ///
    /// # Errors
    /// [`TransportBuildError`] for an unusable URL, header or TLS file.
    ///
    /// # Panics
    /// Outside a tokio runtime: tonic spawns the channel's worker task here.
    pub fn new(signal: Signal, settings: &SignalEndpoint) -> Result<Self, TransportBuildError> {
        let url = normalize_url(&settings.url, settings.insecure);
        let invalid = |reason: String| TransportBuildError::InvalidUrl {
            signal,
            url: redact_url(&settings.url),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| invalid(error_chain(&e)))?
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout);
        match endpoint.uri().scheme_str() {
            Some("https") => {
                endpoint = endpoint
                    .tls_config(client_tls_config(&settings.tls)?)
                    .map_err(|e| TransportBuildError::Tls {
                        signal,
                        detail: error_chain(&e),
                    })?;
            }
            Some("http") => {
                if settings.tls != Default::default() {
                    tracing::warn!(
                        %signal,
                        endpoint = %redact_url(&url),
                        "TLS files are configured but the OTLP endpoint is plain http://, so \
                         they are not used; write https:// to use TLS"
                    );
                }
            }
            other => {
                return Err(invalid(format!(
                    "the scheme must be http or https, not {}",
                    other.unwrap_or("(none)")
                )))
            }
        }
        let mut metadata = MetadataMap::new();
        for (name, value) in &settings.headers {
            let key = AsciiMetadataKey::from_bytes(name.as_bytes()).map_err(|_| {
                TransportBuildError::InvalidHeader {
                    name: name.clone(),
                    reason: "not a valid gRPC metadata name",
                }
            })?;
            let value = AsciiMetadataValue::try_from(value.expose()).map_err(|_| {
                TransportBuildError::InvalidHeader {
                    name: name.clone(),
                    reason: "the value holds characters gRPC metadata cannot carry",
                }
            })?;
            metadata.append(key, value);
        }
        Ok(Self {
            channel: endpoint.connect_lazy(),
            endpoint: redact_url(&url),
            metadata,
            timeout: settings.timeout,
            compression: match settings.compression {
                Compression::Gzip => Some(CompressionEncoding::Gzip),
                Compression::None => None,
            },
        })
    }

    async fn export<R: ExportResponse>(
        &self,
        signal: Signal,
        request: &EncodedRequest,
    ) -> Result<SendOutcome, SendError> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        if let Some(encoding) = self.compression {
            grpc = grpc.send_compressed(encoding);
        }
        // Accepting gzip costs nothing and lets a collector compress a long error message.
        grpc = grpc.accept_compressed(CompressionEncoding::Gzip);

        let mut call = tonic::Request::new(request.body().clone());
        *call.metadata_mut() = self.metadata.clone();
        call.set_timeout(self.timeout);

        let attempt = async {
            grpc.ready().await.map_err(|e| SendError::Connect {
                signal,
                endpoint: self.endpoint.clone(),
                detail: error_chain(&e),
            })?;
            let path = http::uri::PathAndQuery::from_static(signal.grpc_path());
            let codec = PassThroughCodec::<R>::for_body(request.body().len());
            grpc.unary(call, path, codec)
                .await
                .map_err(|status| self.status_error(signal, status))
        };
        // tonic's own timeout covers the call; this one also bounds the connection set-up.
        let response = tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| SendError::Timeout {
                signal,
                endpoint: self.endpoint.clone(),
                timeout: self.timeout,
            })??;
        let partial_success = response.into_inner().into_partial_success();
        if let Some(partial) = &partial_success {
            log_partial_success(signal, &self.endpoint, partial);
        }
        Ok(SendOutcome { partial_success })
    }

    fn status_error(&self, signal: Signal, status: tonic::Status) -> SendError {
        let mut message = status.message().to_string();
        if let Some(source) = std::error::Error::source(&status) {
            message = format!("{message} ({})", error_chain(source));
        }
        SendError::GrpcStatus {
            signal,
            endpoint: self.endpoint.clone(),
            code: status.code(),
            message,
            retry_after: retry_info_delay(status.details()),
        }
    }
}

impl Transport for GrpcTransport {
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

/// Gives a scheme-less endpoint (`collector:4317`) the one `insecure` implies.
fn normalize_url(url: &str, insecure: bool) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else if insecure {
        format!("http://{url}")
    } else {
        format!("https://{url}")
    }
}

fn client_tls_config(
    files: &crate::config::otlp::TlsFiles,
) -> Result<ClientTlsConfig, TransportBuildError> {
    let mut config = ClientTlsConfig::new();
    config = match &files.ca_certificate {
        Some(path) => config.ca_certificate(Certificate::from_pem(tls::read_pem(
            "CA certificate",
            path,
        )?)),
        None => config.with_webpki_roots(),
    };
    if let Some(pems) = tls::client_identity_pems(files)? {
        config = config.identity(Identity::from_pem(pems.cert, pems.key));
    }
    Ok(config)
}

/// A gRPC message's header: the compression flag and the 4-byte length.
const GRPC_MESSAGE_HEADER: usize = 5;
/// tonic's own message buffer size (`BufferSettings::default`).
const TONIC_DEFAULT_BUFFER: usize = 8 * 1024;

/// Writes the pre-encoded request as the gRPC message and decodes the response as `R`.
struct PassThroughCodec<R> {
    /// The request's length: tonic's message buffer is allocated at that size once, instead of
    /// at its 8 KiB default and then grown (and, with compression, grown 8 KiB at a time while
    /// the compressed bytes are written).
    body_len: usize,
    response: PhantomData<fn() -> R>,
}

impl<R> PassThroughCodec<R> {
    fn for_body(body_len: usize) -> Self {
        Self {
            body_len,
            response: PhantomData,
        }
    }
}

impl<R: ExportResponse> Codec for PassThroughCodec<R> {
    type Encode = Bytes;
    type Decode = R;
    type Encoder = BytesEncoder;
    type Decoder = ProstDecoder<R>;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder {
            body_len: self.body_len,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder(PhantomData)
    }
}

struct BytesEncoder {
    body_len: usize,
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        // The message and its gRPC header (a flag and a 4-byte length), never under tonic's
        // default. One message per call: the buffer is handed over whole once it is written,
        // whatever the yield threshold.
        let size = (self.body_len + GRPC_MESSAGE_HEADER).max(TONIC_DEFAULT_BUFFER);
        BufferSettings::new(size, size)
    }
}

struct ProstDecoder<R>(PhantomData<fn() -> R>);

impl<R: ExportResponse> Decoder for ProstDecoder<R> {
    type Item = R;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<R>, Self::Error> {
        R::decode(src).map(Some).map_err(|e| {
            tonic::Status::internal(format!(
                "the OTLP export response is not valid protobuf: {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::otlp::TlsFiles;
    use crate::values::SecretString;

    fn settings(url: &str) -> SignalEndpoint {
        SignalEndpoint {
            protocol: crate::config::otlp::Protocol::Grpc,
            url: url.into(),
            headers: vec![("x-api-key".into(), SecretString::new("s3cr3t-value"))],
            timeout: Duration::from_secs(1),
            compression: Compression::Gzip,
            tls: TlsFiles::default(),
            insecure: false,
        }
    }

    #[test]
    fn scheme_less_endpoints_follow_insecure() {
        assert_eq!(
            normalize_url("collector:4317", true),
            "http://collector:4317"
        );
        assert_eq!(
            normalize_url("collector:4317", false),
            "https://collector:4317"
        );
        assert_eq!(normalize_url("http://c:4317", false), "http://c:4317");
    }

    #[tokio::test]
    async fn debug_output_never_shows_header_values() {
        let transport =
            GrpcTransport::new(Signal::Metrics, &settings("http://127.0.0.1:1")).unwrap();
        let text = format!("{transport:?}");
        assert!(text.contains("x-api-key"), "{text}");
        assert!(!text.contains("s3cr3t-value"), "{text}");
    }

    #[tokio::test]
    async fn a_bad_header_name_is_refused_without_showing_the_value() {
        let mut s = settings("http://127.0.0.1:1");
        s.headers = vec![("bad header".into(), SecretString::new("s3cr3t-value"))];
        let err = GrpcTransport::new(Signal::Metrics, &s).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("bad header"), "{text}");
        assert!(!text.contains("s3cr3t-value"), "{text}");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_retryable_failure() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let transport =
            GrpcTransport::new(Signal::Metrics, &settings("http://127.0.0.1:1")).unwrap();
        let err = transport
            .send(Signal::Metrics, &EncodedRequest::new(Vec::new(), 0))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.retryability(),
                super::super::Retryability::Retryable { .. }
            ),
            "{err}"
        );
    }
}
