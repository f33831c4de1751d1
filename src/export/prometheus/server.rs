//! The HTTP side of `/metrics`: HTTP/1.1 over hyper, one task per connection, `GET /metrics`
//! answered from [`Published`]. The accept loop backs off when accepting fails (EMFILE when
//! the process is out of file descriptors) instead of spinning, and says so at most once per
//! failure streak.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{ACCEPT, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::encode::{encode, Format};
use super::Published;

/// The longest wait between two failed accepts.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Binds `addr` and serves `/metrics` until the task is aborted. Returns the bound address
/// (the port is chosen by the kernel when `addr` says 0).
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    published: Arc<Published>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tracing::info!("Prometheus metrics on http://{local}/metrics");
    Ok((local, tokio::spawn(accept_loop(listener, published))))
}

async fn accept_loop(listener: TcpListener, published: Arc<Published>) {
    let mut backoff = Duration::ZERO;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(e) => {
                if backoff.is_zero() {
                    tracing::warn!(
                        "/metrics could not accept a connection: {e}. Retrying with backoff; if \
                         this is 'Too many open files', raise the file descriptor limit \
                         (ulimit -n / LimitNOFILE)"
                    );
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let published = Arc::clone(&published);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let published = Arc::clone(&published);
                async move { Ok::<_, Infallible>(respond(&published, &req)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("/metrics connection ended: {e}");
            }
        });
    }
}

/// Answers one request; the body is never read (a scrape has none).
pub fn respond<B>(published: &Published, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!(
                "nothing at {}; Prometheus metrics are at /metrics\n",
                req.uri().path()
            ),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "/metrics answers GET\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, http::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let (exposition, own) = published.latest();
    match encode(exposition, own, format, SystemTime::now()) {
        Ok(body) => text(StatusCode::OK, format.content_type(), body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "could not format the metrics\n".into(),
        ),
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}
