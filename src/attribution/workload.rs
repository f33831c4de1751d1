//! Who a GPU process is: the identity attribution gives a host PID, as OpenTelemetry resource
//! attributes would name it.

use serde::Serialize;

use super::environ::{EnvRank, JobIdSource};
use super::sent_identity::SentIdentity;

/// How a workload was tied to the process NVML listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttributionMethod {
    /// The host PID NVML reported was found under the procfs root.
    HostPid,
    /// The host PID was not visible; a local process holding `/dev/nvidia<minor>` open matched
    /// the device one-to-one.
    DeviceFile,
    /// Nothing could be read: only the PID is known.
    Unresolved,
}

/// The resolved identity of one GPU process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Host PID (`process.pid`).
    pub pid: u32,
    /// PID inside the process's own PID namespace (`process.vpid`): last `NSpid` entry.
    pub vpid: Option<u32>,
    /// When the process started (`process.creation.time`): known when its `stat` was read.
    #[serde(skip)]
    pub creation_time: Option<std::time::SystemTime>,
    /// `process.executable.name`.
    pub executable_name: Option<String>,
    /// `process.owner`: user name, or the numeric uid when it has no name here.
    pub owner: Option<String>,
    /// `process.command_line`, only when the user asked for it (it carries secrets).
    pub command_line: Option<String>,
    /// `container.id`.
    pub container_id: Option<String>,
    /// `container.runtime.name`: docker, containerd, cri-o, podman.
    pub container_runtime: Option<String>,
    /// `k8s.pod.uid`.
    pub pod_uid: Option<String>,
    /// From the kubelet pod-resources API.
    pub pod_name: Option<String>,
    pub namespace_name: Option<String>,
    pub container_name: Option<String>,
    /// The process's own `service.name`: what its telemetry's resource says when gpulse's
    /// receiver hears it, else its `OTEL_SERVICE_NAME` (or `service.name` in its
    /// `OTEL_RESOURCE_ATTRIBUTES`); `None` when nothing named it.
    pub service_name: Option<String>,
    /// Where `service_name`, the adopted attributes and the rank came from.
    pub identity_source: IdentitySource,
    /// The process's own resource attributes: its `OTEL_RESOURCE_ATTRIBUTES`, parsed, in order,
    /// with what its telemetry's resource says of `service.namespace`, `service.version`,
    /// `deployment.environment.name` and `pytorch.distributed.backend` set over them.
    pub resource_attributes: Vec<(String, String)>,
    /// The job the process belongs to (`gpulse.job.id`): the companion's
    /// `pytorch.distributed.job.id`, else the process's environment (`environ` says the order).
    pub job_id: Option<String>,
    /// Where `job_id` came from.
    pub job_id_source: Option<JobIdSource>,
    /// Its rank in the job: what its telemetry's resource says (`pytorch.distributed.*`), else
    /// its environment (`RANK`/`WORLD_SIZE`/`LOCAL_RANK` or SLURM's).
    pub rank: Option<EnvRank>,
    pub attributed_by: AttributionMethod,
}

impl Workload {
    /// A workload about which nothing but the PID is known.
    pub fn unresolved(pid: u32) -> Self {
        Self {
            pid,
            vpid: None,
            creation_time: None,
            executable_name: None,
            owner: None,
            command_line: None,
            container_id: None,
            container_runtime: None,
            pod_uid: None,
            pod_name: None,
            namespace_name: None,
            container_name: None,
            service_name: None,
            identity_source: IdentitySource::Default,
            resource_attributes: Vec::new(),
            job_id: None,
            job_id_source: None,
            rank: None,
            attributed_by: AttributionMethod::Unresolved,
        }
    }

    /// Takes the job id the PyTorch companion reports for this process
    /// (`pytorch.distributed.job.id` on its telemetry's resource): the process says it itself,
    /// so it outranks what its environment suggested. A blank id changes nothing.
    pub fn adopt_companion_job_id(&mut self, job_id: &str) {
        let job_id = job_id.trim();
        if !job_id.is_empty() {
            self.job_id = Some(job_id.to_string());
            self.job_id_source = Some(JobIdSource::Companion);
        }
    }

    /// Takes what the process said about itself through gpulse's receiver, over what its
    /// environment said: its `service.name`, the `service.*`, `deployment.environment.name` and
    /// backend attributes, its rank and its job. What it did not say stays as the environment
    /// gave it; gpulse's own observations (PIDs, container, pod) are not touched.
    pub fn adopt_sent_identity(&mut self, sent: &SentIdentity) {
        if sent.is_empty() {
            return;
        }
        self.identity_source = IdentitySource::Telemetry;
        if let Some(name) = &sent.service_name {
            self.service_name = Some(name.clone());
        }
        for (key, value) in &sent.attributes {
            match self.resource_attributes.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1.clone_from(value),
                None => self.resource_attributes.push((key.clone(), value.clone())),
            }
        }
        let Some(distributed) = &sent.distributed else {
            return;
        };
        if let Some(job_id) = &distributed.job_id {
            self.adopt_companion_job_id(job_id);
        }
        // A rank without a world size keeps the environment's world size; with neither, the
        // workload has no rank (the training evidence still carries the sent one).
        let env = self.rank;
        let world_size = distributed.world_size.or(env.map(|r| r.world_size));
        if let Some(world_size) = world_size {
            self.rank = Some(EnvRank {
                rank: distributed.rank,
                world_size,
                local_rank: distributed.local_rank.or(env.and_then(|r| r.local_rank)),
            });
        }
    }

    /// `service.name` as the OpenTelemetry specification defaults it:
    /// the process's own, else `unknown_service:<executable>`, else `unknown_service`.
    pub fn effective_service_name(&self) -> String {
        match (&self.service_name, &self.executable_name) {
            (Some(name), _) => name.clone(),
            (None, Some(exe)) => format!("unknown_service:{exe}"),
            (None, None) => "unknown_service".to_string(),
        }
    }
}

/// Where a workload's `service.name`, adopted attributes and rank came from, highest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// The resource of the telemetry the process sent through gpulse's receiver.
    Telemetry,
    /// The process's environment (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `RANK`…).
    Environment,
    /// Neither: `service.name` is the specification's `unknown_service:<executable>`.
    #[default]
    Default,
}

impl IdentitySource {
    /// The value of `gpulse.identity.source`.
    pub const fn as_str(self) -> &'static str {
        match self {
            IdentitySource::Telemetry => "telemetry",
            IdentitySource::Environment => "environment",
            IdentitySource::Default => "default",
        }
    }

    /// The source `as_str` names.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Telemetry, Self::Environment, Self::Default]
            .into_iter()
            .find(|source| source.as_str() == name)
    }
}

/// CPU and memory a GPU process (and its descendants) used over one export window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProcessUsage {
    /// `gpulse.process.cpu.utilization`: the process alone, as a ratio of one core.
    pub cpu_utilization: Option<f64>,
    /// The same over the process and its descendants (DataLoader workers), ratio of one core.
    pub tree_cpu_utilization: Option<f64>,
    /// Resident set size (`process.memory.usage`).
    pub memory_rss_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_companion_job_id_outranks_the_environment_and_blank_is_ignored() {
        let mut workload = Workload::unresolved(7);
        workload.job_id = Some("4242".into());
        workload.job_id_source = Some(JobIdSource::Slurm);
        workload.adopt_companion_job_id("  ");
        assert_eq!(workload.job_id.as_deref(), Some("4242"));
        assert_eq!(workload.job_id_source, Some(JobIdSource::Slurm));
        workload.adopt_companion_job_id("run-7");
        assert_eq!(workload.job_id.as_deref(), Some("run-7"));
        assert_eq!(workload.job_id_source, Some(JobIdSource::Companion));
    }
}
