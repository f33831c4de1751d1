//! What procfs says about one process, and the per-PID cache that keeps it: a PID seen before
//! costs one read of its `stat` (its start time tells whether it is still the same process);
//! a new or reused PID is read in full (`stat`, `status`, the `exe` link, `cgroup`, `environ`
//! when allowed, `cmdline` when asked, the owner's name from `passwd`, re-read at most once a
//! minute). A process that exits keeps its cached identity for the window that still reports
//! it. The `Attributor` decides which PIDs to look up and what to do with the answers.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use super::cgroup::{parse_cgroup, CgroupIdentity};
use super::environ::{resolve_identity, scan_environ, OtelIdentity};
use super::procfs::{
    creation_time, executable_name, parse_boot_time, parse_cmdline, parse_passwd, ProcDir, Stat,
};
use super::settings::AttributionSettings;
use super::workload::{AttributionMethod, IdentitySource, Workload};
use crate::fast_map::FastMap;

/// How often the `passwd` database is re-read, at most (only when a new process needs it).
const PASSWD_MAX_AGE: Duration = Duration::from_secs(60);

/// What procfs said about a process; pod names are not part of it (they come fresh each time).
#[derive(Debug, Clone)]
pub(super) struct ProcessIdentity {
    pub(super) vpid: Option<u32>,
    /// When the process started (`process.creation.time`), from its `stat` and the boot time.
    pub(super) creation_time: Option<SystemTime>,
    pub(super) executable_name: Option<String>,
    pub(super) owner: Option<String>,
    pub(super) command_line: Option<String>,
    pub(super) cgroup: Option<CgroupIdentity>,
    pub(super) otel: OtelIdentity,
}

#[derive(Debug)]
pub(super) struct CacheEntry {
    pub(super) start_time_ticks: u64,
    pub(super) identity: ProcessIdentity,
    pub(super) generation: u64,
}

/// The result of looking one PID up.
pub(super) enum Lookup<'a> {
    Found(&'a ProcessIdentity),
    /// Not under the root (another PID namespace, or gone before we looked).
    NotVisible,
    /// There but not readable (hidepid, permissions).
    Unreadable,
}

#[derive(Debug, Default)]
pub(super) struct Passwd {
    pub(super) users: HashMap<u32, String>,
    pub(super) loaded_at: Option<Instant>,
}

pub(super) fn workload_of(
    pid: u32,
    identity: &ProcessIdentity,
    method: AttributionMethod,
) -> Workload {
    let cgroup = identity.cgroup.clone().unwrap_or_default();
    Workload {
        pid,
        vpid: identity.vpid,
        creation_time: identity.creation_time,
        executable_name: identity.executable_name.clone(),
        owner: identity.owner.clone(),
        command_line: identity.command_line.clone(),
        container_id: cgroup.container_id,
        container_runtime: cgroup.runtime.map(|r| r.as_str().to_string()),
        pod_uid: cgroup.pod_uid,
        pod_name: None,
        namespace_name: None,
        container_name: None,
        service_name: identity.otel.service_name.clone(),
        identity_source: if identity.otel.service_name.is_some()
            || !identity.otel.resource_attributes.is_empty()
            || identity.otel.rank.is_some()
        {
            IdentitySource::Environment
        } else {
            IdentitySource::Default
        },
        resource_attributes: identity.otel.resource_attributes.clone(),
        job_id: identity.otel.job.as_ref().map(|job| job.id.clone()),
        job_id_source: identity.otel.job.as_ref().map(|job| job.source),
        rank: identity.otel.rank,
        attributed_by: method,
    }
}

/// Finds `pid` in `cache`, re-reading it when it is new or its start time changed; the flag
/// says whether it was read in full this time. `known` is its `stat` when the window's
/// process table already read it.
pub(super) fn lookup<'c>(
    cache: &'c mut FastMap<u32, CacheEntry>,
    passwd: &mut Passwd,
    settings: &AttributionSettings,
    generation: u64,
    pid: u32,
    known: Option<&Stat>,
) -> (Lookup<'c>, bool) {
    // Every window, for every process that stays, the table's `stat` confirms the cached
    // identity: it is borrowed, and the process's directory is only named when something must
    // be read.
    let dir = || ProcDir::new(&settings.proc_root, pid);
    let read = match known {
        Some(stat) => Ok(Some(Cow::Borrowed(stat))),
        None => dir().stat().map(|stat| stat.map(Cow::Owned)),
    };
    let stat = match read {
        Ok(Some(stat)) => stat,
        Ok(None) => {
            return (
                keep_cached(cache, generation, pid, Lookup::NotVisible),
                false,
            )
        }
        Err(error) if is_gone(&error) => {
            return (
                keep_cached(cache, generation, pid, Lookup::NotVisible),
                false,
            )
        }
        Err(_) => {
            return (
                keep_cached(cache, generation, pid, Lookup::Unreadable),
                false,
            )
        }
    };
    let fresh = cache
        .get(&pid)
        .is_some_and(|entry| entry.start_time_ticks == stat.start_time_ticks);
    if !fresh {
        let dir = dir();
        let identity = read_identity(pid, &dir, &stat, passwd, settings);
        // Reused between the first read and now: what was read may mix two processes.
        let still_same =
            matches!(dir.stat(), Ok(Some(now)) if now.start_time_ticks == stat.start_time_ticks);
        if !still_same {
            cache.remove(&pid);
            return (Lookup::NotVisible, true);
        }
        cache.insert(
            pid,
            CacheEntry {
                start_time_ticks: stat.start_time_ticks,
                identity,
                generation,
            },
        );
    }
    let found = match cache.get_mut(&pid) {
        Some(entry) => {
            entry.generation = generation;
            Lookup::Found(&entry.identity)
        }
        None => Lookup::NotVisible,
    };
    (found, !fresh)
}

/// A process that exited keeps its identity for the window that still reports it.
fn keep_cached<'c>(
    cache: &'c mut FastMap<u32, CacheEntry>,
    generation: u64,
    pid: u32,
    otherwise: Lookup<'static>,
) -> Lookup<'c> {
    match cache.get_mut(&pid) {
        Some(entry) => {
            entry.generation = generation;
            Lookup::Found(&entry.identity)
        }
        None => otherwise,
    }
}

/// `NotFound`, or `ESRCH` (a process that exited while its files were being opened).
fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH)
}

fn read_identity(
    pid: u32,
    dir: &ProcDir,
    stat: &Stat,
    passwd: &mut Passwd,
    settings: &AttributionSettings,
) -> ProcessIdentity {
    let status = dir.status().ok();
    let executable_name = dir
        .exe_target()
        .ok()
        .and_then(|target| executable_name(&target))
        .or_else(|| (!stat.comm.is_empty()).then(|| stat.comm.clone()))
        .or_else(|| status.as_ref().and_then(|s| s.name.clone()));
    let owner = status
        .as_ref()
        .and_then(|s| s.real_uid)
        .map(|uid| user_name(passwd, &settings.proc_root, uid));
    let command_line = if settings.include_command_line {
        dir.read("cmdline")
            .ok()
            .and_then(|bytes| parse_cmdline(&bytes))
    } else {
        None
    };
    let cgroup = dir
        .read_to_string("cgroup")
        .ok()
        .map(|text| parse_cgroup(&text));
    let otel = if settings.read_environ {
        // Permission denied is normal when not root: no identity, nothing to report.
        match dir.read("environ") {
            Ok(bytes) => {
                let identity = resolve_identity(&scan_environ(&bytes));
                if let Some(error) = &identity.attributes_error {
                    tracing::debug!(pid, %error, "ignoring the process's OTEL_RESOURCE_ATTRIBUTES");
                }
                identity
            }
            Err(_) => OtelIdentity::default(),
        }
    } else {
        OtelIdentity::default()
    };
    // Read for each new process only (an identity is cached by PID and start time).
    let boot_time = std::fs::read_to_string(settings.proc_root.join("stat"))
        .ok()
        .and_then(|text| parse_boot_time(&text));
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks_per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(0);
    ProcessIdentity {
        vpid: status.as_ref().and_then(|s| s.vpid()),
        creation_time: boot_time
            .and_then(|boot| creation_time(boot, stat.start_time_ticks, ticks_per_second)),
        executable_name,
        owner,
        command_line,
        cgroup,
        otel,
    }
}

/// The user name for `uid` from the host's `passwd` (`<root>/1/root/etc/passwd`, readable when
/// the root is the host's procfs and we may look into init's root), else ours (`/etc/passwd`);
/// the number itself when neither names it.
fn user_name(passwd: &mut Passwd, proc_root: &Path, uid: u32) -> String {
    let stale = passwd
        .loaded_at
        .is_none_or(|at| at.elapsed() >= PASSWD_MAX_AGE);
    if stale {
        let host = proc_root.join("1/root/etc/passwd");
        let text = std::fs::read_to_string(&host)
            .or_else(|_| std::fs::read_to_string("/etc/passwd"))
            .unwrap_or_default();
        passwd.users = parse_passwd(&text);
        passwd.loaded_at = Some(Instant::now());
    }
    passwd
        .users
        .get(&uid)
        .cloned()
        .unwrap_or_else(|| uid.to_string())
}
