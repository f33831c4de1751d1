//! The `Attributor`: resolves the host PIDs of one window to `Workload`s, caching what procfs
//! said about each process and applying the kubelet's pod names on top.
//!
//! ## Cost of a resolve
//! A PID seen before costs one read of `<root>/<pid>/stat` (about 300 bytes): its start time
//! (field 22) tells whether it is still the same process. Only a new PID, or a reused one, is read
//! in full (`stat`, `status`, the `exe` link, `cgroup`, `environ` when allowed, `cmdline` when
//! asked, `passwd` at most once a minute). Pod names are looked up in the current in-memory
//! index on every resolve, so a refreshed pod list applies at once without re-reading procfs.
//! Entries for PIDs the window no longer reports are dropped: memory is bounded by the number of
//! live GPU processes.
//!
//! ## Degrading
//! Nothing here is an error for the caller. An unreadable procfs root is one warning and
//! `Unresolved` workloads until it is readable again; a process that exits between two reads
//! yields what was read (a process already cached keeps its identity for the window that still
//! reports it); `environ` that is not ours to read is simply absent.
//!
//! ## Pod names
//! Pod-resources has no pod UID, so names are matched by GPU UUID (see `podresources`). To stay
//! consistent with the cgroup: names go only to processes whose cgroup shows a pod UID (or whose
//! cgroup could not be read); and within one resolve, if processes with different pod UIDs
//! would get the same pod, or one pod UID two different pods, those processes get no names.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::devicefile::{match_one_to_one, scan_device_holders, DeviceHolders};
use super::podresources::{
    spawn_refresher, DeviceKeys, DeviceMatch, PodContainer, PodDirectory, RefreshHandle,
};
use super::process_identity::{lookup, workload_of, CacheEntry, Lookup, Passwd};
use super::procfiles::ProcFiles;
use super::settings::AttributionSettings;
use super::usage::{ProcessTable, UsageTracker};
use super::workload::{AttributionMethod, ProcessUsage, Workload};
use crate::fast_map::{FastMap, FastSet, FastState};
use crate::sampling::window::Window;

/// One GPU process on one device, as NVML listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcessRef<'a> {
    /// Host PID.
    pub pid: u32,
    pub device_uuid: &'a str,
    /// `N` of the device's `/dev/nvidiaN`; needed for the device-file fallback and to match
    /// the GPU's DRA name (`gpu-N`).
    pub device_minor: Option<u32>,
    /// The MIG device the process runs in, when NVML named one.
    pub mig: Option<GpuProcessMig<'a>>,
}

/// The MIG device of a [`GpuProcessRef`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcessMig<'a> {
    /// `MIG-…` UUID, what a device plugin with the `mixed` strategy lists.
    pub uuid: &'a str,
    /// e.g. `1g.10gb`, part of the DRA device name.
    pub profile: &'a str,
}

/// Resolves GPU processes to workloads; owns the per-PID cache and the usage tracker.
#[derive(Debug)]
pub struct Attributor {
    settings: AttributionSettings,
    cache: FastMap<u32, CacheEntry>,
    /// Local processes found by the device-file fallback, cached the same way.
    local_cache: FastMap<u32, CacheEntry>,
    generation: u64,
    passwd: Passwd,
    root_unreadable: bool,
    pods: Option<Arc<PodDirectory>>,
    refresher: Option<RefreshHandle>,
    usage: UsageTracker,
    /// The `stat` and `children` files of the last window's processes, kept open.
    files: ProcFiles,
    /// The last scan of `/proc/*/fd` for device-file holders, kept while the set of invisible
    /// NVML PIDs stays the same: the scan reads every fd of every process, the costliest thing
    /// attribution does, and a profile showed it dominating when host PIDs are not visible.
    holders_scan: Option<HolderScan>,
    /// Whether the "cannot read other processes' fd" warning was given (once per run: the
    /// condition is a deployment setting, not something that comes and goes).
    warned_fd_denied: bool,
}

/// Device-file holders found for one set of invisible NVML PIDs.
#[derive(Debug)]
struct HolderScan {
    invisible: BTreeSet<u32>,
    holders: DeviceHolders,
    at: Instant,
}

/// A holders scan is redone at least this often even when the invisible PIDs did not change, so
/// a local process that opened the device later is still found.
const HOLDER_SCAN_MAX_AGE: Duration = Duration::from_secs(60);

impl Attributor {
    /// Builds an attributor. When a kubelet socket is configured and this is called inside a
    /// tokio runtime, a background task keeps the pod list fresh; outside one, call
    /// `pod_directory().refresh()` yourself or live without pod names.
    pub fn new(settings: AttributionSettings) -> Self {
        let pods = settings
            .kubelet_socket
            .as_ref()
            .map(|socket| Arc::new(PodDirectory::new(socket)));
        let refresher = match (&pods, tokio::runtime::Handle::try_current()) {
            (Some(directory), Ok(runtime)) => {
                Some(spawn_refresher(Arc::clone(directory), &runtime))
            }
            (Some(directory), Err(_)) => {
                tracing::warn!(
                    socket = %directory.socket().display(),
                    "attribution started outside a tokio runtime: the kubelet pod list is not \
                     refreshed in the background, so pod names appear only if refreshed explicitly"
                );
                None
            }
            (None, _) => None,
        };
        Self {
            usage: UsageTracker::new(&settings.proc_root),
            files: ProcFiles::for_root(&settings.proc_root),
            holders_scan: None,
            warned_fd_denied: false,
            settings,
            cache: FastMap::default(),
            local_cache: FastMap::default(),
            generation: 0,
            passwd: Passwd::default(),
            root_unreadable: false,
            pods,
            refresher,
        }
    }

    pub fn settings(&self) -> &AttributionSettings {
        &self.settings
    }

    /// The pod list this attributor reads names from, when a kubelet socket is configured.
    pub fn pod_directory(&self) -> Option<&Arc<PodDirectory>> {
        self.pods.as_ref()
    }

    /// Number of processes whose identity is cached.
    pub fn cached_len(&self) -> usize {
        self.cache.len() + self.local_cache.len()
    }

    /// Resolves the PIDs of one window; each pair is a host PID and a device UUID it uses (a
    /// PID on two GPUs appears twice). No device-file fallback: minors are not known here.
    pub fn resolve(&mut self, processes: &[(u32, String)]) -> HashMap<u32, Workload> {
        let refs: Vec<GpuProcessRef<'_>> = processes
            .iter()
            .map(|(pid, uuid)| GpuProcessRef {
                pid: *pid,
                device_uuid: uuid,
                device_minor: None,
                mig: None,
            })
            .collect();
        self.resolve_processes(&refs)
    }

    /// Resolves the processes of an export window, with the devices' minor numbers for the
    /// device-file fallback.
    pub fn resolve_window(&mut self, window: &Window) -> HashMap<u32, Workload> {
        self.resolve_window_in(window, &ProcessTable::default())
    }

    /// Every `stat` the window's attribution needs, read once: the GPU processes' and their
    /// descendants' (see [`ProcessTable::scan_for`]). Pass it to [`Self::resolve_window_in`],
    /// [`Self::usage_in`] and `ParentWatch::parent_alive_in`, so a process's `stat` is read
    /// once per window instead of once by each of them.
    pub fn process_table(&mut self, window: &Window) -> ProcessTable {
        let mut pids: Vec<u32> = window.processes.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        self.process_table_of(&pids)
    }

    /// [`Self::process_table`] for the given GPU PIDs. The `stat` and `children` files it
    /// reads stay open until a table is made without them (see `procfiles`).
    pub fn process_table_of(&mut self, pids: &[u32]) -> ProcessTable {
        self.files.begin_window();
        let table = if pids.is_empty() {
            ProcessTable::default()
        } else {
            ProcessTable::scan_with(&mut self.files, pids).unwrap_or_default()
        };
        self.files.end_window();
        table
    }

    /// [`Self::resolve_window`] with the `stat` of each PID taken from `table` when it is there
    /// (read from procfs otherwise, as without a table).
    pub fn resolve_window_in(
        &mut self,
        window: &Window,
        table: &ProcessTable,
    ) -> HashMap<u32, Workload> {
        let minors: FastMap<&str, u32> = window
            .devices
            .iter()
            .filter_map(|d| Some((d.info.uuid.as_str(), d.info.minor_number?)))
            .collect();
        let refs: Vec<GpuProcessRef<'_>> = window
            .processes
            .iter()
            .map(|p| GpuProcessRef {
                pid: p.pid,
                device_uuid: &p.device_uuid,
                device_minor: minors.get(p.device_uuid.as_str()).copied(),
                mig: window
                    .mig_instance_of(p.pid, &p.device_uuid)
                    .map(|m| GpuProcessMig {
                        uuid: &m.info.uuid,
                        profile: m.info.profile(),
                    }),
            })
            .collect();
        self.resolve_processes_in(&refs, table)
    }

    /// Resolves GPU processes to workloads, one per distinct PID.
    pub fn resolve_processes(&mut self, processes: &[GpuProcessRef<'_>]) -> HashMap<u32, Workload> {
        self.resolve_processes_in(processes, &ProcessTable::default())
    }

    /// [`Self::resolve_processes`] with each `stat` taken from `table` when it is there.
    pub fn resolve_processes_in(
        &mut self,
        processes: &[GpuProcessRef<'_>],
        table: &ProcessTable,
    ) -> HashMap<u32, Workload> {
        self.generation += 1;
        // Sized for the window at once: it is built anew every window.
        let mut devices_of: FastMap<u32, BTreeSet<&str>> =
            FastMap::with_capacity_and_hasher(processes.len(), FastState::default());
        for process in processes {
            devices_of
                .entry(process.pid)
                .or_default()
                .insert(process.device_uuid);
        }

        if !self.root_readable() {
            self.cache.clear();
            self.local_cache.clear();
            return devices_of
                .keys()
                .map(|&pid| (pid, Workload::unresolved(pid)))
                .collect();
        }

        let mut workloads = HashMap::with_capacity(devices_of.len());
        let mut invisible: Vec<u32> = Vec::new();
        let mut cgroup_read: FastSet<u32> =
            FastSet::with_capacity_and_hasher(devices_of.len(), FastState::default());
        let mut new_pids = false;
        for &pid in devices_of.keys() {
            let generation = self.generation;
            let (lookup, read_in_full) = lookup(
                &mut self.cache,
                &mut self.passwd,
                &self.settings,
                generation,
                pid,
                table.stat(pid),
            );
            new_pids |= read_in_full;
            let workload = match lookup {
                Lookup::Found(identity) => {
                    if identity.cgroup.is_some() {
                        cgroup_read.insert(pid);
                    }
                    workload_of(pid, identity, AttributionMethod::HostPid)
                }
                Lookup::NotVisible => {
                    invisible.push(pid);
                    Workload::unresolved(pid)
                }
                Lookup::Unreadable => Workload::unresolved(pid),
            };
            workloads.insert(pid, workload);
        }

        if !invisible.is_empty() {
            new_pids |=
                self.device_file_fallback(&invisible, processes, &mut workloads, &mut cgroup_read);
        }

        self.apply_pod_names(processes, &cgroup_read, &mut workloads);
        if new_pids {
            if let Some(refresher) = &self.refresher {
                refresher.request();
            }
        }

        let generation = self.generation;
        self.cache.retain(|_, entry| entry.generation == generation);
        self.local_cache
            .retain(|_, entry| entry.generation == generation);
        workloads
    }

    /// CPU and memory of the given processes (and their descendants) since the previous call;
    /// meant once per export window.
    pub fn usage(&mut self, pids: &[u32]) -> HashMap<u32, ProcessUsage> {
        self.usage.sample(pids)
    }

    /// [`Self::usage`] over the window's [`Self::process_table`].
    pub fn usage_in(&mut self, pids: &[u32], table: &ProcessTable) -> HashMap<u32, ProcessUsage> {
        self.usage.sample_table(pids, table, Instant::now())
    }

    /// One warning when the root turns unreadable, one line when it is back.
    fn root_readable(&mut self) -> bool {
        let readable = std::fs::read_dir(&self.settings.proc_root).is_ok();
        if !readable && !self.root_unreadable {
            tracing::warn!(
                proc_root = %self.settings.proc_root.display(),
                "procfs root is not readable: GPU processes are exported with process.pid only \
                 (no container, pod or service). Mount the host's /proc (e.g. --proc-root \
                 /host/proc or HOST_PROC) and run with hostPID or CAP_SYS_PTRACE"
            );
        } else if readable && self.root_unreadable {
            tracing::info!(
                proc_root = %self.settings.proc_root.display(),
                "procfs root is readable again; attributing GPU processes"
            );
        }
        self.root_unreadable = !readable;
        readable
    }

    /// Attributes invisible NVML PIDs to local device-file holders, by the minor numbers of
    /// the devices `processes` lists them on. Returns whether a local process was read for the
    /// first time.
    fn device_file_fallback(
        &mut self,
        invisible: &[u32],
        processes: &[GpuProcessRef<'_>],
        workloads: &mut HashMap<u32, Workload>,
        cgroup_read: &mut FastSet<u32>,
    ) -> bool {
        let invisible_set: BTreeSet<u32> = invisible.iter().copied().collect();
        let mut by_minor: HashMap<u32, BTreeSet<u32>> = HashMap::new();
        for process in processes {
            if let Some(minor) = process.device_minor {
                if invisible_set.contains(&process.pid) {
                    by_minor.entry(minor).or_default().insert(process.pid);
                }
            }
        }
        if by_minor.is_empty() {
            return false;
        }
        let fresh = self.holders_scan.as_ref().is_some_and(|scan| {
            scan.invisible == invisible_set && scan.at.elapsed() < HOLDER_SCAN_MAX_AGE
        });
        if !fresh {
            self.holders_scan = Some(HolderScan {
                holders: scan_device_holders(&self.settings.proc_root),
                invisible: invisible_set,
                at: Instant::now(),
            });
        }
        let Some(scan) = &self.holders_scan else {
            return false;
        };
        let pairs = match_one_to_one(&by_minor, &scan.holders.by_minor, &visible_of(workloads));
        let denied = scan.holders.denied.len();
        let unmatched = invisible.len().saturating_sub(pairs.len());
        if unmatched > 0 && denied > 0 && !self.warned_fd_denied {
            self.warned_fd_denied = true;
            tracing::warn!(
                proc_root = %self.settings.proc_root.display(),
                unmatched_gpu_processes = unmatched,
                unreadable = denied,
                "cannot read /proc/<pid>/fd of {} local processes (permission denied): GPU \
                 processes whose host PID is not visible cannot be matched by the /dev/nvidia* \
                 file they hold open, so they are exported with process.pid only (no container, \
                 service.name or process.vpid). Run gpulse as the workload's uid (runAsUser) or \
                 with CAP_SYS_PTRACE, or mount the host's /proc (HOST_PROC)",
                denied
            );
        }
        let mut read_new = false;
        for (nvml_pid, local_pid) in pairs {
            let generation = self.generation;
            let (lookup, read_in_full) = lookup(
                &mut self.local_cache,
                &mut self.passwd,
                &self.settings,
                generation,
                local_pid,
                None,
            );
            read_new |= read_in_full;
            if let Lookup::Found(identity) = lookup {
                if identity.cgroup.is_some() {
                    cgroup_read.insert(nvml_pid);
                }
                let mut workload = workload_of(nvml_pid, identity, AttributionMethod::DeviceFile);
                // The local PID is the process as its own namespace (shared with us) sees it.
                workload.vpid = identity.vpid.or(Some(local_pid));
                workloads.insert(nvml_pid, workload);
            }
        }
        read_new
    }

    fn apply_pod_names(
        &self,
        processes: &[GpuProcessRef<'_>],
        cgroup_read: &FastSet<u32>,
        workloads: &mut HashMap<u32, Workload>,
    ) {
        let Some(directory) = &self.pods else {
            return;
        };
        let index = directory.current();
        if index.is_empty() {
            return;
        }
        let mut devices_of: FastMap<u32, Vec<DeviceKeys<'_>>> = FastMap::default();
        for p in processes {
            let keys = DeviceKeys::new(
                p.device_uuid,
                p.device_minor,
                p.mig.map(|m| (m.uuid, m.profile)),
            );
            let devices = devices_of.entry(p.pid).or_default();
            // A PID listed twice on one device is one device.
            if !devices
                .iter()
                .any(|d| d.uuid == keys.uuid && d.mig_uuid == keys.mig_uuid)
            {
                devices.push(keys);
            }
        }
        let mut matched: HashMap<u32, Arc<PodContainer>> = HashMap::new();
        for (pid, workload) in workloads.iter() {
            // A process the cgroup shows outside any pod is not a pod's, whatever GPU it uses.
            if cgroup_read.contains(pid) && workload.pod_uid.is_none() {
                continue;
            }
            let devices = devices_of
                .get(pid)
                .into_iter()
                .flatten()
                .map(DeviceKeys::keys);
            if let DeviceMatch::Unique(container) = index.match_device_keys(devices) {
                matched.insert(*pid, container);
            }
        }

        // Consistency with the cgroup's pod UIDs.
        let mut uids_of_pod: HashMap<(&str, &str), HashSet<&str>> = HashMap::new();
        let mut pods_of_uid: HashMap<&str, HashSet<(&str, &str)>> = HashMap::new();
        for (pid, container) in &matched {
            if let Some(uid) = workloads.get(pid).and_then(|w| w.pod_uid.as_deref()) {
                let pod = (container.namespace.as_str(), container.pod_name.as_str());
                uids_of_pod.entry(pod).or_default().insert(uid);
                pods_of_uid.entry(uid).or_default().insert(pod);
            }
        }
        let mut conflicting: Vec<u32> = Vec::new();
        for (pid, container) in &matched {
            let pod = (container.namespace.as_str(), container.pod_name.as_str());
            let uid = workloads.get(pid).and_then(|w| w.pod_uid.as_deref());
            let pod_conflict = uids_of_pod.get(&pod).is_some_and(|uids| uids.len() > 1);
            let uid_conflict = uid
                .and_then(|uid| pods_of_uid.get(uid))
                .is_some_and(|pods| pods.len() > 1);
            if pod_conflict || uid_conflict {
                conflicting.push(*pid);
            }
        }
        if !conflicting.is_empty() {
            tracing::debug!(
                ?conflicting,
                "GPU processes match pods inconsistently with their cgroup pod UIDs; \
                 leaving their pod names out"
            );
        }
        for pid in conflicting {
            matched.remove(&pid);
        }
        for (pid, container) in matched {
            if let Some(workload) = workloads.get_mut(&pid) {
                workload.pod_name = Some(container.pod_name.clone());
                workload.namespace_name = Some(container.namespace.clone());
                workload.container_name = Some(container.container_name.clone());
            }
        }
    }
}

/// NVML PIDs resolved directly, which cannot be someone else's device-file holder.
fn visible_of(workloads: &HashMap<u32, Workload>) -> HashSet<u32> {
    workloads
        .iter()
        .filter(|(_, w)| w.attributed_by == AttributionMethod::HostPid)
        .map(|(pid, _)| *pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributor_can_move_to_another_task() {
        fn assert_send<T: Send + 'static>() {}
        assert_send::<Attributor>();
    }
}
