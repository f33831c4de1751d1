//! Whether a GPU process still has the parent it started under: the leftover of a crashed run is
//! a worker whose launcher (torchrun, a notebook, a shell) died and left it re-parented, still
//! holding GPU memory.
//!
//! A process's parent at the time gpulse first saw it, identified by PID *and* start time (so a
//! reused PID does not pass for it), is remembered. The parent is alive while the process still
//! has that PID as its parent and that PID is still the same process. When gpulse first sees a
//! process that is already a child of PID 1 (the namespace's init: tini, the pause container or
//! the host's init), nothing can be said and the answer is unknown: a container's main process
//! legitimately looks like that.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::procfs::{ProcDir, Stat};
use super::usage::ProcessTable;
use crate::fast_map::{FastMap, FastSet, FastState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parent {
    pid: u32,
    start_time_ticks: u64,
}

/// Remembers each GPU process's original parent; bounded by the PIDs of the last call.
#[derive(Debug, Default)]
pub struct ParentWatch {
    proc_root: PathBuf,
    /// Keyed by (pid, the process's own start time), so a reused PID starts afresh.
    parents: FastMap<(u32, u64), Option<Parent>>,
}

impl ParentWatch {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            parents: FastMap::default(),
        }
    }

    /// For each PID gpulse can read: whether its original parent is still its parent and alive.
    /// PIDs that cannot be read, or whose parent was init from the start, are left out (unknown).
    pub fn parent_alive(&mut self, pids: &[u32]) -> HashMap<u32, bool> {
        self.parent_alive_in(pids, &ProcessTable::default())
    }

    /// [`Self::parent_alive`] with each `stat` taken from `table` when it is there (the
    /// window's process table), read from procfs otherwise.
    pub fn parent_alive_in(&mut self, pids: &[u32], table: &ProcessTable) -> HashMap<u32, bool> {
        let mut alive = HashMap::with_capacity(pids.len());
        let mut seen = FastSet::with_capacity_and_hasher(pids.len(), FastState::default());
        for &pid in pids {
            let Some(stat) = read_stat(&self.proc_root, table, pid) else {
                continue;
            };
            let key = (pid, stat.start_time_ticks);
            seen.insert(key);
            let root = &self.proc_root;
            let original = *self
                .parents
                .entry(key)
                .or_insert_with(|| original_parent(root, table, &stat));
            if let Some(parent) = original {
                let same_parent = stat.ppid == parent.pid;
                let parent_lives = read_stat(&self.proc_root, table, parent.pid).is_some_and(|p| {
                    p.start_time_ticks == parent.start_time_ticks && p.state != 'Z'
                });
                alive.insert(pid, same_parent && parent_lives);
            }
        }
        self.parents.retain(|key, _| seen.contains(key));
        alive
    }
}

fn read_stat<'t>(proc_root: &Path, table: &'t ProcessTable, pid: u32) -> Option<Cow<'t, Stat>> {
    match table.stat(pid) {
        Some(stat) => Some(Cow::Borrowed(stat)),
        None => ProcDir::new(proc_root, pid)
            .stat()
            .ok()
            .flatten()
            .map(Cow::Owned),
    }
}

fn original_parent(proc_root: &Path, table: &ProcessTable, stat: &Stat) -> Option<Parent> {
    if stat.ppid <= 1 {
        return None;
    }
    let parent = read_stat(proc_root, table, stat.ppid)?;
    Some(Parent {
        pid: stat.ppid,
        start_time_ticks: parent.start_time_ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_stat(root: &Path, pid: u32, ppid: u32, start: u64) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("pid dir");
        let stat = format!(
            "{pid} (python3) S {ppid} 1 1 0 -1 4194304 100 0 0 0 5 3 0 0 20 0 1 0 {start} 1000 200 18446744073709551615"
        );
        std::fs::write(dir.join("stat"), stat).expect("stat");
    }

    #[test]
    fn a_worker_whose_launcher_died_is_reported_orphaned() {
        let root = tempfile::tempdir().expect("root");
        write_stat(root.path(), 100, 1, 10); // the launcher, child of init
        write_stat(root.path(), 200, 100, 20); // a worker it started
        let mut watch = ParentWatch::new(root.path());
        assert_eq!(watch.parent_alive(&[200]).get(&200), Some(&true));
        // The launcher crashes; the worker is re-parented to init.
        std::fs::remove_dir_all(root.path().join("100")).expect("kill launcher");
        write_stat(root.path(), 200, 1, 20);
        assert_eq!(watch.parent_alive(&[200]).get(&200), Some(&false));
    }

    #[test]
    fn a_reused_parent_pid_does_not_pass_for_the_parent() {
        let root = tempfile::tempdir().expect("root");
        write_stat(root.path(), 100, 1, 10);
        write_stat(root.path(), 200, 100, 20);
        let mut watch = ParentWatch::new(root.path());
        watch.parent_alive(&[200]);
        write_stat(root.path(), 100, 1, 99); // another process now has PID 100
        assert_eq!(watch.parent_alive(&[200]).get(&200), Some(&false));
    }

    #[test]
    fn a_process_first_seen_under_init_is_unknown_not_orphaned() {
        let root = tempfile::tempdir().expect("root");
        write_stat(root.path(), 300, 1, 30);
        let mut watch = ParentWatch::new(root.path());
        assert!(watch.parent_alive(&[300]).is_empty());
        assert!(
            watch.parent_alive(&[999]).is_empty(),
            "an unreadable PID is unknown"
        );
    }
}
