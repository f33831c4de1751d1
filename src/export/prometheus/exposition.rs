//! What one scrape of `/metrics` shows, built once per analysed window: the window's OTLP
//! metrics (the very request the OTLP exporter sends, from the same builder) under the names
//! Prometheus's OTLP translation gives them, resource attributes promoted to labels, then
//! dcgm-exporter's families when asked for, with a bound on the number of series.
//!
//! Built from the latest window only, so the series of a process that exited vanish with the
//! first window that no longer lists it. The bound keeps device series first (the node
//! resource, then dcgm-exporter's device families, then the findings gauge), then processes by
//! ascending PID; what does not fit is counted, never silently lost.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point, Metric};

use super::dcgm;
use super::names::{label_name, metric_name, OtlpKind, PromName};
use crate::attribution::AttributedWindow;
use crate::config::PrometheusNames;
use crate::diagnosis::{Finding, RuleId};
use crate::export::metrics::{metrics_request, RequestOptions, METRICS};
use crate::export::resource::NodeIdentity;

/// Resource attributes that do not become labels: `service.instance.id` is what Prometheus's
/// translation turns into `instance`, which the scrape sets itself (and it changes with every
/// restart); the SDK attributes only say "gpulse" on every series; a command line can carry
/// secrets and would make a label of unbounded size.
const NOT_PROMOTED: [&str; 5] = [
    "service.instance.id",
    "telemetry.sdk.name",
    "telemetry.sdk.language",
    "telemetry.sdk.version",
    "process.command_line",
];

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
    Counter,
}

/// One metric family: its name, help, type and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: PromName,
    pub help: String,
    pub kind: FamilyKind,
    pub samples: Vec<Sample>,
}

/// Everything one scrape shows, as of one window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    /// By full name, so the text comes out in a stable order.
    pub families: BTreeMap<String, Family>,
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
            .or_insert_with(|| Family {
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

/// The label form of an OTLP attribute value.
fn attribute_text(value: Option<&any_value::Value>) -> Option<String> {
    match value? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// `attributes` as labels, on top of `base` (a later key replaces an earlier one).
fn labels_of(base: &[(String, String)], attributes: &[KeyValue]) -> Vec<(String, String)> {
    let mut labels = base.to_vec();
    for kv in attributes {
        let (Some(name), Some(value)) = (
            label_name(&kv.key),
            attribute_text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
        ) else {
            continue;
        };
        match labels.iter_mut().find(|(n, _)| *n == name) {
            Some(existing) => existing.1 = value,
            None => labels.push((name, value)),
        }
    }
    labels
}

fn resource_labels(attributes: &[KeyValue]) -> Vec<(String, String)> {
    let promoted: Vec<KeyValue> = attributes
        .iter()
        .filter(|kv| !NOT_PROMOTED.contains(&kv.key.as_str()))
        .cloned()
        .collect();
    labels_of(&[], &promoted)
}

/// The name, help and type of an OTLP metric as Prometheus sees it.
fn family_of(metric: &Metric) -> Option<(PromName, FamilyKind)> {
    let kind = match metric.data.as_ref()? {
        Data::Gauge(_) => OtlpKind::Gauge,
        Data::Sum(s) if s.is_monotonic => OtlpKind::Counter,
        Data::Sum(_) => OtlpKind::UpDownCounter,
        _ => return None,
    };
    let name = metric_name(&metric.name, &metric.unit, kind)?;
    let family = if kind == OtlpKind::Counter {
        FamilyKind::Counter
    } else {
        FamilyKind::Gauge
    };
    Some((name, family))
}

fn push_otlp_metric(b: &mut Builder, metric: &Metric, resource: &[(String, String)]) {
    let Some((name, kind)) = family_of(metric) else {
        return;
    };
    let points = match metric.data.as_ref() {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => return,
    };
    for point in points {
        let value = match point.value {
            Some(number_data_point::Value::AsInt(v)) => SampleValue::Int(v),
            Some(number_data_point::Value::AsDouble(v)) => SampleValue::Float(v),
            None => continue,
        };
        let labels = labels_of(resource, &point.attributes);
        b.push(&name, &metric.description, kind, labels, value);
    }
}

/// The exposition of one analysed window and the findings active after it.
///
/// `last_xid` is the last XID code seen per device UUID since gpulse started (dcgm-exporter's
/// `DCGM_FI_DEV_XID_ERRORS` keeps it past the window that saw it).
pub fn build(
    attributed: &AttributedWindow,
    findings: &[Finding],
    node: &NodeIdentity,
    names: PrometheusNames,
    max_series: usize,
    last_xid: &HashMap<String, u64>,
) -> Exposition {
    let request = metrics_request(
        &attributed.window,
        &attributed.workloads,
        &attributed.usage,
        node,
        &RequestOptions::default(),
    );
    let mut b = Builder::new(max_series);
    let mut resources = request.resource_metrics.iter().map(|rm| {
        let labels = rm
            .resource
            .as_ref()
            .map(|r| resource_labels(&r.attributes))
            .unwrap_or_default();
        let metrics: Vec<&Metric> = rm
            .scope_metrics
            .iter()
            .flat_map(|s| s.metrics.iter())
            .collect();
        (labels, metrics)
    });
    // The node resource comes first in the request: devices before processes.
    let node_labels = match resources.next() {
        Some((labels, metrics)) => {
            for metric in metrics {
                push_otlp_metric(&mut b, metric, &labels);
            }
            labels
        }
        None => Vec::new(),
    };
    if names == PrometheusNames::Dcgm {
        dcgm::push_devices(&mut b, attributed, node, last_xid);
    }
    push_findings(&mut b, findings, &node_labels);
    for (labels, metrics) in resources {
        for metric in metrics {
            push_otlp_metric(&mut b, metric, &labels);
        }
    }
    let mut exposition = b.finish();
    exposition.window_end = Some(attributed.window.end);
    exposition
}

/// `gpulse.diagnosis.active` by rule, as the OTLP health metrics carry it: every rule, 0 when
/// none of its findings is active (an alert can then tell "fine" from "not scraped").
fn push_findings(b: &mut Builder, findings: &[Finding], node_labels: &[(String, String)]) {
    let Some(spec) = METRICS.iter().find(|m| m.name == "gpulse.diagnosis.active") else {
        return;
    };
    let Some(name) = metric_name(spec.name, spec.unit, OtlpKind::UpDownCounter) else {
        return;
    };
    for rule in RuleId::ALL {
        let count = findings.iter().filter(|f| f.rule == rule).count();
        let mut labels = node_labels.to_vec();
        labels.push(("gpulse_diagnosis_rule".into(), rule.as_str().into()));
        b.push(
            &name,
            spec.description,
            FamilyKind::Gauge,
            labels,
            SampleValue::Int(count as i64),
        );
    }
}
