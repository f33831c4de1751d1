//! Per-device queries: identity (name, UUID, serial, PCI), memory, utilisation, temperature,
//! power and energy, clocks, fans, PCIe, throttle reasons and the fixed modes (ECC,
//! persistence, compute, MIG). The health counters (ECC errors, retired pages, remapped rows)
//! are in [`super::health`].

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

use super::{enable_state, fill_field, nvml_fn, out, to_u32, write_str};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::model::{Device, Sim};
use crate::runtime::{self, Target};

/// A getter writing one value computed from the device and the time.
macro_rules! getter {
    (
        $(#[$m:meta])* $name:ident $(as $proto:ty)?, $ty:ty,
        |$sim:pat_param, $dev:ident, $t:pat_param| $val:expr
    ) => {
        nvml_fn! {
            $(#[$m])*
            fn $name(device: nvmlDevice_t, value: *mut $ty) $(as $proto)? |api| {
                let ($sim, $dev, $t) = runtime::device(api, device)?;
                let slot = out(value)?;
                *slot = $val;
                Ok(())
            }
        }
    };
}

/// A getter writing a string into a caller buffer.
macro_rules! string_getter {
    ($name:ident, |$dev:ident| $val:expr) => {
        nvml_fn! {
            fn $name(device: nvmlDevice_t, buffer: *mut c_char, length: c_uint) |api| {
                let (_, $dev, _) = runtime::device(api, device)?;
                write_str(buffer, length, $val)
            }
        }
    };
}

/// A string getter that also answers for MIG devices.
macro_rules! target_string_getter {
    ($name:ident, |$dev:ident| $gpu:expr, |$mig:ident| $of_mig:expr) => {
        nvml_fn! {
            fn $name(device: nvmlDevice_t, buffer: *mut c_char, length: c_uint) |api| {
                let (_, target, _) = runtime::target(api, device)?;
                let s = match target {
                    Target::Gpu($dev) => $gpu,
                    Target::Mig(_, $mig) => $of_mig,
                };
                write_str(buffer, length, s)
            }
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
    nvmlDeviceGetPciInfo_v2 as unsafe extern "C" fn(nvmlDevice_t, *mut abi::PciInfoV2) -> Ret,
    abi::PciInfoV2, |_, d, _| abi::PciInfoV2 {
        v1: pci_v1(d),
        pci_sub_system_id: d.pci_subsystem_id,
    }
);
getter!(
    /// Writes only the v1 prefix (32 bytes) of the struct.
    nvmlDeviceGetPciInfo as unsafe extern "C" fn(nvmlDevice_t, *mut abi::PciInfoV1) -> Ret,
    abi::PciInfoV1, |_, d, _| pci_v1(d)
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
                        p.listed_at(t)
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

nvml_fn! {
    /// v1 semantics: `used` includes the reserved memory (`free = total - used`).
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut abi::nvmlMemory_t) |api| {
        let (_, target, t) = runtime::target(api, device)?;
        let m = out(memory)?;
        let (total, reserved, used) = memory_of(target, t);
        let used = used + reserved;
        *m = abi::nvmlMemory_t {
            total,
            free: total.saturating_sub(used),
            used,
        };
        Ok(())
    }
}

nvml_fn! {
    /// v2: `version` must be `NVML_STRUCT_VERSION(Memory, 2)`; `used` excludes `reserved`.
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut abi::nvmlMemory_v2_t) |api| {
        let (_, target, t) = runtime::target(api, device)?;
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
    }
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

nvml_fn! {
    fn nvmlDeviceGetEncoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) |api| {
        codec(
            api,
            device,
            utilization,
            samplingPeriodUs,
            |d| &d.signals.encoder_util,
        )
    }
}

nvml_fn! {
    fn nvmlDeviceGetDecoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        samplingPeriodUs: *mut c_uint,
    ) |api| {
        codec(
            api,
            device,
            utilization,
            samplingPeriodUs,
            |d| &d.signals.decoder_util,
        )
    }
}

nvml_fn! {
    fn nvmlDeviceGetTemperature(
        device: nvmlDevice_t,
        sensorType: abi::nvmlTemperatureSensors_t,
        temp: *mut c_uint,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(temp)?;
        if sensorType != abi::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(abi::INVALID_ARGUMENT);
        }
        *slot = to_u32(d.signals.temperature_c.value(t), 255);
        Ok(())
    }
}

nvml_fn! {
    /// The versioned form pynvml 13 prefers (`nvmlTemperature_v1_t`).
    fn nvmlDeviceGetTemperatureV(
        device: nvmlDevice_t,
        temperature: *mut abi::nvmlTemperature_v1_t,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
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
    }
}

nvml_fn! {
    /// Shutdown (0), slowdown (1) and the GPU max-operating thresholds (3); others unsupported.
    fn nvmlDeviceGetTemperatureThreshold(
        device: nvmlDevice_t,
        thresholdType: abi::nvmlTemperatureThresholds_t,
        temp: *mut c_uint,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
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
    }
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

nvml_fn! {
    fn nvmlDeviceGetPowerManagementLimitConstraints(
        device: nvmlDevice_t,
        minLimit: *mut c_uint,
        maxLimit: *mut c_uint,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let lo = out(minLimit)?;
        let hi = out(maxLimit)?;
        *lo = d.min_power_limit_mw;
        *hi = d.max_power_limit_mw;
        Ok(())
    }
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

nvml_fn! {
    fn nvmlDeviceGetClockInfo(
        device: nvmlDevice_t,
        type_: abi::nvmlClockType_t,
        clock: *mut c_uint,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(clock)?;
        *slot = current_clock(d, clock_index(type_)?, t);
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetMaxClockInfo(
        device: nvmlDevice_t,
        type_: abi::nvmlClockType_t,
        clock: *mut c_uint,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let slot = out(clock)?;
        *slot = d.max_clocks_mhz[clock_index(type_)?];
        Ok(())
    }
}

nvml_fn! {
    /// `NVML_CLOCK_ID_CURRENT` is the signal; the application targets and the boost maximum are
    /// the device's maximum clock.
    fn nvmlDeviceGetClock(
        device: nvmlDevice_t,
        clockType: abi::nvmlClockType_t,
        clockId: abi::nvmlClockId_t,
        clockMHz: *mut c_uint,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
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
    }
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

nvml_fn! {
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(speed)?;
        *slot = fan(d, 0, t)?;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan_: c_uint, speed: *mut c_uint) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(speed)?;
        *slot = fan(d, fan_, t)?;
        Ok(())
    }
}

nvml_fn! {
    /// KB/s over the driver's 20 ms window.
    fn nvmlDeviceGetPcieThroughput(
        device: nvmlDevice_t,
        counter: abi::nvmlPcieUtilCounter_t,
        value: *mut c_uint,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let slot = out(value)?;
        let s = match counter {
            abi::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => &d.signals.pcie_tx_kbps,
            abi::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => &d.signals.pcie_rx_kbps,
            _ => return Err(abi::INVALID_ARGUMENT),
        };
        *slot = to_u32(s.value(t), u32::MAX);
        Ok(())
    }
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

nvml_fn! {
    fn nvmlDeviceGetEccMode(
        device: nvmlDevice_t,
        current: *mut abi::nvmlEnableState_t,
        pending: *mut abi::nvmlEnableState_t,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let c = out(current)?;
        let p = out(pending)?;
        *c = enable_state(d.ecc);
        *p = enable_state(d.ecc);
        Ok(())
    }
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

nvml_fn! {
    fn nvmlDeviceGetMigMode(
        device: nvmlDevice_t,
        currentMode: *mut c_uint,
        pendingMode: *mut c_uint,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let c = out(currentMode)?;
        let p = out(pendingMode)?;
        *c = d.mig as c_uint;
        *p = d.mig as c_uint;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetCudaComputeCapability(
        device: nvmlDevice_t,
        major: *mut c_int,
        minor: *mut c_int,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let ma = out(major)?;
        let mi = out(minor)?;
        *ma = d.compute_capability.0;
        *mi = d.compute_capability.1;
        Ok(())
    }
}
