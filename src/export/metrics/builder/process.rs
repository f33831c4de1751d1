//! The families of a process resource: its points on each device it holds (memory, per-process
//! utilisation, on the MIG device it ran in where there is one), its host usage (CPU, RSS) and
//! its training figures (step time, collective and data wait) with its rank.

use super::device::mig_instance_ids;
use super::{int, push_gauge, with, Family, MetricsBuilder, Span, Value};
use crate::attribution::ProcessUsage;
use crate::diagnosis::training::ProcessTraining;
use crate::export::metrics::encoding::{MetricsBatch, PointAttributes};
use crate::export::resource::{kv_int, kv_str};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{MigInstanceWindow, ProcessWindow};
use crate::schema::MetricId;

use MetricId as M;

/// The points of one process on one device; `mig` is the MIG device it ran in, whose `hw.id`
/// the points then carry (with the GPU as `hw.parent`).
pub(super) fn push_process_device(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    p: &ProcessWindow,
    mig: Option<&MigInstanceWindow>,
    gauge_span: Span,
) {
    let attributes = match mig {
        None => vec![
            kv_str("hw.id", p.device_uuid.as_str()),
            kv_int("gpu.index", i64::from(p.device_index)),
        ],
        Some(m) => {
            let mut attrs = vec![
                kv_str("hw.id", m.info.uuid.as_str()),
                kv_str("hw.parent", p.device_uuid.as_str()),
                kv_int("gpu.index", i64::from(p.device_index)),
            ];
            attrs.extend(mig_instance_ids(m));
            attrs
        }
    };
    let base = batch.add_attribute_set(attributes);
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
    let util = Family {
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
            let attrs = with(base, "hw.gpu.task", task);
            push_gauge(b, util, attrs, gauge_span, g);
        }
    }
    if let Some(g) = &p.memory_utilization {
        let fam = Family {
            mean: M::ProcessGpuMemoryUtilization,
            max: Some(M::ProcessGpuMemoryUtilizationMax),
            min: Some(M::ProcessGpuMemoryUtilizationMin),
        };
        push_gauge(b, fam, PointAttributes::of(base), gauge_span, g);
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
            attributes.push(kv_str("pytorch.distributed.job.id", job.as_str()));
        }
        attributes.push(kv_int("pytorch.distributed.rank", i64::from(d.rank)));
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
