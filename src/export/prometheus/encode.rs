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
}

impl Collector for ExpositionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.exposition.families.values() {
            if family.samples.is_empty() {
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
    registry.register_collector(Box::new(ExpositionCollector {
        exposition,
        own,
        now,
    }));
    let mut text = String::new();
    match format {
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry)?,
    }
    Ok(text)
}
