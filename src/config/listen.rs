//! The syntax of the addresses gpulse listens on (`--health-addr`, `--prometheus-addr`,
//! `--otlp-receiver-grpc/-http`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// `PORT`, `:PORT` (both 127.0.0.1: what gpulse serves is for the local kubelet, a sidecar or the
/// applications beside it, not the network), `localhost:PORT`, or `IP:PORT`.
pub(crate) fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    const EXPECTED: &str =
        "expected PORT, :PORT, IP:PORT or [IPv6]:PORT, e.g. 9464 or 0.0.0.0:9464";
    let text = text.trim();
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("bad port; {EXPECTED}"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| EXPECTED.to_string())
}
