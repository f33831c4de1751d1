//! The metric table: every OTLP metric the request builder can emit (name, instrument, unit,
//! description, and the columns of its line in docs/metrics.md), in request order, addressed by
//! [`MetricId`]. The enum and the table are declared together by one macro, so a metric is one
//! row and the count is derived. Names the OpenTelemetry semantic conventions define come from
//! `opentelemetry-semantic-conventions`; the rest are gpulse's own (`nvidia.gpu.*`, `gpulse.*`)
//! or follow the conventions' patterns (`process.gpu.*`).
//!
//! gpulse's own health metrics (`gpulse.export.*`, `gpulse.sample.*`) are not here: they are
//! instruments of the OpenTelemetry SDK in `crate::export::telemetry`.

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

/// Which resource a metric's points are reported under, and so which table of docs/metrics.md
/// lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The node resource: a GPU or MIG device's points.
    Device,
    /// One resource per GPU process.
    Process,
}

/// One row of the metric table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSpec {
    pub id: MetricId,
    pub name: &'static str,
    pub instrument: Instrument,
    /// UCUM unit.
    pub unit: &'static str,
    pub section: Section,
    /// The OTLP metric description.
    pub description: &'static str,
    /// docs/metrics.md's source and notes columns (Markdown; empty where there is nothing to say:
    /// a `.max`/`.min` companion's source is that of the metric it accompanies). The attribute
    /// column is rendered from [`metric_attributes`](super::signals::metric_attributes).
    ///
    /// Where the value comes from, beyond the typed sources of the device and GPM fields the
    /// metric carries (the docs name those from [`DEVICE_FIELDS`](super::DEVICE_FIELDS) and
    /// [`GPM_FIELDS`](super::GPM_FIELDS) first): family calls, `/proc`, spans. Empty when the
    /// fields say it all.
    pub source: &'static str,
    pub notes: &'static str,
}

impl MetricId {
    /// This metric's row of [`METRICS`].
    pub(crate) const fn spec(self) -> &'static MetricSpec {
        &METRICS[self as usize]
    }

    /// The metric named `name` (as exported), if gpulse has one.
    pub(crate) fn by_name(name: &str) -> Option<MetricId> {
        static BY_NAME: std::sync::OnceLock<std::collections::HashMap<&'static str, MetricId>> =
            std::sync::OnceLock::new();
        BY_NAME
            .get_or_init(|| METRICS.iter().map(|m| (m.name, m.id)).collect())
            .get(name)
            .copied()
    }
}

/// Declares [`MetricId`] and [`METRICS`] from one list, so they cannot disagree.
macro_rules! metric_table {
    ($( $id:ident: $name:expr, $instrument:ident, $unit:literal, $section:ident,
        $description:literal,
        source $source:literal,
        notes $notes:literal; )*) => {
        /// Index of a metric in [`METRICS`]; the builders address metrics by it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum MetricId {
            $( $id, )*
        }

        /// Number of [`MetricId`]s.
        pub const METRIC_COUNT: usize = [$( MetricId::$id ),*].len();

        /// Every metric gpulse can emit, in the order they appear in a request.
        pub static METRICS: [MetricSpec; METRIC_COUNT] = [$(
            MetricSpec {
                id: MetricId::$id,
                name: $name,
                instrument: Instrument::$instrument,
                unit: $unit,
                section: Section::$section,
                description: $description,
                source: $source,
                notes: $notes,
            },
        )*];
    };
}

metric_table! {
    GpuUtilization: semconv::HW_GPU_UTILIZATION, Gauge, "1", Device,
        "Mean ratio of the window the GPU task was busy.",
        source "",
        notes "window mean, ratio 0–1";
    GpuUtilizationMax: "hw.gpu.utilization.max", Gauge, "1", Device,
        "Highest sampled hw.gpu.utilization in the window.",
        source "",
        notes "highest sample in the window";
    GpuUtilizationMin: "hw.gpu.utilization.min", Gauge, "1", Device,
        "Lowest sampled hw.gpu.utilization in the window.",
        source "",
        notes "lowest sample in the window";
    GpuMemoryUtilization: semconv::HW_GPU_MEMORY_UTILIZATION, Gauge, "1", Device,
        "Mean ratio of the window device memory was read or written.",
        source "",
        notes "share of time memory was read or written (not capacity)";
    GpuMemoryUtilizationMax: "hw.gpu.memory.utilization.max", Gauge, "1", Device,
        "Highest sampled hw.gpu.memory.utilization in the window.",
        source "",
        notes "";
    GpuMemoryUtilizationMin: "hw.gpu.memory.utilization.min", Gauge, "1", Device,
        "Lowest sampled hw.gpu.memory.utilization in the window.",
        source "",
        notes "";
    GpuMemoryUsage: semconv::HW_GPU_MEMORY_USAGE, UpDownCounter, "By", Device,
        "Device memory in use.",
        source "",
        notes "last value";
    GpuMemoryLimit: semconv::HW_GPU_MEMORY_LIMIT, UpDownCounter, "By", Device,
        "Total device memory.",
        source "",
        notes "last value";
    GpuMemoryFree: "hw.gpu.memory.free", UpDownCounter, "By", Device,
        "Device memory free.",
        source "",
        notes "last value; not in the semantic conventions";
    GpuMemoryReserved: "hw.gpu.memory.reserved", UpDownCounter, "By", Device,
        "Device memory the driver reserves.",
        source "",
        notes "last value; driver-reserved; not in the semantic conventions";
    Bar1MemoryUsage: "nvidia.gpu.bar1.memory.usage", UpDownCounter, "By", Device,
        "BAR1 memory mapped (the aperture through which the CPU and peers reach device memory).",
        source "",
        notes "last value; BAR1 full makes RDMA/GPUDirect and pinned mappings fail while device memory is free. DCGM's `DCGM_FI_DEV_BAR1_USED`";
    Bar1MemoryLimit: "nvidia.gpu.bar1.memory.limit", UpDownCounter, "By", Device,
        "Size of the BAR1 aperture.",
        source "",
        notes "last value; DCGM's `DCGM_FI_DEV_BAR1_TOTAL`";
    Bar1MemoryFree: "nvidia.gpu.bar1.memory.free", UpDownCounter, "By", Device,
        "BAR1 memory not mapped.",
        source "",
        notes "last value; DCGM's `DCGM_FI_DEV_BAR1_FREE`";
    Temperature: semconv::HW_TEMPERATURE, Gauge, "Cel", Device,
        "Mean GPU temperature over the window.",
        source "",
        notes "window mean";
    TemperatureMax: "hw.temperature.max", Gauge, "Cel", Device,
        "Highest sampled GPU temperature in the window.",
        source "",
        notes "hottest sample in the window";
    MemoryTemperature: "nvidia.gpu.memory.temperature", Gauge, "Cel", Device,
        "Mean device memory (HBM) temperature over the window.",
        source "",
        notes "window mean; only on boards whose memory reports it (HBM), absent elsewhere; DCGM's `DCGM_FI_DEV_MEMORY_TEMP`";
    MemoryTemperatureMax: "nvidia.gpu.memory.temperature.max", Gauge, "Cel", Device,
        "Highest sampled device memory temperature in the window.",
        source "",
        notes "hottest sample in the window";
    Power: semconv::HW_POWER, Gauge, "W", Device,
        "Mean power draw over the window.",
        source "",
        notes "window mean";
    PowerMax: "hw.power.max", Gauge, "W", Device,
        "Highest sampled power draw in the window.",
        source "",
        notes "highest sample in the window";
    PowerLimit: "nvidia.gpu.power.limit", Gauge, "W", Device,
        "Enforced power limit.",
        source "",
        notes "last value";
    Energy: semconv::HW_ENERGY, Counter, "J", Device,
        "Energy used since the start time.",
        source "",
        notes "since `counters_start`";
    Clock: "nvidia.gpu.clock", Gauge, "MHz", Device,
        "Mean clock frequency over the window.",
        source "",
        notes "window mean";
    FanSpeed: "nvidia.gpu.fan.speed", Gauge, "1", Device,
        "Mean fan speed, ratio of the maximum.",
        source "",
        notes "window mean of the mean over fans; absent on passively cooled boards";
    GpuIo: semconv::HW_GPU_IO, Counter, "By", Device,
        "PCIe bytes transferred since the start time.",
        source "",
        notes "PCIe bytes since `counters_start`, integrated from the sampled throughput (NVML samples a 20 ms window: an estimate)";
    Throttle: "nvidia.gpu.throttle", Gauge, "1", Device,
        "Ratio of the window the clock throttle reason was active.",
        source "`nvmlDeviceGetCurrentClocksEventReasons` (`…ThrottleReasons`)",
        notes "ratio of the window's samples in which the reason was active; a known-inactive reason is `0`; no point at all when the throttle state is unknown";
    Errors: semconv::HW_ERRORS, Counter, "{error}", Device,
        "Errors since the start time.",
        source "XID events (`nvmlEventSetWait`), NVLink field values (below)",
        notes "since `counters_start` (`pcie_replay` and `nvlink_*`: the driver's totals since it loaded); ECC points only where ECC is supported and enabled; `xid`: one series per XID code seen since `counters_start`, and while none has been seen one point of `0` without `nvidia.gpu.xid`; `nvlink_crc` = flit CRC (`NVML_FI_DEV_NVLINK_ERROR_DL_CRC`, scopeId = link) + data CRC (`NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_Ln`, links 0–11, pre-Hopper), `nvlink_replay` / `nvlink_recovery` = `NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY` / `_RECOVERY` (scopeId = link)";
    Status: semconv::HW_STATUS, UpDownCounter, "1", Device,
        "1 for the device's current state, 0 for the other.",
        source "NVML answering / `NVML_ERROR_GPU_IS_LOST`",
        notes "`1` for the current state, `0` for the other: a lost GPU shows as `failed` = 1";
    PerformanceState: "nvidia.gpu.performance_state", Gauge, "1", Device,
        "Performance state, 0 (max) to 15 (min).",
        source "",
        notes "last value, 0 (max performance) to 15 (min)";
    PcieLinkGeneration: "nvidia.gpu.pcie.link.generation", Gauge, "{generation}", Device,
        "PCIe generation the link runs at now.",
        source "",
        notes "last value; a link below its maximum at load (after a bad riser, a BIOS setting) cuts host↔GPU bandwidth; it may drop at idle to save power. DCGM's `DCGM_FI_DEV_PCIE_LINK_GEN`";
    PcieLinkWidth: "nvidia.gpu.pcie.link.width", Gauge, "{lane}", Device,
        "PCIe lanes the link runs with now.",
        source "",
        notes "last value (e.g. 16); DCGM's `DCGM_FI_DEV_PCIE_LINK_WIDTH`";
    SmActivity: "nvidia.gpu.sm.activity", Gauge, "1", Device,
        "Mean ratio of SMs with at least one warp resident (GPM SM_UTIL; DCGM PROF_SM_ACTIVE).",
        source "",
        notes "window mean of the rates between consecutive GPM samples (≥ 100 ms apart): share of SMs with a warp resident. Hopper and newer only; DCGM's `DCGM_FI_PROF_SM_ACTIVE`";
    SmActivityMax: "nvidia.gpu.sm.activity.max", Gauge, "1", Device,
        "Highest nvidia.gpu.sm.activity between two GPM samples in the window.",
        source "",
        notes "";
    SmActivityMin: "nvidia.gpu.sm.activity.min", Gauge, "1", Device,
        "Lowest nvidia.gpu.sm.activity between two GPM samples in the window.",
        source "",
        notes "";
    SmOccupancy: "nvidia.gpu.sm.occupancy", Gauge, "1", Device,
        "Mean ratio of resident warps to the maximum the SMs hold (GPM SM_OCCUPANCY).",
        source "",
        notes "resident warps over the SMs' maximum; DCGM's `DCGM_FI_PROF_SM_OCCUPANCY`";
    SmOccupancyMax: "nvidia.gpu.sm.occupancy.max", Gauge, "1", Device,
        "Highest nvidia.gpu.sm.occupancy between two GPM samples in the window.",
        source "",
        notes "";
    SmOccupancyMin: "nvidia.gpu.sm.occupancy.min", Gauge, "1", Device,
        "Lowest nvidia.gpu.sm.occupancy between two GPM samples in the window.",
        source "",
        notes "";
    DramActivity: "nvidia.gpu.dram.activity", Gauge, "1", Device,
        "Mean ratio of DRAM bandwidth used to its peak (GPM DRAM_BW_UTIL).",
        source "",
        notes "DRAM bandwidth used over its peak; DCGM's `DCGM_FI_PROF_DRAM_ACTIVE`";
    DramActivityMax: "nvidia.gpu.dram.activity.max", Gauge, "1", Device,
        "Highest nvidia.gpu.dram.activity between two GPM samples in the window.",
        source "",
        notes "";
    DramActivityMin: "nvidia.gpu.dram.activity.min", Gauge, "1", Device,
        "Lowest nvidia.gpu.dram.activity between two GPM samples in the window.",
        source "",
        notes "";
    GraphicsActivity: "nvidia.gpu.graphics.activity", Gauge, "1", Device,
        "Mean ratio of time the graphics engine was active (GPM GRAPHICS_UTIL).",
        source "",
        notes "graphics engine active; DCGM's `DCGM_FI_PROF_GR_ENGINE_ACTIVE`";
    GraphicsActivityMax: "nvidia.gpu.graphics.activity.max", Gauge, "1", Device,
        "Highest nvidia.gpu.graphics.activity between two GPM samples in the window.",
        source "",
        notes "";
    GraphicsActivityMin: "nvidia.gpu.graphics.activity.min", Gauge, "1", Device,
        "Lowest nvidia.gpu.graphics.activity between two GPM samples in the window.",
        source "",
        notes "";
    PipeActivity: "nvidia.gpu.pipe.activity", Gauge, "1", Device,
        "Mean ratio of time the pipe was active (GPM *_UTIL).",
        source "",
        notes "share of time the pipe was active; `tensor` is any tensor pipe (DCGM's `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`)";
    PipeActivityMax: "nvidia.gpu.pipe.activity.max", Gauge, "1", Device,
        "Highest nvidia.gpu.pipe.activity between two GPM samples in the window.",
        source "",
        notes "";
    PipeActivityMin: "nvidia.gpu.pipe.activity.min", Gauge, "1", Device,
        "Lowest nvidia.gpu.pipe.activity between two GPM samples in the window.",
        source "",
        notes "";
    RemappedRows: "nvidia.gpu.memory.remapped_rows", UpDownCounter, "{row}", Device,
        "Rows the row remapper replaced, by the kind of error that caused it.",
        source "`nvmlDeviceGetRemappedRows` (`corrRows`, `uncRows`)",
        notes "last value; Ampere and newer";
    RemapPending: "nvidia.gpu.memory.remap.pending", Gauge, "1", Device,
        "1 when a row remapping waits for a GPU reset.",
        source "`nvmlDeviceGetRemappedRows` (`isPending`)",
        notes "1 when a remapping waits for a GPU reset (drain and reset the GPU), else 0";
    RemapFailed: "nvidia.gpu.memory.remap.failed", Gauge, "1", Device,
        "1 when a row remapping failed: the memory cannot be repaired.",
        source "`nvmlDeviceGetRemappedRows` (`failureOccurred`)",
        notes "1 when a remapping failed (the memory cannot be repaired: RMA), else 0";
    ThrottleTime: "nvidia.gpu.throttle.time", Counter, "s", Device,
        "Time the performance policy held the clocks down, since the driver loaded.",
        source "`nvmlDeviceGetViolationStatus` (ns → s)",
        notes "the driver's total since it loaded (start = `counters_start`); a policy the device does not report has no point";
    NvLinkIo: "nvidia.gpu.nvlink.io", Counter, "By", Device,
        "NVLink data bytes the link sent or received, since the driver loaded.",
        source "`nvmlDeviceGetFieldValues` `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` with `scopeId` = the link (KiB → bytes), all links of a device in one call",
        notes "the driver's total since it loaded (start = `counters_start`); no point on a GPU without NVLink";
    NvLinkState: "nvidia.gpu.nvlink.state", Gauge, "1", Device,
        "1 when the NVLink link is active, 0 when it is down.",
        source "`nvmlDeviceGetNvLinkState`",
        notes "last value: `1` link active, `0` link down; one point per link NVML numbers (`NVML_FI_DEV_NVLINK_LINK_COUNT`)";
    ProcessGpuMemoryUsage: "process.gpu.memory.usage", UpDownCounter, "By", Process,
        "Device memory the process holds on the device.",
        source "`nvmlDeviceGetComputeRunningProcesses_v3`, `…GraphicsRunningProcesses_v3` (`usedGpuMemory`)",
        notes "last value; start = `first_seen` on that device";
    ProcessGpuUtilization: "process.gpu.utilization", Gauge, "1", Process,
        "Mean ratio of the window the process kept the GPU task busy.",
        source "`nvmlDeviceGetProcessUtilization` (`smUtil`, `encUtil`, `decUtil`)",
        notes "window mean. On MIG (no per-process figures there) only a process alone on its GPU instance has a point: `general` = the instance's graphics-engine activity (DCGM's advice: `GR_ENGINE_ACTIVE` in place of GPU-Util), `hw.id` = the `MIG-…` UUID";
    ProcessGpuUtilizationMax: "process.gpu.utilization.max", Gauge, "1", Process,
        "Highest sampled process.gpu.utilization in the window.",
        source "",
        notes "";
    ProcessGpuUtilizationMin: "process.gpu.utilization.min", Gauge, "1", Process,
        "Lowest sampled process.gpu.utilization in the window.",
        source "",
        notes "";
    ProcessGpuMemoryUtilization: "process.gpu.memory.utilization", Gauge, "1", Process,
        "Mean ratio of the window the process read or wrote device memory.",
        source "`nvmlDeviceGetProcessUtilization` (`memUtil`)",
        notes "window mean";
    ProcessGpuMemoryUtilizationMax: "process.gpu.memory.utilization.max", Gauge, "1", Process,
        "Highest sampled process.gpu.memory.utilization in the window.",
        source "",
        notes "";
    ProcessGpuMemoryUtilizationMin: "process.gpu.memory.utilization.min", Gauge, "1", Process,
        "Lowest sampled process.gpu.memory.utilization in the window.",
        source "",
        notes "";
    // MIG: a process alone on its GPU instance takes the instance's GPM activity as its own
    // (src/export/metrics/builder/process.rs; docs/shared-gpus.md#mig).
    ProcessGpuSmActivity: "process.gpu.sm.activity", Gauge, "1", Process,
        "Mean ratio of the MIG instance's SMs with a warp resident, for the process alone on it.",
        source "",
        notes "window mean; only for a process alone on its MIG GPU instance in the window (the instance's activity is then its own; several processes on one instance get no point: NVML cannot split it), see [shared-gpus.md](shared-gpus.md#mig)";
    ProcessGpuSmActivityMax: "process.gpu.sm.activity.max", Gauge, "1", Process,
        "Highest process.gpu.sm.activity between two GPM samples in the window.",
        source "",
        notes "";
    ProcessGpuSmActivityMin: "process.gpu.sm.activity.min", Gauge, "1", Process,
        "Lowest process.gpu.sm.activity between two GPM samples in the window.",
        source "",
        notes "";
    ProcessGpuDramActivity: "process.gpu.dram.activity", Gauge, "1", Process,
        "Mean ratio of the MIG instance's DRAM bandwidth used, for the process alone on it.",
        source "",
        notes "window mean; as `process.gpu.sm.activity`";
    ProcessGpuDramActivityMax: "process.gpu.dram.activity.max", Gauge, "1", Process,
        "Highest process.gpu.dram.activity between two GPM samples in the window.",
        source "",
        notes "";
    ProcessGpuDramActivityMin: "process.gpu.dram.activity.min", Gauge, "1", Process,
        "Lowest process.gpu.dram.activity between two GPM samples in the window.",
        source "",
        notes "";
    ProcessGpuPipeActivity: "process.gpu.pipe.activity", Gauge, "1", Process,
        "Mean ratio of time the MIG instance's tensor pipes were active, for the process alone on it.",
        source "",
        notes "window mean; as `process.gpu.sm.activity`";
    ProcessGpuPipeActivityMax: "process.gpu.pipe.activity.max", Gauge, "1", Process,
        "Highest process.gpu.pipe.activity between two GPM samples in the window.",
        source "",
        notes "";
    ProcessGpuPipeActivityMin: "process.gpu.pipe.activity.min", Gauge, "1", Process,
        "Lowest process.gpu.pipe.activity between two GPM samples in the window.",
        source "",
        notes "";
    // Not the conventions' `process.cpu.utilization`, which is normalised by the CPUs available
    // and split by `cpu.mode`: a ratio of one core answers "how many cores does it keep busy".
    ProcessCpuUtilization: "gpulse.process.cpu.utilization", Gauge, "1", Process,
        "CPU time of the process alone over the window, ratio of one core.",
        source "`/proc/<pid>/stat` (utime + stime)",
        notes "the process alone, over the window, as a ratio of **one core** (1.5 = one and a half cores busy)";
    ProcessTreeCpuUtilization: "gpulse.process.tree.cpu.utilization", Gauge, "1", Process,
        "CPU time of the process and its descendants over the window, ratio of one core.",
        source "`/proc/<pid>/stat` of the process and its descendants",
        notes "as `gpulse.process.cpu.utilization`, including DataLoader workers and other children";
    ProcessMemoryUsage: semconv::PROCESS_MEMORY_USAGE, UpDownCounter, "By", Process,
        "Resident set size of the process.",
        source "`/proc/<pid>/status` (`VmRSS`)",
        notes "resident set size, last value";
    // Training figures from the process's own step spans (gpulse's OTLP receiver): per rank, so
    // a backend can compare the ranks of a job across nodes (docs/distributed.md).
    TrainingStepDuration: "gpulse.training.step.duration", Gauge, "s", Process,
        "Mean duration of the process's recent training steps, from its step spans.",
        source "the companion's `step` spans through gpulse's OTLP receiver",
        notes "mean over the steps that ended within `input_bound.step_lookback` (1 min) of the newest, the figures the rules use; no point without recent step spans";
    TrainingStepCollectiveWait: "gpulse.training.step.collective_wait", Gauge, "s", Process,
        "Mean time per recent step the process had a torch.distributed collective in flight.",
        source "`pytorch.distributed.collective.wait` on the companion's `step` spans",
        notes "same steps as `gpulse.training.step.duration`; no point unless every counted step carried it. Step time outside collectives = duration − collective_wait";
    TrainingStepDataWait: "gpulse.training.step.data_wait", Gauge, "s", Process,
        "Mean time per recent step the process waited on its DataLoader.",
        source "the companion's `data_wait` spans",
        notes "same steps as `gpulse.training.step.duration`";
    // Shared GPUs: GPU time and energy per process, and the energy no process was charged
    // (src/attribution/accounting.rs; docs/shared-gpus.md).
    GpuEnergyAttribution: "gpulse.gpu.energy", Counter, "J", Device,
        "Energy of the GPU since gpulse started accounting it, by whether its processes were charged for it.",
        source "the GPU's energy per window (the `hw.energy` delta, else mean power × the window) split as in [shared-gpus.md](shared-gpus.md)",
        notes "`attributed` = charged to its processes (`process.gpu.energy`, exited processes included), `unattributed` = the rest: idle power, busy time of no known process, MIG instances shared by several processes; the two add up to the GPU's energy since the first accounted window (start)";
    ProcessGpuEnergy: "process.gpu.energy", Counter, "J", Process,
        "GPU energy charged to the process: the device's energy apportioned by the process's busy time.",
        source "the device's energy per window × the process's activity × its presence (× its MIG slice), see [shared-gpus.md](shared-gpus.md)",
        notes "since `first_seen` on that device; no point while its activity is not knowable (several processes on a MIG instance or on a GPU without per-process figures); the processes' sum never exceeds the device's; split by the ledger's cause (busy time's energy: `compute` and the waits that took busy time), whose sum is the process's energy";
    ProcessGpuTime: "process.gpu.time", Counter, "s", Process,
        "Time the process held the GPU, by whether it kept the GPU busy and by what the time went to.",
        source "the process lists (held time), its activity per window and its training loop's step spans, see [shared-gpus.md](shared-gpus.md)",
        notes "since `first_seen` on that device; the states add up to the time it held the GPU, and so do the causes; `active` = windows whose activity reached 5 %, `idle` = below, `unknown` = activity not knowable";
}

#[cfg(test)]
mod tests {
    use super::super::docs::{field_sources, mig_process_sources};
    use super::super::{DEVICE_FIELDS, GPM_FIELDS, MIG_PROCESS_GPM};
    use super::*;

    #[test]
    fn ids_match_positions_and_names_are_unique() {
        for (i, spec) in METRICS.iter().enumerate() {
            assert_eq!(spec.id as usize, i, "{} is out of place", spec.name);
        }
        let mut names: Vec<&str> = METRICS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
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
                        (base_spec.instrument, base_spec.unit, base_spec.section),
                        (spec.instrument, spec.unit, spec.section),
                        "{}",
                        spec.name
                    );
                }
            }
        }
    }

    /// Every metric has a description, and every metric that is not a companion says where its
    /// value comes from (the docs table would otherwise show a bare dash).
    #[test]
    fn every_metric_is_described_and_sourced() {
        for spec in &METRICS {
            assert!(spec.description.ends_with('.'), "{}", spec.name);
            let companion = spec.name.ends_with(".max") || spec.name.ends_with(".min");
            assert!(
                companion
                    || !spec.source.is_empty()
                    || !field_sources(spec).is_empty()
                    || !mig_process_sources(spec).is_empty(),
                "{} has no source",
                spec.name
            );
        }
    }

    /// A metric's hand-written source never repeats a call its device fields already name, nor
    /// a GPM metric its GPM fields (or, for a process metric, the MIG instance's GPM fields it
    /// takes) name, by its `nvml.h` name or the short one after `NVML_GPM_METRIC_`: the typed
    /// source is the one description, so the two cannot disagree.
    #[test]
    fn no_source_text_repeats_a_fields_call() {
        for spec in &METRICS {
            let mig = MIG_PROCESS_GPM
                .iter()
                .filter(|(_, m)| m.id == spec.id)
                .map(|(field, _)| &GPM_FIELDS[*field as usize]);
            for field in GPM_FIELDS
                .iter()
                .filter(|f| f.metric.id == spec.id)
                .chain(mig)
            {
                let name = field.c_name();
                let short = name.trim_start_matches("NVML_GPM_METRIC_");
                assert!(
                    !spec.source.contains(short),
                    "{}'s source text names {name}, which its GPM field `{}` already gives",
                    spec.name,
                    field.key
                );
            }
            for field in DEVICE_FIELDS.iter().filter(|f| f.metric.id == spec.id) {
                let call = field.source.kind.c_name();
                assert!(
                    !spec.source.contains(call),
                    "{}'s source text names {call}, which its field `{}` already gives: \
                     leave it to the schema",
                    spec.name,
                    field.key
                );
            }
        }
    }
}
