//! What the live view reads from `/proc` itself, beyond what attribution gives it: the
//! descendants of each GPU process (a trainer's DataLoader workers hold no GPU context, so NVML
//! never lists them) for the tree view, and gpulse's own CPU for the header.
//!
//! The descendants come from one read of every `<proc_root>/<pid>/stat` (the same
//! [`ProcessTable`] attribution's usage tracker builds), and only while the tree view or the
//! detail pane needs them: the flat view reads nothing here but `/proc/self/stat`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::attribution::procfs::ProcDir;
use crate::attribution::usage::{cpu_utilization, ProcessTable};

/// One process under a GPU process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// CPU since the previous refresh, as a ratio of one core; `None` on the first reading.
    pub cpu: Option<f64>,
    pub rss_bytes: Option<u64>,
}

/// GPU processes and their live descendants, as of the last refresh.
#[derive(Debug, Default)]
pub(crate) struct ProcessTrees {
    proc_root: PathBuf,
    ticks_per_second: f64,
    page_size: u64,
    /// By PID: every process in the tree of at least one GPU process.
    members: HashMap<u32, Member>,
    /// By GPU PID: its descendants, the process itself first (breadth first).
    trees: HashMap<u32, Vec<u32>>,
    /// (pid, start time) -> (when, utime + stime), for the next refresh's CPU figure.
    previous: HashMap<(u32, u64), (Instant, u64)>,
}

impl ProcessTrees {
    pub(crate) fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            ticks_per_second: clock_ticks_per_second(),
            page_size: page_size(),
            ..Self::default()
        }
    }

    /// Re-reads the process table and the trees of `gpu_pids` (the visible GPU processes).
    pub(crate) fn refresh(&mut self, gpu_pids: &[u32]) {
        let table = if gpu_pids.is_empty() {
            ProcessTable::default()
        } else {
            ProcessTable::scan_for(&self.proc_root, gpu_pids).unwrap_or_default()
        };
        self.refresh_from(gpu_pids, &table, Instant::now());
    }

    /// `refresh` over a table already read (tests build one by hand).
    pub(crate) fn refresh_from(&mut self, gpu_pids: &[u32], table: &ProcessTable, now: Instant) {
        let mut members = HashMap::new();
        let mut trees = HashMap::new();
        let mut previous = HashMap::new();
        for &gpu_pid in gpu_pids {
            if table.stat(gpu_pid).is_none() {
                continue;
            }
            let tree = table.tree(gpu_pid);
            for &pid in &tree {
                if members.contains_key(&pid) {
                    continue;
                }
                let Some(stat) = table.stat(pid) else {
                    continue;
                };
                let ticks = stat.utime_ticks.saturating_add(stat.stime_ticks);
                let key = (pid, stat.start_time_ticks);
                let cpu = self.previous.get(&key).and_then(|(then, before)| {
                    cpu_utilization(
                        *before,
                        ticks,
                        now.saturating_duration_since(*then).as_secs_f64(),
                        self.ticks_per_second,
                    )
                });
                previous.insert(key, (now, ticks));
                members.insert(
                    pid,
                    Member {
                        pid,
                        ppid: stat.ppid,
                        comm: stat.comm.clone(),
                        cpu,
                        rss_bytes: (stat.rss_pages > 0)
                            .then(|| stat.rss_pages.saturating_mul(self.page_size)),
                    },
                );
            }
            trees.insert(gpu_pid, tree);
        }
        self.members = members;
        self.trees = trees;
        self.previous = previous;
    }

    pub(crate) fn member(&self, pid: u32) -> Option<&Member> {
        self.members.get(&pid)
    }

    /// The direct children of `pid` among the known members, by ascending PID.
    pub(crate) fn children(&self, pid: u32) -> Vec<u32> {
        let mut children: Vec<u32> = self
            .members
            .values()
            .filter(|m| m.ppid == pid && m.pid != pid)
            .map(|m| m.pid)
            .collect();
        children.sort_unstable();
        children
    }

    /// Whether `pid` lies in the tree of a GPU process other than itself.
    pub(crate) fn has_gpu_ancestor(&self, pid: u32) -> bool {
        self.trees
            .iter()
            .any(|(&root, tree)| root != pid && tree.contains(&pid))
    }

    /// Descendants of `pid` (itself excluded), when it is a GPU process seen at the last refresh.
    pub(crate) fn descendants(&self, pid: u32) -> &[u32] {
        self.trees
            .get(&pid)
            .map_or(&[][..], |t| t.get(1..).unwrap_or(&[]))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }
}

/// gpulse's own CPU use between two calls, from `/proc/self/stat`.
#[derive(Debug)]
pub(crate) struct OwnCpu {
    proc_dir: ProcDir,
    ticks_per_second: f64,
    previous: Option<(Instant, u64)>,
}

impl Default for OwnCpu {
    fn default() -> Self {
        Self::new()
    }
}

impl OwnCpu {
    pub(crate) fn new() -> Self {
        Self {
            proc_dir: ProcDir::new(Path::new("/proc"), std::process::id()),
            ticks_per_second: clock_ticks_per_second(),
            previous: None,
        }
    }

    /// CPU used since the previous call as a ratio of one core; `None` on the first call or when
    /// `/proc/self/stat` cannot be read.
    pub(crate) fn sample(&mut self) -> Option<f64> {
        let stat = self.proc_dir.stat().ok().flatten()?;
        let ticks = stat.utime_ticks.saturating_add(stat.stime_ticks);
        let now = Instant::now();
        let ratio = self.previous.and_then(|(then, before)| {
            cpu_utilization(
                before,
                ticks,
                now.saturating_duration_since(then).as_secs_f64(),
                self.ticks_per_second,
            )
        });
        self.previous = Some((now, ticks));
        ratio
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::procfs::Stat;
    use std::time::Duration;

    fn stat(comm: &str, ppid: u32, ticks: u64) -> Stat {
        Stat {
            comm: comm.into(),
            state: 'S',
            ppid,
            utime_ticks: ticks,
            stime_ticks: 0,
            cutime_ticks: 0,
            cstime_ticks: 0,
            start_time_ticks: 7,
            num_threads: 1,
            rss_pages: 2,
        }
    }

    fn table(worker_ticks: u64) -> ProcessTable {
        let mut t = ProcessTable::default();
        t.insert(1, stat("init", 0, 0));
        t.insert(100, stat("python3", 1, 10));
        t.insert(101, stat("pt_data_worker", 100, worker_ticks));
        t.insert(102, stat("pt_data_worker", 100, 0));
        t.insert(200, stat("other", 1, 0));
        t
    }

    #[test]
    fn trainer_has_its_workers_as_children_with_their_cpu() {
        let mut process_trees = ProcessTrees::new("/nonexistent");
        process_trees.ticks_per_second = 100.0;
        let t0 = Instant::now();
        process_trees.refresh_from(&[100], &table(0), t0);
        assert_eq!(process_trees.children(100), vec![101, 102]);
        assert_eq!(process_trees.descendants(100), &[101, 102]);
        assert_eq!(process_trees.member(101).unwrap().comm, "pt_data_worker");
        assert_eq!(
            process_trees.member(101).unwrap().cpu,
            None,
            "first reading"
        );
        assert!(
            process_trees.member(200).is_none(),
            "not under a GPU process"
        );

        process_trees.refresh_from(&[100], &table(50), t0 + Duration::from_secs(1));
        let cpu = process_trees
            .member(101)
            .unwrap()
            .cpu
            .expect("second reading");
        assert!((cpu - 0.5).abs() < 1e-9, "{cpu}");
        assert!(!process_trees.has_gpu_ancestor(100));
    }

    #[test]
    fn a_gpu_process_under_another_is_nested() {
        let mut process_trees = ProcessTrees::new("/nonexistent");
        process_trees.refresh_from(&[100, 101], &table(0), Instant::now());
        assert!(process_trees.has_gpu_ancestor(101));
        assert!(!process_trees.has_gpu_ancestor(100));
    }

    #[test]
    fn own_cpu_is_known_from_the_second_call() {
        let mut own = OwnCpu::new();
        assert_eq!(own.sample(), None);
        // The ticks are the whole test process's, other tests' threads included, in 10 ms
        // steps: two readings microseconds apart could divide a tick by almost nothing.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ratio = own.sample().expect("second reading");
        assert!((0.0..=64.0).contains(&ratio), "{ratio}");
    }
}
