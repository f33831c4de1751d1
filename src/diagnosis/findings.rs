//! What a rule reports: the `Finding` (which rule, how bad, about what, what to do), its
//! `Subject` (a device, one GPU process, or a multi-GPU job) and the key that says when two
//! findings from consecutive windows are the same one.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

pub use super::framework::Layer;

/// The rules gpulse evaluates. The snake_case name is what configuration, log records
/// (`gpulse.diagnosis.rule`) and the `gpulse.diagnosis.active` gauge use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuleId {
    InputBound,
    MemoryPressure,
    MemoryGrowth,
    IdleHolder,
    Throttling,
    HardwareErrors,
    UnevenMultiGpu,
    MemoryFragmentation,
    TensorCoresIdle,
    LowSmEfficiency,
    InterconnectBound,
    RankStraggler,
    CollectiveBound,
    CollectiveStall,
    DistributedHang,
    LongPhaseWait,
    CollectivesUnseen,
}

impl RuleId {
    /// Every rule, in evaluation (and report) order.
    pub(crate) const ALL: [RuleId; 17] = [
        RuleId::InputBound,
        RuleId::MemoryPressure,
        RuleId::MemoryGrowth,
        RuleId::IdleHolder,
        RuleId::Throttling,
        RuleId::HardwareErrors,
        RuleId::UnevenMultiGpu,
        RuleId::MemoryFragmentation,
        RuleId::TensorCoresIdle,
        RuleId::LowSmEfficiency,
        RuleId::InterconnectBound,
        RuleId::RankStraggler,
        RuleId::CollectiveBound,
        RuleId::CollectiveStall,
        RuleId::DistributedHang,
        RuleId::LongPhaseWait,
        RuleId::CollectivesUnseen,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            RuleId::InputBound => "input_bound",
            RuleId::MemoryPressure => "memory_pressure",
            RuleId::MemoryGrowth => "memory_growth",
            RuleId::IdleHolder => "idle_holder",
            RuleId::Throttling => "throttling",
            RuleId::HardwareErrors => "hardware_errors",
            RuleId::UnevenMultiGpu => "uneven_multi_gpu",
            RuleId::MemoryFragmentation => "memory_fragmentation",
            RuleId::TensorCoresIdle => "tensor_cores_idle",
            RuleId::LowSmEfficiency => "low_sm_efficiency",
            RuleId::InterconnectBound => "interconnect_bound",
            RuleId::RankStraggler => "rank_straggler",
            RuleId::CollectiveBound => "collective_bound",
            RuleId::CollectiveStall => "collective_stall",
            RuleId::DistributedHang => "distributed_hang",
            RuleId::LongPhaseWait => "long_phase_wait",
            RuleId::CollectivesUnseen => "collectives_unseen",
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How urgent a finding is. Ordered: `Info < Warning < Error < Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing, nothing is wrong yet (e.g. running at the power cap).
    Info,
    /// The job is slower or wasteful than it could be, or will fail if the trend goes on.
    Warning,
    /// Something is failing now (hardware slowdown, an application-level XID).
    Error,
    /// The device or the job is lost or corrupting data: drain, reset, RMA.
    Critical,
}

impl Severity {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device a finding is about (its `hw.id` and NVML index), and the MIG instance on it when
/// the finding is about one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct DeviceRef {
    pub uuid: String,
    pub index: u32,
    /// The MIG instance the finding was evaluated on (a process's instance on a GPU in MIG
    /// mode); `None` for a whole GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRef>,
}

/// A MIG instance a finding is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct MigRef {
    /// `MIG-…` UUID.
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// e.g. `3g.40gb`.
    pub profile: String,
}

impl DeviceRef {
    /// A whole GPU (for the unit tests' findings).
    #[cfg(test)]
    pub(crate) fn gpu(uuid: impl Into<String>, index: u32) -> Self {
        Self {
            uuid: uuid.into(),
            index,
            mig: None,
        }
    }
}

/// How the processes of a multi-GPU job were grouped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "by", content = "value", rename_all = "snake_case")]
pub enum JobKey {
    /// All processes of one Kubernetes pod (`k8s.pod.uid`).
    PodUid(String),
    /// All processes of one container (`container.id`), outside Kubernetes.
    ContainerId(String),
    /// One process using several GPUs, with neither pod nor container known.
    Pid(u32),
    /// The ranks of one torch.distributed job (`pytorch.distributed.job.id`).
    Distributed(String),
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobKey::PodUid(uid) => write!(f, "pod {uid}"),
            JobKey::ContainerId(id) => write!(f, "container {}", short_id(id)),
            JobKey::Pid(pid) => write!(f, "pid {pid}"),
            JobKey::Distributed(id) => write!(f, "job {id}"),
        }
    }
}

/// What a finding is about.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Subject {
    /// A whole device (throttling, hardware errors, device-wide memory pressure).
    Device(DeviceRef),
    /// One GPU process, on one device when the rule is about that device.
    Workload {
        /// Host PID (`process.pid`): the key the export stage uses to pick the workload resource.
        pid: u32,
        /// `process.vpid`, when attribution knew it.
        vpid: Option<u32>,
        device: Option<DeviceRef>,
        container_id: Option<String>,
        pod_uid: Option<String>,
        /// `service.name` as the OpenTelemetry specification defaults it.
        service_name: String,
    },
    /// The processes of one job spread over several devices.
    Job {
        key: JobKey,
        /// Host PIDs, ascending.
        pids: Vec<u32>,
        /// Devices the job uses, by index.
        devices: Vec<DeviceRef>,
    },
}

impl Subject {
    /// Identity of the subject across windows: two findings of the same rule with the same key
    /// are the same finding continuing. Display fields (service name, vpid) are not part of it.
    pub(crate) fn key(&self) -> String {
        match self {
            Subject::Device(d) => format!("device:{}", d.uuid),
            Subject::Workload { pid, device, .. } => match device {
                Some(d) => format!("workload:{pid}@{}", d.uuid),
                None => format!("workload:{pid}"),
            },
            Subject::Job { key, .. } => match key {
                JobKey::PodUid(uid) => format!("job:pod:{uid}"),
                JobKey::ContainerId(id) => format!("job:container:{id}"),
                JobKey::Pid(pid) => format!("job:pid:{pid}"),
                JobKey::Distributed(id) => format!("job:distributed:{id}"),
            },
        }
    }

    /// The device this subject is about, when there is exactly one.
    pub(crate) fn device(&self) -> Option<&DeviceRef> {
        match self {
            Subject::Device(d) => Some(d),
            Subject::Workload { device, .. } => device.as_ref(),
            Subject::Job { .. } => None,
        }
    }

    /// The host PID, for a workload subject.
    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Subject::Workload { pid, .. } => Some(*pid),
            _ => None,
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Device(d) => write!(f, "GPU {} ({})", d.index, d.uuid),
            Subject::Workload {
                pid,
                device,
                service_name,
                ..
            } => {
                write!(f, "pid {pid} ({service_name})")?;
                if let Some(d) = device {
                    write!(f, " on GPU {}", d.index)?;
                    if let Some(m) = &d.mig {
                        write!(f, " MIG {} (GI {})", m.profile, m.gpu_instance_id)?;
                    }
                }
                Ok(())
            }
            Subject::Job { key, devices, .. } => {
                let list: Vec<String> = devices.iter().map(|d| d.index.to_string()).collect();
                write!(f, "{key} on GPUs {}", list.join(","))
            }
        }
    }
}

/// One measured value that backs a finding; exported as `gpulse.diagnosis.value.<name>`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(i64),
    Float(f64),
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v:.4}"),
            Value::Text(v) => f.write_str(v),
        }
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

/// One problem a rule saw in one window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub rule: RuleId,
    pub severity: Severity,
    pub subject: Subject,
    /// One line for a human: what is wrong, with the numbers.
    pub summary: String,
    /// What to do about it.
    pub advice: String,
    /// The numbers behind the summary, snake_case names with the unit as suffix
    /// (`_ratio`, `_bytes`, `_bytes_per_second`, `_seconds`, `_cores`).
    pub values: Vec<(String, Value)>,
    /// Since when the condition holds, as far as the rule can tell (the start of the window, or
    /// of the history that shows it). The tracker keeps the earliest across windows.
    #[serde(with = "crate::sampling::model::unix_nanos")]
    pub since: SystemTime,
    /// The layers the rule read to reach it (`gpulse.diagnosis.evidence`: `nvml,procfs,spans`).
    pub evidence: Vec<Layer>,
    /// What the rule gathered from processes other than the subject (the waiting ranks' stacks
    /// of a hang): exported once, when the finding starts, as `gpulse.diagnosis.evidence` log
    /// records on those processes' resources, each naming the finding's subject.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<RelatedEvidence>,
}

/// Evidence of a finding from another process than its subject.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelatedEvidence {
    pub pid: u32,
    /// Its rank, when it is a rank of a distributed job.
    pub rank: Option<u32>,
    /// Every thread's Python stack, as the process sent it.
    pub stack: String,
}

impl Finding {
    /// The identity of this finding across windows: rule + subject key.
    pub(crate) fn key(&self) -> FindingKey {
        FindingKey {
            rule: self.rule,
            subject: self.subject.key(),
        }
    }

    /// A value by name (for the unit tests).
    #[cfg(test)]
    pub(crate) fn value(&self, name: &str) -> Option<&Value> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// Rule + subject: what makes two findings the same finding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FindingKey {
    pub rule: RuleId,
    pub subject: String,
}

/// First 12 characters of a container id, as `docker ps` shows it.
pub(crate) fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Bytes as a human reads them in a summary line (GiB/MiB/KiB, binary).
pub(crate) fn human_bytes(bytes: f64) -> String {
    const KIB: f64 = 1024.0;
    const MIB: f64 = KIB * 1024.0;
    const GIB: f64 = MIB * 1024.0;
    let abs = bytes.abs();
    if abs >= GIB {
        format!("{:.1} GiB", bytes / GIB)
    } else if abs >= MIB {
        format!("{:.0} MiB", bytes / MIB)
    } else if abs >= KIB {
        format!("{:.0} KiB", bytes / KIB)
    } else {
        format!("{bytes:.0} B")
    }
}

/// A ratio as a percentage for a summary line.
pub(crate) fn pct(ratio: f64) -> String {
    format!("{:.0}%", ratio * 100.0)
}

/// A duration for a summary line (`12m`, `3h5m`, `2d4h`).
pub(crate) fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_key_ignores_display_fields() {
        let a = Subject::Workload {
            pid: 7,
            vpid: Some(1),
            device: Some(DeviceRef {
                uuid: "GPU-a".into(),
                index: 0,
                mig: None,
            }),
            container_id: None,
            pod_uid: None,
            service_name: "train".into(),
        };
        let mut b = a.clone();
        if let Subject::Workload { service_name, .. } = &mut b {
            *service_name = "other".into();
        }
        assert_eq!(a.key(), b.key());
        assert_eq!(a.key(), "workload:7@GPU-a");
    }

    #[test]
    fn human_formats() {
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
        assert_eq!(human_bytes(300.0 * 1024.0 * 1024.0), "300 MiB");
        assert_eq!(human_duration(3725.0), "1h2m");
        assert_eq!(human_duration(90_000.0), "1d1h");
        assert_eq!(pct(0.123), "12%");
    }

    #[test]
    fn rule_names_are_unique_and_snake_case() {
        let names: std::collections::BTreeSet<&str> =
            RuleId::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), RuleId::ALL.len());
        for r in RuleId::ALL {
            let json = serde_json::to_string(&r).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
        }
    }
}
