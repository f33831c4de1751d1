//! GPM (GPU Performance Monitoring, Hopper and newer): support query, opaque samples and the
//! metrics computed between two of them. A sample records which GPU (or GPU instance) it was
//! taken on and the simulated time; `nvmlGpmMetricsGet` reports, for each metric, the mean of the
//! scenario's signal over the interval between the two samples, as the driver derives metrics
//! from two snapshots of hardware counters. Activity metrics are percentages (0–100), PCIe and
//! NVLink metrics MiB/s.
//!
//! Sample handles are addresses of small allocations kept in a registry, so a freed or foreign
//! handle is `NVML_ERROR_INVALID_ARGUMENT` instead of undefined behaviour.

use std::collections::HashMap;
use std::os::raw::{c_char, c_uint};
use std::sync::Mutex;

use super::{nvml_fn, out};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::hardware::{mean_over, GpmSignals};
use crate::model::Device;
use crate::runtime;

/// Where and when a sample was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Taken {
    device: u32,
    /// `Some(gpu instance id)` for a MIG sample.
    instance: Option<u32>,
    t: f64,
}

/// Allocated samples by address; `None` until the sample is filled.
static SAMPLES: Mutex<Option<HashMap<usize, Option<Taken>>>> = Mutex::new(None);

fn with_samples<R>(f: impl FnOnce(&mut HashMap<usize, Option<Taken>>) -> R) -> R {
    let mut g = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// Records a sample of `device` (or one of its GPU instances) at `t`.
fn fill(sample: abi::nvmlGpmSample_t, taken: Taken) -> Result<(), Ret> {
    with_samples(|m| match m.get_mut(&(sample as usize)) {
        Some(slot) => {
            *slot = Some(taken);
            Ok(())
        }
        None => Err(abi::INVALID_ARGUMENT),
    })
}

nvml_fn! {
    fn nvmlGpmQueryDeviceSupport(
        device: nvmlDevice_t,
        gpmSupport: *mut abi::nvmlGpmSupport_t,
    ) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let s = out(gpmSupport)?;
        if s.version != abi::NVML_GPM_SUPPORT_VERSION {
            return Err(abi::ARGUMENT_VERSION_MISMATCH);
        }
        s.isSupportedDevice = d.hw.gpm_supported as c_uint;
        Ok(())
    }
}

nvml_fn! {
    /// Streaming is never on in the simulation (nothing here turns it on).
    fn nvmlGpmQueryIfStreamingEnabled(device: nvmlDevice_t, state: *mut c_uint) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let s = out(state)?;
        if !d.hw.gpm_supported {
            return Err(abi::NOT_SUPPORTED);
        }
        *s = 0;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlGpmSampleAlloc(gpmSample: *mut abi::nvmlGpmSample_t) |api| {
        runtime::session(api)?;
        let slot = out(gpmSample)?;
        let p = Box::into_raw(Box::new(0u64)) as abi::nvmlGpmSample_t;
        with_samples(|m| m.insert(p as usize, None));
        *slot = p;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlGpmSampleFree(gpmSample: abi::nvmlGpmSample_t) |api| {
        runtime::session(api)?;
        if with_samples(|m| m.remove(&(gpmSample as usize))).is_none() {
            return Err(abi::INVALID_ARGUMENT);
        }
        // SAFETY: registered addresses come from Box::into_raw in nvmlGpmSampleAlloc, and the
        // registry entry was just removed, so this frees each allocation once.
        drop(Box::from_raw(gpmSample as *mut u64));
        Ok(())
    }
}

nvml_fn! {
    fn nvmlGpmSampleGet(device: nvmlDevice_t, gpmSample: abi::nvmlGpmSample_t) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        if !d.hw.gpm_supported {
            return Err(abi::NOT_SUPPORTED);
        }
        fill(
            gpmSample,
            Taken {
                device: d.index,
                instance: None,
                t,
            },
        )
    }
}

nvml_fn! {
    /// A sample of one GPU instance of a GPU in MIG mode (`NVML_ERROR_NOT_FOUND` for an id that
    /// no instance has).
    fn nvmlGpmMigSampleGet(
        device: nvmlDevice_t,
        gpuInstanceId: c_uint,
        gpmSample: abi::nvmlGpmSample_t,
    ) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        if !d.hw.gpm_supported || !d.mig {
            return Err(abi::NOT_SUPPORTED);
        }
        if !d.hw.mig.iter().any(|m| m.gpu_instance_id == gpuInstanceId) {
            return Err(abi::NOT_FOUND);
        }
        fill(
            gpmSample,
            Taken {
                device: d.index,
                instance: Some(gpuInstanceId),
                t,
            },
        )
    }
}

/// `(shortName, longName, unit)` of the metrics the simulation models, NUL-terminated.
fn metric_info(id: c_uint) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match id {
        1 => ("gr_util\0", "Graphics engine utilization\0", "%\0"),
        2 => ("sm_util\0", "SM utilization\0", "%\0"),
        3 => ("sm_occupancy\0", "SM occupancy\0", "%\0"),
        4 => ("int_util\0", "Integer pipe utilization\0", "%\0"),
        5 => ("tensor_util\0", "Any tensor pipe utilization\0", "%\0"),
        6 => ("dfma_util\0", "DFMA tensor pipe utilization\0", "%\0"),
        7 => ("hmma_util\0", "HMMA tensor pipe utilization\0", "%\0"),
        9 => ("imma_util\0", "IMMA tensor pipe utilization\0", "%\0"),
        10 => ("dram_bw_util\0", "DRAM bandwidth utilization\0", "%\0"),
        11 => ("fp64_util\0", "FP64 pipe utilization\0", "%\0"),
        12 => ("fp32_util\0", "FP32 pipe utilization\0", "%\0"),
        13 => ("fp16_util\0", "FP16 pipe utilization\0", "%\0"),
        20 => ("pcie_tx\0", "PCIe traffic from this GPU\0", "MiB/sec\0"),
        21 => ("pcie_rx\0", "PCIe traffic to this GPU\0", "MiB/sec\0"),
        60 => (
            "nvlink_rx\0",
            "NVLink read bandwidth, all links\0",
            "MiB/sec\0",
        ),
        61 => (
            "nvlink_tx\0",
            "NVLink write bandwidth, all links\0",
            "MiB/sec\0",
        ),
        62..=97 if id % 2 == 0 => (
            "nvlink_lx_rx\0",
            "NVLink read bandwidth, one link\0",
            "MiB/sec\0",
        ),
        62..=97 => (
            "nvlink_lx_tx\0",
            "NVLink write bandwidth, one link\0",
            "MiB/sec\0",
        ),
        _ => return None,
    })
}

/// One metric over `[t1, t2]` for a GPU (`gpm` its signals, `whole_gpu` false for a GPU
/// instance, which has no PCIe or NVLink metrics of its own).
fn metric_value(
    d: &Device,
    gpm: &GpmSignals,
    whole_gpu: bool,
    id: c_uint,
    t1: f64,
    t2: f64,
) -> Result<f64, Ret> {
    if let Some(s) = gpm.for_metric(id) {
        return Ok((mean_over(s, t1, t2) * 100.0).clamp(0.0, 100.0));
    }
    const MIB: f64 = 1024.0;
    match id {
        20 | 21 if whole_gpu => {
            let s = if id == 20 {
                &d.signals.pcie_tx_kbps
            } else {
                &d.signals.pcie_rx_kbps
            };
            Ok(mean_over(s, t1, t2).max(0.0) / MIB)
        }
        60..=97 if whole_gpu => {
            let link = d.hw.nvlink.as_ref().ok_or(abi::NOT_SUPPORTED)?;
            // Even ids are RX, odd ids TX (60/61 all links, then 62/63 link 0, ...).
            let s = if id % 2 == 0 {
                &link.rx_kibps
            } else {
                &link.tx_kibps
            };
            let per_link = mean_over(s, t1, t2).max(0.0) / MIB;
            if id <= 61 {
                return Ok(per_link * link.active() as f64);
            }
            let l = (id - 62) / 2;
            if l >= link.links {
                return Err(abi::NOT_SUPPORTED);
            }
            Ok(if link.is_up(l) { per_link } else { 0.0 })
        }
        1..=209 => Err(abi::NOT_SUPPORTED),
        _ => Err(abi::INVALID_ARGUMENT),
    }
}

nvml_fn! {
    /// Fills `metrics[..numMetrics]` from the interval between `sample1` and `sample2`: both must
    /// be filled samples of the same GPU or GPU instance. Per-metric failures go in each metric's
    /// `nvmlReturn`; the call itself succeeds.
    fn nvmlGpmMetricsGet(metricsGet: *mut abi::nvmlGpmMetricsGet_t) |api| {
        let (sim, t) = runtime::session(api)?;
        let mg = out(metricsGet)?;
        if mg.version != abi::NVML_GPM_METRICS_GET_VERSION {
            return Err(abi::ARGUMENT_VERSION_MISMATCH);
        }
        if mg.numMetrics as usize > mg.metrics.len() {
            return Err(abi::INVALID_ARGUMENT);
        }
        let (s1, s2) = with_samples(|m| {
            (
                m.get(&(mg.sample1 as usize)).copied().flatten(),
                m.get(&(mg.sample2 as usize)).copied().flatten(),
            )
        });
        let (Some(s1), Some(s2)) = (s1, s2) else {
            return Err(abi::INVALID_ARGUMENT);
        };
        if s1.device != s2.device || s1.instance != s2.instance {
            return Err(abi::INVALID_ARGUMENT);
        }
        let d = sim
            .devices
            .get(s1.device as usize)
            .ok_or(abi::INVALID_ARGUMENT)?;
        if d.is_lost(t) {
            return Err(abi::GPU_IS_LOST);
        }
        let gpm = match s1.instance {
            None => &d.hw.gpm,
            Some(gi) => {
                &d.hw
                    .mig
                    .iter()
                    .find(|m| m.gpu_instance_id == gi)
                    .ok_or(abi::INVALID_ARGUMENT)?
                    .gpm
            }
        };
        let n = mg.numMetrics as usize;
        for m in mg.metrics[..n].iter_mut() {
            match metric_value(d, gpm, s1.instance.is_none(), m.metricId, s1.t, s2.t) {
                Ok(v) => {
                    m.nvmlReturn = abi::SUCCESS;
                    m.value = v;
                }
                Err(code) => {
                    m.nvmlReturn = code;
                    m.value = 0.0;
                }
            }
            let info = metric_info(m.metricId);
            let ptr = |s: &'static str| s.as_ptr() as *mut c_char;
            m.metricInfo.shortName = info.map_or(std::ptr::null_mut(), |i| ptr(i.0));
            m.metricInfo.longName = info.map_or(std::ptr::null_mut(), |i| ptr(i.1));
            m.metricInfo.unit = info.map_or(std::ptr::null_mut(), |i| ptr(i.2));
        }
        Ok(())
    }
}
