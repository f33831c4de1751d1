//! The JSON contract of `gpulse snapshot --format json` and `/status`: one document shape,
//! built from one sample (`snapshot`) or from a running pipeline's latest window (`/status`).
//! Device fields come from the schema's device field table (`schema::DEVICE_FIELDS`), so a new NVML field
//! reaches both without touching this module. Field names are a stable contract other tools
//! read; `null` where NVML gave nothing.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::attribution::Workload;
use crate::diagnosis::Finding;
use crate::pipeline::View;
use crate::sampling::{
    DeviceInfo, DeviceSample, DeviceStatus, DeviceWindow, GpmActivity, MigInstanceSample,
    MigInstanceWindow, ProcessKind, ProcessMig, ProcessSample, ProcessWindow, Snapshot,
};
use crate::schema::{throttle_reason_names, FieldReport, ReportValue, FIELD_COUNT};

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The JSON document `gpulse snapshot --format json` prints. Field names are a stable contract.
#[derive(Debug, Serialize)]
pub struct SnapshotReport<'a> {
    /// Unix time of the sample, in seconds.
    pub timestamp: f64,
    pub driver_version: Option<&'a str>,
    pub cuda_driver_version: Option<&'a str>,
    pub nvml_version: Option<&'a str>,
    pub devices: Vec<DeviceReport<'a>>,
    pub processes: Vec<ProcessReport<'a>>,
    /// What the diagnosis rules say about this sample; empty when there is nothing to say.
    pub findings: Vec<Finding>,
    /// `/status` only: the export window the figures summarise (device and process figures are
    /// then window means, memory the last sample). Absent from `gpulse snapshot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowReport>,
    /// `/status` only: Unix time, in seconds, at which the window was analysed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
    /// `/status` and `snapshot --window` only: each device's energy, what its processes were
    /// charged and the rest, and the roll-ups by job, pod and container since gpulse started
    /// (for a snapshot: over its window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounting: Option<AccountingReport<'a>>,
}

/// GPU time and energy (docs/shared-gpus.md says how they are figured).
#[derive(Debug, Serialize)]
pub struct AccountingReport<'a> {
    /// A window whose activity reaches this ratio counts as active time.
    pub active_threshold: f64,
    pub devices: &'a [crate::attribution::accounting::DeviceAccount],
    pub rollups: &'a [crate::attribution::Rollup],
    /// The roll-ups' GPU-hours, energy and cost by cause (the ledger), in the same order.
    pub cause_rollups: &'a [crate::attribution::ledger::CauseRollup],
}

/// The export window behind a `/status` answer.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WindowReport {
    /// Unix time, in seconds.
    pub start: f64,
    pub end: f64,
    pub samples: u32,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport<'a> {
    pub index: u32,
    pub uuid: &'a str,
    pub name: &'a str,
    pub pci_bus_id: &'a str,
    pub status: DeviceStatus,
    /// Every scalar field under its key: the sample's value (`snapshot`), or what the window
    /// says of it (`/status`: a gauge's mean, a level's last value, a counter's total since
    /// gpulse first saw the device, a rate's mean).
    #[serde(flatten)]
    pub fields: FieldReport,
    /// Clock throttle reasons active at the sample (`/status`: in at least half of the
    /// window's samples).
    pub throttle_reasons: Option<Vec<&'static str>>,
    /// GPM activity ratios (Hopper and newer), `null` where the GPU gives none.
    #[serde(flatten)]
    pub activity: GpmActivity,
    /// Row remapper state (Ampere and newer): rows remapped for correctable and uncorrectable
    /// errors, and whether a remapping waits for a GPU reset (`pending`) or failed (`failure`).
    pub remapped_rows: Option<crate::sampling::model::RemappedRows>,
    /// NVLink links (link, active, the driver's tx/rx byte and error totals); left out on a
    /// GPU without NVLink.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nvlink: Vec<crate::sampling::NvLinkSample>,
    /// The MIG devices of a GPU in MIG mode, each a device of its own; empty otherwise.
    pub mig_instances: Vec<MigInstanceReport<'a>>,
}

/// One MIG device: its identity, its memory slice and its GPU instance's GPM activity.
#[derive(Debug, Serialize)]
pub struct MigInstanceReport<'a> {
    /// `MIG-…` UUID (the instance's `hw.id`).
    pub uuid: &'a str,
    /// What NVML names the MIG device, with its profile (e.g. `… MIG 3g.40gb`).
    pub name: &'a str,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    #[serde(flatten)]
    pub activity: GpmActivity,
}

impl<'a> MigInstanceReport<'a> {
    fn of_sample(m: &'a MigInstanceSample) -> Self {
        Self {
            uuid: &m.info.uuid,
            name: &m.info.name,
            gpu_instance_id: m.info.gpu_instance_id,
            compute_instance_id: m.info.compute_instance_id,
            memory_total_bytes: m.memory_total_bytes,
            memory_used_bytes: m.memory_used_bytes,
            memory_free_bytes: m.memory_free_bytes,
            activity: m.gpm,
        }
    }

    /// A window's MIG device (`/status`): last memory values, mean activity.
    pub(crate) fn of_window(m: &'a MigInstanceWindow) -> Self {
        Self {
            uuid: &m.info.uuid,
            name: &m.info.name,
            gpu_instance_id: m.info.gpu_instance_id,
            compute_instance_id: m.info.compute_instance_id,
            memory_total_bytes: m.memory_total_bytes,
            memory_used_bytes: m.memory_used_bytes,
            memory_free_bytes: m.memory_free_bytes,
            activity: m.gpm.means(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ProcessReport<'a> {
    pub pid: u32,
    pub device_index: u32,
    pub device_uuid: &'a str,
    pub kind: ProcessKind,
    pub gpu_memory_bytes: Option<u64>,
    pub sm_utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    pub encoder_utilization: Option<f64>,
    pub decoder_utilization: Option<f64>,
    /// The MIG device the process runs in (`uuid`, `gpu_instance_id`, `compute_instance_id`),
    /// `null` on a GPU not in MIG mode.
    pub mig_instance: Option<ProcessMig>,
    /// Who the process is (container, pod, namespaced PID), as `run` exports it.
    pub workload: Option<&'a Workload>,
    /// `/status` only: CPU and memory of the process (and its tree) over the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<&'a crate::attribution::ProcessUsage>,
    /// `/status` only: its GPU time and energy on this device since gpulse first saw it there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounting: Option<&'a crate::attribution::accounting::ProcessAccount>,
    /// `/status` only: the same time and energy by cause, in its last window and in total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub causes: Option<&'a crate::attribution::ledger::ProcessLedger>,
}

impl<'a> SnapshotReport<'a> {
    /// The report of a running pipeline's latest view (`/status`): device and process figures
    /// over its window, each process's CPU use.
    pub(crate) fn of_view(view: &'a View) -> Self {
        let attributed = &view.attributed;
        let window = &attributed.window;
        let mut processes: Vec<&ProcessWindow> = window.processes.iter().collect();
        processes.sort_by_key(|p| (p.device_index, p.pid));
        SnapshotReport {
            timestamp: seconds(window.end),
            driver_version: window.driver_version.as_deref(),
            cuda_driver_version: window.cuda_driver_version.as_deref(),
            nvml_version: None,
            devices: window.devices.iter().map(DeviceReport::of_window).collect(),
            processes: processes
                .into_iter()
                .map(|p| ProcessReport {
                    pid: p.pid,
                    device_index: p.device_index,
                    device_uuid: &p.device_uuid,
                    kind: p.kind,
                    gpu_memory_bytes: p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64),
                    sm_utilization: p.sm_utilization.map(|g| g.mean),
                    memory_utilization: p.memory_utilization.map(|g| g.mean),
                    encoder_utilization: p.encoder_utilization.map(|g| g.mean),
                    decoder_utilization: p.decoder_utilization.map(|g| g.mean),
                    mig_instance: window.mig_instance_of(p.pid, &p.device_uuid).map(|m| {
                        crate::sampling::ProcessMig {
                            uuid: m.info.uuid.clone(),
                            gpu_instance_id: m.info.gpu_instance_id,
                            compute_instance_id: m.info.compute_instance_id,
                        }
                    }),
                    workload: attributed.workloads.get(&p.pid),
                    usage: attributed.usage.get(&p.pid),
                    accounting: attributed.accounts.process(p.pid, &p.device_uuid),
                    causes: attributed.ledger.process(p.pid, &p.device_uuid),
                })
                .collect(),
            findings: view.findings.clone(),
            window: Some(WindowReport {
                start: seconds(window.start),
                end: seconds(window.end),
                samples: window.sample_count,
            }),
            at: Some(seconds(view.at)),
            accounting: Some(AccountingReport {
                active_threshold: crate::attribution::accounting::ACTIVE_THRESHOLD,
                devices: &attributed.accounts.devices,
                rollups: &attributed.accounts.rollups,
                cause_rollups: &attributed.ledger.rollups,
            }),
        }
    }

    /// The report of one sample (`gpulse snapshot`).
    pub fn new(snapshot: &'a Snapshot, workloads: &'a HashMap<u32, Workload>) -> Self {
        Self {
            timestamp: snapshot
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            driver_version: snapshot.driver_version.as_deref(),
            cuda_driver_version: snapshot.cuda_driver_version.as_deref(),
            nvml_version: snapshot.nvml_version.as_deref(),
            devices: snapshot
                .devices
                .iter()
                .map(DeviceReport::of_sample)
                .collect(),
            processes: snapshot
                .processes
                .iter()
                .map(|p| ProcessReport::new(p, workloads.get(&p.pid)))
                .collect(),
            findings: Vec::new(),
            window: None,
            at: None,
            accounting: None,
        }
    }
}

impl<'a> DeviceReport<'a> {
    /// A device as one sample saw it (`gpulse snapshot`).
    pub(crate) fn of_sample(d: &'a DeviceSample) -> Self {
        Self {
            fields: FieldReport::of_values(&d.fields),
            throttle_reasons: d.throttle_reasons.map(throttle_reason_names),
            activity: d.gpm,
            remapped_rows: d.remapped_rows,
            nvlink: d.nvlink.clone(),
            mig_instances: d
                .mig_instances
                .iter()
                .map(MigInstanceReport::of_sample)
                .collect(),
            ..Self::identity(&d.info, d.status)
        }
    }

    /// A device over one export window (`/status`).
    pub(crate) fn of_window(d: &'a DeviceWindow) -> Self {
        // Reasons active in at least half of the window's samples, as the throttling rule reads
        // them.
        let throttle = d.throttle_active_ratio.as_ref().map(|ratios| {
            let bits = ratios
                .iter()
                .filter(|(_, ratio)| **ratio >= 0.5)
                .fold(0u64, |bits, (bit, _)| bits | bit);
            throttle_reason_names(bits)
        });
        Self {
            fields: d.fields.report(),
            throttle_reasons: throttle,
            activity: d.gpm.means(),
            remapped_rows: d.remapped_rows,
            nvlink: d.nvlink.iter().map(|l| l.last).collect(),
            mig_instances: d
                .mig_instances
                .iter()
                .map(MigInstanceReport::of_window)
                .collect(),
            ..Self::identity(&d.info, d.status)
        }
    }

    /// The device's identity, with nothing else known.
    fn identity(info: &'a DeviceInfo, status: DeviceStatus) -> Self {
        Self {
            index: info.index,
            uuid: &info.uuid,
            name: &info.name,
            pci_bus_id: &info.pci_bus_id,
            status,
            fields: FieldReport([ReportValue::Unknown; FIELD_COUNT]),
            throttle_reasons: None,
            activity: GpmActivity::default(),
            remapped_rows: None,
            nvlink: Vec::new(),
            mig_instances: Vec::new(),
        }
    }
}

impl<'a> ProcessReport<'a> {
    fn new(p: &'a ProcessSample, workload: Option<&'a Workload>) -> Self {
        Self {
            pid: p.pid,
            device_index: p.device_index,
            device_uuid: &p.device_uuid,
            kind: p.kind,
            gpu_memory_bytes: p.gpu_memory_bytes,
            sm_utilization: p.sm_utilization,
            memory_utilization: p.memory_utilization,
            encoder_utilization: p.encoder_utilization,
            decoder_utilization: p.decoder_utilization,
            mig_instance: p.mig.clone(),
            workload,
            usage: None,
            accounting: None,
            causes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::{device, gauge, GIB};
    use crate::sampling::Gauge;
    use crate::schema::DeviceField;
    use std::sync::Arc;

    /// Each field is reported as its window kind says: a gauge's mean, a level's last value, a
    /// counter's total since gpulse first saw the GPU, a rate's mean rate; whole fields as
    /// integers.
    #[test]
    fn a_window_reports_each_field_by_its_kind() {
        let mut d = device(0, 0.4, 20 * GIB);
        let spread = Gauge {
            mean: 250.0,
            min: 100.0,
            max: 400.0,
            last: 390.0,
            count: 10,
        };
        d.fields.set_gauge(DeviceField::Power, Some(spread));
        d.fields
            .set_gauge(DeviceField::SmClock, Some(gauge(1754.6)));
        d.fields.set_gauge(DeviceField::PcieTx, Some(gauge(1.5e9)));
        d.fields.set_total(DeviceField::PcieTx, Some(9.0e10));
        d.fields.set_total(DeviceField::Energy, Some(1234.5));
        let json = serde_json::to_value(DeviceReport::of_window(&d)).unwrap();
        assert_eq!(json["power_watts"], 250.0);
        assert_eq!(json["sm_clock_mhz"], serde_json::json!(1755));
        assert_eq!(json["memory_used_bytes"], serde_json::json!(20 * GIB));
        assert_eq!(json["energy_joules"], 1234.5);
        assert_eq!(json["pcie_tx_bytes_per_second"], 1.5e9);
        assert!(json["pcie_rx_bytes_per_second"].is_null());
        assert!(json["fan_speed"].is_null());
    }

    /// A sample reports its values as NVML gave them, under the same keys as a window.
    #[test]
    fn a_sample_and_a_window_share_the_keys() {
        let d = device(0, 0.4, 20 * GIB);
        let window = serde_json::to_value(DeviceReport::of_window(&d)).unwrap();
        let mut s = DeviceSample::empty(Arc::clone(&d.info), DeviceStatus::Ok);
        s.set(DeviceField::Energy, Some(5.0e6));
        let sample = serde_json::to_value(DeviceReport::of_sample(&s)).unwrap();
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&window), keys(&sample));
        assert_eq!(sample["energy_joules"], 5.0e6);
        assert_eq!(sample["memory_total_bytes"], serde_json::json!(80 * GIB));
    }
}
