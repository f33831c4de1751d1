//! The scenario keys of [`crate::hardware`]: `[device.gpm]`, `[device.nvlink]`,
//! `[device.violation]` and `[[device.mig_instance]]`, their defaults and their checks.

use serde::Deserialize;

use crate::hardware::{GpmSignals, Hardware, MigInstance, NvLink, Violations};
use crate::model::Process;
use crate::signal::{splitmix64, Signal};

/// `[device.gpm]` and `[device.mig_instance.gpm]`: activity ratios 0–1.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpm {
    /// Only on `[device.gpm]`: overrides the architecture's default support.
    supported: Option<bool>,
    sm_activity: Option<Signal>,
    sm_occupancy: Option<Signal>,
    tensor_activity: Option<Signal>,
    tensor_hmma: Option<Signal>,
    tensor_imma: Option<Signal>,
    tensor_dfma: Option<Signal>,
    dram_activity: Option<Signal>,
    fp16_activity: Option<Signal>,
    fp32_activity: Option<Signal>,
    fp64_activity: Option<Signal>,
    integer_activity: Option<Signal>,
    graphics_activity: Option<Signal>,
}

/// `[device.nvlink]`.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNvLink {
    links: u32,
    #[serde(default)]
    down: Vec<u32>,
    tx_kibps: Option<Signal>,
    rx_kibps: Option<Signal>,
    crc_flit: Option<Signal>,
    crc_data: Option<Signal>,
    replay: Option<Signal>,
    recovery: Option<Signal>,
}

/// `[device.violation]`: per policy, the share of time (0–1) clocks were held down.
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawViolation {
    power: Option<Signal>,
    thermal: Option<Signal>,
    sync_boost: Option<Signal>,
    board_limit: Option<Signal>,
    low_utilization: Option<Signal>,
    reliability: Option<Signal>,
    total_app_clocks: Option<Signal>,
    total_base_clocks: Option<Signal>,
}

/// `[[device.mig_instance]]`.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMig {
    profile: String,
    gpu_instance_id: u32,
    #[serde(default)]
    compute_instance_id: u32,
    uuid: Option<String>,
    memory_total_mib: f64,
    memory_used_mib: Option<Signal>,
    gpm: Option<RawGpm>,
}

/// What a device table says about these features.
pub(super) struct RawHardware<'a> {
    pub gpm: Option<&'a RawGpm>,
    pub nvlink: Option<&'a RawNvLink>,
    pub violation: Option<&'a RawViolation>,
    pub mig: &'a [RawMig],
    pub pcie_replays: Option<&'a Signal>,
}

/// The largest number of MIG devices NVIDIA's GPUs offer (A100/H100: 7).
const MAX_MIG_DEVICES: u32 = 7;

fn gpm_signals(raw: Option<&RawGpm>, salt: u64) -> GpmSignals {
    let Some(g) = raw else {
        return GpmSignals::idle();
    };
    let s = |v: &Option<Signal>, f: u64| {
        v.clone()
            .unwrap_or(Signal::constant(0.0))
            .salted(salt << 8 | f)
    };
    // HMMA is what fp16/bf16 training uses: without its own key it follows "any tensor".
    let hmma = g.tensor_hmma.clone().or_else(|| g.tensor_activity.clone());
    GpmSignals {
        sm_activity: s(&g.sm_activity, 40),
        sm_occupancy: s(&g.sm_occupancy, 41),
        tensor_activity: s(&g.tensor_activity, 42),
        tensor_hmma: s(&hmma, 43),
        tensor_imma: s(&g.tensor_imma, 44),
        tensor_dfma: s(&g.tensor_dfma, 45),
        dram_activity: s(&g.dram_activity, 46),
        fp16_activity: s(&g.fp16_activity, 47),
        fp32_activity: s(&g.fp32_activity, 48),
        fp64_activity: s(&g.fp64_activity, 49),
        integer_activity: s(&g.integer_activity, 50),
        graphics_activity: s(&g.graphics_activity, 51),
    }
}

/// A stable `MIG-…` UUID from the parent's index and the instance ids.
fn derived_mig_uuid(parent: u32, gi: u32, ci: u32) -> String {
    let h = splitmix64(0x4D49_4700 ^ (parent as u64) << 32 ^ (gi as u64) << 16 ^ ci as u64);
    let l = splitmix64(h);
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        l >> 48,
        l & 0xffff_ffff_ffff
    )
}

/// Compiles the hardware of device `index` (a copy of a template when `copies > 1`).
#[allow(clippy::too_many_arguments)]
pub(super) fn compile(
    raw: &RawHardware,
    index: u32,
    copies: u32,
    name: &str,
    mig_mode: bool,
    profiling_arch: bool,
    mig_arch: bool,
    processes: &[Process],
) -> Result<Hardware, String> {
    let salt = index as u64;
    let nvlink = match raw.nvlink {
        None => None,
        Some(n) => {
            if n.links == 0 || n.links > crate::abi::NVML_NVLINK_MAX_LINKS {
                return Err(format!(
                    "nvlink.links = {} is out of range: NVML knows 1 to {} links \
                     (NVML_NVLINK_MAX_LINKS); drop [device.nvlink] for a GPU without NVLink",
                    n.links,
                    crate::abi::NVML_NVLINK_MAX_LINKS
                ));
            }
            let mut down = 0u64;
            for l in &n.down {
                if *l >= n.links {
                    return Err(format!(
                        "nvlink.down lists link {l}, but the GPU has links 0 to {}",
                        n.links - 1
                    ));
                }
                down |= 1 << l;
            }
            let s = |v: &Option<Signal>, f: u64| {
                v.clone()
                    .unwrap_or(Signal::constant(0.0))
                    .salted(salt << 8 | f)
            };
            for (key, v) in [("tx_kibps", &n.tx_kibps), ("rx_kibps", &n.rx_kibps)] {
                if v.as_ref().is_some_and(|s| s.shape_min() < 0.0) {
                    return Err(format!(
                        "nvlink.{key} can go below 0; the throughput counters integrate it, so \
                         its shape must stay >= 0"
                    ));
                }
            }
            Some(NvLink {
                links: n.links,
                down,
                tx_kibps: s(&n.tx_kibps, 60),
                rx_kibps: s(&n.rx_kibps, 61),
                crc_flit: s(&n.crc_flit, 62),
                crc_data: s(&n.crc_data, 63),
                replay: s(&n.replay, 64),
                recovery: s(&n.recovery, 65),
            })
        }
    };
    let mut violations = Violations::none();
    if let Some(v) = raw.violation {
        let keyed = [
            &v.power,
            &v.thermal,
            &v.sync_boost,
            &v.board_limit,
            &v.low_utilization,
            &v.reliability,
            &v.total_app_clocks,
            &v.total_base_clocks,
        ];
        for (slot, sig) in violations.by_policy.iter_mut().zip(keyed) {
            if let Some(sig) = sig {
                if sig.shape_min() < 0.0 {
                    return Err(
                        "a [device.violation] share can go below 0; violation time integrates \
                         it, so its shape must stay >= 0"
                            .into(),
                    );
                }
                *slot = sig.clone();
            }
        }
    }

    if !raw.mig.is_empty() {
        if !mig_mode {
            return Err(
                "[[device.mig_instance]] needs `mig = true` on the device (MIG mode on)".into(),
            );
        }
        if copies > 1 {
            return Err(
                "[[device.mig_instance]] cannot be used on a device template with count > 1 \
                 (each MIG device needs its own UUID); use separate [[device]] tables"
                    .into(),
            );
        }
        if raw.mig.len() as u32 > MAX_MIG_DEVICES {
            return Err(format!(
                "{} MIG instances declared; a GPU has at most {MAX_MIG_DEVICES}",
                raw.mig.len()
            ));
        }
    }
    let mut mig = Vec::new();
    for (i, m) in raw.mig.iter().enumerate() {
        if raw.mig[..i].iter().any(|o| {
            o.gpu_instance_id == m.gpu_instance_id && o.compute_instance_id == m.compute_instance_id
        }) {
            return Err(format!(
                "two MIG instances have gpu_instance_id = {} and compute_instance_id = {}",
                m.gpu_instance_id, m.compute_instance_id
            ));
        }
        if m.gpm.as_ref().is_some_and(|g| g.supported.is_some()) {
            return Err(
                "`supported` belongs in the GPU's [device.gpm], not in a MIG instance's".into(),
            );
        }
        if !(m.memory_total_mib.is_finite() && m.memory_total_mib > 0.0) {
            return Err(format!(
                "mig_instance memory_total_mib must be a positive number, got {}",
                m.memory_total_mib
            ));
        }
        mig.push(MigInstance {
            parent: index,
            index: i as u32,
            gpu_instance_id: m.gpu_instance_id,
            compute_instance_id: m.compute_instance_id,
            uuid: m.uuid.clone().unwrap_or_else(|| {
                derived_mig_uuid(index, m.gpu_instance_id, m.compute_instance_id)
            }),
            name: format!("{name} MIG {}", m.profile),
            memory_total: crate::model::mib_to_bytes(m.memory_total_mib),
            memory_used_mib: m.memory_used_mib.clone(),
            gpm: gpm_signals(m.gpm.as_ref(), salt << 4 | (i as u64 + 1)),
        });
    }
    if !mig.is_empty() {
        for p in processes {
            if p.gpu_instance_id != crate::abi::NO_INSTANCE
                && !mig.iter().any(|m| m.gpu_instance_id == p.gpu_instance_id)
            {
                return Err(format!(
                    "process {} has gpu_instance_id = {}, but no [[device.mig_instance]] of this \
                     GPU has that id",
                    p.pid, p.gpu_instance_id
                ));
            }
        }
    }

    let pcie_replays = raw
        .pcie_replays
        .cloned()
        .unwrap_or(Signal::constant(0.0))
        .salted(salt << 8 | 70);
    Ok(Hardware {
        gpm_supported: raw.gpm.and_then(|g| g.supported).unwrap_or(profiling_arch),
        gpm: gpm_signals(raw.gpm, salt),
        nvlink,
        violations,
        pcie_replays,
        mig: mig.into_boxed_slice(),
        max_mig_devices: if mig_arch { MAX_MIG_DEVICES } else { 0 },
    })
}
