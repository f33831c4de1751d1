//! Attribute keys as `&str` constants, for code that must name a key in a `match` pattern
//! (reading a received or configured resource's attributes back): a call such as
//! `AttributeId::ContainerId.key()` cannot be a pattern, a constant can. Each is its
//! [`AttributeId`](super::attributes::AttributeId) row's key, so the key is still written once,
//! in the attribute table.

use super::attributes::AttributeId as A;

/// `container.id`.
pub const CONTAINER_ID: &str = A::ContainerId.key();
/// `host.name`.
pub const HOST_NAME: &str = A::HostName.key();
/// `k8s.node.name`.
pub const K8S_NODE_NAME: &str = A::K8sNodeName.key();
/// `process.pid`.
pub const PROCESS_PID: &str = A::ProcessPid.key();
/// `process.vpid`.
pub const PROCESS_VPID: &str = A::ProcessVpid.key();
/// `service.instance.id`.
pub const SERVICE_INSTANCE_ID: &str = A::ServiceInstanceId.key();
/// `service.name`.
pub const SERVICE_NAME: &str = A::ServiceName.key();
/// `service.version`.
pub const SERVICE_VERSION: &str = A::ServiceVersion.key();
