//! The GPM field table: one row per GPM activity ratio (Hopper and newer). They have a table of
//! their own because they are read together from one GPM sample pair, for a GPU and for each of
//! its MIG instances, and a window keeps the same summary (mean, min, max) of every one,
//! exported as the metric's mean with its `.max`/`.min` companions. Declared like
//! [`DEVICE_FIELDS`](super::DEVICE_FIELDS): enum and rows in one macro, count derived. Beside
//! them, [`MIG_PROCESS_GPM`]: the process metrics a process alone on its MIG instance takes
//! from the instance's GPM fields.

use nvml_wrapper::enums::gpm::GpmMetricId;

use super::dcgm::{gauge as dcgm, DcgmScale, DcgmSeries};
use super::device::{metric, metric_with, FieldMetric};
use super::metrics::MetricId;

/// One row of the GPM field table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpmFieldSpec {
    pub field: GpmField,
    /// Key in the device and MIG instance objects of the JSON reports.
    pub key: &'static str,
    /// The NVML GPM metric (`NVML_GPM_METRIC_*`) it is computed from.
    pub nvml: GpmMetricId,
    /// Its metric, always with both companions.
    pub metric: FieldMetric,
    /// dcgm-exporter's `DCGM_FI_PROF_*` series for it (the window's mean), if any.
    pub dcgm: Option<DcgmSeries>,
}

impl GpmFieldSpec {
    const fn of(self, field: GpmField) -> Self {
        Self { field, ..self }
    }

    /// The `nvml.h` name of its GPM metric (`NVML_GPM_METRIC_SM_UTIL`), from
    /// [`GPM_METRIC_NAMES`].
    pub(crate) fn c_name(&self) -> &'static str {
        gpm_metric_name(self.nvml).unwrap_or_else(|| {
            panic!(
                "{}: {:?} has no row in GPM_METRIC_NAMES",
                self.key, self.nvml
            )
        })
    }
}

/// The `nvml.h` names and numbers (`nvmlGpmMetricId_t`, checked against the NVML 13.3.29
/// header) of the GPM metrics [`GPM_FIELDS`] reads: the docs and docs/schema.json name each
/// row's metric from here, and a test checks each number against nvml-wrapper's binding of
/// the header.
pub const GPM_METRIC_NAMES: [(GpmMetricId, &str, u32); 12] = [
    (
        GpmMetricId::GraphicsUtil,
        "NVML_GPM_METRIC_GRAPHICS_UTIL",
        1,
    ),
    (GpmMetricId::SmUtil, "NVML_GPM_METRIC_SM_UTIL", 2),
    (GpmMetricId::SmOccupancy, "NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    (GpmMetricId::IntegerUtil, "NVML_GPM_METRIC_INTEGER_UTIL", 4),
    (
        GpmMetricId::AnyTensorUtil,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        5,
    ),
    (
        GpmMetricId::DfmaTensorUtil,
        "NVML_GPM_METRIC_DFMA_TENSOR_UTIL",
        6,
    ),
    (
        GpmMetricId::HmmaTensorUtil,
        "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
        7,
    ),
    (
        GpmMetricId::ImmaTensorUtil,
        "NVML_GPM_METRIC_IMMA_TENSOR_UTIL",
        9,
    ),
    (GpmMetricId::DramBwUtil, "NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
    (GpmMetricId::Fp64Util, "NVML_GPM_METRIC_FP64_UTIL", 11),
    (GpmMetricId::Fp32Util, "NVML_GPM_METRIC_FP32_UTIL", 12),
    (GpmMetricId::Fp16Util, "NVML_GPM_METRIC_FP16_UTIL", 13),
];

/// The `nvml.h` name of `id`, if [`GPM_METRIC_NAMES`] has it.
pub fn gpm_metric_name(id: GpmMetricId) -> Option<&'static str> {
    GPM_METRIC_NAMES
        .iter()
        .find(|(m, _, _)| *m == id)
        .map(|(_, name, _)| *name)
}

/// Declares [`GpmField`] and [`GPM_FIELDS`] from one list, so they cannot disagree.
macro_rules! gpm_fields {
    ($( $field:ident => $row:expr, )*) => {
        /// A GPM activity ratio (0–1, NVML reports percent) over the interval between two GPM
        /// samples. The discriminant indexes [`GPM_FIELDS`] and the value arrays.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum GpmField {
            $( $field, )*
        }

        /// Number of [`GpmField`]s.
        pub const GPM_FIELD_COUNT: usize = [$( GpmField::$field ),*].len();

        /// Every GPM field, in [`GpmField`] order (the key order of the JSON reports).
        pub static GPM_FIELDS: [GpmFieldSpec; GPM_FIELD_COUNT] = [$( $row.of(GpmField::$field), )*];
    };
}

/// A row; the metric's companions are `max` and `min`, its field set by [`gpm_fields!`].
const fn gpm(
    key: &'static str,
    nvml: GpmMetricId,
    metric: FieldMetric,
    [max, min]: [MetricId; 2],
    dcgm: Option<DcgmSeries>,
) -> GpmFieldSpec {
    GpmFieldSpec {
        field: GpmField::SmActivity,
        key,
        nvml,
        metric: metric.extremes(max, Some(min)),
        dcgm,
    }
}

use super::attributes::AttributeId;
use DcgmScale::Float;
use GpmMetricId as G;
use MetricId as M;

const PIPE: &str = AttributeId::NvidiaPipe.key();
const PIPE_EXTREMES: [MetricId; 2] = [M::PipeActivityMax, M::PipeActivityMin];

gpm_fields! {
    SmActivity => gpm("sm_activity", G::SmUtil,
        metric(M::SmActivity), [M::SmActivityMax, M::SmActivityMin],
        dcgm("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned.", Float)),
    SmOccupancy => gpm("sm_occupancy", G::SmOccupancy,
        metric(M::SmOccupancy), [M::SmOccupancyMax, M::SmOccupancyMin],
        dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident on an SM to the maximum.", Float)),
    TensorActivity => gpm("tensor_activity", G::AnyTensorUtil,
        metric_with(M::PipeActivity, PIPE, "tensor"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipes are active.", Float)),
    TensorHmmaActivity => gpm("tensor_hmma_activity", G::HmmaTensorUtil,
        metric_with(M::PipeActivity, PIPE, "tensor.hmma"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "Ratio of cycles the HMMA tensor pipe is active.", Float)),
    TensorImmaActivity => gpm("tensor_imma_activity", G::ImmaTensorUtil,
        metric_with(M::PipeActivity, PIPE, "tensor.imma"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "Ratio of cycles the IMMA tensor pipe is active.", Float)),
    TensorDfmaActivity => gpm("tensor_dfma_activity", G::DfmaTensorUtil,
        metric_with(M::PipeActivity, PIPE, "tensor.dfma"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "Ratio of cycles the DFMA tensor pipe is active.", Float)),
    DramActivity => gpm("dram_activity", G::DramBwUtil,
        metric(M::DramActivity), [M::DramActivityMax, M::DramActivityMin],
        dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", Float)),
    Fp16Activity => gpm("fp16_activity", G::Fp16Util,
        metric_with(M::PipeActivity, PIPE, "fp16"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active.", Float)),
    Fp32Activity => gpm("fp32_activity", G::Fp32Util,
        metric_with(M::PipeActivity, PIPE, "fp32"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active.", Float)),
    Fp64Activity => gpm("fp64_activity", G::Fp64Util,
        metric_with(M::PipeActivity, PIPE, "fp64"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active.", Float)),
    IntegerActivity => gpm("integer_activity", G::IntegerUtil,
        metric_with(M::PipeActivity, PIPE, "integer"), PIPE_EXTREMES,
        dcgm("DCGM_FI_PROF_PIPE_INT_ACTIVE", "Ratio of cycles the integer pipe is active.", Float)),
    GraphicsActivity => gpm("graphics_activity", G::GraphicsUtil,
        metric(M::GraphicsActivity), [M::GraphicsActivityMax, M::GraphicsActivityMin],
        dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", Float)),
}

/// The process metric each GPM field feeds for a process alone on its MIG GPU instance, which
/// takes the instance's activity (`nvmlGpmMigSampleGet`) as its own: NVML gives no per-process
/// utilisation on MIG, and the graphics engine's activity stands in for the `general` task
/// (DCGM's advice on MIG: `GR_ENGINE_ACTIVE` in place of GPU-Util). The export builder pushes
/// these, and docs/metrics.md names each metric's source from them.
pub(crate) static MIG_PROCESS_GPM: [(GpmField, FieldMetric); 4] = [
    (
        GpmField::GraphicsActivity,
        metric_with(
            M::ProcessGpuUtilization,
            AttributeId::HwGpuTask.key(),
            "general",
        )
        .extremes(
            M::ProcessGpuUtilizationMax,
            Some(M::ProcessGpuUtilizationMin),
        ),
    ),
    (
        GpmField::SmActivity,
        metric(M::ProcessGpuSmActivity)
            .extremes(M::ProcessGpuSmActivityMax, Some(M::ProcessGpuSmActivityMin)),
    ),
    (
        GpmField::DramActivity,
        metric(M::ProcessGpuDramActivity).extremes(
            M::ProcessGpuDramActivityMax,
            Some(M::ProcessGpuDramActivityMin),
        ),
    ),
    (
        GpmField::TensorActivity,
        metric_with(M::ProcessGpuPipeActivity, PIPE, "tensor").extremes(
            M::ProcessGpuPipeActivityMax,
            Some(M::ProcessGpuPipeActivityMin),
        ),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row's metric has its `nvml.h` name, each name once, its number the binding's.
    #[test]
    fn gpm_metric_names_are_nvml_h_names_and_numbers() {
        for spec in &GPM_FIELDS {
            assert!(
                spec.c_name().starts_with("NVML_GPM_METRIC_"),
                "{}",
                spec.key
            );
        }
        for (i, (id, name, number)) in GPM_METRIC_NAMES.iter().enumerate() {
            assert_eq!(id.as_c(), *number, "{name}");
            for (other, other_name, _) in &GPM_METRIC_NAMES[i + 1..] {
                assert!(id != other && name != other_name, "{name} twice");
            }
        }
    }

    /// Each MIG process row feeds a process metric, with the companions named after it, from
    /// a GPM field of its own.
    #[test]
    fn mig_process_rows_feed_process_metrics_with_their_companions() {
        use super::super::metrics::Section;
        for (i, (field, metric)) in MIG_PROCESS_GPM.iter().enumerate() {
            let spec = metric.id.spec();
            assert_eq!(spec.section, Section::Process, "{}", spec.name);
            for (companion, suffix) in [(metric.max, "max"), (metric.min, "min")] {
                assert_eq!(
                    companion.map(|m| m.spec().name),
                    Some(format!("{}.{suffix}", spec.name).as_str())
                );
            }
            assert!(
                MIG_PROCESS_GPM[i + 1..].iter().all(|(f, _)| f != field),
                "{field:?} twice"
            );
        }
    }

    #[test]
    fn rows_are_in_field_order_each_with_its_own_nvml_metric() {
        for (i, spec) in GPM_FIELDS.iter().enumerate() {
            assert_eq!(spec.field as usize, i, "{} is out of place", spec.key);
            let name = spec.metric.id.spec().name;
            assert_eq!(
                spec.metric.max.map(|m| m.spec().name),
                Some(format!("{name}.max").as_str()),
                "{}",
                spec.key
            );
            assert_eq!(
                spec.metric.min.map(|m| m.spec().name),
                Some(format!("{name}.min").as_str()),
                "{}",
                spec.key
            );
        }
        for (i, a) in GPM_FIELDS.iter().enumerate() {
            for b in &GPM_FIELDS[i + 1..] {
                assert_ne!(a.nvml, b.nvml, "{} and {}", a.key, b.key);
                assert_ne!(a.key, b.key);
                assert_ne!(
                    (a.metric.id, a.metric.attribute),
                    (b.metric.id, b.metric.attribute)
                );
            }
        }
    }
}
