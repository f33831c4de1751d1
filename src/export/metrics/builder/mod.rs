//! The request builder: a `Window` and the workloads turned into one [`MetricsBatch`] (what the
//! exporter encodes) or, for tests and OTLP/JSON, one `ExportMetricsServiceRequest`; one
//! function per collector family (device, GPM, process-on-device, process usage, accounting),
//! each pushing the data points of its part of the window, as Vector's `host_metrics` source
//! does. The device families are in [`device`], the process ones in [`process`], the GPU time
//! and energy charged to processes in [`accounting`]; this module holds the point collector they
//! share and assembles the resources.
//!
//! ## Contract
//! - One `ResourceMetrics` for the node (first, always present: device metrics), then one per
//!   GPU process in ascending host PID order. A process on two GPUs is one resource whose data
//!   points carry each device's `hw.id` and `gpu.index`.
//! - A MIG device is a device of its own on the node resource (`hw.id` = its `MIG-…` UUID,
//!   `hw.parent` = the GPU's UUID, its GPU/compute instance ids), with its memory slice and GPM
//!   activity; a process running in it has the instance's `hw.id` on its `process.gpu.*` points,
//!   and a process alone in its GPU instance takes the instance's GPM as its own
//!   (`process.gpu.utilization` general, `.sm.activity`, `.dram.activity`, `.pipe.activity`).
//! - Every metric is named by its typed [`MetricId`]: name, instrument and unit come from the
//!   schema ([`crate::schema::METRICS`]).
//! - A value that is `None` (or not finite) yields no data point: unknown is never reported as 0.
//!   A metric with no data point is left out of the request.
//! - Gauges: `time_unix_nano` = window end, `start_time_unix_nano` = window start, value = the
//!   window mean; `.max`/`.min` companions carry the extremes when the configuration puts more
//!   than one sample in a window ([`Extremes`]). Sums are cumulative: start =
//!   `counters_start` (devices) or `first_seen` (processes).
//!
//! Pure functions, no I/O. gpulse's own health (`gpulse.export.*`, `gpulse.sample.*`...) is not
//! built here: it is the OpenTelemetry SDK's, in `crate::export::telemetry`.

mod accounting;
mod device;
mod process;
mod resources;
#[cfg(test)]
mod tests;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;

pub use resources::ProcessResources;

use super::encoding::{AttributeSetId, BatchPoint, ExtraValue, MetricsBatch, PointAttributes};
use crate::attribution::{AttributedWindow, Workload};
use crate::diagnosis::training::TrainingWindow;
use crate::export::resource::{node_resource, process_resource, NodeIdentity};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{Gauge, ProcessWindow};
use crate::schema::{FieldMetric, MetricId, MetricSet, MetricSwitches};

/// Whether the gauges of a window carry their `.max`/`.min` companions.
///
/// A window of one sample has max = min = mean: its companions would repeat the mean (39 % of a
/// request's points at 1 s sampling with a 1 s export). Whether they are sent is decided from
/// the configuration, never from one window's sample count, so that a backend never sees the
/// companion series come and go with the sampler's jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extremes {
    /// With each gauge, its companions.
    Sent,
    /// The means alone.
    Omitted,
}

impl Extremes {
    /// Sent when every export window is configured to hold at least two samples
    /// (`export_interval` ≥ 2 × `sample_interval`); omitted otherwise, as a window of one
    /// sample (or, between one and two, sometimes one) has nothing to add to its mean.
    pub fn for_intervals(sample_interval: Duration, export_interval: Duration) -> Self {
        if export_interval >= sample_interval.saturating_mul(2) {
            Extremes::Sent
        } else {
            Extremes::Omitted
        }
    }
}

/// Collects the data points of one resource, in any metric order (the batch sorts them); a
/// metric with no point never reaches the request.
pub(super) struct MetricsBuilder {
    pub(super) points: Vec<BatchPoint>,
    extremes: Extremes,
    /// The metrics switched off (`[metrics]`): their points are dropped here, so no family
    /// builder needs to know the switches.
    off: MetricSet,
}

impl MetricsBuilder {
    pub(super) fn new(points_hint: usize, extremes: Extremes, off: MetricSet) -> Self {
        Self {
            points: Vec::with_capacity(points_hint),
            extremes,
            off,
        }
    }

    pub(super) fn push(
        &mut self,
        id: MetricId,
        attributes: PointAttributes,
        span: Span,
        value: Value,
    ) {
        if self.off.contains(id) {
            return;
        }
        let value = match value {
            Value::F64(v) if !v.is_finite() => return,
            Value::F64(v) => number_data_point::Value::AsDouble(v),
            Value::I64(v) => number_data_point::Value::AsInt(v),
        };
        self.points.push(BatchPoint {
            metric: id,
            attributes,
            start: span.start,
            end: span.end,
            value,
        });
    }
}

#[derive(Clone, Copy)]
pub(super) enum Value {
    F64(f64),
    I64(i64),
}

pub(super) fn int(v: u64) -> Value {
    Value::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

/// Start and end of a data point, Unix nanoseconds.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The shared attributes plus one more, whose value is a constant.
pub(super) fn with(
    base: AttributeSetId,
    key: &'static str,
    value: &'static str,
) -> PointAttributes {
    PointAttributes::with(Some(base), key, ExtraValue::Static(value))
}

/// A gauge's metric and the companions that carry its extremes.
#[derive(Clone, Copy)]
pub(super) struct GaugeWithExtremes {
    pub(super) mean: MetricId,
    pub(super) max: Option<MetricId>,
    pub(super) min: Option<MetricId>,
}

impl GaugeWithExtremes {
    /// The gauge and extremes a schema row names.
    pub(super) const fn of(metric: &FieldMetric) -> Self {
        Self {
            mean: metric.id,
            max: metric.max,
            min: metric.min,
        }
    }
}

pub(super) fn push_gauge(
    b: &mut MetricsBuilder,
    fam: GaugeWithExtremes,
    attrs: PointAttributes,
    span: Span,
    g: &Gauge,
) {
    if b.extremes == Extremes::Sent {
        if let Some(id) = fam.max {
            b.push(id, attrs.clone(), span, Value::F64(g.max));
        }
        if let Some(id) = fam.min {
            b.push(id, attrs.clone(), span, Value::F64(g.min));
        }
    }
    b.push(fam.mean, attrs, span, Value::F64(g.mean));
}

/// Builds the metrics of one export window from its attributed processes: a process with no
/// usage figures (its `/proc` entry not visible) gets no CPU and RSS points. See the module
/// documentation for the contract. Without training figures: for a window no receiver fed
/// (`gpulse snapshot`, tests); `gpulse run` uses [`metrics_batch_with_training`].
pub fn metrics_batch(attributed: &AttributedWindow, node: &NodeIdentity) -> MetricsBatch {
    metrics_batch_with_training(attributed, &TrainingWindow::default(), node)
}

/// [`metrics_batch`] plus each process's `gpulse.training.step.*` points, from what its step
/// spans said (`training`, the analyzer's figures for this window).
pub fn metrics_batch_with_training(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
) -> MetricsBatch {
    fresh_build(attributed, training, node, MetricSet::default())
}

/// [`metrics_batch_with_training`] less the metrics `switches` turn off: what `/metrics`
/// exposes, so a metric switched off is gone from both exports.
pub fn metrics_request_switched(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
    switches: &MetricSwitches,
) -> ExportMetricsServiceRequest {
    fresh_build(attributed, training, node, switches.disabled_set()).into_request()
}

/// A window built without kept resources, every gauge with its companions, less `off`.
fn fresh_build(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
    off: MetricSet,
) -> MetricsBatch {
    build(attributed, training, node, None, Extremes::Sent, off)
}

/// [`metrics_batch_with_training`], taking each process's resource from `resources` (kept from
/// the windows before while the process and its workload stay) and keeping this window's there,
/// with the gauges' companions as `extremes` says and without the metrics `switches` turn off:
/// what `gpulse run` exports each window. The request's bytes are the same as a fresh build's.
pub fn metrics_batch_cached(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
    resources: &mut ProcessResources,
    extremes: Extremes,
    switches: &MetricSwitches,
) -> MetricsBatch {
    resources.begin(node);
    let batch = build(
        attributed,
        training,
        node,
        Some(&mut *resources),
        extremes,
        switches.disabled_set(),
    );
    resources.end();
    batch
}

fn build(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
    mut resources: Option<&mut ProcessResources>,
    extremes: Extremes,
    off: MetricSet,
) -> MetricsBatch {
    let window = &attributed.window;
    let gauge_span = Span {
        start: to_nanos(window.start),
        end: to_nanos(window.end),
    };
    let driver_version = window.driver_version.as_deref();

    // The (pid, device) rows grouped by pid, pids ascending so resources come out in a stable
    // order, rows in window order within a pid (a stable sort: one allocation, not one per pid).
    let mut rows_by_pid: Vec<&ProcessWindow> = window.processes.iter().collect();
    rows_by_pid.sort_by_key(|p| p.pid);
    let by_pid = rows_by_pid.chunk_by(|a, b| a.pid == b.pid);
    let mut batch = MetricsBatch::with_capacity(1 + window.processes.len());

    let mut node_builder = MetricsBuilder::new(window.devices.len() * 48, extremes, off);
    for device in &window.devices {
        let base = device::push_device(
            &mut node_builder,
            &mut batch,
            device,
            driver_version,
            gauge_span,
        );
        if let Some(account) = attributed.accounts.device(&device.info.uuid) {
            accounting::push_device_energy(&mut node_builder, base, account, gauge_span.end);
        }
        for m in &device.mig_instances {
            device::push_mig_instance(
                &mut node_builder,
                &mut batch,
                device,
                m,
                driver_version,
                gauge_span,
            );
        }
    }
    batch.push_resource(node_resource(node), node_builder.points);

    let mut device_sets = process::DeviceSets::default();
    let mut cause_sets = accounting::CauseSets::default();
    for rows in by_pid {
        let pid = rows[0].pid;
        let mut b = MetricsBuilder::new(rows.len() * 8 + 3, extremes, off);
        for p in rows {
            let mig = window
                .mig_instance_of(p.pid, &p.device_uuid)
                .map(|instance| process::ProcessMigDevice {
                    instance,
                    alone: window
                        .mig_instance_held_alone(p.pid, &p.device_uuid)
                        .is_some(),
                });
            let base = process::push_process_device(
                &mut b,
                &mut batch,
                &mut device_sets,
                p,
                mig,
                gauge_span,
            );
            if let Some(account) = attributed.accounts.process(p.pid, &p.device_uuid) {
                let ledger = attributed.ledger.process(p.pid, &p.device_uuid);
                accounting::push_process_accounting(
                    &mut b,
                    &mut batch,
                    &mut cause_sets,
                    base,
                    account,
                    ledger,
                    gauge_span.end,
                );
            }
        }
        let process = attributed.process(pid);
        if let Some(u) = process.and_then(|p| p.usage) {
            let first_seen = rows
                .iter()
                .map(|p| to_nanos(p.first_seen))
                .min()
                .unwrap_or(gauge_span.start);
            process::push_process_usage(&mut b, u, gauge_span, first_seen);
        }
        if let Some(t) = training.process(pid) {
            process::push_training(&mut b, &mut batch, t, gauge_span);
        }
        // Attribution lists every process of its window; one it missed is known by its PID.
        let unresolved;
        let workload = match process {
            Some(p) => p.workload,
            None => {
                unresolved = Workload::unresolved(pid);
                &unresolved
            }
        };
        match resources.as_deref_mut() {
            Some(kept) => batch.push_encoded_resource(kept.resource(workload, node), b.points),
            None => batch.push_resource(process_resource(workload, node), b.points),
        }
    }
    batch
}

/// [`metrics_batch`] as a prost request: the reference form tests read.
pub fn metrics_request(
    attributed: &AttributedWindow,
    node: &NodeIdentity,
) -> ExportMetricsServiceRequest {
    metrics_batch(attributed, node).into_request()
}

/// [`metrics_batch_with_training`] as a prost request (what `/metrics` translates).
pub fn metrics_request_with_training(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    node: &NodeIdentity,
) -> ExportMetricsServiceRequest {
    metrics_batch_with_training(attributed, training, node).into_request()
}
