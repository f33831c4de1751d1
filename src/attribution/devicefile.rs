//! The fallback when NVML's host PIDs are not visible under the procfs root (a sidecar that shares
//! only its pod's PID namespace): a local process holding `/dev/nvidia<minor>` open is the one
//! NVML lists on the device with that minor number, when the match is one-to-one.
//!
//! One-to-one means: on that device exactly one NVML process is not visible, and exactly one
//! local process (not itself a visible NVML process) holds the device file. Anything else —
//! two workers on one GPU, `nvidia-smi` running at the same moment — matches nothing, since a
//! wrong attribution is worse than none.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

use super::procfs::list_pids;

/// `N` when a file-descriptor link points at the GPU device file `/dev/nvidiaN` (not at
/// `nvidiactl`, `nvidia-uvm` or `nvidia-caps/...`).
pub(crate) fn nvidia_minor_of_link(target: &Path) -> Option<u32> {
    let digits = target.to_str()?.strip_prefix("/dev/nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What one scan of `<root>/*/fd/*` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeviceHolders {
    /// Minor number → local PIDs holding `/dev/nvidia<minor>` open.
    pub by_minor: BTreeMap<u32, BTreeSet<u32>>,
    /// Local processes whose `fd` directory exists but cannot be read (another uid, and no
    /// `CAP_SYS_PTRACE`): their device files are unknown, so they can never be matched.
    pub denied: BTreeSet<u32>,
}

/// Scans `<root>/*/fd/*` for device-file holders. Processes that are gone, or have no `fd`
/// directory, are skipped; those whose `fd` is not ours to read are counted in `denied`.
pub(crate) fn scan_device_holders(proc_root: &Path) -> DeviceHolders {
    let mut found = DeviceHolders::default();
    let Ok(pids) = list_pids(proc_root) else {
        return found;
    };
    for pid in pids {
        let fds = match std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) {
            Ok(fds) => fds,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    found.denied.insert(pid);
                }
                continue;
            }
        };
        for fd in fds.flatten() {
            if let Some(minor) = std::fs::read_link(fd.path())
                .ok()
                .and_then(|target| nvidia_minor_of_link(&target))
            {
                found.by_minor.entry(minor).or_default().insert(pid);
            }
        }
    }
    found
}

/// Pairs NVML PIDs that are not visible with local holders, one-to-one per device.
///
/// `invisible`: minor → NVML PIDs on that device not found under the root. `visible`: PIDs
/// resolved directly, which cannot be someone else's holder. Returns NVML PID → local PID.
pub(crate) fn match_one_to_one(
    invisible: &HashMap<u32, BTreeSet<u32>>,
    holders: &BTreeMap<u32, BTreeSet<u32>>,
    visible: &HashSet<u32>,
) -> HashMap<u32, u32> {
    // Candidate pairs per device, then keep those that agree across devices: one local process
    // on two GPUs must be the same NVML process on both, and the other way round.
    let mut locals_of: HashMap<u32, BTreeSet<u32>> = HashMap::new();
    let mut nvml_of: HashMap<u32, BTreeSet<u32>> = HashMap::new();
    for (minor, nvml_pids) in invisible {
        let [nvml_pid] = nvml_pids.iter().copied().collect::<Vec<_>>()[..] else {
            continue;
        };
        let candidates: Vec<u32> = holders
            .get(minor)
            .into_iter()
            .flatten()
            .copied()
            .filter(|pid| !visible.contains(pid))
            .collect();
        let [local_pid] = candidates[..] else {
            continue;
        };
        locals_of.entry(nvml_pid).or_default().insert(local_pid);
        nvml_of.entry(local_pid).or_default().insert(nvml_pid);
    }
    locals_of
        .into_iter()
        .filter_map(|(nvml_pid, locals)| {
            let [local_pid] = locals.into_iter().collect::<Vec<_>>()[..] else {
                return None;
            };
            let agrees = nvml_of.get(&local_pid).is_some_and(|n| n.len() == 1);
            agrees.then_some((nvml_pid, local_pid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_links() {
        assert_eq!(nvidia_minor_of_link(Path::new("/dev/nvidia0")), Some(0));
        assert_eq!(nvidia_minor_of_link(Path::new("/dev/nvidia17")), Some(17));
        for other in [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/nvidia",
            "/dev/null",
            "socket:[1234]",
        ] {
            assert_eq!(nvidia_minor_of_link(Path::new(other)), None, "{other}");
        }
    }

    fn set(items: &[u32]) -> BTreeSet<u32> {
        items.iter().copied().collect()
    }

    #[test]
    fn one_to_one_only() {
        let invisible = HashMap::from([
            (0, set(&[5000])),       // one NVML process, one holder: match
            (1, set(&[5001, 5002])), // two NVML processes: no
            (2, set(&[5003])),       // two local holders: no
            (3, set(&[5004])),       // no holder
            (4, set(&[5005])),       // its only holder is a visible NVML process
        ]);
        let holders = BTreeMap::from([
            (0, set(&[7])),
            (1, set(&[8])),
            (2, set(&[9, 10])),
            (4, set(&[42])),
        ]);
        let visible = HashSet::from([42]);
        let pairs = match_one_to_one(&invisible, &holders, &visible);
        assert_eq!(pairs, HashMap::from([(5000, 7)]));
    }

    #[test]
    fn one_local_process_cannot_be_two_nvml_processes() {
        let invisible = HashMap::from([(0, set(&[5000])), (1, set(&[5001]))]);
        let holders = BTreeMap::from([(0, set(&[7])), (1, set(&[7]))]);
        let pairs = match_one_to_one(&invisible, &holders, &HashSet::new());
        assert!(pairs.is_empty(), "{pairs:?}");
    }

    #[test]
    fn scan_reads_fd_links() {
        let root = tempfile::tempdir().expect("temp dir");
        let fd = root.path().join("31/fd");
        std::fs::create_dir_all(&fd).expect("mkdir");
        std::os::unix::fs::symlink("/dev/nvidia2", fd.join("5")).expect("symlink");
        std::os::unix::fs::symlink("/dev/nvidiactl", fd.join("6")).expect("symlink");
        std::fs::create_dir_all(root.path().join("32")).expect("mkdir without fd dir");
        let found = scan_device_holders(root.path());
        assert_eq!(found.by_minor, BTreeMap::from([(2, set(&[31]))]));
        assert!(found.denied.is_empty(), "{found:?}");
    }

    #[test]
    fn scan_counts_fd_directories_it_may_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("temp dir");
        let fd = root.path().join("40/fd");
        std::fs::create_dir_all(&fd).expect("mkdir");
        std::os::unix::fs::symlink("/dev/nvidia0", fd.join("3")).expect("symlink");
        std::fs::set_permissions(&fd, std::fs::Permissions::from_mode(0o000)).expect("chmod");
        // Root reads a mode-000 directory anyway (CAP_DAC_OVERRIDE): then the fd is found,
        // which is the "with the privilege" side of the same test.
        let readable = std::fs::read_dir(&fd).is_ok();
        let found = scan_device_holders(root.path());
        std::fs::set_permissions(&fd, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
        if readable {
            assert_eq!(found.by_minor, BTreeMap::from([(0, set(&[40]))]));
            assert!(found.denied.is_empty());
        } else {
            assert!(found.by_minor.is_empty(), "{found:?}");
            assert_eq!(found.denied, set(&[40]));
        }
    }
}
