//! The C ABI this library promises: struct layouts (the `repr(C)` types of `nvml-wrapper-sys`,
//! pinned here to the sizes in NVIDIA's `nvml.h` at compile time), the older struct layouts that
//! the unversioned and `_v1`/`_v2` entry points still write, struct version words, and short
//! aliases for the return codes.

use std::mem::size_of;

/// `NVML_FI_*` field ids (a module in `nvml-wrapper-sys`).
pub use nvml_wrapper_sys::bindings::field_id;
pub use nvml_wrapper_sys::bindings::*;

// Sizes from nvml.h (x86_64 / aarch64 LP64). A mismatch here would silently corrupt the caller's
// memory, so it must fail the build instead.
const _: () = assert!(size_of::<nvmlMemory_t>() == 24);
const _: () = assert!(size_of::<nvmlMemory_v2_t>() == 40);
const _: () = assert!(size_of::<nvmlProcessInfo_t>() == 24);
const _: () = assert!(size_of::<nvmlProcessInfo_v1_t>() == 16);
const _: () = assert!(size_of::<nvmlPciInfo_t>() == 68);
const _: () = assert!(size_of::<nvmlUtilization_t>() == 8);
const _: () = assert!(size_of::<nvmlProcessUtilizationSample_t>() == 32);
const _: () = assert!(size_of::<nvmlEventData_t>() == 32);
const _: () = assert!(size_of::<nvmlTemperature_v1_t>() == 12);
const _: () = assert!(size_of::<nvmlBAR1Memory_t>() == 24);
const _: () = assert!(size_of::<nvmlDevice_t>() == size_of::<usize>());
const _: () = assert!(size_of::<PciInfoV1>() == 32);
const _: () = assert!(size_of::<PciInfoV2>() == 36);
const _: () = assert!(size_of::<EventDataV1>() == 24);
const _: () = assert!(size_of::<nvmlFieldValue_t>() == 40);
const _: () = assert!(size_of::<nvmlViolationTime_t>() == 16);
const _: () = assert!(size_of::<nvmlGpmSupport_t>() == 8);
// nvmlGpmMetric_t: metricId, nvmlReturn, double value, three char* (4 + 4 + 8 + 24).
const _: () = assert!(size_of::<nvmlGpmMetric_t>() == 40);
// nvmlGpmMetricsGet_t: version, numMetrics, two sample handles, NVML_GPM_METRIC_MAX metrics.
const _: () = assert!(size_of::<nvmlGpmMetricsGet_t>() == 8 + 16 + 210 * 40);
// nvmlFieldValue_t, every member (nvml.h 13.3.29, as go-nvml vendors it): fieldId, scopeId,
// timestamp, latencyUsec, valueType, nvmlReturn, then the 8-byte nvmlValue_t union.
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, fieldId) == 0);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, scopeId) == 4);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, timestamp) == 8);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, latencyUsec) == 16);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, valueType) == 24);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, nvmlReturn) == 28);
const _: () = assert!(std::mem::offset_of!(nvmlFieldValue_t, value) == 32);
const _: () = assert!(size_of::<nvmlValue_t>() == 8);
const _: () = assert!(field_id::NVML_FI_DEV_MEMORY_TEMP == 82);
const _: () = assert!(std::mem::offset_of!(nvmlGpmMetric_t, value) == 8);

/// `NVML_STRUCT_VERSION(Memory, 2)`: `sizeof(nvmlMemory_v2_t) | 2 << 24`.
pub const MEMORY_V2_VERSION: u32 = (size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24);
/// `NVML_STRUCT_VERSION(Temperature, 1)`.
pub const TEMPERATURE_V1_VERSION: u32 = (size_of::<nvmlTemperature_v1_t>() as u32) | (1 << 24);

/// The prefix of `nvmlPciInfo_t` that `nvmlDeviceGetPciInfo` (v1) fills: the legacy 16-byte
/// bus id and four ids. Older headers declared a larger struct whose tail was reserved; only
/// this prefix is written, so a caller built against any of them is safe.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoV1 {
    pub bus_id: [std::os::raw::c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
}

/// The prefix of `nvmlPciInfo_t` that `nvmlDeviceGetPciInfo_v2` fills (v1 plus the subsystem id).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfoV2 {
    pub v1: PciInfoV1,
    pub pci_sub_system_id: u32,
}

/// `nvmlEventData_t` as `nvmlEventSetWait` (v1) knows it: without the MIG instance ids.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDataV1 {
    pub device: nvmlDevice_t,
    pub event_type: u64,
    pub event_data: u64,
}

/// What NVML writes in `gpuInstanceId`/`computeInstanceId` when MIG is off.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

pub type Ret = nvmlReturn_t;
pub const SUCCESS: Ret = nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Ret = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Ret = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Ret = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Ret = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Ret = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: Ret = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const TIMEOUT: Ret = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const GPU_IS_LOST: Ret = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const ARGUMENT_VERSION_MISMATCH: Ret = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: Ret = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// Every return code with its snake_case scenario name and the text the real
/// `nvmlErrorString` gives (NUL-terminated so it can be handed to C as is).
pub const RETURN_CODES: &[(Ret, &str, &str)] = &[
    (0, "success", "Success\0"),
    (1, "uninitialized", "Uninitialized\0"),
    (2, "invalid_argument", "Invalid Argument\0"),
    (3, "not_supported", "Not Supported\0"),
    (4, "no_permission", "Insufficient Permissions\0"),
    (5, "already_initialized", "Already Initialized\0"),
    (6, "not_found", "Not Found\0"),
    (7, "insufficient_size", "Insufficient Size\0"),
    (8, "insufficient_power", "Insufficient External Power\0"),
    (9, "driver_not_loaded", "Driver Not Loaded\0"),
    (10, "timeout", "Timeout\0"),
    (11, "irq_issue", "Interrupt request issue\0"),
    (12, "library_not_found", "NVML Shared Library Not Found\0"),
    (13, "function_not_found", "Function Not Found\0"),
    (14, "corrupted_inforom", "Corrupted infoROM\0"),
    (15, "gpu_is_lost", "GPU is lost\0"),
    (16, "reset_required", "GPU requires restart\0"),
    (
        17,
        "operating_system",
        "The operating system has blocked the request.\0",
    ),
    (
        18,
        "lib_rm_version_mismatch",
        "RM has detected an NVML/RM version mismatch.\0",
    ),
    (19, "in_use", "In use by another client\0"),
    (20, "memory", "Insufficient Memory\0"),
    (21, "no_data", "No data\0"),
    (
        22,
        "vgpu_ecc_not_supported",
        "The requested vgpu operation is not available on target device, because ECC is enabled\0",
    ),
    (
        23,
        "insufficient_resources",
        "Ran out of critical resources, other than memory\0",
    ),
    (24, "freq_not_supported", "Frequency not supported\0"),
    (
        25,
        "argument_version_mismatch",
        "Argument version mismatch\0",
    ),
    (26, "deprecated", "Deprecated\0"),
    (27, "not_ready", "Not Ready\0"),
    (28, "gpu_not_found", "GPU not found\0"),
    (29, "invalid_state", "Invalid state\0"),
    (30, "reset_type_not_supported", "Reset type not supported\0"),
    (999, "unknown", "Unknown Error\0"),
];

/// The code for a scenario error name (`not_supported`, `NVML_ERROR_NOT_SUPPORTED`, ...).
pub fn return_code_by_name(name: &str) -> Option<Ret> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_prefix("nvml_error_").unwrap_or(&n);
    RETURN_CODES
        .iter()
        .find(|(_, short, _)| *short == n)
        .map(|(code, _, _)| *code)
}

/// The scenario name of a return code, for messages.
pub fn return_code_name(code: Ret) -> &'static str {
    RETURN_CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or("unknown", |(_, n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_versions_match_nvml_h() {
        assert_eq!(
            MEMORY_V2_VERSION, 0x0200_0028,
            "pynvml's nvmlMemory_v2 constant"
        );
        assert_eq!(
            TEMPERATURE_V1_VERSION, 0x0100_000C,
            "pynvml's nvmlTemperature_v1"
        );
    }

    #[test]
    fn return_codes_round_trip_by_name() {
        assert_eq!(return_code_by_name("not_supported"), Some(NOT_SUPPORTED));
        assert_eq!(
            return_code_by_name("NVML_ERROR_GPU_IS_LOST"),
            Some(GPU_IS_LOST)
        );
        assert_eq!(return_code_by_name("nope"), None);
        for (code, name, text) in RETURN_CODES {
            assert_eq!(return_code_by_name(name), Some(*code));
            assert!(text.ends_with('\0') && !text[..text.len() - 1].contains('\0'));
        }
    }
}
