//! The sampled data model: what one NVML pass over the node saw.
//!
//! Every dynamic field is an `Option`: `None` means the device or driver did not give the value
//! (not supported, no permission, lost), and downstream stages omit it instead of reporting zero.
//! Units are fixed by the field name (`_bytes`, `_watts`, `_mhz`, `_celsius`); ratios are 0–1.

use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::schema::{
    serialize_keyed, DeviceField, FieldValues, GpmField, GPM_FIELDS, GPM_FIELD_COUNT,
};

/// One sampling pass: every device, every GPU process, and the XID events since the last pass.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Wall-clock time at which the pass started.
    #[serde(with = "unix_nanos")]
    pub at: SystemTime,
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, as `major.minor` (e.g. `12.4`).
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub devices: Vec<DeviceSample>,
    pub processes: Vec<ProcessSample>,
    pub events: Vec<XidEvent>,
}

/// Facts about a device that do not change while it stays attached; read once and cached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceInfo {
    /// NVML index (not necessarily the CUDA index).
    pub index: u32,
    /// `GPU-…` UUID; the stable identity exported as `hw.id`.
    pub uuid: String,
    pub name: String,
    /// PCI bus id as NVML formats it, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    pub serial: Option<String>,
    /// `N` of `/dev/nvidiaN`.
    pub minor_number: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    /// `major.minor`, e.g. `9.0` for Hopper.
    pub compute_capability: Option<String>,
    /// Number of fans NVML reports; 0 on passively cooled boards.
    pub fan_count: Option<u32>,
}

/// Whether a device answered this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceStatus {
    Ok,
    /// NVML answered `GPU_IS_LOST` (fell off the bus) or the handle could not be obtained.
    Lost,
}

/// One device in one pass.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceSample {
    pub info: Arc<DeviceInfo>,
    pub status: DeviceStatus,
    /// The scalar fields (see [`DEVICE_FIELDS`](crate::schema::DEVICE_FIELDS)).
    #[serde(flatten)]
    pub fields: FieldValues,
    /// Active clock throttle reasons (`nvmlClocksThrottleReason*` bits).
    pub throttle_reasons: Option<u64>,
    /// GPM activity since the previous tick (Hopper and newer); all `None` elsewhere.
    pub gpm: GpmActivity,
    /// Row remapper state (Ampere and newer).
    pub remapped_rows: Option<RemappedRows>,
    /// Time each performance policy held the clocks down since the driver loaded.
    pub violation: Option<ViolationTimes>,
    /// NVLink links in link order; empty on a GPU without NVLink.
    pub nvlink: Vec<NvLinkSample>,
    /// The MIG devices of a GPU in MIG mode, in NVML's MIG index order; empty otherwise.
    pub mig_instances: Vec<MigInstanceSample>,
}

/// One NVLink link in one pass. Counters are the driver's, since it loaded (or since the
/// counters were last reset); `None` where the device does not give the field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NvLinkSample {
    /// Link number, 0 to `NVML_NVLINK_MAX_LINKS - 1`.
    pub link: u32,
    /// `nvmlDeviceGetNvLinkState`: the link is up.
    pub active: Option<bool>,
    /// Data bytes sent and received (`NVLINK_THROUGHPUT_DATA_TX/RX`, KiB → bytes).
    pub tx_bytes_total: Option<u64>,
    pub rx_bytes_total: Option<u64>,
    /// Flit CRC errors (`NVLINK_ERROR_DL_CRC`).
    pub crc_flit_errors: Option<u64>,
    /// Data CRC errors (`NVLINK_CRC_DATA_ERROR_COUNT_Ln`, links 0–11, pre-Hopper).
    pub crc_data_errors: Option<u64>,
    /// Replays after a CRC error (`NVLINK_ERROR_DL_REPLAY`).
    pub replay_errors: Option<u64>,
    /// Link recoveries (`NVLINK_ERROR_DL_RECOVERY`).
    pub recovery_errors: Option<u64>,
}

/// Facts about a MIG device (one compute instance inside one GPU instance) that do not change
/// while the instance exists; read once per instance and cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigInstanceInfo {
    /// `MIG-…` UUID; the instance's `hw.id`.
    pub uuid: String,
    /// What NVML's name call returns on the MIG handle, e.g. `NVIDIA H100 80GB HBM3 MIG 3g.40gb`.
    pub name: String,
    /// The parent GPU's `GPU-…` UUID (`hw.parent`).
    pub parent_uuid: String,
    /// The parent GPU's NVML index.
    pub parent_index: u32,
    /// Position in the parent's MIG device list (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub mig_index: u32,
    /// `nvmlDeviceGetGpuInstanceId`.
    pub gpu_instance_id: u32,
    /// `nvmlDeviceGetComputeInstanceId`.
    pub compute_instance_id: u32,
}

impl MigInstanceInfo {
    /// The MIG profile, e.g. `3g.40gb` (see [`mig_profile`]).
    pub(crate) fn profile(&self) -> &str {
        mig_profile(&self.name)
    }
}

/// The MIG profile in NVML's name of a MIG device, e.g. `3g.40gb`: NVML names a MIG device
/// `"<GPU name> MIG <profile>"` (nvidia-smi and dcgm-exporter's `GPU_I_PROFILE` show the same);
/// the whole name when it does not follow that form.
pub(crate) fn mig_profile(name: &str) -> &str {
    name.rsplit_once("MIG ").map_or(name, |(_, p)| p)
}

/// One MIG device in one pass. NVML gives a MIG handle no utilisation, clocks, power or
/// temperature (those belong to the parent GPU): memory and GPM are what it has of its own.
#[derive(Debug, Clone, Serialize)]
pub struct MigInstanceSample {
    pub info: Arc<MigInstanceInfo>,
    /// The instance's memory slice, as the memory call on the MIG handle reports it.
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    /// GPM activity of the instance's GPU instance (`nvmlGpmMigSampleGet` on the parent); two
    /// compute instances of one GPU instance show the same activity.
    pub gpm: GpmActivity,
}

/// The MIG device a process runs in, from the instance ids NVML's process list gives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ProcessMig {
    /// The `MIG-…` UUID of the MIG device with these ids; the `hw.id` of the process's points.
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// Row remapper state (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed: the memory can no longer be repaired.
    pub failure: bool,
}

/// Violation time per `nvmlPerfPolicyType_t`, nanoseconds, in the order of
/// `sampling::health::VIOLATION_POLICIES`; `None` where the device does not report the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ViolationTimes {
    pub nanoseconds: [Option<u64>; 8],
}

impl DeviceSample {
    /// A field's value this tick.
    pub(crate) fn get(&self, field: DeviceField) -> Option<f64> {
        self.fields.get(field)
    }

    /// A whole field's value this tick (bytes, counts, MHz), as the library API
    /// (`gpulse::otel`) reports it.
    #[cfg(feature = "otel-sdk")]
    pub(crate) fn get_u64(&self, field: DeviceField) -> Option<u64> {
        self.fields.get(field).map(|v| v.round().max(0.0) as u64)
    }

    /// Sets a field's value.
    pub fn set(&mut self, field: DeviceField, value: Option<f64>) {
        self.fields.set(field, value);
    }

    /// A sample carrying only the identity of the device (and its static memory total),
    /// everything else unknown.
    pub fn empty(info: Arc<DeviceInfo>, status: DeviceStatus) -> Self {
        let mut fields = FieldValues::default();
        fields.set(
            DeviceField::MemoryTotal,
            info.memory_total_bytes.map(|b| b as f64),
        );
        Self {
            info,
            status,
            fields,
            throttle_reasons: None,
            gpm: GpmActivity::default(),
            remapped_rows: None,
            violation: None,
            nvlink: Vec::new(),
            mig_instances: Vec::new(),
        }
    }
}

/// GPM activity of one device over the interval between two GPM samples, one ratio (0–1) per
/// [`GpmField`] (see [`GPM_FIELDS`] for what each measures); `None`
/// when the device does not give the metric. Serialises as the report keys.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpmActivity([Option<f64>; GPM_FIELD_COUNT]);

impl GpmActivity {
    pub(crate) fn get(&self, field: GpmField) -> Option<f64> {
        self.0[field as usize]
    }

    pub(crate) fn set(&mut self, field: GpmField, value: Option<f64>) {
        self.0[field as usize] = value;
    }

    /// Whether any metric has a value.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The activity with these values, the other fields unknown (for the unit tests of the
    /// stages that read it).
    #[cfg(test)]
    pub(crate) fn of<const N: usize>(values: [(GpmField, f64); N]) -> Self {
        let mut activity = Self::default();
        for (field, value) in values {
            activity.set(field, Some(value));
        }
        activity
    }
}

impl Serialize for GpmActivity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_keyed(serializer, GPM_FIELDS.iter().map(|s| s.key), &self.0)
    }
}

/// How a process uses a device, from which NVML list it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    Compute,
    Graphics,
    /// Listed by both the compute and the graphics lists.
    ComputeAndGraphics,
}

/// One process on one device in one pass. A process using two GPUs appears twice.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessSample {
    /// Host PID, as NVML reports it.
    pub pid: u32,
    pub device_index: u32,
    pub device_uuid: String,
    pub kind: ProcessKind,
    /// `None` when NVML reports the value as not available (e.g. under some virtualisation).
    pub gpu_memory_bytes: Option<u64>,
    /// Ratios from `nvmlDeviceGetProcessUtilization`, `None` when the device gives none for it.
    pub sm_utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    pub encoder_utilization: Option<f64>,
    pub decoder_utilization: Option<f64>,
    /// The MIG device the process runs in, when its GPU is in MIG mode and NVML names the
    /// instance; `device_uuid` stays the parent GPU's.
    pub mig: Option<ProcessMig>,
}

/// An XID error the driver reported through an NVML event set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct XidEvent {
    #[serde(with = "unix_nanos")]
    pub at: SystemTime,
    pub device_uuid: String,
    pub device_index: u32,
    pub xid: u64,
}

/// Serialises a `SystemTime` as integer nanoseconds since the Unix epoch.
pub(crate) mod unix_nanos {
    use std::time::{SystemTime, UNIX_EPOCH};

    use serde::Serializer;

    pub(crate) fn serialize<S: Serializer>(
        at: &SystemTime,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(to_nanos(*at))
    }

    /// Nanoseconds since the epoch; 0 for a time before it.
    pub(crate) fn to_nanos(at: SystemTime) -> u64 {
        at.duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}
