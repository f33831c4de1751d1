//! Process lists (compute, graphics, MPS; every struct version) and per-process utilisation,
//! with the driver's two-call protocol: a NULL or too-small buffer returns
//! `NVML_ERROR_INSUFFICIENT_SIZE` with the needed count, an empty list returns `NVML_SUCCESS`
//! with count 0.

use std::os::raw::c_uint;

use super::{nvml_fn, out, to_u32};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::model::{Process, KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS};
use crate::runtime::{self, Target};

#[inline]
fn listed(p: &Process, kind: u8, t: f64) -> bool {
    p.kinds & kind != 0 && p.listed_at(t)
}

/// Fills `infos` with the device's active processes of `kind`, converted by `make`. On a MIG
/// device handle, only the processes in that instance (GPU and compute instance ids); on the
/// parent GPU, all of them, each carrying its instance ids.
unsafe fn list<T>(
    api: Api,
    device: nvmlDevice_t,
    kind: u8,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(&Process, f64) -> T,
) -> Result<(), Ret> {
    let (_, target, t) = runtime::target(api, device)?;
    let d = target.gpu();
    let listed = |p: &Process, kind: u8, t: f64| {
        listed(p, kind, t)
            && match target {
                Target::Gpu(_) => true,
                Target::Mig(_, m) => {
                    p.gpu_instance_id == m.gpu_instance_id
                        && p.compute_instance_id == m.compute_instance_id
                }
            }
    };
    let count = out(count)?;
    let n = d.processes.iter().filter(|p| listed(p, kind, t)).count() as c_uint;
    if infos.is_null() || *count < n {
        *count = n;
        return if n == 0 {
            Ok(())
        } else {
            Err(abi::INSUFFICIENT_SIZE)
        };
    }
    for (i, p) in d
        .processes
        .iter()
        .filter(|p| listed(p, kind, t))
        .enumerate()
    {
        infos.add(i).write(make(p, t));
    }
    *count = n;
    Ok(())
}

fn info_v2(p: &Process, t: f64) -> abi::nvmlProcessInfo_t {
    abi::nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.memory_bytes(t),
        gpuInstanceId: p.gpu_instance_id,
        computeInstanceId: p.compute_instance_id,
    }
}

fn info_v1(p: &Process, t: f64) -> abi::nvmlProcessInfo_v1_t {
    abi::nvmlProcessInfo_v1_t {
        pid: p.pid,
        usedGpuMemory: p.memory_bytes(t),
    }
}

macro_rules! process_list {
    ($name:ident $(as $proto:ty)?, $kind:expr, $ty:ty, $make:expr) => {
        nvml_fn! {
            fn $name(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut $ty)
                $(as $proto)? |api|
            {
                list(api, device, $kind, infoCount, infos, $make)
            }
        }
    };
}

/// The `nvml.h` prototype of the process lists that write an older struct than `NvmlLib` knows.
type ListOf<T> = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> Ret;

process_list!(
    nvmlDeviceGetComputeRunningProcesses_v3,
    KIND_COMPUTE,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetComputeRunningProcesses_v2 as ListOf<abi::nvmlProcessInfo_t>,
    KIND_COMPUTE,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetComputeRunningProcesses as ListOf<abi::nvmlProcessInfo_v1_t>,
    KIND_COMPUTE,
    abi::nvmlProcessInfo_v1_t,
    info_v1
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    KIND_GRAPHICS,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses_v2 as ListOf<abi::nvmlProcessInfo_t>,
    KIND_GRAPHICS,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetGraphicsRunningProcesses as ListOf<abi::nvmlProcessInfo_v1_t>,
    KIND_GRAPHICS,
    abi::nvmlProcessInfo_v1_t,
    info_v1
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses_v3,
    KIND_MPS,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses_v2 as ListOf<abi::nvmlProcessInfo_t>,
    KIND_MPS,
    abi::nvmlProcessInfo_t,
    info_v2
);
process_list!(
    nvmlDeviceGetMPSComputeRunningProcesses as ListOf<abi::nvmlProcessInfo_v1_t>,
    KIND_MPS,
    abi::nvmlProcessInfo_v1_t,
    info_v1
);

/// The driver samples process utilisation periodically; a process's latest sample is taken at
/// the start of the current period, and is returned only if newer than `lastSeenTimeStamp`.
fn sample_time(period: f64, t: f64) -> f64 {
    (t / period).floor() * period
}

nvml_fn! {
    /// One sample per active process (compute, graphics or MPS) newer than `lastSeenTimeStamp`
    /// (µs since the epoch). No sample: `NVML_ERROR_NOT_FOUND`, as the driver says.
    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        utilization: *mut abi::nvmlProcessUtilizationSample_t,
        processSamplesCount: *mut c_uint,
        lastSeenTimeStamp: u64,
    ) |api| {
        let (sim, d, t) = runtime::device(api, device)?;
        let count = out(processSamplesCount)?;
        let at = sample_time(sim.process_sample_period, t);
        let stamp = sim.clock.wall_us(at);
        let any = KIND_COMPUTE | KIND_GRAPHICS | KIND_MPS;
        let fresh = |p: &&Process| listed(p, any, at) && stamp > lastSeenTimeStamp;
        let n = d.processes.iter().filter(fresh).count() as c_uint;
        if n == 0 {
            *count = 0;
            return Err(abi::NOT_FOUND);
        }
        if utilization.is_null() || *count < n {
            *count = n;
            return Err(abi::INSUFFICIENT_SIZE);
        }
        for (i, p) in d.processes.iter().filter(fresh).enumerate() {
            utilization
                .add(i)
                .write(abi::nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: stamp,
                    smUtil: to_u32(p.sm_util.value(at), 100),
                    memUtil: to_u32(p.mem_util.value(at), 100),
                    encUtil: to_u32(p.enc_util.value(at), 100),
                    decUtil: to_u32(p.dec_util.value(at), 100),
                });
        }
        *count = n;
        Ok(())
    }
}
