//! An [`Exposition`] written in the format the scraper asked for, through `prometheus-client`'s
//! encoders: the Prometheus text format 0.0.4 by default, OpenMetrics 1.0 when the `Accept`
//! header names `application/openmetrics-text` (as Prometheus's own scrapes do). A custom
//! [`Collector`] hands the prepared families to the encoder, so a scrape only formats text: it
//! never calls NVML or reads `/proc`.

use std::sync::Arc;
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::families::{Exposition, FamilyKind, SampleValue};

/// The two exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    PrometheusText,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names it (with a non-zero
    /// quality), the Prometheus text format otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let wants_openmetrics = accept.is_some_and(|accept| {
            accept.split(',').any(|item| {
                let mut parts = item.split(';').map(str::trim);
                let media = parts.next().unwrap_or("");
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if wants_openmetrics {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// What the endpoint says about itself, next to the exposition.
#[derive(Debug, Clone, Copy, Default)]
pub struct SelfMetrics {
    /// Series left out by the bound since start.
    pub dropped_total: u64,
}

#[derive(Debug)]
struct ExpositionCollector {
    exposition: Arc<Exposition>,
    own: SelfMetrics,
    now: SystemTime,
    /// Leave out the [`FamilyKind::NamedCounter`] families ([`encode`] writes them itself in
    /// the Prometheus text format).
    skip_named_counters: bool,
}

impl Collector for ExpositionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.exposition.families.values() {
            if family.samples.is_empty()
                || (self.skip_named_counters && family.kind == FamilyKind::NamedCounter)
            {
                continue;
            }
            let unit = family.name.unit.clone().map(Unit::Other);
            let metric_type = match family.kind {
                FamilyKind::Gauge => MetricType::Gauge,
                FamilyKind::Counter | FamilyKind::NamedCounter => MetricType::Counter,
            };
            let mut metric = encoder.encode_descriptor(
                &family.name.base,
                &family.help,
                unit.as_ref(),
                metric_type,
            )?;
            for sample in &family.samples {
                let labeled = metric.encode_family(&sample.labels)?;
                encode_value(labeled, family.kind, sample.value)?;
            }
        }
        self.encode_own(&mut encoder)
    }
}

fn encode_value(
    mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    kind: FamilyKind,
    value: SampleValue,
) -> Result<(), std::fmt::Error> {
    match (kind, value) {
        (FamilyKind::Gauge, SampleValue::Int(v)) => encoder.encode_gauge(&v),
        (FamilyKind::Gauge, SampleValue::Float(v)) => encoder.encode_gauge(&v),
        // The encoder's gauge sample is the bare name; the family's `# TYPE` says counter.
        (FamilyKind::NamedCounter, SampleValue::Int(v)) => encoder.encode_gauge(&v.max(0)),
        (FamilyKind::NamedCounter, SampleValue::Float(v)) => encoder.encode_gauge(&v.max(0.0)),
        // A counter is never negative; an OTLP int that is would be a bug upstream.
        (FamilyKind::Counter, SampleValue::Int(v)) => encoder
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
            &u64::try_from(v).unwrap_or(0),
            None,
        ),
        (FamilyKind::Counter, SampleValue::Float(v)) => encoder
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(
            &v.max(0.0),
            None,
        ),
    }
}

impl ExpositionCollector {
    fn encode_own(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let none: &[(String, String)] = &[];
        let mut series = encoder.encode_descriptor(
            "gpulse_prometheus_series",
            "Series on this endpoint as of the last window, these three excluded.",
            None,
            MetricType::Gauge,
        )?;
        series
            .encode_family(&none)?
            .encode_gauge(&(self.exposition.series as i64))?;
        let mut dropped = encoder.encode_descriptor(
            "gpulse_prometheus_series_dropped",
            "Series left out of /metrics since start because a window had more than \
             --prometheus-max-series.",
            None,
            MetricType::Counter,
        )?;
        dropped
            .encode_family(&none)?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                &self.own.dropped_total,
                None,
            )?;
        if let Some(end) = self.exposition.window_end {
            let age = self
                .now
                .duration_since(end)
                .map_or(0.0, |d| d.as_secs_f64());
            let seconds = Unit::Seconds;
            let mut age_metric = encoder.encode_descriptor(
                "gpulse_prometheus_window_age",
                "Time since the end of the window shown; it grows when sampling or analysis \
                 stops.",
                Some(&seconds),
                MetricType::Gauge,
            )?;
            age_metric.encode_family(&none)?.encode_gauge(&age)?;
        }
        Ok(())
    }
}

/// The text of one scrape.
///
/// # Errors
/// Only what `std::fmt::Write` on a `String` can return, which is nothing in practice.
pub fn encode(
    exposition: Arc<Exposition>,
    own: SelfMetrics,
    format: Format,
    now: SystemTime,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let text_format = format == Format::PrometheusText;
    registry.register_collector(Box::new(ExpositionCollector {
        exposition: Arc::clone(&exposition),
        own,
        now,
        skip_named_counters: text_format,
    }));
    let mut text = String::new();
    match format {
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
            write_named_counters(&mut text, &exposition)?;
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry)?,
    }
    Ok(text)
}

/// dcgm-exporter's counters in the Prometheus text format, as dcgm-exporter writes them:
/// `# TYPE NAME counter` and samples named `NAME`. `prometheus-client`'s text encoder names
/// every counter's `# TYPE` line and samples `NAME_total` (its OpenMetrics encoder names the
/// family as given, where `encode_gauge` then writes the bare sample name), so these few
/// lines are written here, with the format's escaping.
fn write_named_counters(text: &mut String, exposition: &Exposition) -> std::fmt::Result {
    use std::fmt::Write;
    fn escaped(out: &mut String, value: &str, escape_quote: bool) {
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '"' if escape_quote => out.push_str("\\\""),
                c => out.push(c),
            }
        }
    }
    for family in exposition.families.values() {
        if family.kind != FamilyKind::NamedCounter || family.samples.is_empty() {
            continue;
        }
        let name = family.name.full();
        text.push_str("# HELP ");
        text.push_str(&name);
        text.push(' ');
        escaped(text, &family.help, false);
        writeln!(text, "\n# TYPE {name} counter")?;
        for sample in &family.samples {
            text.push_str(&name);
            if !sample.labels.is_empty() {
                text.push('{');
                for (i, (key, value)) in sample.labels.iter().enumerate() {
                    if i > 0 {
                        text.push(',');
                    }
                    text.push_str(key);
                    text.push_str("=\"");
                    escaped(text, value, true);
                    text.push('"');
                }
                text.push('}');
            }
            match sample.value {
                SampleValue::Int(v) => writeln!(text, " {}", v.max(0))?,
                SampleValue::Float(v) if v == f64::INFINITY => writeln!(text, " +Inf")?,
                SampleValue::Float(v) => writeln!(text, " {}", v.max(0.0))?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::families::{Builder, MetricFamily};
    use super::super::names::PromName;
    use super::*;

    /// A dcgm-exporter counter keeps its name in both formats: `# TYPE NAME counter` and
    /// samples `NAME`, label values escaped.
    #[test]
    fn named_counters_keep_their_name_in_both_formats() {
        let mut b = Builder::new(10);
        let name = PromName {
            base: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER".into(),
            unit: None,
            counter: false,
        };
        for (gpu, v) in [("0", 12), ("1\"x", 3)] {
            b.push(
                &name,
                "PCIe replays.",
                FamilyKind::NamedCounter,
                vec![("gpu".into(), gpu.into())],
                SampleValue::Int(v),
            );
        }
        let e = Arc::new(b.finish());
        let MetricFamily { kind, .. } = &e.families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"];
        assert_eq!(*kind, FamilyKind::NamedCounter);
        let at = SystemTime::UNIX_EPOCH;
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            let text = encode(Arc::clone(&e), SelfMetrics::default(), format, at).unwrap();
            assert!(
                text.contains(
                    "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n\
                     DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=\"0\"} 12\n\
                     DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=\"1\\\"x\"} 3\n"
                ),
                "{format:?}:\n{text}"
            );
            assert!(!text.contains("REPLAY_COUNTER_total"), "{text}");
        }
    }
}
