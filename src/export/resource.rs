//! OTLP resources: who the exported data is about.
//!
//! Owns the node's identity (`NodeIdentity`, resolved from `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` with the specification's precedence) and the two resource builders
//! every request shares: the node resource (gpulse itself, carrying the device metrics) and one
//! resource per GPU process, named as the process's own SDK names itself so that its GPU metrics
//! land next to its traces. Also the instrumentation scope and the small `KeyValue` helpers the
//! metric and log builders use, so the attribute encoding lives in one place.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::attribution::sent_identity::{JOB_ID, LOCAL_RANK, RANK, WORLD_SIZE};
use crate::attribution::{AttributionMethod, Workload};
use crate::schema::attribute_keys::{
    HOST_NAME, K8S_NODE_NAME, SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION,
};
use crate::schema::attributes::AttributeId as A;

/// gpulse's version: `service.version` and `telemetry.sdk.version` of the node resource, and
/// the instrumentation scope's version.
pub const GPULSE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Instrumentation scope name of everything gpulse emits.
pub const SCOPE_NAME: &str = "gpulse";

/// This machine's host name, as an SDK's host detector reports it (`gethostname`), or
/// `unknown` when the call fails.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The identity of the node gpulse runs on, and of gpulse itself: the node resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub host_name: String,
    /// `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else `gpulse`.
    pub service_name: String,
    pub service_instance_id: String,
    pub service_version: String,
    /// `OTEL_RESOURCE_ATTRIBUTES` (less the keys resolved into the fields above) and
    /// `k8s.node.name` when known. They never override the fields above.
    pub extra_attributes: Vec<(String, String)>,
}

impl NodeIdentity {
    /// The node identity from the resolved configuration (`service_name` and the
    /// `OTEL_RESOURCE_ATTRIBUTES` pairs, already merged with the config file by `config`) and what
    /// gpulse detected. A `host.name`, `service.instance.id`, `service.version` or
    /// `k8s.node.name` among the attributes is the user's explicit word and wins over the
    /// detected value; every other attribute is kept, in order, later duplicates winning.
    pub fn resolve(
        service_name: String,
        resource_attributes: &[(String, String)],
        host_name: String,
        service_instance_id: String,
        k8s_node_name: Option<String>,
    ) -> NodeIdentity {
        let mut identity = NodeIdentity {
            host_name,
            service_name,
            service_instance_id,
            service_version: GPULSE_VERSION.to_string(),
            extra_attributes: Vec::with_capacity(resource_attributes.len() + 1),
        };
        let mut node_name = k8s_node_name;
        for (key, value) in resource_attributes {
            let value = value.clone();
            match key.as_str() {
                // `config` resolved it into `service_name` already, with its precedence.
                SERVICE_NAME => {}
                HOST_NAME => identity.host_name = value,
                SERVICE_INSTANCE_ID => identity.service_instance_id = value,
                SERVICE_VERSION => identity.service_version = value,
                K8S_NODE_NAME => node_name = Some(value),
                _ => upsert_pair(&mut identity.extra_attributes, key.clone(), value),
            }
        }
        if let Some(name) = node_name {
            upsert_pair(
                &mut identity.extra_attributes,
                A::K8sNodeName.key().to_string(),
                name,
            );
        }
        identity
    }

    /// `k8s.node.name` when known (kept among the extra attributes).
    pub fn k8s_node_name(&self) -> Option<&str> {
        self.extra_attributes
            .iter()
            .find(|(k, _)| k == A::K8sNodeName.key())
            .map(|(_, v)| v.as_str())
    }
}

fn upsert_pair(pairs: &mut Vec<(String, String)>, key: String, value: String) {
    match pairs.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => pairs.push((key, value)),
    }
}

/// A string attribute.
pub fn kv_str(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    }
}

/// An integer attribute.
pub fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        key_strindex: 0,
    }
}

/// A boolean attribute.
pub fn kv_bool(key: &str, value: bool) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::BoolValue(value)),
        }),
        key_strindex: 0,
    }
}

/// An attribute list in which a key appears once: setting a key already present replaces its
/// value in place, which is how the precedence rules below are written.
struct AttributeSet(Vec<KeyValue>);

impl AttributeSet {
    fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    fn set(&mut self, kv: KeyValue) {
        match self.0.iter_mut().find(|existing| existing.key == kv.key) {
            Some(existing) => *existing = kv,
            None => self.0.push(kv),
        }
    }

    /// Adds `kv` only when the key is not there yet.
    fn add_if_absent(&mut self, kv: KeyValue) {
        if !self.0.iter().any(|existing| existing.key == kv.key) {
            self.0.push(kv);
        }
    }

    fn into_resource(self) -> Resource {
        Resource {
            attributes: self.0,
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        }
    }
}

/// The node resource: gpulse itself on this host. Device metrics and node-level findings go here.
///
/// `service.*`, `host.name` and `telemetry.sdk.*` come from the identity fields; the extra
/// attributes are added after them and never replace them.
pub fn node_resource(node: &NodeIdentity) -> Resource {
    let mut attrs = AttributeSet::with_capacity(7 + node.extra_attributes.len());
    attrs.set(kv_str(A::ServiceName.key(), node.service_name.as_str()));
    attrs.set(kv_str(
        A::ServiceInstanceId.key(),
        node.service_instance_id.as_str(),
    ));
    attrs.set(kv_str(
        A::ServiceVersion.key(),
        node.service_version.as_str(),
    ));
    attrs.set(kv_str(A::HostName.key(), node.host_name.as_str()));
    attrs.set(kv_str(A::TelemetrySdkName.key(), "gpulse"));
    attrs.set(kv_str(A::TelemetrySdkLanguage.key(), "rust"));
    attrs.set(kv_str(A::TelemetrySdkVersion.key(), GPULSE_VERSION));
    for (key, value) in &node.extra_attributes {
        attrs.add_if_absent(kv_str(key, value.as_str()));
    }
    attrs.into_resource()
}

/// The value of `gpulse.attribution.method`.
pub fn attribution_method_name(method: AttributionMethod) -> &'static str {
    match method {
        AttributionMethod::HostPid => "host_pid",
        AttributionMethod::DeviceFile => "device_file",
        AttributionMethod::Unresolved => "unresolved",
    }
}

/// The resource of one GPU process, in three layers, each overriding the one before:
///
/// 1. `service.name` = `Workload::effective_service_name` (what the process's telemetry says,
///    else its environment's, else the specification's `unknown_service:<executable>`);
/// 2. the process's own resource attributes (its `OTEL_RESOURCE_ATTRIBUTES`, with what its
///    telemetry says of `service.namespace`, `service.version`, `deployment.environment.name`
///    over them, so they match its traces; its `service.name` entry is already folded into
///    step 1), then its place in a distributed job as integers (`pytorch.distributed.rank`,
///    `.local_rank`, `.world_size`, and `.job.id` beside a rank), from its telemetry or its
///    launcher's variables;
/// 3. the identity gpulse observed, which always wins: `process.*`, `container.*`, `k8s.*`,
///    `host.name` (and `k8s.node.name` when the node knows it), `gpulse.attribution.method`,
///    `gpulse.identity.source` (where steps 1 and 2 came from), and the job (`gpulse.job.id`,
///    `gpulse.job.id.source`) when one is known.
///
/// The join key with the application's own telemetry: `container.id` + `process.vpid` here
/// equals `container.id` + `process.pid` there.
pub fn process_resource(workload: &Workload, node: &NodeIdentity) -> Resource {
    let mut attrs = AttributeSet::with_capacity(16 + workload.resource_attributes.len());
    attrs.set(kv_str(
        A::ServiceName.key(),
        workload.effective_service_name(),
    ));
    for (key, value) in &workload.resource_attributes {
        if key != A::ServiceName.key() {
            attrs.set(kv_str(key, value.as_str()));
        }
    }
    if let Some(rank) = workload.rank {
        attrs.set(kv_int(RANK, i64::from(rank.rank)));
        attrs.set(kv_int(WORLD_SIZE, i64::from(rank.world_size)));
        if let Some(local_rank) = rank.local_rank {
            attrs.set(kv_int(LOCAL_RANK, i64::from(local_rank)));
        }
        if let Some(job_id) = &workload.job_id {
            attrs.set(kv_str(JOB_ID, job_id.as_str()));
        }
    }
    attrs.set(kv_int(A::ProcessPid.key(), i64::from(workload.pid)));
    // Identifies the process with its PID (the conventions' `process` entity): a reused PID
    // starts later.
    let creation_time = workload
        .creation_time
        .map(|t| humantime::format_rfc3339_millis(t).to_string());
    let optional_strings = [
        (A::ProcessCreationTime.key(), &creation_time),
        (A::ProcessExecutableName.key(), &workload.executable_name),
        (A::ProcessOwner.key(), &workload.owner),
        (A::ProcessCommandLine.key(), &workload.command_line),
        (A::ContainerId.key(), &workload.container_id),
        (A::ContainerRuntime.key(), &workload.container_runtime),
        (A::K8sPodUid.key(), &workload.pod_uid),
        (A::K8sPodName.key(), &workload.pod_name),
        (A::K8sNamespaceName.key(), &workload.namespace_name),
        (A::K8sContainerName.key(), &workload.container_name),
        (A::GpulseJobId.key(), &workload.job_id),
    ];
    if let Some(vpid) = workload.vpid {
        attrs.set(kv_int(A::ProcessVpid.key(), i64::from(vpid)));
    }
    for (key, value) in optional_strings {
        if let Some(value) = value {
            attrs.set(kv_str(key, value.as_str()));
        }
    }
    attrs.set(kv_str(A::HostName.key(), node.host_name.as_str()));
    if let Some(node_name) = node.k8s_node_name() {
        attrs.set(kv_str(A::K8sNodeName.key(), node_name));
    }
    attrs.set(kv_str(
        A::GpulseAttributionMethod.key(),
        attribution_method_name(workload.attributed_by),
    ));
    attrs.set(kv_str(
        A::GpulseIdentitySource.key(),
        workload.identity_source.as_str(),
    ));
    if let Some(source) = workload.job_id_source {
        attrs.set(kv_str(A::GpulseJobIdSource.key(), source.as_str()));
    }
    attrs.into_resource()
}

/// The instrumentation scope of every metric and log record gpulse emits.
pub fn gpulse_scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE_NAME.to_string(),
        version: GPULSE_VERSION.to_string(),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn attr<'a>(resource: &'a Resource, key: &str) -> Option<&'a any_value::Value> {
        resource
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn attr_str<'a>(resource: &'a Resource, key: &str) -> Option<&'a str> {
        match attr(resource, key) {
            Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
            _ => None,
        }
    }

    #[test]
    fn resource_attributes_override_detected_identity_fields() {
        let id = NodeIdentity::resolve(
            "svc".into(),
            &pairs(&[
                ("host.name", "override"),
                ("service.instance.id", "i-9"),
                ("service.version", "7"),
                ("k8s.node.name", "n2"),
                ("team", "ml"),
                ("service.name", "resolved-by-config-already"),
            ]),
            "detected".into(),
            "inst-1".into(),
            Some("n1".into()),
        );
        assert_eq!(id.service_name, "svc");
        assert_eq!(id.host_name, "override");
        assert_eq!(id.service_instance_id, "i-9");
        assert_eq!(id.service_version, "7");
        assert_eq!(id.k8s_node_name(), Some("n2"));
        assert_eq!(
            id.extra_attributes,
            vec![
                ("team".to_string(), "ml".to_string()),
                ("k8s.node.name".to_string(), "n2".to_string())
            ]
        );
    }

    #[test]
    fn detected_k8s_node_name_is_kept_when_not_overridden() {
        let id = NodeIdentity::resolve("s".into(), &[], "h".into(), "i".into(), Some("n1".into()));
        assert_eq!(id.k8s_node_name(), Some("n1"));
        assert_eq!(id.service_version, GPULSE_VERSION);
    }

    #[test]
    fn node_resource_identity_fields_win_over_extras() {
        let r = node_resource(&node());
        assert_eq!(attr_str(&r, "service.name"), Some("gpulse"));
        assert_eq!(attr_str(&r, "host.name"), Some("node-a"));
        assert_eq!(attr_str(&r, "service.instance.id"), Some("inst-1"));
        assert_eq!(attr_str(&r, "telemetry.sdk.name"), Some("gpulse"));
        assert_eq!(attr_str(&r, "telemetry.sdk.language"), Some("rust"));
        assert_eq!(attr_str(&r, "telemetry.sdk.version"), Some(GPULSE_VERSION));
        assert_eq!(attr_str(&r, "deployment.environment.name"), Some("prod"));
        let keys: Vec<&str> = r.attributes.iter().map(|kv| kv.key.as_str()).collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(keys.len(), unique.len(), "duplicate keys in {keys:?}");
    }

    fn node() -> NodeIdentity {
        NodeIdentity {
            host_name: "node-a".into(),
            service_name: "gpulse".into(),
            service_instance_id: "inst-1".into(),
            service_version: "0.1.0".into(),
            extra_attributes: vec![
                ("service.name".into(), "must-not-win".into()),
                ("host.name".into(), "must-not-win".into()),
                ("deployment.environment.name".into(), "prod".into()),
                ("k8s.node.name".into(), "kn-1".into()),
            ],
        }
    }

    fn workload() -> Workload {
        Workload {
            pid: 4242,
            vpid: Some(7),
            creation_time: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_123_450)),
            executable_name: Some("python3".into()),
            owner: Some("alice".into()),
            command_line: None,
            container_id: Some("c0ffee".into()),
            container_runtime: Some("containerd".into()),
            pod_uid: Some("pod-uid-1".into()),
            pod_name: Some("trainer-0".into()),
            namespace_name: Some("ml".into()),
            container_name: Some("trainer".into()),
            service_name: Some("trainer".into()),
            identity_source: crate::attribution::IdentitySource::Telemetry,
            resource_attributes: vec![
                ("service.name".into(), "ignored-here".into()),
                ("pytorch.distributed.rank".into(), "9".into()),
                ("service.namespace".into(), "research".into()),
                ("process.pid".into(), "1".into()),
                ("container.id".into(), "spoofed".into()),
                ("host.name".into(), "spoofed".into()),
                ("gpulse.job.id".into(), "spoofed".into()),
            ],
            job_id: Some("run-7".into()),
            job_id_source: Some(crate::attribution::JobIdSource::TorchElastic),
            rank: Some(crate::attribution::EnvRank {
                rank: 3,
                world_size: 4,
                local_rank: None,
            }),
            attributed_by: AttributionMethod::HostPid,
        }
    }

    #[test]
    fn process_resource_layers_identity_over_the_apps_own_attributes() {
        let r = process_resource(&workload(), &node());
        assert_eq!(attr_str(&r, "service.name"), Some("trainer"));
        assert_eq!(attr_str(&r, "service.namespace"), Some("research"));
        assert_eq!(
            attr(&r, "process.pid"),
            Some(&any_value::Value::IntValue(4242))
        );
        assert_eq!(
            attr(&r, "process.vpid"),
            Some(&any_value::Value::IntValue(7))
        );
        assert_eq!(
            attr_str(&r, "process.creation.time"),
            Some("2023-11-14T22:15:23.450Z")
        );
        assert_eq!(attr_str(&r, "container.id"), Some("c0ffee"));
        assert_eq!(attr_str(&r, "container.runtime.name"), Some("containerd"));
        assert_eq!(attr_str(&r, "host.name"), Some("node-a"));
        assert_eq!(attr_str(&r, "k8s.pod.uid"), Some("pod-uid-1"));
        assert_eq!(attr_str(&r, "k8s.pod.name"), Some("trainer-0"));
        assert_eq!(attr_str(&r, "k8s.namespace.name"), Some("ml"));
        assert_eq!(attr_str(&r, "k8s.container.name"), Some("trainer"));
        assert_eq!(attr_str(&r, "k8s.node.name"), Some("kn-1"));
        assert_eq!(attr_str(&r, "process.executable.name"), Some("python3"));
        assert_eq!(attr_str(&r, "process.owner"), Some("alice"));
        assert_eq!(attr_str(&r, "gpulse.attribution.method"), Some("host_pid"));
        assert_eq!(attr_str(&r, "gpulse.job.id"), Some("run-7"));
        assert_eq!(attr_str(&r, "gpulse.job.id.source"), Some("torchelastic"));
        assert_eq!(attr_str(&r, "gpulse.identity.source"), Some("telemetry"));
        // The rank as an integer, over a text one among the process's own attributes.
        assert_eq!(attr(&r, RANK), Some(&any_value::Value::IntValue(3)));
        assert_eq!(attr(&r, WORLD_SIZE), Some(&any_value::Value::IntValue(4)));
        assert_eq!(attr(&r, LOCAL_RANK), None);
        assert_eq!(attr_str(&r, JOB_ID), Some("run-7"));
        assert_eq!(
            attr(&r, "process.command_line"),
            None,
            "only when asked for"
        );
        let pid_count = r
            .attributes
            .iter()
            .filter(|kv| kv.key == "process.pid")
            .count();
        assert_eq!(pid_count, 1);
    }

    #[test]
    fn unresolved_process_gets_the_default_service_name_and_pid_only() {
        let r = process_resource(&Workload::unresolved(9), &node());
        assert_eq!(attr_str(&r, "service.name"), Some("unknown_service"));
        assert_eq!(
            attr(&r, "process.pid"),
            Some(&any_value::Value::IntValue(9))
        );
        assert_eq!(attr(&r, "process.vpid"), None);
        assert_eq!(attr(&r, "container.id"), None);
        assert_eq!(attr(&r, "gpulse.job.id"), None);
        assert_eq!(attr(&r, RANK), None);
        assert_eq!(attr_str(&r, "gpulse.identity.source"), Some("default"));
        assert_eq!(
            attr_str(&r, "gpulse.attribution.method"),
            Some("unresolved")
        );
    }

    #[test]
    fn attribution_method_names() {
        let cases = [
            (AttributionMethod::HostPid, "host_pid"),
            (AttributionMethod::DeviceFile, "device_file"),
            (AttributionMethod::Unresolved, "unresolved"),
        ];
        for (method, name) in cases {
            assert_eq!(attribution_method_name(method), name);
        }
    }
}
