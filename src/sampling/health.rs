//! Memory and clock health counters of a device, read each tick: row remapping
//! (`nvmlDeviceGetRemappedRows`, which nvml-wrapper 0.13 does not wrap), PCIe replays, and the
//! time each performance policy held the clocks down (`nvmlDeviceGetViolationStatus`).

use nvml_wrapper::enum_wrappers::device::PerformancePolicy;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};

use super::model::{RemappedRows, ViolationTimes};

/// Row remapper state of a device (Ampere and newer).
pub(crate) fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle comes from a live `Device` borrowed from `nvml`, and the four
    // out-pointers are valid, aligned locals that outlive the call.
    let code = unsafe {
        sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    nvml_try(code)?;
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// `nvmlPerfPolicyType_t` values gpulse reads, with the names it exports them under.
pub(crate) const VIOLATION_POLICIES: [(PerformancePolicy, &str); 8] = [
    (PerformancePolicy::Power, "power"),
    (PerformancePolicy::Thermal, "thermal"),
    (PerformancePolicy::SyncBoost, "sync_boost"),
    (PerformancePolicy::BoardLimit, "board_limit"),
    (PerformancePolicy::LowUtilization, "low_utilization"),
    (PerformancePolicy::Reliability, "reliability"),
    (PerformancePolicy::TotalAppClocks, "total_app_clocks"),
    (PerformancePolicy::TotalBaseClocks, "total_base_clocks"),
];

/// Violation time per policy, in the order of [`VIOLATION_POLICIES`]; a policy the device does
/// not report is `None`. Fails only when no policy answered.
pub(crate) fn violation_times(device: &Device<'_>) -> Result<ViolationTimes, NvmlError> {
    let mut out = ViolationTimes::default();
    let mut first_error = None;
    for (i, (policy, _)) in VIOLATION_POLICIES.iter().enumerate() {
        match device.violation_status(*policy) {
            Ok(v) => out.nanoseconds[i] = Some(v.violation_time),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if out.nanoseconds.iter().all(Option::is_none) => Err(e),
        _ => Ok(out),
    }
}
