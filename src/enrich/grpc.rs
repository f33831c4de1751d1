//! The OTLP/gRPC receiver: `TraceService`, `MetricsService` and `LogsService` `Export` on one
//! tonic server. One hand-written service routes the three methods (tonic's multi-service
//! router needs its `router` feature, which pulls in axum), and its codec hands the request over
//! as the raw protobuf bytes, so that metrics and logs are forwarded without being re-encoded.
//! Refusals use the codes the OTLP/gRPC specification gives: INVALID_ARGUMENT (malformed),
//! RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo` (queue full, retryable), UNAVAILABLE
//! (shutting down).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::{Buf as _, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;
use tokio::net::TcpListener;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{Grpc, UnaryService};
use tonic::transport::server::TcpIncoming;

use super::intake::{Intake, IntakeError, Peer};
use crate::export::transport::{ProtoAny, ProtoDuration, RetryInfo, RpcStatus, Signal};

/// The largest request message taken, after decompression (tonic's default is 4 MiB, which a
/// large SDK batch can pass).
pub(crate) const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Serves OTLP/gRPC on `listener` until the task is aborted.
pub(crate) fn serve(listener: TcpListener, intake: Arc<Intake>) -> tokio::task::JoinHandle<()> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .serve_with_incoming(OtlpGrpc::new(intake), incoming)
            .await
        {
            tracing::error!("the OTLP/gRPC receiver stopped: {e}");
        }
    })
}

/// The three `Export` methods.
#[derive(Clone)]
pub(crate) struct OtlpGrpc {
    intake: Arc<Intake>,
}

impl OtlpGrpc {
    /// The service without a server around it, for calling it in-process (`crate::fuzzing`).
    pub(crate) fn new(intake: Arc<Intake>) -> Self {
        Self { intake }
    }
}

impl<B> Service<http::Request<B>> for OtlpGrpc
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let intake = Arc::clone(&self.intake);
        let signal = match req.uri().path() {
            p if p == Signal::Traces.grpc_path() => Signal::Traces,
            p if p == Signal::Metrics.grpc_path() => Signal::Metrics,
            p if p == Signal::Logs.grpc_path() => Signal::Logs,
            _ => return Box::pin(async { Ok(unimplemented_response()) }),
        };
        Box::pin(async move {
            Ok(match signal {
                Signal::Traces => {
                    grpc::<ExportTraceServiceResponse>()
                        .unary(Export::new(intake, signal), req)
                        .await
                }
                Signal::Metrics => {
                    grpc::<ExportMetricsServiceResponse>()
                        .unary(Export::new(intake, signal), req)
                        .await
                }
                Signal::Logs => {
                    grpc::<ExportLogsServiceResponse>()
                        .unary(Export::new(intake, signal), req)
                        .await
                }
            })
        })
    }
}

fn grpc<R: prost::Message + Default + Send + 'static>() -> Grpc<RawRequestCodec<R>> {
    Grpc::new(RawRequestCodec(PhantomData))
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

fn unimplemented_response() -> http::Response<tonic::body::Body> {
    let mut response = http::Response::new(tonic::body::Body::default());
    let headers = response.headers_mut();
    headers.insert(
        tonic::Status::GRPC_STATUS,
        (tonic::Code::Unimplemented as i32).into(),
    );
    headers.insert(
        http::header::CONTENT_TYPE,
        tonic::metadata::GRPC_CONTENT_TYPE,
    );
    response
}

/// One `Export` call of one signal.
struct Export<R> {
    intake: Arc<Intake>,
    signal: Signal,
    _response: PhantomData<fn() -> R>,
}

impl<R> Export<R> {
    fn new(intake: Arc<Intake>, signal: Signal) -> Self {
        Self {
            intake,
            signal,
            _response: PhantomData,
        }
    }
}

impl<R: prost::Message + Default + Send + 'static> UnaryService<Bytes> for Export<R> {
    type Response = R;
    type Future = BoxFuture<tonic::Response<R>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let intake = Arc::clone(&self.intake);
        let signal = self.signal;
        let peer = match (request.local_addr(), request.remote_addr()) {
            (Some(local), Some(remote)) => Some(Peer { local, remote }),
            _ => None,
        };
        Box::pin(async move {
            intake
                .accept(signal, request.into_inner(), peer)
                .await
                // An empty response: no partial success to report.
                .map(|_| tonic::Response::new(R::default()))
                .map_err(|e| to_status(&e))
        })
    }
}

/// The gRPC status of a refusal.
pub(crate) fn to_status(error: &IntakeError) -> tonic::Status {
    let message = error.to_string();
    match error {
        IntakeError::Malformed { .. } => tonic::Status::invalid_argument(message),
        IntakeError::QueueFull { retry_after, .. } => {
            let code = tonic::Code::ResourceExhausted;
            let details = RpcStatus {
                code: code as i32,
                message: message.clone(),
                details: vec![ProtoAny {
                    type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                    value: RetryInfo {
                        retry_delay: Some(ProtoDuration {
                            seconds: i64::try_from(retry_after.as_secs()).unwrap_or(i64::MAX),
                            nanos: retry_after.subsec_nanos() as i32,
                        }),
                    }
                    .encode_to_vec(),
                }],
            };
            tonic::Status::with_details(code, message, Bytes::from(details.encode_to_vec()))
        }
        _ => tonic::Status::unavailable(message),
    }
}

/// Decodes nothing (the request stays protobuf bytes), encodes the response `R`.
struct RawRequestCodec<R>(PhantomData<fn() -> R>);

impl<R: prost::Message + Default + Send + 'static> Codec for RawRequestCodec<R> {
    type Encode = R;
    type Decode = Bytes;
    type Encoder = ResponseEncoder<R>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

struct ResponseEncoder<R>(PhantomData<fn() -> R>);

impl<R: prost::Message> Encoder for ResponseEncoder<R> {
    type Item = R;
    type Error = tonic::Status;

    fn encode(&mut self, item: R, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encoding the OTLP response: {e}")))
    }
}

struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::transport::{classify_grpc, retry_info_delay, Retryability};

    #[test]
    fn a_full_queue_is_resource_exhausted_with_retry_info_that_the_sdk_retries() {
        let status = to_status(&IntakeError::QueueFull {
            queued: 1,
            max: 1,
            retry_after: std::time::Duration::from_secs(5),
        });
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let delay = retry_info_delay(status.details());
        assert_eq!(delay, Some(std::time::Duration::from_secs(5)));
        // By the specification's table, RESOURCE_EXHAUSTED with RetryInfo is retryable.
        assert_eq!(
            classify_grpc(status.code(), delay),
            Retryability::Retryable { after: delay }
        );
        let bad = to_status(&IntakeError::Malformed {
            signal: Signal::Logs,
            detail: "x".into(),
        });
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("logs"), "{}", bad.message());
    }
}
