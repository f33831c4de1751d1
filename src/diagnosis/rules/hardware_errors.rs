//! `hardware_errors`: XID events in the window, uncorrectable ECC errors new since the previous
//! window, and a device that stopped answering NVML (lost). One finding per device, with the
//! XID numbers and what they mean.

use std::collections::BTreeMap;

use crate::config::thresholds::HardwareErrors;
use crate::diagnosis::findings::{Finding, Layer, RuleId, Severity, Subject, Value};
use crate::diagnosis::{xid, xid_catalog};
use crate::sampling::DeviceStatus;
use crate::schema::DeviceField;

use super::{device_ref, Inputs};

const ECC_ADVICE: &str =
    "New uncorrectable ECC errors: drain the GPU's jobs (their results may be \
corrupt), check `nvidia-smi -q -d ECC,ROW_REMAPPER`, reset the GPU to apply row remapping; RMA \
if remapping failed or errors recur.";
const LOST_ADVICE: &str = "The GPU stopped answering NVML (fell off the bus or hung): drain the \
node, check dmesg for XID 79 / PCIe errors, and reboot; RMA on recurrence.";

/// One finding per device with XIDs, new uncorrectable ECC errors or lost samples.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &HardwareErrors) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in &inputs.window.devices {
        let uuid = d.info.uuid.as_str();
        let mut xids: BTreeMap<u64, u64> = BTreeMap::new();
        for e in inputs
            .window
            .xid_events
            .iter()
            .filter(|e| e.device_uuid == uuid)
        {
            if !t.ignore_xids.contains(&e.xid) {
                *xids.entry(e.xid).or_default() += 1;
            }
        }
        let previous = inputs
            .history
            .device(uuid)
            .and_then(|c| c.previous_ecc_uncorrected)
            .unwrap_or(0);
        // The window's total counts from when gpulse first saw the device, so with no previous
        // window everything counted is new.
        let new_ecc = d
            .total_u64(DeviceField::EccUncorrected)
            .map(|total| total.saturating_sub(previous))
            .unwrap_or(0);
        let lost = d.status == DeviceStatus::Lost || d.lost_samples > 0;
        if xids.is_empty() && new_ecc == 0 && !lost {
            continue;
        }

        let mut severity = Severity::Info;
        let mut parts: Vec<String> = Vec::new();
        let mut advice: Vec<String> = Vec::new();
        // The catalog's classes of the window's XIDs, and whether any stopped the application
        // or the GPU (the finding's `xid_classes` and `xid_fatal`).
        let mut classes: Vec<&str> = Vec::new();
        let mut fatal = false;
        for (&code, &count) in &xids {
            let times = if count > 1 {
                format!(" ×{count}")
            } else {
                String::new()
            };
            match xid::lookup(code) {
                Some(info) => {
                    severity = severity.max(info.severity);
                    let row = info.row;
                    let class = row.class.as_str();
                    let kind = if row.fatal { "fatal" } else { "not fatal" };
                    parts.push(format!(
                        "XID {code} ({}; {class}, {kind}){times}",
                        row.meaning
                    ));
                    if !classes.contains(&class) {
                        classes.push(class);
                    }
                    fatal |= row.fatal;
                    let a = format!("XID {code}: {}", info.action);
                    if !advice.contains(&a) {
                        advice.push(a);
                    }
                }
                None => {
                    severity = severity.max(xid::UNKNOWN_SEVERITY);
                    parts.push(format!("XID {code}{times}"));
                    advice.push(format!(
                        "XID {code}: not in gpulse's copy of NVIDIA's Xid catalog ({}): look it \
                         up in the catalog ({}).",
                        xid_catalog::CATALOG_VERSION,
                        xid_catalog::SOURCE_URL
                    ));
                }
            }
        }
        if new_ecc > 0 {
            severity = Severity::Critical;
            parts.push(format!("{new_ecc} new uncorrectable ECC error(s)"));
            advice.push(ECC_ADVICE.to_string());
        }
        if lost {
            severity = Severity::Critical;
            parts.push(format!(
                "not answering NVML in {} of {} samples",
                d.lost_samples, inputs.window.sample_count
            ));
            advice.push(LOST_ADVICE.to_string());
        }
        let subject = Subject::Device(device_ref(d));
        let since = inputs
            .window
            .xid_events
            .iter()
            .filter(|e| e.device_uuid == uuid)
            .map(|e| e.at)
            .min()
            .unwrap_or(inputs.window.start);
        let mut values = vec![
            (
                "xids".to_string(),
                Value::from(
                    xids.keys()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            ),
            (
                "xid_count".to_string(),
                Value::from(xids.values().sum::<u64>()),
            ),
            ("ecc_uncorrected_new".to_string(), Value::from(new_ecc)),
        ];
        if !xids.is_empty() {
            values.push(("xid_classes".into(), Value::from(classes.join(","))));
            values.push((
                "xid_fatal".into(),
                Value::from(if fatal { "true" } else { "false" }),
            ));
        }
        if lost {
            values.push(("lost_samples".into(), Value::from(d.lost_samples)));
        }
        out.push(Finding {
            rule: RuleId::HardwareErrors,
            related: Vec::new(),
            severity,
            subject: subject.clone(),
            summary: format!("{subject}: {}", parts.join("; ")),
            advice: advice.join(" "),
            values,
            since,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;
    use crate::sampling::XidEvent;

    fn xid_event(at: u64, code: u64) -> XidEvent {
        XidEvent {
            at: t(at),
            device_uuid: "GPU-00000000".into(),
            device_index: 0,
            xid: code,
        }
    }

    #[test]
    fn xid_79_is_critical_and_named() {
        let mut w = window(60, vec![device(0, 0.0, GIB), device(1, 0.5, GIB)], vec![]);
        w.xid_events = vec![xid_event(30, 79), xid_event(31, 13), xid_event(32, 13)];
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &HardwareErrors::default());
        assert_eq!(found.len(), 1, "only GPU 0 had events");
        let finding = &found[0];
        assert_eq!(finding.severity, Severity::Critical);
        assert!(
            finding
                .summary
                .contains("XID 79 (GPU has fallen off the bus; interconnect, fatal)"),
            "{}",
            finding.summary
        );
        assert!(finding
            .summary
            .contains("XID 13 (graphics engine exception; application, fatal) ×2"));
        assert!(
            finding.advice.contains("XID 79: catalog action RESTART_BM"),
            "{}",
            finding.advice
        );
        assert!(
            finding
                .advice
                .contains("XID 13: catalog action RESTART_APP"),
            "{}",
            finding.advice
        );
        assert_eq!(
            finding.value("xid_classes"),
            Some(&Value::from("application,interconnect"))
        );
        assert_eq!(finding.value("xid_fatal"), Some(&Value::from("true")));
        assert_eq!(finding.value("xids"), Some(&Value::from("13,79")));
        assert_eq!(finding.since, t(30));
    }

    #[test]
    fn new_ecc_errors_since_previous_window_are_critical() {
        let mut w1 = window(60, vec![device(0, 0.5, GIB)], vec![]);
        w1.devices[0]
            .fields
            .set_total(DeviceField::EccUncorrected, Some(2.0));
        let mut w2 = window(120, vec![device(0, 0.5, GIB)], vec![]);
        w2.devices[0]
            .fields
            .set_total(DeviceField::EccUncorrected, Some(5.0));
        let f = Fixture::new(vec![w1.clone(), w2]);
        let found = evaluate(&f.inputs(), &HardwareErrors::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].value("ecc_uncorrected_new"), Some(&Value::Int(3)));
        assert_eq!(found[0].severity, Severity::Critical);
        // Same total as the previous window: nothing new.
        let mut w3 = window(180, vec![device(0, 0.5, GIB)], vec![]);
        w3.devices[0]
            .fields
            .set_total(DeviceField::EccUncorrected, Some(2.0));
        let f = Fixture::new(vec![w1, w3]);
        assert!(evaluate(&f.inputs(), &HardwareErrors::default()).is_empty());
    }

    #[test]
    fn quiet_healthy_device_reports_nothing() {
        let f = Fixture::new(vec![window(60, vec![device(0, 0.5, GIB)], vec![])]);
        assert!(evaluate(&f.inputs(), &HardwareErrors::default()).is_empty());
    }

    #[test]
    fn ignored_xids_are_dropped_and_lost_device_is_reported() {
        let mut w = window(60, vec![device(0, 0.5, GIB)], vec![]);
        w.xid_events = vec![xid_event(10, 45)];
        let t = HardwareErrors {
            ignore_xids: vec![45],
            ..HardwareErrors::default()
        };
        let f = Fixture::new(vec![w.clone()]);
        assert!(evaluate(&f.inputs(), &t).is_empty());
        w.devices[0].status = DeviceStatus::Lost;
        w.devices[0].lost_samples = 12;
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &t);
        assert_eq!(found.len(), 1);
        assert!(found[0].summary.contains("not answering NVML in 12 of 60"));
    }

    #[test]
    fn unknown_xid_points_to_the_catalog() {
        let mut w = window(60, vec![device(0, 0.5, GIB)], vec![]);
        w.xid_events = vec![xid_event(10, 1234)];
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &HardwareErrors::default());
        assert_eq!(found[0].severity, Severity::Error);
        assert!(found[0].advice.contains("Xid catalog"));
    }
}
