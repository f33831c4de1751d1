//! The device field table: one row per scalar NVML device field (a value NVML gives once per
//! device per tick), saying where NVML gives it, what an export window keeps of it, which metric
//! of [`METRICS`](super::METRICS) carries it (by [`MetricId`], with the attribute that tells it
//! apart and its `.max`/`.min` companions), its key in the `snapshot`/`/status` JSON and its
//! dcgm-exporter series. The enum and the table are declared together by one macro, so a field
//! is one row and [`FIELD_COUNT`] is derived.
//!
//! Sampling reads each field (`sampling::device`) and stores a tick's values in
//! [`FieldValues`](super::FieldValues); the aggregator folds them by [`WindowKind`]; the metrics
//! builder, the JSON reports, the DCGM families, the generated docs and the benchmark floor walk
//! [`DEVICE_FIELDS`]. Values that come as families rather than one number per device (throttle
//! reason bits, NVLink links, MIG instances, the row remapper, violation times, XIDs) keep their
//! own types and builders.

use super::dcgm::{DcgmReading, DcgmSeries, DcgmType};
use super::metrics::MetricId;
use super::source::{NvmlCall, NvmlFieldId, Scale, Source, SourceKind};

/// What an export window keeps of a field, and so what `/status`, the metrics and the DCGM
/// families report of it. Every field's sampled values are also summarised as a gauge (mean,
/// min, max, last) whatever its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// A level that moves between ticks (utilisation, temperature, power, clocks): the window's
    /// mean, with the extremes where the metric has `.max`/`.min` companions.
    Gauge,
    /// A level whose latest value is the answer (memory, limits, P-state, the driver's own
    /// totals exported as they are): the window's last value.
    Last,
    /// A counter the driver keeps since it loaded (energy, ECC errors): the window carries the
    /// increase since `counters_start`, adding only positive steps so a driver reload never
    /// makes it go back.
    LifetimeCounter,
    /// An instantaneous rate per second (PCIe throughput over NVML's 20 ms window): the window
    /// carries its integral since `counters_start` (trapezoid rule between ticks, gaps capped).
    IntegratedRate,
}

impl WindowKind {
    /// The name docs and the exported schema use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WindowKind::Gauge => "gauge",
            WindowKind::Last => "last",
            WindowKind::LifetimeCounter => "lifetime_counter",
            WindowKind::IntegratedRate => "integrated_rate",
        }
    }
}

/// Where a field's window value goes in the OTLP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldMetric {
    pub id: MetricId,
    /// The attribute telling this field apart from others on the same metric.
    pub attribute: Option<(&'static str, &'static str)>,
    /// The companions carrying the window's extremes (gauges only).
    pub max: Option<MetricId>,
    pub min: Option<MetricId>,
}

/// One row of the device field table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    pub field: DeviceField,
    /// Key in the device objects of `gpulse snapshot --format json` and `/status`.
    pub key: &'static str,
    /// The quantity is whole (bytes, MHz, counts, P-state): reports print it as an integer.
    /// A rate's integral is whole bytes even though the rate is not.
    pub whole: bool,
    pub window: WindowKind,
    pub metric: FieldMetric,
    pub dcgm: Option<DcgmSeries>,
    /// The NVML call that gives it, the member of the answer and the scale to its unit: what
    /// sampling reads, the benchmark floor calls and the device check compares.
    pub source: Source,
}

impl FieldSpec {
    /// UCUM unit of the sampled value: the metric's, per second for a rate the window
    /// integrates.
    pub(crate) fn unit(&self) -> &'static str {
        let unit = self.metric.id.spec().unit;
        match (self.window, unit) {
            (WindowKind::IntegratedRate, "By") => "By/s",
            (WindowKind::IntegratedRate, other) => {
                unreachable!("an integrated rate of {other}: name its per-second unit here")
            }
            _ => unit,
        }
    }

    /// Which reading of the window its dcgm-exporter series shows: a counter gpulse keeps, its
    /// total; a rate, its mean (as DCGM averages its profiling rates); anything else (a
    /// driver's own total included), the last sample.
    pub(crate) fn dcgm_reading(&self) -> DcgmReading {
        let counter = self.dcgm.is_some_and(|d| d.kind == DcgmType::Counter);
        match self.window {
            WindowKind::LifetimeCounter | WindowKind::IntegratedRate if counter => {
                DcgmReading::Total
            }
            WindowKind::IntegratedRate => DcgmReading::Mean,
            _ => DcgmReading::Last,
        }
    }

    const fn of(self, field: DeviceField) -> Self {
        Self { field, ..self }
    }
}

impl DeviceField {
    /// This field's row of [`DEVICE_FIELDS`].
    pub(crate) fn spec(self) -> &'static FieldSpec {
        &DEVICE_FIELDS[self as usize]
    }
}

/// Declares [`DeviceField`] and [`DEVICE_FIELDS`] from one list, so they cannot disagree.
macro_rules! device_fields {
    ($( $field:ident => $row:expr, )*) => {
        /// A scalar device field. The discriminant indexes [`DEVICE_FIELDS`] and the value
        /// arrays.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DeviceField {
            $( $field, )*
        }

        /// Number of [`DeviceField`]s.
        pub const FIELD_COUNT: usize = [$( DeviceField::$field ),*].len();

        /// Every scalar device field, in [`DeviceField`] order (which is also the key order of
        /// the JSON reports and the point order within a metric).
        pub static DEVICE_FIELDS: [FieldSpec; FIELD_COUNT] = [$( $row.of(DeviceField::$field), )*];
    };
}

/// A metric with no attribute of its own and no companions.
pub(super) const fn metric(id: MetricId) -> FieldMetric {
    FieldMetric {
        id,
        attribute: None,
        max: None,
        min: None,
    }
}

/// A metric the field shares with others, told apart by `key` = `value`.
pub(super) const fn metric_with(
    id: MetricId,
    key: &'static str,
    value: &'static str,
) -> FieldMetric {
    FieldMetric {
        attribute: Some((key, value)),
        ..metric(id)
    }
}

impl FieldMetric {
    /// With the window's highest value on `max` (and lowest on `min`).
    pub(super) const fn extremes(self, max: MetricId, min: Option<MetricId>) -> Self {
        Self {
            max: Some(max),
            min,
            ..self
        }
    }
}

/// A row; its field is set by [`device_fields!`].
const fn row(
    key: &'static str,
    whole: bool,
    window: WindowKind,
    metric: FieldMetric,
    dcgm: Option<DcgmSeries>,
    source: Source,
) -> FieldSpec {
    FieldSpec {
        field: DeviceField::MemoryTotal,
        key,
        whole,
        window,
        metric,
        dcgm,
        source,
    }
}

use super::attributes::AttributeId;
use super::dcgm::DcgmScale::{Float, Mebibytes, Millijoules, Percent, Whole};
use super::dcgm::{counter, gauge as dcgm};
use MetricId as M;
use NvmlCall::*;
use Scale::{Kibi, Milli, PercentToRatio};
use WindowKind::{Gauge, IntegratedRate, Last, LifetimeCounter};

const GPU_TASK: &str = AttributeId::HwGpuTask.key();
const CLOCK_TYPE: &str = AttributeId::NvidiaClockType.key();
const DIRECTION: &str = AttributeId::NetworkIoDirection.key();
const ERROR_TYPE: &str = AttributeId::ErrorType.key();
/// Whole quantities and fractional ones, for the rows' readability.
const WHOLE: bool = true;
const FRACTION: bool = false;
const fn of(call: NvmlCall) -> Source {
    Source::of(call)
}
const fn member(call: NvmlCall, member: &'static str) -> Source {
    Source::member(call, member)
}

device_fields! {
    MemoryTotal => row("memory_total_bytes", WHOLE, Last,
        metric(M::GpuMemoryLimit), None,
        member(MemoryInfo, "total")),
    MemoryUsed => row("memory_used_bytes", WHOLE, Last,
        metric(M::GpuMemoryUsage),
        dcgm("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", Mebibytes),
        member(MemoryInfo, "used")),
    MemoryFree => row("memory_free_bytes", WHOLE, Last,
        metric(M::GpuMemoryFree),
        dcgm("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", Mebibytes),
        member(MemoryInfo, "free")),
    MemoryReserved => row("memory_reserved_bytes", WHOLE, Last,
        metric(M::GpuMemoryReserved),
        dcgm("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", Mebibytes),
        member(MemoryInfo, "reserved")),
    Bar1Total => row("bar1_total_bytes", WHOLE, Last,
        metric(M::Bar1MemoryLimit),
        dcgm("DCGM_FI_DEV_BAR1_TOTAL", "Total BAR1 of the GPU in MB.", Mebibytes),
        member(Bar1MemoryInfo, "bar1Total")),
    Bar1Used => row("bar1_used_bytes", WHOLE, Last,
        metric(M::Bar1MemoryUsage),
        dcgm("DCGM_FI_DEV_BAR1_USED", "Used BAR1 of the GPU in MB.", Mebibytes),
        member(Bar1MemoryInfo, "bar1Used")),
    Bar1Free => row("bar1_free_bytes", WHOLE, Last,
        metric(M::Bar1MemoryFree),
        dcgm("DCGM_FI_DEV_BAR1_FREE", "Free BAR1 of the GPU in MB.", Mebibytes),
        member(Bar1MemoryInfo, "bar1Free")),
    UtilizationGpu => row("utilization_gpu", FRACTION, Gauge,
        metric_with(M::GpuUtilization, GPU_TASK, "general")
            .extremes(M::GpuUtilizationMax, Some(M::GpuUtilizationMin)),
        dcgm("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", Percent),
        member(UtilizationRates, "gpu").scaled(PercentToRatio)),
    UtilizationMemory => row("utilization_memory", FRACTION, Gauge,
        metric(M::GpuMemoryUtilization)
            .extremes(M::GpuMemoryUtilizationMax, Some(M::GpuMemoryUtilizationMin)),
        dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", Percent),
        member(UtilizationRates, "memory").scaled(PercentToRatio)),
    UtilizationEncoder => row("utilization_encoder", FRACTION, Gauge,
        metric_with(M::GpuUtilization, GPU_TASK, "encoder")
            .extremes(M::GpuUtilizationMax, Some(M::GpuUtilizationMin)),
        dcgm("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", Percent),
        of(EncoderUtilization).scaled(PercentToRatio)),
    UtilizationDecoder => row("utilization_decoder", FRACTION, Gauge,
        metric_with(M::GpuUtilization, GPU_TASK, "decoder")
            .extremes(M::GpuUtilizationMax, Some(M::GpuUtilizationMin)),
        dcgm("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", Percent),
        of(DecoderUtilization).scaled(PercentToRatio)),
    Temperature => row("temperature_celsius", FRACTION, Gauge,
        metric(M::Temperature).extremes(M::TemperatureMax, None),
        dcgm("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", Whole),
        of(GpuTemperature)),
    Power => row("power_watts", FRACTION, Gauge,
        metric(M::Power).extremes(M::PowerMax, None),
        dcgm("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", Float),
        of(PowerUsage).scaled(Milli)),
    PowerLimit => row("power_limit_watts", FRACTION, Last,
        metric(M::PowerLimit), None,
        of(EnforcedPowerLimit).scaled(Milli)),
    Energy => row("energy_joules", FRACTION, LifetimeCounter,
        metric(M::Energy),
        counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
             "Total energy consumption since gpulse first saw the GPU (in mJ).", Millijoules),
        of(TotalEnergyConsumption).scaled(Milli)),
    SmClock => row("sm_clock_mhz", WHOLE, Gauge,
        metric_with(M::Clock, CLOCK_TYPE, "sm"),
        dcgm("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", Whole),
        of(SmClock)),
    MemoryClock => row("memory_clock_mhz", WHOLE, Gauge,
        metric_with(M::Clock, CLOCK_TYPE, "memory"),
        dcgm("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", Whole),
        of(MemoryClock)),
    GraphicsClock => row("graphics_clock_mhz", WHOLE, Gauge,
        metric_with(M::Clock, CLOCK_TYPE, "graphics"), None,
        of(GraphicsClock)),
    FanSpeed => row("fan_speed", FRACTION, Gauge,
        metric(M::FanSpeed), None,
        of(FanSpeeds).scaled(PercentToRatio)),
    PcieTx => row("pcie_tx_bytes_per_second", FRACTION, IntegratedRate,
        metric_with(M::GpuIo, DIRECTION, "transmit"),
        dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe data sent per second (in B/s).", Whole),
        of(PcieTxThroughput).scaled(Kibi)),
    PcieRx => row("pcie_rx_bytes_per_second", FRACTION, IntegratedRate,
        metric_with(M::GpuIo, DIRECTION, "receive"),
        dcgm("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe data received per second (in B/s).", Whole),
        of(PcieRxThroughput).scaled(Kibi)),
    EccCorrected => row("ecc_corrected_total", WHOLE, LifetimeCounter,
        metric_with(M::Errors, ERROR_TYPE, "corrected"), None,
        of(CorrectedEccErrors)),
    EccUncorrected => row("ecc_uncorrected_total", WHOLE, LifetimeCounter,
        metric_with(M::Errors, ERROR_TYPE, "uncorrected"), None,
        of(UncorrectedEccErrors)),
    PerformanceState => row("performance_state", WHOLE, Last,
        metric(M::PerformanceState), None,
        of(PerformanceState)),
    PcieReplays => row("pcie_replays_total", WHOLE, Last,
        metric_with(M::Errors, ERROR_TYPE, "pcie_replay"),
        counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                "PCIe replays (retries) the driver counted since it loaded.", Whole),
        of(PcieReplayCounter)),
    PcieLinkGeneration => row("pcie_link_generation", WHOLE, Last,
        metric(M::PcieLinkGeneration),
        dcgm("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", Whole),
        of(CurrPcieLinkGeneration)),
    PcieLinkWidth => row("pcie_link_width", WHOLE, Last,
        metric(M::PcieLinkWidth),
        dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes).", Whole),
        of(CurrPcieLinkWidth)),
    MemoryTemperature => row("memory_temperature_celsius", FRACTION, Gauge,
        metric(M::MemoryTemperature).extremes(M::MemoryTemperatureMax, None),
        dcgm("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", Whole),
        Source::field_id(NvmlFieldId::MemoryTemp)),
}

/// A field filled by a call: the field, the index of its member in the call's answer, and
/// the factor to its unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldRead {
    pub field: DeviceField,
    pub member: usize,
    pub factor: f64,
}

/// Every distinct call of [`DEVICE_FIELDS`], in the order of its first row, with the fields it
/// fills: what sampling asks of a device each tick for its scalar fields, and so what the
/// benchmark floor asks too. Field-id rows are not here: see [`field_id_reads`].
pub fn field_calls() -> Vec<(NvmlCall, Vec<FieldRead>)> {
    let mut calls: Vec<(NvmlCall, Vec<FieldRead>)> = Vec::new();
    for spec in &DEVICE_FIELDS {
        let source = spec.source;
        let SourceKind::Call(call) = source.kind else {
            continue;
        };
        let member = call
            .member_index(source.member)
            .unwrap_or_else(|| panic!("{}: {} has no member {:?}", spec.key, call, source.member));
        let read = FieldRead {
            field: spec.field,
            member,
            factor: source.scale.factor(),
        };
        match calls.iter_mut().find(|(c, _)| *c == call) {
            Some((_, reads)) => reads.push(read),
            None => calls.push((call, vec![read])),
        }
    }
    calls
}

/// Every field-id row of [`DEVICE_FIELDS`], in table order, with the field it fills (member 0):
/// sampling reads them together, one `nvmlDeviceGetFieldValues` call per device per tick, and
/// the benchmark floor makes the same call.
pub fn field_id_reads() -> Vec<(NvmlFieldId, FieldRead)> {
    DEVICE_FIELDS
        .iter()
        .filter_map(|spec| match spec.source.kind {
            SourceKind::FieldId(id) => {
                assert!(
                    spec.source.member.is_empty(),
                    "{}: a field id's value has no members",
                    spec.key
                );
                Some((
                    id,
                    FieldRead {
                        field: spec.field,
                        member: 0,
                        factor: spec.source.scale.factor(),
                    },
                ))
            }
            SourceKind::Call(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call fills some field, and every member a call names is read by some row: a call
    /// nobody reads would be made for nothing every tick.
    #[test]
    fn every_call_and_member_is_read() {
        let calls = field_calls();
        for call in NvmlCall::ALL {
            let Some((_, reads)) = calls.iter().find(|(c, _)| c == call) else {
                panic!("{call} fills no field of DEVICE_FIELDS");
            };
            for (i, member) in call.members().iter().enumerate() {
                assert!(
                    reads.iter().any(|r| r.member == i),
                    "{call}: no row reads {member}"
                );
            }
        }
    }

    /// Every field id is read by exactly one row (a batch asks each id once).
    #[test]
    fn every_field_id_is_read_once() {
        let reads = field_id_reads();
        for id in NvmlFieldId::ALL {
            assert_eq!(
                reads.iter().filter(|(i, _)| i == id).count(),
                1,
                "{}",
                id.c_name()
            );
        }
        let (_, temp) = reads
            .iter()
            .find(|(id, _)| *id == NvmlFieldId::MemoryTemp)
            .expect("memory temperature");
        assert_eq!(temp.field, DeviceField::MemoryTemperature);
        assert!(field_calls()
            .iter()
            .all(|(_, reads)| reads.iter().all(|r| r.field != temp.field)));
    }

    use crate::schema::Instrument;

    #[test]
    fn rows_are_in_field_order_with_unique_keys() {
        for (i, spec) in DEVICE_FIELDS.iter().enumerate() {
            assert_eq!(spec.field as usize, i, "{} is out of place", spec.key);
        }
        let mut keys: Vec<&str> = DEVICE_FIELDS.iter().map(|s| s.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), FIELD_COUNT);
    }

    #[test]
    fn only_gauges_have_extremes_and_metric_attributes_are_unique() {
        let mut seen = Vec::new();
        for spec in &DEVICE_FIELDS {
            let m = spec.metric;
            if m.max.is_some() || m.min.is_some() {
                assert_eq!(spec.window, WindowKind::Gauge, "{}", spec.key);
            }
            assert!(
                !seen.contains(&(m.id, m.attribute)),
                "{} repeats {:?}",
                spec.key,
                m.id
            );
            seen.push((m.id, m.attribute));
        }
    }

    /// A companion is named after the metric it accompanies, and a field's kind fits its
    /// metric's instrument: what a window keeps of a level or a gauge is a gauge or an
    /// updowncounter, of a counter or a rate a counter.
    #[test]
    fn companions_and_instruments_fit_the_metric() {
        for spec in &DEVICE_FIELDS {
            let base = spec.metric.id.spec();
            for (companion, suffix) in [(spec.metric.max, ".max"), (spec.metric.min, ".min")] {
                if let Some(id) = companion {
                    assert_eq!(
                        id.spec().name,
                        format!("{}{suffix}", base.name),
                        "{}",
                        spec.key
                    );
                }
            }
            let counter = base.instrument == Instrument::Counter;
            let cumulative = matches!(
                spec.window,
                WindowKind::LifetimeCounter | WindowKind::IntegratedRate
            );
            // PCIe replays are the driver's own total, exported as it is on a counter.
            assert!(
                counter == cumulative || spec.field == DeviceField::PcieReplays,
                "{}: {:?} on a {:?}",
                spec.key,
                spec.window,
                base.instrument
            );
        }
    }

    #[test]
    fn a_rate_is_sampled_per_second_of_its_metric_unit() {
        for spec in &DEVICE_FIELDS {
            assert!(!spec.unit().is_empty(), "{}", spec.key);
        }
        assert_eq!(DeviceField::PcieTx.spec().unit(), "By/s");
        assert_eq!(DeviceField::MemoryUsed.spec().unit(), "By");
        assert_eq!(DeviceField::Temperature.spec().unit(), "Cel");
    }
}
