//! Leaf helpers every NVML reader of sampling shares (the device fields, GPM, MIG, NVLink, and
//! the benchmark floor): the one place each schema [`NvmlCall`] is made ([`read_call`]), the
//! names of the per-device calls a device may not give ([`DeviceCall`]) and which errors say so, a
//! short name for each NVML error, for counting; the memory call with its fallback to the v1
//! call; and the unit conversions NVML's integers need. Depends on nothing else in sampling, so
//! the readers depend on it and not on each other.

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};

use crate::schema::{NvmlCall, NvmlFieldId};

/// Any NVML call sampling makes per device per tick: a schema [`NvmlCall`] (the device field
/// table's calls only), the field-values call or one of its ids, or a call outside the table
/// (throttle reasons, processes, ...). The key under which a device's absent calls are
/// remembered (and warned of once per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DeviceCall {
    /// A call of the schema's device field table.
    Field(NvmlCall),
    /// The one `nvmlDeviceGetFieldValues` call reading a device's field-id rows.
    FieldValues,
    /// One field id of that call (a device may not give one and give the others).
    FieldId(NvmlFieldId),
    Throttle,
    ComputeProcesses,
    GraphicsProcesses,
    ProcessUtilization,
    RemappedRows,
    Violation,
}

impl std::fmt::Display for DeviceCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceCall::Field(call) => write!(f, "{call}"),
            DeviceCall::FieldValues => f.write_str("nvmlDeviceGetFieldValues"),
            DeviceCall::FieldId(id) => write!(f, "{id}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// Whether `error` says the call will never answer on this device: the device does not give it,
/// gpulse may not read it, or the library lacks the function (an older driver, another
/// implementation of the header). Such a call is not made again.
pub(crate) fn is_absent(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::NotSupported
            | NvmlError::NoPermission
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
    )
}

/// The most members a schema call's answer has.
pub(crate) const MAX_MEMBERS: usize = 4;

/// The answer of one schema call as NVML gives it (before the schema's scale), one number per
/// member in [`NvmlCall::members`] order; `None` for a member this library does not give.
pub(crate) type Answer = [Option<f64>; MAX_MEMBERS];

/// Whether `call` is made on a device with `fans` fans: the fan call is not made on a board
/// without fans (datacenter boards), which has no fan speed to give.
pub(crate) fn applies(call: NvmlCall, fans: u32) -> bool {
    call != NvmlCall::FanSpeeds || fans > 0
}

/// Makes `call` on `device` (see [`applies`]). `fans` is the device's fan count (the fan call is made once per
/// fan, and the answer is their mean); `NVML_PSTATE_UNKNOWN` answers nothing.
pub(crate) fn read_call(
    nvml: &Nvml,
    device: &Device,
    call: NvmlCall,
    fans: u32,
) -> Result<Answer, NvmlError> {
    let one = |v: f64| [Some(v), None, None, None];
    let u32_one = |r: Result<u32, NvmlError>| r.map(|v| one(f64::from(v)));
    match call {
        NvmlCall::MemoryInfo => memory_info(nvml, device).map(|m| {
            [
                Some(m.total as f64),
                Some(m.used as f64),
                Some(m.free as f64),
                m.reserved.map(|b| b as f64),
            ]
        }),
        NvmlCall::Bar1MemoryInfo => device.bar1_memory_info().map(|m| {
            [
                Some(m.total as f64),
                Some(m.used as f64),
                Some(m.free as f64),
                None,
            ]
        }),
        NvmlCall::UtilizationRates => device.utilization_rates().map(|u| {
            [
                Some(f64::from(u.gpu)),
                Some(f64::from(u.memory)),
                None,
                None,
            ]
        }),
        NvmlCall::EncoderUtilization => {
            u32_one(device.encoder_utilization().map(|u| u.utilization))
        }
        NvmlCall::DecoderUtilization => {
            u32_one(device.decoder_utilization().map(|u| u.utilization))
        }
        NvmlCall::GpuTemperature => u32_one(device.temperature(TemperatureSensor::Gpu)),
        NvmlCall::PowerUsage => u32_one(device.power_usage()),
        NvmlCall::EnforcedPowerLimit => u32_one(device.enforced_power_limit()),
        NvmlCall::TotalEnergyConsumption => {
            device.total_energy_consumption().map(|mj| one(mj as f64))
        }
        NvmlCall::SmClock => u32_one(device.clock_info(Clock::SM)),
        NvmlCall::MemoryClock => u32_one(device.clock_info(Clock::Memory)),
        NvmlCall::GraphicsClock => u32_one(device.clock_info(Clock::Graphics)),
        NvmlCall::FanSpeeds => {
            let mut total = 0u32;
            for fan in 0..fans {
                total += device.fan_speed(fan)?;
            }
            Ok(one(f64::from(total) / f64::from(fans.max(1))))
        }
        NvmlCall::PcieTxThroughput => u32_one(device.pcie_throughput(PcieUtilCounter::Send)),
        NvmlCall::PcieRxThroughput => u32_one(device.pcie_throughput(PcieUtilCounter::Receive)),
        NvmlCall::CorrectedEccErrors => device
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)
            .map(|n| one(n as f64)),
        NvmlCall::UncorrectedEccErrors => device
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .map(|n| one(n as f64)),
        NvmlCall::PerformanceState => device.performance_state().map(|p| {
            // NVML's `NVML_PSTATE_UNKNOWN` is 32; anything above 15 is not a P-state.
            let raw = p.as_c();
            [(raw <= 15).then_some(f64::from(raw)), None, None, None]
        }),
        NvmlCall::PcieReplayCounter => u32_one(device.pcie_replay_counter()),
        NvmlCall::CurrPcieLinkGeneration => u32_one(device.current_pcie_link_gen()),
        NvmlCall::CurrPcieLinkWidth => u32_one(device.current_pcie_link_width()),
    }
}

/// The field ids of `ids` a device has not said it does not give (`absent`): what one tick asks
/// in its `nvmlDeviceGetFieldValues` call, none when the list is empty.
pub(crate) fn field_id_batch(
    ids: impl IntoIterator<Item = NvmlFieldId>,
    absent: impl Fn(NvmlFieldId) -> bool,
) -> Vec<NvmlFieldId> {
    ids.into_iter().filter(|id| !absent(*id)).collect()
}

/// Reads `ids` in one `nvmlDeviceGetFieldValues` call (`scopeId` 0, through nvml-wrapper's
/// `nvmlFieldValue_t`): the call's own error, else each value in `ids` order, or the error of
/// that value's own `nvmlReturn` (`NVML_ERROR_NOT_SUPPORTED` for a field the device lacks),
/// which leaves only that field absent.
pub(crate) fn read_field_values(
    device: &Device,
    ids: &[NvmlFieldId],
) -> Result<Vec<Result<f64, NvmlError>>, NvmlError> {
    let request: Vec<FieldId> = ids.iter().map(|id| FieldId(id.id())).collect();
    let samples = device.field_values_for(&request)?;
    Ok(samples
        .into_iter()
        .map(|sample| {
            sample.and_then(|s| s.value).map(|value| match value {
                SampleValue::F64(v) => v,
                SampleValue::U32(v) => f64::from(v),
                SampleValue::U64(v) => v as f64,
                SampleValue::I64(v) => v as f64,
            })
        })
        .collect())
}

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
