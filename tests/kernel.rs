//! Helpers for tests on real kernel state: child processes, cgroups and PID namespaces that
//! are cleaned up even when an assertion fails.
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

/// Whether this process may create cgroups on both hierarchies the tests use.
pub fn cgroups_writable() -> bool {
    is_root()
        && Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        && Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists()
}
