//! Compiling `[[fault]]` tables: which keys each fault kind takes, the `field` or `function`
//! resolved to a mask of NVML calls, device calls routed to the devices picked and system calls
//! to the system's fault set, lost GPUs, the init error and the driver disappearing.

use std::time::Duration;

use super::no_such_device;
use super::schema::{FaultKind, RawFault};
use crate::abi;
use crate::api::Api;
use crate::model::{Action, Device, DriverGone, Fault, FaultSet, InitFault, Window};

pub(super) fn compile_fault(
    raw: &RawFault,
    devices: &mut [Device],
    system: &mut FaultSet,
    init_fault: &mut Option<InitFault>,
    driver_gone: &mut Vec<DriverGone>,
) -> Result<(), String> {
    let n = devices.len() as u32;
    let window = Window {
        from: raw.from_s.unwrap_or(f64::NEG_INFINITY),
        until: raw.until_s.unwrap_or(f64::INFINITY),
    };
    if window.from >= window.until {
        return Err(format!(
            "from_s ({}) must be before until_s ({})",
            window.from, window.until
        ));
    }
    let targets: Vec<u32> = match (raw.device, &raw.devices) {
        (Some(_), Some(_)) => return Err("use `device = N` or `devices = [..]`, not both".into()),
        (Some(d), None) => vec![d],
        (None, Some(ds)) => ds.clone(),
        (None, None) => (0..n).collect(),
    };
    if let Some(bad) = targets.iter().find(|d| **d >= n) {
        return Err(no_such_device(*bad, n));
    }
    let error = match &raw.error {
        Some(name) => Some(abi::return_code_by_name(name).ok_or_else(|| {
            let names: Vec<&str> = abi::RETURN_CODES
                .iter()
                .filter(|(c, _, _)| *c != abi::SUCCESS)
                .map(|(_, n, _)| *n)
                .collect();
            format!("unknown error {name:?}; use one of: {}", names.join(", "))
        })?),
        None => None,
    };
    let only = |allowed: &[&str]| -> Result<(), String> {
        let given = [
            ("device", raw.device.is_some()),
            ("devices", raw.devices.is_some()),
            ("field", raw.field.is_some()),
            ("function", raw.function.is_some()),
            ("error", raw.error.is_some()),
            ("from_s", raw.from_s.is_some()),
            ("until_s", raw.until_s.is_some()),
            ("delay_ms", raw.delay_ms.is_some()),
            ("attempts", raw.attempts.is_some()),
        ];
        match given.iter().find(|(k, set)| *set && !allowed.contains(k)) {
            Some((k, _)) => Err(format!(
                "`{k}` does not apply to a fault of kind {:?}; it takes: {}",
                raw.kind,
                allowed.join(", ")
            )),
            None => Ok(()),
        }
    };
    match raw.kind {
        FaultKind::Error | FaultKind::Slow => {
            let slow = raw.kind == FaultKind::Slow;
            if slow {
                only(&[
                    "device", "devices", "field", "function", "from_s", "until_s", "delay_ms",
                ])?;
            } else {
                only(&[
                    "device", "devices", "field", "function", "error", "from_s", "until_s",
                ])?;
            }
            let apis = match (&raw.field, &raw.function) {
                (Some(_), Some(_)) => return Err("use `field` or `function`, not both".into()),
                (None, None) => {
                    return Err(format!(
                        "a fault of kind {:?} needs `field = \"...\"` (one of: {}) or \
                         `function = \"nvmlDevice...\"`",
                        raw.kind,
                        Api::field_names().join(", ")
                    ))
                }
                (Some(f), None) => Api::mask_for_field(f).ok_or_else(|| {
                    format!(
                        "unknown field {f:?}; use one of: {}",
                        Api::field_names().join(", ")
                    )
                })?,
                (None, Some(f)) => Api::mask_for_function(f).ok_or_else(|| {
                    format!(
                        "nvml-sim does not export a function named {f:?}; check the spelling \
                         (e.g. \"nvmlDeviceGetFanSpeed_v2\") or use `field`"
                    )
                })?,
            };
            let action = if slow {
                let ms = raw
                    .delay_ms
                    .ok_or("a fault of kind \"slow\" needs `delay_ms`")?;
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(format!("delay_ms must be >= 0, got {ms}"));
                }
                Action::Delay(Duration::from_secs_f64(ms / 1000.0))
            } else {
                Action::Fail(error.unwrap_or(abi::NOT_SUPPORTED))
            };
            let device_apis: u128 = Api::ALL
                .iter()
                .filter(|a| a.is_device_call())
                .fold(0, |m, a| m | a.bit());
            let picked_devices = raw.device.is_some() || raw.devices.is_some();
            if picked_devices && apis & device_apis == 0 {
                return Err(
                    "this field/function is not a device call (it takes no device handle); \
                     drop `device`/`devices`"
                        .into(),
                );
            }
            if apis & device_apis != 0 {
                for d in &targets {
                    devices[*d as usize].faults.push(Fault {
                        apis: apis & device_apis,
                        window,
                        action,
                    });
                }
            }
            // A field spanning both kinds (`events`) with devices picked hits only those
            // devices' calls; without a pick it also hits the system calls.
            if apis & !device_apis != 0 && !picked_devices {
                system.push(Fault {
                    apis: apis & !device_apis,
                    window,
                    action,
                });
            }
        }
        FaultKind::GpuLost => {
            only(&["device", "devices", "from_s", "until_s"])?;
            if raw.device.is_none() && raw.devices.is_none() {
                return Err(
                    "a gpu_lost fault needs `device = N` (or `devices = [..]`): losing every GPU \
                     is a `driver_gone` fault"
                        .into(),
                );
            }
            if raw.from_s.is_none() {
                return Err(
                    "a gpu_lost fault needs `from_s` (when the GPU falls off the bus)".into(),
                );
            }
            for d in &targets {
                devices[*d as usize].lost.push(window);
            }
        }
        FaultKind::InitError => {
            only(&["error", "attempts"])?;
            let error = error.ok_or(
                "an init_error fault needs `error` (e.g. \"driver_not_loaded\", \"no_permission\")",
            )?;
            if init_fault.is_some() {
                return Err("only one init_error fault is allowed".into());
            }
            *init_fault = Some(InitFault {
                error,
                attempts: raw.attempts.unwrap_or(u32::MAX),
            });
        }
        FaultKind::DriverGone => {
            only(&["error", "from_s", "until_s"])?;
            if raw.from_s.is_none() {
                return Err("a driver_gone fault needs `from_s`".into());
            }
            driver_gone.push(DriverGone {
                window,
                error: error.unwrap_or(abi::nvmlReturn_enum_NVML_ERROR_UNKNOWN),
            });
        }
    }
    Ok(())
}
