//! Helpers for tests on real kernel state: child processes, cgroups and PID namespaces that
//! are cleaned up even when an assertion fails, and the host's cgroup layout.
//!
//! Tests that need root are `#[ignore = "needs root ..."]`d, so an unprivileged
//! `cargo test` says so instead of passing without running them; `scripts/test` runs them as
//! root and always with `CI=true` (`--include-ignored`). Once running, they never skip: a
//! missing feature panics with what is missing ([`require_root`], [`require_cgroups`]).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed and reaped on drop, so no test leaves one behind.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Self)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Cgroup directories this test made, removed deepest first on drop (after the children in them
/// are gone: declare the guard before the children).
#[derive(Default)]
pub struct CgroupGuard(pub Vec<PathBuf>);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl CgroupGuard {
    /// Creates `base/relative` and each directory on the way, remembering the ones it made.
    pub fn create(&mut self, base: &Path, relative: &str) -> std::io::Result<PathBuf> {
        let mut dir = base.to_path_buf();
        for part in relative.split('/') {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir)?;
                self.0.push(dir.clone());
            }
        }
        Ok(dir)
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The host PID of the first child of `parent`, waiting a little for the fork to happen.
pub fn child_of(parent: u32) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Kills a process by PID on drop: a PID namespace's init ignores signals from outside it except
/// SIGKILL, and its `unshare` parent dying does not stop it.
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the PID is our descendant.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

/// Moves `pid` into the cgroup directory `dir`.
pub fn join_cgroup(dir: &Path, pid: u32) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())
}

/// Where this host mounts the cgroup hierarchies a container runtime writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The cgroup2 mount: `/sys/fs/cgroup` on a pure v2 host (most current distributions),
    /// `/sys/fs/cgroup/unified` on a hybrid one. `/proc/<pid>/cgroup` shows the `0::` path
    /// relative to it either way, which is what attribution reads.
    pub unified: PathBuf,
    /// The v1 memory hierarchy (Docker's cgroupfs driver writes `docker/<id>` there), on hybrid
    /// and legacy hosts only.
    pub v1_memory: Option<PathBuf>,
}

impl CgroupLayout {
    /// Reads the layout under `root` (`/sys/fs/cgroup` on a real host): pure v2 when `root`
    /// itself is a cgroup2 root (it has `cgroup.controllers`), hybrid when `root/unified` is.
    ///
    /// # Errors
    /// When no cgroup2 hierarchy is mounted there (a v1-only host), saying what was found.
    pub fn detect(root: &Path) -> Result<CgroupLayout, String> {
        let is_v2_root = |dir: &Path| dir.join("cgroup.controllers").is_file();
        let memory = root.join("memory");
        let v1_memory = memory.join("cgroup.procs").is_file().then_some(memory);
        if is_v2_root(root) {
            return Ok(CgroupLayout {
                unified: root.to_path_buf(),
                v1_memory: None,
            });
        }
        let unified = root.join("unified");
        if is_v2_root(&unified) {
            return Ok(CgroupLayout { unified, v1_memory });
        }
        Err(format!(
            "no cgroup2 hierarchy under {}: neither {} nor {} exists{}",
            root.display(),
            root.join("cgroup.controllers").display(),
            unified.join("cgroup.controllers").display(),
            if v1_memory.is_some() {
                " (only cgroup v1 is mounted)"
            } else {
                ""
            }
        ))
    }
}

/// Panics, saying why, unless this process is root.
pub fn require_root(to: &str) {
    assert!(
        is_root(),
        "this test must run as root to {to}; it is #[ignore]d for unprivileged runs (scripts/test \
         runs it as root and with CI=true)"
    );
}

/// The host's cgroup layout, checked to be writable: panics, saying what is missing, when it is
/// not (never skips).
pub fn require_cgroups() -> CgroupLayout {
    require_root("create cgroups");
    let layout = CgroupLayout::detect(Path::new("/sys/fs/cgroup"))
        .unwrap_or_else(|e| panic!("this test needs a cgroup2 hierarchy: {e}"));
    // Unique per call: tests of one process run in parallel threads and probe at the same time.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe = layout.unified.join(format!(
        "gpulse-test-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir(&probe)
        .and_then(|()| std::fs::remove_dir(&probe))
        .unwrap_or_else(|e| {
            panic!(
                "cannot create a cgroup under {} ({e}): a read-only /sys/fs/cgroup (a container \
                 without --privileged or --cgroupns=private?)",
                layout.unified.display()
            )
        });
    layout
}

#[test]
fn cgroup_layout_is_read_from_pure_v2_hybrid_and_v1_only_trees() {
    let touch = |path: PathBuf| {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, "").expect("write");
    };
    // Pure v2 (Debian 11+, Ubuntu 21.10+, Fedora 31+, RHEL 9): one hierarchy at the root.
    let pure = tempfile::tempdir().expect("temp dir");
    touch(pure.path().join("cgroup.controllers"));
    touch(pure.path().join("cgroup.procs"));
    assert_eq!(
        CgroupLayout::detect(pure.path()),
        Ok(CgroupLayout {
            unified: pure.path().to_path_buf(),
            v1_memory: None
        })
    );
    // Hybrid (systemd's default before v2): v1 controllers and cgroup2 at unified/.
    let hybrid = tempfile::tempdir().expect("temp dir");
    touch(hybrid.path().join("unified/cgroup.controllers"));
    touch(hybrid.path().join("memory/cgroup.procs"));
    assert_eq!(
        CgroupLayout::detect(hybrid.path()),
        Ok(CgroupLayout {
            unified: hybrid.path().join("unified"),
            v1_memory: Some(hybrid.path().join("memory"))
        })
    );
    // Hybrid without the memory controller mounted: still usable through cgroup2.
    std::fs::remove_dir_all(hybrid.path().join("memory")).expect("rm");
    assert_eq!(
        CgroupLayout::detect(hybrid.path()).map(|l| l.v1_memory),
        Ok(None)
    );
    // v1 only: no cgroup2 to write to, and the error says so.
    let legacy = tempfile::tempdir().expect("temp dir");
    touch(legacy.path().join("memory/cgroup.procs"));
    let err = CgroupLayout::detect(legacy.path()).unwrap_err();
    assert!(err.contains("only cgroup v1"), "{err}");
}

#[test]
fn this_hosts_cgroup_layout_is_detected_when_cgroup2_is_mounted() {
    // Checked against the kernel's own list of mounts, independently of the paths detect reads.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let cgroup2_mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    });
    let detected = CgroupLayout::detect(Path::new("/sys/fs/cgroup"));
    match cgroup2_mount {
        Some(mount) if mount.starts_with("/sys/fs/cgroup") => {
            assert_eq!(detected.map(|l| l.unified), Ok(mount));
        }
        _ => assert!(detected.is_err(), "{detected:?}"),
    }
}
