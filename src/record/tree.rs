//! Which GPU processes belong to the recorded command: its own process and every descendant,
//! found by walking parent PIDs in procfs. Everything else NVML lists on the same GPUs is an
//! "other process" in the summary and the report.
//!
//! A process is identified by its PID and start time, so a PID reused after the command's
//! process exited is not taken for it. Answers are cached per identity: a descendant stays one
//! even after its parent dies and it is re-parented to init (a dataloader worker outliving its
//! launcher is still the command's).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::attribution::procfs::ProcDir;

/// How many parent links are followed before giving up; process trees are never this deep.
const MAX_DEPTH: usize = 128;

/// Classifies PIDs as inside or outside the command's process tree.
#[derive(Debug)]
pub(crate) struct CommandTree {
    proc_root: PathBuf,
    root_pid: u32,
    /// (pid, start time in ticks) → whether it descends from the root.
    known: HashMap<(u32, u64), bool>,
}

impl CommandTree {
    pub(crate) fn new(proc_root: impl Into<PathBuf>, root_pid: u32) -> Self {
        Self {
            proc_root: proc_root.into(),
            root_pid,
            known: HashMap::new(),
        }
    }

    /// Whether `pid` is the command or one of its descendants. A PID that cannot be read (gone,
    /// or not visible in this PID namespace) is not the command's: NVML lists host PIDs and a
    /// process gpulse cannot see cannot be shown to be a child of its own child.
    pub(crate) fn contains(&mut self, pid: u32) -> bool {
        if pid == self.root_pid {
            return true;
        }
        let Some(start) = self.start_time(pid) else {
            return false;
        };
        if let Some(known) = self.known.get(&(pid, start)) {
            return *known;
        }
        let answer = self.walk(pid);
        self.known.insert((pid, start), answer);
        answer
    }

    fn walk(&mut self, pid: u32) -> bool {
        let mut current = pid;
        for _ in 0..MAX_DEPTH {
            let Ok(Some(stat)) = ProcDir::new(&self.proc_root, current).stat() else {
                return false;
            };
            if stat.ppid == self.root_pid {
                return true;
            }
            if stat.ppid <= 1 {
                return false;
            }
            if let Some(start) = self.start_time(stat.ppid) {
                if let Some(known) = self.known.get(&(stat.ppid, start)) {
                    return *known;
                }
            }
            current = stat.ppid;
        }
        false
    }

    fn start_time(&self, pid: u32) -> Option<u64> {
        ProcDir::new(&self.proc_root, pid)
            .stat()
            .ok()
            .flatten()
            .map(|s| s.start_time_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A real shell with a real grandchild: both belong to the shell's tree, this test process
    /// and its parent do not.
    #[test]
    fn descendants_of_a_real_process_are_in_its_tree() {
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(shell.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: u32 = line
            .trim()
            .parse()
            .expect("the shell printed its child's PID");
        let mut tree = CommandTree::new("/proc", shell.id());
        assert!(tree.contains(shell.id()));
        assert!(
            tree.contains(grandchild),
            "sleep {grandchild} is the shell's child"
        );
        assert!(!tree.contains(std::process::id()));
        assert!(!tree.contains(1));
        // Cached answers survive the parent's death: the orphan is still the command's.
        unsafe { libc::kill(shell.id() as i32, libc::SIGKILL) };
        shell.wait().unwrap();
        assert!(tree.contains(grandchild));
        unsafe { libc::kill(grandchild as i32, libc::SIGKILL) };
    }

    #[test]
    fn an_unreadable_pid_is_not_the_commands() {
        let dir = tempfile::tempdir().unwrap();
        let mut tree = CommandTree::new(dir.path(), 100);
        assert!(tree.contains(100));
        assert!(!tree.contains(101));
    }

    /// A fake procfs: 300 → 200 → 100 (the root); 400 → 1.
    #[test]
    fn parent_links_are_followed_through_a_proc_root() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, ppid) in [(100, 50), (200, 100), (300, 200), (400, 1)] {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(
                p.join("stat"),
                format!("{pid} (x) S {ppid} 0 0 0 0 0 0 0 0 0 1 1 0 0 20 0 1 0 {pid}7 0 0\n"),
            )
            .unwrap();
        }
        let mut tree = CommandTree::new(dir.path(), 100);
        assert!(tree.contains(300));
        assert!(tree.contains(200));
        assert!(!tree.contains(400));
    }
}
