//! What the Kubernetes Downward API tells gpulse about where it runs: its own pod (so that
//! processes of that pod get its name and namespace, which their cgroups do not carry) and the
//! node (`k8s.node.name` on the node resource). Read through config's environment lookup like
//! every other setting, so tests pass a map instead of changing the process environment.

use super::env::{self, EnvLookup};

/// The `K8S_*` variables a Downward API manifest sets (see deploy/), each `None` when unset or
/// empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownwardApi {
    /// `K8S_POD_UID` (`metadata.uid`).
    pub pod_uid: Option<String>,
    /// `K8S_POD_NAME` (`metadata.name`).
    pub pod_name: Option<String>,
    /// `K8S_POD_NAMESPACE` (`metadata.namespace`).
    pub pod_namespace: Option<String>,
    /// `K8S_NODE_NAME` (`spec.nodeName`).
    pub node_name: Option<String>,
}

impl DownwardApi {
    /// Reads the variables through `lookup`; empty values count as unset.
    pub fn from_env(lookup: EnvLookup<'_>) -> Self {
        let get = |name| env::get(lookup, name).map(|v| v.trim().to_string());
        Self {
            pod_uid: get(env::K8S_POD_UID),
            pod_name: get(env::K8S_POD_NAME),
            pod_namespace: get(env::K8S_POD_NAMESPACE),
            node_name: get(env::K8S_NODE_NAME),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_downward_variables_and_treats_empty_as_unset() {
        let lookup = |name: &str| match name {
            "K8S_POD_UID" => Some("6a1f2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b".to_string()),
            "K8S_POD_NAME" => Some("trainer-0".to_string()),
            "K8S_POD_NAMESPACE" => Some("  ".to_string()),
            "K8S_NODE_NAME" => Some("gpu-node-7".to_string()),
            _ => None,
        };
        assert_eq!(
            DownwardApi::from_env(&lookup),
            DownwardApi {
                pod_uid: Some("6a1f2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b".into()),
                pod_name: Some("trainer-0".into()),
                pod_namespace: None,
                node_name: Some("gpu-node-7".into()),
            }
        );
        assert_eq!(DownwardApi::from_env(&|_| None), DownwardApi::default());
    }
}
