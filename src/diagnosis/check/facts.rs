//! What `gpulse check` knows about the node: `HealthFacts`, read from NVML by
//! `collect::collect_health_facts` or built by hand in tests. Every field read from a device is
//! a `Fact`, which keeps "not supported" apart from "could not be read" and from a value.

use serde::Serialize;

/// One value read from NVML.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", content = "value", rename_all = "snake_case")]
pub enum Fact<T> {
    Known(T),
    /// The device or driver does not have this (NVML `NotSupported`, or the driver lacks the
    /// function).
    NotSupported,
    /// Reading it failed; the NVML error as text.
    Unavailable(String),
}

impl<T> Fact<T> {
    pub(crate) fn known(&self) -> Option<&T> {
        match self {
            Fact::Known(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Fact<U> {
        match self {
            Fact::Known(v) => Fact::Known(f(v)),
            Fact::NotSupported => Fact::NotSupported,
            Fact::Unavailable(e) => Fact::Unavailable(e),
        }
    }
}

/// ECC mode now and after the next reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EccMode {
    pub current: bool,
    pub pending: bool,
}

/// MIG mode now and after the next GPU reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// Device memory (`nvmlMemory_v2_t`), bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryFacts {
    pub total: u64,
    pub free: u64,
    pub used: u64,
    pub reserved: u64,
}

/// A process holding device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProcessHolding {
    pub pid: u32,
    /// `None` when NVML reports the amount as not available.
    pub used_bytes: Option<u64>,
}

/// Row remapper state (`nvmlDeviceGetRemappedRows`, Ampere and newer): the sampler's type, read
/// by the sampler's one call site (`sampling::health::remapped_rows`).
pub use crate::sampling::model::RemappedRows;

/// ECC error counters (uncorrectable unless named).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EccCounts {
    /// Since the last driver load.
    pub uncorrected_volatile: u64,
    /// Over the board's lifetime.
    pub uncorrected_aggregate: Option<u64>,
    pub corrected_volatile: Option<u64>,
}

/// Everything read about one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceFacts {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    /// The handle could not be obtained or the device is lost: nothing else was read.
    pub unreachable: Option<String>,
    pub persistence_mode: Fact<bool>,
    pub ecc_mode: Fact<EccMode>,
    pub ecc_errors: Fact<EccCounts>,
    /// Active `nvmlClocksThrottleReason*` bits.
    pub throttle_reasons: Fact<u64>,
    pub mig_mode: Fact<MigMode>,
    /// Compute and graphics processes, one entry per PID.
    pub processes: Fact<Vec<ProcessHolding>>,
    pub memory: Fact<MemoryFacts>,
    pub retired_pages_pending: Fact<bool>,
    pub remapped_rows: Fact<RemappedRows>,
}

impl DeviceFacts {
    /// A device whose handle could not be obtained.
    pub fn unreachable(index: u32, reason: impl Into<String>) -> Self {
        let r: String = reason.into();
        Self {
            index,
            uuid: None,
            name: None,
            unreachable: Some(r.clone()),
            persistence_mode: Fact::Unavailable(r.clone()),
            ecc_mode: Fact::Unavailable(r.clone()),
            ecc_errors: Fact::Unavailable(r.clone()),
            throttle_reasons: Fact::Unavailable(r.clone()),
            mig_mode: Fact::Unavailable(r.clone()),
            processes: Fact::Unavailable(r.clone()),
            memory: Fact::Unavailable(r.clone()),
            retired_pages_pending: Fact::Unavailable(r.clone()),
            remapped_rows: Fact::Unavailable(r),
        }
    }
}

/// What `gpulse check` evaluates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthFacts {
    /// Set when NVML could not be opened or could not count devices: nothing else was read.
    pub nvml_error: Option<String>,
    pub driver_version: Option<String>,
    /// `major.minor`.
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub device_count: Option<u32>,
    pub devices: Vec<DeviceFacts>,
}

impl HealthFacts {
    /// NVML could not be opened (or answered nothing); `reason` says why and what to do.
    pub(crate) fn nvml_unavailable(reason: impl Into<String>) -> Self {
        Self {
            nvml_error: Some(reason.into()),
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            device_count: None,
            devices: Vec::new(),
        }
    }
}
