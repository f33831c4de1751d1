//! The catalogue of exported NVML functions, each with the scenario *field* it reads. A fault in
//! a scenario names either a field (`field = "fan_speed"` hits every function reading fans) or
//! one C function (`function = "nvmlDeviceGetFanSpeed_v2"`); both resolve here, once, at load
//! time, into a bit mask so a call only tests one bit.

macro_rules! apis {
    ($($name:ident => $field:literal,)*) => {
        /// One exported NVML function (the variant is its C name).
        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Api { $($name,)* }

        impl Api {
            /// Every function, in declaration order.
            pub const ALL: &'static [Api] = &[$(Api::$name,)*];

            /// The C symbol name.
            pub fn c_name(self) -> &'static str {
                match self { $(Api::$name => stringify!($name),)* }
            }

            /// The scenario field this function reads.
            pub fn field(self) -> &'static str {
                match self { $(Api::$name => $field,)* }
            }
        }
    };
}

apis! {
    nvmlSystemGetDriverVersion => "driver_version",
    nvmlSystemGetNVMLVersion => "nvml_version",
    nvmlSystemGetCudaDriverVersion => "cuda_version",
    nvmlSystemGetCudaDriverVersion_v2 => "cuda_version",
    nvmlSystemGetProcessName => "process_name",
    nvmlDeviceGetCount => "device_count",
    nvmlDeviceGetCount_v2 => "device_count",
    nvmlEventSetCreate => "events",
    nvmlEventSetFree => "events",
    nvmlEventSetWait => "events",
    nvmlEventSetWait_v2 => "events",
    nvmlDeviceGetHandleByIndex => "handle",
    nvmlDeviceGetHandleByIndex_v2 => "handle",
    nvmlDeviceGetHandleByUUID => "handle",
    nvmlDeviceGetHandleByPciBusId => "handle",
    nvmlDeviceGetHandleByPciBusId_v2 => "handle",
    nvmlDeviceGetHandleBySerial => "handle",
    nvmlDeviceGetIndex => "index",
    nvmlDeviceGetName => "name",
    nvmlDeviceGetUUID => "uuid",
    nvmlDeviceGetSerial => "serial",
    nvmlDeviceGetPciInfo => "pci_info",
    nvmlDeviceGetPciInfo_v2 => "pci_info",
    nvmlDeviceGetPciInfo_v3 => "pci_info",
    nvmlDeviceGetMinorNumber => "minor_number",
    nvmlDeviceGetMemoryInfo => "memory",
    nvmlDeviceGetMemoryInfo_v2 => "memory",
    nvmlDeviceGetBAR1MemoryInfo => "bar1_memory",
    nvmlDeviceGetUtilizationRates => "utilization",
    nvmlDeviceGetEncoderUtilization => "encoder_utilization",
    nvmlDeviceGetDecoderUtilization => "decoder_utilization",
    nvmlDeviceGetTemperature => "temperature",
    nvmlDeviceGetTemperatureV => "temperature",
    nvmlDeviceGetTemperatureThreshold => "temperature_threshold",
    nvmlDeviceGetPowerUsage => "power_usage",
    nvmlDeviceGetEnforcedPowerLimit => "power_limit",
    nvmlDeviceGetPowerManagementLimit => "power_limit",
    nvmlDeviceGetPowerManagementDefaultLimit => "power_limit",
    nvmlDeviceGetPowerManagementLimitConstraints => "power_limit",
    nvmlDeviceGetTotalEnergyConsumption => "energy",
    nvmlDeviceGetClockInfo => "clocks",
    nvmlDeviceGetClock => "clocks",
    nvmlDeviceGetMaxClockInfo => "max_clocks",
    nvmlDeviceGetNumFans => "num_fans",
    nvmlDeviceGetFanSpeed => "fan_speed",
    nvmlDeviceGetFanSpeed_v2 => "fan_speed",
    nvmlDeviceGetPcieThroughput => "pcie_throughput",
    nvmlDeviceGetCurrPcieLinkGeneration => "pcie_link",
    nvmlDeviceGetCurrPcieLinkWidth => "pcie_link",
    nvmlDeviceGetMaxPcieLinkGeneration => "pcie_link",
    nvmlDeviceGetMaxPcieLinkWidth => "pcie_link",
    nvmlDeviceGetCurrentClocksThrottleReasons => "throttle_reasons",
    nvmlDeviceGetCurrentClocksEventReasons => "throttle_reasons",
    nvmlDeviceGetSupportedClocksThrottleReasons => "supported_throttle_reasons",
    nvmlDeviceGetSupportedClocksEventReasons => "supported_throttle_reasons",
    nvmlDeviceGetTotalEccErrors => "ecc_errors",
    nvmlDeviceGetEccMode => "ecc_mode",
    nvmlDeviceGetPerformanceState => "performance_state",
    nvmlDeviceGetPowerState => "performance_state",
    nvmlDeviceGetPersistenceMode => "persistence_mode",
    nvmlDeviceGetMigMode => "mig_mode",
    nvmlDeviceGetCudaComputeCapability => "compute_capability",
    nvmlDeviceGetComputeMode => "compute_mode",
    nvmlDeviceGetArchitecture => "architecture",
    nvmlDeviceGetBrand => "brand",
    nvmlDeviceGetVbiosVersion => "vbios_version",
    nvmlDeviceGetComputeRunningProcesses => "compute_processes",
    nvmlDeviceGetComputeRunningProcesses_v2 => "compute_processes",
    nvmlDeviceGetComputeRunningProcesses_v3 => "compute_processes",
    nvmlDeviceGetGraphicsRunningProcesses => "graphics_processes",
    nvmlDeviceGetGraphicsRunningProcesses_v2 => "graphics_processes",
    nvmlDeviceGetGraphicsRunningProcesses_v3 => "graphics_processes",
    nvmlDeviceGetMPSComputeRunningProcesses => "mps_processes",
    nvmlDeviceGetMPSComputeRunningProcesses_v2 => "mps_processes",
    nvmlDeviceGetMPSComputeRunningProcesses_v3 => "mps_processes",
    nvmlDeviceGetProcessUtilization => "process_utilization",
    nvmlDeviceGetRetiredPages => "retired_pages",
    nvmlDeviceGetRetiredPages_v2 => "retired_pages",
    nvmlDeviceGetRetiredPagesPendingStatus => "retired_pages",
    nvmlDeviceGetRemappedRows => "remapped_rows",
    nvmlDeviceRegisterEvents => "events",
    nvmlDeviceGetSupportedEventTypes => "events",
    nvmlDeviceGetMaxMigDeviceCount => "mig",
    nvmlDeviceGetMigDeviceHandleByIndex => "mig",
    nvmlDeviceGetDeviceHandleFromMigDeviceHandle => "mig",
    nvmlDeviceIsMigDeviceHandle => "mig",
    nvmlDeviceGetGpuInstanceId => "mig",
    nvmlDeviceGetComputeInstanceId => "mig",
    nvmlGpmQueryDeviceSupport => "gpm_support",
    nvmlGpmQueryIfStreamingEnabled => "gpm_support",
    nvmlGpmSampleAlloc => "gpm_alloc",
    nvmlGpmSampleFree => "gpm_alloc",
    nvmlGpmSampleGet => "gpm",
    nvmlGpmMigSampleGet => "gpm",
    nvmlGpmMetricsGet => "gpm_metrics",
    nvmlDeviceGetNvLinkState => "nvlink",
    nvmlDeviceGetFieldValues => "field_values",
    nvmlDeviceGetViolationStatus => "violation",
    nvmlDeviceGetPcieReplayCounter => "pcie_replay",
}

// The fault masks are u128: one bit per function.
const _: () = assert!(Api::ALL.len() <= 128);

/// Field names that stand for several fields at once.
const GROUPS: &[(&str, &[&str])] = &[
    (
        "processes",
        &["compute_processes", "graphics_processes", "mps_processes"],
    ),
    ("power", &["power_usage", "power_limit", "energy"]),
];

impl Api {
    /// This function's bit in a fault mask.
    #[inline]
    pub const fn bit(self) -> u128 {
        1u128 << (self as u8)
    }

    /// Whether the function takes a device handle (faults for it are per device).
    pub fn is_device_call(self) -> bool {
        let n = self.c_name();
        (n.starts_with("nvmlDevice")
            && !matches!(self, Api::nvmlDeviceGetCount | Api::nvmlDeviceGetCount_v2))
            || matches!(
                self,
                Api::nvmlGpmQueryDeviceSupport
                    | Api::nvmlGpmQueryIfStreamingEnabled
                    | Api::nvmlGpmSampleGet
                    | Api::nvmlGpmMigSampleGet
            )
    }

    /// The mask of the functions reading `field` (or a group of fields), if the name is known.
    pub fn mask_for_field(field: &str) -> Option<u128> {
        let names: Vec<&str> = match GROUPS.iter().find(|(g, _)| *g == field) {
            Some((_, members)) => members.to_vec(),
            None => vec![field],
        };
        let mask = Api::ALL
            .iter()
            .filter(|a| names.contains(&a.field()))
            .fold(0u128, |m, a| m | a.bit());
        (mask != 0).then_some(mask)
    }

    /// The mask of one C function, if this library exports it under that name.
    pub fn mask_for_function(name: &str) -> Option<u128> {
        Api::ALL
            .iter()
            .find(|a| a.c_name() == name)
            .map(|a| a.bit())
    }

    /// Every accepted field name, for error messages.
    pub fn field_names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = Api::ALL.iter().map(|a| a.field()).collect();
        v.extend(GROUPS.iter().map(|(g, _)| *g));
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_masks_cover_every_version_of_a_function() {
        let fan = Api::mask_for_field("fan_speed").unwrap();
        assert_eq!(
            fan,
            Api::nvmlDeviceGetFanSpeed.bit() | Api::nvmlDeviceGetFanSpeed_v2.bit()
        );
        let procs = Api::mask_for_field("processes").unwrap();
        assert_ne!(
            procs & Api::nvmlDeviceGetMPSComputeRunningProcesses_v3.bit(),
            0
        );
        assert_ne!(procs & Api::nvmlDeviceGetGraphicsRunningProcesses.bit(), 0);
        assert_eq!(procs & Api::nvmlDeviceGetPowerUsage.bit(), 0);
        assert_eq!(Api::mask_for_field("fan_sped"), None);
    }

    #[test]
    fn function_masks_are_single_bits_and_device_calls_are_told_apart() {
        assert_eq!(
            Api::mask_for_function("nvmlDeviceGetFanSpeed_v2"),
            Some(Api::nvmlDeviceGetFanSpeed_v2.bit())
        );
        assert_eq!(Api::mask_for_function("nvmlDeviceGetFanSpeed_v9"), None);
        assert!(Api::nvmlDeviceGetPowerUsage.is_device_call());
        assert!(!Api::nvmlDeviceGetCount_v2.is_device_call());
        assert!(!Api::nvmlSystemGetDriverVersion.is_device_call());
        assert!(
            Api::nvmlGpmSampleGet.is_device_call(),
            "takes a device handle"
        );
        assert!(
            !Api::nvmlGpmMetricsGet.is_device_call(),
            "takes two samples"
        );
    }
}
