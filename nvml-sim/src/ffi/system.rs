//! Library lifetime (init, shutdown, error strings), system queries (driver, NVML and CUDA
//! versions, process names), the device count and device lookups.

use std::os::raw::{c_char, c_int, c_uint, c_ulonglong};

use super::{check_signature, nvml_body, nvml_fn, out, read_str, write_str};
use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::runtime;
use crate::scenario::parse_bus_id;

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    nvml_body!({
        match runtime::init() {
            abi::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}
check_signature!(nvmlInit_v2);

/// The original `nvmlInit` (NVML 1-era); same behaviour.
#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}
check_signature!(nvmlInit as extern "C" fn() -> Ret);

/// `flags` (`NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`) change nothing here: the
/// simulated devices need no attaching.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}
check_signature!(nvmlInitWithFlags);

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    nvml_body!({
        match runtime::shutdown() {
            abi::SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}
check_signature!(nvmlShutdown);

/// Not NVML: the simulator's own. The `index`-th NVML function this library exports (its C
/// name into `name`, a buffer of `length` bytes) and how many times it was called in this process
/// since the library was loaded, answered or not; `NVML_ERROR_NOT_FOUND` past the last. For
/// tests that compare the calls of two clients (tests/floor.rs: the benchmark floor against
/// gpulse's sampler). Works before init.
#[no_mangle]
pub unsafe extern "C" fn nvmlSimGetCallCount(
    index: c_uint,
    name: *mut c_char,
    length: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    nvml_body!({
        let api = Api::ALL.get(index as usize).ok_or(abi::NOT_FOUND)?;
        write_str(name, length, api.c_name())?;
        *out(count)? = runtime::call_count(*api);
        Ok(())
    })
}

/// Works before init, as the driver's does. The strings are static.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    abi::RETURN_CODES
        .iter()
        .find(|(c, _, _)| *c == result)
        .map_or("Unknown Error\0", |(_, _, text)| text)
        .as_ptr()
        .cast()
}
check_signature!(nvmlErrorString);

nvml_fn! {
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) |api| {
        let (sim, _) = runtime::session(api)?;
        write_str(version, length, &sim.driver_version)
    }
}

nvml_fn! {
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) |api| {
        let (sim, _) = runtime::session(api)?;
        write_str(version, length, &sim.nvml_version)
    }
}

nvml_fn! {
    fn nvmlSystemGetCudaDriverVersion(cudaDriverVersion: *mut c_int) |api| {
        let (sim, _) = runtime::session(api)?;
        *out(cudaDriverVersion)? = sim.cuda_version;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion: *mut c_int) |api| {
        let (sim, _) = runtime::session(api)?;
        *out(cudaDriverVersion)? = sim.cuda_version;
        Ok(())
    }
}

nvml_fn! {
    /// The scenario's `name` for a PID it lists, else the name in `/proc/<pid>/comm` (as the driver
    /// does), else `NVML_ERROR_NOT_FOUND`. Cropped to `length`, like the driver.
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) |api| {
        let (sim, _) = runtime::session(api)?;
        if name.is_null() || length == 0 {
            return Err(abi::INVALID_ARGUMENT);
        }
        let listed = sim
            .devices
            .iter()
            .flat_map(|d| d.processes.iter())
            .find(|p| p.pid == pid)
            .and_then(|p| p.name.clone());
        let found = match listed {
            Some(n) => n,
            None => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim_end().to_string())
                .map_err(|_| abi::NOT_FOUND)?,
        };
        let mut end = found.len().min(length as usize - 1);
        while !found.is_char_boundary(end) {
            end -= 1;
        }
        write_str(name, length, &found[..end])
    }
}

nvml_fn! {
    fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) |api| {
        let (sim, _) = runtime::session(api)?;
        *out(deviceCount)? = sim.devices.len() as c_uint;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlDeviceGetCount(
        deviceCount: *mut c_uint,
    ) as unsafe extern "C" fn(*mut c_uint) -> Ret |api| {
        let (sim, _) = runtime::session(api)?;
        *out(deviceCount)? = sim.devices.len() as c_uint;
        Ok(())
    }
}

unsafe fn by_index(api: Api, index: c_uint, device: *mut nvmlDevice_t) -> Result<(), Ret> {
    let (sim, t) = runtime::session(api)?;
    let slot = out(device)?;
    let dev = sim
        .devices
        .get(index as usize)
        .ok_or(abi::INVALID_ARGUMENT)?;
    runtime::checked(sim, dev, api, t)?;
    *slot = sim.handle(dev);
    Ok(())
}

nvml_fn! {
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) |api| {
        by_index(api, index, device)
    }
}

nvml_fn! {
    fn nvmlDeviceGetHandleByIndex(
        index: c_uint,
        device: *mut nvmlDevice_t,
    ) as unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> Ret |api| {
        by_index(api, index, device)
    }
}

unsafe fn by_match(
    api: Api,
    key: *const c_char,
    device: *mut nvmlDevice_t,
    matches: impl Fn(&crate::model::Device, &str) -> bool,
) -> Result<(), Ret> {
    let (sim, t) = runtime::session(api)?;
    let key = read_str(key)?;
    let slot = out(device)?;
    let dev = sim
        .devices
        .iter()
        .find(|d| matches(d, key))
        .ok_or(abi::NOT_FOUND)?;
    runtime::checked(sim, dev, api, t)?;
    *slot = sim.handle(dev);
    Ok(())
}

nvml_fn! {
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) |api| {
        by_match(api, uuid, device, |d, k| {
            d.uuid == k
        })
    }
}

nvml_fn! {
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) |api| {
        by_match(api, serial, device, |d, k| {
            d.serial == k
        })
    }
}

fn bus_matches(d: &crate::model::Device, key: &str) -> bool {
    parse_bus_id(key)
        .is_some_and(|(dom, bus, dev, _)| dom == d.domain && bus == d.bus && dev == d.pci_device)
}

nvml_fn! {
    fn nvmlDeviceGetHandleByPciBusId_v2(pciBusId: *const c_char, device: *mut nvmlDevice_t) |api| {
        by_match(
            api,
            pciBusId,
            device,
            bus_matches,
        )
    }
}

nvml_fn! {
    fn nvmlDeviceGetHandleByPciBusId(
        pciBusId: *const c_char,
        device: *mut nvmlDevice_t,
    ) as unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> Ret |api| {
        by_match(
            api,
            pciBusId,
            device,
            bus_matches,
        )
    }
}
