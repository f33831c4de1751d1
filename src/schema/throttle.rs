//! NVML's clock throttle (clock event) reasons as `nvidia.gpu.throttle.reason` names them,
//! taken from nvml-wrapper's `ThrottleReasons` flags rather than copied.

use std::sync::LazyLock;

use nvml_wrapper::bitmasks::device::ThrottleReasons;

/// NVML's clock throttle (clock event) reasons: bit value (`nvmlClocksThrottleReason*` in
/// nvml.h) and name, from nvml-wrapper's `ThrottleReasons` flags (lower case, as exported in
/// `nvidia.gpu.throttle.reason`), in bit order. An alias of an earlier bit (the deprecated
/// `USER_DEFINED_CLOCKS`) and the empty `NONE` are not reasons of their own and are left out.
pub(crate) fn throttle_reasons() -> &'static [(u64, &'static str)] {
    static REASONS: LazyLock<Vec<(u64, &'static str)>> = LazyLock::new(|| {
        ThrottleReasons::all()
            .iter_names()
            .map(|(name, flag)| (flag.bits(), lower_snake(name)))
            .collect()
    });
    &REASONS
}

/// `name` in lower case. The handful of reason names are made once per process and kept, so
/// every data point can borrow its attribute value.
fn lower_snake(name: &'static str) -> &'static str {
    Box::leak(name.to_ascii_lowercase().into_boxed_str())
}

/// Names of the throttle reasons set in `bits`, in bit order; bits this build does not know are
/// named `other`, once.
pub(crate) fn throttle_reason_names(bits: u64) -> Vec<&'static str> {
    let reasons = throttle_reasons();
    let mut names: Vec<&'static str> = reasons
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    let known = reasons.iter().fold(0, |all, (bit, _)| all | bit);
    if bits & !known != 0 {
        names.push("other");
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bits and names nvml.h gives the reasons (`nvmlClocksThrottleReason*`): what the
    /// exported `nvidia.gpu.throttle.reason` values have always been.
    #[test]
    fn throttle_reasons_are_nvml_h_bits_and_names() {
        assert_eq!(
            throttle_reasons(),
            [
                (0x1, "gpu_idle"),
                (0x2, "applications_clocks_setting"),
                (0x4, "sw_power_cap"),
                (0x8, "hw_slowdown"),
                (0x10, "sync_boost"),
                (0x20, "sw_thermal_slowdown"),
                (0x40, "hw_thermal_slowdown"),
                (0x80, "hw_power_brake_slowdown"),
                (0x100, "display_clock_setting"),
            ]
        );
        assert_eq!(
            throttle_reason_names(0x4 | 0x40),
            ["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert_eq!(throttle_reason_names(0x1000 | 0x1), ["gpu_idle", "other"]);
        assert!(throttle_reason_names(0).is_empty());
    }
}
