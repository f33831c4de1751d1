//! The metric catalogue: every metric the request builder can emit (name, instrument, unit,
//! description), in request order, addressed by [`MetricId`]; the table docs/metrics.md
//! documents (an integration test holds the two equal). Names the OpenTelemetry semantic
//! conventions define come from `opentelemetry-semantic-conventions`; the rest are gpulse's own
//! (`nvidia.gpu.*`, `gpulse.*`) or follow the conventions' patterns (`process.gpu.*`). Also the
//! names of NVML's clock throttle reasons, taken from nvml-wrapper's `ThrottleReasons`.
//!
//! Pure data: depends on nothing else in gpulse (the device field catalogue,
//! `sampling::fields`, names the metrics of its fields; a test holds it to this table).

use std::sync::LazyLock;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use opentelemetry_semantic_conventions::metric as semconv;

/// The kind of OpenTelemetry instrument a metric stands for, as docs/metrics.md names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instrument {
    /// OTLP Gauge.
    Gauge,
    /// OTLP Sum, monotonic, cumulative.
    Counter,
    /// OTLP Sum, not monotonic, cumulative.
    UpDownCounter,
}

impl Instrument {
    /// The name docs/metrics.md uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Instrument::Gauge => "gauge",
            Instrument::Counter => "counter",
            Instrument::UpDownCounter => "updowncounter",
        }
    }
}

/// One row of the metric reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSpec {
    id: MetricId,
    pub name: &'static str,
    pub instrument: Instrument,
    /// UCUM unit.
    pub unit: &'static str,
    pub description: &'static str,
}

/// Index of a metric in [`METRICS`]; the builders address metrics by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricId {
    GpuUtilization,
    GpuUtilizationMax,
    GpuUtilizationMin,
    GpuMemoryUtilization,
    GpuMemoryUtilizationMax,
    GpuMemoryUtilizationMin,
    GpuMemoryUsage,
    GpuMemoryLimit,
    GpuMemoryFree,
    GpuMemoryReserved,
    Temperature,
    TemperatureMax,
    Power,
    PowerMax,
    PowerLimit,
    Energy,
    Clock,
    FanSpeed,
    GpuIo,
    Throttle,
    Errors,
    Status,
    PerformanceState,
    PcieLinkGeneration,
    PcieLinkWidth,
    SmActivity,
    SmActivityMax,
    SmActivityMin,
    SmOccupancy,
    SmOccupancyMax,
    SmOccupancyMin,
    DramActivity,
    DramActivityMax,
    DramActivityMin,
    GraphicsActivity,
    GraphicsActivityMax,
    GraphicsActivityMin,
    PipeActivity,
    PipeActivityMax,
    PipeActivityMin,
    RemappedRows,
    RemapPending,
    RemapFailed,
    ThrottleTime,
    NvLinkIo,
    NvLinkState,
    ProcessGpuMemoryUsage,
    ProcessGpuUtilization,
    ProcessGpuUtilizationMax,
    ProcessGpuUtilizationMin,
    ProcessGpuMemoryUtilization,
    ProcessGpuMemoryUtilizationMax,
    ProcessGpuMemoryUtilizationMin,
    ProcessCpuUtilization,
    ProcessTreeCpuUtilization,
    ProcessMemoryUsage,
}

impl MetricId {
    /// This metric's row of [`METRICS`].
    pub(crate) fn spec(self) -> &'static MetricSpec {
        &METRICS[self as usize]
    }

    /// The metric with this name.
    pub(crate) fn by_name(name: &str) -> Option<Self> {
        METRICS.iter().find(|m| m.name == name).map(|m| m.id)
    }
}

const METRIC_COUNT: usize = MetricId::ProcessMemoryUsage as usize + 1;

const fn spec(
    id: MetricId,
    name: &'static str,
    instrument: Instrument,
    unit: &'static str,
    description: &'static str,
) -> MetricSpec {
    MetricSpec {
        id,
        name,
        instrument,
        unit,
        description,
    }
}

use Instrument::{Counter, Gauge as G, UpDownCounter as UpDown};
use MetricId as M;

/// Every metric gpulse can emit, in the order they appear in a request.
#[rustfmt::skip]
pub static METRICS: [MetricSpec; METRIC_COUNT] = [
    spec(M::GpuUtilization, semconv::HW_GPU_UTILIZATION, G, "1", "Mean ratio of the window the GPU task was busy."),
    spec(M::GpuUtilizationMax, "hw.gpu.utilization.max", G, "1", "Highest sampled hw.gpu.utilization in the window."),
    spec(M::GpuUtilizationMin, "hw.gpu.utilization.min", G, "1", "Lowest sampled hw.gpu.utilization in the window."),
    spec(M::GpuMemoryUtilization, semconv::HW_GPU_MEMORY_UTILIZATION, G, "1", "Mean ratio of the window device memory was read or written."),
    spec(M::GpuMemoryUtilizationMax, "hw.gpu.memory.utilization.max", G, "1", "Highest sampled hw.gpu.memory.utilization in the window."),
    spec(M::GpuMemoryUtilizationMin, "hw.gpu.memory.utilization.min", G, "1", "Lowest sampled hw.gpu.memory.utilization in the window."),
    spec(M::GpuMemoryUsage, semconv::HW_GPU_MEMORY_USAGE, UpDown, "By", "Device memory in use."),
    spec(M::GpuMemoryLimit, semconv::HW_GPU_MEMORY_LIMIT, UpDown, "By", "Total device memory."),
    spec(M::GpuMemoryFree, "hw.gpu.memory.free", UpDown, "By", "Device memory free."),
    spec(M::GpuMemoryReserved, "hw.gpu.memory.reserved", UpDown, "By", "Device memory the driver reserves."),
    spec(M::Temperature, semconv::HW_TEMPERATURE, G, "Cel", "Mean GPU temperature over the window."),
    spec(M::TemperatureMax, "hw.temperature.max", G, "Cel", "Highest sampled GPU temperature in the window."),
    spec(M::Power, semconv::HW_POWER, G, "W", "Mean power draw over the window."),
    spec(M::PowerMax, "hw.power.max", G, "W", "Highest sampled power draw in the window."),
    spec(M::PowerLimit, "nvidia.gpu.power.limit", G, "W", "Enforced power limit."),
    spec(M::Energy, semconv::HW_ENERGY, Counter, "J", "Energy used since the start time."),
    spec(M::Clock, "nvidia.gpu.clock", G, "MHz", "Mean clock frequency over the window."),
    spec(M::FanSpeed, "nvidia.gpu.fan.speed", G, "1", "Mean fan speed, ratio of the maximum."),
    spec(M::GpuIo, semconv::HW_GPU_IO, Counter, "By", "PCIe bytes transferred since the start time."),
    spec(M::Throttle, "nvidia.gpu.throttle", G, "1", "Ratio of the window the clock throttle reason was active."),
    spec(M::Errors, semconv::HW_ERRORS, Counter, "{error}", "Errors since the start time."),
    spec(M::Status, semconv::HW_STATUS, UpDown, "1", "1 for the device's current state, 0 for the other."),
    spec(M::PerformanceState, "nvidia.gpu.performance_state", G, "1", "Performance state, 0 (max) to 15 (min)."),
    spec(M::PcieLinkGeneration, "nvidia.gpu.pcie.link.generation", G, "{generation}", "PCIe generation the link runs at now."),
    spec(M::PcieLinkWidth, "nvidia.gpu.pcie.link.width", G, "{lane}", "PCIe lanes the link runs with now."),
    spec(M::SmActivity, "nvidia.gpu.sm.activity", G, "1", "Mean ratio of SMs with at least one warp resident (GPM SM_UTIL; DCGM PROF_SM_ACTIVE)."),
    spec(M::SmActivityMax, "nvidia.gpu.sm.activity.max", G, "1", "Highest nvidia.gpu.sm.activity between two GPM samples in the window."),
    spec(M::SmActivityMin, "nvidia.gpu.sm.activity.min", G, "1", "Lowest nvidia.gpu.sm.activity between two GPM samples in the window."),
    spec(M::SmOccupancy, "nvidia.gpu.sm.occupancy", G, "1", "Mean ratio of resident warps to the maximum the SMs hold (GPM SM_OCCUPANCY)."),
    spec(M::SmOccupancyMax, "nvidia.gpu.sm.occupancy.max", G, "1", "Highest nvidia.gpu.sm.occupancy between two GPM samples in the window."),
    spec(M::SmOccupancyMin, "nvidia.gpu.sm.occupancy.min", G, "1", "Lowest nvidia.gpu.sm.occupancy between two GPM samples in the window."),
    spec(M::DramActivity, "nvidia.gpu.dram.activity", G, "1", "Mean ratio of DRAM bandwidth used to its peak (GPM DRAM_BW_UTIL)."),
    spec(M::DramActivityMax, "nvidia.gpu.dram.activity.max", G, "1", "Highest nvidia.gpu.dram.activity between two GPM samples in the window."),
    spec(M::DramActivityMin, "nvidia.gpu.dram.activity.min", G, "1", "Lowest nvidia.gpu.dram.activity between two GPM samples in the window."),
    spec(M::GraphicsActivity, "nvidia.gpu.graphics.activity", G, "1", "Mean ratio of time the graphics engine was active (GPM GRAPHICS_UTIL)."),
    spec(M::GraphicsActivityMax, "nvidia.gpu.graphics.activity.max", G, "1", "Highest nvidia.gpu.graphics.activity between two GPM samples in the window."),
    spec(M::GraphicsActivityMin, "nvidia.gpu.graphics.activity.min", G, "1", "Lowest nvidia.gpu.graphics.activity between two GPM samples in the window."),
    spec(M::PipeActivity, "nvidia.gpu.pipe.activity", G, "1", "Mean ratio of time the pipe was active (GPM *_UTIL)."),
    spec(M::PipeActivityMax, "nvidia.gpu.pipe.activity.max", G, "1", "Highest nvidia.gpu.pipe.activity between two GPM samples in the window."),
    spec(M::PipeActivityMin, "nvidia.gpu.pipe.activity.min", G, "1", "Lowest nvidia.gpu.pipe.activity between two GPM samples in the window."),
    spec(M::RemappedRows, "nvidia.gpu.memory.remapped_rows", UpDown, "{row}", "Rows the row remapper replaced, by the kind of error that caused it."),
    spec(M::RemapPending, "nvidia.gpu.memory.remap.pending", G, "1", "1 when a row remapping waits for a GPU reset."),
    spec(M::RemapFailed, "nvidia.gpu.memory.remap.failed", G, "1", "1 when a row remapping failed: the memory cannot be repaired."),
    spec(M::ThrottleTime, "nvidia.gpu.throttle.time", Counter, "s", "Time the performance policy held the clocks down, since the driver loaded."),
    spec(M::NvLinkIo, "nvidia.gpu.nvlink.io", Counter, "By", "NVLink data bytes the link sent or received, since the driver loaded."),
    spec(M::NvLinkState, "nvidia.gpu.nvlink.state", G, "1", "1 when the NVLink link is active, 0 when it is down."),
    spec(M::ProcessGpuMemoryUsage, "process.gpu.memory.usage", UpDown, "By", "Device memory the process holds on the device."),
    spec(M::ProcessGpuUtilization, "process.gpu.utilization", G, "1", "Mean ratio of the window the process kept the GPU task busy."),
    spec(M::ProcessGpuUtilizationMax, "process.gpu.utilization.max", G, "1", "Highest sampled process.gpu.utilization in the window."),
    spec(M::ProcessGpuUtilizationMin, "process.gpu.utilization.min", G, "1", "Lowest sampled process.gpu.utilization in the window."),
    spec(M::ProcessGpuMemoryUtilization, "process.gpu.memory.utilization", G, "1", "Mean ratio of the window the process read or wrote device memory."),
    spec(M::ProcessGpuMemoryUtilizationMax, "process.gpu.memory.utilization.max", G, "1", "Highest sampled process.gpu.memory.utilization in the window."),
    spec(M::ProcessGpuMemoryUtilizationMin, "process.gpu.memory.utilization.min", G, "1", "Lowest sampled process.gpu.memory.utilization in the window."),
    spec(M::ProcessCpuUtilization, semconv::PROCESS_CPU_UTILIZATION, G, "1", "CPU time of the process alone over the window, ratio of one core."),
    spec(M::ProcessTreeCpuUtilization, "gpulse.process.tree.cpu.utilization", G, "1", "CPU time of the process and its descendants over the window, ratio of one core."),
    spec(M::ProcessMemoryUsage, semconv::PROCESS_MEMORY_USAGE, UpDown, "By", "Resident set size of the process."),
];

/// NVML's clock throttle (clock event) reasons: bit value (`nvmlClocksThrottleReason*` in
/// nvml.h) and name, from nvml-wrapper's `ThrottleReasons` flags (lower case, as exported in
/// `nvidia.gpu.throttle.reason`), in bit order. An alias of an earlier bit (the deprecated
/// `USER_DEFINED_CLOCKS`) and the empty `NONE` are not reasons of their own and are left out.
pub fn throttle_reasons() -> &'static [(u64, &'static str)] {
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
pub fn throttle_reason_names(bits: u64) -> Vec<&'static str> {
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

    #[test]
    fn metric_table_ids_match_positions_and_names_are_unique() {
        for (i, spec) in METRICS.iter().enumerate() {
            assert_eq!(spec.id as usize, i, "{} is out of place", spec.name);
        }
        let mut names: Vec<&str> = METRICS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
    }

    /// Every metric the device field catalogue names is a row here, with the field's unit
    /// (a rate's integral drops the `/s`), and the companions it asks for exist.
    #[test]
    fn device_fields_name_catalogue_metrics_in_their_units() {
        use crate::sampling::{WindowKind, DEVICE_FIELDS};
        for spec in &DEVICE_FIELDS {
            let Some(m) = spec.metric else { continue };
            let id = MetricId::by_name(m.name)
                .unwrap_or_else(|| panic!("{} names {}, not in METRICS", spec.key, m.name));
            let unit = match spec.window {
                WindowKind::IntegratedRate => spec.unit.trim_end_matches("/s"),
                _ => spec.unit,
            };
            assert_eq!(id.spec().unit, unit, "{}", spec.key);
            for (wanted, suffix) in [(m.max, ".max"), (m.min, ".min")] {
                if wanted {
                    let companion = format!("{}{suffix}", m.name);
                    assert!(MetricId::by_name(&companion).is_some(), "{companion}");
                }
            }
        }
    }

    #[test]
    fn companions_extend_the_name_they_accompany() {
        for (i, spec) in METRICS.iter().enumerate() {
            for suffix in [".max", ".min"] {
                if let Some(base) = spec.name.strip_suffix(suffix) {
                    let found = METRICS[..i].iter().find(|m| m.name == base);
                    let base_spec =
                        found.unwrap_or_else(|| panic!("{} has no {base} before it", spec.name));
                    assert_eq!(
                        (base_spec.instrument, base_spec.unit),
                        (spec.instrument, spec.unit),
                        "{}",
                        spec.name
                    );
                }
            }
        }
    }

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
