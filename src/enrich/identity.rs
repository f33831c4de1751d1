//! Which GPU process sent a span: the span's resource (`container.id`, `process.pid`,
//! `process.vpid`, `service.instance.id`) matched against what gpulse knows of the PIDs in its
//! history. A match must be unique; anything ambiguous is no match, since GPU figures of the
//! wrong process are worse than none. The connection's peer (`peer`) is the fallback the caller
//! tries next.
//!
//! Rules, first that decides wins:
//! 1. `container.id` given: the processes in that container; with `process.vpid` (else
//!    `process.pid`) given, the one whose PID-namespace PID it is, else the container's only GPU
//!    process.
//! 2. `process.vpid`/`process.pid` given: a process whose host PID or PID-namespace PID it is.
//! 3. `service.instance.id` given: the process whose own `OTEL_RESOURCE_ATTRIBUTES` set it.

use std::path::Path;

use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::sample_history::{ProcessIdentity, SampleHistory, SampleHistoryHandle};
use crate::attribution::parse_cgroup;
use crate::attribution::procfs::ProcDir;
use crate::schema::attribute_keys::{CONTAINER_ID, PROCESS_PID, PROCESS_VPID, SERVICE_INSTANCE_ID};

/// The identifying attributes of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResourceKey {
    pub container_id: Option<String>,
    pub pid: Option<u32>,
    pub vpid: Option<u32>,
    pub service_instance_id: Option<String>,
}

impl ResourceKey {
    pub(crate) fn of(resource: Option<&Resource>) -> Self {
        let mut key = Self::default();
        for kv in resource.map_or(&[][..], |r| &r.attributes) {
            match kv.key.as_str() {
                CONTAINER_ID => key.container_id = string(kv).map(|s| s.to_ascii_lowercase()),
                PROCESS_PID => key.pid = int(kv),
                PROCESS_VPID => key.vpid = int(kv),
                SERVICE_INSTANCE_ID => key.service_instance_id = string(kv),
                _ => {}
            }
        }
        key
    }
}

fn string(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn int(kv: &KeyValue) -> Option<u32> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => u32::try_from(*i).ok(),
        // Some SDKs and hand-written OTEL_RESOURCE_ATTRIBUTES give the PID as a string.
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The outcome of matching a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// Exactly this host PID.
    Pid(u32),
    /// Several processes fit; none is chosen.
    Ambiguous,
    /// No process fits, or the resource names none.
    None,
}

/// Matches `key` against the identities known to `history`.
pub(crate) fn match_resource(history: &SampleHistory, key: &ResourceKey) -> Match {
    let unique = |candidates: Vec<u32>| match candidates.as_slice() {
        [] => Match::None,
        [one] => Match::Pid(*one),
        _ => Match::Ambiguous,
    };
    let process_pid = key.vpid.or(key.pid);
    if let Some(container) = &key.container_id {
        let in_container: Vec<(u32, &ProcessIdentity)> = history
            .identities()
            .filter(|(_, id)| id.container_id.as_deref() == Some(container.as_str()))
            .collect();
        if !in_container.is_empty() {
            return match process_pid {
                Some(p) => unique(
                    in_container
                        .iter()
                        .filter(|(_, id)| id.vpid == Some(p))
                        .map(|(pid, _)| *pid)
                        .collect(),
                ),
                None => unique(in_container.iter().map(|(pid, _)| *pid).collect()),
            };
        }
    }
    if let Some(p) = process_pid {
        let mut candidates: Vec<u32> = history
            .identities()
            .filter(|(pid, id)| *pid == p || id.vpid == Some(p))
            .map(|(pid, _)| pid)
            .collect();
        // A host PID with no identity yet still names itself.
        if candidates.is_empty() && history.knows(p) && key.container_id.is_none() {
            candidates.push(p);
        }
        match unique(candidates) {
            Match::None => {}
            decided => return decided,
        }
    }
    if let Some(instance) = &key.service_instance_id {
        return unique(
            history
                .identities()
                .filter(|(_, id)| id.service_instance_id.as_deref() == Some(instance.as_str()))
                .map(|(pid, _)| pid)
                .collect(),
        );
    }
    Match::None
}

/// Fills in, from procfs, the identity of history PIDs that attribution has not named yet (a
/// span can arrive before the first export window is attributed). Reads two small files per
/// new PID; done off the async threads by the caller.
pub(crate) fn identify_new(history: &SampleHistoryHandle, proc_root: &Path) {
    let pids = history.read().unidentified();
    if pids.is_empty() {
        return;
    }
    let found: Vec<(u32, ProcessIdentity)> = pids
        .into_iter()
        .map(|pid| {
            let dir = ProcDir::new(proc_root, pid);
            // A PID that cannot be read (not visible here, exited) is remembered as known but
            // unnamed, so that it is not read again with every request.
            let identity = match dir.status() {
                Ok(status) => ProcessIdentity {
                    vpid: status.vpid(),
                    container_id: dir
                        .read_to_string("cgroup")
                        .ok()
                        .and_then(|c| parse_cgroup(&c).container_id)
                        .map(|c| c.to_ascii_lowercase()),
                    service_instance_id: None,
                },
                Err(_) => ProcessIdentity::default(),
            };
            (pid, identity)
        })
        .collect();
    let mut writer = history.write();
    for (pid, identity) in found {
        writer.note_identity(pid, identity);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use opentelemetry_proto::tonic::common::v1::AnyValue;

    use super::*;
    use crate::enrich::sample_history::tests::{device, process, snapshot};

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn history() -> SampleHistory {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        h.record(&snapshot(
            100,
            vec![device("GPU-a", 0.5, 10.0)],
            vec![
                process(1001, "GPU-a", 1, None),
                process(1002, "GPU-a", 1, None),
                process(1003, "GPU-a", 1, None),
                process(1004, "GPU-a", 1, None),
            ],
        ));
        let id = |vpid, container: Option<&str>, instance: Option<&str>| ProcessIdentity {
            vpid: Some(vpid),
            container_id: container.map(String::from),
            service_instance_id: instance.map(String::from),
        };
        h.note_identity(1001, id(7, Some("aaaa"), None));
        h.note_identity(1002, id(8, Some("aaaa"), Some("trainer-0")));
        h.note_identity(1003, id(7, Some("bbbb"), None));
        h
    }

    fn key(container: Option<&str>, pid: Option<u32>, instance: Option<&str>) -> ResourceKey {
        ResourceKey {
            container_id: container.map(String::from),
            pid,
            vpid: None,
            service_instance_id: instance.map(String::from),
        }
    }

    #[test]
    fn resource_attributes_are_read_whatever_their_type() {
        let resource = Resource {
            attributes: vec![
                kv("container.id", Value::StringValue("ABCD".into())),
                kv("process.pid", Value::IntValue(12)),
                kv("process.vpid", Value::StringValue("13".into())),
                kv("process.owner", Value::StringValue("me".into())),
            ],
            ..Default::default()
        };
        let k = ResourceKey::of(Some(&resource));
        assert_eq!(k.container_id.as_deref(), Some("abcd"));
        assert_eq!((k.pid, k.vpid), (Some(12), Some(13)));
        assert_eq!(ResourceKey::of(None), ResourceKey::default());
    }

    #[test]
    fn container_and_pid_pick_one_process() {
        let h = history();
        assert_eq!(
            match_resource(&h, &key(Some("aaaa"), Some(7), None)),
            Match::Pid(1001)
        );
        assert_eq!(
            match_resource(&h, &key(Some("bbbb"), Some(7), None)),
            Match::Pid(1003)
        );
        // Two processes in the container and no PID: no guess.
        assert_eq!(
            match_resource(&h, &key(Some("aaaa"), None, None)),
            Match::Ambiguous
        );
        assert_eq!(
            match_resource(&h, &key(Some("bbbb"), None, None)),
            Match::Pid(1003)
        );
        assert_eq!(
            match_resource(&h, &key(Some("aaaa"), Some(9), None)),
            Match::None
        );
    }

    #[test]
    fn a_pid_alone_must_be_unique() {
        let h = history();
        // vpid 7 exists in two containers.
        assert_eq!(
            match_resource(&h, &key(None, Some(7), None)),
            Match::Ambiguous
        );
        assert_eq!(
            match_resource(&h, &key(None, Some(8), None)),
            Match::Pid(1002)
        );
        // A host PID (same PID namespace as gpulse), even without an identity yet.
        assert_eq!(
            match_resource(&h, &key(None, Some(1004), None)),
            Match::Pid(1004)
        );
        assert_eq!(
            match_resource(&h, &key(None, Some(5555), None)),
            Match::None
        );
    }

    #[test]
    fn service_instance_id_is_the_last_resort() {
        let h = history();
        assert_eq!(
            match_resource(&h, &key(None, None, Some("trainer-0"))),
            Match::Pid(1002)
        );
        assert_eq!(
            match_resource(&h, &key(None, None, Some("other"))),
            Match::None
        );
        assert_eq!(match_resource(&h, &ResourceKey::default()), Match::None);
    }

    #[test]
    fn new_pids_are_identified_from_procfs() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("1004");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("status"), "Name:\tpython\nNSpid:\t1004\t31\n").unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/system.slice/docker-{}.scope\n", "c".repeat(64)),
        )
        .unwrap();
        let handle = SampleHistoryHandle::new(Duration::from_secs(600), Duration::from_secs(1));
        handle.record(&snapshot(
            100,
            vec![device("GPU-a", 0.5, 10.0)],
            vec![
                process(1004, "GPU-a", 1, None),
                process(1005, "GPU-a", 1, None),
            ],
        ));
        identify_new(&handle, root.path());
        let h = handle.read();
        let mut found: Vec<_> = h.identities().collect();
        found.sort_by_key(|(pid, _)| *pid);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, 1004);
        assert_eq!(found[0].1.vpid, Some(31));
        assert_eq!(
            found[0].1.container_id.as_deref(),
            Some("c".repeat(64).as_str())
        );
        // Unreadable: known, unnamed, and not read again.
        assert_eq!(found[1], (1005, &ProcessIdentity::default()));
        assert!(h.unidentified().is_empty());
    }
}
