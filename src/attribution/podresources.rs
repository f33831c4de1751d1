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
//! Devices allocated through Dynamic Resource Allocation (DRA) are listed under each container's
//! `dynamic_resources` instead: a claim's driver, pool and device name, and CDI ids. Only NVIDIA's
//! GPU driver (`gpu.nvidia.com`) is read. Its kubelet plugin names a whole GPU `gpu-<minor>` and a
//! MIG device `gpu-<parent minor>-mig-<profile>-<profile id>-<placement start>`, where `<minor>`
//! is NVML's minor number (`/dev/nvidia<minor>`) and `<profile>` the MIG profile with its dots
//! removed (`1g.10gb` → `1g10gb`); its CDI ids (`k8s.gpu.nvidia.com/claim=<claim uid>-<device
//! name>`) carry no UUID, so the device name is what is matched. A MIG device is matched by its
//! parent's minor and its profile: NVML gives gpulse no placement start, so two MIG devices of
//! one profile on one GPU held by two containers are ambiguous, like a shared GPU.
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

/// The name NVIDIA's DRA driver registers its GPUs (and MIG devices) under.
pub const DRA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// How the kubelet says a container got its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// A device plugin's resource (`devices`); the ids are GPU or MIG UUIDs.
    DevicePlugin,
    /// A DRA claim (`dynamic_resources`); the ids are the driver's device names.
    Dra {
        claim_namespace: String,
        claim_name: String,
        /// The resource pool, the node's name for NVIDIA's driver.
        pool_name: String,
    },
}

/// One container's devices of one resource (or one DRA claim), flattened from the kubelet's
/// answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainerDevices {
    pub pod_name: String,
    pub namespace: String,
    pub container_name: String,
    /// e.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`; for DRA the driver, `gpu.nvidia.com`.
    pub resource_name: String,
    /// For NVIDIA resources, GPU or MIG UUIDs (possibly with a `::<n>` time-slicing replica);
    /// for DRA, device names such as `gpu-0` or `gpu-0-mig-1g10gb-19-0`.
    pub device_ids: Vec<String>,
    pub allocation: Allocation,
}

/// Flattens a `List` answer: one entry per container and resource that has device ids, and one
/// per container and DRA claim with devices of NVIDIA's GPU driver (other drivers' devices are
/// no GPUs gpulse watches).
pub fn flatten(response: proto::ListPodResourcesResponse) -> Vec<PodContainerDevices> {
    let mut flat = Vec::new();
    for pod in response.pod_resources {
        for container in pod.containers {
            for claim in container.dynamic_resources {
                let mut by_pool: Vec<(String, Vec<String>)> = Vec::new();
                for resource in claim.claim_resources {
                    if resource.driver_name != DRA_GPU_DRIVER || resource.device_name.is_empty() {
                        continue;
                    }
                    match by_pool
                        .iter_mut()
                        .find(|(pool, _)| *pool == resource.pool_name)
                    {
                        Some((_, names)) => names.push(resource.device_name),
                        None => by_pool.push((resource.pool_name, vec![resource.device_name])),
                    }
                }
                for (pool_name, device_ids) in by_pool {
                    flat.push(PodContainerDevices {
                        pod_name: pod.name.clone(),
                        namespace: pod.namespace.clone(),
                        container_name: container.name.clone(),
                        resource_name: DRA_GPU_DRIVER.to_string(),
                        device_ids,
                        allocation: Allocation::Dra {
                            claim_namespace: claim.claim_namespace.clone(),
                            claim_name: claim.claim_name.clone(),
                            pool_name,
                        },
                    });
                }
            }
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
                    allocation: Allocation::DevicePlugin,
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
                let key = match entry.allocation {
                    Allocation::DevicePlugin => device_key(id).to_string(),
                    Allocation::Dra { .. } => match dra_key(id) {
                        Some(key) => key,
                        None => {
                            tracing::debug!(
                                device = %id,
                                "a gpu.nvidia.com DRA device name that is neither gpu-<minor> nor \
                                 gpu-<minor>-mig-…; its container gets no pod names from it"
                            );
                            continue;
                        }
                    },
                };
                sets.entry(key).or_default().insert(Arc::clone(&container));
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
        self.match_device_keys(uuids.into_iter().map(std::iter::once))
    }

    /// [`Self::match_devices`] where each device the process uses has several keys (its UUID,
    /// its MIG device's UUID, its DRA name: see [`DeviceKeys`]); a device is held by whichever
    /// container holds any of its keys.
    pub(crate) fn match_device_keys<'a, K>(
        &self,
        devices: impl IntoIterator<Item = K>,
    ) -> DeviceMatch
    where
        K: IntoIterator<Item = &'a str>,
    {
        let mut candidates: Option<BTreeSet<&Arc<PodContainer>>> = None;
        for keys in devices {
            let holders: BTreeSet<&Arc<PodContainer>> = keys
                .into_iter()
                .flat_map(|key| self.containers_for(key))
                .collect();
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

/// The index key of a DRA device name of NVIDIA's driver: `gpu-<minor>` stays as it is;
/// `gpu-<minor>-mig-<profile>-<profile id>-<placement start>` loses the two numbers gpulse
/// cannot see in NVML's answers. `None` for any other form.
fn dra_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix("gpu-")?;
    let (minor, mig) = match rest.split_once("-mig-") {
        Some((minor, mig)) => (minor, Some(mig)),
        None => (rest, None),
    };
    let minor: u32 = minor.parse().ok()?;
    match mig {
        None => Some(dra_gpu_key(minor)),
        Some(mig) => {
            let (profile_and_id, start) = mig.rsplit_once('-')?;
            let (profile, id) = profile_and_id.rsplit_once('-')?;
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            (numeric(start) && numeric(id) && !profile.is_empty())
                .then(|| format!("{DRA_GPU_DRIVER}/gpu-{minor}-mig-{profile}"))
        }
    }
}

/// Keys are prefixed with the driver so that they never meet a device plugin's UUID.
fn dra_gpu_key(minor: u32) -> String {
    format!("{DRA_GPU_DRIVER}/gpu-{minor}")
}

/// The DRA key of a MIG device on the GPU with minor number `parent_minor`: the profile as the
/// driver writes it into device names (lower case, dots removed, anything outside `[a-z0-9-]`
/// made a dash, dashes trimmed).
fn dra_mig_key(parent_minor: u32, profile: &str) -> String {
    let profile: String = profile
        .to_ascii_lowercase()
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "{DRA_GPU_DRIVER}/gpu-{parent_minor}-mig-{}",
        profile.trim_matches('-')
    )
}

/// Every name one device a process uses may be listed under: its GPU UUID, its MIG device's
/// UUID, and the DRA name the GPU or MIG device has when its minor number is known.
pub(crate) struct DeviceKeys<'a> {
    pub uuid: &'a str,
    pub mig_uuid: Option<&'a str>,
    dra: Option<String>,
}

impl<'a> DeviceKeys<'a> {
    /// `mig_profile` is the profile of the MIG device the process runs in (e.g. `1g.10gb`).
    pub(crate) fn new(uuid: &'a str, minor: Option<u32>, mig: Option<(&'a str, &'a str)>) -> Self {
        let dra = minor.and_then(|minor| match mig {
            // A MIG device whose profile is unknown has no DRA name to match.
            Some((_, "")) => None,
            Some((_, profile)) => Some(dra_mig_key(minor, profile)),
            None => Some(dra_gpu_key(minor)),
        });
        Self {
            uuid,
            mig_uuid: mig.map(|(uuid, _)| uuid),
            dra,
        }
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.uuid)
            .chain(self.mig_uuid)
            .chain(self.dra.as_deref())
    }
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
            allocation: Allocation::DevicePlugin,
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

    #[test]
    fn dra_names_of_nvidias_driver() {
        assert_eq!(dra_key("gpu-0").as_deref(), Some("gpu.nvidia.com/gpu-0"));
        assert_eq!(dra_key("gpu-12").as_deref(), Some("gpu.nvidia.com/gpu-12"));
        assert_eq!(
            dra_key("gpu-3-mig-1g10gb-19-6").as_deref(),
            Some("gpu.nvidia.com/gpu-3-mig-1g10gb")
        );
        // Profile names with a dash (media extensions) keep it.
        assert_eq!(
            dra_key("gpu-0-mig-1g10gb-me-20-0").as_deref(),
            Some("gpu.nvidia.com/gpu-0-mig-1g10gb-me")
        );
        for bad in [
            "gpu-",
            "gpu-x",
            "GPU-0",
            "gpu-0-mig-",
            "gpu-0-mig-1g10gb-19",
            "gpu-0-counter-set",
            "nic-0",
        ] {
            assert_eq!(dra_key(bad), None, "{bad}");
        }
        // The process side writes the same names from NVML's facts.
        assert_eq!(dra_mig_key(3, "1g.10gb"), "gpu.nvidia.com/gpu-3-mig-1g10gb");
        assert_eq!(
            dra_mig_key(0, "1g.10gb+me"),
            "gpu.nvidia.com/gpu-0-mig-1g10gb-me"
        );
        let keys = DeviceKeys::new("GPU-p", Some(3), Some(("MIG-m", "1g.10gb")));
        assert_eq!(
            keys.keys().collect::<Vec<_>>(),
            ["GPU-p", "MIG-m", "gpu.nvidia.com/gpu-3-mig-1g10gb"]
        );
        let unknown_profile = DeviceKeys::new("GPU-p", Some(3), Some(("MIG-m", "")));
        assert_eq!(
            unknown_profile.keys().collect::<Vec<_>>(),
            ["GPU-p", "MIG-m"]
        );
        let no_minor = DeviceKeys::new("GPU-p", None, None);
        assert_eq!(no_minor.keys().collect::<Vec<_>>(), ["GPU-p"]);
    }

    #[test]
    fn flatten_reads_dra_claims_of_the_gpu_driver_only() {
        use proto::*;
        let claim = |driver: &str, device: &str| ClaimResource {
            cdi_devices: vec![CdiDevice {
                name: format!("k8s.gpu.nvidia.com/claim=0b1c-{device}"),
            }],
            driver_name: driver.into(),
            pool_name: "node-a".into(),
            device_name: device.into(),
        };
        let response = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "n".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    dynamic_resources: vec![DynamicResource {
                        claim_name: "gpus".into(),
                        claim_namespace: "n".into(),
                        claim_resources: vec![
                            claim("gpu.nvidia.com", "gpu-0"),
                            claim("nic.example.com", "eth-1"),
                            claim("gpu.nvidia.com", "gpu-1"),
                        ],
                    }],
                    ..Default::default()
                }],
            }],
        };
        let flat = flatten(response);
        assert_eq!(flat.len(), 1, "{flat:?}");
        assert_eq!(flat[0].resource_name, DRA_GPU_DRIVER);
        assert_eq!(flat[0].device_ids, ["gpu-0", "gpu-1"]);
        assert_eq!(
            flat[0].allocation,
            Allocation::Dra {
                claim_namespace: "n".into(),
                claim_name: "gpus".into(),
                pool_name: "node-a".into(),
            }
        );
        let index = PodIndex::new(&flat);
        let gpu1 = DeviceKeys::new("GPU-x", Some(1), None);
        assert_eq!(
            index.match_device_keys([gpu1.keys()]),
            unique("n", "p", "c")
        );
        let gpu2 = DeviceKeys::new("GPU-y", Some(2), None);
        assert_eq!(index.match_device_keys([gpu2.keys()]), DeviceMatch::None);
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
