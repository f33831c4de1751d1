//! The device families of the node resource: a GPU's scalar fields (as the schema maps them),
//! throttle reasons, XIDs, status, GPM activity, the row remapper, violation times and NVLink
//! links; and a MIG device's memory slice and GPM activity.

use opentelemetry_proto::tonic::common::v1::KeyValue;

use super::{int, push_gauge, with, GaugeWithExtremes, MetricsBuilder, Span, Value};
use crate::diagnosis::xid_catalog;
use crate::export::metrics::encoding::{AttributeSetId, ExtraValue, MetricsBatch, PointAttributes};
use crate::export::resource::{kv_bool, kv_int, kv_str};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{DeviceStatus, DeviceWindow, GpmWindow, MigInstanceWindow};
use crate::schema::{
    throttle_reasons, Instrument, MetricId, WindowKind, DEVICE_FIELDS, GPM_FIELDS,
};

use crate::schema::attributes::AttributeId as A;
use MetricId as M;

/// The attributes every device data point carries.
fn device_attributes(device: &DeviceWindow, driver_version: Option<&str>) -> Vec<KeyValue> {
    let info = &device.info;
    let mut attrs = Vec::with_capacity(10);
    attrs.push(kv_str(A::HwId.key(), info.uuid.as_str()));
    attrs.push(kv_str(A::HwName.key(), format!("gpu{}", info.index)));
    attrs.push(kv_str(A::HwType.key(), "gpu"));
    attrs.push(kv_str(A::HwVendor.key(), "NVIDIA"));
    attrs.push(kv_str(A::HwModel.key(), info.name.as_str()));
    if let Some(version) = driver_version {
        attrs.push(kv_str(A::HwDriverVersion.key(), version));
    }
    if let Some(serial) = &info.serial {
        attrs.push(kv_str(A::HwSerialNumber.key(), serial.as_str()));
    }
    attrs.push(kv_int(A::GpuIndex.key(), i64::from(info.index)));
    attrs.push(kv_str(A::GpuPciAddress.key(), info.pci_bus_id.as_str()));
    attrs
}

/// The attributes of a MIG device's data points: those of a device, naming its parent GPU and
/// its instance ids; `hw.name` is the name NVML gives the MIG device (it carries the profile).
fn mig_attributes(
    parent: &DeviceWindow,
    m: &MigInstanceWindow,
    driver_version: Option<&str>,
) -> Vec<KeyValue> {
    let gpu = &parent.info;
    let mut attrs = Vec::with_capacity(11);
    attrs.push(kv_str(A::HwId.key(), m.info.uuid.as_str()));
    attrs.push(kv_str(A::HwName.key(), m.info.name.as_str()));
    attrs.push(kv_str(A::HwType.key(), "gpu"));
    attrs.push(kv_str(A::HwVendor.key(), "NVIDIA"));
    attrs.push(kv_str(A::HwModel.key(), gpu.name.as_str()));
    attrs.push(kv_str(A::HwParent.key(), gpu.uuid.as_str()));
    if let Some(version) = driver_version {
        attrs.push(kv_str(A::HwDriverVersion.key(), version));
    }
    attrs.push(kv_int(A::GpuIndex.key(), i64::from(gpu.index)));
    attrs.push(kv_str(A::GpuPciAddress.key(), gpu.pci_bus_id.as_str()));
    attrs.extend(mig_instance_ids(m));
    attrs
}

pub(super) fn mig_instance_ids(m: &MigInstanceWindow) -> [KeyValue; 2] {
    [
        kv_int(
            A::NvidiaMigGpuInstanceId.key(),
            i64::from(m.info.gpu_instance_id),
        ),
        kv_int(
            A::NvidiaMigComputeInstanceId.key(),
            i64::from(m.info.compute_instance_id),
        ),
    ]
}

/// The metrics a MIG device has of its own: its memory slice and its GPU instance's GPM
/// activity (NVML gives it no utilisation, power, clocks or temperature: those are the GPU's).
pub(super) fn push_mig_instance(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    parent: &DeviceWindow,
    m: &MigInstanceWindow,
    driver_version: Option<&str>,
    gauge_span: Span,
) {
    let base = batch.add_attribute_set(mig_attributes(parent, m, driver_version));
    let sum_span = Span {
        start: to_nanos(parent.counters_start),
        end: gauge_span.end,
    };
    for (id, bytes) in [
        (M::GpuMemoryUsage, m.memory_used_bytes),
        (M::GpuMemoryLimit, m.memory_total_bytes),
        (M::GpuMemoryFree, m.memory_free_bytes),
    ] {
        if let Some(bytes) = bytes {
            b.push(id, PointAttributes::of(base), sum_span, int(bytes));
        }
    }
    push_gpm(b, base, &m.gpm, gauge_span);
}

/// Pushes a GPU's points; returns its attribute set, for the families other modules add.
pub(super) fn push_device(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    d: &DeviceWindow,
    driver_version: Option<&str>,
    gauge_span: Span,
) -> AttributeSetId {
    let base = batch.add_attribute_set(device_attributes(d, driver_version));
    let sum_span = Span {
        start: to_nanos(d.counters_start),
        end: gauge_span.end,
    };

    push_fields(b, base, d, gauge_span, sum_span);

    if let Some(active) = &d.throttle_active_ratio {
        for &(bit, reason) in throttle_reasons() {
            let ratio = active.get(&bit).copied().unwrap_or(0.0);
            let attrs = with(base, A::NvidiaThrottleReason.key(), reason);
            b.push(M::Throttle, attrs, gauge_span, Value::F64(ratio));
        }
        // A bit newer than this build's table is still worth seeing, under its number.
        for (bit, ratio) in active {
            if !throttle_reasons().iter().any(|(known, _)| known == bit) {
                let attrs = PointAttributes::with(
                    Some(base),
                    A::NvidiaThrottleReason.key(),
                    ExtraValue::Owned(format!("other_{bit:#x}").into()),
                );
                b.push(M::Throttle, attrs, gauge_span, Value::F64(*ratio));
            }
        }
    }
    push_xid(b, batch, d, driver_version, sum_span);

    let failed = d.status == DeviceStatus::Lost;
    for (state, value) in [("ok", !failed), ("failed", failed)] {
        let attrs = with(base, A::HwState.key(), state);
        b.push(M::Status, attrs, sum_span, Value::I64(i64::from(value)));
    }

    push_gpm(b, base, &d.gpm, gauge_span);

    if let Some(r) = &d.remapped_rows {
        for (kind, rows) in [
            ("correctable", r.correctable),
            ("uncorrectable", r.uncorrectable),
        ] {
            let attrs = with(base, A::NvidiaRemapType.key(), kind);
            b.push(M::RemappedRows, attrs, sum_span, int(u64::from(rows)));
        }
        for (id, flag) in [(M::RemapPending, r.pending), (M::RemapFailed, r.failure)] {
            b.push(
                id,
                PointAttributes::of(base),
                gauge_span,
                Value::I64(i64::from(flag)),
            );
        }
    }
    if let Some(v) = &d.violation {
        for ((_, reason), ns) in crate::sampling::health::VIOLATION_POLICIES
            .iter()
            .zip(v.nanoseconds)
        {
            if let Some(ns) = ns {
                let attrs = with(base, A::NvidiaThrottleReason.key(), reason);
                b.push(
                    M::ThrottleTime,
                    attrs,
                    sum_span,
                    Value::F64(ns as f64 / 1e9),
                );
            }
        }
    }
    push_nvlink(b, batch, d, driver_version, gauge_span, sum_span);
    base
}

/// The scalar device fields, as the schema's device field table maps them to metrics: a gauge's
/// window mean (with its `.max`/`.min` companions), a level's last value, a lifetime counter's or
/// an integrated rate's total since `counters_start`. Gauge instruments span the window; sums
/// start at `counters_start`.
fn push_fields(
    b: &mut MetricsBuilder,
    base: AttributeSetId,
    d: &DeviceWindow,
    gauge_span: Span,
    sum_span: Span,
) {
    for spec in &DEVICE_FIELDS {
        let metric = &spec.metric;
        let attrs = match metric.attribute {
            Some((key, value)) => with(base, key, value),
            None => PointAttributes::of(base),
        };
        let span = match metric.id.spec().instrument {
            Instrument::Gauge => gauge_span,
            Instrument::Counter | Instrument::UpDownCounter => sum_span,
        };
        if spec.window == WindowKind::Gauge {
            if let Some(g) = d.gauge(spec.field) {
                push_gauge(b, GaugeWithExtremes::of(metric), attrs, span, &g);
            }
        } else if let Some(v) = d.fields.value(spec) {
            let value = if spec.whole {
                int(v.round().max(0.0) as u64)
            } else {
                Value::F64(v)
            };
            b.push(metric.id, attrs, span, value);
        }
    }
}

/// `hw.errors{error.type=xid}`: one series per XID code seen since `counters_start`, with the
/// code in `nvidia.gpu.xid`; while no XID has been seen, one point of 0 without a code, so the
/// series exists (and an alert on its increase has a baseline) before the first XID.
fn push_xid(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    d: &DeviceWindow,
    driver_version: Option<&str>,
    sum_span: Span,
) {
    if d.xid_by_code.is_empty() {
        let mut attrs = device_attributes(d, driver_version);
        attrs.push(kv_str(A::ErrorType.key(), "xid"));
        let set = batch.add_attribute_set(attrs);
        b.push(
            M::Errors,
            PointAttributes::of(set),
            sum_span,
            int(d.xid_total),
        );
        return;
    }
    for (&code, &count) in &d.xid_by_code {
        let mut attrs = device_attributes(d, driver_version);
        attrs.push(kv_str(A::ErrorType.key(), "xid"));
        attrs.push(kv_int(
            A::NvidiaXid.key(),
            i64::try_from(code).unwrap_or(i64::MAX),
        ));
        // The catalog's reading of the code, so an alert or a dashboard can split
        // application faults from the GPU's without a lookup table of its own.
        if let Some(row) = xid_catalog::lookup(code) {
            attrs.push(kv_str(A::NvidiaXidClass.key(), row.class.as_str()));
            attrs.push(kv_str(A::NvidiaXidAction.key(), row.immediate_action));
            attrs.push(kv_bool(A::NvidiaXidFatal.key(), row.fatal));
        }
        let set = batch.add_attribute_set(attrs);
        b.push(M::Errors, PointAttributes::of(set), sum_span, int(count));
    }
}

/// Per NVLink link (`nvidia.gpu.nvlink.link`): traffic (`nvidia.gpu.nvlink.io`, the driver's
/// totals), state (`nvidia.gpu.nvlink.state`, 1 active / 0 down) and error counters
/// (`hw.errors{error.type=nvlink_crc|nvlink_replay|nvlink_recovery}`; CRC = flit + data CRC).
/// A field the link does not give has no point; a GPU without NVLink has none at all.
fn push_nvlink(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    d: &DeviceWindow,
    driver_version: Option<&str>,
    gauge_span: Span,
    sum_span: Span,
) {
    for l in &d.nvlink {
        let mut attrs = device_attributes(d, driver_version);
        attrs.push(kv_int(A::NvidiaNvLinkLink.key(), i64::from(l.last.link)));
        let set = batch.add_attribute_set(attrs);
        for (direction, bytes) in [
            ("transmit", l.last.tx_bytes_total),
            ("receive", l.last.rx_bytes_total),
        ] {
            if let Some(bytes) = bytes {
                let attrs = with(set, A::NetworkIoDirection.key(), direction);
                b.push(M::NvLinkIo, attrs, sum_span, int(bytes));
            }
        }
        if let Some(active) = l.last.active {
            let attrs = PointAttributes::of(set);
            b.push(
                M::NvLinkState,
                attrs,
                gauge_span,
                Value::I64(i64::from(active)),
            );
        }
        for (error_type, count) in [
            ("nvlink_crc", l.crc_errors_total()),
            ("nvlink_replay", l.last.replay_errors),
            ("nvlink_recovery", l.last.recovery_errors),
        ] {
            if let Some(count) = count {
                let attrs = with(set, A::ErrorType.key(), error_type);
                b.push(M::Errors, attrs, sum_span, int(count));
            }
        }
    }
}

/// The GPM activity gauges of one device or MIG instance (Hopper and newer; nothing
/// elsewhere), as the schema's GPM field table maps them: each a window mean with its extremes.
fn push_gpm(b: &mut MetricsBuilder, base: AttributeSetId, gpm: &GpmWindow, span: Span) {
    for spec in &GPM_FIELDS {
        let Some(g) = gpm.gauge(spec.field) else {
            continue;
        };
        let attrs = match spec.metric.attribute {
            Some((key, value)) => with(base, key, value),
            None => PointAttributes::of(base),
        };
        push_gauge(b, GaugeWithExtremes::of(&spec.metric), attrs, span, &g);
    }
}
