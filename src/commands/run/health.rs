//! The optional health endpoint (`--health-addr`): `/healthz` answers while the process runs,
//! `/readyz` only while NVML answers and the sampler ticks, and `/status` returns the running
//! pipeline's latest view (devices, processes with their workloads, active findings) as the
//! snapshot JSON contract (see `status`). HTTP/1.1 over hyper, one short response per
//! connection; no listening port unless asked for.
//!
//! Nothing here calls NVML or reads `/proc`: `/readyz` reads the sampler's health counters and
//! `/status` the last published [`View`](crate::pipeline::View).
//!
//! The accept loop backs off when accepting fails (out of file descriptors, `EMFILE`), from
//! 10 ms doubling to 1 s, instead of spinning on the error; one warning per streak of failures.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::status::status_json;
use crate::pipeline::SamplerHealth;
use crate::pipeline::ViewReceiver;

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What the endpoint reads to answer.
#[derive(Clone)]
struct State {
    sampler: Arc<SamplerHealth>,
    stale_after: Duration,
    view: ViewReceiver,
}

/// Binds `addr` and answers health probes and `/status` in the background.
///
/// # Errors
/// The address cannot be bound.
pub(crate) async fn serve(
    addr: SocketAddr,
    sampler: Arc<SamplerHealth>,
    sample_interval: Duration,
    view: ViewReceiver,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(
        "health endpoint on http://{}/healthz, /readyz and /status",
        listener.local_addr()?
    );
    let state = State {
        sampler,
        stale_after: (sample_interval * 5).max(Duration::from_secs(5)),
        view,
    };
    Ok(tokio::spawn(accept_loop(listener, state)))
}

async fn accept_loop(listener: TcpListener, state: State) {
    let mut backoff = BACKOFF_FIRST;
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = BACKOFF_FIRST;
                failing = false;
                stream
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        "the health endpoint could not accept a connection: {e}. Retrying with \
                         backoff; if this is 'too many open files', raise the file descriptor \
                         limit (ulimit -n)"
                    );
                    failing = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = next_backoff(backoff);
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = respond(&req, &state);
                async move { Ok::<_, Infallible>(response) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("health connection ended: {e}");
            }
        });
    }
}

/// The wait after the next failed accept: doubled, at most [`BACKOFF_MAX`].
fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(BACKOFF_MAX)
}

fn respond<B>(req: &Request<B>, state: &State) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the health endpoint answers GET\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let (status, body) = readiness(&state.sampler, state.stale_after);
            text(status, body)
        }
        "/status" => {
            let view = state.view.borrow().clone();
            let (status, body) = status_json(view.as_deref());
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if status == StatusCode::SERVICE_UNAVAILABLE {
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "try /healthz, /readyz or /status\n".into(),
        ),
    }
}

fn readiness(sampler: &SamplerHealth, stale_after: Duration) -> (StatusCode, String) {
    if !sampler.session_up.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "NVML is not answering\n".into(),
        );
    }
    match sampler.since_last_tick() {
        Some(since) if since <= stale_after => (StatusCode::OK, "ready\n".into()),
        Some(since) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the last sample finished {since:.0?} ago\n"),
        ),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no sample yet\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_from_10ms_to_at_most_1s() {
        let mut waits = vec![BACKOFF_FIRST];
        while waits.len() < 10 {
            waits.push(next_backoff(*waits.last().unwrap()));
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    }

    #[tokio::test]
    async fn status_is_503_json_until_a_view_is_published() {
        let (sender, view) = tokio::sync::watch::channel(None);
        let state = State {
            sampler: Arc::new(SamplerHealth::default()),
            stale_after: Duration::from_secs(5),
            view,
        };
        let request = |path: &str| Request::get(path).body(()).unwrap();
        let pending = respond(&request("/status"), &state);
        assert_eq!(pending.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(pending.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(pending.headers()[RETRY_AFTER], "1");
        let window = crate::diagnosis::rules::testkit::window(60, vec![], vec![]);
        sender.send_replace(Some(Arc::new(crate::pipeline::View {
            attributed: Arc::new(crate::attribution::AttributedWindow::unattributed(window)),
            findings: Vec::new(),
            training: Default::default(),
            at: std::time::SystemTime::now(),
        })));
        assert_eq!(
            respond(&request("/status"), &state).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&request("/healthz"), &state).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&request("/nope"), &state).status(),
            StatusCode::NOT_FOUND
        );
        let post = Request::post("/status").body(()).unwrap();
        assert_eq!(
            respond(&post, &state).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
