//! The optional health endpoint (`--health-addr`): `/healthz` answers while the process runs,
//! `/readyz` only while NVML answers and the sampler ticks. Plain HTTP/1.1, one short response
//! per connection; no listening port unless asked for.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::sampler_thread::SamplerHealth;

/// Binds `addr` and answers health probes in the background.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    sampler: Arc<SamplerHealth>,
    sample_interval: Duration,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(
        "health endpoint on http://{}/healthz and /readyz",
        listener.local_addr()?
    );
    let stale_after = (sample_interval * 5).max(Duration::from_secs(5));
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let sampler = Arc::clone(&sampler);
            tokio::spawn(async move {
                let Some(request) = read_request_head(&mut stream).await else {
                    return;
                };
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, body) = respond(path, &sampler, stale_after);
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    }))
}

/// Reads until the end of the request head (a probe's request can arrive in several packets),
/// at most 4 KiB and 2 s.
async fn read_request_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 4096 {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn respond(path: &str, sampler: &SamplerHealth, stale_after: Duration) -> (&'static str, String) {
    match path {
        "/healthz" | "/livez" => ("200 OK", "ok\n".into()),
        "/readyz" => {
            if !sampler.session_up.load(Ordering::Relaxed) {
                return ("503 Service Unavailable", "NVML is not answering\n".into());
            }
            match sampler.since_last_tick() {
                Some(since) if since <= stale_after => ("200 OK", "ready\n".into()),
                Some(since) => (
                    "503 Service Unavailable",
                    format!("the last sample finished {since:.0?} ago\n"),
                ),
                None => ("503 Service Unavailable", "no sample yet\n".into()),
            }
        }
        _ => ("404 Not Found", "try /healthz or /readyz\n".into()),
    }
}
