//! Leaf helpers every NVML reader of sampling shares (the device fields, GPM, MIG, NVLink): a
//! short name for each NVML error, for counting; the memory call with its fallback to the v1
//! call; and the unit conversions NVML's integers need. Depends on nothing else in sampling, so
//! the readers depend on it and not on each other.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

/// Device memory, as `nvmlDeviceGetMemoryInfo_v2` gives it (with the driver's reserved share), or
/// from the v1 call on a library that predates v2 (drivers before R510), without that share.
pub(crate) struct Memory {
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
    pub(crate) reserved: Option<u64>,
}

pub(crate) fn memory_info(nvml: &Nvml, device: &Device) -> Result<Memory, NvmlError> {
    match device.memory_info() {
        Ok(m) => Ok(Memory {
            total: m.total,
            free: m.free,
            used: m.used,
            reserved: Some(m.reserved),
        }),
        Err(NvmlError::FailedToLoadSymbol(_)) => {
            let v1 = nvml
                .lib()
                .nvmlDeviceGetMemoryInfo
                .as_ref()
                .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
            let mut m = nvml_wrapper_sys::bindings::nvmlMemory_t {
                total: 0,
                free: 0,
                used: 0,
            };
            // SAFETY: the handle is live for the borrow of `device`, and `m` is a valid
            // `nvmlMemory_t` the call fills in.
            let rc = unsafe { v1(device.handle(), &mut m) };
            nvml_wrapper::error::nvml_try(rc)?;
            Ok(Memory {
                total: m.total,
                free: m.free,
                used: m.used,
                reserved: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// NVML's whole percent as a ratio.
pub(crate) fn percent(value: u32) -> f64 {
    f64::from(value) / 100.0
}

/// NVML's thousandths (mW, mJ) as units.
pub(crate) fn milli(value: u32) -> f64 {
    f64::from(value) / 1000.0
}

/// A short, stable name for an NVML error, for counting.
pub(crate) fn error_kind(error: &NvmlError) -> &'static str {
    match error {
        NvmlError::NotSupported => "not_supported",
        NvmlError::NoPermission => "no_permission",
        NvmlError::GpuLost => "gpu_lost",
        NvmlError::Timeout => "timeout",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::FailedToLoadSymbol(_) => "function_not_found",
        NvmlError::FunctionNotFound => "function_not_found",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::Unknown => "unknown",
        _ => "other",
    }
}
