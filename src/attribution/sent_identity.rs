//! What a GPU process says about itself on the resource of the telemetry it sends through
//! gpulse's receiver: its `service.name`, the `service.*` and `deployment.environment.name`
//! attributes of its SDK's resource, and its place in a distributed job (the PyTorch
//! companion's `pytorch.distributed.*`). Attribution adopts it over what the process's
//! environment said ([`super::Workload::adopt_sent_identity`]), so that gpulse's resource for
//! the process names the same service and rank as the process's own traces, however the
//! application named them (in code, in its environment, or by its SDK's detectors).
//!
//! ## Stable once known
//! A process's identity is merged from every resource it sends, each value kept from the first
//! resource that gave one: a process that sends two different resources (two SDKs, a library
//! with a provider of its own) does not make its GPU metrics flap between two services from one
//! window to the next, and a process that stops sending keeps what it said until it exits. An
//! SDK's made-up default (`unknown_service`, `unknown_service:<executable>`) names nothing and is
//! never adopted: the process did not name itself, and gpulse's own default is as good.
//!
//! ## Not adopted
//! `service.instance.id` names one instance of the application's own telemetry: were gpulse's
//! process resource to take it, a backend would see two producers (the SDK and gpulse) write one
//! entity with two different sets of resource attributes, and Prometheus's `target_info` of that
//! `job`/`instance` would get conflicting samples. The join stays `container.id` +
//! `process.vpid` (docs/metrics.md). Identifying attributes gpulse observes itself
//! (`process.*`, `container.*`, `k8s.*`, `host.*`, `hw.*`) are never taken from what a process
//! sends: they are facts gpulse reads, and a process may be wrong about them.

use opentelemetry_semantic_conventions::resource::{
    DEPLOYMENT_ENVIRONMENT_NAME, SERVICE_NAMESPACE, SERVICE_VERSION,
};
use serde::Serialize;

use crate::schema::attributes::AttributeId;

/// The resource attributes that name a process's place in a distributed job, as the PyTorch
/// companion sets them (and as `OTEL_RESOURCE_ATTRIBUTES` may).
pub const RANK: &str = AttributeId::PytorchRank.key();
pub const LOCAL_RANK: &str = AttributeId::PytorchLocalRank.key();
pub const WORLD_SIZE: &str = AttributeId::PytorchWorldSize.key();
pub const BACKEND: &str = AttributeId::PytorchBackend.key();
pub const JOB_ID: &str = AttributeId::PytorchJobId.key();

/// The string attributes of a process's own resource that gpulse's resource for it takes, in
/// the order they are exported. `service.name` is handled apart (it has a default); the rank,
/// local rank, world size and job id are typed fields of the workload.
pub const ADOPTED_ATTRIBUTES: [&str; 4] = [
    SERVICE_NAMESPACE,
    SERVICE_VERSION,
    DEPLOYMENT_ENVIRONMENT_NAME,
    BACKEND,
];

/// The prefix of the `service.name` an SDK makes up when the application named none.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// A process's place in a torch.distributed job, as its own telemetry's resource gives it
/// (the PyTorch companion's `pytorch.distributed.*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DistributedIdentity {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub backend: Option<String>,
    /// Equal on every rank of one job (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, or the rendezvous
    /// address); `None` when the launcher gave none, and then the rank is compared with nobody.
    pub job_id: Option<String>,
}

/// What one process said about itself, merged over the resources it sent (see the module's
/// documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SentIdentity {
    /// `service.name`, unless the SDK made it up.
    pub service_name: Option<String>,
    /// The [`ADOPTED_ATTRIBUTES`] it gave, in that order.
    pub attributes: Vec<(String, String)>,
    pub distributed: Option<DistributedIdentity>,
}

impl SentIdentity {
    /// The identity one resource gives: `service_name` as sent (a made-up default is dropped
    /// here), `attributes` by key (others are ignored; blank values give nothing).
    pub fn from_resource<'a>(
        service_name: Option<&str>,
        attributes: impl IntoIterator<Item = (&'a str, &'a str)>,
        distributed: Option<DistributedIdentity>,
    ) -> Self {
        let service_name = service_name
            .map(str::trim)
            .filter(|name| !name.is_empty() && !name.starts_with(UNKNOWN_SERVICE))
            .map(str::to_string);
        let mut adopted: Vec<(String, String)> = Vec::new();
        for (key, value) in attributes {
            let value = value.trim();
            if ADOPTED_ATTRIBUTES.contains(&key)
                && !value.is_empty()
                && !adopted.iter().any(|(k, _)| k == key)
            {
                adopted.push((key.to_string(), value.to_string()));
            }
        }
        adopted.sort_by_key(|(k, _)| ADOPTED_ATTRIBUTES.iter().position(|a| a == k));
        Self {
            service_name,
            attributes: adopted,
            distributed,
        }
    }

    /// Whether the resource said nothing gpulse adopts.
    pub fn is_empty(&self) -> bool {
        self.service_name.is_none() && self.attributes.is_empty() && self.distributed.is_none()
    }

    /// Fills in what `later` gives that this identity lacks; what is already known stays.
    /// Returns whether anything was added.
    pub fn merge(&mut self, later: SentIdentity) -> bool {
        let mut changed = false;
        if self.service_name.is_none() && later.service_name.is_some() {
            self.service_name = later.service_name;
            changed = true;
        }
        for (key, value) in later.attributes {
            if !self.attributes.iter().any(|(k, _)| *k == key) {
                self.attributes.push((key, value));
                changed = true;
            }
        }
        if changed {
            self.attributes
                .sort_by_key(|(k, _)| ADOPTED_ATTRIBUTES.iter().position(|a| a == k));
        }
        match (&mut self.distributed, later.distributed) {
            (None, Some(later)) => {
                self.distributed = Some(later);
                changed = true;
            }
            (Some(known), Some(later)) if known.rank == later.rank => {
                // The same rank: fill in what the first resource left out.
                let before = known.clone();
                known.local_rank = known.local_rank.or(later.local_rank);
                known.world_size = known.world_size.or(later.world_size);
                known.backend = known.backend.take().or(later.backend);
                known.job_id = known.job_id.take().or(later.job_id);
                changed |= *known != before;
            }
            _ => {}
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, job: Option<&str>) -> DistributedIdentity {
        DistributedIdentity {
            rank,
            world_size: Some(4),
            job_id: job.map(str::to_string),
            ..DistributedIdentity::default()
        }
    }

    #[test]
    fn an_sdks_made_up_name_and_foreign_keys_are_not_taken() {
        for made_up in ["unknown_service", "unknown_service:python3.11", "  "] {
            let sent = SentIdentity::from_resource(Some(made_up), [], None);
            assert_eq!(sent.service_name, None, "{made_up:?}");
            assert!(sent.is_empty());
        }
        let sent = SentIdentity::from_resource(
            Some(" ddp-bar "),
            [
                ("deployment.environment.name", "prod"),
                ("process.pid", "1"),
                ("container.id", "abc"),
                ("service.instance.id", "i-1"),
                ("service.namespace", "ml"),
                ("service.version", ""),
                ("service.namespace", "second"),
            ],
            None,
        );
        assert_eq!(sent.service_name.as_deref(), Some("ddp-bar"));
        assert_eq!(
            sent.attributes,
            vec![
                ("service.namespace".to_string(), "ml".to_string()),
                (
                    "deployment.environment.name".to_string(),
                    "prod".to_string()
                ),
            ],
            "only the adopted keys, in their order, the first of a repeated key, no blanks"
        );
    }

    #[test]
    fn what_is_known_stays_and_only_gaps_are_filled() {
        let mut known = SentIdentity::from_resource(Some("ddp-bar"), [], Some(rank(2, None)));
        let changed = known.merge(SentIdentity::from_resource(
            Some("other-sdk"),
            [("service.version", "1.4")],
            Some(rank(2, Some("run-7"))),
        ));
        assert!(changed);
        assert_eq!(
            known.service_name.as_deref(),
            Some("ddp-bar"),
            "no flapping"
        );
        assert_eq!(
            known.attributes,
            vec![("service.version".into(), "1.4".into())]
        );
        assert_eq!(known.distributed, Some(rank(2, Some("run-7"))));
        // Another rank from the same process is a contradiction: the first stays.
        assert!(!known.merge(SentIdentity::from_resource(None, [], Some(rank(3, None)))));
        assert_eq!(known.distributed.as_ref().map(|d| d.rank), Some(2));
        // The same again changes nothing.
        assert!(!known.merge(known.clone()));
    }
}
