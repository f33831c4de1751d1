//! Kubernetes names for GPU processes, from the kubelet pod-resources API: the gRPC client
//! (`v1.PodResourcesLister/List` over the kubelet's Unix socket), the device → container index
//! built from its answer, and the directory that keeps that index fresh without ever making the
//! sampler wait.
//!
//! The kubelet lists, for every pod and container, the device ids the device plugins assigned;
//! the NVIDIA plugin uses GPU (or MIG) UUIDs, the same strings NVML reports. The API carries no
//! pod UID, so a process is matched by device only:
//!
//! - a process is given a container's names only when exactly one container holds the devices
//!   it uses (all of them, when it uses several); two containers sharing a GPU (time-slicing,
//!   whose ids look like `GPU-<uuid>::<n>` and are folded onto the UUID) make it ambiguous and
//!   nothing is attached;
//! - the caller then keeps it consistent with the cgroup: names are attached only to processes
//!   whose cgroup puts them in a pod (or whose cgroup could not be read), and two processes
//!   with different `k8s.pod.uid`s never get the same pod, nor one UID two pods (see
//!   `Attributor`).
//!
//! When the socket is missing or the call fails, one line is logged at the change (not per
//! refresh), the last good list is kept, and refreshes go on at their normal pace.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint, Uri};

/// The code generated from `proto/kubelet/podresources/v1/api.proto` (client and server; the
/// server is what tests serve the client from).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("v1");
}

use proto::pod_resources_lister_client::PodResourcesListerClient;

/// Where the kubelet serves the pod-resources API.
pub const DEFAULT_KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet caps its answers at 16 MiB (`podresources.DefaultMaxMsgSize`); tonic's default
/// 4 MiB would reject a busy node's list.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Fewest seconds between two `List` calls, however many new PIDs ask for one.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(5);
/// A refresh happens at least this often, so a pod that replaced another on the same GPU is
/// seen even when no new PID appears.
pub const MAX_REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// Why the kubelet's pod list could not be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PodResourcesError {
    /// Nothing at the socket path: not a Kubernetes node, or the directory is not mounted.
    #[error(
        "kubelet pod-resources socket {} does not exist; k8s.pod.name, k8s.namespace.name and \
         k8s.container.name will be missing. On Kubernetes, mount the host's \
         /var/lib/kubelet/pod-resources into the gpulse container (read-only is not enough for \
         a Unix socket: mount the directory) or set the socket path",
        path.display()
    )]
    SocketMissing { path: PathBuf },
    /// The socket path could not even be looked at (a directory on the way is not ours).
    #[error(
        "cannot look at the kubelet pod-resources socket {}: {source}; gpulse needs search \
         permission on its directory (run as root, or mount the directory readable)",
        path.display()
    )]
    Inaccessible {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The socket exists but the connection failed.
    #[error(
        "cannot connect to the kubelet pod-resources socket {}: {source}; gpulse needs \
         permission to open it (it is root-owned, mode 0660 on most distributions)",
        path.display()
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet answered the `List` call with an error.
    #[error(
        "kubelet pod-resources List on {} failed: {status}; check the kubelet's log \
         (the KubeletPodResources API is enabled by default since Kubernetes 1.15)",
        path.display()
    )]
    Rpc {
        path: PathBuf,
        #[source]
        status: Box<tonic::Status>,
    },
}

/// One container's devices of one resource, flattened from the kubelet's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainerDevices {
    pub pod_name: String,
    pub namespace: String,
    pub container_name: String,
    /// e.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`.
    pub resource_name: String,
    /// For NVIDIA resources, GPU or MIG UUIDs (possibly with a `::<n>` time-slicing replica).
    pub device_ids: Vec<String>,
}

/// Flattens a `List` answer: one entry per container and resource that has device ids.
pub fn flatten(response: proto::ListPodResourcesResponse) -> Vec<PodContainerDevices> {
    let mut flat = Vec::new();
    for pod in response.pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                if devices.device_ids.is_empty() {
                    continue;
                }
                flat.push(PodContainerDevices {
                    pod_name: pod.name.clone(),
                    namespace: pod.namespace.clone(),
                    container_name: container.name.clone(),
                    resource_name: devices.resource_name,
                    device_ids: devices.device_ids,
                });
            }
        }
    }
    flat
}

/// A connected client of the kubelet pod-resources API.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    path: PathBuf,
    inner: PodResourcesListerClient<Channel>,
}

impl PodResourcesClient {
    /// Connects to the kubelet over the Unix socket at `path`.
    ///
    /// # Errors
    /// `SocketMissing` when nothing is at `path`, `Inaccessible` when its directory cannot be
    /// searched, `Connect` when it cannot be opened.
    pub async fn connect(path: impl Into<PathBuf>) -> Result<Self, PodResourcesError> {
        let path = path.into();
        match tokio::fs::try_exists(&path).await {
            Ok(true) => {}
            Ok(false) => return Err(PodResourcesError::SocketMissing { path }),
            Err(source) => return Err(PodResourcesError::Inaccessible { path, source }),
        }
        let socket = path.clone();
        // The URI is required by the API but unused: the connector ignores it and opens the
        // socket; `:authority` becomes "localhost", which the kubelet accepts.
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move { UnixStream::connect(socket).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|source| PodResourcesError::Connect {
                path: path.clone(),
                source,
            })?;
        let inner =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self { path, inner })
    }

    /// Lists every pod's containers and their devices.
    ///
    /// # Errors
    /// `Rpc` when the kubelet answers with an error (or the call times out).
    pub async fn list(&mut self) -> Result<Vec<PodContainerDevices>, PodResourcesError> {
        let response = self
            .inner
            .list(proto::ListPodResourcesRequest {})
            .await
            .map_err(|status| PodResourcesError::Rpc {
                path: self.path.clone(),
                status: Box::new(status),
            })?;
        Ok(flatten(response.into_inner()))
    }
}

/// The Kubernetes names of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PodContainer {
    pub namespace: String,
    pub pod_name: String,
    pub container_name: String,
}

/// The outcome of matching a process's devices against the pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceMatch {
    /// No container holds these devices.
    None,
    /// Exactly one container holds all of them.
    Unique(Arc<PodContainer>),
    /// Several containers could be the one.
    Ambiguous,
}

/// Device id → the containers it is assigned to.
#[derive(Debug, Default)]
pub struct PodIndex {
    by_device: HashMap<String, Vec<Arc<PodContainer>>>,
}

impl PodIndex {
    pub fn new(containers: &[PodContainerDevices]) -> Self {
        let mut sets: HashMap<String, BTreeSet<Arc<PodContainer>>> = HashMap::new();
        for entry in containers {
            let container = Arc::new(PodContainer {
                namespace: entry.namespace.clone(),
                pod_name: entry.pod_name.clone(),
                container_name: entry.container_name.clone(),
            });
            for id in &entry.device_ids {
                sets.entry(device_key(id).to_string())
                    .or_default()
                    .insert(Arc::clone(&container));
            }
        }
        Self {
            by_device: sets
                .into_iter()
                .map(|(id, set)| (id, set.into_iter().collect()))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }

    /// Containers assigned the device with this UUID.
    pub(crate) fn containers_for(&self, uuid: &str) -> &[Arc<PodContainer>] {
        self.by_device.get(uuid).map_or(&[], Vec::as_slice)
    }

    /// The one container holding every device in `uuids` (see the module documentation).
    pub(crate) fn match_devices<'a>(
        &self,
        uuids: impl IntoIterator<Item = &'a str>,
    ) -> DeviceMatch {
        let mut candidates: Option<BTreeSet<&Arc<PodContainer>>> = None;
        for uuid in uuids {
            let holders: BTreeSet<&Arc<PodContainer>> = self.containers_for(uuid).iter().collect();
            if holders.is_empty() {
                // A device no pod holds: the process is not (only) a pod's.
                return DeviceMatch::None;
            }
            candidates = Some(match candidates {
                None => holders,
                Some(previous) => previous.intersection(&holders).copied().collect(),
            });
        }
        match candidates {
            Some(set) if set.len() == 1 => set
                .into_iter()
                .next()
                .map_or(DeviceMatch::None, |c| DeviceMatch::Unique(Arc::clone(c))),
            Some(set) if set.len() > 1 => DeviceMatch::Ambiguous,
            _ => DeviceMatch::None,
        }
    }
}

/// Time-slicing replicas (`GPU-<uuid>::3`) stand for the GPU itself.
fn device_key(id: &str) -> &str {
    id.split_once("::").map_or(id, |(uuid, _)| uuid)
}

/// What the last refresh attempt found, to log changes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Unknown,
    Ok,
    Missing,
    Failing,
}

/// The current pod index for one socket, replaced whole by each successful refresh.
#[derive(Debug)]
pub struct PodDirectory {
    socket: PathBuf,
    index: RwLock<Arc<PodIndex>>,
    health: Mutex<Health>,
}

impl PodDirectory {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            index: RwLock::new(Arc::new(PodIndex::default())),
            health: Mutex::new(Health::Unknown),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The index as of the last successful refresh (empty before the first).
    pub fn current(&self) -> Arc<PodIndex> {
        Arc::clone(&self.index.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Lists the kubelet's pods now and replaces the index. Logs when the outcome changes from
    /// the previous attempt's; on failure the previous index stays.
    ///
    /// # Errors
    /// Whatever connecting or listing failed with; the caller need not log it again.
    pub async fn refresh(&self) -> Result<usize, PodResourcesError> {
        let result = match PodResourcesClient::connect(&self.socket).await {
            Ok(mut client) => client.list().await,
            Err(error) => Err(error),
        };
        let health = match &result {
            Ok(_) => Health::Ok,
            Err(PodResourcesError::SocketMissing { .. }) => Health::Missing,
            Err(_) => Health::Failing,
        };
        let previous = {
            let mut current = self.health.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *current, health)
        };
        match &result {
            Ok(containers) => {
                let index = PodIndex::new(containers);
                if previous != Health::Ok {
                    tracing::info!(
                        socket = %self.socket.display(),
                        containers_with_devices = containers.len(),
                        "kubelet pod-resources API reachable; attaching k8s pod, namespace and container names"
                    );
                }
                *self.index.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(index);
            }
            Err(error) if previous != health => match health {
                Health::Missing => tracing::info!("{error}"),
                _ => tracing::warn!("{error}; will retry"),
            },
            Err(_) => {}
        }
        result.map(|containers| containers.len())
    }
}

/// Asks the background refresher for a refresh; dropping it stops the refresher.
#[derive(Debug, Clone)]
pub(crate) struct RefreshHandle {
    requests: mpsc::Sender<()>,
}

impl RefreshHandle {
    /// Requests a refresh without waiting; one already pending absorbs this one.
    pub(crate) fn request(&self) {
        let _ = self.requests.try_send(());
    }
}

/// Starts the refresher on `runtime`: one refresh at once, then on request (at most every
/// `MIN_REFRESH_INTERVAL`) and at least every `MAX_REFRESH_INTERVAL`.
pub(crate) fn spawn_refresher(
    directory: Arc<PodDirectory>,
    runtime: &tokio::runtime::Handle,
) -> RefreshHandle {
    let (requests, mut pending) = mpsc::channel::<()>(1);
    runtime.spawn(async move {
        loop {
            let _ = directory.refresh().await;
            let refreshed_at = tokio::time::Instant::now();
            tokio::select! {
                request = pending.recv() => {
                    if request.is_none() {
                        break;
                    }
                }
                _ = tokio::time::sleep(MAX_REFRESH_INTERVAL) => {}
            }
            tokio::time::sleep_until(refreshed_at + MIN_REFRESH_INTERVAL).await;
            match pending.try_recv() {
                Ok(()) | Err(mpsc::error::TryRecvError::Empty) => {}
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
    });
    RefreshHandle { requests }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ns: &str, pod: &str, container: &str, ids: &[&str]) -> PodContainerDevices {
        PodContainerDevices {
            pod_name: pod.into(),
            namespace: ns.into(),
            container_name: container.into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn unique(ns: &str, pod: &str, container: &str) -> DeviceMatch {
        DeviceMatch::Unique(Arc::new(PodContainer {
            namespace: ns.into(),
            pod_name: pod.into(),
            container_name: container.into(),
        }))
    }

    #[test]
    fn matching_rules() {
        let index = PodIndex::new(&[
            entry("ml", "train-0", "trainer", &["GPU-a", "GPU-b"]),
            entry("ml", "infer-0", "server", &["GPU-c"]),
            entry("ml", "shared-0", "x", &["GPU-d::0"]),
            entry("ml", "shared-1", "y", &["GPU-d::1"]),
            // Listed twice (two resources): still one container.
            entry("ml", "infer-0", "server", &["GPU-c"]),
        ]);
        assert_eq!(
            index.match_devices(["GPU-a"]),
            unique("ml", "train-0", "trainer")
        );
        assert_eq!(
            index.match_devices(["GPU-a", "GPU-b"]),
            unique("ml", "train-0", "trainer")
        );
        assert_eq!(
            index.match_devices(["GPU-c"]),
            unique("ml", "infer-0", "server")
        );
        assert_eq!(index.match_devices(["GPU-d"]), DeviceMatch::Ambiguous);
        assert_eq!(index.match_devices(["GPU-zz"]), DeviceMatch::None);
        // Uses a pod's GPU and one no pod holds: not that pod's alone.
        assert_eq!(index.match_devices(["GPU-a", "GPU-zz"]), DeviceMatch::None);
        // Two GPUs of two different containers: no container holds both.
        assert_eq!(index.match_devices(["GPU-a", "GPU-c"]), DeviceMatch::None);
        assert_eq!(index.match_devices([]), DeviceMatch::None);
    }

    #[test]
    fn flatten_skips_containers_without_devices() {
        use proto::*;
        let response = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "n".into(),
                containers: vec![
                    ContainerResources {
                        name: "gpu".into(),
                        devices: vec![ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-1".into()],
                            topology: None,
                        }],
                        ..Default::default()
                    },
                    ContainerResources {
                        name: "sidecar".into(),
                        ..Default::default()
                    },
                ],
            }],
        };
        assert_eq!(flatten(response), vec![entry("n", "p", "gpu", &["GPU-1"])]);
    }

    #[tokio::test]
    async fn missing_socket_is_a_typed_error_and_keeps_the_index() {
        let dir = tempfile::tempdir().expect("temp dir");
        let directory = PodDirectory::new(dir.path().join("kubelet.sock"));
        let error = directory.refresh().await.expect_err("no socket");
        assert!(matches!(error, PodResourcesError::SocketMissing { .. }));
        assert!(error.to_string().contains("mount"), "{error}");
        assert!(directory.current().is_empty());
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_fails_to_connect() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubelet.sock");
        std::fs::write(&path, b"").expect("write");
        let error = PodResourcesClient::connect(&path)
            .await
            .expect_err("a regular file is no socket");
        assert!(
            matches!(error, PodResourcesError::Connect { .. }),
            "{error:?}"
        );
    }
}
