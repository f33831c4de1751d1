//! MIG devices: the instance list of a GPU with MIG mode on, handles of MIG devices, and the
//! calls that map between a MIG device and its parent. Name, UUID, memory and process lists
//! answer for MIG handles in [`super::device`] and [`super::process`]; every other device call
//! returns `NVML_ERROR_NOT_SUPPORTED` for them (see [`crate::runtime::device`]).

use std::os::raw::c_uint;

use super::{nvml_fn, out};
use crate::abi::{self, nvmlDevice_t};
use crate::runtime::{self, Target};

nvml_fn! {
    /// How many MIG devices the GPU can hold (not how many exist: look them up by index and skip
    /// `NVML_ERROR_NOT_FOUND`). A GPU without MIG support: `NVML_ERROR_NOT_SUPPORTED`.
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        let c = out(count)?;
        if d.hw.max_mig_devices == 0 {
            return Err(abi::NOT_SUPPORTED);
        }
        *c = d.hw.max_mig_devices;
        Ok(())
    }
}

nvml_fn! {
    /// The MIG device at `index`: `NVML_ERROR_NOT_FOUND` for a free slot (below the maximum),
    /// `NVML_ERROR_INVALID_ARGUMENT` past the maximum.
    fn nvmlDeviceGetMigDeviceHandleByIndex(
        device: nvmlDevice_t,
        index: c_uint,
        migDevice: *mut nvmlDevice_t,
    ) |api| {
        let (sim, d, _) = runtime::device(api, device)?;
        let m = out(migDevice)?;
        if d.hw.max_mig_devices == 0 {
            return Err(abi::NOT_SUPPORTED);
        }
        if index >= d.hw.max_mig_devices {
            return Err(abi::INVALID_ARGUMENT);
        }
        let inst = d.hw.mig.get(index as usize).ok_or(abi::NOT_FOUND)?;
        *m = sim.mig_handle(inst);
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        migDevice: nvmlDevice_t,
        device: *mut nvmlDevice_t,
    ) |api| {
        let (sim, target, _) =
            runtime::target(api, migDevice)?;
        let p = out(device)?;
        match target {
            Target::Mig(parent, _) => {
                *p = sim.handle(parent);
                Ok(())
            }
            Target::Gpu(_) => Err(abi::INVALID_ARGUMENT),
        }
    }
}

nvml_fn! {
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, isMigDevice: *mut c_uint) |api| {
        let (_, target, _) = runtime::target(api, device)?;
        *out(isMigDevice)? = matches!(target, Target::Mig(..)) as c_uint;
        Ok(())
    }
}

nvml_fn! {
    /// The GPU instance id of a MIG device (a GPU handle: `NVML_ERROR_NOT_SUPPORTED`).
    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) |api| {
        let (_, target, _) = runtime::target(api, device)?;
        let slot = out(id)?;
        match target {
            Target::Mig(_, m) => {
                *slot = m.gpu_instance_id;
                Ok(())
            }
            Target::Gpu(_) => Err(abi::NOT_SUPPORTED),
        }
    }
}

nvml_fn! {
    /// The compute instance id of a MIG device (a GPU handle: `NVML_ERROR_NOT_SUPPORTED`).
    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) |api| {
        let (_, target, _) = runtime::target(api, device)?;
        let slot = out(id)?;
        match target {
            Target::Mig(_, m) => {
                *slot = m.compute_instance_id;
                Ok(())
            }
            Target::Gpu(_) => Err(abi::NOT_SUPPORTED),
        }
    }
}
