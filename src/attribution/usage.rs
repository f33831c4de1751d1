//! CPU and memory of GPU processes, for diagnosis (an input-bound job shows a busy CPU and an
//! idle GPU): readings of `/proc/<pid>/stat` (CPU ticks and resident pages: `status` is not
//! read, it costs the kernel several times more to render), and the tracker that turns two
//! readings into `gpulse.process.cpu.utilization`. Called once per export window, not per sample.
//!
//! The tree figure adds the process's live descendants (found by `ppid`, e.g. PyTorch DataLoader
//! workers). Each member counts `utime + stime + cutime + cstime`: when a worker exits and is
//! reaped, its time moves into its parent's `cutime`, so the tree total does not drop. A
//! negative difference (an orphan reparented away) is clamped to zero.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::procfiles::{parse_children, ProcFiles};
use super::procfs::{list_pids, read_to_string, ProcDir, Stat};
use super::workload::ProcessUsage;
use crate::fast_map::{FastMap, FastSet, FastState};

/// One process's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuReading {
    /// Identity of the process (with its PID): a reused PID is not compared with its old self.
    pub start_time_ticks: u64,
    /// `utime + stime` of the process alone, clock ticks.
    pub own_ticks: u64,
    /// The same plus waited-for children, over the process and its live descendants.
    pub tree_ticks: u64,
    pub rss_bytes: Option<u64>,
}

/// Every process's `stat` under a procfs root, read once so descendants can be found by `ppid`.
#[derive(Debug, Default)]
pub struct ProcessTable {
    stats: FastMap<u32, Stat>,
    children: FastMap<u32, Vec<u32>>,
}

impl ProcessTable {
    /// Reads all `<root>/<pid>/stat`. Processes that vanish meanwhile are left out.
    pub fn scan(proc_root: &Path) -> std::io::Result<Self> {
        let mut table = Self::default();
        for pid in list_pids(proc_root)? {
            if let Ok(Some(stat)) = ProcDir::new(proc_root, pid).stat() {
                table.insert(pid, stat);
            }
        }
        Ok(table)
    }

    /// What the usage of `pids` (and the window's parent checks) need: the `stat` of each of
    /// `pids`, of their parents and of all their live descendants; nothing when not one of
    /// `pids` is visible under `proc_root` (the GPU processes live in a PID namespace gpulse
    /// cannot see).
    ///
    /// Descendants are found through each thread's `task/<tid>/children` file, which costs
    /// two small reads per thread of the processes in the tree instead of one `stat` per
    /// process under the root. When those files are missing (a kernel without
    /// `CONFIG_PROC_CHILDREN`, or a procfs copy) or the threads outnumber the root's processes,
    /// every `stat` under the root is read instead ([`Self::scan`]): the same tree either way.
    pub fn scan_for(proc_root: &Path, pids: &[u32]) -> std::io::Result<Self> {
        Self::scan_with(&mut ProcFiles::uncached(proc_root), pids)
    }

    /// [`Self::scan_for`] through `files`, which keeps the files it reads open for the next
    /// window (one window: call `begin_window` before and `end_window` after).
    pub fn scan_with(files: &mut ProcFiles, pids: &[u32]) -> std::io::Result<Self> {
        let mut table = Self::default();
        for &pid in pids {
            if let Ok(Some(stat)) = files.stat(pid) {
                table.insert(pid, stat);
            }
        }
        if table.stats.is_empty() {
            return Ok(table);
        }
        if table.add_descendants(files).is_none() {
            return Self::scan(files.root());
        }
        let parents: Vec<u32> = table.stats.values().map(|s| s.ppid).collect();
        for ppid in parents {
            if ppid > 0 && !table.stats.contains_key(&ppid) {
                if let Ok(Some(stat)) = files.stat(ppid) {
                    table.insert(ppid, stat);
                }
            }
        }
        Ok(table)
    }

    /// Adds the live descendants of every process in the table, walking the `children` file
    /// of each of their threads. `None` when that cannot give the whole tree cheaply (see
    /// [`Self::scan_for`]); the table is then incomplete and must be replaced.
    fn add_descendants(&mut self, files: &mut ProcFiles) -> Option<()> {
        let proc_root = files.root().to_path_buf();
        let proc_root = proc_root.as_path();
        // The walk gives up for a full scan once it has read more files than there are
        // processes. Counting the processes lists all of `/proc`, so that is done only once the
        // walk is long enough for the answer to matter.
        let mut budget: Option<usize> = None;
        let mut reads = 0usize;
        let mut todo: Vec<u32> = self.stats.keys().copied().collect();
        let mut seen: FastSet<u32> = todo.iter().copied().collect();
        // The children of the thread being read, reused from one thread to the next.
        let mut children: Vec<u32> = Vec::new();
        while let Some(pid) = todo.pop() {
            // One live thread and a live main thread: that thread is the main one, whose task ID
            // is the PID, so `task/` need not be listed, and no path is built unless a read
            // fails. (A main thread that exited before the others leaves the process's state
            // `Z` while they run.)
            let single_threaded = self
                .stats
                .get(&pid)
                .is_some_and(|s| s.num_threads == 1 && s.state != 'Z');
            if single_threaded {
                if over_budget(&mut reads, &mut budget, proc_root) {
                    return None;
                }
                match files.main_thread_children(pid, &mut children) {
                    Ok(()) => {}
                    // The process exited meanwhile.
                    Err(_) if !process_dir(proc_root, pid).exists() => continue,
                    // The kernel does not have the file, or the root has no per-thread
                    // directories (a copied procfs tree).
                    Err(_) => return None,
                }
                self.add_children(files, &children, &mut seen, &mut todo, &mut reads);
                continue;
            }
            let process = process_dir(proc_root, pid);
            let main_thread = process.join("task").join(pid.to_string());
            let tasks: Vec<PathBuf> = match std::fs::read_dir(process.join("task")) {
                Ok(tasks) => tasks.flatten().map(|task| task.path()).collect(),
                // Exited meanwhile: no descendants to find through it.
                Err(_) if !process.exists() => continue,
                // No per-thread directories under this root.
                Err(_) => return None,
            };
            for task in tasks {
                if over_budget(&mut reads, &mut budget, proc_root) {
                    return None;
                }
                let read = if task == main_thread {
                    files.main_thread_children(pid, &mut children)
                } else {
                    read_to_string(&task.join("children")).map(|text| {
                        children.clear();
                        children.extend(parse_children(&text));
                    })
                };
                match read {
                    Ok(()) => {}
                    // The process exited meanwhile.
                    Err(_) if !process.exists() => continue,
                    // A listed thread exited meanwhile.
                    Err(_) if !task.exists() => continue,
                    // The kernel does not have the file, or the root has no per-thread
                    // directories (a copied procfs tree).
                    Err(_) => return None,
                }
                self.add_children(files, &children, &mut seen, &mut todo, &mut reads);
            }
        }
        Some(())
    }

    /// Reads the `stat` of each of `children` not seen yet and queues those alive for the walk.
    fn add_children(
        &mut self,
        files: &mut ProcFiles,
        children: &[u32],
        seen: &mut FastSet<u32>,
        todo: &mut Vec<u32>,
        reads: &mut usize,
    ) {
        for &child in children {
            if seen.insert(child) {
                *reads += 1;
                if let Ok(Some(stat)) = files.stat(child) {
                    self.insert(child, stat);
                    todo.push(child);
                }
            }
        }
    }

    pub fn insert(&mut self, pid: u32, stat: Stat) {
        if stat.ppid != pid {
            self.children.entry(stat.ppid).or_default().push(pid);
        }
        self.stats.insert(pid, stat);
    }

    pub fn stat(&self, pid: u32) -> Option<&Stat> {
        self.stats.get(&pid)
    }

    /// The process and all its live descendants, the process first.
    pub fn tree(&self, pid: u32) -> Vec<u32> {
        let mut seen: FastSet<u32> = [pid].into_iter().collect();
        let mut order = vec![pid];
        let mut next = 0;
        while let Some(&current) = order.get(next) {
            next += 1;
            for &child in self.children.get(&current).map_or(&[][..], Vec::as_slice) {
                // A malformed tree (a cycle in fixture files) must not loop forever.
                if seen.insert(child) {
                    order.push(child);
                }
            }
        }
        order
    }

    /// The reading for `pid`, with `rss_bytes` as given (from `status`, read by the caller).
    pub fn reading(&self, pid: u32, rss_bytes: Option<u64>) -> Option<CpuReading> {
        let stat = self.stat(pid)?;
        let ticks = |s: &Stat| {
            s.utime_ticks
                .saturating_add(s.stime_ticks)
                .saturating_add(s.cutime_ticks)
                .saturating_add(s.cstime_ticks)
        };
        // Most GPU processes have no live children: their tree is themselves, and walking it
        // would allocate for nothing (this runs for every process every window).
        let tree_ticks = if self.children.contains_key(&pid) {
            self.tree(pid)
                .into_iter()
                .filter_map(|member| self.stat(member))
                .map(ticks)
                .fold(0u64, u64::saturating_add)
        } else {
            ticks(stat)
        };
        Some(CpuReading {
            start_time_ticks: stat.start_time_ticks,
            own_ticks: stat.utime_ticks.saturating_add(stat.stime_ticks),
            tree_ticks,
            rss_bytes,
        })
    }
}

/// How many files the descendant walk reads before it counts the processes under the root to
/// decide whether a full scan would be cheaper (see `ProcessTable::add_descendants`).
const WALK_READS_BEFORE_COUNTING: usize = 1024;

/// The number of processes under `proc_root`; 0 when it cannot be listed (so the walk falls
/// back to a full scan, which then reports the error).
fn count_pids(proc_root: &Path) -> usize {
    list_pids(proc_root).map_or(0, |pids| pids.len())
}

/// Counts one more file read by the descendant walk; true once the walk has read more files
/// than there are processes under `proc_root` (counted once, and only past
/// [`WALK_READS_BEFORE_COUNTING`]), when a full scan is the cheaper way.
fn over_budget(reads: &mut usize, budget: &mut Option<usize>, proc_root: &Path) -> bool {
    *reads += 1;
    *reads > WALK_READS_BEFORE_COUNTING
        && *reads > *budget.get_or_insert_with(|| count_pids(proc_root))
}

/// `<proc_root>/<pid>`.
fn process_dir(proc_root: &Path, pid: u32) -> PathBuf {
    proc_root.join(pid.to_string())
}

/// CPU used between two tick counts over `elapsed_secs`, as a ratio of one core.
pub fn cpu_utilization(
    before_ticks: u64,
    after_ticks: u64,
    elapsed_secs: f64,
    ticks_per_second: f64,
) -> Option<f64> {
    if elapsed_secs <= 0.0 || ticks_per_second <= 0.0 {
        return None;
    }
    let used = after_ticks.saturating_sub(before_ticks) as f64 / ticks_per_second;
    Some(used / elapsed_secs)
}

/// Turns successive readings into usage, keeping the previous reading of each tracked PID.
#[derive(Debug)]
pub struct UsageTracker {
    proc_root: PathBuf,
    ticks_per_second: f64,
    page_size: u64,
    previous: FastMap<u32, (Instant, CpuReading)>,
}

impl UsageTracker {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Self {
            proc_root: proc_root.into(),
            // 100 is what Linux has exported to user space on every architecture.
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_size: if page > 0 { page as u64 } else { 4096 },
            previous: FastMap::default(),
        }
    }

    /// Usage of each of `pids` since the previous call: CPU is `None` on the first reading of a
    /// process (or of a reused PID); a process that is gone is absent. PIDs not passed are
    /// forgotten.
    pub fn sample(&mut self, pids: &[u32]) -> HashMap<u32, ProcessUsage> {
        let table = ProcessTable::scan_for(&self.proc_root, pids).unwrap_or_default();
        self.sample_table(pids, &table, Instant::now())
    }

    /// `sample` over a table already read, at a given moment (tests drive the clock).
    pub(crate) fn sample_table(
        &mut self,
        pids: &[u32],
        table: &ProcessTable,
        now: Instant,
    ) -> HashMap<u32, ProcessUsage> {
        let mut usage = HashMap::with_capacity(pids.len());
        let mut kept = FastMap::with_capacity_and_hasher(pids.len(), FastState::default());
        for &pid in pids {
            if table.stat(pid).is_none() {
                continue; // gone, or not visible from here
            }
            // Zombies and kernel threads have no memory: 0 pages, as `status` has no `VmRSS`.
            let rss = table
                .stat(pid)
                .filter(|s| s.rss_pages > 0)
                .map(|s| s.rss_pages.saturating_mul(self.page_size));
            let Some(reading) = table.reading(pid, rss) else {
                continue;
            };
            let mut entry = ProcessUsage {
                memory_rss_bytes: reading.rss_bytes,
                ..ProcessUsage::default()
            };
            if let Some((then, before)) = self.previous.get(&pid) {
                if before.start_time_ticks == reading.start_time_ticks {
                    let elapsed = now.saturating_duration_since(*then).as_secs_f64();
                    entry.cpu_utilization = cpu_utilization(
                        before.own_ticks,
                        reading.own_ticks,
                        elapsed,
                        self.ticks_per_second,
                    );
                    entry.tree_cpu_utilization = cpu_utilization(
                        before.tree_ticks,
                        reading.tree_ticks,
                        elapsed,
                        self.ticks_per_second,
                    );
                }
            }
            usage.insert(pid, entry);
            kept.insert(pid, (now, reading));
        }
        self.previous = kept;
        usage
    }

    pub fn ticks_per_second(&self) -> f64 {
        self.ticks_per_second
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stat(ppid: u32, utime: u64, stime: u64, cutime: u64, start: u64) -> Stat {
        Stat {
            comm: "x".into(),
            state: 'S',
            ppid,
            utime_ticks: utime,
            stime_ticks: stime,
            cutime_ticks: cutime,
            cstime_ticks: 0,
            start_time_ticks: start,
            num_threads: 1,
            rss_pages: 10,
        }
    }

    #[test]
    fn utilisation_ratio() {
        assert_eq!(cpu_utilization(100, 300, 2.0, 100.0), Some(1.0));
        assert_eq!(cpu_utilization(100, 150, 1.0, 100.0), Some(0.5));
        // Counters that went backwards read as idle, not negative.
        assert_eq!(cpu_utilization(300, 100, 1.0, 100.0), Some(0.0));
        assert_eq!(cpu_utilization(0, 100, 0.0, 100.0), None);
    }

    fn write_stat(root: &Path, pid: u32, ppid: u32) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let line = format!(
            "{pid} (python3) S {ppid} {pid} {pid} 0 -1 4194304 100 0 0 0 250 50 5 1 20 0 4 0 \
             12345 1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        );
        std::fs::write(dir.join("stat"), line).unwrap();
    }

    #[test]
    fn scan_for_reads_all_of_proc_only_when_a_pid_is_visible() {
        let root = tempfile::tempdir().unwrap();
        write_stat(root.path(), 10, 1);
        write_stat(root.path(), 11, 10);
        write_stat(root.path(), 12, 1);

        let table = ProcessTable::scan_for(root.path(), &[10]).unwrap();
        assert_eq!(table.tree(10), vec![10, 11], "the child is found by ppid");
        assert!(table.stat(12).is_some(), "a full scan");

        // A single-threaded process (field 20 is 1) in a copy without `task/` directories:
        // its main thread's `children` file is missing, so the walk gives up for the full scan.
        let single = root.path().join("20");
        std::fs::create_dir_all(&single).unwrap();
        std::fs::write(
            single.join("stat"),
            "20 (python3) S 1 20 20 0 -1 4194304 100 0 0 0 250 50 5 1 20 0 1 0 \
             12345 1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n",
        )
        .unwrap();
        write_stat(root.path(), 21, 20);
        let table = ProcessTable::scan_for(root.path(), &[20]).unwrap();
        assert_eq!(table.stat(20).map(|s| s.num_threads), Some(1));
        assert_eq!(
            table.tree(20),
            vec![20, 21],
            "the child is found by the full scan"
        );

        let invisible = ProcessTable::scan_for(root.path(), &[4242, 4343]).unwrap();
        assert!(
            invisible.stat(10).is_none(),
            "nothing to find: nothing read"
        );
        assert!(ProcessTable::scan_for(root.path(), &[])
            .unwrap()
            .stats
            .is_empty());

        let mut tracker = UsageTracker::new(root.path());
        let usage = tracker.sample(&[10, 4242]);
        assert!(usage.contains_key(&10));
        assert!(!usage.contains_key(&4242), "an invisible PID has no usage");
    }

    /// A real process tree (`sh` and two sleeping children, in their own process group).
    struct RealTree {
        sh: std::process::Child,
    }

    impl Drop for RealTree {
        fn drop(&mut self) {
            // SAFETY: kill(2) on our own child's process group; no memory is involved.
            unsafe { libc::kill(-(self.sh.id() as i32), libc::SIGKILL) };
            let _ = self.sh.wait();
        }
    }

    #[test]
    fn descendants_found_through_children_files_are_the_full_scans() {
        use std::os::unix::process::CommandExt;
        let proc_root = Path::new("/proc");
        let tree = RealTree {
            sh: std::process::Command::new("sh")
                .args(["-c", "sleep 60 & sleep 60 & wait"])
                .process_group(0)
                .spawn()
                .expect("spawn sh"),
        };
        let pid = tree.sh.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut full_tree = loop {
            let tree = ProcessTable::scan(proc_root).expect("scan /proc").tree(pid);
            if tree.len() == 3 || Instant::now() > deadline {
                break tree;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(full_tree.len(), 3, "sh and its two sleeps: {full_tree:?}");

        let walked = ProcessTable::scan_for(proc_root, &[pid]).expect("scan_for");
        let mut walked_tree = walked.tree(pid);
        walked_tree.sort_unstable();
        full_tree.sort_unstable();
        assert_eq!(walked_tree, full_tree);
        assert!(
            walked.stat(std::process::id()).is_some(),
            "the GPU process's parent (this test) is in the table for the parent check"
        );

        let children_file = proc_root.join(format!("{pid}/task/{pid}/children"));
        if children_file.exists() {
            // The tree and its parent, not every process on the host.
            assert_eq!(walked.stats.len(), 4, "{:?}", walked.stats.keys());
        } else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{} is missing: this kernel has no CONFIG_PROC_CHILDREN, so attribution reads \
                 every /proc/<pid>/stat each window (the fallback checked above)",
                children_file.display()
            );
        }
    }

    #[test]
    fn tree_sums_descendants_and_survives_cycles() {
        let mut table = ProcessTable::default();
        table.insert(10, stat(1, 100, 50, 0, 5));
        table.insert(11, stat(10, 30, 0, 0, 6));
        table.insert(12, stat(11, 20, 0, 0, 7));
        table.insert(99, stat(1, 1000, 0, 0, 8));
        // A cycle, as only a malformed tree can have.
        table.insert(20, stat(21, 1, 0, 0, 9));
        table.insert(21, stat(20, 1, 0, 0, 9));
        assert_eq!(table.tree(10), vec![10, 11, 12]);
        let reading = table
            .reading(10, Some(4096))
            .expect("pid 10 is in the table");
        assert_eq!(reading.own_ticks, 150);
        assert_eq!(reading.tree_ticks, 200);
        assert_eq!(table.tree(20).len(), 2);
        assert_eq!(table.reading(404, None), None);
    }

    #[test]
    fn tracker_turns_two_readings_into_utilisation() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut tracker = UsageTracker::new(dir.path());
        tracker.ticks_per_second = 100.0;
        let t0 = Instant::now();

        let mut first = ProcessTable::default();
        first.insert(10, stat(1, 100, 0, 0, 5));
        first.insert(11, stat(10, 100, 0, 0, 6));
        let usage = tracker.sample_table(&[10], &first, t0);
        assert_eq!(
            usage[&10].cpu_utilization, None,
            "first reading has no rate"
        );
        // RSS from stat's resident pages.
        assert_eq!(usage[&10].memory_rss_bytes, Some(10 * tracker.page_size));

        // 10 s later: the process used 5 s, its worker 10 s then exited and was reaped.
        let mut second = ProcessTable::default();
        second.insert(10, stat(1, 600, 0, 1100, 5));
        let usage = tracker.sample_table(&[10], &second, t0 + Duration::from_secs(10));
        let cpu = usage[&10]
            .cpu_utilization
            .expect("rate on the second reading");
        assert!((cpu - 0.5).abs() < 1e-9, "{cpu}");
        let tree = usage[&10].tree_cpu_utilization.expect("tree rate");
        assert!((tree - 1.5).abs() < 1e-9, "{tree}");

        // The PID is reused by another process: no rate against the old one.
        let mut third = ProcessTable::default();
        third.insert(10, stat(1, 5, 0, 0, 777));
        let usage = tracker.sample_table(&[10], &third, t0 + Duration::from_secs(20));
        assert_eq!(usage[&10].cpu_utilization, None);

        // Gone: absent, and forgotten.
        let usage = tracker.sample_table(
            &[10],
            &ProcessTable::default(),
            t0 + Duration::from_secs(30),
        );
        assert!(usage.is_empty());
        assert!(tracker.previous.is_empty());
    }
}
