//! The local OTLP receiver's settings (`--otlp-receiver-grpc`, `--otlp-receiver-http`, the
//! enrichment history): resolved from flags, environment and file like every setting, and
//! refused when the receiver would listen on the very address the exporter sends to.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::defaults::{DEFAULT_ENRICH_HISTORY, MAX_ENRICH_HISTORY};
use super::env;
use super::error::ConfigError;
use super::file::{self, FileConfig};
use super::layers::{first, Layers};
use super::listen::parse_listen_addr;
use super::otlp::ExporterKind;
use crate::cli::{RunArgs, TopArgs};
use crate::values;

/// The local OTLP receiver (`--otlp-receiver-grpc`, `--otlp-receiver-http`): off when both
/// addresses are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverSettings {
    pub grpc: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    /// How far back per-process GPU samples are kept. Greater than zero, at most
    /// [`MAX_ENRICH_HISTORY`].
    pub history: Duration,
}

impl ReceiverSettings {
    /// No receiver.
    pub fn off() -> Self {
        Self {
            grpc: None,
            http: None,
            history: DEFAULT_ENRICH_HISTORY,
        }
    }

    /// Whether any receiver is to be started.
    pub fn enabled(&self) -> bool {
        self.grpc.is_some() || self.http.is_some()
    }
}

/// Whether the local OTLP receiver is turned on by any layer (before its addresses are checked):
/// only then can received telemetry need forwarding.
pub(super) fn receiver_configured(run: &RunArgs, layers: &Layers<'_>) -> bool {
    first([
        Layers::flag("--otlp-receiver-grpc", run.otlp_receiver_grpc.as_deref()),
        layers.env(env::OTLP_RECEIVER_GRPC),
        layers.file("otlp_receiver.grpc", |f| &f.otlp_receiver.grpc),
        Layers::flag("--otlp-receiver-http", run.otlp_receiver_http.as_deref()),
        layers.env(env::OTLP_RECEIVER_HTTP),
        layers.file("otlp_receiver.http", |f| &f.otlp_receiver.http),
    ])
    .is_some()
}

/// The local OTLP receiver's addresses and history. Refuses a receiver on the very port the
/// exporter sends to on this host, which would forward everything to itself forever.
pub(super) fn receiver_settings(
    run: &RunArgs,
    layers: &Layers<'_>,
    exporter: &ExporterKind,
) -> Result<ReceiverSettings, ConfigError> {
    let mut addrs = [None, None];
    for (slot, flag, value, var, key, field) in [
        (
            0,
            "--otlp-receiver-grpc",
            run.otlp_receiver_grpc.as_deref(),
            env::OTLP_RECEIVER_GRPC,
            "otlp_receiver.grpc",
            (|f| &f.otlp_receiver.grpc) as fn(&FileConfig) -> &file::Value,
        ),
        (
            1,
            "--otlp-receiver-http",
            run.otlp_receiver_http.as_deref(),
            env::OTLP_RECEIVER_HTTP,
            "otlp_receiver.http",
            |f| &f.otlp_receiver.http,
        ),
    ] {
        let Some(raw) = first([
            Layers::flag(flag, value),
            layers.env(var),
            layers.file(key, field),
        ]) else {
            continue;
        };
        let addr = raw.parse(parse_listen_addr)?;
        if let ExporterKind::Otlp {
            metrics,
            logs,
            traces,
        } = exporter
        {
            for endpoint in [metrics, logs, traces] {
                if points_at(&endpoint.url, addr) {
                    return Err(raw.invalid(format!(
                        "the exporter sends to {} on this same address, so received data would \
                         be forwarded to gpulse itself; point OTEL_EXPORTER_OTLP_ENDPOINT at \
                         the collector, or listen on another port",
                        endpoint.url
                    )));
                }
            }
        }
        addrs[slot] = Some(addr);
    }
    let history = match first([
        Layers::flag("--enrich-history", run.enrich_history.as_deref()),
        layers.env(env::ENRICH_HISTORY),
        layers.file("otlp_receiver.enrich_history", |f| {
            &f.otlp_receiver.enrich_history
        }),
    ]) {
        Some(raw) => {
            let d = raw.parse(values::parse_duration)?;
            if d.is_zero() || d > MAX_ENRICH_HISTORY {
                return Err(raw.invalid(format!(
                    "expected a duration above 0 and at most {}, e.g. 10m",
                    values::format_duration(MAX_ENRICH_HISTORY)
                )));
            }
            d
        }
        None => DEFAULT_ENRICH_HISTORY,
    };
    if addrs[0].is_some() && addrs[0] == addrs[1] {
        return Err(ConfigError::Invalid {
            setting: "--otlp-receiver-grpc and --otlp-receiver-http".into(),
            reason: "both name the same address; gRPC and HTTP need a port each, e.g. 4317 and \
                     4318"
                .into(),
        });
    }
    Ok(ReceiverSettings {
        grpc: addrs[0],
        http: addrs[1],
        history,
    })
}

/// `gpulse top`'s receiver: `run`'s flags, environment and file keys; top exports nothing, so
/// no exporter address can collide with it.
pub(super) fn top_receiver_settings(
    top: &TopArgs,
    layers: &Layers<'_>,
) -> Result<ReceiverSettings, ConfigError> {
    let flags = RunArgs {
        otlp_receiver_grpc: top.otlp_receiver_grpc.clone(),
        otlp_receiver_http: top.otlp_receiver_http.clone(),
        ..RunArgs::default()
    };
    receiver_settings(&flags, layers, &ExporterKind::Off)
}

/// Whether an exporter URL names `addr` on this host (a loopback or unspecified listener).
fn points_at(url: &str, addr: SocketAddr) -> bool {
    let Ok(uri) = url.trim().parse::<http::Uri>() else {
        return false;
    };
    let default_port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    if uri.port_u16().unwrap_or(default_port) != addr.port() {
        return false;
    }
    let host = uri
        .host()
        .unwrap_or("")
        .trim_start_matches('[')
        .trim_end_matches(']');
    let local_host = host == "localhost"
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip == addr.ip());
    local_host && (addr.ip().is_loopback() || addr.ip().is_unspecified())
}
