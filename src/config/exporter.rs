//! Resolving the OTLP exporter settings of each signal (metrics, logs, forwarded traces) as the OpenTelemetry
//! specification's "OTLP Exporter Configuration" says, inside gpulse's one precedence:
//!
//! 1. the `--otlp-*` flag (applies to both signals),
//! 2. `OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>` (signal-specific),
//! 3. `OTEL_EXPORTER_OTLP_<SETTING>`,
//! 4. the file's `[otlp.<signal>]` key, then its `[otlp]` key,
//! 5. the default: `http/protobuf` to `http://localhost:4318` (`http://localhost:4317` for
//!    `grpc`), 10 s timeout, no compression, no TLS files, secure.
//!
//! The endpoint's source decides its form: for HTTP, a generic endpoint (flag, generic variable,
//! `[otlp]`, default) gets `/v1/metrics` or `/v1/logs` appended to its path
//! (`http://x:4318/otlp` → `http://x:4318/otlp/v1/metrics`); a signal-specific one is used as
//! given. Headers are taken whole from the highest layer that sets any (no merging, so a layer can
//! always replace a token). Timeouts in `OTEL_*` variables are milliseconds; elsewhere durations.

use std::path::PathBuf;

use super::defaults::{
    DEFAULT_GRPC_ENDPOINT, DEFAULT_HTTP_ENDPOINT, DEFAULT_PROTOCOL, DEFAULT_TIMEOUT,
};
use super::env::{otlp as var, signal_var};
use super::error::{ConfigError, Origin, Raw};
use super::file::{OtlpSignalFile, Value};
use super::layers::Layers;
use super::otlp::{Compression, ExporterKind, Protocol, SignalEndpoint, TlsFiles};
use crate::cli::RunArgs;
use crate::values::SecretString;
use crate::values::{self, ListEntryError};

/// An OTLP signal gpulse sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    Logs,
    /// Where the spans received by `--otlp-receiver-*` are forwarded.
    Traces,
}

impl Signal {
    fn env_name(self) -> &'static str {
        match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
            Signal::Traces => "TRACES",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
            Signal::Traces => "traces",
        }
    }

    /// The path the specification appends to a generic OTLP/HTTP endpoint.
    pub(crate) fn http_path(self) -> &'static str {
        match self {
            Signal::Metrics => "v1/metrics",
            Signal::Logs => "v1/logs",
            Signal::Traces => "v1/traces",
        }
    }
}

/// Parses an OTLP protocol name.
pub(crate) fn parse_protocol(text: &str) -> Result<Protocol, String> {
    match text.trim() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "http/json" => {
            Err("http/json is not supported by gpulse; expected grpc or http/protobuf".into())
        }
        _ => Err("expected grpc or http/protobuf".into()),
    }
}

/// Parses an OTLP compression name.
pub(crate) fn parse_compression(text: &str) -> Result<Compression, String> {
    match text.trim() {
        "none" => Ok(Compression::None),
        "gzip" => Ok(Compression::Gzip),
        _ => Err("expected none or gzip".into()),
    }
}

/// The OTLP exporter for both signals.
pub(crate) fn resolve_otlp(
    run: &RunArgs,
    layers: &Layers<'_>,
) -> Result<ExporterKind, ConfigError> {
    if let Some(file) = layers.file {
        for (signal, table) in [
            ("metrics", &file.config.otlp.metrics),
            ("logs", &file.config.otlp.logs),
            ("traces", &file.config.otlp.traces),
        ] {
            if let Some(table) = table {
                if table.metrics.is_some() || table.logs.is_some() || table.traces.is_some() {
                    return Err(ConfigError::Invalid {
                        setting: format!("[otlp.{signal}] in {}", file.path.display()),
                        reason: "holds another signal table; [otlp.metrics], [otlp.logs] and \
                                 [otlp.traces] go directly under [otlp]"
                            .into(),
                    });
                }
            }
        }
    }
    Ok(ExporterKind::Otlp {
        metrics: resolve_signal(Signal::Metrics, run, layers)?,
        logs: resolve_signal(Signal::Logs, run, layers)?,
        traces: resolve_signal(Signal::Traces, run, layers)?,
    })
}

/// Whether the traces endpoint was set by a flag, variable or file key rather than defaulted:
/// only then are received spans forwarded when gpulse's own signals use no OTLP.
pub(crate) fn traces_endpoint_explicit(run: &RunArgs, layers: &Layers<'_>) -> bool {
    endpoint_explicit(Signal::Traces, run, layers)
}

/// Whether any signal's endpoint was set by a flag, variable (generic or signal-specific) or file
/// key rather than defaulted: `gpulse record` exports only then, so that recording a job on a
/// laptop never sends anything to a `localhost:4318` nobody asked for.
pub(crate) fn any_endpoint_explicit(run: &RunArgs, layers: &Layers<'_>) -> bool {
    [Signal::Metrics, Signal::Logs, Signal::Traces]
        .into_iter()
        .any(|signal| endpoint_explicit(signal, run, layers))
}

fn endpoint_explicit(signal: Signal, run: &RunArgs, layers: &Layers<'_>) -> bool {
    SignalLayers { signal, layers }
        .pick(
            Layers::flag("--otlp-endpoint", run.otlp_endpoint.as_deref()),
            var::ENDPOINT,
            "endpoint",
            |f| &f.endpoint,
        )
        .is_some()
}

/// Looks one OTLP setting up in the layers, for one signal.
struct SignalLayers<'l, 'a> {
    signal: Signal,
    layers: &'l Layers<'a>,
}

impl SignalLayers<'_, '_> {
    /// The winning value and whether it came from a signal-specific source.
    fn pick(
        &self,
        flag: Option<Raw>,
        generic_var: &str,
        key: &str,
        field: fn(&OtlpSignalFile) -> &Value,
    ) -> Option<(Raw, bool)> {
        let specific_var = signal_var(generic_var, self.signal.env_name());
        let (specific_file, generic_file) = match self.layers.file {
            Some(file) => {
                let otlp = &file.config.otlp;
                let table = match self.signal {
                    Signal::Metrics => otlp.metrics.as_deref(),
                    Signal::Logs => otlp.logs.as_deref(),
                    Signal::Traces => otlp.traces.as_deref(),
                };
                (
                    table.and_then(|t| {
                        file.raw(&format!("otlp.{}.{key}", self.signal.key()), field(t))
                    }),
                    file.raw(&format!("otlp.{key}"), field(otlp)),
                )
            }
            None => (None, None),
        };
        flag.map(|r| (r, false))
            .or_else(|| self.layers.env(&specific_var).map(|r| (r, true)))
            .or_else(|| self.layers.env(generic_var).map(|r| (r, false)))
            .or_else(|| specific_file.map(|r| (r, true)))
            .or_else(|| generic_file.map(|r| (r, false)))
    }

    fn headers(
        &self,
        flag: &[crate::cli::HeaderArg],
    ) -> Result<Vec<(String, SecretString)>, ConfigError> {
        if !flag.is_empty() {
            return Ok(flag
                .iter()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect());
        }
        let specific_var = signal_var(var::HEADERS, self.signal.env_name());
        for name in [specific_var.as_str(), var::HEADERS] {
            if let Some(raw) = self.layers.env(name) {
                let entries =
                    values::parse_key_value_list(&raw.text).map_err(|entry| ConfigError::List {
                        setting: name.to_string(),
                        entry,
                    })?;
                return Ok(entries
                    .into_iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), SecretString::new(v)))
                    .collect());
            }
        }
        let Some(file) = self.layers.file else {
            return Ok(Vec::new());
        };
        let otlp = &file.config.otlp;
        let table = match self.signal {
            Signal::Metrics => otlp.metrics.as_deref(),
            Signal::Logs => otlp.logs.as_deref(),
            Signal::Traces => otlp.traces.as_deref(),
        };
        let specific = table
            .and_then(|t| t.headers.as_ref())
            .map(|h| (format!("otlp.{}.headers", self.signal.key()), h));
        let generic = otlp
            .headers
            .as_ref()
            .map(|h| ("otlp.headers".to_string(), h));
        let Some((key, headers)) = specific.or(generic) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(headers.len());
        for (position, (name, value)) in headers.iter().enumerate() {
            let name = name.trim();
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
            if !valid {
                return Err(ConfigError::List {
                    setting: file.table_origin(&key).name(),
                    entry: ListEntryError {
                        position: position + 1,
                        key: None,
                        reason: "header name must be an HTTP token (letters, digits, - _ .)",
                    },
                });
            }
            out.push((
                name.to_ascii_lowercase(),
                SecretString::new(value.0.clone()),
            ));
        }
        Ok(out)
    }

    /// A TLS file setting, checked to exist. Relative paths from the file are taken relative to
    /// the file's directory, since that is where people keep the certificates next to it.
    fn tls_file(
        &self,
        generic_var: &str,
        key: &str,
        field: fn(&OtlpSignalFile) -> &Value,
    ) -> Result<Option<(PathBuf, Raw)>, ConfigError> {
        let Some((raw, _)) = self.pick(None, generic_var, key, field) else {
            return Ok(None);
        };
        let mut path = PathBuf::from(raw.text.trim());
        if let (Origin::File { .. }, Some(file)) = (&raw.origin, self.layers.file) {
            if path.is_relative() {
                if let Some(dir) = file.path.parent() {
                    path = dir.join(path);
                }
            }
        }
        if !path.is_file() {
            return Err(ConfigError::NotFound {
                setting: raw.origin.with_value(&path.display().to_string()),
                what: "file",
            });
        }
        Ok(Some((path, raw)))
    }
}

fn resolve_signal(
    signal: Signal,
    run: &RunArgs,
    layers: &Layers<'_>,
) -> Result<SignalEndpoint, ConfigError> {
    let s = SignalLayers { signal, layers };

    let protocol = match s.pick(
        Layers::flag("--otlp-protocol", run.otlp_protocol.as_deref()),
        var::PROTOCOL,
        "protocol",
        |f| &f.protocol,
    ) {
        Some((raw, _)) => raw.parse(parse_protocol)?,
        None => DEFAULT_PROTOCOL,
    };

    let insecure = match s.pick(None, var::INSECURE, "insecure", |f| &f.insecure) {
        Some((raw, _)) => raw.parse(values::parse_bool)?,
        None => false,
    };

    let (endpoint, specific) = s
        .pick(
            Layers::flag("--otlp-endpoint", run.otlp_endpoint.as_deref()),
            var::ENDPOINT,
            "endpoint",
            |f| &f.endpoint,
        )
        .unwrap_or_else(|| {
            let default = match protocol {
                Protocol::Grpc => DEFAULT_GRPC_ENDPOINT,
                Protocol::HttpProtobuf => DEFAULT_HTTP_ENDPOINT,
            };
            (Layers::default("OTLP endpoint", default), false)
        });
    let url = endpoint_url(&endpoint, protocol, signal, specific, insecure)?;

    let timeout = match s.pick(
        Layers::flag("--otlp-timeout", run.otlp_timeout.as_deref()),
        var::TIMEOUT,
        "timeout",
        |f| &f.timeout,
    ) {
        Some((raw, _)) => {
            let timeout = if raw.origin.is_env() {
                raw.parse(values::parse_millis)?
            } else {
                raw.parse(values::parse_duration)?
            };
            if timeout.is_zero() {
                return Err(raw.invalid(
                    "a zero timeout fails every request; expected e.g. 10s (10000 in OTEL_* variables)",
                ));
            }
            timeout
        }
        None => DEFAULT_TIMEOUT,
    };

    let compression = match s.pick(
        Layers::flag("--otlp-compression", run.otlp_compression.as_deref()),
        var::COMPRESSION,
        "compression",
        |f| &f.compression,
    ) {
        Some((raw, _)) => raw.parse(parse_compression)?,
        None => Compression::None,
    };

    let headers = s.headers(&run.otlp_headers)?;

    let ca = s.tls_file(var::CERTIFICATE, "certificate", |f| &f.certificate)?;
    let cert = s.tls_file(var::CLIENT_CERTIFICATE, "client_certificate", |f| {
        &f.client_certificate
    })?;
    let key = s.tls_file(var::CLIENT_KEY, "client_key", |f| &f.client_key)?;
    match (&cert, &key) {
        (Some((_, raw)), None) => {
            return Err(raw.invalid(format!(
                "mutual TLS needs the client key too; set {} (or otlp.client_key in the file)",
                var::CLIENT_KEY
            )))
        }
        (None, Some((_, raw))) => {
            return Err(raw.invalid(format!(
                "mutual TLS needs the client certificate too; set {} (or otlp.client_certificate \
                 in the file)",
                var::CLIENT_CERTIFICATE
            )))
        }
        _ => {}
    }

    Ok(SignalEndpoint {
        protocol,
        url,
        headers,
        timeout,
        compression,
        tls: TlsFiles {
            ca_certificate: ca.map(|(p, _)| p),
            client_certificate: cert.map(|(p, _)| p),
            client_key: key.map(|(p, _)| p),
        },
        insecure,
    })
}

/// The URL requests for `signal` go to, from the winning endpoint setting.
fn endpoint_url(
    raw: &Raw,
    protocol: Protocol,
    signal: Signal,
    specific: bool,
    insecure: bool,
) -> Result<String, ConfigError> {
    let text = raw.text.trim();
    // Messages show the URL without any `user:password@`.
    let shown = Raw {
        text: redact_userinfo(text),
        origin: raw.origin.clone(),
    };
    let raw = &shown;
    let example = match protocol {
        Protocol::Grpc => "http://collector:4317",
        Protocol::HttpProtobuf => "http://collector:4318",
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|_| raw.invalid(format!("not a URL; expected e.g. {example}")))?;
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(raw.invalid(format!("no host in the URL; expected e.g. {example}")));
    };
    match protocol {
        Protocol::HttpProtobuf => {
            let scheme = match uri.scheme_str() {
                Some(s @ ("http" | "https")) => s,
                Some(_) => {
                    return Err(raw.invalid(format!(
                        "OTLP/HTTP needs an http:// or https:// URL, e.g. {example}"
                    )))
                }
                None => {
                    return Err(raw.invalid(format!(
                        "no scheme; OTLP/HTTP needs http:// or https://, e.g. {example}"
                    )))
                }
            };
            if specific {
                return Ok(text.to_string());
            }
            let base = uri.path().trim_end_matches('/');
            let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
            Ok(format!(
                "{scheme}://{authority}{base}/{}{query}",
                signal.http_path()
            ))
        }
        Protocol::Grpc => match uri.scheme_str() {
            Some("http" | "https") => Ok(text.to_string()),
            Some(_) => Err(raw.invalid(format!(
                "gRPC endpoints are http:// or https:// URLs, e.g. {example}"
            ))),
            // The specification's OTEL_EXPORTER_OTLP_INSECURE decides for a bare host:port.
            None => {
                let scheme = if insecure { "http" } else { "https" };
                Ok(format!("{scheme}://{text}"))
            }
        },
    }
}

/// `scheme://user:pass@host/...` → `scheme://<redacted>@host/...`; anything else unchanged.
fn redact_userinfo(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return text.to_string();
    };
    let redacted = format!("<redacted>{}", &rest[at..]);
    match scheme {
        Some(scheme) => format!("{scheme}://{redacted}"),
        None => redacted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_redacted() {
        assert_eq!(
            redact_userinfo("http://u:p@h:1/x@y"),
            "http://<redacted>@h:1/x@y"
        );
        assert_eq!(redact_userinfo("u:p@h:1"), "<redacted>@h:1");
        assert_eq!(redact_userinfo("http://h:1/a@b"), "http://h:1/a@b");
        assert_eq!(redact_userinfo("not a url"), "not a url");
    }

    #[test]
    fn endpoint_errors_do_not_show_credentials() {
        let raw = Raw {
            text: "ftp://user:hunter2@h/".into(),
            origin: Origin::Env("OTEL_EXPORTER_OTLP_ENDPOINT".into()),
        };
        let e =
            endpoint_url(&raw, Protocol::HttpProtobuf, Signal::Metrics, false, false).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("http:// or https://") && !msg.contains("hunter2"),
            "{msg}"
        );
    }
}
