//! NVLink: per-link state, traffic and error counters of each device, read once per tick.
//!
//! This module owns what that needs: how many links a device has (asked once per device, from
//! the `NVLINK_LINK_COUNT` field value, else by probing `nvmlDeviceGetNvLinkState`), and the one
//! batched `nvmlDeviceGetFieldValues` call per device per tick that reads every link's counters
//! with `scopeId` = the link. It calls the `-sys` symbol because nvml-wrapper 0.13's
//! `field_values_for` never sets `scopeId`, so through it every scoped field reads link 0.
//!
//! Per link it reads `NVLINK_THROUGHPUT_DATA_TX/RX` (KiB since the driver loaded), the data-link
//! error counters `NVLINK_ERROR_DL_CRC` / `_REPLAY` / `_RECOVERY` (scoped), and, for links 0–11
//! where NVML numbers them, the legacy `NVLINK_CRC_DATA_ERROR_COUNT_Ln` (data CRC errors, a
//! separate counter on pre-Hopper links; Hopper answers `NOT_SUPPORTED`). A field the device
//! does not give comes back as `None`. A GPU without NVLink (a PCIe board), or one whose driver
//! refuses the calls (`NOT_SUPPORTED`, `NO_PERMISSION`, a missing symbol: `calls::is_absent`, the
//! sampler's one rule for absence), gives no links: said once at info level, not asked again and
//! not counted as an NVML error.

use std::collections::HashMap;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6,
    NVML_FI_DEV_NVLINK_ERROR_DL_CRC, NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, NVML_FI_DEV_NVLINK_LINK_COUNT,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};
use nvml_wrapper_sys::bindings::{self as sys, nvmlFieldValue_t};

use super::calls::is_absent;
use super::model::NvLinkSample;

/// `NVML_NVLINK_MAX_LINKS` of nvml.h (R535 and newer): the most links NVML numbers.
pub(crate) const NVML_NVLINK_MAX_LINKS: u32 = 18;

/// What is known about a device's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Links {
    /// No NVLink (or no way to read it): not asked again.
    None,
    Count(u32),
}

/// What one NVLink read did, for the sampler's error counts.
#[derive(Debug, Default)]
pub(crate) struct NvLinkOutcome {
    /// One entry per link, link order; empty when the device has no NVLink.
    pub links: Vec<NvLinkSample>,
    /// The NVML error kind of a failed call, if one failed.
    pub error: Option<&'static str>,
    /// The device answered `GPU_IS_LOST`.
    pub lost: bool,
}

/// The NVLink state of every device of one NVML session.
#[derive(Debug, Default)]
pub(crate) struct NvLinkReader {
    links: HashMap<u32, Links>,
    /// Devices already warned about for an unexpected error.
    warned: std::collections::HashSet<u32>,
}

impl NvLinkReader {
    /// Reads every link of one device. The link count is learnt on the first call.
    pub(crate) fn read(&mut self, nvml: &Nvml, index: u32, device: &Device) -> NvLinkOutcome {
        let mut outcome = NvLinkOutcome::default();
        let count = match self.links.get(&index) {
            Some(Links::None) => return outcome,
            Some(Links::Count(n)) => *n,
            None => match link_count(nvml, device) {
                Ok(0) => {
                    self.no_nvlink(index, "NVML reports 0 links".into());
                    return outcome;
                }
                Ok(n) => {
                    tracing::debug!(gpu.index = index, "GPU {index} has {n} NVLink links");
                    self.links.insert(index, Links::Count(n));
                    n
                }
                Err(e) if is_absent(&e) => {
                    self.no_nvlink(index, e.to_string());
                    return outcome;
                }
                Err(e) => return self.fail(index, e, outcome),
            },
        };
        let mut values = request(count);
        if let Err(e) = field_values(nvml, device, &mut values) {
            if is_absent(&e) {
                self.no_nvlink(index, e.to_string());
                return outcome;
            }
            return self.fail(index, e, outcome);
        }
        outcome.links = (0..count)
            .map(|link| NvLinkSample {
                link,
                active: None,
                ..Default::default()
            })
            .collect();
        for v in &values {
            let Some(sample) = outcome.links.get_mut(link_of(v) as usize) else {
                continue;
            };
            let value = match nvml_try(v.nvmlReturn) {
                Ok(()) => decode(v),
                Err(NvmlError::GpuLost) => {
                    outcome.lost = true;
                    None
                }
                Err(_) => None,
            };
            match v.fieldId {
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => {
                    sample.tx_bytes_total = value.map(|kib| kib.saturating_mul(1024))
                }
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
                    sample.rx_bytes_total = value.map(|kib| kib.saturating_mul(1024))
                }
                NVML_FI_DEV_NVLINK_ERROR_DL_CRC => sample.crc_flit_errors = value,
                NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY => sample.replay_errors = value,
                NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY => sample.recovery_errors = value,
                _ => sample.crc_data_errors = value,
            }
        }
        for sample in &mut outcome.links {
            match device.link_wrapper_for(sample.link).is_active() {
                Ok(active) => sample.active = Some(active),
                Err(NvmlError::GpuLost) => outcome.lost = true,
                // The state of one link is one field: its absence leaves `active` unknown.
                Err(_) => {}
            }
        }
        outcome
    }

    fn no_nvlink(&mut self, index: u32, why: String) {
        self.links.insert(index, Links::None);
        tracing::info!(
            gpu.index = index,
            "GPU {index} gives no NVLink data ({why}; a PCIe board has no NVLink): NVLink \
             traffic, state and errors are left out"
        );
    }

    fn fail(&mut self, index: u32, error: NvmlError, mut outcome: NvLinkOutcome) -> NvLinkOutcome {
        outcome.error = Some(super::calls::error_kind(&error));
        match error {
            NvmlError::GpuLost => outcome.lost = true,
            e => {
                if self.warned.insert(index) {
                    tracing::warn!(
                        gpu.index = index,
                        "NVML failed to read NVLink on GPU {index}: {e}; NVLink traffic and \
                         errors are missing while it fails, gpulse keeps sampling and will not \
                         repeat this warning"
                    );
                }
            }
        }
        outcome
    }
}

/// The link whose counter a field value holds: its scope, or the link in a legacy id.
fn link_of(v: &nvmlFieldValue_t) -> u32 {
    match v.fieldId {
        id if (NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0
            ..NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 + 6)
            .contains(&id) =>
        {
            id - NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0
        }
        id if (NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6
            ..NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 + 6)
            .contains(&id) =>
        {
            id - NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 + 6
        }
        _ => v.scopeId,
    }
}

/// The legacy field id of link `link`'s data CRC counter (links 0–11).
fn crc_data_id(link: u32) -> Option<u32> {
    match link {
        0..=5 => Some(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 + link),
        6..=11 => Some(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 + link - 6),
        _ => None,
    }
}

/// The field values asked for a device with `links` links, all in one call.
fn request(links: u32) -> Vec<nvmlFieldValue_t> {
    const SCOPED: [u32; 5] = [
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    ];
    let mut out = Vec::with_capacity(links as usize * (SCOPED.len() + 1));
    for link in 0..links {
        for id in SCOPED {
            out.push(field(id, link));
        }
        if let Some(id) = crc_data_id(link) {
            out.push(field(id, 0));
        }
    }
    out
}

fn field(id: u32, scope: u32) -> nvmlFieldValue_t {
    // SAFETY: nvmlFieldValue_t is plain C data (integers and a union of numbers); all zeroes is
    // a valid value of it.
    let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    v.fieldId = id;
    v.scopeId = scope;
    v
}

/// `nvmlDeviceGetFieldValues` with the scope ids set, filling `values` in place.
fn field_values(
    nvml: &Nvml,
    device: &Device,
    values: &mut [nvmlFieldValue_t],
) -> Result<(), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: the handle is live for the borrow of `device`; `values` points at `count`
    // initialised `nvmlFieldValue_t` the call reads the ids of and fills in.
    nvml_try(unsafe { sym(device.handle(), count, values.as_mut_ptr()) })
}

/// A field's value as a count, by the type NVML says it has; `None` for a negative or
/// non-finite number.
fn decode(v: &nvmlFieldValue_t) -> Option<u64> {
    // SAFETY: each arm reads the union member `valueType` names, as nvml.h specifies.
    unsafe {
        match v.valueType {
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => {
                let d = v.value.dVal;
                (d.is_finite() && d >= 0.0).then_some(d as u64)
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(u64::from(v.value.uiVal)),
            // `c_ulong` is 64 bits on Linux but 32 on other targets.
            #[allow(clippy::unnecessary_cast)]
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(v.value.ulVal as u64),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(v.value.ullVal),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => {
                u64::try_from(v.value.sllVal).ok()
            }
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(v.value.siVal).ok(),
            sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => {
                Some(u64::from(v.value.usVal))
            }
            _ => None,
        }
    }
}

/// How many links the device has: the `NVLINK_LINK_COUNT` field, or, where the library does
/// not give it, the links `nvmlDeviceGetNvLinkState` answers for, counted from 0.
fn link_count(nvml: &Nvml, device: &Device) -> Result<u32, NvmlError> {
    let mut v = [field(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)];
    field_values(nvml, device, &mut v)?;
    if nvml_try(v[0].nvmlReturn).is_ok() {
        if let Some(n) = decode(&v[0]) {
            return Ok((n as u32).min(NVML_NVLINK_MAX_LINKS));
        }
    }
    let mut n = 0;
    while n < NVML_NVLINK_MAX_LINKS {
        match device.link_wrapper_for(n).is_active() {
            Ok(_) => n += 1,
            Err(e @ NvmlError::GpuLost) => return Err(e),
            Err(e) if n == 0 && !matches!(e, NvmlError::InvalidArg) => return Err(e),
            Err(_) => break,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_scopes_every_link_and_numbers_legacy_ids_by_link() {
        let r = request(14);
        // Five scoped fields per link, plus the data CRC id for links 0-11.
        assert_eq!(r.len(), 14 * 5 + 12);
        let scoped: Vec<u32> = r
            .iter()
            .filter(|v| v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)
            .map(|v| v.scopeId)
            .collect();
        assert_eq!(scoped, (0..14).collect::<Vec<_>>());
        let data: Vec<u32> = r
            .iter()
            .filter(|v| {
                ![
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                    NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
                    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                ]
                .contains(&v.fieldId)
            })
            .map(link_of)
            .collect();
        assert_eq!(data, (0..12).collect::<Vec<_>>());
        // nvml.h: CRC_DATA_ERROR_COUNT_L5 = 44, _L6 = 102, _L11 = 107.
        assert_eq!(crc_data_id(5), Some(44));
        assert_eq!(crc_data_id(6), Some(102));
        assert_eq!(crc_data_id(11), Some(107));
        assert_eq!(crc_data_id(12), None);
    }

    #[test]
    fn values_decode_by_their_declared_type() {
        let mut v = field(NVML_FI_DEV_NVLINK_LINK_COUNT, 0);
        v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
        v.value.uiVal = 4;
        assert_eq!(decode(&v), Some(4));
        v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v.value.ullVal = 1 << 40;
        assert_eq!(decode(&v), Some(1 << 40));
        v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG;
        v.value.sllVal = -1;
        assert_eq!(decode(&v), None, "a negative count is not a count");
        v.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE;
        v.value.dVal = 12.0;
        assert_eq!(decode(&v), Some(12));
        v.valueType = 99;
        assert_eq!(decode(&v), None);
    }
}
