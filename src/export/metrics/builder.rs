//! The request builder: a `Window` and the workloads turned into one [`MetricsBatch`] (what the
//! exporter encodes) or, for tests and OTLP/JSON, one `ExportMetricsServiceRequest`; one
//! function per collector family (device, GPM, process-on-device, process usage), each pushing
//! the data points of its part of the window, as Vector's `host_metrics` source does.
//!
//! ## Contract
//! - One `ResourceMetrics` for the node (first, always present: device metrics), then one per
//!   GPU process in ascending host PID order. A process on two GPUs is one resource whose data
//!   points carry each device's `hw.id` and `gpu.index`.
//! - A MIG device is a device of its own on the node resource (`hw.id` = its `MIG-…` UUID,
//!   `hw.parent` = the GPU's UUID, its GPU/compute instance ids), with its memory slice and GPM
//!   activity; a process running in it has the instance's `hw.id` on its `process.gpu.*` points.
//! - Every metric name, instrument and unit comes from the catalogue ([`super::METRICS`]).
//! - A value that is `None` (or not finite) yields no data point: unknown is never reported as 0.
//!   A metric with no data point is left out of the request.
//! - Gauges: `time_unix_nano` = window end, `start_time_unix_nano` = window start, value = the
//!   window mean (`.max`/`.min` companions carry the extremes). Sums are cumulative: start =
//!   `counters_start` (devices) or `first_seen` (processes).
//!
//! Pure functions, no I/O. gpulse's own health (`gpulse.export.*`, `gpulse.sample.*`...) is not
//! built here: it is the OpenTelemetry SDK's, in `crate::telemetry`.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;

use std::sync::LazyLock;

use super::catalogue::{throttle_reasons, Instrument, MetricId};
use super::encoding::{AttributeSetId, BatchPoint, ExtraValue, MetricsBatch, PointAttributes};
use crate::attribution::{AttributedWindow, ProcessUsage, Workload};
use crate::export::resource::{kv_int, kv_str, node_resource, process_resource, NodeIdentity};
use crate::sampling::fields::{FieldMetric, FIELD_COUNT, GPM_FIELD_COUNT};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{
    DeviceStatus, DeviceWindow, Gauge, GpmWindow, MigInstanceWindow, ProcessWindow, WindowKind,
    DEVICE_FIELDS, GPM_FIELDS,
};

use MetricId as M;

/// Collects the data points of one resource, in any metric order (the batch sorts them); a
/// metric with no point never reaches the request.
struct MetricsBuilder {
    points: Vec<BatchPoint>,
}

impl MetricsBuilder {
    fn new(points_hint: usize) -> Self {
        Self {
            points: Vec::with_capacity(points_hint),
        }
    }

    fn push(&mut self, id: MetricId, attributes: PointAttributes, span: Span, value: Value) {
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
enum Value {
    F64(f64),
    I64(i64),
}

fn int(v: u64) -> Value {
    Value::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

/// Start and end of a data point, Unix nanoseconds.
#[derive(Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
}

/// The shared attributes plus one more, whose value is a constant.
fn with(base: AttributeSetId, key: &'static str, value: &'static str) -> PointAttributes {
    PointAttributes::with(Some(base), key, ExtraValue::Static(value))
}

/// Mean, and the companions asked for, of one gauge.
#[derive(Clone, Copy)]
struct Family {
    mean: MetricId,
    max: Option<MetricId>,
    min: Option<MetricId>,
}

const fn family(mean: MetricId, max: Option<MetricId>, min: Option<MetricId>) -> Family {
    Family { mean, max, min }
}

fn push_gauge(b: &mut MetricsBuilder, fam: Family, attrs: PointAttributes, span: Span, g: &Gauge) {
    if let Some(id) = fam.max {
        b.push(id, attrs.clone(), span, Value::F64(g.max));
    }
    if let Some(id) = fam.min {
        b.push(id, attrs.clone(), span, Value::F64(g.min));
    }
    b.push(fam.mean, attrs, span, Value::F64(g.mean));
}

/// The attributes every device data point carries.
fn device_attributes(device: &DeviceWindow, driver_version: Option<&str>) -> Vec<KeyValue> {
    let info = &device.info;
    let mut attrs = Vec::with_capacity(10);
    attrs.push(kv_str("hw.id", info.uuid.as_str()));
    attrs.push(kv_str("hw.name", format!("gpu{}", info.index)));
    attrs.push(kv_str("hw.type", "gpu"));
    attrs.push(kv_str("hw.vendor", "NVIDIA"));
    attrs.push(kv_str("hw.model", info.name.as_str()));
    if let Some(version) = driver_version {
        attrs.push(kv_str("hw.driver_version", version));
    }
    if let Some(serial) = &info.serial {
        attrs.push(kv_str("hw.serial_number", serial.as_str()));
    }
    attrs.push(kv_int("gpu.index", i64::from(info.index)));
    attrs.push(kv_str("gpu.pci_address", info.pci_bus_id.as_str()));
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
    attrs.push(kv_str("hw.id", m.info.uuid.as_str()));
    attrs.push(kv_str("hw.name", m.info.name.as_str()));
    attrs.push(kv_str("hw.type", "gpu"));
    attrs.push(kv_str("hw.vendor", "NVIDIA"));
    attrs.push(kv_str("hw.model", gpu.name.as_str()));
    attrs.push(kv_str("hw.parent", gpu.uuid.as_str()));
    if let Some(version) = driver_version {
        attrs.push(kv_str("hw.driver_version", version));
    }
    attrs.push(kv_int("gpu.index", i64::from(gpu.index)));
    attrs.push(kv_str("gpu.pci_address", gpu.pci_bus_id.as_str()));
    attrs.extend(mig_instance_ids(m));
    attrs
}

fn mig_instance_ids(m: &MigInstanceWindow) -> [KeyValue; 2] {
    [
        kv_int(
            "nvidia.gpu.mig.gpu_instance_id",
            i64::from(m.info.gpu_instance_id),
        ),
        kv_int(
            "nvidia.gpu.mig.compute_instance_id",
            i64::from(m.info.compute_instance_id),
        ),
    ]
}

/// The metrics a MIG device has of its own: its memory slice and its GPU instance's GPM
/// activity (NVML gives it no utilisation, power, clocks or temperature: those are the GPU's).
fn push_mig_instance(
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

fn push_device(
    b: &mut MetricsBuilder,
    batch: &mut MetricsBatch,
    d: &DeviceWindow,
    driver_version: Option<&str>,
    gauge_span: Span,
) {
    let base = batch.add_attribute_set(device_attributes(d, driver_version));
    let sum_span = Span {
        start: to_nanos(d.counters_start),
        end: gauge_span.end,
    };

    push_fields(b, base, d, gauge_span, sum_span);

    if let Some(active) = &d.throttle_active_ratio {
        for &(bit, reason) in throttle_reasons() {
            let ratio = active.get(&bit).copied().unwrap_or(0.0);
            let attrs = with(base, "nvidia.gpu.throttle.reason", reason);
            b.push(M::Throttle, attrs, gauge_span, Value::F64(ratio));
        }
        // A bit newer than this build's table is still worth seeing, under its number.
        for (bit, ratio) in active {
            if !throttle_reasons().iter().any(|(known, _)| known == bit) {
                let attrs = PointAttributes::with(
                    Some(base),
                    "nvidia.gpu.throttle.reason",
                    ExtraValue::Owned(format!("other_{bit:#x}").into()),
                );
                b.push(M::Throttle, attrs, gauge_span, Value::F64(*ratio));
            }
        }
    }
    push_xid(b, batch, d, driver_version, sum_span);

    let failed = d.status == DeviceStatus::Lost;
    for (state, value) in [("ok", !failed), ("failed", failed)] {
        let attrs = with(base, "hw.state", state);
        b.push(M::Status, attrs, sum_span, Value::I64(i64::from(value)));
    }

    push_gpm(b, base, &d.gpm, gauge_span);

    if let Some(r) = &d.remapped_rows {
        for (kind, rows) in [
            ("correctable", r.correctable),
            ("uncorrectable", r.uncorrectable),
        ] {
            let attrs = with(base, "nvidia.gpu.memory.remap.type", kind);
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
                let attrs = with(base, "nvidia.gpu.throttle.reason", reason);
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
}

/// The scalar device fields, as the device field catalogue maps them to metrics: a gauge's
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
    for (spec, family) in DEVICE_FIELDS.iter().zip(field_families()) {
        let (Some(metric), Some(family)) = (spec.metric, family) else {
            continue;
        };
        let attrs = match metric.attribute {
            Some((key, value)) => with(base, key, value),
            None => PointAttributes::of(base),
        };
        let span = match family.mean.spec().instrument {
            Instrument::Gauge => gauge_span,
            Instrument::Counter | Instrument::UpDownCounter => sum_span,
        };
        if spec.window == WindowKind::Gauge {
            if let Some(g) = d.gauge(spec.field) {
                push_gauge(b, *family, attrs, span, &g);
            }
        } else if let Some(v) = d.fields.value(spec) {
            let value = if spec.whole {
                int(v.round().max(0.0) as u64)
            } else {
                Value::F64(v)
            };
            b.push(family.mean, attrs, span, value);
        }
    }
}

/// A field's metric and the companions it asks for, resolved by name in the catalogue; `None`
/// for a name the catalogue lacks (a test holds the field tables to the catalogue).
fn resolve(m: &FieldMetric) -> Option<Family> {
    let id = |name: &str| MetricId::by_name(name);
    Some(Family {
        mean: id(m.name)?,
        max: m.max.then(|| id(&format!("{}.max", m.name))).flatten(),
        min: m.min.then(|| id(&format!("{}.min", m.name))).flatten(),
    })
}

/// Each device field's metric family, resolved once.
fn field_families() -> &'static [Option<Family>; FIELD_COUNT] {
    static FAMILIES: LazyLock<[Option<Family>; FIELD_COUNT]> = LazyLock::new(|| {
        std::array::from_fn(|i| DEVICE_FIELDS[i].metric.as_ref().and_then(resolve))
    });
    &FAMILIES
}

/// Each GPM field's metric family, resolved once.
fn gpm_families() -> &'static [Family; GPM_FIELD_COUNT] {
    static FAMILIES: LazyLock<[Family; GPM_FIELD_COUNT]> = LazyLock::new(|| {
        std::array::from_fn(|i| {
            resolve(&GPM_FIELDS[i].metric).expect("every GPM metric is in the catalogue")
        })
    });
    &FAMILIES
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
        attrs.push(kv_str("error.type", "xid"));
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
        attrs.push(kv_str("error.type", "xid"));
        attrs.push(kv_int(
            "nvidia.gpu.xid",
            i64::try_from(code).unwrap_or(i64::MAX),
        ));
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
        attrs.push(kv_int("nvidia.gpu.nvlink.link", i64::from(l.last.link)));
        let set = batch.add_attribute_set(attrs);
        for (direction, bytes) in [
            ("transmit", l.last.tx_bytes_total),
            ("receive", l.last.rx_bytes_total),
        ] {
            if let Some(bytes) = bytes {
                let attrs = with(set, "network.io.direction", direction);
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
                let attrs = with(set, "error.type", error_type);
                b.push(M::Errors, attrs, sum_span, int(count));
            }
        }
    }
}

/// The GPM activity gauges of one device or MIG instance (Hopper and newer; nothing
/// elsewhere), as the GPM field catalogue maps them: each a window mean with its extremes.
fn push_gpm(b: &mut MetricsBuilder, base: AttributeSetId, gpm: &GpmWindow, span: Span) {
    for (spec, family) in GPM_FIELDS.iter().zip(gpm_families()) {
        let Some(g) = gpm.gauge(spec.field) else {
            continue;
        };
        let attrs = match spec.metric.attribute {
            Some((key, value)) => with(base, key, value),
            None => PointAttributes::of(base),
        };
        push_gauge(b, *family, attrs, span, &g);
    }
}

/// The points of one process on one device; `mig` is the MIG device it ran in, whose `hw.id`
/// the points then carry (with the GPU as `hw.parent`).
fn push_process_device(
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
    let util = family(
        M::ProcessGpuUtilization,
        Some(M::ProcessGpuUtilizationMax),
        Some(M::ProcessGpuUtilizationMin),
    );
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
        let fam = family(
            M::ProcessGpuMemoryUtilization,
            Some(M::ProcessGpuMemoryUtilizationMax),
            Some(M::ProcessGpuMemoryUtilizationMin),
        );
        push_gauge(b, fam, PointAttributes::of(base), gauge_span, g);
    }
}

fn push_process_usage(
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

/// Builds the metrics of one export window from its attributed processes: a process with no
/// usage figures (its `/proc` entry not visible) gets no CPU and RSS points. See the module
/// documentation for the contract.
pub fn metrics_batch(attributed: &AttributedWindow, node: &NodeIdentity) -> MetricsBatch {
    let window = &attributed.window;
    let gauge_span = Span {
        start: to_nanos(window.start),
        end: to_nanos(window.end),
    };
    let driver_version = window.driver_version.as_deref();

    // Group the (pid, device) rows by pid; BTreeMap so resources come out in a stable order.
    let mut by_pid: BTreeMap<u32, Vec<&ProcessWindow>> = BTreeMap::new();
    for p in &window.processes {
        by_pid.entry(p.pid).or_default().push(p);
    }
    let mut batch = MetricsBatch::with_capacity(1 + by_pid.len());

    let mut node_builder = MetricsBuilder::new(window.devices.len() * 48);
    for device in &window.devices {
        push_device(
            &mut node_builder,
            &mut batch,
            device,
            driver_version,
            gauge_span,
        );
        for m in &device.mig_instances {
            push_mig_instance(
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

    for (pid, rows) in by_pid {
        let mut b = MetricsBuilder::new(rows.len() * 8 + 3);
        for p in &rows {
            let mig = window.mig_instance_of(p.pid, &p.device_uuid);
            push_process_device(&mut b, &mut batch, p, mig, gauge_span);
        }
        let process = attributed.process(pid);
        if let Some(u) = process.and_then(|p| p.usage) {
            let first_seen = rows
                .iter()
                .map(|p| to_nanos(p.first_seen))
                .min()
                .unwrap_or(gauge_span.start);
            push_process_usage(&mut b, u, gauge_span, first_seen);
        }
        // Attribution lists every process of its window; one it missed is known by its PID.
        let resource = match process {
            Some(p) => process_resource(p.workload, node),
            None => process_resource(&Workload::unresolved(pid), node),
        };
        batch.push_resource(resource, b.points);
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry_proto::tonic::common::v1::any_value;
    use opentelemetry_proto::tonic::metrics::v1::{
        AggregationTemporality, Metric, NumberDataPoint, ResourceMetrics,
    };

    use std::time::SystemTime;

    use opentelemetry_proto::tonic::metrics::v1::metric::Data;

    use super::*;
    use crate::attribution::AttributionMethod;
    use crate::export::json::to_otlp_json_line;

    use crate::export::metrics::data_point_count;
    use crate::sampling::{DeviceField, DeviceInfo, ProcessKind, Window};

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn g(mean: f64, min: f64, max: f64, last: f64) -> Gauge {
        Gauge {
            mean,
            min,
            max,
            last,
            count: 10,
        }
    }

    fn info(index: u32) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index,
            uuid: format!("GPU-{index:04}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", index + 0x10),
            serial: None,
            minor_number: Some(index),
            memory_total_bytes: Some(80 << 30),
            max_sm_clock_mhz: Some(1980),
            max_memory_clock_mhz: Some(2619),
            compute_capability: Some("9.0".into()),
            fan_count: Some(0),
        })
    }

    fn bare_device(index: u32) -> DeviceWindow {
        DeviceWindow::empty(info(index), t(100))
    }

    fn window(devices: Vec<DeviceWindow>, processes: Vec<ProcessWindow>) -> Window {
        Window {
            start: t(1000),
            end: t(1010),
            sample_count: 10,
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            devices,
            processes,
            xid_events: Vec::new(),
        }
    }

    fn process(pid: u32, device: u32) -> ProcessWindow {
        ProcessWindow {
            pid,
            device_index: device,
            device_uuid: format!("GPU-{device:04}"),
            kind: ProcessKind::Compute,
            first_seen: t(900 + u64::from(device)),
            samples: 1,
            gpu_memory_bytes: Some(g(1e9, 5e8, 2e9, 1.5e9)),
            sm_utilization: Some(g(0.5, 0.1, 0.9, 0.4)),
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
        }
    }

    fn node() -> NodeIdentity {
        NodeIdentity {
            host_name: "node-a".into(),
            service_name: "gpulse".into(),
            service_instance_id: "i-1".into(),
            service_version: "0.1.0".into(),
            extra_attributes: Vec::new(),
        }
    }

    fn build(w: &Window) -> ExportMetricsServiceRequest {
        metrics_request(&AttributedWindow::unattributed(w.clone()), &node())
    }

    fn metric<'a>(rm: &'a ResourceMetrics, name: &str) -> Option<&'a Metric> {
        rm.scope_metrics[0].metrics.iter().find(|m| m.name == name)
    }

    fn points<'a>(rm: &'a ResourceMetrics, name: &str) -> &'a [NumberDataPoint] {
        match metric(rm, name).and_then(|m| m.data.as_ref()) {
            Some(Data::Gauge(g)) => &g.data_points,
            Some(Data::Sum(s)) => &s.data_points,
            _ => &[],
        }
    }

    fn attr<'a>(p: &'a NumberDataPoint, key: &str) -> Option<&'a any_value::Value> {
        p.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    fn s(v: &str) -> any_value::Value {
        any_value::Value::StringValue(v.into())
    }

    fn value(p: &NumberDataPoint) -> f64 {
        match p.value {
            Some(number_data_point::Value::AsDouble(v)) => v,
            Some(number_data_point::Value::AsInt(v)) => v as f64,
            None => f64::NAN,
        }
    }

    /// The point of `name` whose attribute `key` is `val`.
    fn point_with<'a>(
        rm: &'a ResourceMetrics,
        name: &str,
        key: &str,
        val: &str,
    ) -> &'a NumberDataPoint {
        points(rm, name)
            .iter()
            .find(|p| attr(p, key) == Some(&s(val)))
            .unwrap_or_else(|| panic!("no {name} point with {key}={val}"))
    }

    #[test]
    fn device_values_attributes_and_instruments() {
        let mut d = bare_device(0);
        d.fields
            .set_gauge(DeviceField::UtilizationGpu, Some(g(0.6, 0.2, 0.95, 0.5)));
        d.fields
            .set_gauge(DeviceField::UtilizationEncoder, Some(g(0.1, 0.0, 0.3, 0.1)));
        d.fields.set_gauge(
            DeviceField::MemoryUsed,
            Some(Gauge::single((40u64 << 30) as f64)),
        );
        d.fields
            .set_gauge(DeviceField::Temperature, Some(g(61.5, 60.0, 66.0, 62.0)));
        d.fields
            .set_gauge(DeviceField::Power, Some(g(350.0, 100.0, 700.0, 300.0)));
        d.fields
            .set_gauge(DeviceField::PowerLimit, Some(Gauge::single(700.0)));
        d.fields.set_total(DeviceField::Energy, Some(12345.5));
        d.fields.set_gauge(
            DeviceField::SmClock,
            Some(g(1800.0, 1500.0, 1980.0, 1800.0)),
        );
        d.fields.set_total(DeviceField::PcieRx, Some(777.0));
        d.fields.set_total(DeviceField::EccUncorrected, Some(2.0));
        d.xid_total = 3;
        d.fields
            .set_gauge(DeviceField::PerformanceState, Some(Gauge::single(2.0)));
        let req = build(&window(vec![d], Vec::new()));
        let rm = &req.resource_metrics[0];

        // (metric, attribute key, attribute value, expected value)
        let cases: &[(&str, &str, &str, f64)] = &[
            ("hw.gpu.utilization", "hw.gpu.task", "general", 0.6),
            ("hw.gpu.utilization.max", "hw.gpu.task", "general", 0.95),
            ("hw.gpu.utilization.min", "hw.gpu.task", "general", 0.2),
            ("hw.gpu.utilization", "hw.gpu.task", "encoder", 0.1),
            (
                "hw.gpu.memory.usage",
                "hw.type",
                "gpu",
                (40u64 << 30) as f64,
            ),
            (
                "hw.gpu.memory.limit",
                "hw.type",
                "gpu",
                (80u64 << 30) as f64,
            ),
            ("hw.temperature", "hw.type", "gpu", 61.5),
            ("hw.temperature.max", "hw.type", "gpu", 66.0),
            ("hw.power", "hw.type", "gpu", 350.0),
            ("hw.power.max", "hw.type", "gpu", 700.0),
            ("nvidia.gpu.power.limit", "hw.type", "gpu", 700.0),
            ("hw.energy", "hw.type", "gpu", 12345.5),
            ("nvidia.gpu.clock", "nvidia.gpu.clock.type", "sm", 1800.0),
            ("hw.gpu.io", "network.io.direction", "receive", 777.0),
            ("hw.errors", "error.type", "uncorrected", 2.0),
            ("hw.errors", "error.type", "xid", 3.0),
            ("hw.status", "hw.state", "ok", 1.0),
            ("hw.status", "hw.state", "failed", 0.0),
            ("nvidia.gpu.performance_state", "hw.type", "gpu", 2.0),
        ];
        for (name, key, val, want) in cases {
            let p = point_with(rm, name, key, val);
            assert_eq!(value(p), *want, "{name} {key}={val}");
            assert_eq!(attr(p, "hw.id"), Some(&s("GPU-0000")), "{name}");
            assert_eq!(attr(p, "hw.vendor"), Some(&s("NVIDIA")), "{name}");
            assert_eq!(
                attr(p, "hw.model"),
                Some(&s("NVIDIA H100 80GB HBM3")),
                "{name}"
            );
            assert_eq!(
                attr(p, "hw.driver_version"),
                Some(&s("550.54.15")),
                "{name}"
            );
            assert_eq!(
                attr(p, "gpu.pci_address"),
                Some(&s("00000000:10:00.0")),
                "{name}"
            );
            assert_eq!(
                attr(p, "gpu.index"),
                Some(&any_value::Value::IntValue(0)),
                "{name}"
            );
        }
        // Unknown fields: no point, and no metric at all when no device has them.
        for name in [
            "hw.gpu.memory.free",
            "nvidia.gpu.fan.speed",
            "hw.gpu.memory.utilization",
        ] {
            assert!(metric(rm, name).is_none(), "{name} must be omitted");
        }
        assert_eq!(
            points(rm, "hw.gpu.io").len(),
            1,
            "transmit unknown: omitted"
        );
        assert_eq!(
            points(rm, "hw.errors").len(),
            2,
            "corrected unknown: omitted {:?}",
            points(rm, "hw.errors")
        );
        assert!(
            metric(rm, "nvidia.gpu.throttle").is_none(),
            "unknown throttle state: nothing"
        );

        for (name, instrument) in [
            ("hw.gpu.utilization", Instrument::Gauge),
            ("hw.energy", Instrument::Counter),
            ("hw.gpu.memory.usage", Instrument::UpDownCounter),
            ("hw.status", Instrument::UpDownCounter),
        ] {
            let m = metric(rm, name).expect(name);
            match (&m.data, instrument) {
                (Some(Data::Gauge(_)), Instrument::Gauge) => {}
                (Some(Data::Sum(s)), Instrument::Counter) => {
                    assert!(s.is_monotonic);
                    assert_eq!(
                        s.aggregation_temporality,
                        AggregationTemporality::Cumulative as i32
                    );
                }
                (Some(Data::Sum(s)), Instrument::UpDownCounter) => assert!(!s.is_monotonic),
                (data, _) => panic!("{name}: unexpected {data:?}"),
            }
        }
    }

    #[test]
    fn throttle_reasons_known_inactive_are_zero() {
        let mut d = bare_device(0);
        d.throttle_active_ratio = Some(BTreeMap::from([(0x4, 0.25), (0x40, 1.0), (0x1000, 0.5)]));
        let req = build(&window(vec![d], Vec::new()));
        let rm = &req.resource_metrics[0];
        let cases = [
            ("sw_power_cap", 0.25),
            ("hw_thermal_slowdown", 1.0),
            ("gpu_idle", 0.0),
            ("display_clock_setting", 0.0),
            ("other_0x1000", 0.5),
        ];
        for (reason, want) in cases {
            let p = point_with(
                rm,
                "nvidia.gpu.throttle",
                "nvidia.gpu.throttle.reason",
                reason,
            );
            assert_eq!(value(p), want, "{reason}");
        }
        assert_eq!(
            points(rm, "nvidia.gpu.throttle").len(),
            throttle_reasons().len() + 1
        );

        let mut none_active = bare_device(0);
        none_active.throttle_active_ratio = Some(BTreeMap::new());
        let req = build(&window(vec![none_active], Vec::new()));
        let pts = points(&req.resource_metrics[0], "nvidia.gpu.throttle");
        assert_eq!(pts.len(), throttle_reasons().len());
        assert!(pts.iter().all(|p| value(p) == 0.0));
    }

    #[test]
    fn lost_device_reports_failed_status() {
        let mut d = bare_device(3);
        d.status = DeviceStatus::Lost;
        let req = build(&window(vec![d], Vec::new()));
        let rm = &req.resource_metrics[0];
        assert_eq!(
            value(point_with(rm, "hw.status", "hw.state", "failed")),
            1.0
        );
        assert_eq!(value(point_with(rm, "hw.status", "hw.state", "ok")), 0.0);
    }

    #[test]
    fn xid_errors_are_one_series_per_code_and_a_zero_before_the_first() {
        let int = |p: &NumberDataPoint, k: &str| match attr(p, k) {
            Some(any_value::Value::IntValue(v)) => Some(*v),
            _ => None,
        };
        let xid_points = |d: DeviceWindow| -> Vec<(Option<i64>, f64)> {
            let req = build(&window(vec![d], Vec::new()));
            points(&req.resource_metrics[0], "hw.errors")
                .iter()
                .filter(|p| attr(p, "error.type") == Some(&s("xid")))
                .map(|p| (int(p, "nvidia.gpu.xid"), value(p)))
                .collect()
        };
        assert_eq!(xid_points(bare_device(0)), [(None, 0.0)]);
        let mut d = bare_device(0);
        d.xid_total = 4;
        d.xid_by_code = [(13, 1), (79, 3)].into_iter().collect();
        assert_eq!(xid_points(d), [(Some(13), 1.0), (Some(79), 3.0)]);
    }

    #[test]
    fn nvlink_points_per_link_with_state_traffic_and_errors() {
        use crate::sampling::{NvLinkSample, NvLinkWindow};
        let mut d = bare_device(0);
        d.nvlink = vec![
            NvLinkWindow {
                last: NvLinkSample {
                    link: 0,
                    active: Some(true),
                    tx_bytes_total: Some(2048),
                    rx_bytes_total: Some(1024),
                    crc_flit_errors: Some(2),
                    crc_data_errors: Some(1),
                    replay_errors: Some(5),
                    recovery_errors: None,
                },
                tx_bytes_per_second: None,
                rx_bytes_per_second: None,
            },
            NvLinkWindow {
                last: NvLinkSample {
                    link: 1,
                    active: Some(false),
                    ..Default::default()
                },
                tx_bytes_per_second: None,
                rx_bytes_per_second: None,
            },
        ];
        let req = build(&window(vec![d], Vec::new()));
        let rm = &req.resource_metrics[0];
        let link = |p: &NumberDataPoint| match attr(p, "nvidia.gpu.nvlink.link") {
            Some(any_value::Value::IntValue(v)) => *v,
            other => panic!("no link attribute: {other:?}"),
        };
        let io: Vec<(i64, f64)> = points(rm, "nvidia.gpu.nvlink.io")
            .iter()
            .map(|p| (link(p), value(p)))
            .collect();
        assert_eq!(io, [(0, 2048.0), (0, 1024.0)], "link 1 gives no traffic");
        assert_eq!(
            value(point_with(
                rm,
                "nvidia.gpu.nvlink.io",
                "network.io.direction",
                "receive"
            )),
            1024.0
        );
        let state: Vec<(i64, f64)> = points(rm, "nvidia.gpu.nvlink.state")
            .iter()
            .map(|p| (link(p), value(p)))
            .collect();
        assert_eq!(state, [(0, 1.0), (1, 0.0)]);
        assert_eq!(
            value(point_with(rm, "hw.errors", "error.type", "nvlink_crc")),
            3.0,
            "flit + data CRC"
        );
        assert_eq!(
            value(point_with(rm, "hw.errors", "error.type", "nvlink_replay")),
            5.0
        );
        assert!(
            !points(rm, "hw.errors")
                .iter()
                .any(|p| attr(p, "error.type") == Some(&s("nvlink_recovery"))),
            "a counter the link does not give has no point"
        );
        assert_eq!(
            metric(rm, "nvidia.gpu.nvlink.io").map(|m| m.unit.as_str()),
            Some("By")
        );
    }

    #[test]
    fn timestamps_gauges_window_sums_counters_start() {
        let mut d = bare_device(0);
        d.fields
            .set_gauge(DeviceField::UtilizationGpu, Some(g(0.5, 0.5, 0.5, 0.5)));
        d.fields.set_total(DeviceField::Energy, Some(1.0));
        let req = build(&window(vec![d], vec![process(42, 0)]));
        let node_rm = &req.resource_metrics[0];
        let gauge = &points(node_rm, "hw.gpu.utilization")[0];
        assert_eq!(gauge.start_time_unix_nano, 1000 * 1_000_000_000);
        assert_eq!(gauge.time_unix_nano, 1010 * 1_000_000_000);
        let sum = &points(node_rm, "hw.energy")[0];
        assert_eq!(sum.start_time_unix_nano, 100 * 1_000_000_000);
        assert_eq!(sum.time_unix_nano, 1010 * 1_000_000_000);
        let proc_rm = &req.resource_metrics[1];
        let mem = &points(proc_rm, "process.gpu.memory.usage")[0];
        assert_eq!(mem.start_time_unix_nano, 900 * 1_000_000_000, "first_seen");
        assert_eq!(mem.time_unix_nano, 1010 * 1_000_000_000);
        assert_eq!(value(mem), 1.5e9, "last value");
    }

    #[test]
    fn mig_instances_are_devices_under_their_gpu_and_carry_their_processes() {
        use crate::sampling::{GpmField, GpmWindow, MigInstanceInfo, MigInstanceWindow};
        let mut gpu = bare_device(0);
        let instance = |gi: u32, uuid: &str, pids: Vec<u32>, sm: f64| MigInstanceWindow {
            info: Arc::new(MigInstanceInfo {
                uuid: uuid.into(),
                name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
                parent_uuid: "GPU-0000".into(),
                parent_index: 0,
                mig_index: gi - 1,
                gpu_instance_id: gi,
                compute_instance_id: 0,
            }),
            memory_used_bytes: Some(u64::from(gi) << 30),
            memory_free_bytes: Some(40 << 30),
            memory_total_bytes: Some(42_144_366_592),
            gpm: GpmWindow::of([(GpmField::SmActivity, g(sm, sm, sm, sm))]),
            pids,
        };
        gpu.mig_instances = vec![
            instance(1, "MIG-a", vec![42], 0.85),
            instance(2, "MIG-b", vec![], 0.05),
        ];
        let w = window(
            vec![gpu, bare_device(1)],
            vec![process(42, 0), process(7, 1)],
        );
        let req = build(&w);
        let node = &req.resource_metrics[0];
        let usage = points(node, "hw.gpu.memory.usage");
        let of = |id: &str| {
            usage
                .iter()
                .find(|p| attr(p, "hw.id") == Some(&s(id)))
                .unwrap_or_else(|| panic!("no memory point of {id}"))
        };
        let a = of("MIG-a");
        assert_eq!(value(a), f64::from(1u32 << 30));
        assert_eq!(attr(a, "hw.parent"), Some(&s("GPU-0000")));
        assert_eq!(
            attr(a, "hw.name"),
            Some(&s("NVIDIA H100 80GB HBM3 MIG 3g.40gb"))
        );
        assert_eq!(
            attr(a, "nvidia.gpu.mig.gpu_instance_id"),
            Some(&any_value::Value::IntValue(1))
        );
        assert_eq!(
            attr(a, "nvidia.gpu.mig.compute_instance_id"),
            Some(&any_value::Value::IntValue(0))
        );
        assert_eq!(value(of("MIG-b")), f64::from(2u32 << 30));
        let limit = points(node, "hw.gpu.memory.limit");
        let gpu_limit = limit
            .iter()
            .find(|p| attr(p, "hw.id") == Some(&s("GPU-0000")))
            .expect("the GPU's own limit point");
        assert_eq!(attr(gpu_limit, "hw.parent"), None, "a GPU has no parent");
        assert!(limit
            .iter()
            .any(|p| attr(p, "hw.id") == Some(&s("MIG-b")) && value(p) == 42_144_366_592.0));
        let sm = points(node, "nvidia.gpu.sm.activity");
        let sm_of = |id: &str| {
            sm.iter()
                .find(|p| attr(p, "hw.id") == Some(&s(id)))
                .map(value)
        };
        assert_eq!(sm_of("MIG-a"), Some(0.85));
        assert_eq!(sm_of("MIG-b"), Some(0.05));
        // Only memory and GPM: no utilisation or status point is invented for an instance.
        for name in ["hw.gpu.utilization", "hw.status", "hw.power"] {
            assert!(
                points(node, name)
                    .iter()
                    .all(|p| attr(p, "hw.parent").is_none()),
                "{name} has a MIG point"
            );
        }

        // PID 42 ran in MIG-a: its points carry the instance; PID 7 (GPU 1, no MIG) the GPU.
        let pid_points = |pid: i64| {
            req.resource_metrics
                .iter()
                .find(|rm| {
                    rm.resource.as_ref().is_some_and(|r| {
                        r.attributes.iter().any(|kv| {
                            kv.key == "process.pid"
                                && kv.value.as_ref().and_then(|v| v.value.clone())
                                    == Some(any_value::Value::IntValue(pid))
                        })
                    })
                })
                .map(|rm| points(rm, "process.gpu.memory.usage").to_vec())
                .expect("process resource")
        };
        let p42 = pid_points(42);
        assert_eq!(attr(&p42[0], "hw.id"), Some(&s("MIG-a")));
        assert_eq!(attr(&p42[0], "hw.parent"), Some(&s("GPU-0000")));
        assert_eq!(
            attr(&p42[0], "nvidia.gpu.mig.gpu_instance_id"),
            Some(&any_value::Value::IntValue(1))
        );
        let p7 = pid_points(7);
        assert_eq!(attr(&p7[0], "hw.id"), Some(&s("GPU-0001")));
        assert_eq!(attr(&p7[0], "hw.parent"), None);
    }

    #[test]
    fn process_on_two_gpus_is_one_resource_with_a_point_per_device() {
        let w = window(
            vec![bare_device(0), bare_device(1)],
            vec![process(42, 0), process(7, 1), process(42, 1)],
        );
        let mut workloads = HashMap::new();
        let mut wl = Workload::unresolved(42);
        wl.container_id = Some("abc".into());
        wl.vpid = Some(1);
        wl.attributed_by = AttributionMethod::HostPid;
        workloads.insert(42, wl);
        let usage = HashMap::from([(
            42,
            ProcessUsage {
                cpu_utilization: Some(1.5),
                tree_cpu_utilization: Some(3.0),
                memory_rss_bytes: Some(1 << 30),
            },
        )]);
        let attributed = AttributedWindow {
            window: w,
            workloads,
            usage,
            parent_alive: HashMap::new(),
            accounts: Default::default(),
        };
        let req = metrics_request(&attributed, &node());
        assert_eq!(req.resource_metrics.len(), 3, "node + two processes");
        let pid_of = |rm: &ResourceMetrics| {
            rm.resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "process.pid"))
                .and_then(|kv| kv.value.as_ref()?.value.clone())
        };
        assert_eq!(
            pid_of(&req.resource_metrics[1]),
            Some(any_value::Value::IntValue(7))
        );
        assert_eq!(
            pid_of(&req.resource_metrics[2]),
            Some(any_value::Value::IntValue(42))
        );

        let rm = &req.resource_metrics[2];
        let mem = points(rm, "process.gpu.memory.usage");
        let ids: Vec<_> = mem.iter().map(|p| attr(p, "hw.id").cloned()).collect();
        assert_eq!(ids, vec![Some(s("GPU-0000")), Some(s("GPU-0001"))]);
        assert_eq!(points(rm, "process.gpu.utilization").len(), 2);
        assert_eq!(value(&points(rm, "process.gpu.utilization.max")[0]), 0.9);
        assert_eq!(value(&points(rm, "process.cpu.utilization")[0]), 1.5);
        assert_eq!(
            value(&points(rm, "gpulse.process.tree.cpu.utilization")[0]),
            3.0
        );
        let rss = &points(rm, "process.memory.usage")[0];
        assert_eq!(value(rss), (1u64 << 30) as f64);
        assert_eq!(
            rss.start_time_unix_nano,
            900 * 1_000_000_000,
            "earliest first_seen"
        );
        // pid 7 has no usage: no CPU/RSS points.
        assert!(metric(&req.resource_metrics[1], "process.cpu.utilization").is_none());
    }

    #[test]
    fn non_finite_values_yield_no_point() {
        let mut d = bare_device(0);
        d.fields.set_gauge(
            DeviceField::Power,
            Some(g(f64::NAN, 1.0, f64::INFINITY, 1.0)),
        );
        d.fields
            .set_gauge(DeviceField::PowerLimit, Some(Gauge::single(f64::NAN)));
        let req = build(&window(vec![d], Vec::new()));
        let rm = &req.resource_metrics[0];
        assert!(metric(rm, "hw.power").is_none());
        assert!(metric(rm, "hw.power.max").is_none());
        assert!(metric(rm, "nvidia.gpu.power.limit").is_none());
    }

    #[test]
    fn empty_window_still_has_the_node_resource() {
        let req = build(&window(Vec::new(), Vec::new()));
        assert_eq!(req.resource_metrics.len(), 1);
        assert!(req.resource_metrics[0].scope_metrics[0].metrics.is_empty());
    }

    #[test]
    fn data_point_count_counts_every_point() {
        let mut d = bare_device(0);
        d.fields
            .set_gauge(DeviceField::UtilizationGpu, Some(g(0.5, 0.1, 0.9, 0.5)));
        let req = build(&window(vec![d], vec![process(1, 0)]));
        // Node: 3 utilisation + memory limit (from DeviceInfo) + 2 status + 1 xid;
        // process: 1 memory + 3 utilisation.
        assert_eq!(data_point_count(&req), 11);
    }

    #[test]
    fn json_keeps_oneof_defaults_and_drops_field_defaults() {
        let mut d = bare_device(0);
        d.status = DeviceStatus::Lost;
        let req = build(&window(vec![d], Vec::new()));
        let line = to_otlp_json_line(&req);
        assert!(!line.contains('\n'));
        assert!(
            line.contains(r#""asInt":"0""#),
            "a zero value stays: {line}"
        );
        assert!(!line.contains(r#""description":"""#));
        assert!(!line.contains(r#""flags":0"#));
        assert!(!line.contains(r#""exemplars""#));
        assert!(line.contains(r#""aggregationTemporality":2"#));
        assert!(line.contains(r#""startTimeUnixNano":"100000000000""#));
        let back: ExportMetricsServiceRequest =
            serde_json::from_str(&line).expect("our JSON must parse back");
        assert_eq!(back, req);
    }
}
