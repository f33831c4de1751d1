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
                let mut buf = [0u8; 1024];
                let read =
                    tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await;
                let Ok(Ok(n)) = read else { return };
                let request = String::from_utf8_lossy(&buf[..n]);
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
