//! How many CPUs a process's cgroup may use: cgroup v2 `cpu.max` (`"200000 100000"` is 2 CPUs,
//! `"max 100000"` no limit), or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (`-1`: no limit).
//! The effective limit is the smallest along the path up to the root, as the kernel applies it.
//! `input_bound`'s advice names it, so a user raising `num_workers` knows the ceiling.
//!
//! The paths are those `/proc/<pid>/cgroup` shows, looked up under gpulse's own cgroup mount: in
//! a container with a private cgroup namespace, processes outside it show paths with `..` and
//! their limit is unknown (mount the host's cgroup file system, or share the host's cgroup
//! namespace, for a DaemonSet to see it).
//!
//! Read only for the processes a rule asks about (those that sent step spans), and cached per
//! PID for [`CpuQuotas::TTL`]: a container's limit rarely changes, and re-reading it every
//! export window would cost a few file reads per process for nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Cached CPU limits by host PID.
#[derive(Debug)]
pub struct CpuQuotas {
    proc_root: PathBuf,
    cgroup_root: PathBuf,
    cache: HashMap<u32, (Instant, Option<f64>)>,
}

impl CpuQuotas {
    /// How long a PID's limit is reused before it is read again.
    pub const TTL: Duration = Duration::from_secs(60);

    /// `proc_root` is where `<pid>/cgroup` is read, `cgroup_root` where the cgroup file system
    /// is mounted (`/sys/fs/cgroup`).
    pub fn new(proc_root: impl Into<PathBuf>, cgroup_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            cgroup_root: cgroup_root.into(),
            cache: HashMap::new(),
        }
    }

    /// The CPUs `pid` may use, `None` when unlimited or unknown (not visible, no cgroup file).
    pub fn cores(&mut self, pid: u32) -> Option<f64> {
        let now = Instant::now();
        if let Some((at, cores)) = self.cache.get(&pid) {
            if now.duration_since(*at) < Self::TTL {
                return *cores;
            }
        }
        let cores = read_cores(&self.proc_root, &self.cgroup_root, pid);
        self.cache.insert(pid, (now, cores));
        cores
    }

    /// Forgets PIDs that are not in `pids` (exited processes).
    pub fn retain(&mut self, pids: &[u32]) {
        self.cache.retain(|pid, _| pids.contains(pid));
    }
}

fn read_cores(proc_root: &Path, cgroup_root: &Path, pid: u32) -> Option<f64> {
    let cgroup = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let mut limits: Vec<f64> = Vec::new();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path.split('/').any(|segment| segment == "..") {
            // Outside gpulse's own cgroup namespace: its cgroup file system does not show that
            // cgroup, and a path with `..` must not be followed out of the mount.
            continue;
        }
        if controllers.is_empty() {
            // cgroup v2: one unified hierarchy.
            limits.extend(along_path(&cgroup_root.to_path_buf(), path, read_v2));
        } else if controllers.split(',').any(|c| c == "cpu") {
            // cgroup v1: the cpu controller's hierarchy, mounted as `cpu,cpuacct` (or `cpu`).
            for mount in [controllers, "cpu,cpuacct", "cpu"] {
                let root = cgroup_root.join(mount);
                if root.is_dir() {
                    limits.extend(along_path(&root, path, read_v1));
                    break;
                }
            }
        }
    }
    limits.into_iter().reduce(f64::min)
}

/// The smallest limit from `path` up to the hierarchy's root.
fn along_path(root: &PathBuf, path: &str, read: fn(&Path) -> Option<f64>) -> Option<f64> {
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut found: Option<f64> = None;
    loop {
        if let Some(cores) = read(&dir) {
            found = Some(found.map_or(cores, |f| f.min(cores)));
        }
        if dir == *root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    found
}

fn read_v2(dir: &Path) -> Option<f64> {
    parse_cpu_max(&std::fs::read_to_string(dir.join("cpu.max")).ok()?)
}

/// The CPUs a cgroup v2 `cpu.max` (`"<quota> <period>"`, `max` for no limit) allows.
pub(crate) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: f64 = parts.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    Some(quota.parse::<f64>().ok()? / period)
}

fn read_v1(dir: &Path) -> Option<f64> {
    let value = |name| parse_cfs_value(&std::fs::read_to_string(dir.join(name)).ok()?);
    let quota = value("cpu.cfs_quota_us")?;
    let period = value("cpu.cfs_period_us")?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// The number in a cgroup v1 `cpu.cfs_quota_us` or `cpu.cfs_period_us`.
pub(crate) fn parse_cfs_value(text: &str) -> Option<f64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn v2_takes_the_smallest_limit_up_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cgroup"));
        write(&proc.join("10/cgroup"), "0::/kubepods/pod1/ctr\n");
        write(&cg.join("kubepods/pod1/ctr/cpu.max"), "max 100000\n");
        write(&cg.join("kubepods/pod1/cpu.max"), "250000 100000\n");
        write(&cg.join("kubepods/cpu.max"), "800000 100000\n");
        write(&proc.join("11/cgroup"), "0::/free\n");
        write(&proc.join("13/cgroup"), "0::/../../kubepods/pod1\n");
        write(&cg.join("free/cpu.max"), "max 100000\n");
        let mut q = CpuQuotas::new(&proc, &cg);
        assert_eq!(q.cores(10), Some(2.5));
        assert_eq!(q.cores(11), None, "no limit anywhere");
        assert_eq!(q.cores(12), None, "no such process");
        assert_eq!(q.cores(13), None, "outside the cgroup namespace: unknown");
        // Cached: a change is seen only after the TTL.
        write(&cg.join("kubepods/pod1/cpu.max"), "100000 100000\n");
        assert_eq!(q.cores(10), Some(2.5));
        q.retain(&[]);
        assert_eq!(q.cores(10), Some(1.0));
    }

    #[test]
    fn v1_reads_the_cfs_quota() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cgroup"));
        write(
            &proc.join("20/cgroup"),
            "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
        );
        write(
            &cg.join("cpu,cpuacct/docker/abc/cpu.cfs_quota_us"),
            "150000\n",
        );
        write(
            &cg.join("cpu,cpuacct/docker/abc/cpu.cfs_period_us"),
            "100000\n",
        );
        write(&cg.join("cpu,cpuacct/cpu.cfs_quota_us"), "-1\n");
        write(&cg.join("cpu,cpuacct/cpu.cfs_period_us"), "100000\n");
        assert_eq!(CpuQuotas::new(&proc, &cg).cores(20), Some(1.5));
    }
}
