//! dcgm-exporter's names, labels and units (`--prometheus-names dcgm`), so NVIDIA's Grafana
//! dashboard (id 12239) and alerts on `DCGM_FI_*` keep working when gpulse replaces
//! dcgm-exporter.
//!
//! Values are the window's last sample (dcgm-exporter shows the latest reading, not an
//! average), in dcgm-exporter's units: percent, MiB, °C, W, MHz, mJ. Labels are its labels:
//! `gpu`, `UUID`, `device`, `modelName`, `Hostname`, `pci_bus_id`, `DCGM_FI_DRIVER_VERSION`,
//! and `container`/`namespace`/`pod` of the one Kubernetes pod using the GPU (absent when none
//! or several do, where dcgm-exporter cannot tell either). Per-process series are the OTLP
//! ones (`process_gpu_*`), which dcgm-exporter has no equivalent for. A GPU in MIG mode also
//! gets one set of series per MIG instance, labelled `GPU_I_PROFILE` and `GPU_I_ID` as
//! dcgm-exporter labels them: its memory slice and its GPU instance's `DCGM_FI_PROF_*`.
//!
//! Types are dcgm-exporter's (`counter` for its `counter` rows, the sample named as the family,
//! without `_total`, as dcgm-exporter writes it), or those of the operator's counters file
//! (`--dcgm-counters`), whose rows then select the series and give their help. A field the
//! device does not give has no series, as with dcgm-exporter. One deliberate difference:
//! `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` counts from when gpulse first saw the device (DCGM:
//! since the driver loaded); `rate()`/`increase()` see the same.

use std::collections::HashMap;

use super::families::{Builder, FamilyKind, SampleValue};
use super::names::PromName;
use crate::attribution::AttributedWindow;
use crate::config::dcgm_counters::DcgmCounters;
use crate::diagnosis::xid_catalog;
use crate::export::resource::NodeIdentity;
use crate::sampling::DeviceInfo;
use crate::sampling::{DeviceStatus, DeviceWindow, MigInstanceWindow};
use crate::schema::{DcgmFamily, DcgmReading, DcgmScale, DcgmSeries, DcgmType, DcgmValue};
use crate::schema::{DeviceField, MetricSet, DCGM_FAMILY_SERIES, DEVICE_FIELDS, GPM_FIELDS};
use crate::schema::{MetricId, DRIVER_VERSION_LABEL};

/// dcgm-exporter's labels, in the order it writes them, with what gpulse puts in each: the one
/// place the label sets are declared. Every `DCGM_FI_*` series of a GPU carries
/// [`DEVICE_LABELS`] then [`POD_LABELS`]; a MIG instance's series carry [`DEVICE_LABELS`] of its
/// GPU with [`MIG_LABELS`] after `modelName`, then [`POD_LABELS`] of the pod in that instance.
/// `DCGM_FI_DEV_XID_ERRORS` alone adds [`XID_LABELS`], as dcgm-exporter does. docs/prometheus.md's
/// label table is generated from these.
pub(super) const DEVICE_LABELS: [(&str, &str); 7] = [
    ("gpu", "the GPU's NVML index"),
    (
        "UUID",
        "the GPU's UUID (on a MIG instance's series: its GPU's)",
    ),
    ("pci_bus_id", "the GPU's PCI bus id"),
    ("device", "`nvidia<index>`"),
    ("modelName", "the product name NVML gives"),
    (
        "Hostname",
        "the Kubernetes node name (`K8S_NODE_NAME`), else the host name",
    ),
    (
        "DCGM_FI_DRIVER_VERSION",
        "the driver version, when NVML gives it",
    ),
];

/// The labels a MIG instance's series add after `modelName` (see [`DEVICE_LABELS`]).
pub(super) const MIG_LABELS: [(&str, &str); 2] = [
    ("GPU_I_PROFILE", "the MIG profile, e.g. `3g.40gb`"),
    ("GPU_I_ID", "the GPU instance id"),
];

/// The labels `DCGM_FI_DEV_XID_ERRORS` adds after [`DEVICE_LABELS`], as dcgm-exporter writes them
/// on that series (its `err_code` and `err_msg` attributes).
pub(super) const XID_LABELS: [(&str, &str); 2] = [
    ("err_code", "the last XID's code, `0` when none"),
    (
        "err_msg",
        "its meaning from gpulse's Xid catalog (docs/xid.md): `No Error` for 0, `Unknown Error` for a code the catalog lacks, as dcgm-exporter; other texts are gpulse's words, so match on `err_code`",
    ),
];

/// The [`XID_LABELS`] of the XID code `code`.
fn xid_labels(code: u64) -> Vec<(String, String)> {
    let message = match code {
        0 => "No Error",
        _ => xid_catalog::lookup(code).map_or("Unknown Error", |row| row.meaning),
    };
    let [(code_label, _), (message_label, _)] = XID_LABELS;
    vec![
        (code_label.to_string(), code.to_string()),
        (message_label.to_string(), message.to_string()),
    ]
}

/// The pod labels, last on every series, only when exactly one pod uses the GPU (or the MIG
/// instance): dcgm-exporter cannot tell either when several do (see [`DEVICE_LABELS`]).
pub(super) const POD_LABELS: [(&str, &str); 3] = [
    ("pod", "the pod's name"),
    ("namespace", "its namespace, when known"),
    ("container", "its container, when known"),
];

/// A GPU's [`DEVICE_LABELS`], in their order (the driver version only when known).
fn device_labels(
    info: &DeviceInfo,
    hostname: &str,
    driver_version: Option<&str>,
) -> Vec<(String, String)> {
    DEVICE_LABELS
        .iter()
        .filter_map(|(name, _)| {
            let value = match *name {
                "gpu" => info.index.to_string(),
                "UUID" => info.uuid.clone(),
                "pci_bus_id" => info.pci_bus_id.clone(),
                "device" => format!("nvidia{}", info.index),
                "modelName" => info.name.clone(),
                "Hostname" => hostname.to_string(),
                DRIVER_VERSION_LABEL => driver_version?.to_string(),
                other => unreachable!("DEVICE_LABELS has {other} without its value"),
            };
            Some((name.to_string(), value))
        })
        .collect()
}

/// A series value in dcgm-exporter's unit, as the schema's row converts it.
fn dcgm_value(scale: DcgmScale, value: f64) -> SampleValue {
    match scale.convert(value) {
        DcgmValue::Int(v) => SampleValue::Int(v),
        DcgmValue::Float(v) => SampleValue::Float(v),
    }
}

/// A dcgm-exporter name: used as is, no unit suffix, no `_total`.
fn dcgm_name(name: &str) -> PromName {
    PromName {
        base: name.to_string(),
        unit: None,
        counter: false,
    }
}

/// The pod using a device (or, with `pids`, a MIG instance of it), as dcgm-exporter labels it:
/// only when exactly one pod does.
fn pod_labels(
    attributed: &AttributedWindow,
    uuid: &str,
    pids: Option<&[u32]>,
) -> Vec<(String, String)> {
    let mut pods: Vec<(&str, Option<&str>, Option<&str>)> = Vec::new();
    for p in attributed
        .window
        .processes
        .iter()
        .filter(|p| p.device_uuid == uuid)
        .filter(|p| pids.is_none_or(|pids| pids.binary_search(&p.pid).is_ok()))
    {
        let Some(w) = attributed.workloads.get(&p.pid) else {
            continue;
        };
        let Some(pod) = w.pod_name.as_deref() else {
            continue;
        };
        let entry = (
            pod,
            w.namespace_name.as_deref(),
            w.container_name.as_deref(),
        );
        if !pods.contains(&entry) {
            pods.push(entry);
        }
    }
    let [(pod, namespace, container)] = pods.as_slice() else {
        return Vec::new();
    };
    POD_LABELS
        .iter()
        .filter_map(|(name, _)| {
            let value = match *name {
                "pod" => Some(*pod),
                "namespace" => *namespace,
                "container" => *container,
                other => unreachable!("POD_LABELS has {other} without its value"),
            };
            Some((name.to_string(), value?.to_string()))
        })
        .collect()
}

/// Which series are served, with which type and help: every series of the schema with its
/// own (no counters file), or the rows of the operator's counters file.
#[derive(Clone, Copy)]
pub(super) struct Selection<'a> {
    pub counters: Option<&'a DcgmCounters>,
    /// The metrics switched off (`[metrics]`): gone under both names.
    pub off: MetricSet,
}

impl<'a> Selection<'a> {
    /// The type and help `series` is served with, or `None` when it is not served: its metric
    /// is switched off, or a counters file does not list it.
    fn of(
        &self,
        series: &'a DcgmSeries,
        metric: Option<MetricId>,
    ) -> Option<(FamilyKind, &'a str)> {
        if metric.is_some_and(|m| self.off.contains(m)) {
            return None;
        }
        let (kind, help) = match self.counters {
            None => (series.kind, series.help),
            Some(counters) => {
                let row = counters.get(series.name)?;
                (row.kind, row.help.as_str())
            }
        };
        let kind = match kind {
            DcgmType::Gauge => FamilyKind::Gauge,
            DcgmType::Counter => FamilyKind::NamedCounter,
        };
        Some((kind, help))
    }

    /// dcgm-exporter's driver version label: always without a counters file, else when the
    /// file has its `label` row.
    fn driver_version_label(&self) -> bool {
        self.counters.is_none_or(|c| c.driver_version_label)
    }

    /// Pushes `value` (in the field's unit) under `series` when it is served.
    fn push(
        &self,
        b: &mut Builder,
        series: &'a DcgmSeries,
        metric: Option<MetricId>,
        labels: &[(String, String)],
        value: Option<f64>,
    ) {
        let (Some((kind, help)), Some(value)) = (self.of(series, metric), value) else {
            return;
        };
        if !value.is_finite() {
            return;
        }
        b.push(
            &dcgm_name(series.name),
            help,
            kind,
            labels.to_vec(),
            dcgm_value(series.scale, value),
        );
    }
}

/// The `DCGM_FI_*` families of every device of the window that `selection` serves.
pub(super) fn push_devices(
    b: &mut Builder,
    attributed: &AttributedWindow,
    node: &NodeIdentity,
    last_xid: &HashMap<String, u64>,
    selection: Selection<'_>,
) {
    let window = &attributed.window;
    // dcgm-exporter's Hostname is the node's name (NODE_NAME in its DaemonSet).
    let hostname = node
        .k8s_node_name()
        .unwrap_or(node.host_name.as_str())
        .to_string();
    let driver_version = window
        .driver_version
        .as_deref()
        .filter(|_| selection.driver_version_label());
    for d in &window.devices {
        if d.status == DeviceStatus::Lost {
            // dcgm-exporter stops reporting a GPU that fell off the bus; so does this.
            continue;
        }
        let info = &d.info;
        let mut labels = device_labels(info, &hostname, driver_version);
        let gpu_labels = labels.clone();
        labels.extend(pod_labels(attributed, &info.uuid, None));

        for spec in &DEVICE_FIELDS {
            let Some(series) = &spec.dcgm else { continue };
            let value = match spec.dcgm_reading() {
                DcgmReading::Total => d.total(spec.field),
                DcgmReading::Mean => d.mean(spec.field),
                DcgmReading::Last => d.last(spec.field),
            };
            selection.push(b, series, Some(spec.metric.id), &labels, value);
        }
        for (family, series) in &DCGM_FAMILY_SERIES {
            let (value, metric) = family_value(*family, d, last_xid);
            if *family == DcgmFamily::XidErrors {
                let code = last_xid.get(&info.uuid).copied().unwrap_or(0);
                let mut xid = gpu_labels.clone();
                xid.extend(xid_labels(code));
                xid.extend(labels[gpu_labels.len()..].iter().cloned());
                selection.push(b, series, metric, &xid, value);
                continue;
            }
            selection.push(b, series, metric, &labels, value);
        }
        push_profiling(b, &labels, d, None, selection);
        for m in &d.mig_instances {
            push_mig_instance(b, attributed, &gpu_labels, d, m, selection);
        }
    }
}

/// A family series' value on device `d` (in its unit; `None`: the device does not give it),
/// and the metric whose switch also turns it off.
fn family_value(
    family: DcgmFamily,
    d: &DeviceWindow,
    last_xid: &HashMap<String, u64>,
) -> (Option<f64>, Option<MetricId>) {
    let remap = d.remapped_rows;
    let nvlink_rate = |tx: bool| {
        d.nvlink
            .iter()
            .filter_map(|l| {
                if tx {
                    l.tx_bytes_per_second
                } else {
                    l.rx_bytes_per_second
                }
            })
            .map(|g| g.mean)
            .reduce(|a, b| a + b)
    };
    match family {
        DcgmFamily::XidErrors => (
            Some(last_xid.get(&d.info.uuid).map_or(0.0, |x| *x as f64)),
            None,
        ),
        DcgmFamily::UncorrectableRemappedRows => (
            remap.map(|r| f64::from(r.uncorrectable)),
            Some(MetricId::RemappedRows),
        ),
        DcgmFamily::CorrectableRemappedRows => (
            remap.map(|r| f64::from(r.correctable)),
            Some(MetricId::RemappedRows),
        ),
        DcgmFamily::RowRemapFailure => (
            remap.map(|r| f64::from(u8::from(r.failure))),
            Some(MetricId::RemapFailed),
        ),
        DcgmFamily::NvLinkBandwidthTotal => (
            d.nvlink
                .iter()
                .flat_map(|l| [l.last.tx_bytes_total, l.last.rx_bytes_total])
                .flatten()
                .map(|v| v as f64)
                .reduce(|a, b| a + b),
            Some(MetricId::NvLinkIo),
        ),
        DcgmFamily::NvLinkTxBytes => (nvlink_rate(true), Some(MetricId::NvLinkIo)),
        DcgmFamily::NvLinkRxBytes => (nvlink_rate(false), Some(MetricId::NvLinkIo)),
    }
}

/// A MIG instance's series, as dcgm-exporter gives them: the GPU's labels (its `UUID`, `gpu`,
/// `device`) with `GPU_I_PROFILE` and `GPU_I_ID` after `modelName`, the pod using the instance,
/// its memory slice (`DCGM_FI_DEV_FB_*`) and its GPU instance's `DCGM_FI_PROF_*` activity.
fn push_mig_instance(
    b: &mut Builder,
    attributed: &AttributedWindow,
    gpu_labels: &[(String, String)],
    d: &DeviceWindow,
    m: &MigInstanceWindow,
    selection: Selection<'_>,
) {
    let mut labels = Vec::with_capacity(gpu_labels.len() + MIG_LABELS.len() + POD_LABELS.len());
    for label in gpu_labels {
        labels.push(label.clone());
        if label.0 == "modelName" {
            for (name, _) in MIG_LABELS {
                let value = match name {
                    "GPU_I_PROFILE" => m.info.profile().to_string(),
                    "GPU_I_ID" => m.info.gpu_instance_id.to_string(),
                    other => unreachable!("MIG_LABELS has {other} without its value"),
                };
                labels.push((name.to_string(), value));
            }
        }
    }
    labels.extend(pod_labels(attributed, &m.info.parent_uuid, Some(&m.pids)));
    for (field, bytes) in [
        (DeviceField::MemoryUsed, m.memory_used_bytes),
        (DeviceField::MemoryFree, m.memory_free_bytes),
    ] {
        let spec = field.spec();
        let Some(series) = &spec.dcgm else { continue };
        selection.push(
            b,
            series,
            Some(spec.metric.id),
            &labels,
            bytes.map(|v| v as f64),
        );
    }
    push_profiling(b, &labels, d, Some(m), selection);
}

/// dcgm-exporter's `DCGM_FI_PROF_*` fields, 0–1 ratios (the window's mean), from GPM (Hopper and
/// later): of the GPU `d`, or with `instance` of that MIG instance's GPU instance. Without GPM
/// there are none: a dashboard panel on them shows "no data", never a made-up 0.
fn push_profiling(
    b: &mut Builder,
    labels: &[(String, String)],
    d: &DeviceWindow,
    instance: Option<&MigInstanceWindow>,
    selection: Selection<'_>,
) {
    let gpm = instance.map_or(&d.gpm, |m| &m.gpm);
    for spec in &GPM_FIELDS {
        let Some(series) = &spec.dcgm else { continue };
        selection.push(
            b,
            series,
            Some(spec.metric.id),
            labels,
            gpm.mean(spec.field),
        );
    }
}
