//! `nvmlDeviceGetFieldValues`, the field-id interface: every `NVML_FI_*` id the simulation
//! models is answered here, whatever it measures: the NVLink throughput and error counters per
//! link (`scopeId` = the link, or the legacy ids with the link in the id, and their totals), the
//! link count and state, the PCIe replay counter and the HBM temperature
//! (`NVML_FI_DEV_MEMORY_TEMP`, only where the scenario sets `memory_temperature_c`). Fields the
//! simulation does not model come back with their own `nvmlReturn` = `NVML_ERROR_NOT_SUPPORTED`;
//! the call itself succeeds, as the driver's does. The NVLink counters themselves are
//! [`super::nvlink`]'s.

use std::os::raw::c_int;

use super::nvlink::{link_counter, Counter};
use super::{nvml_fn, to_u32};
use crate::abi::field_id::*;
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::model::Device;
use crate::runtime;

/// The per-link error counters: (first field id of links 0–5, first of links 6–11, the
/// `_TOTAL` id, which counter).
const LINK_COUNTERS: [(u32, u32, u32, Counter); 4] = [
    (
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0,
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6,
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        Counter::CrcFlit,
    ),
    (
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        Counter::CrcData,
    ),
    (
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0,
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6,
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        Counter::Replay,
    ),
    (
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0,
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6,
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        Counter::Recovery,
    ),
];

/// A value of one field as (type, value).
enum Value {
    U32(u32),
    U64(u64),
}

/// One field of `d` at `t`: `id` the `NVML_FI_*` value, `scope` its `scopeId` (the link, where
/// the id is per link).
fn field(d: &Device, id: u32, scope: u32, t: f64) -> Result<Value, Ret> {
    if id == NVML_FI_DEV_PCIE_REPLAY_COUNTER {
        return Ok(Value::U32(to_u32(d.hw.pcie_replays.value(t), u32::MAX)));
    }
    if id == NVML_FI_DEV_MEMORY_TEMP {
        let temp = d.signals.memory_temperature_c.as_ref();
        return temp
            .map(|s| Value::U32(to_u32(s.value(t), 255)))
            .ok_or(abi::NOT_SUPPORTED);
    }
    let nv = d.hw.nvlink.as_ref();
    let need = || nv.ok_or(abi::NOT_SUPPORTED);
    match id {
        NVML_FI_DEV_NVLINK_LINK_COUNT => return Ok(Value::U32(need()?.links)),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => {
            return link_counter(need()?, Counter::TxKib, scope, t).map(Value::U64)
        }
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
            return link_counter(need()?, Counter::RxKib, scope, t).map(Value::U64)
        }
        NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY => {
            return link_counter(need()?, Counter::Replay, scope, t).map(Value::U64)
        }
        NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY => {
            return link_counter(need()?, Counter::Recovery, scope, t).map(Value::U64)
        }
        NVML_FI_DEV_NVLINK_ERROR_DL_CRC => {
            return link_counter(need()?, Counter::CrcFlit, scope, t).map(Value::U64)
        }
        NVML_FI_DEV_NVLINK_GET_STATE => {
            let nv = need()?;
            if scope >= nv.links {
                return Err(abi::INVALID_ARGUMENT);
            }
            return Ok(Value::U32(nv.is_up(scope) as u32));
        }
        _ => {}
    }
    // The legacy per-link ids (the link is in the id, scopeId is ignored) and their totals.
    for (l0, l6, total, c) in LINK_COUNTERS {
        let link = if (l0..l0 + 6).contains(&id) {
            id - l0
        } else if (l6..l6 + 6).contains(&id) {
            id - l6 + 6
        } else if id == total {
            let nv = need()?;
            let sum = (0..nv.links)
                .map(|l| link_counter(nv, c, l, t))
                .sum::<Result<u64, Ret>>()?;
            return Ok(Value::U64(sum));
        } else {
            continue;
        };
        let nv = need()?;
        if link >= nv.links {
            return Err(abi::NOT_SUPPORTED);
        }
        return link_counter(nv, c, link, t).map(Value::U64);
    }
    Err(abi::NOT_SUPPORTED)
}

nvml_fn! {
    /// Fills each `values[i]` for its `fieldId` and `scopeId`: `timestamp` (µs), `latencyUsec`,
    /// `valueType`, `nvmlReturn` and `value`.
    fn nvmlDeviceGetFieldValues(
        device: nvmlDevice_t,
        valuesCount: c_int,
        values: *mut abi::nvmlFieldValue_t,
    ) |api| {
        let (sim, d, t) = runtime::device(api, device)?;
        if values.is_null() || valuesCount <= 0 {
            return Err(abi::INVALID_ARGUMENT);
        }
        let stamp = sim.clock.wall_us(t) as i64;
        let values = std::slice::from_raw_parts_mut(values, valuesCount as usize);
        for v in values.iter_mut() {
            v.timestamp = stamp;
            v.latencyUsec = 0;
            match field(d, v.fieldId, v.scopeId, t) {
                Ok(Value::U32(x)) => {
                    v.valueType = abi::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    v.value.uiVal = x;
                    v.nvmlReturn = abi::SUCCESS;
                }
                Ok(Value::U64(x)) => {
                    v.valueType = abi::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    v.value.ullVal = x;
                    v.nvmlReturn = abi::SUCCESS;
                }
                Err(code) => {
                    v.valueType = abi::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    v.value.ullVal = 0;
                    v.nvmlReturn = code;
                }
            }
        }
        Ok(())
    }
}
