//! `throttling`: clocks held down by temperature, power or a hardware slowdown signal for most
//! of the window. `gpu_idle`, application/user clock settings, sync boost and display clock
//! settings are not problems and are never reported.

use nvml_wrapper::bitmasks::device::ThrottleReasons;

use crate::config::thresholds::Throttling;
use crate::diagnosis::findings::{pct, Finding, Layer, RuleId, Severity, Subject, Value};
use crate::schema::DeviceField;

use super::{device_ref, Inputs};

/// What a throttle reason is about, for the advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThrottleClass {
    Thermal,
    Power,
    Other,
}

/// A reportable throttle reason.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reason {
    pub bit: u64,
    /// snake_case name, as NVML's constant without its prefix.
    pub name: &'static str,
    pub class: ThrottleClass,
    pub severity: Severity,
}

/// The reasons this rule reports; the software power cap only when configured.
pub(crate) const REASONS: [Reason; 5] = [
    Reason {
        bit: ThrottleReasons::HW_THERMAL_SLOWDOWN.bits(),
        name: "hw_thermal_slowdown",
        class: ThrottleClass::Thermal,
        severity: Severity::Error,
    },
    Reason {
        bit: ThrottleReasons::SW_THERMAL_SLOWDOWN.bits(),
        name: "sw_thermal_slowdown",
        class: ThrottleClass::Thermal,
        severity: Severity::Warning,
    },
    Reason {
        bit: ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN.bits(),
        name: "hw_power_brake_slowdown",
        class: ThrottleClass::Power,
        severity: Severity::Error,
    },
    Reason {
        bit: ThrottleReasons::HW_SLOWDOWN.bits(),
        name: "hw_slowdown",
        class: ThrottleClass::Other,
        severity: Severity::Error,
    },
    Reason {
        bit: ThrottleReasons::SW_POWER_CAP.bits(),
        name: "sw_power_cap",
        class: ThrottleClass::Power,
        severity: Severity::Info,
    },
];

const THERMAL_ADVICE: &str = "Thermal slowdown: check cooling (fan speed, chassis airflow, inlet \
temperature, blocked or dusty heatsinks) with `nvidia-smi -q -d TEMPERATURE,PERFORMANCE`; a \
single hot GPU in a node points to its slot or fan.";
const POWER_BRAKE_ADVICE: &str = "Power brake is asserted by the board or chassis (PSU \
overcurrent, a redundant PSU lost): check the power supplies and the BMC event log.";
const POWER_CAP_ADVICE: &str = "The board runs at its power limit: normal under full load. Check \
`nvidia-smi -q -d POWER`; raise the limit with `nvidia-smi -pl` if the board and the node's \
power budget allow it.";
const HW_SLOWDOWN_ADVICE: &str = "Hardware slowdown (HW_SLOWDOWN) is engaged by high temperature, \
power brake or an external signal: check cooling and power supplies; if it persists on a cool, \
well-powered GPU, contact the vendor.";

/// One finding per device with at least one reason active above `active_ratio_above`.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &Throttling) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in &inputs.window.devices {
        let Some(ratios) = &d.throttle_active_ratio else {
            continue;
        };
        let active: Vec<(Reason, f64)> = REASONS
            .iter()
            .filter(|r| t.report_sw_power_cap || r.name != "sw_power_cap")
            .filter_map(|r| {
                ratios
                    .get(&r.bit)
                    .filter(|&&ratio| ratio > t.active_ratio_above)
                    .map(|&ratio| (*r, ratio))
            })
            .collect();
        let Some(severity) = active.iter().map(|(r, _)| r.severity).max() else {
            continue;
        };
        let subject = Subject::Device(device_ref(d));
        let named: Vec<String> = active
            .iter()
            .map(|(r, ratio)| format!("{} {}", r.name, pct(*ratio)))
            .collect();
        let mut summary = format!("{subject} throttled: {} of the window", named.join(", "));
        if let Some(temp) = d.gauge(DeviceField::Temperature) {
            summary.push_str(&format!(", up to {:.0} °C", temp.max));
        }
        if let (Some(p), Some(limit)) =
            (d.gauge(DeviceField::Power), d.last(DeviceField::PowerLimit))
        {
            summary.push_str(&format!(", {:.0}/{limit:.0} W", p.mean));
        }
        let mut advice: Vec<&str> = Vec::new();
        for (r, _) in &active {
            let a = match (r.class, r.name) {
                (ThrottleClass::Thermal, _) => THERMAL_ADVICE,
                (ThrottleClass::Power, "sw_power_cap") => POWER_CAP_ADVICE,
                (ThrottleClass::Power, _) => POWER_BRAKE_ADVICE,
                (ThrottleClass::Other, _) => HW_SLOWDOWN_ADVICE,
            };
            if !advice.contains(&a) {
                advice.push(a);
            }
        }
        let mut values: Vec<(String, Value)> = active
            .iter()
            .map(|(r, ratio)| (format!("{}_ratio", r.name), Value::from(*ratio)))
            .collect();
        values.push((
            "reasons".into(),
            Value::from(
                active
                    .iter()
                    .map(|(r, _)| r.name)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ));
        if let Some(temp) = d.gauge(DeviceField::Temperature) {
            values.push(("temperature_max_celsius".into(), Value::from(temp.max)));
        }
        out.push(Finding {
            rule: RuleId::Throttling,
            related: Vec::new(),
            severity,
            subject,
            summary,
            advice: advice.join(" "),
            values,
            since: inputs.window.start,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    fn with_ratios(ratios: &[(u64, f64)]) -> Fixture {
        let mut d = device(0, 0.95, 40 * GIB);
        d.throttle_active_ratio = Some(ratios.iter().copied().collect());
        Fixture::new(vec![window(60, vec![d], vec![])])
    }

    #[test]
    fn hw_thermal_slowdown_most_of_the_window_is_an_error() {
        let f = with_ratios(&[(0x40, 0.8), (0x20, 0.3)]);
        let found = evaluate(&f.inputs(), &Throttling::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].severity, Severity::Error);
        assert!(
            found[0].summary.contains("hw_thermal_slowdown 80%"),
            "{}",
            found[0].summary
        );
        // sw thermal at 30% is below the 50% threshold.
        assert!(!found[0].summary.contains("sw_thermal"));
        assert_eq!(
            found[0].value("reasons"),
            Some(&Value::from("hw_thermal_slowdown"))
        );
        assert!(found[0].advice.contains("cooling"));
    }

    #[test]
    fn idle_and_clock_settings_are_not_throttling() {
        // gpu_idle 100%, applications clocks 100%, sync boost 100%.
        let f = with_ratios(&[(0x1, 1.0), (0x2, 1.0), (0x10, 1.0)]);
        assert!(evaluate(&f.inputs(), &Throttling::default()).is_empty());
    }

    #[test]
    fn power_cap_only_when_asked() {
        let f = with_ratios(&[(0x4, 0.9)]);
        assert!(evaluate(&f.inputs(), &Throttling::default()).is_empty());
        let t = Throttling {
            report_sw_power_cap: true,
            ..Throttling::default()
        };
        let found = evaluate(&f.inputs(), &t);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].severity, Severity::Info);
        assert!(found[0].advice.contains("power limit"));
    }

    #[test]
    fn bit_values_match_nvml_header() {
        // nvml.h: SwPowerCap 0x4, HwSlowdown 0x8, SwThermal 0x20, HwThermal 0x40, PowerBrake 0x80.
        let bits: Vec<(&str, u64)> = REASONS.iter().map(|r| (r.name, r.bit)).collect();
        assert!(bits.contains(&("sw_power_cap", 0x4)));
        assert!(bits.contains(&("hw_slowdown", 0x8)));
        assert!(bits.contains(&("sw_thermal_slowdown", 0x20)));
        assert!(bits.contains(&("hw_thermal_slowdown", 0x40)));
        assert!(bits.contains(&("hw_power_brake_slowdown", 0x80)));
    }
}
