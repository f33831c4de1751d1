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
    DeviceInfo, DeviceStatus, MigInstanceInfo, NvLinkSample, ProcessKind, RemappedRows,
    ViolationTimes, XidEvent,
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
    pub utilization_gpu: Option<Gauge>,
    pub utilization_memory: Option<Gauge>,
    pub utilization_encoder: Option<Gauge>,
    pub utilization_decoder: Option<Gauge>,
    pub temperature_celsius: Option<Gauge>,
    pub power_watts: Option<Gauge>,
    pub sm_clock_mhz: Option<Gauge>,
    pub memory_clock_mhz: Option<Gauge>,
    pub graphics_clock_mhz: Option<Gauge>,
    pub fan_speed: Option<Gauge>,
    /// Last values.
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_reserved_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_limit_watts: Option<f64>,
    pub performance_state: Option<u32>,
    /// Throttle reasons: for each reason bit seen active, the ratio (0–1) of the window's samples
    /// with a known throttle state in which it was active. Empty map with `Some` = none active.
    pub throttle_active_ratio: Option<BTreeMap<u64, f64>>,
    /// Start of the cumulative counters below.
    #[serde(with = "super::model::unix_nanos")]
    pub counters_start: SystemTime,
    /// Energy used since `counters_start`, joules.
    pub energy_joules_total: Option<f64>,
    /// PCIe bytes since `counters_start`, integrated from the sampled throughput.
    pub pcie_tx_bytes_total: Option<u64>,
    pub pcie_rx_bytes_total: Option<u64>,
    /// ECC errors counted since `counters_start`.
    pub ecc_corrected_total: Option<u64>,
    pub ecc_uncorrected_total: Option<u64>,
    /// XID events since `counters_start`.
    pub xid_total: u64,
    /// GPM activity gauges (Hopper and newer); all `None` elsewhere.
    pub gpm: GpmWindow,
    /// Row remapper state, last value.
    pub remapped_rows: Option<RemappedRows>,
    /// The driver's PCIe replay count (since it loaded), last value.
    pub pcie_replays_total: Option<u64>,
    /// The driver's violation times (since it loaded), last value.
    pub violation: Option<ViolationTimes>,
    /// XID events since `counters_start`, by XID code (they add up to `xid_total`).
    pub xid_by_code: BTreeMap<u64, u64>,
    /// Combined PCIe throughput (transmit + receive) over the window's samples, bytes/s.
    pub pcie_bytes_per_second: Option<Gauge>,
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
    pub fn crc_errors_total(&self) -> Option<u64> {
        match (self.last.crc_flit_errors, self.last.crc_data_errors) {
            (None, None) => None,
            (flit, data) => Some(flit.unwrap_or(0) + data.unwrap_or(0)),
        }
    }
}

impl DeviceWindow {
    /// Mean NVLink traffic over the window, both directions of every link, bytes/s; `None`
    /// when no link gave a rate.
    pub fn nvlink_bytes_per_second(&self) -> Option<f64> {
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

/// The GPM activity of one device over one window: each metric's mean/min/max over the ticks
/// that gave it (see [`GpmActivity`](super::model::GpmActivity) for what each one measures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GpmWindow {
    pub sm_activity: Option<Gauge>,
    pub sm_occupancy: Option<Gauge>,
    pub tensor_activity: Option<Gauge>,
    pub tensor_hmma_activity: Option<Gauge>,
    pub tensor_imma_activity: Option<Gauge>,
    pub tensor_dfma_activity: Option<Gauge>,
    pub dram_activity: Option<Gauge>,
    pub fp16_activity: Option<Gauge>,
    pub fp32_activity: Option<Gauge>,
    pub fp64_activity: Option<Gauge>,
    pub integer_activity: Option<Gauge>,
    pub graphics_activity: Option<Gauge>,
}

impl DeviceWindow {
    /// A window of a device with nothing known but its identity and the counters' start.
    pub fn empty(info: Arc<DeviceInfo>, counters_start: SystemTime) -> Self {
        Self {
            info,
            status: DeviceStatus::Ok,
            lost_samples: 0,
            utilization_gpu: None,
            utilization_memory: None,
            utilization_encoder: None,
            utilization_decoder: None,
            temperature_celsius: None,
            power_watts: None,
            sm_clock_mhz: None,
            memory_clock_mhz: None,
            graphics_clock_mhz: None,
            fan_speed: None,
            memory_used_bytes: None,
            memory_free_bytes: None,
            memory_reserved_bytes: None,
            memory_total_bytes: None,
            power_limit_watts: None,
            performance_state: None,
            throttle_active_ratio: None,
            counters_start,
            energy_joules_total: None,
            pcie_tx_bytes_total: None,
            pcie_rx_bytes_total: None,
            ecc_corrected_total: None,
            ecc_uncorrected_total: None,
            xid_total: 0,
            gpm: GpmWindow::default(),
            remapped_rows: None,
            pcie_replays_total: None,
            violation: None,
            xid_by_code: BTreeMap::new(),
            pcie_bytes_per_second: None,
            nvlink: Vec::new(),
            mig_instances: Vec::new(),
        }
    }
}

impl Window {
    /// The MIG device process `pid` ran in on the GPU `device_uuid` during the window, if its
    /// GPU is in MIG mode and NVML named the instance.
    pub fn mig_instance_of(&self, pid: u32, device_uuid: &str) -> Option<&MigInstanceWindow> {
        self.devices
            .iter()
            .filter(|d| d.info.uuid == device_uuid)
            .flat_map(|d| &d.mig_instances)
            .find(|m| m.pids.binary_search(&pid).is_ok())
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
    pub gpu_memory_bytes: Option<Gauge>,
    pub sm_utilization: Option<Gauge>,
    pub memory_utilization: Option<Gauge>,
    pub encoder_utilization: Option<Gauge>,
    pub decoder_utilization: Option<Gauge>,
}
