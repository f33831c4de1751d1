//! What each signal of gpulse's registry carries: the attributes of every metric (beyond its
//! resource section's device identity), of the findings' log records and of gpulse's two
//! entities, each with how required it is. [`metric_attributes`] is an exhaustive match, so a
//! new metric does not build until it says (and, where an attribute is enumerated, which of its
//! values); the registry ([`super::registry`]) writes these out, and docs/metrics.md's attribute
//! column is rendered from them ([`super::docs`]).

use super::attributes::{rec, req, when, AttributeId as A, Uses};
use super::metrics::MetricId;

const ON_MIG: &str = "on a MIG instance";
const READABLE: &str = "when the process's /proc entry is readable";
const ANALYSED: &str = "when the window was analysed (`run`, `record`, `top`, `snapshot --window`)";
const STRAGGLER_WAIT: &str = "on `gpulse.gpu.cause` = `straggler_wait` points";
const IN_A_JOB: &str = "when the process is a rank of a torch.distributed job";

/// The engines of `hw.gpu.task`: the SM (`general`), the video encoder and decoder.
const GPU_TASKS: &[&str] = &["general", "encoder", "decoder"];
const DIRECTIONS: &[&str] = &["transmit", "receive"];
/// The clock event reasons' names (nvml-wrapper's `ThrottleReasons` flags, in lower snake
/// case, as `throttle_reasons` makes them) and `other` for a bit this build does not know.
const THROTTLE_REASONS: &[&str] = &[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
    "other",
];
/// The performance policies of `nvmlDeviceGetViolationStatus`.
const PERFORMANCE_POLICIES: &[&str] = &[
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "total_app_clocks",
    "total_base_clocks",
];

/// The identity every device point carries (a GPU, or a MIG instance with its parent).
pub const DEVICE_IDENTITY: [Uses; 12] = [
    req(A::HwId),
    rec(A::HwName),
    req(A::HwType),
    rec(A::HwVendor),
    rec(A::HwModel),
    rec(A::HwDriverVersion),
    rec(A::HwSerialNumber),
    rec(A::GpuIndex),
    rec(A::GpuPciAddress),
    when(A::HwParent, ON_MIG),
    when(A::NvidiaMigGpuInstanceId, ON_MIG),
    when(A::NvidiaMigComputeInstanceId, ON_MIG),
];

/// The device every process point is about.
pub const PROCESS_DEVICE: [Uses; 5] = [
    req(A::HwId),
    rec(A::GpuIndex),
    when(A::HwParent, ON_MIG),
    when(A::NvidiaMigGpuInstanceId, ON_MIG),
    when(A::NvidiaMigComputeInstanceId, ON_MIG),
];

/// The attributes of a metric beyond its resource section's identity ([`DEVICE_IDENTITY`],
/// [`PROCESS_DEVICE`]). A `.max`/`.min` companion carries what the metric it accompanies does.
pub fn metric_attributes(id: MetricId) -> &'static [Uses] {
    use MetricId as M;
    match id {
        M::GpuUtilization | M::GpuUtilizationMax | M::GpuUtilizationMin => {
            const { &[req(A::HwGpuTask).values(GPU_TASKS)] }
        }
        M::Temperature | M::TemperatureMax => &[],
        M::Clock => const { &[req(A::NvidiaClockType)] },
        M::GpuIo => const { &[req(A::NetworkIoDirection).values(DIRECTIONS)] },
        M::Throttle => const { &[req(A::NvidiaThrottleReason).values(THROTTLE_REASONS)] },
        M::ThrottleTime => const { &[req(A::NvidiaThrottleReason).values(PERFORMANCE_POLICIES)] },
        M::Errors => {
            const {
                &[
                    req(A::ErrorType).values(&[
                        "corrected",
                        "uncorrected",
                        "xid",
                        "pcie_replay",
                        "nvlink_crc",
                        "nvlink_replay",
                        "nvlink_recovery",
                    ]),
                    when(
                        A::NvidiaXid,
                        "on `error.type` = `xid` points, once an XID was seen",
                    ),
                    when(
                        A::NvidiaXidClass,
                        "on `error.type` = `xid` points whose XID is in gpulse's copy of the Xid catalog",
                    ),
                    when(
                        A::NvidiaXidAction,
                        "on `error.type` = `xid` points whose XID is in gpulse's copy of the Xid catalog",
                    ),
                    when(
                        A::NvidiaXidFatal,
                        "on `error.type` = `xid` points whose XID is in gpulse's copy of the Xid catalog",
                    ),
                    when(A::NvidiaNvLinkLink, "on `error.type` = `nvlink_*` points"),
                ]
            }
        }
        M::Status => const { &[req(A::HwState).values(&["ok", "failed"])] },
        M::PipeActivity | M::PipeActivityMax | M::PipeActivityMin => {
            const { &[req(A::NvidiaPipe)] }
        }
        M::RemappedRows => const { &[req(A::NvidiaRemapType)] },
        M::NvLinkIo => {
            const {
                &[
                    req(A::NvidiaNvLinkLink),
                    req(A::NetworkIoDirection).values(DIRECTIONS),
                ]
            }
        }
        M::NvLinkState => const { &[req(A::NvidiaNvLinkLink)] },
        M::GpuEnergyAttribution => const { &[req(A::GpulseEnergyAttribution)] },
        M::ProcessGpuUtilization | M::ProcessGpuUtilizationMax | M::ProcessGpuUtilizationMin => {
            const { &[req(A::HwGpuTask).values(GPU_TASKS)] }
        }
        // A process alone on its MIG instance takes the instance's tensor activity only.
        M::ProcessGpuPipeActivity | M::ProcessGpuPipeActivityMax | M::ProcessGpuPipeActivityMin => {
            const { &[req(A::NvidiaPipe).values(&["tensor"])] }
        }
        M::ProcessGpuTime => {
            const {
                &[
                    req(A::GpulseGpuTimeState),
                    when(A::GpulseGpuCause, ANALYSED),
                    when(A::GpulseStragglerRank, STRAGGLER_WAIT),
                ]
            }
        }
        M::ProcessGpuEnergy => {
            const {
                &[
                    when(A::GpulseGpuCause, ANALYSED),
                    when(A::GpulseStragglerRank, STRAGGLER_WAIT),
                ]
            }
        }
        M::TrainingStepDuration | M::TrainingStepCollectiveWait | M::TrainingStepDataWait => {
            const {
                &[
                    when(A::PytorchJobId, IN_A_JOB),
                    when(A::PytorchRank, IN_A_JOB),
                ]
            }
        }
        M::GpuMemoryUtilization
        | M::GpuMemoryUtilizationMax
        | M::GpuMemoryUtilizationMin
        | M::GpuMemoryUsage
        | M::GpuMemoryLimit
        | M::GpuMemoryFree
        | M::GpuMemoryReserved
        | M::Bar1MemoryUsage
        | M::Bar1MemoryLimit
        | M::Bar1MemoryFree
        | M::MemoryTemperature
        | M::MemoryTemperatureMax
        | M::Power
        | M::PowerMax
        | M::PowerLimit
        | M::Energy
        | M::FanSpeed
        | M::PerformanceState
        | M::PcieLinkGeneration
        | M::PcieLinkWidth
        | M::SmActivity
        | M::SmActivityMax
        | M::SmActivityMin
        | M::SmOccupancy
        | M::SmOccupancyMax
        | M::SmOccupancyMin
        | M::DramActivity
        | M::DramActivityMax
        | M::DramActivityMin
        | M::GraphicsActivity
        | M::GraphicsActivityMax
        | M::GraphicsActivityMin
        | M::RemapPending
        | M::RemapFailed
        | M::ProcessGpuMemoryUsage
        | M::ProcessGpuMemoryUtilization
        | M::ProcessGpuMemoryUtilizationMax
        | M::ProcessGpuMemoryUtilizationMin
        | M::ProcessGpuSmActivity
        | M::ProcessGpuSmActivityMax
        | M::ProcessGpuSmActivityMin
        | M::ProcessGpuDramActivity
        | M::ProcessGpuDramActivityMax
        | M::ProcessGpuDramActivityMin
        | M::ProcessCpuUtilization
        | M::ProcessTreeCpuUtilization
        | M::ProcessMemoryUsage => &[],
    }
}

/// The attributes of a finding's log record.
pub const FINDING_ATTRIBUTES: [Uses; 20] = [
    req(A::DiagnosisRule),
    req(A::DiagnosisState),
    req(A::DiagnosisSeverity),
    req(A::DiagnosisSubject),
    req(A::DiagnosisSince),
    when(A::DiagnosisAdvice, "unless the finding cleared"),
    rec(A::DiagnosisEvidence),
    when(A::DiagnosisCause, "when the rule tells causes apart"),
    rec(A::DiagnosisValue),
    when(
        A::HwId,
        "when the finding is about a device or a process on one",
    ),
    when(A::HwParent, "when the process is on a MIG instance"),
    when(
        A::GpuIndex,
        "when the finding is about a device or a process on one",
    ),
    when(
        A::NvidiaMigGpuInstanceId,
        "when the process is on a MIG instance",
    ),
    when(
        A::NvidiaMigComputeInstanceId,
        "when the process is on a MIG instance",
    ),
    when(A::NvidiaMigProfile, "when the process is on a MIG instance"),
    when(A::ProcessPid, "when the finding is about a process"),
    rec(A::ProcessVpid),
    when(A::DiagnosisJob, "when the finding is about a job"),
    when(A::DiagnosisPids, "when the finding is about a job"),
    when(A::HwIds, "when the finding is about a job"),
];

/// Further attributes of a finding's log record: where it is, which training job, and the stack
/// of the process it names.
pub const FINDING_PLACE: [Uses; 5] = [
    rec(A::ContainerId),
    rec(A::K8sPodUid),
    when(
        A::PytorchJobId,
        "when the finding is about a torch.distributed job",
    ),
    when(A::PytorchRank, "when the finding names a rank"),
    when(
        A::CodeStacktrace,
        "when the finding names a process that sent its stack",
    ),
];

/// The attributes of a finding's evidence record (`gpulse.diagnosis.evidence`): which finding it
/// belongs to, and the stack.
pub const EVIDENCE_ATTRIBUTES: [Uses; 5] = [
    req(A::DiagnosisRule),
    req(A::DiagnosisSubject),
    req(A::CodeStacktrace),
    when(
        A::PytorchRank,
        "when the process is a rank of a torch.distributed job",
    ),
    when(
        A::PytorchJobId,
        "when the process is a rank of a torch.distributed job",
    ),
];

/// gpulse's entity on every process resource, beside the conventions' `process`, `container`,
/// `k8s.*` and `service` entities: how the process was found, and its job.
pub const GPU_PROCESS_ENTITY: [Uses; 11] = [
    req(A::ProcessPid),
    when(A::ProcessCreationTime, READABLE),
    when(A::ProcessVpid, READABLE),
    req(A::GpulseAttributionMethod),
    req(A::GpulseIdentitySource),
    when(A::GpulseJobId, "when the process's job is known"),
    when(A::GpulseJobIdSource, "when `gpulse.job.id` is set"),
    when(A::PytorchJobId, IN_A_JOB),
    when(A::PytorchRank, IN_A_JOB),
    when(A::PytorchLocalRank, "when the process's launcher gives it"),
    when(A::PytorchWorldSize, IN_A_JOB),
];

/// gpulse's entity on the node resource: the agent watching the node's GPUs.
pub const NODE_ENTITY: [Uses; 7] = [
    req(A::ServiceName),
    req(A::ServiceInstanceId),
    rec(A::ServiceVersion),
    rec(A::HostName),
    req(A::TelemetrySdkName),
    req(A::TelemetrySdkLanguage),
    req(A::TelemetrySdkVersion),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{throttle_reasons, DEVICE_FIELDS, GPM_FIELDS, METRICS, MIG_PROCESS_GPM};

    /// The values a metric says it gives an enumerated attribute of gpulse's are members of it.
    #[test]
    fn listed_values_are_members() {
        for spec in &METRICS {
            for uses in metric_attributes(spec.id) {
                let members = uses.attribute.spec().members;
                for value in uses.values {
                    assert!(
                        members.is_empty() || members.iter().any(|m| m.value == *value),
                        "{}: {} = {value} is not a member of its row",
                        spec.name,
                        uses.attribute.key()
                    );
                }
            }
        }
    }

    /// Every value a field row puts on a metric (and its companions) is one the metric's
    /// attributes list, so docs/metrics.md, rendered from them, names every value exported.
    #[test]
    fn field_rows_give_listed_values() {
        let rows = DEVICE_FIELDS
            .iter()
            .map(|f| f.metric)
            .chain(GPM_FIELDS.iter().map(|f| f.metric))
            .chain(MIG_PROCESS_GPM.iter().map(|(_, m)| *m));
        for row in rows {
            let Some((key, value)) = row.attribute else {
                continue;
            };
            for id in [Some(row.id), row.max, row.min].into_iter().flatten() {
                let uses = metric_attributes(id)
                    .iter()
                    .find(|u| u.attribute.key() == key)
                    .unwrap_or_else(|| panic!("{id:?} carries {key}, which it does not list"));
                assert!(
                    uses.given_values().contains(&value),
                    "{id:?}: {key} = {value} is not among {:?}",
                    uses.given_values()
                );
            }
        }
    }

    #[test]
    fn throttle_reasons_are_nvml_wrappers_and_other() {
        let names: Vec<&str> = throttle_reasons().iter().map(|(_, name)| *name).collect();
        assert_eq!(THROTTLE_REASONS[..names.len()], names[..]);
        assert_eq!(THROTTLE_REASONS[names.len()..], ["other"]);
    }
}
