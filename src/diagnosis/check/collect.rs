//! Reads `HealthFacts` through nvml-wrapper 0.13. Each field is read on its own: `NotSupported`
//! (or a driver without the function) becomes `Fact::NotSupported`, any other error
//! `Fact::Unavailable` with NVML's message, and one failing field never stops the others.

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::facts::{
    DeviceFacts, EccCounts, EccMode, Fact, HealthFacts, MemoryFacts, MigMode, ProcessHolding,
};

/// Reads everything `gpulse check` evaluates. `nvml` is the sampler's handle, or the reason it
/// could not be opened (which becomes the single "GPU visible" failure).
pub fn collect_health_facts(nvml: Result<&Nvml, String>) -> HealthFacts {
    let nvml = match nvml {
        Ok(n) => n,
        Err(reason) => return HealthFacts::nvml_unavailable(reason),
    };
    let device_count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            return HealthFacts::nvml_unavailable(format!(
                "NVML opened but could not count devices ({e}): check `nvidia-smi` and dmesg"
            ))
        }
    };
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
        format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(v),
            nvml_wrapper::cuda_driver_version_minor(v)
        )
    });
    let devices = (0..device_count)
        .map(|i| match nvml.device_by_index(i) {
            Ok(d) => device_facts(nvml, i, &d),
            Err(e) => DeviceFacts::unreachable(i, e.to_string()),
        })
        .collect();
    HealthFacts {
        nvml_error: None,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: cuda,
        nvml_version: nvml.sys_nvml_version().ok(),
        device_count: Some(device_count),
        devices,
    }
}

fn fact<T>(r: Result<T, NvmlError>) -> Fact<T> {
    match r {
        Ok(v) => Fact::Known(v),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Fact::NotSupported,
        Err(e) => Fact::Unavailable(e.to_string()),
    }
}

fn device_facts(nvml: &Nvml, index: u32, d: &Device<'_>) -> DeviceFacts {
    let uuid = match d.uuid() {
        Err(NvmlError::GpuLost) => {
            return DeviceFacts::unreachable(index, NvmlError::GpuLost.to_string())
        }
        other => other.ok(),
    };
    let ecc_mode = fact(d.is_ecc_enabled()).map(|m| EccMode {
        current: m.currently_enabled,
        pending: m.pending_enabled,
    });
    let ecc_errors = fact(d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)).map(
        |uncorrected_volatile| EccCounts {
            uncorrected_volatile,
            uncorrected_aggregate: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                .ok(),
            corrected_volatile: d
                .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                .ok(),
        },
    );
    DeviceFacts {
        index,
        uuid,
        name: d.name().ok(),
        unreachable: None,
        persistence_mode: fact(d.is_in_persistent_mode()),
        ecc_mode,
        ecc_errors,
        throttle_reasons: fact(d.current_throttle_reasons()).map(|r| r.bits()),
        // NVML_DEVICE_MIG_ENABLE is 1.
        mig_mode: fact(d.mig_mode()).map(|m| MigMode {
            current: m.current == 1,
            pending: m.pending == 1,
        }),
        processes: processes(d),
        memory: fact(d.memory_info()).map(|m| MemoryFacts {
            total: m.total,
            free: m.free,
            used: m.used,
            reserved: m.reserved,
        }),
        retired_pages_pending: fact(d.are_pages_pending_retired()),
        remapped_rows: match crate::sampling::health::remapped_rows(nvml, d) {
            Err(NvmlError::FailedToLoadSymbol(_)) => Fact::Unavailable(
                "the NVML library does not export nvmlDeviceGetRemappedRows (a driver older \
                 than R450, or another NVML implementation)"
                    .into(),
            ),
            other => fact(other),
        },
    }
}

fn processes(d: &Device<'_>) -> Fact<Vec<ProcessHolding>> {
    let compute = d.running_compute_processes();
    let graphics = d.running_graphics_processes();
    let (compute, graphics) = match (fact(compute), fact(graphics)) {
        (Fact::Known(c), Fact::Known(g)) => (c, g),
        (Fact::Known(c), _) => (c, Vec::new()),
        (_, Fact::Known(g)) => (Vec::new(), g),
        (other, _) => {
            return match other {
                Fact::Unavailable(e) => Fact::Unavailable(e),
                _ => Fact::NotSupported,
            }
        }
    };
    let mut out: Vec<ProcessHolding> = Vec::new();
    for p in compute.into_iter().chain(graphics) {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        // A process in both lists holds one allocation, not two.
        match out.iter_mut().find(|h| h.pid == p.pid) {
            Some(h) => h.used_bytes = h.used_bytes.max(used),
            None => out.push(ProcessHolding {
                pid: p.pid,
                used_bytes: used,
            }),
        }
    }
    out.sort_by_key(|h| h.pid);
    Fact::Known(out)
}
