//! MIG devices: the instance list of a GPU with MIG mode on, handles of MIG devices, and the
//! calls that map between a MIG device and its parent. Name, UUID, memory and process lists
//! answer for MIG handles in [`super::device`] and [`super::process`]; every other device call
//! returns `NVML_ERROR_NOT_SUPPORTED` for them (see [`crate::runtime::device`]).

use std::os::raw::c_uint;

use super::{nvml_body, out};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::runtime::{self, Target};

/// How many MIG devices the GPU can hold (not how many exist: look them up by index and skip
/// `NVML_ERROR_NOT_FOUND`). A GPU without MIG support: `NVML_ERROR_NOT_SUPPORTED`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, d, _) = runtime::device(Api::nvmlDeviceGetMaxMigDeviceCount, device)?;
        let c = out(count)?;
        if d.hw.max_mig_devices == 0 {
            return Err(abi::NOT_SUPPORTED);
        }
        *c = d.hw.max_mig_devices;
        Ok(())
    })
}

/// The MIG device at `index`: `NVML_ERROR_NOT_FOUND` for a free slot (below the maximum),
/// `NVML_ERROR_INVALID_ARGUMENT` past the maximum.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> Ret {
    nvml_body!({
        let (sim, d, _) = runtime::device(Api::nvmlDeviceGetMigDeviceHandleByIndex, device)?;
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
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    nvml_body!({
        let (sim, target, _) =
            runtime::target(Api::nvmlDeviceGetDeviceHandleFromMigDeviceHandle, migDevice)?;
        let p = out(device)?;
        match target {
            Target::Mig(parent, _) => {
                *p = sim.handle(parent);
                Ok(())
            }
            Target::Gpu(_) => Err(abi::INVALID_ARGUMENT),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, target, _) = runtime::target(Api::nvmlDeviceIsMigDeviceHandle, device)?;
        *out(isMigDevice)? = matches!(target, Target::Mig(..)) as c_uint;
        Ok(())
    })
}

/// The GPU instance id of a MIG device (a GPU handle: `NVML_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    nvml_body!({
        let (_, target, _) = runtime::target(Api::nvmlDeviceGetGpuInstanceId, device)?;
        let slot = out(id)?;
        match target {
            Target::Mig(_, m) => {
                *slot = m.gpu_instance_id;
                Ok(())
            }
            Target::Gpu(_) => Err(abi::NOT_SUPPORTED),
        }
    })
}

/// The compute instance id of a MIG device (a GPU handle: `NVML_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    nvml_body!({
        let (_, target, _) = runtime::target(Api::nvmlDeviceGetComputeInstanceId, device)?;
        let slot = out(id)?;
        match target {
            Target::Mig(_, m) => {
                *slot = m.compute_instance_id;
                Ok(())
            }
            Target::Gpu(_) => Err(abi::NOT_SUPPORTED),
        }
    })
}
