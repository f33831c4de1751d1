//! NVLink link state (`nvmlDeviceGetNvLinkState`) and each link's counters at a time, which
//! `nvmlDeviceGetFieldValues` ([`super::field_values`]) reads by field id.

use super::{enable_state, nvml_fn, out};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::hardware::NvLink;
use crate::runtime;

nvml_fn! {
    fn nvmlDeviceGetNvLinkState(
        device: nvmlDevice_t,
        link: std::os::raw::c_uint,
        isActive: *mut abi::nvmlEnableState_t,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let a = out(isActive)?;
        let nv = d.hw.nvlink.as_ref().ok_or(abi::NOT_SUPPORTED)?;
        if link >= nv.links {
            return Err(abi::INVALID_ARGUMENT);
        }
        *a = enable_state(nv.is_up(link));
        Ok(())
    }
}

/// Which of a link's counters: its four error counters and its data throughput (KiB each way).
#[derive(Debug, Clone, Copy)]
pub(super) enum Counter {
    CrcFlit,
    CrcData,
    Replay,
    Recovery,
    TxKib,
    RxKib,
}

/// One counter of one link at `t` (an inactive link counts nothing).
pub(super) fn link_counter(nv: &NvLink, c: Counter, link: u32, t: f64) -> Result<u64, Ret> {
    if link >= nv.links {
        return Err(abi::INVALID_ARGUMENT);
    }
    if !nv.is_up(link) {
        return Ok(0);
    }
    let count = |s: &crate::signal::Signal| s.value(t).round().max(0.0) as u64;
    Ok(match c {
        Counter::CrcFlit => count(&nv.crc_flit),
        Counter::CrcData => count(&nv.crc_data),
        Counter::Replay => count(&nv.replay),
        Counter::Recovery => count(&nv.recovery),
        Counter::TxKib => nv.tx_kibps.integral(t.max(0.0)).max(0.0) as u64,
        Counter::RxKib => nv.rx_kibps.integral(t.max(0.0)).max(0.0) as u64,
    })
}
