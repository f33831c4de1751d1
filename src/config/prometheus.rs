//! The `/metrics` endpoint's settings (`--prometheus-addr`, `--prometheus-names`,
//! `--prometheus-max-series`, their `GPULSE_PROMETHEUS_*` variables and the `[prometheus]` file
//! table), resolved with the one precedence: flags > environment > file > defaults; the SDK's
//! `OTEL_EXPORTER_PROMETHEUS_HOST`/`_PORT` when the metrics exporter list names `prometheus`
//! and no address was given; and the dcgm-exporter counters file (`--dcgm-counters`, or
//! dcgm-exporter's own `DCGM_EXPORTER_COLLECTORS`, read by [`super::dcgm_counters`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use super::dcgm_counters::{self, DcgmCounters, UnknownCounters};
use super::defaults::{DEFAULT_OTEL_PROMETHEUS_PORT, DEFAULT_PROMETHEUS_MAX_SERIES};
use super::error::ConfigError;
use super::layers::{first, Layers};
use super::listen::parse_listen_addr;
use crate::cli::RunArgs;

/// Which names `/metrics` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrometheusNames {
    /// The OTLP metrics under the names Prometheus's own OTLP translation gives them.
    #[default]
    Otel,
    /// The same, plus dcgm-exporter's `DCGM_FI_*` names, labels and units, so its dashboards
    /// and alerts keep working.
    Dcgm,
}

impl PrometheusNames {
    pub fn as_str(self) -> &'static str {
        match self {
            PrometheusNames::Otel => "otel",
            PrometheusNames::Dcgm => "dcgm",
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "otel" => Ok(PrometheusNames::Otel),
            "dcgm" => Ok(PrometheusNames::Dcgm),
            _ => Err(
                "expected otel (OTLP names as Prometheus translates them) or dcgm (those plus \
                 dcgm-exporter's DCGM_FI_* names)"
                    .into(),
            ),
        }
    }
}

/// `/metrics`: off when `addr` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    pub addr: Option<SocketAddr>,
    pub names: PrometheusNames,
    /// Series beyond this are left out of a scrape (device series first, then processes by
    /// ascending PID keep their place) and counted in `gpulse_prometheus_series_dropped_total`.
    pub max_series: usize,
    /// The `DCGM_FI_*` series a dcgm-exporter counters file selects; `None`: every one gpulse
    /// has (with `names` = dcgm).
    pub dcgm_counters: Option<Arc<DcgmCounters>>,
}

impl Default for PrometheusSettings {
    fn default() -> Self {
        Self {
            addr: None,
            names: PrometheusNames::Otel,
            max_series: DEFAULT_PROMETHEUS_MAX_SERIES,
            dcgm_counters: None,
        }
    }
}

/// `wanted`: the metrics exporter list names `prometheus`. The address is then
/// `--prometheus-addr` (or its variable or key) when given, else
/// `OTEL_EXPORTER_PROMETHEUS_HOST`:`OTEL_EXPORTER_PROMETHEUS_PORT` (defaults `localhost`, 9464).
/// Without `prometheus` in the list, `/metrics` is served only at an explicit `--prometheus-addr`
/// and the `OTEL_EXPORTER_PROMETHEUS_*` variables are not read.
///
/// A counters file implies `--prometheus-names dcgm` (its rows are `DCGM_FI_*` series); naming
/// `otel` beside it is an error, as one of the two is a mistake.
pub(crate) fn resolve(
    run: &RunArgs,
    layers: &Layers<'_>,
    wanted: bool,
    warnings: &mut Vec<String>,
) -> Result<PrometheusSettings, ConfigError> {
    let explicit = first([
        Layers::flag("--prometheus-addr", run.prometheus_addr.as_deref()),
        layers.env(super::env::PROMETHEUS_ADDR),
        layers.file("prometheus.addr", |f| &f.prometheus.addr),
    ])
    .map(|raw| raw.parse(parse_listen_addr))
    .transpose()?;
    let addr = match explicit {
        Some(addr) => Some(addr),
        None if wanted => Some(otel_addr(layers)?),
        None => None,
    };
    let names_raw = first([
        Layers::flag("--prometheus-names", run.prometheus_names.as_deref()),
        layers.env(super::env::PROMETHEUS_NAMES),
        layers.file("prometheus.names", |f| &f.prometheus.names),
    ]);
    let names = names_raw
        .as_ref()
        .map(|raw| raw.parse(PrometheusNames::parse))
        .transpose()?;
    let dcgm_counters = dcgm_counters(run, layers, warnings)?;
    let names = match (names, &dcgm_counters, &names_raw) {
        (Some(PrometheusNames::Otel), Some(_), Some(raw)) => {
            return Err(raw.invalid(
                "a dcgm-exporter counters file (--dcgm-counters, DCGM_EXPORTER_COLLECTORS or \
                 prometheus.dcgm_counters) selects DCGM_FI_* series, which only \
                 --prometheus-names dcgm serves; drop one of the two",
            ))
        }
        (_, Some(_), _) => PrometheusNames::Dcgm,
        (names, None, _) => names.unwrap_or_default(),
    };
    let max_series = match first([
        Layers::flag(
            "--prometheus-max-series",
            run.prometheus_max_series.as_deref(),
        ),
        layers.env(super::env::PROMETHEUS_MAX_SERIES),
        layers.file("prometheus.max_series", |f| &f.prometheus.max_series),
    ]) {
        Some(raw) => raw.parse(|text| match text.trim().parse::<usize>() {
            Ok(0) => Err("0 series would leave /metrics empty; expected e.g. 20000".into()),
            Ok(n) => Ok(n),
            Err(_) => Err("expected a whole number of series, e.g. 20000".into()),
        })?,
        None => DEFAULT_PROMETHEUS_MAX_SERIES,
    };
    Ok(PrometheusSettings {
        addr,
        names,
        max_series,
        dcgm_counters,
    })
}

/// The counters file, read and checked, when one is given.
fn dcgm_counters(
    run: &RunArgs,
    layers: &Layers<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<Arc<DcgmCounters>>, ConfigError> {
    let Some(path) = first([
        Layers::flag("--dcgm-counters", run.dcgm_counters.as_deref()),
        layers.env(super::env::DCGM_EXPORTER_COLLECTORS),
        layers.file("prometheus.dcgm_counters", |f| &f.prometheus.dcgm_counters),
    ]) else {
        return Ok(None);
    };
    let unknown = first([
        Layers::flag(
            "--dcgm-counters-unknown",
            run.dcgm_counters_unknown.as_deref(),
        ),
        layers.env(super::env::DCGM_COUNTERS_UNKNOWN),
        layers.file("prometheus.dcgm_counters_unknown", |f| {
            &f.prometheus.dcgm_counters_unknown
        }),
    ])
    .map(|raw| raw.parse(UnknownCounters::parse))
    .transpose()?
    .unwrap_or_default();
    let counters = dcgm_counters::load(
        Path::new(path.text.trim()),
        &path.origin.name(),
        unknown,
        warnings,
    )?;
    Ok(Some(Arc::new(counters)))
}

/// The address from the SDK's `OTEL_EXPORTER_PROMETHEUS_HOST` and `_PORT`.
fn otel_addr(layers: &Layers<'_>) -> Result<SocketAddr, ConfigError> {
    use super::env::{
        OTEL_EXPORTER_PROMETHEUS_HOST as HOST, OTEL_EXPORTER_PROMETHEUS_PORT as PORT,
    };
    let ip = match layers.env(HOST) {
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Some(raw) => raw.parse(parse_host)?,
    };
    let port = match layers.env(PORT) {
        None => DEFAULT_OTEL_PROMETHEUS_PORT,
        Some(raw) => raw.parse(|text| {
            text.trim()
                .parse::<u16>()
                .map_err(|_| "expected a port number from 0 to 65535, e.g. 9464".to_string())
        })?,
    };
    Ok(SocketAddr::new(ip, port))
}

/// `localhost`, an IPv4 address, or an IPv6 one (bracketed or not). Host names other than
/// `localhost` are refused rather than resolved: a listener binds an interface, and a name that
/// resolves differently later would silently move it.
fn parse_host(text: &str) -> Result<IpAddr, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>().map_err(|_| {
        "expected localhost or an IP address to listen on, e.g. 0.0.0.0 to be scraped from \
         other hosts"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_refuse_with_the_choices() {
        assert_eq!(PrometheusNames::parse("dcgm"), Ok(PrometheusNames::Dcgm));
        assert_eq!(PrometheusNames::parse(" otel "), Ok(PrometheusNames::Otel));
        let err = PrometheusNames::parse("DCGM_FI").unwrap_err();
        assert!(err.contains("otel") && err.contains("dcgm"), "{err}");
    }

    #[test]
    fn hosts_parse_as_listen_addresses() {
        assert_eq!(parse_host("localhost"), Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(parse_host("0.0.0.0"), Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        assert_eq!(parse_host("[::1]"), Ok("::1".parse().unwrap()));
        assert!(parse_host("node-1.example")
            .unwrap_err()
            .contains("IP address"));
    }
}
