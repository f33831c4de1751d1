//! Where each signal goes: the per-signal exporter choice of the OpenTelemetry SDK's
//! `OTEL_METRICS_EXPORTER` / `OTEL_LOGS_EXPORTER`, gpulse's `--metrics-exporter`,
//! `--logs-exporter` and the all-signal `--exporter`, resolved once into [`SignalSinks`] that
//! `run` and `record` both consume.
//!
//! Precedence, per signal (metrics shown; logs alike):
//! `--metrics-exporter` > `--exporter` > `OTEL_METRICS_EXPORTER` > `GPULSE_EXPORTER` >
//! file `metrics_exporter` > file `exporter` > `otlp`. The signal-specific setting beats the
//! all-signal one within a layer, as `OTEL_EXPORTER_OTLP_METRICS_*` beats `OTEL_EXPORTER_OTLP_*`.
//!
//! Values: metrics take a comma list of `otlp`, `prometheus` (serve `/metrics`), `console`
//! (alias `stdout`: OTLP JSON lines) or `none` alone; logs (the findings) take one of `otlp`,
//! `console`/`stdout` or `none`. `otlp` and `console` cannot both carry one signal: one delivery
//! lane per signal keeps the retry queue's accounting simple (run two gpulse processes, or a
//! Collector with two exporters, to get both).

use super::env;
use super::error::{ConfigError, Raw};
use super::layers::{first, Layers};

/// Where one signal's requests are delivered through the retry queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sink {
    /// OTLP to the resolved endpoint of that signal.
    #[default]
    Otlp,
    /// OTLP JSON lines on standard output.
    Stdout,
    /// Nowhere: nothing of this signal is built into a request or queued.
    Off,
}

impl Sink {
    pub fn as_str(self) -> &'static str {
        match self {
            Sink::Otlp => "otlp",
            Sink::Stdout => "console",
            Sink::Off => "none",
        }
    }
}

/// Every signal's destination, resolved once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalSinks {
    /// gpulse's own metrics, through the queue.
    pub metrics: Sink,
    /// Whether `OTEL_METRICS_EXPORTER` (or its flag/key) names `prometheus`. `/metrics` is also
    /// served whenever `--prometheus-addr` is set, whatever this says; see
    /// [`super::PrometheusSettings`] for the address.
    pub prometheus: bool,
    /// The diagnosis findings, as OTLP log records.
    pub logs: Sink,
    /// Telemetry received by the local OTLP receiver (`--otlp-receiver-*`) for a signal gpulse
    /// does not send itself (always traces): OTLP when another signal uses OTLP or an upstream
    /// endpoint was set explicitly, stdout when everything goes to stdout, else off (received
    /// data then feeds diagnosis and `/metrics` only and is not forwarded).
    pub forward: Sink,
}

impl Default for SignalSinks {
    fn default() -> Self {
        Self {
            metrics: Sink::Otlp,
            prometheus: false,
            logs: Sink::Otlp,
            forward: Sink::Otlp,
        }
    }
}

impl SignalSinks {
    /// The destination of the queue lane of metrics: gpulse's own, or else forwarded ones.
    pub fn metrics_lane(&self) -> Sink {
        or_forward(self.metrics, self.forward)
    }

    /// The destination of the queue lane of logs.
    pub(crate) fn logs_lane(&self) -> Sink {
        or_forward(self.logs, self.forward)
    }

    /// The destination of the queue lane of traces (only ever forwarded spans).
    pub fn traces_lane(&self) -> Sink {
        self.forward
    }

    /// Whether any lane needs an OTLP endpoint (and so its settings must resolve).
    pub fn uses_otlp(&self) -> bool {
        [self.metrics, self.logs, self.forward].contains(&Sink::Otlp)
    }

    /// Whether any lane writes to standard output.
    pub(crate) fn uses_stdout(&self) -> bool {
        [self.metrics, self.logs, self.forward].contains(&Sink::Stdout)
    }
}

fn or_forward(own: Sink, forward: Sink) -> Sink {
    match own {
        Sink::Off => forward,
        own => own,
    }
}

const METRICS_ACCEPTED: &str =
    "expected a comma list of otlp, prometheus, console (or stdout), or none alone, e.g. \
     prometheus or otlp,prometheus";
const LOGS_ACCEPTED: &str = "expected one of otlp, console (or stdout) or none";

/// Parses a metrics exporter list into the queue sink and whether `/metrics` is wanted.
pub(crate) fn parse_metrics(text: &str) -> Result<(Sink, bool), String> {
    let mut sink = None;
    let mut prometheus = false;
    let mut none = false;
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    for item in &items {
        let this = match item.to_ascii_lowercase().as_str() {
            "otlp" => Sink::Otlp,
            "console" | "stdout" => Sink::Stdout,
            "prometheus" => {
                prometheus = true;
                continue;
            }
            "none" => {
                none = true;
                continue;
            }
            "" => return Err(format!("empty entry; {METRICS_ACCEPTED}")),
            other => return Err(format!("unknown exporter {other:?}; {METRICS_ACCEPTED}")),
        };
        match sink {
            Some(previous) if previous != this => {
                return Err(format!(
                    "{} and {} cannot both carry metrics (one delivery lane per signal); pick one, \
                     optionally with prometheus",
                    Sink::as_str(previous),
                    this.as_str()
                ))
            }
            _ => sink = Some(this),
        }
    }
    if none && items.len() > 1 {
        return Err(format!(
            "none cannot be combined with other exporters; {METRICS_ACCEPTED}"
        ));
    }
    Ok((sink.unwrap_or(Sink::Off), prometheus))
}

/// Parses a logs exporter name.
pub(crate) fn parse_logs(text: &str) -> Result<Sink, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "otlp" => Ok(Sink::Otlp),
        "console" | "stdout" => Ok(Sink::Stdout),
        "none" => Ok(Sink::Off),
        "prometheus" => Err(format!(
            "prometheus serves metrics only, not log records; {LOGS_ACCEPTED}"
        )),
        other if other.contains(',') => Err(format!("one logs exporter only; {LOGS_ACCEPTED}")),
        other => Err(format!("unknown exporter {other:?}; {LOGS_ACCEPTED}")),
    }
}

/// Parses the all-signal `--exporter` / `GPULSE_EXPORTER` / `exporter` value.
fn parse_all(text: &str) -> Result<Sink, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "otlp" => Ok(Sink::Otlp),
        "console" | "stdout" => Ok(Sink::Stdout),
        "none" => Ok(Sink::Off),
        "prometheus" => Err(
            "prometheus is a metrics exporter only; use --metrics-exporter prometheus (or \
             OTEL_METRICS_EXPORTER=prometheus) with --logs-exporter none"
                .into(),
        ),
        other => Err(format!(
            "unknown exporter {other:?}; expected otlp, stdout (or console) or none"
        )),
    }
}

/// The flags that choose sinks (kept apart from `RunArgs` so `record` can pass its own).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SinkFlags<'a> {
    pub exporter: Option<&'a str>,
    pub metrics_exporter: Option<&'a str>,
    pub logs_exporter: Option<&'a str>,
}

/// Resolves the sinks. `upstream_explicit`: the OTLP receiver is on and an OTLP endpoint for
/// traces was set by a flag, variable or file key (not the default), which makes received
/// telemetry forwarded even when gpulse's own signals use no OTLP.
pub(crate) fn resolve(
    flags: SinkFlags<'_>,
    layers: &Layers<'_>,
    upstream_explicit: bool,
) -> Result<SignalSinks, ConfigError> {
    let all_flag = Layers::flag("--exporter", flags.exporter);
    let all_env = layers.env(env::EXPORTER);
    let all_file = layers.file("exporter", |f| &f.exporter);
    let parse_all_raw = |raw: Raw| raw.parse(parse_all);

    let metrics_raw = first([
        Layers::flag("--metrics-exporter", flags.metrics_exporter),
        all_flag.clone(),
        layers.env(env::OTEL_METRICS_EXPORTER),
        all_env.clone(),
        layers.file("metrics_exporter", |f| &f.metrics_exporter),
        all_file.clone(),
    ]);
    let (metrics, prometheus) = match metrics_raw {
        None => (Sink::Otlp, false),
        Some(raw) if is_all(&raw) => (parse_all_raw(raw)?, false),
        Some(raw) => raw.parse(parse_metrics)?,
    };
    let logs_raw = first([
        Layers::flag("--logs-exporter", flags.logs_exporter),
        all_flag,
        layers.env(env::OTEL_LOGS_EXPORTER),
        all_env,
        layers.file("logs_exporter", |f| &f.logs_exporter),
        all_file,
    ]);
    let logs = match logs_raw {
        None => Sink::Otlp,
        Some(raw) if is_all(&raw) => parse_all_raw(raw)?,
        Some(raw) => raw.parse(parse_logs)?,
    };
    let forward = if metrics == Sink::Otlp || logs == Sink::Otlp || upstream_explicit {
        Sink::Otlp
    } else if metrics == Sink::Stdout || logs == Sink::Stdout {
        Sink::Stdout
    } else {
        Sink::Off
    };
    Ok(SignalSinks {
        metrics,
        prometheus,
        logs,
        forward,
    })
}

/// Whether a value came from one of the all-signal settings (their error names them and
/// accepts their own values).
fn is_all(raw: &Raw) -> bool {
    use super::error::Origin;
    match &raw.origin {
        Origin::Flag(flag) => *flag == "--exporter",
        Origin::Env(name) => name == env::EXPORTER,
        Origin::File { key, .. } => key == "exporter",
        Origin::Default(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_lists_parse() {
        assert_eq!(parse_metrics("otlp"), Ok((Sink::Otlp, false)));
        assert_eq!(parse_metrics("prometheus"), Ok((Sink::Off, true)));
        assert_eq!(parse_metrics(" otlp , prometheus"), Ok((Sink::Otlp, true)));
        assert_eq!(parse_metrics("console"), Ok((Sink::Stdout, false)));
        assert_eq!(parse_metrics("none"), Ok((Sink::Off, false)));
    }

    #[test]
    fn metrics_lists_refuse_with_the_choices() {
        for bad in [
            "otlp,console",
            "none,prometheus",
            "zipkin",
            "otlp,,prometheus",
        ] {
            let err = parse_metrics(bad).unwrap_err();
            assert!(err.contains("prometheus"), "{bad}: {err}");
        }
        assert!(parse_metrics("jaeger").unwrap_err().contains("\"jaeger\""));
    }

    #[test]
    fn logs_refuse_prometheus_and_lists() {
        assert_eq!(parse_logs("none"), Ok(Sink::Off));
        assert_eq!(parse_logs("console"), Ok(Sink::Stdout));
        assert!(parse_logs("prometheus")
            .unwrap_err()
            .contains("metrics only"));
        assert!(parse_logs("otlp,console")
            .unwrap_err()
            .contains("one logs exporter"));
    }

    #[test]
    fn lanes_fall_back_to_forwarding() {
        let sinks = SignalSinks {
            metrics: Sink::Off,
            prometheus: true,
            logs: Sink::Off,
            forward: Sink::Off,
        };
        assert!(!sinks.uses_otlp() && !sinks.uses_stdout());
        let forwarding = SignalSinks {
            forward: Sink::Otlp,
            ..sinks
        };
        assert_eq!(forwarding.metrics_lane(), Sink::Otlp);
        assert_eq!(forwarding.traces_lane(), Sink::Otlp);
    }
}
