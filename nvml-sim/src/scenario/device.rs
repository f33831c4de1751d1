//! Compiling `[[device]]` tables: a template with `count` expanded into devices whose identity
//! (UUID, PCI bus id, serial, minor number) is derived from their index unless written, every
//! default filled in (an idle H100), values range-checked, signals salted per device, and the
//! check that no two GPUs share an identity. Processes and hardware sections are delegated to
//! `super::process` and `super::hardware`.

use super::hardware;
use super::process::expand_process;
use super::schema::{Architecture, Brand, ComputeMode, EventKind, RawDevice};
use super::Env;
use crate::abi;
use crate::api::Api;
use crate::model::{Action, Device, DeviceSignals, Fault, FaultSet, MemoryHealth, Window};
use crate::signal::{splitmix64, Signal};

fn derived_uuid(i: u32) -> String {
    let a = splitmix64(0x6e76_6d6c_5f73_696d ^ i as u64);
    let b = splitmix64(a);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        (a as u16 & 0x0fff) | 0x4000,
        ((b >> 48) as u16 & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Parses `DDDDDDDD:BB:DD.F` or `DDDD:BB:DD.F` (or `BB:DD.F`), case-insensitive.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let mut parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.len() {
        3 => (parts.remove(0), parts.remove(0), parts.remove(0)),
        2 => ("0", parts.remove(0), parts.remove(0)),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.').unwrap_or((devfn, "0"));
    let hex = |p: &str, max: u32| u32::from_str_radix(p, 16).ok().filter(|v| *v <= max);
    Some((
        hex(domain, u32::MAX)?,
        hex(bus, 0xff)?,
        hex(dev, 0x1f)?,
        hex(func, 7)?,
    ))
}

pub(super) fn expand_device(
    raw: &RawDevice,
    out: &mut Vec<Device>,
    env: &dyn Env,
) -> Result<(), String> {
    let count = raw.count.unwrap_or(1);
    if count == 0 {
        return Err("`count` must be at least 1".into());
    }
    if count > 1 {
        for (key, set) in [
            ("uuid", raw.uuid.is_some()),
            ("pci_bus_id", raw.pci_bus_id.is_some()),
            ("serial", raw.serial.is_some()),
            ("minor", raw.minor.is_some()),
        ] {
            if set {
                return Err(format!(
                    "`{key}` cannot be set on a device template with count = {count}: each copy \
                     derives its own from its index; drop `{key}` or use separate [[device]] tables"
                ));
            }
        }
    }
    let explicit_bus = match &raw.pci_bus_id {
        Some(s) => Some(parse_bus_id(s).ok_or_else(|| {
            format!("pci_bus_id {s:?} is not a PCI address like \"00000000:18:00.0\"")
        })?),
        None => None,
    };
    let cc = match &raw.compute_capability {
        None => (9, 0),
        Some(s) => s
            .get_ref()
            .split_once('.')
            .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
            .ok_or_else(|| {
                format!(
                    "compute_capability {:?} is not MAJOR.MINOR like \"9.0\"",
                    s.get_ref()
                )
            })?,
    };
    let positive = |key: &str, v: Option<f64>, default: f64| -> Result<f64, String> {
        let v = v.unwrap_or(default);
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("`{key}` must be a non-negative number, got {v}"))
        }
    };
    let total_mib = positive("memory_total_mib", raw.memory_total_mib, 81559.0)?;
    let bar1_total_mib = positive("bar1_total_mib", raw.bar1_total_mib, 131072.0)?;
    // A driver maps a small share of BAR1 for itself even on an idle GPU.
    let bar1_used_mib = raw.bar1_used_mib.unwrap_or(bar1_total_mib / 64.0);
    if !(0.0..=bar1_total_mib).contains(&bar1_used_mib) {
        return Err(format!(
            "bar1_used_mib ({bar1_used_mib}) must be between 0 and bar1_total_mib ({bar1_total_mib})"
        ));
    }
    let reserved_mib = positive("memory_reserved_mib", raw.memory_reserved_mib, 542.0)?;
    if reserved_mib > total_mib {
        return Err(format!(
            "memory_reserved_mib ({reserved_mib}) is larger than memory_total_mib ({total_mib})"
        ));
    }
    let limit_w = positive("power_limit_w", raw.power_limit_w, 700.0)?;
    let default_limit_w = positive("default_power_limit_w", raw.default_power_limit_w, limit_w)?;
    let min_limit_w = positive(
        "min_power_limit_w",
        raw.min_power_limit_w,
        limit_w.min(200.0),
    )?;
    let max_limit_w = positive("max_power_limit_w", raw.max_power_limit_w, limit_w)?;
    let energy_start_j = positive("energy_start_j", raw.energy_start_j, 0.0)?;
    let clocks = raw.max_clocks_mhz.unwrap_or_default();
    let max_clocks = [
        clocks.graphics.unwrap_or(1980),
        clocks.sm.unwrap_or(1980),
        clocks.mem.unwrap_or(2619),
        clocks.video.unwrap_or(1965),
    ];
    let sig = &raw.signals;
    if let Some(p) = &sig.power_w {
        if p.get_ref().shape_min() < 0.0 {
            return Err(
                "signals.power_w can go below 0 W; energy integrates power, so its shape must \
                 stay >= 0 (lower the amplitude or raise the mean)"
                    .into(),
            );
        }
    }
    let supported_events = match &raw.supported_events {
        Some(kinds) => kinds.iter().fold(0, |m, k| m | k.bits()),
        None => [
            EventKind::Xid,
            EventKind::SingleBitEcc,
            EventKind::DoubleBitEcc,
            EventKind::Pstate,
            EventKind::Clock,
        ]
        .iter()
        .fold(0, |m, k| m | k.bits()),
    };
    // PIDs of a template's copies must not collide: each copy shifts its literal PIDs by the
    // number of literal PIDs the template declares.
    let literal_pids_per_copy: u32 = raw
        .processes
        .iter()
        .filter(|p| p.get_ref().pid.is_some())
        .map(|p| p.get_ref().count.unwrap_or(1))
        .sum();

    for copy in 0..count {
        let index = out.len() as u32;
        let salt = index as u64;
        let (domain, bus, pci_device, _func) =
            explicit_bus.unwrap_or((index / 80, 0x10 + (index % 80) * 3, 0, 0));
        let s = |v: &Option<Signal>, default: f64, field: u64| -> Signal {
            v.clone()
                .unwrap_or(Signal::constant(default))
                .salted(salt << 8 | field)
        };
        let clock_sig = |v: &Option<Signal>, i: usize| -> Signal {
            v.clone()
                .unwrap_or(Signal::constant(max_clocks[i] as f64))
                .salted(salt << 8 | (20 + i as u64))
        };
        let signals = DeviceSignals {
            gpu_util: s(&sig.gpu_util, 0.0, 1),
            mem_util: s(&sig.mem_util, 0.0, 2),
            encoder_util: s(&sig.encoder_util, 0.0, 3),
            decoder_util: s(&sig.decoder_util, 0.0, 4),
            memory_used_mib: sig
                .memory_used_mib
                .as_ref()
                .map(|m| m.salted(salt << 8 | 5)),
            temperature_c: s(&sig.temperature_c, 35.0, 6),
            memory_temperature_c: sig
                .memory_temperature_c
                .as_ref()
                .map(|m| m.salted(salt << 8 | 15)),
            power_w: sig
                .power_w
                .as_ref()
                .map(|p| p.get_ref().clone())
                .unwrap_or(Signal::constant(70.0))
                .salted(salt << 8 | 7),
            clocks_mhz: [
                clock_sig(&sig.clock_graphics_mhz, 0),
                clock_sig(&sig.clock_sm_mhz, 1),
                clock_sig(&sig.clock_mem_mhz, 2),
                clock_sig(&sig.clock_video_mhz, 3),
            ],
            fan_percent: s(&sig.fan_percent, 30.0, 8),
            pcie_tx_kbps: s(&sig.pcie_tx_kbps, 0.0, 9),
            pcie_rx_kbps: s(&sig.pcie_rx_kbps, 0.0, 10),
            throttle_reasons: s(&sig.throttle_reasons, 0.0, 11),
            ecc_corrected: s(&sig.ecc_corrected, 0.0, 12),
            ecc_uncorrected: s(&sig.ecc_uncorrected, 0.0, 13),
            pstate: s(&sig.pstate, 0.0, 14),
        };
        let mut processes = Vec::new();
        for p in &raw.processes {
            expand_process(
                p.get_ref(),
                copy * literal_pids_per_copy,
                salt,
                env,
                &mut processes,
            )?;
        }
        let health = {
            let r = raw.retired_pages.unwrap_or_default();
            let m = raw.remapped_rows.unwrap_or_default();
            MemoryHealth {
                retired_single_bit: r.single_bit,
                retired_double_bit: r.double_bit,
                retired_pending: r.pending,
                remapped_corrected: m.corrected,
                remapped_uncorrected: m.uncorrected,
                remap_pending: m.pending,
                remap_failure: m.failure,
            }
        };
        let name = raw
            .name
            .clone()
            .unwrap_or_else(|| "NVIDIA H100 80GB HBM3".into());
        let arch = raw.architecture.unwrap_or(Architecture::Hopper);
        let hw = hardware::compile(
            &hardware::RawHardware {
                gpm: raw.gpm.as_ref(),
                nvlink: raw.nvlink.as_ref(),
                violation: raw.violation.as_ref(),
                mig: &raw.mig_instances,
                pcie_replays: sig.pcie_replays.as_ref(),
            },
            index,
            count,
            &name,
            raw.mig.unwrap_or(false),
            matches!(arch, Architecture::Hopper | Architecture::Blackwell),
            matches!(
                arch,
                Architecture::Ampere | Architecture::Hopper | Architecture::Blackwell
            ),
            &processes,
        )?;
        let mut faults = FaultSet::default();
        if !hw.mig.is_empty() {
            // A GPU with MIG devices has no device-wide or per-process utilisation.
            faults.push(Fault {
                apis: Api::nvmlDeviceGetUtilizationRates.bit()
                    | Api::nvmlDeviceGetProcessUtilization.bit(),
                window: Window::ALWAYS,
                action: Action::Fail(abi::NOT_SUPPORTED),
            });
        }
        out.push(Device {
            index,
            name,
            uuid: raw.uuid.clone().unwrap_or_else(|| derived_uuid(index)),
            serial: raw
                .serial
                .clone()
                .unwrap_or_else(|| format!("{}", 1_650_000_000_000u64 + index as u64)),
            vbios_version: raw
                .vbios_version
                .clone()
                .unwrap_or_else(|| "96.00.99.00.01".into()),
            domain,
            bus,
            pci_device,
            bus_id: format!("{domain:08X}:{bus:02X}:{pci_device:02X}.0"),
            bus_id_legacy: format!("{:04X}:{bus:02X}:{pci_device:02X}.0", domain & 0xffff),
            pci_device_id: raw.pci_device_id.unwrap_or(0x2330_10DE),
            pci_subsystem_id: raw.pci_subsystem_id.unwrap_or(0x16C1_10DE),
            minor: raw.minor.unwrap_or(index),
            memory_total: crate::model::mib_to_bytes(total_mib),
            memory_reserved: crate::model::mib_to_bytes(reserved_mib),
            bar1_total: crate::model::mib_to_bytes(bar1_total_mib),
            bar1_used: crate::model::mib_to_bytes(bar1_used_mib),
            power_limit_mw: (limit_w * 1000.0) as u32,
            default_power_limit_mw: (default_limit_w * 1000.0) as u32,
            min_power_limit_mw: (min_limit_w * 1000.0) as u32,
            max_power_limit_mw: (max_limit_w * 1000.0) as u32,
            energy_start_mj: energy_start_j * 1000.0,
            max_clocks_mhz: max_clocks,
            fans: raw.fans.unwrap_or(0),
            ecc: raw.ecc.unwrap_or(true),
            persistence: raw.persistence.unwrap_or(true),
            mig: raw.mig.unwrap_or(false),
            compute_capability: cc,
            architecture: arch_code(raw.architecture.unwrap_or(Architecture::Hopper)),
            brand: brand_code(raw.brand.unwrap_or(Brand::Nvidia)),
            compute_mode: match raw.compute_mode.unwrap_or(ComputeMode::Default) {
                ComputeMode::Default => abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
                ComputeMode::ExclusiveThread => {
                    abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD
                }
                ComputeMode::Prohibited => abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
                ComputeMode::ExclusiveProcess => {
                    abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
                }
            },
            supported_throttle_reasons: raw.supported_throttle_reasons.unwrap_or(0x1FF),
            supported_events,
            pcie_gen: (
                raw.pcie_generation.unwrap_or(5),
                raw.pcie_max_generation.unwrap_or(5),
            ),
            pcie_width: (
                raw.pcie_width.unwrap_or(16),
                raw.pcie_max_width.unwrap_or(16),
            ),
            slowdown_temp_c: raw.slowdown_temp_c.unwrap_or(87),
            shutdown_temp_c: raw.shutdown_temp_c.unwrap_or(92),
            health,
            hw,
            signals,
            processes: processes.into_boxed_slice(),
            lost: Vec::new(),
            faults,
        });
    }
    Ok(())
}

fn arch_code(a: Architecture) -> u32 {
    match a {
        Architecture::Kepler => abi::NVML_DEVICE_ARCH_KEPLER,
        Architecture::Maxwell => abi::NVML_DEVICE_ARCH_MAXWELL,
        Architecture::Pascal => abi::NVML_DEVICE_ARCH_PASCAL,
        Architecture::Volta => abi::NVML_DEVICE_ARCH_VOLTA,
        Architecture::Turing => abi::NVML_DEVICE_ARCH_TURING,
        Architecture::Ampere => abi::NVML_DEVICE_ARCH_AMPERE,
        Architecture::Ada => abi::NVML_DEVICE_ARCH_ADA,
        Architecture::Hopper => abi::NVML_DEVICE_ARCH_HOPPER,
        Architecture::Blackwell => abi::NVML_DEVICE_ARCH_BLACKWELL,
    }
}

fn brand_code(b: Brand) -> u32 {
    match b {
        Brand::Unknown => abi::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        Brand::Quadro => abi::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        Brand::Tesla => abi::nvmlBrandType_enum_NVML_BRAND_TESLA,
        Brand::Nvs => abi::nvmlBrandType_enum_NVML_BRAND_NVS,
        Brand::Grid => abi::nvmlBrandType_enum_NVML_BRAND_GRID,
        Brand::Geforce => abi::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        Brand::Titan => abi::nvmlBrandType_enum_NVML_BRAND_TITAN,
        Brand::NvidiaRtx => abi::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        Brand::Nvidia => abi::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        Brand::GeforceRtx => abi::nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX,
    }
}

pub(super) fn check_unique(devices: &[Device]) -> Result<(), String> {
    for (i, a) in devices.iter().enumerate() {
        for b in &devices[..i] {
            for (what, x, y) in [
                ("uuid", &a.uuid, &b.uuid),
                ("pci_bus_id", &a.bus_id, &b.bus_id),
                ("serial", &a.serial, &b.serial),
            ] {
                if x == y {
                    return Err(format!(
                        "devices {} and {} have the same {what} {x:?}; each GPU needs its own",
                        b.index, a.index
                    ));
                }
            }
            if a.minor == b.minor {
                return Err(format!(
                    "devices {} and {} have the same minor number {}; each GPU needs its own",
                    b.index, a.index, a.minor
                ));
            }
        }
    }
    Ok(())
}
