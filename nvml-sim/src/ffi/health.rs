//! Clock and link health: violation timers per performance policy and the PCIe replay counter.
//! (Row remapping and retired pages are in [`super::device`].)

use std::os::raw::c_uint;

use super::{nvml_body, out, to_u32};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::runtime;

/// Cumulative time (ns) the policy held clocks below what was asked, with the CPU timestamp
/// (µs) it refers to. An unknown policy is `NVML_ERROR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetViolationStatus(
    device: nvmlDevice_t,
    perfPolicyType: abi::nvmlPerfPolicyType_t,
    violTime: *mut abi::nvmlViolationTime_t,
) -> Ret {
    nvml_body!({
        let (sim, d, t) = runtime::device(Api::nvmlDeviceGetViolationStatus, device)?;
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
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetPcieReplayCounter, device)?;
        *out(value)? = to_u32(d.hw.pcie_replays.value(t), u32::MAX);
        Ok(())
    })
}
