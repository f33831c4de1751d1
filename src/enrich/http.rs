//! The OTLP/HTTP receiver: `POST /v1/traces`, `/v1/metrics`, `/v1/logs` with protobuf bodies
//! (`application/x-protobuf`, optionally `Content-Encoding: gzip`), answered as the OTLP/HTTP
//! specification says: 200 with an empty `Export*ServiceResponse`, or an error status with a
//! `google.rpc.Status` body (400 malformed, 413 too large, 415 JSON or an unknown encoding, 429
//! or 503 with `Retry-After`). HTTP/1.1 over hyper, one task per connection.

use std::convert::Infallible;
use std::io::Read as _;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::net::TcpListener;

use super::intake::{Intake, IntakeError, Peer};
use crate::export::transport::{RpcStatus, Signal};

/// The largest request body taken, compressed or decompressed; an SDK's batch of 512 spans is
/// far smaller.
pub(crate) const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
const PROTOBUF: &str = "application/x-protobuf";

/// Serves OTLP/HTTP on `listener` until the task is aborted.
pub(crate) fn serve(listener: TcpListener, intake: Arc<Intake>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (stream, remote) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: wait a little instead of spinning.
                    tracing::warn!("the OTLP/HTTP receiver could not accept a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let local = stream.local_addr().ok();
            let _ = stream.set_nodelay(true);
            let intake = Arc::clone(&intake);
            tokio::spawn(async move {
                let peer = local.map(|local| Peer { local, remote });
                let service = hyper::service::service_fn(move |req| {
                    let intake = Arc::clone(&intake);
                    async move { Ok::<_, Infallible>(handle(&intake, req, peer).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%remote, "OTLP/HTTP connection ended: {e}");
                }
            });
        }
    })
}

/// Answers one request. Generic over the body so that `crate::fuzzing` can call it without a
/// connection; the server passes hyper's `Incoming`.
pub(crate) async fn handle<B>(
    intake: &Arc<Intake>,
    req: Request<B>,
    peer: Option<Peer>,
) -> Response<Full<Bytes>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let signal = match req.uri().path() {
        "/v1/traces" => Signal::Traces,
        "/v1/metrics" => Signal::Metrics,
        "/v1/logs" => Signal::Logs,
        other => {
            return status(
                StatusCode::NOT_FOUND,
                &format!("no OTLP endpoint at {other}; use /v1/traces, /v1/metrics or /v1/logs"),
            )
        }
    };
    if req.method() != Method::POST {
        let mut response = status(
            StatusCode::METHOD_NOT_ALLOWED,
            "OTLP/HTTP exports are POST requests",
        );
        response
            .headers_mut()
            .insert(ALLOW, http::HeaderValue::from_static("POST"));
        return response;
    }
    let content_type = header(&req, CONTENT_TYPE);
    if content_type.starts_with("application/json") {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "gpulse's OTLP receiver takes protobuf bodies only (application/x-protobuf); set \
             OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (or grpc) in the application",
        );
    }
    if !content_type.is_empty() && !content_type.starts_with(PROTOBUF) {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!("unsupported Content-Type {content_type:?}; expected {PROTOBUF}"),
        );
    }
    let encoding = header(&req, CONTENT_ENCODING).to_ascii_lowercase();
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return status(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request is over {} MiB; lower the SDK's batch size \
                     (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)",
                    MAX_BODY_BYTES >> 20
                ),
            )
        }
        Err(e) => {
            return status(
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {e}"),
            )
        }
    };
    let body = match encoding.as_str() {
        "" | "identity" => body,
        "gzip" => match gunzip(&body) {
            Ok(plain) => plain,
            Err(message) => return status(StatusCode::BAD_REQUEST, &message),
        },
        other => {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding {other:?}; use gzip or none"),
            )
        }
    };
    match intake.accept(signal, body, peer).await {
        Ok(_) => {
            // An empty Export*ServiceResponse: no partial success to report.
            let mut response = Response::new(Full::new(Bytes::new()));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, http::HeaderValue::from_static(PROTOBUF));
            response
        }
        Err(e) => refusal(&e),
    }
}

fn header<B>(req: &Request<B>, name: http::header::HeaderName) -> &str {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
}

/// The HTTP answer to a refusal.
pub(crate) fn refusal(error: &IntakeError) -> Response<Full<Bytes>> {
    let message = error.to_string();
    match error {
        IntakeError::Malformed { .. } => status(StatusCode::BAD_REQUEST, &message),
        IntakeError::QueueFull { retry_after, .. } => {
            let mut r = status(StatusCode::TOO_MANY_REQUESTS, &message);
            r.headers_mut()
                .insert(RETRY_AFTER, http::HeaderValue::from(retry_after.as_secs()));
            r
        }
        _ => {
            let mut r = status(StatusCode::SERVICE_UNAVAILABLE, &message);
            r.headers_mut()
                .insert(RETRY_AFTER, http::HeaderValue::from_static("1"));
            r
        }
    }
}

/// An error answer with the `google.rpc.Status` body the specification asks for.
fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let grpc_code = match code {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::InvalidArgument,
        StatusCode::NOT_FOUND => tonic::Code::NotFound,
        StatusCode::TOO_MANY_REQUESTS => tonic::Code::ResourceExhausted,
        StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
        _ => tonic::Code::Unimplemented,
    };
    let body = RpcStatus {
        code: grpc_code as i32,
        message: message.to_string(),
        details: Vec::new(),
    }
    .encode_to_vec();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(PROTOBUF));
    response
}

/// Decompresses a gzip body, at most [`MAX_BODY_BYTES`] of output.
pub(crate) fn gunzip(body: &[u8]) -> Result<Bytes, String> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(MAX_BODY_BYTES));
    let read = flate2::read::GzDecoder::new(body)
        .take(MAX_BODY_BYTES as u64 + 1)
        .read_to_end(&mut out);
    match read {
        Ok(_) if out.len() > MAX_BODY_BYTES => Err(format!(
            "the request is over {} MiB once decompressed",
            MAX_BODY_BYTES >> 20
        )),
        Ok(_) => Ok(Bytes::from(out)),
        Err(e) => Err(format!(
            "Content-Encoding says gzip but the body does not decompress: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_bodies_round_trip_and_garbage_is_refused() {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"spans spans spans").unwrap();
        let packed = enc.finish().unwrap();
        assert_eq!(
            gunzip(&packed).unwrap(),
            Bytes::from_static(b"spans spans spans")
        );
        let err = gunzip(b"not gzip").unwrap_err();
        assert!(err.contains("does not decompress"), "{err}");
    }

    #[test]
    fn refusals_carry_the_specified_status_and_hint() {
        let full = refusal(&IntakeError::QueueFull {
            queued: 10,
            max: 10,
            retry_after: std::time::Duration::from_secs(5),
        });
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.headers()[RETRY_AFTER], "5");
        let bad = refusal(&IntakeError::Malformed {
            signal: Signal::Traces,
            detail: "x".into(),
        });
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
}
