//! Health counters: memory (ECC error counts, retired pages, remapped rows) and clocks and link
//! (violation timers per performance policy, the PCIe replay counter). The ECC mode itself is in
//! [`super::device`].

use std::os::raw::{c_uint, c_ulonglong};

use super::{enable_state, nvml_fn, out, to_u32};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::model::Device;
use crate::runtime;

nvml_fn! {
    /// Cumulative time (ns) the policy held clocks below what was asked, with the CPU timestamp
    /// (µs) it refers to. An unknown policy is `NVML_ERROR_INVALID_ARGUMENT`.
    fn nvmlDeviceGetViolationStatus(
        device: nvmlDevice_t,
        perfPolicyType: abi::nvmlPerfPolicyType_t,
        violTime: *mut abi::nvmlViolationTime_t,
    ) |api| {
        let (sim, d, t) = runtime::device(api, device)?;
        let v = out(violTime)?;
        let ns =
            d.hw.violations
                .time_ns(perfPolicyType, t)
                .ok_or(abi::INVALID_ARGUMENT)?;
        *v = abi::nvmlViolationTime_t {
            referenceTime: sim.clock.wall_us(t),
            violationTime: ns,
        };
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, value: *mut c_uint) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        *out(value)? = to_u32(d.hw.pcie_replays.value(t), u32::MAX);
        Ok(())
    }
}

nvml_fn! {
    /// Volatile and aggregate counters are the same signal here. ECC off: not supported.
    fn nvmlDeviceGetTotalEccErrors(
        device: nvmlDevice_t,
        errorType: abi::nvmlMemoryErrorType_t,
        counterType: abi::nvmlEccCounterType_t,
        eccCounts: *mut c_ulonglong,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(eccCounts)?;
        if counterType >= abi::nvmlEccCounterType_enum_NVML_ECC_COUNTER_TYPE_COUNT {
            return Err(abi::INVALID_ARGUMENT);
        }
        let s = match errorType {
            abi::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => {
                &d.signals.ecc_corrected
            }
            abi::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => {
                &d.signals.ecc_uncorrected
            }
            _ => return Err(abi::INVALID_ARGUMENT),
        };
        if !d.ecc {
            return Err(abi::NOT_SUPPORTED);
        }
        *slot = s.value(t).round().max(0.0) as u64;
        Ok(())
    }
}

/// Deterministic fake page addresses: one 4 KiB page per retired page, per cause.
fn retired_address(d: &Device, cause: u32, i: u32) -> u64 {
    0x10_0000_0000 + ((d.index as u64) << 32) + ((cause as u64) << 28) + (i as u64) * 4096
}

unsafe fn retired_pages(
    api: Api,
    device: nvmlDevice_t,
    cause: abi::nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), Ret> {
    let (sim, d, _) = runtime::device(api, device)?;
    let count = out(page_count)?;
    let n = match cause {
        abi::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            d.health.retired_single_bit
        }
        abi::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
            d.health.retired_double_bit
        }
        _ => return Err(abi::INVALID_ARGUMENT),
    };
    if addresses.is_null() || *count < n {
        let fits = n == 0;
        *count = n;
        return if fits {
            Ok(())
        } else {
            Err(abi::INSUFFICIENT_SIZE)
        };
    }
    for i in 0..n {
        *addresses.add(i as usize) = retired_address(d, cause, i);
        if !timestamps.is_null() {
            *timestamps.add(i as usize) = sim.clock.wall_us(0.0) / 1_000_000;
        }
    }
    *count = n;
    Ok(())
}

nvml_fn! {
    fn nvmlDeviceGetRetiredPages(
        device: nvmlDevice_t,
        cause: abi::nvmlPageRetirementCause_t,
        pageCount: *mut c_uint,
        addresses: *mut c_ulonglong,
    ) |api| {
        retired_pages(
            api,
            device,
            cause,
            pageCount,
            addresses,
            std::ptr::null_mut(),
        )
    }
}

nvml_fn! {
    fn nvmlDeviceGetRetiredPages_v2(
        device: nvmlDevice_t,
        cause: abi::nvmlPageRetirementCause_t,
        pageCount: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) |api| {
        retired_pages(
            api,
            device,
            cause,
            pageCount,
            addresses,
            timestamps,
        )
    }
}

nvml_fn! {
    fn nvmlDeviceGetRetiredPagesPendingStatus(
        device: nvmlDevice_t,
        isPending: *mut abi::nvmlEnableState_t,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        *out(isPending)? = enable_state(d.health.retired_pending);
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetRemappedRows(
        device: nvmlDevice_t,
        corrRows: *mut c_uint,
        uncRows: *mut c_uint,
        isPending: *mut c_uint,
        failureOccurred: *mut c_uint,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let (c, u, p, f) = (
            out(corrRows)?,
            out(uncRows)?,
            out(isPending)?,
            out(failureOccurred)?,
        );
        *c = d.health.remapped_corrected;
        *u = d.health.remapped_uncorrected;
        *p = d.health.remap_pending as c_uint;
        *f = d.health.remap_failure as c_uint;
        Ok(())
    }
}
