//! The attribution stage's one output: an export `Window` together with what attribution learnt
//! about each of its GPU processes — identity (`Workload`), CPU/memory use over the window, and
//! whether the process still has the parent it started under. Every consumer of a window
//! and the GPU time and energy charged to each (`accounting`). Every consumer of a window
//! (diagnosis, the request builders, `/metrics`, `/status`, `gpulse top`) reads its processes from
//! here instead of joining PID-keyed maps itself.

use std::collections::HashMap;

use serde::Serialize;

use super::accounting::Accounts;
use super::ledger::Ledger;
use super::workload::{AttributionMethod, ProcessUsage, Workload};
use crate::sampling::{ProcessWindow, Window};

/// A window and its attributed processes.
#[derive(Debug, Clone, Serialize)]
pub struct AttributedWindow {
    pub window: Window,
    /// By host PID: every process the window lists (unresolved ones included).
    pub workloads: HashMap<u32, Workload>,
    /// By host PID: CPU and memory use, for the processes whose `/proc` entry is visible.
    pub usage: HashMap<u32, ProcessUsage>,
    /// By host PID: whether the original parent is alive; missing means unknown.
    pub parent_alive: HashMap<u32, bool>,
    /// GPU time and energy per process and device, and the roll-ups by job, pod and container.
    pub accounts: Accounts,
    /// By host PID: processes of a job that left within the last hour, as they were last
    /// attributed, so what is said about them (a hung job's rank that exited) goes on the
    /// resource they had.
    pub departed: HashMap<u32, Workload>,
    /// The same time and energy by cause; filled once the window's step phases and findings are
    /// known (`pipeline::Analyzer`), empty where no analysis ran.
    pub ledger: Ledger,
}

/// One GPU process of an `AttributedWindow`, with its per-device windows.
#[derive(Debug, Clone, Copy)]
pub struct AttributedProcess<'a> {
    pub workload: &'a Workload,
    pub usage: Option<&'a ProcessUsage>,
    pub parent_alive: Option<bool>,
}

impl AttributedWindow {
    /// A window whose processes nobody attributed (each known by its PID only).
    pub fn unattributed(window: Window) -> Self {
        let workloads = window
            .processes
            .iter()
            .map(|p| (p.pid, Workload::unresolved(p.pid)))
            .collect();
        Self {
            window,
            workloads,
            usage: HashMap::new(),
            parent_alive: HashMap::new(),
            accounts: Accounts::default(),
            departed: HashMap::new(),
            ledger: Ledger::default(),
        }
    }

    pub fn process(&self, pid: u32) -> Option<AttributedProcess<'_>> {
        let workload = self.workloads.get(&pid)?;
        Some(AttributedProcess {
            workload,
            usage: self.usage.get(&pid),
            parent_alive: self.parent_alive.get(&pid).copied(),
        })
    }

    /// Every attributed process, by ascending host PID.
    pub fn processes(&self) -> Vec<AttributedProcess<'_>> {
        let mut pids: Vec<u32> = self.workloads.keys().copied().collect();
        pids.sort_unstable();
        pids.into_iter()
            .filter_map(|pid| self.process(pid))
            .collect()
    }

    /// The per-device windows of one process (a process on two GPUs has two).
    pub(crate) fn devices_of(&self, pid: u32) -> impl Iterator<Item = &ProcessWindow> {
        self.window.processes.iter().filter(move |p| p.pid == pid)
    }

    /// The host PIDs whose `/proc` entries are visible: the only ones whose CPU, memory and
    /// parent `/proc` can tell. Sorted.
    pub(crate) fn visible_pids(&self) -> Vec<u32> {
        visible_pids(&self.workloads)
    }
}

/// The host PIDs among `workloads` attributed through their visible `/proc` entry, sorted.
/// Asking `/proc` about the others would cost a failed lookup each, every window, in a container
/// without the host's PID namespace.
pub(crate) fn visible_pids(workloads: &HashMap<u32, Workload>) -> Vec<u32> {
    let mut pids: Vec<u32> = workloads
        .values()
        .filter(|w| w.attributed_by == AttributionMethod::HostPid)
        .map(|w| w.pid)
        .collect();
    pids.sort_unstable();
    pids
}
