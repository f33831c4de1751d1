//! Per-device queries: identity (name, UUID, serial, PCI), memory, utilisation, temperature,
//! power and energy, clocks, fans, PCIe, throttle reasons, ECC and the fixed modes.

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

use super::{enable_state, fill_field, nvml_body, out, to_u32, write_str};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::model::{Device, Sim};
use crate::runtime::{self, Target};

/// A getter writing one value computed from the device and the time.
macro_rules! getter {
    ($(#[$m:meta])* $name:ident, $ty:ty, |$sim:pat_param, $dev:ident, $t:pat_param| $val:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, value: *mut $ty) -> Ret {
            nvml_body!({
                let ($sim, $dev, $t) = runtime::device(Api::$name, device)?;
                let slot = out(value)?;
                *slot = $val;
                Ok(())
            })
        }
    };
}

/// A getter writing a string into a caller buffer.
macro_rules! string_getter {
    ($name:ident, |$dev:ident| $val:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            buffer: *mut c_char,
            length: c_uint,
        ) -> Ret {
            nvml_body!({
                let (_, $dev, _) = runtime::device(Api::$name, device)?;
                write_str(buffer, length, $val)
            })
        }
    };
}

/// A string getter that also answers for MIG devices.
macro_rules! target_string_getter {
    ($name:ident, |$dev:ident| $gpu:expr, |$mig:ident| $of_mig:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            buffer: *mut c_char,
            length: c_uint,
        ) -> Ret {
            nvml_body!({
                let (_, target, _) = runtime::target(Api::$name, device)?;
                let s = match target {
                    Target::Gpu($dev) => $gpu,
                    Target::Mig(_, $mig) => $of_mig,
                };
                write_str(buffer, length, s)
            })
        }
    };
}

target_string_getter!(nvmlDeviceGetName, |d| &d.name, |m| &m.name);
target_string_getter!(nvmlDeviceGetUUID, |d| &d.uuid, |m| &m.uuid);
string_getter!(nvmlDeviceGetSerial, |d| &d.serial);
string_getter!(nvmlDeviceGetVbiosVersion, |d| &d.vbios_version);

getter!(nvmlDeviceGetIndex, c_uint, |_, d, _| d.index);
getter!(nvmlDeviceGetMinorNumber, c_uint, |_, d, _| d.minor);

fn pci_v3(d: &Device) -> abi::nvmlPciInfo_t {
    let mut p = abi::nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: d.domain,
        bus: d.bus,
        device: d.pci_device,
        pciDeviceId: d.pci_device_id,
        pciSubSystemId: d.pci_subsystem_id,
        busId: [0; 32],
    };
    fill_field(&mut p.busIdLegacy, &d.bus_id_legacy);
    fill_field(&mut p.busId, &d.bus_id);
    p
}

fn pci_v1(d: &Device) -> abi::PciInfoV1 {
    let mut p = abi::PciInfoV1 {
        bus_id: [0; 16],
        domain: d.domain,
        bus: d.bus,
        device: d.pci_device,
        pci_device_id: d.pci_device_id,
    };
    fill_field(&mut p.bus_id, &d.bus_id_legacy);
    p
}

getter!(nvmlDeviceGetPciInfo_v3, abi::nvmlPciInfo_t, |_, d, _| {
    pci_v3(d)
});
getter!(
    /// Writes only the v2 prefix (36 bytes) of the struct.
    nvmlDeviceGetPciInfo_v2, abi::PciInfoV2, |_, d, _| abi::PciInfoV2 {
        v1: pci_v1(d),
        pci_sub_system_id: d.pci_subsystem_id,
    }
);
getter!(
    /// Writes only the v1 prefix (32 bytes) of the struct.
    nvmlDeviceGetPciInfo, abi::PciInfoV1, |_, d, _| pci_v1(d)
);

/// Total, reserved and used bytes of a GPU or of a MIG device (whose memory is its own slice:
/// nothing reserved, used = its processes unless the scenario says otherwise).
fn memory_of(target: Target, t: f64) -> (u64, u64, u64) {
    match target {
        Target::Gpu(d) => (d.memory_total, d.memory_reserved, d.memory_used(t)),
        Target::Mig(d, m) => {
            let used = match &m.memory_used_mib {
                Some(s) => crate::model::mib_to_bytes(s.value(t)),
                None => d
                    .processes
                    .iter()
                    .filter(|p| {
                        p.active.contains(t)
                            && p.gpu_instance_id == m.gpu_instance_id
                            && p.compute_instance_id == m.compute_instance_id
                    })
                    .map(|p| p.memory_bytes(t))
                    .sum(),
            };
            (m.memory_total, 0, used.min(m.memory_total))
        }
    }
}

/// v1 semantics: `used` includes the reserved memory (`free = total - used`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut abi::nvmlMemory_t,
) -> Ret {
    nvml_body!({
        let (_, target, t) = runtime::target(Api::nvmlDeviceGetMemoryInfo, device)?;
        let m = out(memory)?;
        let (total, reserved, used) = memory_of(target, t);
        let used = used + reserved;
        *m = abi::nvmlMemory_t {
            total,
            free: total.saturating_sub(used),
            used,
        };
        Ok(())
    })
}

/// v2: `version` must be `NVML_STRUCT_VERSION(Memory, 2)`; `used` excludes `reserved`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut abi::nvmlMemory_v2_t,
) -> Ret {
    nvml_body!({
        let (_, target, t) = runtime::target(Api::nvmlDeviceGetMemoryInfo_v2, device)?;
        let m = out(memory)?;
        if m.version != abi::MEMORY_V2_VERSION {
            return Err(abi::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = memory_of(target, t);
        m.total = total;
        m.reserved = reserved;
        m.used = used;
        m.free = total.saturating_sub(reserved + used);
        Ok(())
    })
}

getter!(
    nvmlDeviceGetBAR1MemoryInfo,
    abi::nvmlBAR1Memory_t,
    |_, d, _| {
        abi::nvmlBAR1Memory_t {
            bar1Total: d.bar1_total,
            bar1Free: d.bar1_total - d.bar1_used,
            bar1Used: d.bar1_used,
        }
    }
);

getter!(
    nvmlDeviceGetUtilizationRates,
    abi::nvmlUtilization_t,
    |_, d, t| {
        abi::nvmlUtilization_t {
            gpu: to_u32(d.signals.gpu_util.value(t), 100),
            memory: to_u32(d.signals.mem_util.value(t), 100),
        }
    }
);

/// The sampling period the driver reports for encoder/decoder utilisation, in µs.
const CODEC_SAMPLING_US: c_uint = 167_000;

unsafe fn codec(
    api: Api,
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    period: *mut c_uint,
    pick: fn(&Device) -> &crate::signal::Signal,
) -> Result<(), Ret> {
    let (_, d, t) = runtime::device(api, device)?;
    let u = out(utilization)?;
    let p = out(period)?;
    *u = to_u32(pick(d).value(t), 100);
    *p = CODEC_SAMPLING_US;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> Ret {
    nvml_body!({
        codec(
            Api::nvmlDeviceGetEncoderUtilization,
            device,
            utilization,
            samplingPeriodUs,
            |d| &d.signals.encoder_util,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    samplingPeriodUs: *mut c_uint,
) -> Ret {
    nvml_body!({
        codec(
            Api::nvmlDeviceGetDecoderUtilization,
            device,
            utilization,
            samplingPeriodUs,
            |d| &d.signals.decoder_util,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: abi::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetTemperature, device)?;
        let slot = out(temp)?;
        if sensorType != abi::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(abi::INVALID_ARGUMENT);
        }
        *slot = to_u32(d.signals.temperature_c.value(t), 255);
        Ok(())
    })
}

/// The versioned form pynvml 13 prefers (`nvmlTemperature_v1_t`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: nvmlDevice_t,
    temperature: *mut abi::nvmlTemperature_v1_t,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetTemperatureV, device)?;
        let slot = out(temperature)?;
        if slot.version != abi::TEMPERATURE_V1_VERSION {
            return Err(abi::ARGUMENT_VERSION_MISMATCH);
        }
        if slot.sensorType != abi::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(abi::INVALID_ARGUMENT);
        }
        slot.temperature = d
            .signals
            .temperature_c
            .value(t)
            .round()
            .clamp(-273.0, 255.0) as c_int;
        Ok(())
    })
}

/// Shutdown (0), slowdown (1) and the GPU max-operating thresholds (3); others unsupported.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    thresholdType: abi::nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetTemperatureThreshold, device)?;
        let slot = out(temp)?;
        *slot = match thresholdType {
            0 => d.shutdown_temp_c,
            1 => d.slowdown_temp_c,
            3 => d.slowdown_temp_c.saturating_sub(2),
            x if x < abi::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_COUNT => {
                return Err(abi::NOT_SUPPORTED)
            }
            _ => return Err(abi::INVALID_ARGUMENT),
        };
        Ok(())
    })
}

getter!(nvmlDeviceGetPowerUsage, c_uint, |_, d, t| to_u32(
    d.signals.power_w.value(t) * 1000.0,
    u32::MAX
));
getter!(nvmlDeviceGetEnforcedPowerLimit, c_uint, |_, d, _| d
    .power_limit_mw);
getter!(nvmlDeviceGetPowerManagementLimit, c_uint, |_, d, _| d
    .power_limit_mw);
getter!(
    nvmlDeviceGetPowerManagementDefaultLimit,
    c_uint,
    |_, d, _| d.default_power_limit_mw
);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    minLimit: *mut c_uint,
    maxLimit: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetPowerManagementLimitConstraints, device)?;
        let lo = out(minLimit)?;
        let hi = out(maxLimit)?;
        *lo = d.min_power_limit_mw;
        *hi = d.max_power_limit_mw;
        Ok(())
    })
}

getter!(
    nvmlDeviceGetTotalEnergyConsumption,
    c_ulonglong,
    |_, d, t| d.energy_mj(t)
);

fn clock_index(clock_type: abi::nvmlClockType_t) -> Result<usize, Ret> {
    if clock_type < abi::nvmlClockType_enum_NVML_CLOCK_COUNT {
        Ok(clock_type as usize)
    } else {
        Err(abi::INVALID_ARGUMENT)
    }
}

fn current_clock(d: &Device, i: usize, t: f64) -> c_uint {
    to_u32(d.signals.clocks_mhz[i].value(t), d.max_clocks_mhz[i])
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    type_: abi::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetClockInfo, device)?;
        let slot = out(clock)?;
        *slot = current_clock(d, clock_index(type_)?, t);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    type_: abi::nvmlClockType_t,
    clock: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetMaxClockInfo, device)?;
        let slot = out(clock)?;
        *slot = d.max_clocks_mhz[clock_index(type_)?];
        Ok(())
    })
}

/// `NVML_CLOCK_ID_CURRENT` is the signal; the application targets and the boost maximum are
/// the device's maximum clock.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: nvmlDevice_t,
    clockType: abi::nvmlClockType_t,
    clockId: abi::nvmlClockId_t,
    clockMHz: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetClock, device)?;
        let slot = out(clockMHz)?;
        let i = clock_index(clockType)?;
        *slot = match clockId {
            abi::nvmlClockId_enum_NVML_CLOCK_ID_CURRENT => current_clock(d, i, t),
            abi::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_TARGET
            | abi::nvmlClockId_enum_NVML_CLOCK_ID_APP_CLOCK_DEFAULT
            | abi::nvmlClockId_enum_NVML_CLOCK_ID_CUSTOMER_BOOST_MAX => d.max_clocks_mhz[i],
            _ => return Err(abi::INVALID_ARGUMENT),
        };
        Ok(())
    })
}

getter!(nvmlDeviceGetNumFans, c_uint, |_, d, _| d.fans);

fn fan(d: &Device, fan: c_uint, t: f64) -> Result<c_uint, Ret> {
    if d.fans == 0 {
        return Err(abi::NOT_SUPPORTED);
    }
    if fan >= d.fans {
        return Err(abi::INVALID_ARGUMENT);
    }
    Ok(to_u32(d.signals.fan_percent.value(t), 100))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetFanSpeed, device)?;
        let slot = out(speed)?;
        *slot = fan(d, 0, t)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan_: c_uint,
    speed: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetFanSpeed_v2, device)?;
        let slot = out(speed)?;
        *slot = fan(d, fan_, t)?;
        Ok(())
    })
}

/// KB/s over the driver's 20 ms window.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: abi::nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetPcieThroughput, device)?;
        let slot = out(value)?;
        let s = match counter {
            abi::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => &d.signals.pcie_tx_kbps,
            abi::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => &d.signals.pcie_rx_kbps,
            _ => return Err(abi::INVALID_ARGUMENT),
        };
        *slot = to_u32(s.value(t), u32::MAX);
        Ok(())
    })
}

getter!(nvmlDeviceGetCurrPcieLinkGeneration, c_uint, |_, d, _| d
    .pcie_gen
    .0);
getter!(nvmlDeviceGetMaxPcieLinkGeneration, c_uint, |_, d, _| d
    .pcie_gen
    .1);
getter!(nvmlDeviceGetCurrPcieLinkWidth, c_uint, |_, d, _| d
    .pcie_width
    .0);
getter!(nvmlDeviceGetMaxPcieLinkWidth, c_uint, |_, d, _| d
    .pcie_width
    .1);

fn throttle(d: &Device, t: f64) -> c_ulonglong {
    let v = d.signals.throttle_reasons.value(t).round();
    (v.clamp(0.0, u64::MAX as f64) as u64) & d.supported_throttle_reasons
}

getter!(
    nvmlDeviceGetCurrentClocksThrottleReasons,
    c_ulonglong,
    |_, d, t| throttle(d, t)
);
getter!(
    nvmlDeviceGetCurrentClocksEventReasons,
    c_ulonglong,
    |_, d, t| throttle(d, t)
);
getter!(
    nvmlDeviceGetSupportedClocksThrottleReasons,
    c_ulonglong,
    |_, d, _| d.supported_throttle_reasons
);
getter!(
    nvmlDeviceGetSupportedClocksEventReasons,
    c_ulonglong,
    |_, d, _| d.supported_throttle_reasons
);

/// Volatile and aggregate counters are the same signal here. ECC off: not supported.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    errorType: abi::nvmlMemoryErrorType_t,
    counterType: abi::nvmlEccCounterType_t,
    eccCounts: *mut c_ulonglong,
) -> Ret {
    nvml_body!({
        let (_, d, t) = runtime::device(Api::nvmlDeviceGetTotalEccErrors, device)?;
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
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut abi::nvmlEnableState_t,
    pending: *mut abi::nvmlEnableState_t,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetEccMode, device)?;
        let c = out(current)?;
        let p = out(pending)?;
        *c = enable_state(d.ecc);
        *p = enable_state(d.ecc);
        Ok(())
    })
}

fn pstate(_: &Sim, d: &Device, t: f64) -> abi::nvmlPstates_t {
    to_u32(d.signals.pstate.value(t), 15)
}

getter!(
    nvmlDeviceGetPerformanceState,
    abi::nvmlPstates_t,
    |s, d, t| pstate(s, d, t)
);
getter!(
    /// The deprecated name of `nvmlDeviceGetPerformanceState`.
    nvmlDeviceGetPowerState, abi::nvmlPstates_t, |s, d, t| pstate(s, d, t)
);
getter!(
    nvmlDeviceGetPersistenceMode,
    abi::nvmlEnableState_t,
    |_, d, _| enable_state(d.persistence)
);
getter!(
    nvmlDeviceGetComputeMode,
    abi::nvmlComputeMode_t,
    |_, d, _| d.compute_mode
);
getter!(
    nvmlDeviceGetArchitecture,
    abi::nvmlDeviceArchitecture_t,
    |_, d, _| d.architecture
);
getter!(nvmlDeviceGetBrand, abi::nvmlBrandType_t, |_, d, _| d.brand);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetMigMode, device)?;
        let c = out(currentMode)?;
        let p = out(pendingMode)?;
        *c = d.mig as c_uint;
        *p = d.mig as c_uint;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetCudaComputeCapability, device)?;
        let ma = out(major)?;
        let mi = out(minor)?;
        *ma = d.compute_capability.0;
        *mi = d.compute_capability.1;
        Ok(())
    })
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

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: abi::nvmlPageRetirementCause_t,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Ret {
    nvml_body!({
        retired_pages(
            Api::nvmlDeviceGetRetiredPages,
            device,
            cause,
            pageCount,
            addresses,
            std::ptr::null_mut(),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: abi::nvmlPageRetirementCause_t,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    nvml_body!({
        retired_pages(
            Api::nvmlDeviceGetRetiredPages_v2,
            device,
            cause,
            pageCount,
            addresses,
            timestamps,
        )
    })
}

getter!(
    nvmlDeviceGetRetiredPagesPendingStatus,
    abi::nvmlEnableState_t,
    |_, d, _| enable_state(d.health.retired_pending)
);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetRemappedRows, device)?;
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
    })
}
