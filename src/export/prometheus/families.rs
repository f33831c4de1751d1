//! The exposition's values: families, their samples and sample values, and the [`Builder`] that
//! collects them under a bound on the number of series. Every source of families (the OTLP
//! translation and the findings gauge in `exposition`, dcgm-exporter's names in `dcgm`) writes
//! through the builder, and `encode` only reads the result.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::names::PromName;

/// A sample's value: integers stay integers in the text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SampleValue {
    Int(i64),
    Float(f64),
}

impl SampleValue {
    pub fn as_f64(self) -> f64 {
        match self {
            SampleValue::Int(v) => v as f64,
            SampleValue::Float(v) => v,
        }
    }
}

/// One series and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Label names are unique within a sample.
    pub labels: Vec<(String, String)>,
    pub value: SampleValue,
}

/// Prometheus's types, as far as gpulse uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    Gauge,
    /// A counter whose samples end in `_total` (the OTLP translation's).
    Counter,
    /// A counter whose samples carry the family's name as it is: dcgm-exporter's `counter`
    /// rows (`# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter`, no `_total`), which its
    /// dashboards and alerts name.
    NamedCounter,
}

/// One metric family: its name, help, type and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    pub name: PromName,
    pub help: String,
    pub kind: FamilyKind,
    pub samples: Vec<Sample>,
}

/// Everything one scrape shows, as of one window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    /// By full name, so the text comes out in a stable order.
    pub families: BTreeMap<String, MetricFamily>,
    /// Series in `families`.
    pub series: usize,
    /// Series this window had that the bound left out.
    pub dropped: u64,
    /// End of the window shown, for `gpulse_prometheus_window_age_seconds`.
    pub window_end: Option<SystemTime>,
}

/// Collects families under a bound on the number of series.
pub(super) struct Builder {
    exposition: Exposition,
    max_series: usize,
}

impl Builder {
    pub(super) fn new(max_series: usize) -> Self {
        Self {
            exposition: Exposition::default(),
            max_series,
        }
    }

    /// Adds one sample; past the bound it is counted as dropped instead.
    pub(super) fn push(
        &mut self,
        name: &PromName,
        help: &str,
        kind: FamilyKind,
        labels: Vec<(String, String)>,
        value: SampleValue,
    ) {
        if let SampleValue::Float(v) = value {
            // Unknown is never reported: a NaN or infinite value has no sample.
            if !v.is_finite() {
                return;
            }
        }
        if self.exposition.series >= self.max_series {
            self.exposition.dropped += 1;
            return;
        }
        let family = self
            .exposition
            .families
            .entry(name.full())
            .or_insert_with(|| MetricFamily {
                name: name.clone(),
                help: help.to_string(),
                kind,
                samples: Vec::new(),
            });
        if family.kind != kind {
            // Two sources disagree on the type of one name: keep the exposition valid.
            self.exposition.dropped += 1;
            return;
        }
        family.samples.push(Sample { labels, value });
        self.exposition.series += 1;
    }

    pub(super) fn finish(self) -> Exposition {
        self.exposition
    }
}
