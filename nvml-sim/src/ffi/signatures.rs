//! Compile-time proof that every exported function has the signature `nvml.h` gives it: each
//! one is passed where the matching `NvmlLib` field's function-pointer type is expected, so a
//! wrong parameter or return type fails the build. The few entry points that write an older,
//! shorter struct than the one `nvml-wrapper-sys` declares, and the legacy names it only
//! declares behind its `legacy-functions` feature (not enabled: it would change what gpulse's
//! `NvmlLib` loads), are checked against types written from `nvml.h` at the end.

#![allow(dead_code)]

use nvml_wrapper_sys::bindings::NvmlLib;

fn same<T, E>(_: &Result<T, E>, _: T) {}

/// Never called: it only has to type-check.
fn signatures_match(lib: &NvmlLib) {
    same(
        &lib.nvmlDeviceGetArchitecture,
        crate::nvmlDeviceGetArchitecture,
    );
    same(
        &lib.nvmlDeviceGetBAR1MemoryInfo,
        crate::nvmlDeviceGetBAR1MemoryInfo,
    );
    same(&lib.nvmlDeviceGetBrand, crate::nvmlDeviceGetBrand);
    same(&lib.nvmlDeviceGetClock, crate::nvmlDeviceGetClock);
    same(&lib.nvmlDeviceGetClockInfo, crate::nvmlDeviceGetClockInfo);
    same(
        &lib.nvmlDeviceGetComputeMode,
        crate::nvmlDeviceGetComputeMode,
    );
    same(
        &lib.nvmlDeviceGetComputeRunningProcesses_v3,
        crate::nvmlDeviceGetComputeRunningProcesses_v3,
    );
    same(&lib.nvmlDeviceGetCount_v2, crate::nvmlDeviceGetCount_v2);
    same(
        &lib.nvmlDeviceGetCudaComputeCapability,
        crate::nvmlDeviceGetCudaComputeCapability,
    );
    same(
        &lib.nvmlDeviceGetCurrPcieLinkGeneration,
        crate::nvmlDeviceGetCurrPcieLinkGeneration,
    );
    same(
        &lib.nvmlDeviceGetCurrPcieLinkWidth,
        crate::nvmlDeviceGetCurrPcieLinkWidth,
    );
    same(
        &lib.nvmlDeviceGetCurrentClocksEventReasons,
        crate::nvmlDeviceGetCurrentClocksEventReasons,
    );
    same(
        &lib.nvmlDeviceGetCurrentClocksThrottleReasons,
        crate::nvmlDeviceGetCurrentClocksThrottleReasons,
    );
    same(
        &lib.nvmlDeviceGetDecoderUtilization,
        crate::nvmlDeviceGetDecoderUtilization,
    );
    same(&lib.nvmlDeviceGetEccMode, crate::nvmlDeviceGetEccMode);
    same(
        &lib.nvmlDeviceGetEncoderUtilization,
        crate::nvmlDeviceGetEncoderUtilization,
    );
    same(
        &lib.nvmlDeviceGetEnforcedPowerLimit,
        crate::nvmlDeviceGetEnforcedPowerLimit,
    );
    same(&lib.nvmlDeviceGetFanSpeed, crate::nvmlDeviceGetFanSpeed);
    same(
        &lib.nvmlDeviceGetFanSpeed_v2,
        crate::nvmlDeviceGetFanSpeed_v2,
    );
    same(
        &lib.nvmlDeviceGetGraphicsRunningProcesses_v3,
        crate::nvmlDeviceGetGraphicsRunningProcesses_v3,
    );
    same(
        &lib.nvmlDeviceGetHandleByIndex_v2,
        crate::nvmlDeviceGetHandleByIndex_v2,
    );
    same(
        &lib.nvmlDeviceGetHandleByPciBusId_v2,
        crate::nvmlDeviceGetHandleByPciBusId_v2,
    );
    same(
        &lib.nvmlDeviceGetHandleBySerial,
        crate::nvmlDeviceGetHandleBySerial,
    );
    same(
        &lib.nvmlDeviceGetHandleByUUID,
        crate::nvmlDeviceGetHandleByUUID,
    );
    same(&lib.nvmlDeviceGetIndex, crate::nvmlDeviceGetIndex);
    same(
        &lib.nvmlDeviceGetMPSComputeRunningProcesses_v3,
        crate::nvmlDeviceGetMPSComputeRunningProcesses_v3,
    );
    same(
        &lib.nvmlDeviceGetMaxClockInfo,
        crate::nvmlDeviceGetMaxClockInfo,
    );
    same(
        &lib.nvmlDeviceGetMaxPcieLinkGeneration,
        crate::nvmlDeviceGetMaxPcieLinkGeneration,
    );
    same(
        &lib.nvmlDeviceGetMaxPcieLinkWidth,
        crate::nvmlDeviceGetMaxPcieLinkWidth,
    );
    same(&lib.nvmlDeviceGetMemoryInfo, crate::nvmlDeviceGetMemoryInfo);
    same(
        &lib.nvmlDeviceGetMemoryInfo_v2,
        crate::nvmlDeviceGetMemoryInfo_v2,
    );
    same(&lib.nvmlDeviceGetMigMode, crate::nvmlDeviceGetMigMode);
    same(
        &lib.nvmlDeviceGetMinorNumber,
        crate::nvmlDeviceGetMinorNumber,
    );
    same(&lib.nvmlDeviceGetName, crate::nvmlDeviceGetName);
    same(&lib.nvmlDeviceGetNumFans, crate::nvmlDeviceGetNumFans);
    same(&lib.nvmlDeviceGetPciInfo_v3, crate::nvmlDeviceGetPciInfo_v3);
    same(
        &lib.nvmlDeviceGetPcieThroughput,
        crate::nvmlDeviceGetPcieThroughput,
    );
    same(
        &lib.nvmlDeviceGetPerformanceState,
        crate::nvmlDeviceGetPerformanceState,
    );
    same(
        &lib.nvmlDeviceGetPersistenceMode,
        crate::nvmlDeviceGetPersistenceMode,
    );
    same(
        &lib.nvmlDeviceGetPowerManagementDefaultLimit,
        crate::nvmlDeviceGetPowerManagementDefaultLimit,
    );
    same(
        &lib.nvmlDeviceGetPowerManagementLimit,
        crate::nvmlDeviceGetPowerManagementLimit,
    );
    same(
        &lib.nvmlDeviceGetPowerManagementLimitConstraints,
        crate::nvmlDeviceGetPowerManagementLimitConstraints,
    );
    same(&lib.nvmlDeviceGetPowerState, crate::nvmlDeviceGetPowerState);
    same(&lib.nvmlDeviceGetPowerUsage, crate::nvmlDeviceGetPowerUsage);
    same(
        &lib.nvmlDeviceGetProcessUtilization,
        crate::nvmlDeviceGetProcessUtilization,
    );
    same(
        &lib.nvmlDeviceGetRemappedRows,
        crate::nvmlDeviceGetRemappedRows,
    );
    same(
        &lib.nvmlDeviceGetRetiredPages,
        crate::nvmlDeviceGetRetiredPages,
    );
    same(
        &lib.nvmlDeviceGetRetiredPagesPendingStatus,
        crate::nvmlDeviceGetRetiredPagesPendingStatus,
    );
    same(
        &lib.nvmlDeviceGetRetiredPages_v2,
        crate::nvmlDeviceGetRetiredPages_v2,
    );
    same(&lib.nvmlDeviceGetSerial, crate::nvmlDeviceGetSerial);
    same(
        &lib.nvmlDeviceGetSupportedClocksEventReasons,
        crate::nvmlDeviceGetSupportedClocksEventReasons,
    );
    same(
        &lib.nvmlDeviceGetSupportedClocksThrottleReasons,
        crate::nvmlDeviceGetSupportedClocksThrottleReasons,
    );
    same(
        &lib.nvmlDeviceGetSupportedEventTypes,
        crate::nvmlDeviceGetSupportedEventTypes,
    );
    same(
        &lib.nvmlDeviceGetTemperature,
        crate::nvmlDeviceGetTemperature,
    );
    same(
        &lib.nvmlDeviceGetTemperatureThreshold,
        crate::nvmlDeviceGetTemperatureThreshold,
    );
    same(
        &lib.nvmlDeviceGetTemperatureV,
        crate::nvmlDeviceGetTemperatureV,
    );
    same(
        &lib.nvmlDeviceGetTotalEccErrors,
        crate::nvmlDeviceGetTotalEccErrors,
    );
    same(
        &lib.nvmlDeviceGetTotalEnergyConsumption,
        crate::nvmlDeviceGetTotalEnergyConsumption,
    );
    same(&lib.nvmlDeviceGetUUID, crate::nvmlDeviceGetUUID);
    same(
        &lib.nvmlDeviceGetUtilizationRates,
        crate::nvmlDeviceGetUtilizationRates,
    );
    same(
        &lib.nvmlDeviceGetVbiosVersion,
        crate::nvmlDeviceGetVbiosVersion,
    );
    same(
        &lib.nvmlDeviceRegisterEvents,
        crate::nvmlDeviceRegisterEvents,
    );
    same(&lib.nvmlErrorString, crate::nvmlErrorString);
    same(&lib.nvmlEventSetCreate, crate::nvmlEventSetCreate);
    same(&lib.nvmlEventSetFree, crate::nvmlEventSetFree);
    same(&lib.nvmlEventSetWait_v2, crate::nvmlEventSetWait_v2);
    same(&lib.nvmlInitWithFlags, crate::nvmlInitWithFlags);
    same(&lib.nvmlInit_v2, crate::nvmlInit_v2);
    same(&lib.nvmlShutdown, crate::nvmlShutdown);
    same(
        &lib.nvmlSystemGetCudaDriverVersion,
        crate::nvmlSystemGetCudaDriverVersion,
    );
    same(
        &lib.nvmlSystemGetCudaDriverVersion_v2,
        crate::nvmlSystemGetCudaDriverVersion_v2,
    );
    same(
        &lib.nvmlSystemGetDriverVersion,
        crate::nvmlSystemGetDriverVersion,
    );
    same(
        &lib.nvmlSystemGetNVMLVersion,
        crate::nvmlSystemGetNVMLVersion,
    );
    same(
        &lib.nvmlSystemGetProcessName,
        crate::nvmlSystemGetProcessName,
    );
    same(
        &lib.nvmlDeviceGetMaxMigDeviceCount,
        crate::nvmlDeviceGetMaxMigDeviceCount,
    );
    same(
        &lib.nvmlDeviceGetMigDeviceHandleByIndex,
        crate::nvmlDeviceGetMigDeviceHandleByIndex,
    );
    same(
        &lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
        crate::nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    );
    same(
        &lib.nvmlDeviceIsMigDeviceHandle,
        crate::nvmlDeviceIsMigDeviceHandle,
    );
    same(
        &lib.nvmlDeviceGetGpuInstanceId,
        crate::nvmlDeviceGetGpuInstanceId,
    );
    same(
        &lib.nvmlDeviceGetComputeInstanceId,
        crate::nvmlDeviceGetComputeInstanceId,
    );
    same(
        &lib.nvmlGpmQueryDeviceSupport,
        crate::nvmlGpmQueryDeviceSupport,
    );
    same(
        &lib.nvmlGpmQueryIfStreamingEnabled,
        crate::nvmlGpmQueryIfStreamingEnabled,
    );
    same(&lib.nvmlGpmSampleAlloc, crate::nvmlGpmSampleAlloc);
    same(&lib.nvmlGpmSampleFree, crate::nvmlGpmSampleFree);
    same(&lib.nvmlGpmSampleGet, crate::nvmlGpmSampleGet);
    same(&lib.nvmlGpmMigSampleGet, crate::nvmlGpmMigSampleGet);
    same(&lib.nvmlGpmMetricsGet, crate::nvmlGpmMetricsGet);
    same(
        &lib.nvmlDeviceGetNvLinkState,
        crate::nvmlDeviceGetNvLinkState,
    );
    same(
        &lib.nvmlDeviceGetFieldValues,
        crate::nvmlDeviceGetFieldValues,
    );
    same(
        &lib.nvmlDeviceGetViolationStatus,
        crate::nvmlDeviceGetViolationStatus,
    );
    same(
        &lib.nvmlDeviceGetPcieReplayCounter,
        crate::nvmlDeviceGetPcieReplayCounter,
    );
}

/// The older layouts and legacy names, typed from `nvml.h`.
fn legacy_signatures() {
    use crate::abi::*;
    use std::os::raw::{c_char, c_uint};
    type List<T> = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut T) -> Ret;
    let _: List<nvmlProcessInfo_v1_t> = crate::nvmlDeviceGetComputeRunningProcesses;
    let _: List<nvmlProcessInfo_v1_t> = crate::nvmlDeviceGetGraphicsRunningProcesses;
    let _: List<nvmlProcessInfo_v1_t> = crate::nvmlDeviceGetMPSComputeRunningProcesses;
    let _: List<nvmlProcessInfo_t> = crate::nvmlDeviceGetComputeRunningProcesses_v2;
    let _: List<nvmlProcessInfo_t> = crate::nvmlDeviceGetGraphicsRunningProcesses_v2;
    let _: List<nvmlProcessInfo_t> = crate::nvmlDeviceGetMPSComputeRunningProcesses_v2;
    let _: unsafe extern "C" fn(*mut c_uint) -> Ret = crate::nvmlDeviceGetCount;
    let _: unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> Ret =
        crate::nvmlDeviceGetHandleByIndex;
    let _: unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> Ret =
        crate::nvmlDeviceGetHandleByPciBusId;
    let _: extern "C" fn() -> Ret = crate::nvmlInit;
    let _: unsafe extern "C" fn(nvmlDevice_t, *mut PciInfoV1) -> Ret = crate::nvmlDeviceGetPciInfo;
    let _: unsafe extern "C" fn(nvmlDevice_t, *mut PciInfoV2) -> Ret =
        crate::nvmlDeviceGetPciInfo_v2;
    let _: unsafe extern "C" fn(nvmlEventSet_t, *mut EventDataV1, c_uint) -> Ret =
        crate::nvmlEventSetWait;
}
