//! Which device fields and GPM metrics a `gpulse run` can leave unread: those whose metric is
//! switched off (`[metrics]`) and that nothing else reads. The analysis (diagnosis' rules,
//! attribution's accounting, span enrichment, the window's own totals) reads the fields of
//! [`ANALYSIS_READS`] and [`ANALYSIS_GPM_READS`] whatever the switches say, so a metric switched
//! off never silences a finding; a test holds those lists to the code that reads fields. A GPM
//! field that also feeds a process metric on a MIG instance is read while that metric is on.
//!
//! `top` and `record` read everything (they show and keep every field).

use crate::sampling::Sampler;
use crate::schema::{
    DeviceField, GpmField, MetricSwitches, DEVICE_FIELDS, GPM_FIELDS, MIG_PROCESS_GPM,
};

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

/// The GPM fields the analysis reads (the rules' SM and tensor activity, and the graphics
/// activity accounting shares GPU time by).
pub const ANALYSIS_GPM_READS: &[GpmField] = &[
    GpmField::SmActivity,
    GpmField::TensorActivity,
    GpmField::GraphicsActivity,
];

/// What the sampler does not ask NVML for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnreadFields {
    pub device: Vec<DeviceField>,
    pub gpm: Vec<GpmField>,
}

impl UnreadFields {
    pub fn is_empty(&self) -> bool {
        self.device.is_empty() && self.gpm.is_empty()
    }

    /// Tells a freshly opened sampler to leave them out.
    pub(crate) fn apply(&self, sampler: &mut Sampler) {
        sampler.leave_out_fields(&self.device, &self.gpm);
    }
}

/// What `run` need not read under `switches`: every device field whose metric is off, less
/// [`ANALYSIS_READS`]; every GPM field whose metric is off, less [`ANALYSIS_GPM_READS`] and
/// those a MIG process metric still on takes. Empty when no metric is switched off.
pub fn unread_fields(switches: &MetricSwitches) -> UnreadFields {
    let device = DEVICE_FIELDS
        .iter()
        .filter(|spec| !switches.enabled(spec.metric.id) && !ANALYSIS_READS.contains(&spec.field))
        .map(|spec| spec.field)
        .collect();
    let mig_process_reads = |field: GpmField| {
        MIG_PROCESS_GPM
            .iter()
            .any(|(f, metric)| *f == field && switches.enabled(metric.id))
    };
    let gpm = GPM_FIELDS
        .iter()
        .filter(|spec| {
            !switches.enabled(spec.metric.id)
                && !ANALYSIS_GPM_READS.contains(&spec.field)
                && !mig_process_reads(spec.field)
        })
        .map(|spec| spec.field)
        .collect();
    UnreadFields { device, gpm }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;
    use crate::schema::MetricId;

    /// Every `<enum>::X` (or `F::X`, the alias some files use) naming one of `variants` in the
    /// stages that analyse windows, tests included (over-listing is safe).
    fn named_in_analysis(enum_name: &str, variants: &BTreeSet<String>) -> BTreeSet<String> {
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
            for prefix in [&format!("{enum_name}::"), "F::"] {
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
        let names =
            |fields: &mut dyn Iterator<Item = String>| -> BTreeSet<String> { fields.collect() };
        let device = names(&mut DEVICE_FIELDS.iter().map(|s| format!("{:?}", s.field)));
        let gpm = names(&mut GPM_FIELDS.iter().map(|s| format!("{:?}", s.field)));
        for (list, enum_name, variants, listed, first) in [
            (
                "ANALYSIS_READS",
                "DeviceField",
                &device,
                names(&mut ANALYSIS_READS.iter().map(|f| format!("{f:?}"))),
                "Power",
            ),
            (
                "ANALYSIS_GPM_READS",
                "GpmField",
                &gpm,
                names(&mut ANALYSIS_GPM_READS.iter().map(|f| format!("{f:?}"))),
                "SmActivity",
            ),
        ] {
            let named = named_in_analysis(enum_name, variants);
            assert!(named.contains(first), "the scan found nothing: {named:?}");
            let missing: Vec<_> = named.difference(&listed).collect();
            assert!(
                missing.is_empty(),
                "the analysis reads {missing:?}: add them to {list}, or a metric switched off \
                 would stop the read a rule needs"
            );
        }
    }

    #[test]
    fn only_fields_of_switched_off_metrics_nothing_needs_are_unread() {
        assert!(unread_fields(&MetricSwitches::default()).is_empty());
        let mut gpm_off = MetricSwitches::default();
        // SM occupancy feeds nothing else; SM activity feeds the rules; DRAM activity also a
        // MIG process's metric, until that is off too.
        gpm_off.set(MetricId::SmOccupancy, false);
        gpm_off.set(MetricId::SmActivity, false);
        gpm_off.set(MetricId::DramActivity, false);
        assert_eq!(unread_fields(&gpm_off).gpm, [GpmField::SmOccupancy]);
        gpm_off.set(MetricId::ProcessGpuDramActivity, false);
        assert_eq!(
            unread_fields(&gpm_off).gpm,
            [GpmField::SmOccupancy, GpmField::DramActivity]
        );
        let mut switches = MetricSwitches::default();
        // hw.gpu.utilization: its encoder and decoder fields go, the general one a rule reads
        // stays; hw.power stays read for the rules and accounting.
        switches.set(MetricId::GpuUtilization, false);
        switches.set(MetricId::Power, false);
        switches.set(MetricId::FanSpeed, false);
        assert_eq!(
            unread_fields(&switches).device,
            [
                DeviceField::UtilizationEncoder,
                DeviceField::UtilizationDecoder,
                DeviceField::FanSpeed
            ]
        );
    }
}
