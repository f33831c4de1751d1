//! The device field catalogue: one descriptor per scalar NVML device field (a value NVML gives
//! once per device per tick), saying what it measures, its unit, what an export window keeps of
//! it, which OpenTelemetry metric carries it, its key in the `snapshot`/`/status` JSON and its
//! dcgm-exporter name. Sampling stores a tick's values in [`FieldValues`], the aggregator folds
//! them into a [`FieldWindows`] by the descriptor's [`WindowKind`], and the metrics builder, the
//! JSON reports and the DCGM compatibility families walk [`DEVICE_FIELDS`]: so a new field is
//! its NVML read (`sampling::nvml`), its row here, and its line in docs/metrics.md.
//!
//! GPM activity ratios (Hopper and newer) have a table of their own, [`GPM_FIELDS`], because
//! they are read together from one GPM sample pair, for a GPU and for each of its MIG instances,
//! and a window keeps the same summary (mean, min, max) of every one. Values that come as
//! families rather than one number per device (throttle reason bits, NVLink links, MIG
//! instances, the row remapper, violation times, XIDs) keep their own types and builders.
//!
//! Pure data: depends on nothing else in gpulse. A metric named here must be a row of the
//! metric catalogue (`export::metrics::METRICS`); a test holds the two together.

use std::fmt;

use nvml_wrapper::enums::gpm::GpmMetricId;
use serde::ser::{Serialize, SerializeMap, Serializer};

/// A scalar device field. The discriminant indexes [`DEVICE_FIELDS`] and the value arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceField {
    MemoryTotal,
    MemoryUsed,
    MemoryFree,
    MemoryReserved,
    UtilizationGpu,
    UtilizationMemory,
    UtilizationEncoder,
    UtilizationDecoder,
    Temperature,
    Power,
    PowerLimit,
    Energy,
    SmClock,
    MemoryClock,
    GraphicsClock,
    FanSpeed,
    PcieTx,
    PcieRx,
    EccCorrected,
    EccUncorrected,
    PerformanceState,
    PcieReplays,
    PcieLinkGeneration,
    PcieLinkWidth,
}

/// Number of [`DeviceField`]s.
pub const FIELD_COUNT: usize = DeviceField::PcieLinkWidth as usize + 1;

/// What an export window keeps of a field, and so what `/status`, the metrics and the DCGM
/// families report of it. Every field's sampled values are also summarised as a
/// [`Gauge`](super::Gauge) (mean, min, max, last) whatever its kind.
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

/// Where a field's window value goes in the OTLP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldMetric {
    /// Metric name, a row of the metric catalogue.
    pub name: &'static str,
    /// The attribute telling this field apart from others on the same metric.
    pub attribute: Option<(&'static str, &'static str)>,
    /// Whether the `.max` and `.min` companions carry the window's extremes (gauges only).
    pub max: bool,
    pub min: bool,
}

/// How dcgm-exporter scales a field it also exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmScale {
    /// A 0–1 ratio as a whole percent.
    Percent,
    /// Bytes as whole MiB.
    Mebibytes,
    /// Rounded to a whole number.
    Whole,
    /// As it is.
    Float,
    /// Joules as whole millijoules.
    Millijoules,
}

/// The dcgm-exporter series a field feeds (`DCGM_FI_*`), from the window's last value (totals
/// for counters), as dcgm-exporter reports its latest reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcgmSeries {
    pub name: &'static str,
    pub help: &'static str,
    pub scale: DcgmScale,
}

/// One row of the device field catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    pub field: DeviceField,
    /// Key in the device objects of `gpulse snapshot --format json` and `/status`.
    pub key: &'static str,
    /// UCUM unit of the sampled value.
    pub unit: &'static str,
    /// The quantity is whole (bytes, MHz, counts, P-state): reports print it as an integer.
    /// A rate's integral is whole bytes even though the rate is not.
    pub whole: bool,
    pub window: WindowKind,
    pub metric: Option<FieldMetric>,
    pub dcgm: Option<DcgmSeries>,
    /// What NVML call gives it, for docs and reviewers.
    pub source: &'static str,
}

impl DeviceField {
    /// This field's row of [`DEVICE_FIELDS`].
    pub fn spec(self) -> &'static FieldSpec {
        &DEVICE_FIELDS[self as usize]
    }
}

const fn metric(name: &'static str) -> Option<FieldMetric> {
    Some(FieldMetric {
        name,
        attribute: None,
        max: false,
        min: false,
    })
}

const fn metric_with(
    name: &'static str,
    key: &'static str,
    value: &'static str,
) -> Option<FieldMetric> {
    Some(FieldMetric {
        name,
        attribute: Some((key, value)),
        max: false,
        min: false,
    })
}

/// Adds the `.max` (and, with `min`, the `.min`) companion to a gauge's metric.
const fn extremes(m: Option<FieldMetric>, min: bool) -> Option<FieldMetric> {
    match m {
        Some(m) => Some(FieldMetric {
            max: true,
            min,
            ..m
        }),
        None => None,
    }
}

const fn dcgm(name: &'static str, help: &'static str, scale: DcgmScale) -> Option<DcgmSeries> {
    Some(DcgmSeries { name, help, scale })
}

#[allow(clippy::too_many_arguments)]
const fn row(
    field: DeviceField,
    key: &'static str,
    unit: &'static str,
    whole: bool,
    window: WindowKind,
    metric: Option<FieldMetric>,
    dcgm: Option<DcgmSeries>,
    source: &'static str,
) -> FieldSpec {
    FieldSpec {
        field,
        key,
        unit,
        whole,
        window,
        metric,
        dcgm,
        source,
    }
}

use DcgmScale::{Float, Mebibytes, Millijoules, Percent, Whole};
use DeviceField as F;
use WindowKind::{Gauge, IntegratedRate, Last, LifetimeCounter};

const GPU_TASK: &str = "hw.gpu.task";
const CLOCK_TYPE: &str = "nvidia.gpu.clock.type";
const DIRECTION: &str = "network.io.direction";
const ERROR_TYPE: &str = "error.type";

/// Every scalar device field, in [`DeviceField`] order (which is also the key order of the JSON
/// reports and the point order within a metric).
#[rustfmt::skip]
pub static DEVICE_FIELDS: [FieldSpec; FIELD_COUNT] = [
    row(F::MemoryTotal, "memory_total_bytes", "By", true, Last,
        metric("hw.gpu.memory.limit"), None,
        "nvmlDeviceGetMemoryInfo_v2 total (the static total when the call fails)"),
    row(F::MemoryUsed, "memory_used_bytes", "By", true, Last,
        metric("hw.gpu.memory.usage"),
        dcgm("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", Mebibytes),
        "nvmlDeviceGetMemoryInfo_v2 used"),
    row(F::MemoryFree, "memory_free_bytes", "By", true, Last,
        metric("hw.gpu.memory.free"),
        dcgm("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", Mebibytes),
        "nvmlDeviceGetMemoryInfo_v2 free"),
    row(F::MemoryReserved, "memory_reserved_bytes", "By", true, Last,
        metric("hw.gpu.memory.reserved"),
        dcgm("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", Mebibytes),
        "nvmlDeviceGetMemoryInfo_v2 reserved"),
    row(F::UtilizationGpu, "utilization_gpu", "1", false, Gauge,
        extremes(metric_with("hw.gpu.utilization", GPU_TASK, "general"), true),
        dcgm("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", Percent),
        "nvmlDeviceGetUtilizationRates gpu"),
    row(F::UtilizationMemory, "utilization_memory", "1", false, Gauge,
        extremes(metric("hw.gpu.memory.utilization"), true),
        dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", Percent),
        "nvmlDeviceGetUtilizationRates memory"),
    row(F::UtilizationEncoder, "utilization_encoder", "1", false, Gauge,
        extremes(metric_with("hw.gpu.utilization", GPU_TASK, "encoder"), true),
        dcgm("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", Percent),
        "nvmlDeviceGetEncoderUtilization"),
    row(F::UtilizationDecoder, "utilization_decoder", "1", false, Gauge,
        extremes(metric_with("hw.gpu.utilization", GPU_TASK, "decoder"), true),
        dcgm("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", Percent),
        "nvmlDeviceGetDecoderUtilization"),
    row(F::Temperature, "temperature_celsius", "Cel", false, Gauge,
        extremes(metric("hw.temperature"), false),
        dcgm("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", Whole),
        "nvmlDeviceGetTemperature (GPU sensor)"),
    row(F::Power, "power_watts", "W", false, Gauge,
        extremes(metric("hw.power"), false),
        dcgm("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", Float),
        "nvmlDeviceGetPowerUsage"),
    row(F::PowerLimit, "power_limit_watts", "W", false, Last,
        metric("nvidia.gpu.power.limit"), None,
        "nvmlDeviceGetEnforcedPowerLimit"),
    row(F::Energy, "energy_joules", "J", false, LifetimeCounter,
        metric("hw.energy"),
        dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
             "Total energy consumption since gpulse first saw the GPU (in mJ).", Millijoules),
        "nvmlDeviceGetTotalEnergyConsumption"),
    row(F::SmClock, "sm_clock_mhz", "MHz", true, Gauge,
        metric_with("nvidia.gpu.clock", CLOCK_TYPE, "sm"),
        dcgm("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", Whole),
        "nvmlDeviceGetClockInfo(SM)"),
    row(F::MemoryClock, "memory_clock_mhz", "MHz", true, Gauge,
        metric_with("nvidia.gpu.clock", CLOCK_TYPE, "memory"),
        dcgm("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", Whole),
        "nvmlDeviceGetClockInfo(MEM)"),
    row(F::GraphicsClock, "graphics_clock_mhz", "MHz", true, Gauge,
        metric_with("nvidia.gpu.clock", CLOCK_TYPE, "graphics"), None,
        "nvmlDeviceGetClockInfo(GRAPHICS)"),
    row(F::FanSpeed, "fan_speed", "1", false, Gauge,
        metric("nvidia.gpu.fan.speed"), None,
        "nvmlDeviceGetFanSpeed_v2, mean over the fans"),
    row(F::PcieTx, "pcie_tx_bytes_per_second", "By/s", false, IntegratedRate,
        metric_with("hw.gpu.io", DIRECTION, "transmit"), None,
        "nvmlDeviceGetPcieThroughput(TX), KB/s"),
    row(F::PcieRx, "pcie_rx_bytes_per_second", "By/s", false, IntegratedRate,
        metric_with("hw.gpu.io", DIRECTION, "receive"), None,
        "nvmlDeviceGetPcieThroughput(RX), KB/s"),
    row(F::EccCorrected, "ecc_corrected_total", "{error}", true, LifetimeCounter,
        metric_with("hw.errors", ERROR_TYPE, "corrected"), None,
        "nvmlDeviceGetTotalEccErrors(corrected, aggregate)"),
    row(F::EccUncorrected, "ecc_uncorrected_total", "{error}", true, LifetimeCounter,
        metric_with("hw.errors", ERROR_TYPE, "uncorrected"), None,
        "nvmlDeviceGetTotalEccErrors(uncorrected, aggregate)"),
    row(F::PerformanceState, "performance_state", "1", true, Last,
        metric("nvidia.gpu.performance_state"), None,
        "nvmlDeviceGetPerformanceState"),
    row(F::PcieReplays, "pcie_replays_total", "{error}", true, Last,
        metric_with("hw.errors", ERROR_TYPE, "pcie_replay"), None,
        "nvmlDeviceGetPcieReplayCounter (the driver's total since it loaded)"),
    row(F::PcieLinkGeneration, "pcie_link_generation", "{generation}", true, Last,
        metric("nvidia.gpu.pcie.link.generation"),
        dcgm("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", Whole),
        "nvmlDeviceGetCurrPcieLinkGeneration"),
    row(F::PcieLinkWidth, "pcie_link_width", "{lane}", true, Last,
        metric("nvidia.gpu.pcie.link.width"),
        dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes).", Whole),
        "nvmlDeviceGetCurrPcieLinkWidth"),
];

/// One tick's value of every field of one device; `None` where NVML gave nothing.
#[derive(Clone, Copy, Default, PartialEq)]
pub struct FieldValues([Option<f64>; FIELD_COUNT]);

impl FieldValues {
    pub fn get(&self, field: DeviceField) -> Option<f64> {
        self.0[field as usize]
    }

    pub fn set(&mut self, field: DeviceField, value: Option<f64>) {
        self.0[field as usize] = value;
    }

    /// Every field with its value, in catalogue order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static FieldSpec, Option<f64>)> + '_ {
        DEVICE_FIELDS.iter().zip(self.0.iter().copied())
    }
}

impl fmt::Debug for FieldValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().filter_map(|(s, v)| Some((s.key, v?))))
            .finish()
    }
}

/// Serialises as the report keys, each value whole or fractional as the field is.
impl Serialize for FieldValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        FieldReport::of_values(self).serialize(serializer)
    }
}

/// Every field's value as a JSON report shows it, serialised as a map under the catalogue's
/// keys in catalogue order (`null` where unknown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldReport(pub [ReportValue; FIELD_COUNT]);

impl FieldReport {
    /// One tick's values as NVML gave them.
    pub fn of_values(values: &FieldValues) -> Self {
        Self(std::array::from_fn(|i| {
            ReportValue::sampled(&DEVICE_FIELDS[i], values.0[i])
        }))
    }

    /// The reported value of a field, `None` when unknown.
    pub fn get(&self, field: DeviceField) -> Option<f64> {
        match self.0[field as usize] {
            ReportValue::Whole(v) => Some(v as f64),
            ReportValue::Fraction(v) => Some(v),
            ReportValue::Unknown => None,
        }
    }
}

impl Serialize for FieldReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_keyed(serializer, DEVICE_FIELDS.iter().map(|s| s.key), &self.0)
    }
}

/// Serialises `values` as a map under `keys` (a catalogue's keys, in its order).
pub fn serialize_keyed<S: Serializer, T: Serialize>(
    serializer: S,
    keys: impl Iterator<Item = &'static str>,
    values: &[T],
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(values.len()))?;
    for (key, value) in keys.zip(values) {
        map.serialize_entry(key, value)?;
    }
    map.end()
}

/// A field's value in a JSON report: whole fields as integers, `null` when unknown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReportValue {
    Whole(u64),
    Fraction(f64),
    Unknown,
}

impl ReportValue {
    /// A sampled value: a rate stays fractional; whole quantities are rounded.
    pub fn sampled(spec: &FieldSpec, value: Option<f64>) -> Self {
        match value.filter(|v| v.is_finite()) {
            None => Self::Unknown,
            Some(v) if spec.whole && spec.window != WindowKind::IntegratedRate => {
                Self::Whole(v.round().max(0.0) as u64)
            }
            Some(v) => Self::Fraction(v),
        }
    }
}

impl Serialize for ReportValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::Whole(v) => serializer.serialize_u64(v),
            Self::Fraction(v) => serializer.serialize_f64(v),
            Self::Unknown => serializer.serialize_none(),
        }
    }
}

/// A GPM activity ratio (0–1, NVML reports percent) over the interval between two GPM samples.
/// The discriminant indexes [`GPM_FIELDS`] and the value arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpmField {
    SmActivity,
    SmOccupancy,
    TensorActivity,
    TensorHmmaActivity,
    TensorImmaActivity,
    TensorDfmaActivity,
    DramActivity,
    Fp16Activity,
    Fp32Activity,
    Fp64Activity,
    IntegerActivity,
    GraphicsActivity,
}

/// Number of [`GpmField`]s.
pub const GPM_FIELD_COUNT: usize = GpmField::GraphicsActivity as usize + 1;

/// One row of the GPM field catalogue. A window keeps every GPM field's mean, min and max, and
/// exports them as the metric's mean with its `.max`/`.min` companions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpmFieldSpec {
    pub field: GpmField,
    /// Key in the device and MIG instance objects of the JSON reports.
    pub key: &'static str,
    /// The NVML GPM metric (`NVML_GPM_METRIC_*`) it is computed from.
    pub nvml: GpmMetricId,
    pub metric: FieldMetric,
    /// dcgm-exporter's `DCGM_FI_PROF_*` series for it (the window's mean), if any.
    pub dcgm: Option<DcgmSeries>,
}

impl GpmField {
    /// This field's row of [`GPM_FIELDS`].
    pub fn spec(self) -> &'static GpmFieldSpec {
        &GPM_FIELDS[self as usize]
    }
}

const fn gpm(
    field: GpmField,
    key: &'static str,
    nvml: GpmMetricId,
    metric: Option<FieldMetric>,
    dcgm: Option<DcgmSeries>,
) -> GpmFieldSpec {
    let Some(metric) = extremes(metric, true) else {
        panic!("a GPM field needs a metric");
    };
    GpmFieldSpec {
        field,
        key,
        nvml,
        metric,
        dcgm,
    }
}

const PIPE: &str = "nvidia.gpu.pipe";
const PIPE_ACTIVITY: &str = "nvidia.gpu.pipe.activity";

/// Every GPM field, in [`GpmField`] order (the key order of the JSON reports).
#[rustfmt::skip]
pub static GPM_FIELDS: [GpmFieldSpec; GPM_FIELD_COUNT] = [
    gpm(GpmField::SmActivity, "sm_activity", GpmMetricId::SmUtil,
        metric("nvidia.gpu.sm.activity"),
        dcgm("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned.", Float)),
    gpm(GpmField::SmOccupancy, "sm_occupancy", GpmMetricId::SmOccupancy,
        metric("nvidia.gpu.sm.occupancy"),
        dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident on an SM to the maximum.", Float)),
    gpm(GpmField::TensorActivity, "tensor_activity", GpmMetricId::AnyTensorUtil,
        metric_with(PIPE_ACTIVITY, PIPE, "tensor"),
        dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipes are active.", Float)),
    gpm(GpmField::TensorHmmaActivity, "tensor_hmma_activity", GpmMetricId::HmmaTensorUtil,
        metric_with(PIPE_ACTIVITY, PIPE, "tensor.hmma"), None),
    gpm(GpmField::TensorImmaActivity, "tensor_imma_activity", GpmMetricId::ImmaTensorUtil,
        metric_with(PIPE_ACTIVITY, PIPE, "tensor.imma"), None),
    gpm(GpmField::TensorDfmaActivity, "tensor_dfma_activity", GpmMetricId::DfmaTensorUtil,
        metric_with(PIPE_ACTIVITY, PIPE, "tensor.dfma"), None),
    gpm(GpmField::DramActivity, "dram_activity", GpmMetricId::DramBwUtil,
        metric("nvidia.gpu.dram.activity"),
        dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", Float)),
    gpm(GpmField::Fp16Activity, "fp16_activity", GpmMetricId::Fp16Util,
        metric_with(PIPE_ACTIVITY, PIPE, "fp16"), None),
    gpm(GpmField::Fp32Activity, "fp32_activity", GpmMetricId::Fp32Util,
        metric_with(PIPE_ACTIVITY, PIPE, "fp32"), None),
    gpm(GpmField::Fp64Activity, "fp64_activity", GpmMetricId::Fp64Util,
        metric_with(PIPE_ACTIVITY, PIPE, "fp64"), None),
    gpm(GpmField::IntegerActivity, "integer_activity", GpmMetricId::IntegerUtil,
        metric_with(PIPE_ACTIVITY, PIPE, "integer"), None),
    gpm(GpmField::GraphicsActivity, "graphics_activity", GpmMetricId::GraphicsUtil,
        metric("nvidia.gpu.graphics.activity"),
        dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", Float)),
];

#[cfg(test)]
mod tests {
    use super::*;

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
            let Some(m) = spec.metric else { continue };
            if m.max || m.min {
                assert_eq!(spec.window, WindowKind::Gauge, "{}", spec.key);
            }
            assert!(
                !seen.contains(&(m.name, m.attribute)),
                "{} repeats {}",
                spec.key,
                m.name
            );
            seen.push((m.name, m.attribute));
        }
    }

    #[test]
    fn gpm_rows_are_in_field_order_each_with_its_own_nvml_metric() {
        for (i, spec) in GPM_FIELDS.iter().enumerate() {
            assert_eq!(spec.field as usize, i, "{} is out of place", spec.key);
            assert!(spec.metric.max && spec.metric.min, "{}", spec.key);
        }
        for (i, a) in GPM_FIELDS.iter().enumerate() {
            for b in &GPM_FIELDS[i + 1..] {
                assert_ne!(a.nvml, b.nvml, "{} and {}", a.key, b.key);
                assert_ne!(a.key, b.key);
                assert_ne!(
                    (a.metric.name, a.metric.attribute),
                    (b.metric.name, b.metric.attribute)
                );
            }
        }
    }

    #[test]
    fn values_serialise_under_their_keys_whole_or_fractional() {
        let mut v = FieldValues::default();
        v.set(DeviceField::MemoryUsed, Some(1024.0));
        v.set(DeviceField::Power, Some(212.5));
        v.set(DeviceField::PcieTx, Some(1536.5));
        let json = serde_json::to_value(v).unwrap();
        assert_eq!(json["memory_used_bytes"], serde_json::json!(1024));
        assert!(json["memory_used_bytes"].is_u64());
        assert_eq!(json["power_watts"], 212.5);
        assert_eq!(json["pcie_tx_bytes_per_second"], 1536.5);
        assert!(json["temperature_celsius"].is_null());
        assert_eq!(json.as_object().unwrap().len(), FIELD_COUNT);
    }
}
