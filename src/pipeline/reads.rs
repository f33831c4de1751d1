//! Which device fields a `gpulse run` can leave unread: those whose metric is switched off
//! (`[metrics]`) and that the analysis does not read. The analysis (diagnosis' rules,
//! attribution's accounting, span enrichment, the window's own totals) reads the fields of
//! [`ANALYSIS_READS`] whatever the switches say, so a metric switched off never silences a
//! finding; a test holds that list to the code that reads fields.
//!
//! `top` and `record` read everything (they show and keep every field).

use crate::schema::{DeviceField, MetricSwitches, DEVICE_FIELDS};

/// The device fields the analysis reads. Over-listing costs only an NVML read; under-listing
/// would blind a rule, which is why `analysis_reads_cover_the_code` fails on a field the
/// analysis names and this list lacks.
pub const ANALYSIS_READS: &[DeviceField] = {
    use DeviceField::*;
    &[
        MemoryTotal,
        MemoryUsed,
        MemoryFree,
        MemoryReserved,
        UtilizationGpu,
        UtilizationMemory,
        Temperature,
        Power,
        PowerLimit,
        Energy,
        SmClock,
        MemoryClock,
        GraphicsClock,
        PerformanceState,
        EccCorrected,
        EccUncorrected,
        PcieTx,
        PcieRx,
    ]
};

/// The device fields `run` need not read under `switches`: every field whose metric is off,
/// less [`ANALYSIS_READS`]. Empty when no metric is switched off.
pub fn unread_fields(switches: &MetricSwitches) -> Vec<DeviceField> {
    DEVICE_FIELDS
        .iter()
        .filter(|spec| !switches.enabled(spec.metric.id) && !ANALYSIS_READS.contains(&spec.field))
        .map(|spec| spec.field)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::schema::MetricId;

    /// Every `DeviceField::X` (or `F::X`, the alias some files use) written in the stages that
    /// analyse windows, tests included (over-listing is safe).
    fn named_in_analysis() -> BTreeSet<String> {
        let variants: BTreeSet<String> = DEVICE_FIELDS
            .iter()
            .map(|spec| format!("{:?}", spec.field))
            .collect();
        let mut named = BTreeSet::new();
        let mut stack: Vec<_> = [
            "src/diagnosis",
            "src/attribution",
            "src/enrich",
            "src/pipeline",
            "src/sampling/window.rs",
            "src/sampling/aggregate.rs",
        ]
        .iter()
        .map(|p| Path::new(env!("CARGO_MANIFEST_DIR")).join(p))
        .collect();
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if path.ends_with("pipeline/reads.rs") {
                continue; // this list and its tests
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for prefix in ["DeviceField::", "F::"] {
                for (at, _) in text.match_indices(prefix) {
                    let name: String = text[at + prefix.len()..]
                        .chars()
                        .take_while(char::is_ascii_alphanumeric)
                        .collect();
                    if variants.contains(&name) {
                        named.insert(name);
                    }
                }
            }
        }
        named
    }

    #[test]
    fn analysis_reads_cover_the_code() {
        let named = named_in_analysis();
        assert!(named.contains("Power"), "the scan found nothing: {named:?}");
        let listed: BTreeSet<String> = ANALYSIS_READS.iter().map(|f| format!("{f:?}")).collect();
        let missing: Vec<_> = named.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "the analysis reads {missing:?}: add them to ANALYSIS_READS, or a metric switched \
             off would stop the read a rule needs"
        );
    }

    #[test]
    fn only_fields_of_switched_off_metrics_nothing_needs_are_unread() {
        assert!(unread_fields(&MetricSwitches::default()).is_empty());
        let mut switches = MetricSwitches::default();
        // hw.gpu.utilization: its encoder and decoder fields go, the general one a rule reads
        // stays; hw.power stays read for the rules and accounting.
        switches.set(MetricId::GpuUtilization, false);
        switches.set(MetricId::Power, false);
        switches.set(MetricId::FanSpeed, false);
        assert_eq!(
            unread_fields(&switches),
            [
                DeviceField::UtilizationEncoder,
                DeviceField::UtilizationDecoder,
                DeviceField::FanSpeed
            ]
        );
    }
}
