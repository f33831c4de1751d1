//! The families of a process resource: its points on each device it holds (memory, per-process
//! utilisation, on the MIG device it ran in where there is one, with that instance's GPM
//! activity when it ran there alone), its host usage (CPU, RSS) and its training figures (step
//! time, collective and data wait) with its rank.

use super::device::mig_instance_ids;
use super::{int, push_gauge, with, GaugeWithExtremes, MetricsBuilder, Span, Value};
use crate::attribution::ProcessUsage;
use crate::diagnosis::training::ProcessTraining;
use crate::export::metrics::encoding::{AttributeSetId, MetricsBatch, PointAttributes};
use crate::export::resource::{kv_int, kv_str};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{GpmWindow, MigInstanceWindow, ProcessWindow};
use crate::schema::{GpmField, MetricId, MIG_PROCESS_GPM};

use crate::schema::attributes::AttributeId as A;
use MetricId as M;

/// The attribute set (`hw.id`, `gpu.index`) of each whole GPU that processes of one batch ran
/// on, registered once per GPU and shared by the points of every process on it (64 processes on
/// a GPU: one set, not 64 equal ones). Lives for one batch: the ids are that batch's.
#[derive(Default)]
pub(super) struct DeviceSets<'w> {
    by_device: Vec<(&'w str, u32, AttributeSetId)>,
}

impl<'w> DeviceSets<'w> {
    fn of(&mut self, batch: &mut MetricsBatch, p: &'w ProcessWindow) -> AttributeSetId {
        let uuid = p.device_uuid.as_str();
        if let Some((_, _, id)) = self
            .by_device
            .iter()
            .find(|(u, index, _)| *u == uuid && *index == p.device_index)
        {
            return *id;
        }
        let id = batch.add_attribute_set(vec![
            kv_str(A::HwId.key(), uuid),
            kv_int(A::GpuIndex.key(), i64::from(p.device_index)),
        ]);
        self.by_device.push((uuid, p.device_index, id));
        id
    }
}

/// The MIG device a process ran in, and whether it was alone in its GPU instance (then the
/// instance's GPM activity is its own).
#[derive(Clone, Copy)]
pub(super) struct ProcessMigDevice<'a> {
    pub(super) instance: &'a MigInstanceWindow,
    pub(super) alone: bool,
}

/// The points of one process on one device; `mig` is the MIG device it ran in, whose `hw.id`
/// the points then carry (with the GPU as `hw.parent`). Returns the attribute set the points
/// share, for the families other modules add.
pub(super) fn push_process_device<'w>(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    device_sets: &mut DeviceSets<'w>,
    p: &'w ProcessWindow,
    mig: Option<ProcessMigDevice<'_>>,
    gauge_span: Span,
) -> AttributeSetId {
    let alone_on = mig.filter(|m| m.alone).map(|m| m.instance);
    let mig = mig.map(|m| m.instance);
    let base = match mig {
        None => device_sets.of(batch, p),
        Some(m) => {
            let mut attrs = vec![
                kv_str(A::HwId.key(), m.info.uuid.as_str()),
                kv_str(A::HwParent.key(), p.device_uuid.as_str()),
                kv_int(A::GpuIndex.key(), i64::from(p.device_index)),
            ];
            attrs.extend(mig_instance_ids(m));
            batch.add_attribute_set(attrs)
        }
    };
    if let Some(g) = &p.gpu_memory_bytes {
        let span = Span {
            start: to_nanos(p.first_seen),
            end: gauge_span.end,
        };
        // The last value: a level, like the device's memory usage, not an average.
        let bytes = if g.last.is_finite() && g.last >= 0.0 {
            Value::I64(g.last.round() as i64)
        } else {
            Value::F64(f64::NAN)
        };
        b.push(
            M::ProcessGpuMemoryUsage,
            PointAttributes::of(base),
            span,
            bytes,
        );
    }
    let util = GaugeWithExtremes {
        mean: M::ProcessGpuUtilization,
        max: Some(M::ProcessGpuUtilizationMax),
        min: Some(M::ProcessGpuUtilizationMin),
    };
    for (task, gauge) in [
        ("general", &p.sm_utilization),
        ("encoder", &p.encoder_utilization),
        ("decoder", &p.decoder_utilization),
    ] {
        if let Some(g) = gauge {
            let attrs = with(base, A::HwGpuTask.key(), task);
            push_gauge(b, util, attrs, gauge_span, g);
        }
    }
    if let Some(instance) = alone_on {
        // NVML gives MIG no per-process utilisation; should a driver ever give it, its own
        // figure wins over the instance's.
        let own_general = p.sm_utilization.is_some();
        push_instance_activity(b, base, &instance.gpm, own_general, gauge_span);
    }
    if let Some(g) = &p.memory_utilization {
        let fam = GaugeWithExtremes {
            mean: M::ProcessGpuMemoryUtilization,
            max: Some(M::ProcessGpuMemoryUtilizationMax),
            min: Some(M::ProcessGpuMemoryUtilizationMin),
        };
        push_gauge(b, fam, PointAttributes::of(base), gauge_span, g);
    }
    base
}

/// A process alone on its MIG GPU instance: the instance's GPM activity as its own, as the
/// schema's [`MIG_PROCESS_GPM`] maps it (the `general` task from the graphics engine's activity,
/// unless the process has its own `general` utilisation).
fn push_instance_activity(
    b: &mut MetricsBuilder,
    base: AttributeSetId,
    gpm: &GpmWindow,
    own_general: bool,
    gauge_span: Span,
) {
    for (field, metric) in &MIG_PROCESS_GPM {
        if own_general && *field == GpmField::GraphicsActivity {
            continue;
        }
        let Some(g) = gpm.gauge(*field) else { continue };
        let attrs = match metric.attribute {
            Some((key, value)) => with(base, key, value),
            None => PointAttributes::of(base),
        };
        push_gauge(b, GaugeWithExtremes::of(metric), attrs, gauge_span, &g);
    }
}

pub(super) fn push_process_usage(
    b: &mut MetricsBuilder,
    usage: &ProcessUsage,
    gauge_span: Span,
    first_seen: u64,
) {
    if let Some(ratio) = usage.cpu_utilization {
        b.push(
            M::ProcessCpuUtilization,
            PointAttributes::NONE,
            gauge_span,
            Value::F64(ratio),
        );
    }
    if let Some(ratio) = usage.tree_cpu_utilization {
        b.push(
            M::ProcessTreeCpuUtilization,
            PointAttributes::NONE,
            gauge_span,
            Value::F64(ratio),
        );
    }
    if let Some(bytes) = usage.memory_rss_bytes {
        let span = Span {
            start: first_seen,
            end: gauge_span.end,
        };
        b.push(
            M::ProcessMemoryUsage,
            PointAttributes::NONE,
            span,
            int(bytes),
        );
    }
}

/// The per-step means the process's step spans gave, with its job id and rank as point
/// attributes (so the series of one job's ranks line up across nodes without relying on which
/// resource attributes a backend promotes to labels).
pub(super) fn push_training(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    training: &ProcessTraining,
    gauge_span: Span,
) {
    let mut attributes = Vec::new();
    if let Some(d) = &training.distributed {
        if let Some(job) = &d.job_id {
            attributes.push(kv_str(A::PytorchJobId.key(), job.as_str()));
        }
        attributes.push(kv_int(A::PytorchRank.key(), i64::from(d.rank)));
    }
    let attrs = if attributes.is_empty() {
        PointAttributes::NONE
    } else {
        PointAttributes::of(batch.add_attribute_set(attributes))
    };
    b.push(
        M::TrainingStepDuration,
        attrs.clone(),
        gauge_span,
        Value::F64(training.step_seconds),
    );
    if let Some(wait) = training.collective_wait_seconds {
        b.push(
            M::TrainingStepCollectiveWait,
            attrs.clone(),
            gauge_span,
            Value::F64(wait),
        );
    }
    b.push(
        M::TrainingStepDataWait,
        attrs,
        gauge_span,
        Value::F64(training.data_wait_seconds),
    );
}
