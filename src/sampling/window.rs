//! The export window: what the samples taken during one export interval add up to.
//!
//! Gauges keep mean/min/max/last so a spike between exports is not lost; counters are cumulative
//! since `counters_start` (the first time gpulse saw the device), so a backend can compute rates
//! across gpulse restarts from the start time alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use super::model::{
    DeviceInfo, DeviceStatus, GpmActivity, MigInstanceInfo, NvLinkSample, ProcessKind,
    RemappedRows, ViolationTimes, XidEvent,
};
use crate::schema::{
    serialize_keyed, DeviceField, FieldReport, FieldSpec, GpmField, ReportValue, WindowKind,
    DEVICE_FIELDS, FIELD_COUNT, GPM_FIELDS, GPM_FIELD_COUNT,
};

/// Summary of one gauge over the samples of a window in which it had a value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gauge {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
    /// Number of samples that had a value.
    pub count: u32,
}

/// What one export window keeps of every scalar device field: a summary of its sampled values
/// and, for counters and rates, the total since `counters_start`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FieldWindows {
    gauges: [Option<Gauge>; FIELD_COUNT],
    totals: [Option<f64>; FIELD_COUNT],
}

impl FieldWindows {
    pub(crate) fn gauge(&self, field: DeviceField) -> Option<Gauge> {
        self.gauges[field as usize]
    }

    pub(crate) fn total(&self, field: DeviceField) -> Option<f64> {
        self.totals[field as usize]
    }

    pub fn set_gauge(&mut self, field: DeviceField, gauge: Option<Gauge>) {
        self.gauges[field as usize] = gauge;
    }

    pub fn set_total(&mut self, field: DeviceField, total: Option<f64>) {
        self.totals[field as usize] = total;
    }

    /// What the window says of a field by its [`WindowKind`]: the mean of a gauge, the last value
    /// of a level, the total of a counter or an integrated rate.
    pub(crate) fn value(&self, spec: &FieldSpec) -> Option<f64> {
        match spec.window {
            WindowKind::Gauge => self.gauge(spec.field).map(|g| g.mean),
            WindowKind::Last => self.gauge(spec.field).map(|g| g.last),
            WindowKind::LifetimeCounter | WindowKind::IntegratedRate => self.total(spec.field),
        }
    }

    /// Every field as a JSON report (`/status`) shows it.
    pub(crate) fn report(&self) -> FieldReport {
        FieldReport(std::array::from_fn(|i| {
            self.report_value(&DEVICE_FIELDS[i])
        }))
    }

    /// What a JSON report (`/status`) shows of a field under its key: as [`Self::value`], except
    /// that a rate is reported as its mean rate over the window (its key is a rate).
    pub(crate) fn report_value(&self, spec: &FieldSpec) -> ReportValue {
        let value = match spec.window {
            WindowKind::IntegratedRate => self.gauge(spec.field).map(|g| g.mean),
            _ => self.value(spec),
        };
        ReportValue::sampled(spec, value)
    }
}

/// A non-negative whole number from a field value.
fn whole(v: f64) -> u64 {
    v.round().max(0.0) as u64
}

/// Serialises as the report keys with their values (`FieldWindows::report_value`).
impl Serialize for FieldWindows {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.report().serialize(serializer)
    }
}

impl Gauge {
    /// A gauge of one sample.
    pub fn single(value: f64) -> Self {
        Self {
            mean: value,
            min: value,
            max: value,
            last: value,
            count: 1,
        }
    }
}

/// Everything one export interval saw.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Time of the first sample in the window.
    #[serde(with = "super::model::unix_nanos")]
    pub start: SystemTime,
    /// Time of the last sample in the window.
    #[serde(with = "super::model::unix_nanos")]
    pub end: SystemTime,
    pub sample_count: u32,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub devices: Vec<DeviceWindow>,
    pub processes: Vec<ProcessWindow>,
    /// XID events that arrived during this window, oldest first.
    pub xid_events: Vec<XidEvent>,
}

/// One device over one window.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceWindow {
    pub info: Arc<DeviceInfo>,
    /// Status at the last sample.
    pub status: DeviceStatus,
    /// Samples in this window in which the device was lost.
    pub lost_samples: u32,
    /// The scalar fields (see [`DEVICE_FIELDS`]).
    pub fields: FieldWindows,
    /// Throttle reasons: for each reason bit seen active, the ratio (0–1) of the window's samples
    /// with a known throttle state in which it was active. Empty map with `Some` = none active.
    pub throttle_active_ratio: Option<BTreeMap<u64, f64>>,
    /// Start of the cumulative counters (`fields` totals, XIDs).
    #[serde(with = "super::model::unix_nanos")]
    pub counters_start: SystemTime,
    /// XID events since `counters_start`.
    pub xid_total: u64,
    /// GPM activity gauges (Hopper and newer); all `None` elsewhere.
    pub gpm: GpmWindow,
    /// Row remapper state, last value.
    pub remapped_rows: Option<RemappedRows>,
    /// The driver's violation times (since it loaded), last value.
    pub violation: Option<ViolationTimes>,
    /// XID events since `counters_start`, by XID code (they add up to `xid_total`).
    pub xid_by_code: BTreeMap<u64, u64>,
    /// NVLink links in link order; empty on a GPU without NVLink.
    pub nvlink: Vec<NvLinkWindow>,
    /// The MIG devices seen in the window (GPU in MIG mode), in MIG index order.
    pub mig_instances: Vec<MigInstanceWindow>,
}

/// One NVLink link over one window: its last sample (the driver's counters) and its traffic
/// rates between consecutive samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NvLinkWindow {
    #[serde(flatten)]
    pub last: NvLinkSample,
    pub tx_bytes_per_second: Option<Gauge>,
    pub rx_bytes_per_second: Option<Gauge>,
}

impl NvLinkWindow {
    /// CRC errors of both kinds (flit and data) the link counted, when it gives either.
    pub(crate) fn crc_errors_total(&self) -> Option<u64> {
        match (self.last.crc_flit_errors, self.last.crc_data_errors) {
            (None, None) => None,
            (flit, data) => Some(flit.unwrap_or(0) + data.unwrap_or(0)),
        }
    }
}

impl DeviceWindow {
    /// The window's summary of a field's sampled values.
    pub(crate) fn gauge(&self, field: DeviceField) -> Option<Gauge> {
        self.fields.gauge(field)
    }

    /// The field's mean over the window.
    pub(crate) fn mean(&self, field: DeviceField) -> Option<f64> {
        self.fields.gauge(field).map(|g| g.mean)
    }

    /// The field's last value in the window (a lost device keeps its last known value).
    pub(crate) fn last(&self, field: DeviceField) -> Option<f64> {
        self.fields.gauge(field).map(|g| g.last)
    }

    /// The field's total since `counters_start` (lifetime counters and integrated rates).
    pub(crate) fn total(&self, field: DeviceField) -> Option<f64> {
        self.fields.total(field)
    }

    /// [`Self::last`] of a whole quantity (bytes, counts).
    pub(crate) fn last_u64(&self, field: DeviceField) -> Option<u64> {
        self.last(field).map(whole)
    }

    /// [`Self::total`] of a whole quantity, rounded (an integrated rate is not whole).
    pub(crate) fn total_u64(&self, field: DeviceField) -> Option<u64> {
        self.total(field).map(whole)
    }

    /// Combined PCIe throughput (transmit + receive), mean over the window, bytes/s; `None`
    /// when the device gives neither direction.
    pub(crate) fn pcie_bytes_per_second(&self) -> Option<f64> {
        match (
            self.mean(DeviceField::PcieTx),
            self.mean(DeviceField::PcieRx),
        ) {
            (None, None) => None,
            (tx, rx) => Some(tx.unwrap_or(0.0) + rx.unwrap_or(0.0)),
        }
    }

    /// Mean NVLink traffic over the window, both directions of every link, bytes/s; `None`
    /// when no link gave a rate.
    pub(crate) fn nvlink_bytes_per_second(&self) -> Option<f64> {
        self.nvlink
            .iter()
            .flat_map(|l| [l.tx_bytes_per_second, l.rx_bytes_per_second])
            .flatten()
            .map(|g| g.mean)
            .reduce(|a, b| a + b)
    }
}

/// One MIG device over one window.
#[derive(Debug, Clone, Serialize)]
pub struct MigInstanceWindow {
    pub info: Arc<MigInstanceInfo>,
    /// Last values of the instance's memory slice.
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    /// GPM activity of the instance's GPU instance.
    pub gpm: GpmWindow,
    /// Host PIDs seen running in this instance during the window, ascending.
    pub pids: Vec<u32>,
}

/// The GPM activity of one device over one window: each [`GpmField`]'s mean/min/max over the
/// ticks that gave it. Serialises as the report keys.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpmWindow([Option<Gauge>; GPM_FIELD_COUNT]);

impl GpmWindow {
    pub(crate) fn gauge(&self, field: GpmField) -> Option<Gauge> {
        self.0[field as usize]
    }

    /// The field's mean over the window.
    pub(crate) fn mean(&self, field: GpmField) -> Option<f64> {
        self.gauge(field).map(|g| g.mean)
    }

    pub(crate) fn set(&mut self, field: GpmField, gauge: Option<Gauge>) {
        self.0[field as usize] = gauge;
    }

    /// The window with these gauges, the other fields unknown.
    pub fn of<const N: usize>(gauges: [(GpmField, Gauge); N]) -> Self {
        let mut window = Self::default();
        for (field, gauge) in gauges {
            window.set(field, Some(gauge));
        }
        window
    }

    /// The window means, as one tick's activity.
    pub(crate) fn means(&self) -> GpmActivity {
        let mut activity = GpmActivity::default();
        for spec in &GPM_FIELDS {
            activity.set(spec.field, self.mean(spec.field));
        }
        activity
    }
}

impl Serialize for GpmWindow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_keyed(serializer, GPM_FIELDS.iter().map(|s| s.key), &self.0)
    }
}

impl DeviceWindow {
    /// A window of a device with nothing known but its identity (and so its static memory
    /// total) and the counters' start.
    pub fn empty(info: Arc<DeviceInfo>, counters_start: SystemTime) -> Self {
        let mut fields = FieldWindows::default();
        fields.set_gauge(
            DeviceField::MemoryTotal,
            info.memory_total_bytes.map(|b| Gauge::single(b as f64)),
        );
        Self {
            info,
            status: DeviceStatus::Ok,
            lost_samples: 0,
            fields,
            throttle_active_ratio: None,
            counters_start,
            xid_total: 0,
            gpm: GpmWindow::default(),
            remapped_rows: None,
            violation: None,
            xid_by_code: BTreeMap::new(),
            nvlink: Vec::new(),
            mig_instances: Vec::new(),
        }
    }
}

impl Window {
    /// The MIG device process `pid` ran in on the GPU `device_uuid` during the window, if its
    /// GPU is in MIG mode and NVML named the instance.
    pub(crate) fn mig_instance_of(
        &self,
        pid: u32,
        device_uuid: &str,
    ) -> Option<&MigInstanceWindow> {
        self.devices
            .iter()
            .filter(|d| d.info.uuid == device_uuid)
            .flat_map(|d| &d.mig_instances)
            .find(|m| m.pids.binary_search(&pid).is_ok())
    }

    /// The MIG device process `pid` ran in on the GPU `device_uuid`, when it was the only
    /// process of the window in that device's GPU instance: then the instance's GPM activity is
    /// its own. GPM is measured per GPU instance, so a process alone on its compute instance
    /// that shares the GPU instance with another compute instance in use is not alone. `None`
    /// also when the process is not on a MIG device: NVML gives MIG no per-process figures, and
    /// a split between several processes would be invented.
    pub(crate) fn mig_instance_held_alone(
        &self,
        pid: u32,
        device_uuid: &str,
    ) -> Option<&MigInstanceWindow> {
        let instance = self.mig_instance_of(pid, device_uuid)?;
        let gi = instance.info.gpu_instance_id;
        let alone = self
            .devices
            .iter()
            .filter(|d| d.info.uuid == device_uuid)
            .flat_map(|d| &d.mig_instances)
            .filter(|m| m.info.gpu_instance_id == gi)
            .all(|m| m.pids.iter().all(|&other| other == pid));
        alone.then_some(instance)
    }
}

/// One process on one device over one window (present in at least one of its samples).
#[derive(Debug, Clone, Serialize)]
pub struct ProcessWindow {
    /// Host PID.
    pub pid: u32,
    pub device_index: u32,
    pub device_uuid: String,
    pub kind: ProcessKind,
    /// When gpulse first saw this PID on this device.
    #[serde(with = "super::model::unix_nanos")]
    pub first_seen: SystemTime,
    /// Samples of the window that listed the process on this device (of the window's
    /// `sample_count`).
    pub samples: u32,
    pub gpu_memory_bytes: Option<Gauge>,
    pub sm_utilization: Option<Gauge>,
    pub memory_utilization: Option<Gauge>,
    pub encoder_utilization: Option<Gauge>,
    pub decoder_utilization: Option<Gauge>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::MigInstanceInfo;

    fn instance(uuid: &str, gi: u32, ci: u32, pids: Vec<u32>) -> MigInstanceWindow {
        MigInstanceWindow {
            info: Arc::new(MigInstanceInfo {
                uuid: uuid.into(),
                name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".into(),
                parent_uuid: "GPU-0".into(),
                parent_index: 0,
                mig_index: 0,
                gpu_instance_id: gi,
                compute_instance_id: ci,
            }),
            memory_used_bytes: None,
            memory_free_bytes: None,
            memory_total_bytes: None,
            gpm: GpmWindow::default(),
            pids,
        }
    }

    fn window_of(instances: Vec<MigInstanceWindow>) -> Window {
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:10:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: None,
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        });
        let mut device = DeviceWindow::empty(info, SystemTime::UNIX_EPOCH);
        device.mig_instances = instances;
        Window {
            start: SystemTime::UNIX_EPOCH,
            end: SystemTime::UNIX_EPOCH,
            sample_count: 1,
            driver_version: None,
            cuda_driver_version: None,
            devices: vec![device],
            processes: Vec::new(),
            xid_events: Vec::new(),
        }
    }

    #[test]
    fn alone_means_alone_in_the_whole_gpu_instance_the_gpm_measures() {
        let w = window_of(vec![
            instance("MIG-a", 1, 0, vec![7]),
            instance("MIG-b", 2, 0, vec![8, 9]),
            instance("MIG-c0", 3, 0, vec![10]),
            instance("MIG-c1", 3, 1, vec![11]),
            instance("MIG-d0", 4, 0, vec![12]),
            instance("MIG-d1", 4, 1, vec![]),
        ]);
        let alone = |pid| {
            w.mig_instance_held_alone(pid, "GPU-0")
                .map(|m| &*m.info.uuid)
        };
        assert_eq!(alone(7), Some("MIG-a"));
        assert_eq!(alone(8), None, "two processes on one instance");
        assert_eq!(alone(10), None, "a sibling compute instance is in use");
        assert_eq!(alone(11), None);
        assert_eq!(alone(12), Some("MIG-d0"), "an idle sibling takes nothing");
        assert_eq!(alone(99), None, "not on a MIG device");
        assert!(
            w.mig_instance_held_alone(7, "GPU-1").is_none(),
            "another GPU"
        );
        assert_eq!(
            w.mig_instance_of(10, "GPU-0").map(|m| &*m.info.uuid),
            Some("MIG-c0")
        );
    }
}
