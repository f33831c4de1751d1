//! The scenario file as written: the serde types TOML deserialises into, with every key a
//! scenario may set, `deny_unknown_fields` so a misspelt key is an error at its line, and the
//! names users write for architectures, brands, compute modes, event and process kinds and fault
//! kinds. Nothing here checks values or applies defaults; the sibling modules compile these types
//! into the simulation's model.

use serde::Deserialize;
use toml::Spanned;

use super::hardware;
use crate::abi;
use crate::signal::Signal;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    #[serde(default)]
    pub(super) driver: RawDriver,
    #[serde(default)]
    pub(super) clock: RawClock,
    #[serde(default, rename = "device")]
    pub(super) devices: Vec<Spanned<RawDevice>>,
    #[serde(default, rename = "event")]
    pub(super) events: Vec<Spanned<RawEvent>>,
    #[serde(default, rename = "fault")]
    pub(super) faults: Vec<Spanned<RawFault>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDriver {
    pub(super) version: Option<String>,
    pub(super) nvml_version: Option<String>,
    pub(super) cuda_version: Option<Spanned<CudaVersion>>,
    pub(super) process_sample_period_ms: Option<f64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum CudaVersion {
    Number(i64),
    Text(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClock {
    pub(super) time_scale: Option<f64>,
    pub(super) start_offset_s: Option<f64>,
    pub(super) freeze_at_s: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDevice {
    pub(super) count: Option<u32>,
    pub(super) name: Option<String>,
    pub(super) uuid: Option<String>,
    pub(super) pci_bus_id: Option<String>,
    pub(super) serial: Option<String>,
    pub(super) minor: Option<u32>,
    pub(super) vbios_version: Option<String>,
    pub(super) pci_device_id: Option<u32>,
    pub(super) pci_subsystem_id: Option<u32>,
    pub(super) memory_total_mib: Option<f64>,
    pub(super) memory_reserved_mib: Option<f64>,
    pub(super) bar1_total_mib: Option<f64>,
    pub(super) bar1_used_mib: Option<f64>,
    pub(super) power_limit_w: Option<f64>,
    pub(super) default_power_limit_w: Option<f64>,
    pub(super) min_power_limit_w: Option<f64>,
    pub(super) max_power_limit_w: Option<f64>,
    pub(super) energy_start_j: Option<f64>,
    pub(super) max_clocks_mhz: Option<RawClocks>,
    pub(super) fans: Option<u32>,
    pub(super) ecc: Option<bool>,
    pub(super) persistence: Option<bool>,
    pub(super) mig: Option<bool>,
    pub(super) compute_capability: Option<Spanned<String>>,
    pub(super) architecture: Option<Architecture>,
    pub(super) brand: Option<Brand>,
    pub(super) compute_mode: Option<ComputeMode>,
    pub(super) supported_throttle_reasons: Option<u64>,
    pub(super) supported_events: Option<Vec<EventKind>>,
    pub(super) pcie_generation: Option<u32>,
    pub(super) pcie_max_generation: Option<u32>,
    pub(super) pcie_width: Option<u32>,
    pub(super) pcie_max_width: Option<u32>,
    pub(super) slowdown_temp_c: Option<u32>,
    pub(super) shutdown_temp_c: Option<u32>,
    pub(super) retired_pages: Option<RawRetired>,
    pub(super) remapped_rows: Option<RawRemapped>,
    pub(super) gpm: Option<hardware::RawGpm>,
    pub(super) nvlink: Option<hardware::RawNvLink>,
    pub(super) violation: Option<hardware::RawViolation>,
    #[serde(default, rename = "mig_instance")]
    pub(super) mig_instances: Vec<hardware::RawMig>,
    #[serde(default)]
    pub(super) signals: RawDeviceSignals,
    #[serde(default, rename = "process")]
    pub(super) processes: Vec<Spanned<RawProcess>>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClocks {
    pub(super) graphics: Option<u32>,
    pub(super) sm: Option<u32>,
    pub(super) mem: Option<u32>,
    pub(super) video: Option<u32>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetired {
    #[serde(default)]
    pub(super) single_bit: u32,
    #[serde(default)]
    pub(super) double_bit: u32,
    #[serde(default)]
    pub(super) pending: bool,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRemapped {
    #[serde(default)]
    pub(super) corrected: u32,
    #[serde(default)]
    pub(super) uncorrected: u32,
    #[serde(default)]
    pub(super) pending: bool,
    #[serde(default)]
    pub(super) failure: bool,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeviceSignals {
    pub(super) gpu_util: Option<Signal>,
    pub(super) mem_util: Option<Signal>,
    pub(super) encoder_util: Option<Signal>,
    pub(super) decoder_util: Option<Signal>,
    pub(super) memory_used_mib: Option<Signal>,
    pub(super) temperature_c: Option<Signal>,
    pub(super) memory_temperature_c: Option<Signal>,
    pub(super) power_w: Option<Spanned<Signal>>,
    pub(super) clock_graphics_mhz: Option<Signal>,
    pub(super) clock_sm_mhz: Option<Signal>,
    pub(super) clock_mem_mhz: Option<Signal>,
    pub(super) clock_video_mhz: Option<Signal>,
    pub(super) fan_percent: Option<Signal>,
    pub(super) pcie_tx_kbps: Option<Signal>,
    pub(super) pcie_rx_kbps: Option<Signal>,
    pub(super) throttle_reasons: Option<Signal>,
    pub(super) ecc_corrected: Option<Signal>,
    pub(super) ecc_uncorrected: Option<Signal>,
    pub(super) pstate: Option<Signal>,
    pub(super) pcie_replays: Option<Signal>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum Brand {
    Unknown,
    Quadro,
    Tesla,
    Nvs,
    Grid,
    Geforce,
    Titan,
    NvidiaRtx,
    Nvidia,
    GeforceRtx,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum ComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum EventKind {
    Xid,
    SingleBitEcc,
    DoubleBitEcc,
    Pstate,
    Clock,
    PowerSource,
}

impl EventKind {
    pub(super) fn bits(self) -> u64 {
        (match self {
            EventKind::Xid => abi::nvmlEventTypeXidCriticalError,
            EventKind::SingleBitEcc => abi::nvmlEventTypeSingleBitEccError,
            EventKind::DoubleBitEcc => abi::nvmlEventTypeDoubleBitEccError,
            EventKind::Pstate => abi::nvmlEventTypePState,
            EventKind::Clock => abi::nvmlEventTypeClock,
            EventKind::PowerSource => abi::nvmlEventTypePowerSourceChange,
        }) as u64
    }
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum ProcessKind {
    Compute,
    Graphics,
    #[serde(rename = "compute+graphics")]
    ComputeGraphics,
    Mps,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProcess {
    pub(super) pid: Option<u32>,
    pub(super) pid_env: Option<String>,
    pub(super) pids_env: Option<String>,
    pub(super) count: Option<u32>,
    pub(super) name: Option<String>,
    pub(super) kind: Option<ProcessKind>,
    pub(super) memory_used_mib: Option<Signal>,
    pub(super) sm_util: Option<Signal>,
    pub(super) mem_util: Option<Signal>,
    pub(super) enc_util: Option<Signal>,
    pub(super) dec_util: Option<Signal>,
    pub(super) active_from_s: Option<f64>,
    pub(super) active_until_s: Option<f64>,
    pub(super) gpu_instance_id: Option<u32>,
    pub(super) compute_instance_id: Option<u32>,
    /// Listed only while the PID is a live process.
    #[serde(default)]
    pub(super) while_alive: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvent {
    pub(super) at_s: f64,
    pub(super) device: u32,
    #[serde(rename = "type", default = "default_event_kind")]
    pub(super) kind: EventKind,
    #[serde(alias = "xid", default)]
    pub(super) data: u64,
}

pub(super) fn default_event_kind() -> EventKind {
    EventKind::Xid
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub(super) enum FaultKind {
    Error,
    GpuLost,
    Slow,
    InitError,
    DriverGone,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub(super) kind: FaultKind,
    pub(super) device: Option<u32>,
    pub(super) devices: Option<Vec<u32>>,
    pub(super) field: Option<String>,
    pub(super) function: Option<String>,
    pub(super) error: Option<String>,
    pub(super) from_s: Option<f64>,
    pub(super) until_s: Option<f64>,
    pub(super) delay_ms: Option<f64>,
    pub(super) attempts: Option<u32>,
}
