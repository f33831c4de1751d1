//! Attribution of whole export windows: the stage's entry point for `gpulse run` and
//! `gpulse top`. It owns what attributing a window needs beyond one process's identity — the
//! pod gpulse itself runs in (the Downward API names it, so its processes get a pod name even
//! without the kubelet socket), the parent watch and the GPU accounts kept from window to window — and turns a [`Window`] into the one
//! [`AttributedWindow`] every later stage reads, reading each process's `stat` once.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::accounting::{GpuAccountant, Prices};
use super::attributed::{visible_pids, AttributedWindow};
use super::attributor::Attributor;
use super::parents::ParentWatch;
use super::sent_identity::SentIdentity;
use super::settings::AttributionSettings;
use super::workload::Workload;
use crate::sampling::Window;

/// The pod gpulse runs in, from the Downward API (`K8S_POD_UID`, `K8S_POD_NAME`,
/// `K8S_POD_NAMESPACE`): in a sidecar, processes whose cgroup names this pod UID are this pod's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnPod {
    pub uid: String,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

impl OwnPod {
    /// Names `workload`'s pod when it is this pod and nothing better named it.
    pub fn apply(&self, workload: &mut Workload) {
        if workload.pod_uid.as_deref() == Some(self.uid.as_str()) {
            if workload.pod_name.is_none() {
                workload.pod_name.clone_from(&self.name);
            }
            if workload.namespace_name.is_none() {
                workload.namespace_name.clone_from(&self.namespace);
            }
        }
    }
}

/// Attributes windows, keeping the caches and watches that live from one window to the next.
pub struct WindowAttributor {
    attributor: Attributor,
    parents: ParentWatch,
    own_pod: Option<OwnPod>,
    accountant: GpuAccountant,
    /// The job processes of the previous window, and those that left since (oldest first).
    job_processes: HashMap<u32, Workload>,
    departed: VecDeque<(Instant, Workload)>,
}

/// How long a process of a job that left is remembered, and how many at most.
const DEPARTED_KEPT: Duration = Duration::from_secs(3600);
const DEPARTED_MAX: usize = 256;

impl WindowAttributor {
    pub fn new(settings: AttributionSettings, own_pod: Option<OwnPod>) -> Self {
        Self {
            parents: ParentWatch::new(&settings.proc_root),
            attributor: Attributor::new(settings),
            own_pod,
            accountant: GpuAccountant::default(),
            job_processes: HashMap::new(),
            departed: VecDeque::new(),
        }
    }

    /// Figures the roll-ups' cost with these prices.
    pub(crate) fn with_prices(mut self, prices: Prices) -> Self {
        self.accountant = GpuAccountant::new(prices);
        self
    }

    /// Every process of `window` with its workload, CPU/memory use and parent liveness.
    pub fn attribute(&mut self, window: Window) -> AttributedWindow {
        self.attribute_with_sent_identities(window, &HashMap::new())
    }

    /// As [`Self::attribute`], with what each process said about itself through gpulse's
    /// receiver, by PID (its service, rank and job): a process's own word outranks its
    /// environment, and it is adopted before the accounts are rolled up, so the job's roll-up
    /// and every consumer of the window name the process as it names itself.
    pub(crate) fn attribute_with_sent_identities(
        &mut self,
        window: Window,
        sent_identities: &HashMap<u32, SentIdentity>,
    ) -> AttributedWindow {
        // One read of each process's `stat` for identity, usage and the parent check.
        let table = self.attributor.process_table(&window);
        let mut workloads = self.attributor.resolve_window_in(&window, &table);
        if let Some(own) = &self.own_pod {
            for workload in workloads.values_mut() {
                own.apply(workload);
            }
        }
        for (pid, sent) in sent_identities {
            if let Some(workload) = workloads.get_mut(pid) {
                workload.adopt_sent_identity(sent);
            }
        }
        let visible = visible_pids(&workloads);
        let usage = self.attributor.usage_in(&visible, &table);
        let parent_alive = self.parents.parent_alive_in(&visible, &table);
        let accounts = self.accountant.account(&window, &workloads);
        let departed = self.note_departures(&workloads);
        AttributedWindow {
            window,
            workloads,
            usage,
            parent_alive,
            accounts,
            departed,
            ledger: Default::default(),
        }
    }

    /// Remembers the processes of a job (those with a job id) that the previous window listed
    /// and this one does not; returns those that left within the last hour, by PID. Only job
    /// processes: a finding may still name them (a hung job's rank that exited).
    fn note_departures(&mut self, workloads: &HashMap<u32, Workload>) -> HashMap<u32, Workload> {
        let now = Instant::now();
        let previous = std::mem::take(&mut self.job_processes);
        for (pid, workload) in previous {
            if !workloads.contains_key(&pid) {
                self.departed.push_back((now, workload));
            }
        }
        self.job_processes = workloads
            .iter()
            .filter(|(_, w)| w.job_id.is_some())
            .map(|(pid, w)| (*pid, w.clone()))
            .collect();
        self.departed.retain(|(left, w)| {
            now.duration_since(*left) <= DEPARTED_KEPT && !workloads.contains_key(&w.pid)
        });
        while self.departed.len() > DEPARTED_MAX {
            self.departed.pop_front();
        }
        self.departed
            .iter()
            .map(|(_, w)| (w.pid, w.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_process_that_leaves_is_remembered_as_last_attributed() {
        let mut attributor = WindowAttributor::new(AttributionSettings::default(), None);
        let rank = |pid: u32, job: Option<&str>| {
            let mut w = Workload::unresolved(pid);
            w.job_id = job.map(str::to_string);
            w.service_name = Some("train".into());
            (pid, w)
        };
        let first: HashMap<u32, Workload> =
            [rank(10, Some("j")), rank(11, Some("j")), rank(12, None)].into();
        assert!(attributor.note_departures(&first).is_empty());
        // 11 (of job j) and 12 (no job) leave.
        let second: HashMap<u32, Workload> = [rank(10, Some("j"))].into();
        let departed = attributor.note_departures(&second);
        assert_eq!(departed.keys().copied().collect::<Vec<_>>(), vec![11]);
        assert_eq!(departed[&11].service_name.as_deref(), Some("train"));
        // Still remembered a window later; forgotten once the PID is listed again (reused).
        assert!(attributor.note_departures(&second).contains_key(&11));
        let third: HashMap<u32, Workload> = [rank(10, Some("j")), rank(11, None)].into();
        assert!(attributor.note_departures(&third).is_empty());
    }

    #[test]
    fn own_pod_names_only_its_own_processes() {
        let own = OwnPod {
            uid: "uid-a".into(),
            name: Some("trainer-0".into()),
            namespace: Some("ml".into()),
        };
        let mut mine = Workload::unresolved(1);
        mine.pod_uid = Some("uid-a".into());
        let mut other = Workload::unresolved(2);
        other.pod_uid = Some("uid-b".into());
        let mut named = Workload::unresolved(3);
        named.pod_uid = Some("uid-a".into());
        named.pod_name = Some("from-kubelet".into());
        for w in [&mut mine, &mut other, &mut named] {
            own.apply(w);
        }
        assert_eq!(mine.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(mine.namespace_name.as_deref(), Some("ml"));
        assert_eq!(other.pod_name, None);
        assert_eq!(other.namespace_name, None);
        assert_eq!(
            named.pod_name.as_deref(),
            Some("from-kubelet"),
            "kubelet's name wins"
        );
    }
}
