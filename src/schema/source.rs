//! Where each device field comes from: the NVML call ([`NvmlCall`], one function with its
//! arguments) or the NVML field id ([`NvmlFieldId`], one `NVML_FI_*` value of
//! `nvmlDeviceGetFieldValues`), the member of its answer, and the factor that turns NVML's
//! number into the field's unit ([`Scale`]). Typed so that sampling, the benchmark floor (which must make exactly
//! the sampler's calls) and the device check (which reads every field again through NVIDIA's own
//! binding) all walk the same list: [`field_calls`](super::field_calls) gives each distinct
//! call once, with the fields it fills. Depends on nothing else in the schema.

/// Declares [`NvmlCall`] with each call's C function, its arguments and the members of its
/// answer, from one list.
macro_rules! nvml_calls {
    ($( $(#[$doc:meta])* $call:ident => $c_name:literal ($($arg:literal),*) [$($member:literal),*], )*) => {
        /// One NVML call gpulse makes per device per tick for the device field table: a C
        /// function with fixed arguments (`nvmlDeviceGetClockInfo(NVML_CLOCK_SM)` and
        /// `(NVML_CLOCK_MEM)` are two calls).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum NvmlCall {
            $( $(#[$doc])* $call, )*
        }

        impl NvmlCall {
            /// Every call, in declaration order.
            pub const ALL: &'static [NvmlCall] = &[$( NvmlCall::$call, )*];

            /// The C function `nvml.h` declares.
            pub(crate) const fn c_name(self) -> &'static str {
                match self { $( NvmlCall::$call => $c_name, )* }
            }

            /// The arguments after the device handle that make this call (`nvml.h` constant
            /// names), empty when the function takes none.
            pub(crate) const fn arguments(self) -> &'static [&'static str] {
                match self { $( NvmlCall::$call => &[$($arg),*], )* }
            }

            /// The members of the answer that fields read, in the order sampling returns them
            /// (`nvml.h` struct member names); empty when the answer is one number.
            pub(crate) const fn members(self) -> &'static [&'static str] {
                match self { $( NvmlCall::$call => &[$($member),*], )* }
            }
        }
    };
}

nvml_calls! {
    /// `nvmlMemory_v2_t`; on a library without the v2 call (drivers before R510), the v1 call
    /// `nvmlDeviceGetMemoryInfo`, which has no `reserved`.
    MemoryInfo => "nvmlDeviceGetMemoryInfo_v2" () ["total", "used", "free", "reserved"],
    Bar1MemoryInfo => "nvmlDeviceGetBAR1MemoryInfo" () ["bar1Total", "bar1Used", "bar1Free"],
    UtilizationRates => "nvmlDeviceGetUtilizationRates" () ["gpu", "memory"],
    /// The answer is `utilization`; the sampling period is not read.
    EncoderUtilization => "nvmlDeviceGetEncoderUtilization" () [],
    DecoderUtilization => "nvmlDeviceGetDecoderUtilization" () [],
    GpuTemperature => "nvmlDeviceGetTemperature" ("NVML_TEMPERATURE_GPU") [],
    PowerUsage => "nvmlDeviceGetPowerUsage" () [],
    EnforcedPowerLimit => "nvmlDeviceGetEnforcedPowerLimit" () [],
    TotalEnergyConsumption => "nvmlDeviceGetTotalEnergyConsumption" () [],
    SmClock => "nvmlDeviceGetClockInfo" ("NVML_CLOCK_SM") [],
    MemoryClock => "nvmlDeviceGetClockInfo" ("NVML_CLOCK_MEM") [],
    GraphicsClock => "nvmlDeviceGetClockInfo" ("NVML_CLOCK_GRAPHICS") [],
    /// Once per fan (`nvmlDeviceGetNumFans`, read once per device, says how many); the field is
    /// the mean. Not made on a board without fans.
    FanSpeeds => "nvmlDeviceGetFanSpeed_v2" ("each fan") [],
    PcieTxThroughput => "nvmlDeviceGetPcieThroughput" ("NVML_PCIE_UTIL_TX_BYTES") [],
    PcieRxThroughput => "nvmlDeviceGetPcieThroughput" ("NVML_PCIE_UTIL_RX_BYTES") [],
    CorrectedEccErrors => "nvmlDeviceGetTotalEccErrors"
        ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC") [],
    UncorrectedEccErrors => "nvmlDeviceGetTotalEccErrors"
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC") [],
    /// `NVML_PSTATE_UNKNOWN` (32) is no value.
    PerformanceState => "nvmlDeviceGetPerformanceState" () [],
    PcieReplayCounter => "nvmlDeviceGetPcieReplayCounter" () [],
    CurrPcieLinkGeneration => "nvmlDeviceGetCurrPcieLinkGeneration" () [],
    CurrPcieLinkWidth => "nvmlDeviceGetCurrPcieLinkWidth" () [],
}

impl NvmlCall {
    /// Where in the answer `member` is, as sampling returns it (0 for a one-number answer).
    pub(crate) fn member_index(self, member: &str) -> Option<usize> {
        match self.members() {
            [] => member.is_empty().then_some(0),
            members => members.iter().position(|m| *m == member),
        }
    }

    /// The call as docs write it: `nvmlDeviceGetClockInfo(NVML_CLOCK_SM)`.
    pub(crate) fn display(self) -> String {
        match self.arguments() {
            [] => self.c_name().to_string(),
            args => format!("{}({})", self.c_name(), args.join(", ")),
        }
    }
}

impl std::fmt::Display for NvmlCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

/// Declares [`NvmlFieldId`] with each id's `nvml.h` name and number, from one list.
macro_rules! nvml_field_ids {
    ($( $(#[$doc:meta])* $id:ident => $c_name:literal = $value:literal, )*) => {
        /// One NVML field id (`NVML_FI_*` of `nvml.h`) a device field is read from. A device's
        /// field-id rows are read together, in one `nvmlDeviceGetFieldValues` call per tick,
        /// each an `nvmlFieldValue_t` with `scopeId` 0; a value whose own `nvmlReturn` is not
        /// `NVML_SUCCESS` leaves only its field absent.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum NvmlFieldId {
            $( $(#[$doc])* $id, )*
        }

        impl NvmlFieldId {
            /// Every field id, in declaration order.
            pub const ALL: &'static [NvmlFieldId] = &[$( NvmlFieldId::$id, )*];

            /// The constant `nvml.h` defines (`NVML_FI_DEV_MEMORY_TEMP`).
            pub(crate) const fn c_name(self) -> &'static str {
                match self { $( NvmlFieldId::$id => $c_name, )* }
            }

            /// Its number (`fieldId` of `nvmlFieldValue_t`).
            pub(crate) const fn id(self) -> u32 {
                match self { $( NvmlFieldId::$id => $value, )* }
            }
        }
    };
}

nvml_field_ids! {
    /// HBM memory temperature, °C (dcgm-exporter's `DCGM_FI_DEV_MEMORY_TEMP`); boards without
    /// HBM answer `NVML_ERROR_NOT_SUPPORTED` for it.
    MemoryTemp => "NVML_FI_DEV_MEMORY_TEMP" = 82,
}

/// The function every [`NvmlFieldId`] is read through.
pub(crate) const FIELD_VALUES_FUNCTION: &str = "nvmlDeviceGetFieldValues";

impl std::fmt::Display for NvmlFieldId {
    /// As docs write it: `nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{FIELD_VALUES_FUNCTION}({})", self.c_name())
    }
}

/// Which NVML interface a field is read through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// A call of its own (shared by the fields reading members of its answer).
    Call(NvmlCall),
    /// A field id, batched with the device's other field-id rows into one
    /// `nvmlDeviceGetFieldValues` call.
    FieldId(NvmlFieldId),
}

impl SourceKind {
    /// The C function `nvml.h` declares.
    pub(crate) const fn c_name(self) -> &'static str {
        match self {
            SourceKind::Call(call) => call.c_name(),
            SourceKind::FieldId(_) => FIELD_VALUES_FUNCTION,
        }
    }

    /// The arguments after the device handle, as `nvml.h` names them (for a field id, the id).
    pub(crate) fn arguments(self) -> Vec<&'static str> {
        match self {
            SourceKind::Call(call) => call.arguments().to_vec(),
            SourceKind::FieldId(id) => vec![id.c_name()],
        }
    }
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceKind::Call(call) => call.fmt(f),
            SourceKind::FieldId(id) => id.fmt(f),
        }
    }
}

/// What NVML's number is multiplied by to give the field in its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// As it is.
    One,
    /// NVML's whole percent as a 0–1 ratio.
    PercentToRatio,
    /// Thousandths (mW, mJ) as units (W, J).
    Milli,
    /// KiB (NVML's "KB") as bytes.
    Kibi,
}

impl Scale {
    pub(crate) const fn factor(self) -> f64 {
        match self {
            Scale::One => 1.0,
            Scale::PercentToRatio => 0.01,
            Scale::Milli => 0.001,
            Scale::Kibi => 1024.0,
        }
    }

    /// The name docs and the exported schema use.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Scale::One => "one",
            Scale::PercentToRatio => "percent_to_ratio",
            Scale::Milli => "milli",
            Scale::Kibi => "kibi",
        }
    }
}

/// A field's NVML source: the call or field id, the member of its answer, and the scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub kind: SourceKind,
    /// One of the members of the call's answer (`NvmlCall::members`), or empty when the answer is
    /// one number.
    pub member: &'static str,
    pub scale: Scale,
}

impl Source {
    /// The whole answer of `call`, as it is.
    pub(crate) const fn of(call: NvmlCall) -> Self {
        Self {
            kind: SourceKind::Call(call),
            member: "",
            scale: Scale::One,
        }
    }

    /// The value of field id `id`, as it is.
    pub(crate) const fn field_id(id: NvmlFieldId) -> Self {
        Self {
            kind: SourceKind::FieldId(id),
            member: "",
            scale: Scale::One,
        }
    }

    /// The member `member` of the answer.
    pub(crate) const fn member(call: NvmlCall, member: &'static str) -> Self {
        Self {
            member,
            ..Self::of(call)
        }
    }

    pub(crate) const fn scaled(self, scale: Scale) -> Self {
        Self { scale, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_resolve_and_calls_display_with_their_arguments() {
        assert_eq!(NvmlCall::MemoryInfo.member_index("used"), Some(1));
        assert_eq!(NvmlCall::MemoryInfo.member_index(""), None);
        assert_eq!(NvmlCall::PowerUsage.member_index(""), Some(0));
        assert_eq!(NvmlCall::PowerUsage.member_index("gpu"), None);
        assert_eq!(
            NvmlCall::SmClock.to_string(),
            "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"
        );
        assert_eq!(NvmlCall::PowerUsage.to_string(), "nvmlDeviceGetPowerUsage");
        assert_eq!(
            SourceKind::FieldId(NvmlFieldId::MemoryTemp).to_string(),
            "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)"
        );
    }

    /// Each field id's number is the one `nvml.h` gives its name (nvml-wrapper-sys's bindings
    /// are generated from the header).
    #[test]
    fn field_ids_are_nvml_h_numbers() {
        use nvml_wrapper::sys_exports::field_id::*;
        for id in NvmlFieldId::ALL {
            let header = match id {
                NvmlFieldId::MemoryTemp => NVML_FI_DEV_MEMORY_TEMP,
            };
            assert_eq!(id.id(), header, "{}", id.c_name());
        }
    }
}
