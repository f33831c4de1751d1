//! The event-set API: create, register a device's event types, wait (blocking, sleeping up to
//! the timeout), free. Sets are reference counted so that a free racing a wait on another
//! thread cannot pull memory from under the waiter.

use std::os::raw::c_uint;
use std::sync::Arc;

use super::{nvml_fn, out};
use crate::abi::{self, nvmlDevice_t, nvmlEventSet_t, Ret};
use crate::api::Api;
use crate::events::{self, Delivered, EventSet};
use crate::model::Sim;
use crate::runtime;

fn lookup(set: nvmlEventSet_t) -> Result<Arc<EventSet>, Ret> {
    events::lookup(set as usize).ok_or(abi::INVALID_ARGUMENT)
}

nvml_fn! {
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) |api| {
        runtime::session(api)?;
        let slot = out(set)?;
        *slot = Arc::as_ptr(&events::create()) as nvmlEventSet_t;
        Ok(())
    }
}

nvml_fn! {
    fn nvmlEventSetFree(set: nvmlEventSet_t) |api| {
        runtime::session(api)?;
        if events::free(set as usize) {
            Ok(())
        } else {
            Err(abi::INVALID_ARGUMENT)
        }
    }
}

nvml_fn! {
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, eventTypes: *mut u64) |api| {
        let (_, d, _) = runtime::device(api, device)?;
        *out(eventTypes)? = d.supported_events;
        Ok(())
    }
}

nvml_fn! {
    /// Asking for a type the device does not support is `NVML_ERROR_NOT_SUPPORTED`, as with the
    /// driver.
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, eventTypes: u64, set: nvmlEventSet_t) |api| {
        let (_, d, t) = runtime::device(api, device)?;
        let es = lookup(set)?;
        if eventTypes & !d.supported_events != 0 {
            return Err(abi::NOT_SUPPORTED);
        }
        es.register(d.index, eventTypes, t);
        Ok(())
    }
}

unsafe fn wait(
    api: Api,
    set: nvmlEventSet_t,
    timeout_ms: c_uint,
) -> Result<(&'static Sim, Delivered), Ret> {
    let (sim, _) = runtime::session(api)?;
    let es = lookup(set)?;
    let ev = es.wait(sim, timeout_ms)?;
    Ok((sim, ev))
}

nvml_fn! {
    fn nvmlEventSetWait_v2(
        set: nvmlEventSet_t,
        data: *mut abi::nvmlEventData_t,
        timeoutms: c_uint,
    ) |api| {
        let slot = out(data)?;
        let (sim, ev) = wait(api, set, timeoutms)?;
        let dev = sim.devices.get(ev.device as usize).ok_or(abi::UNKNOWN)?;
        *slot = abi::nvmlEventData_t {
            device: sim.handle(dev),
            eventType: ev.event_type,
            eventData: ev.data,
            gpuInstanceId: abi::NO_INSTANCE,
            computeInstanceId: abi::NO_INSTANCE,
        };
        Ok(())
    }
}

nvml_fn! {
    /// The v1 struct lacks the MIG instance ids; only its 24 bytes are written.
    fn nvmlEventSetWait(
        set: nvmlEventSet_t,
        data: *mut abi::EventDataV1,
        timeoutms: c_uint,
    ) as unsafe extern "C" fn(nvmlEventSet_t, *mut abi::EventDataV1, c_uint) -> Ret |api| {
        let slot = out(data)?;
        let (sim, ev) = wait(api, set, timeoutms)?;
        let dev = sim.devices.get(ev.device as usize).ok_or(abi::UNKNOWN)?;
        *slot = abi::EventDataV1 {
            device: sim.handle(dev),
            event_type: ev.event_type,
            event_data: ev.data,
        };
        Ok(())
    }
}
