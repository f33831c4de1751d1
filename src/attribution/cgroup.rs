//! Container and pod identity from the text of `/proc/<pid>/cgroup`: a pure parser, no I/O.
//!
//! The kernel writes one line per hierarchy, `hierarchy-id:controllers:path` (cgroup v1 has many,
//! v2 a single `0::/path`; hybrid hosts have both). Container runtimes name the leaf cgroup after
//! the container, so the id is read from the path segments, deepest first:
//!
//! | segment | runtime |
//! | --- | --- |
//! | `docker-<id>.scope` (systemd driver), `/docker/<id>` (cgroupfs) | docker |
//! | `cri-containerd-<id>.scope`, a bare `<id>` under `kubepods` (cgroupfs driver) | containerd |
//! | `crio-<id>.scope`, `crio-<id>` (`crio-conmon-<id>` is the monitor, not the container) | cri-o |
//! | `libpod-<id>.scope` (`libpod-conmon-<id>` is the monitor) | podman |
//! | any other bare 64-hex segment | unknown runtime, id only |
//!
//! A bare id under `kubepods` is reported as containerd: dockershim left Kubernetes in 1.24 and
//! CRI-O prefixes its cgroups with `crio-` under both drivers, so in practice only containerd
//! leaves bare ids there.
//!
//! The pod UID comes from `kubepods-<qos>-pod<uid>.slice` (systemd driver: the UID's `-` are
//! written as `_`, turned back here) or a `pod<uid>` segment (cgroupfs driver). Lines that yield
//! nothing are skipped; the first line that names a container decides, so a v1 host where every
//! controller repeats the same path gives the same answer as a v2 host.

/// The container runtime whose naming scheme a cgroup path matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerRuntime {
    Docker,
    Containerd,
    CriO,
    Podman,
}

impl ContainerRuntime {
    /// The `container.runtime.name` value, as the semantic conventions spell the runtimes.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Docker => "docker",
            ContainerRuntime::Containerd => "containerd",
            ContainerRuntime::CriO => "cri-o",
            ContainerRuntime::Podman => "podman",
        }
    }
}

/// What a cgroup file says about the process's container and pod; all `None` for a host process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupIdentity {
    /// `container.id`: the runtime's 64-hex id.
    pub container_id: Option<String>,
    /// `container.runtime.name`, when the naming scheme tells it.
    pub runtime: Option<ContainerRuntime>,
    /// `k8s.pod.uid`, dashed form.
    pub pod_uid: Option<String>,
}

/// Parses the whole text of a `/proc/<pid>/cgroup` file. Never fails: text it does not
/// recognise simply yields no identity.
pub fn parse_cgroup(content: &str) -> CgroupIdentity {
    let mut found = CgroupIdentity::default();
    for line in content.lines() {
        let Some(path) = cgroup_path(line) else {
            continue;
        };
        let from_line = parse_cgroup_path(path);
        if found.container_id.is_none() && from_line.container_id.is_some() {
            found.container_id = from_line.container_id;
            found.runtime = from_line.runtime;
            // The pod of the line that named the container wins over one seen earlier.
            if from_line.pod_uid.is_some() {
                found.pod_uid = from_line.pod_uid;
            }
        } else if found.pod_uid.is_none() {
            found.pod_uid = from_line.pod_uid;
        }
        if found.container_id.is_some() && found.pod_uid.is_some() {
            break;
        }
    }
    found
}

/// The path part of one `id:controllers:path` line. The path itself may contain `:`.
fn cgroup_path(line: &str) -> Option<&str> {
    let mut parts = line.splitn(3, ':');
    let _hierarchy = parts.next()?;
    let _controllers = parts.next()?;
    let path = parts.next()?.trim_end();
    path.starts_with('/').then_some(path)
}

/// Identity named by one cgroup path (`/kubepods.slice/.../cri-containerd-<id>.scope`).
pub(crate) fn parse_cgroup_path(path: &str) -> CgroupIdentity {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let under_kubepods = segments.iter().any(|s| s.starts_with("kubepods"));
    let mut identity = CgroupIdentity {
        pod_uid: segments.iter().find_map(|s| pod_uid_of_segment(s)),
        ..CgroupIdentity::default()
    };
    // Deepest first: podman v2 puts the payload in `libpod-<id>.scope/container`, and docker in
    // docker in a nested `/docker/<outer>/docker/<inner>`, where the inner one is the process's.
    for (index, segment) in segments.iter().enumerate().rev() {
        let parent = index.checked_sub(1).map(|i| segments[i]);
        if let Some((id, runtime)) = container_of_segment(segment, parent, under_kubepods) {
            identity.container_id = Some(id.to_ascii_lowercase());
            identity.runtime = runtime;
            break;
        }
    }
    identity
}

/// Container id and runtime named by one path segment, given the segment above it.
fn container_of_segment<'a>(
    segment: &'a str,
    parent: Option<&str>,
    under_kubepods: bool,
) -> Option<(&'a str, Option<ContainerRuntime>)> {
    let stem = segment.strip_suffix(".scope").unwrap_or(segment);
    // Monitors that live next to the container but are not it: never report their id.
    if stem.starts_with("crio-conmon-") || stem.starts_with("libpod-conmon-") {
        return None;
    }
    const PREFIXES: [(&str, ContainerRuntime); 4] = [
        ("cri-containerd-", ContainerRuntime::Containerd),
        ("docker-", ContainerRuntime::Docker),
        ("crio-", ContainerRuntime::CriO),
        ("libpod-", ContainerRuntime::Podman),
    ];
    for (prefix, runtime) in PREFIXES {
        if let Some(id) = stem.strip_prefix(prefix) {
            return is_container_id(id).then_some((id, Some(runtime)));
        }
    }
    if !is_container_id(segment) {
        return None;
    }
    let runtime = if parent == Some("docker") {
        Some(ContainerRuntime::Docker)
    } else if under_kubepods {
        Some(ContainerRuntime::Containerd)
    } else {
        None
    };
    Some((segment, runtime))
}

/// Runtimes in scope all use 64 hex digits; requiring exactly that keeps ordinary slice names
/// (`user-1000.slice`, `session-3.scope`) from being taken for containers.
fn is_container_id(candidate: &str) -> bool {
    candidate.len() == 64 && candidate.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod UID named by one segment, dashed.
fn pod_uid_of_segment(segment: &str) -> Option<String> {
    if let Some(stem) = segment.strip_suffix(".slice") {
        // systemd driver: `kubepods-burstable-pod<uid_with_underscores>.slice`, also nested
        // (`kubelet-kubepods-besteffort-pod<uid>.slice` under kind).
        if !stem.contains("kubepods") {
            return None;
        }
        let (_, last) = stem.rsplit_once('-')?;
        let uid = last.strip_prefix("pod")?.replace('_', "-");
        return is_pod_uid(&uid).then_some(uid.to_ascii_lowercase());
    }
    // cgroupfs driver: `/kubepods/burstable/pod<uid>/<container>`.
    let uid = segment.strip_prefix("pod")?;
    is_pod_uid(uid).then(|| uid.to_ascii_lowercase())
}

/// A Kubernetes pod UID is an RFC 4122 UUID: 8-4-4-4-12 hex digits.
fn is_pod_uid(candidate: &str) -> bool {
    let bytes = candidate.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4b1c2d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";
    const ID2: &str = "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999";
    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const UID_UNDERSCORED: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";

    fn expect(
        content: &str,
        id: Option<&str>,
        runtime: Option<ContainerRuntime>,
        pod: Option<&str>,
    ) {
        let got = parse_cgroup(content);
        assert_eq!(
            got,
            CgroupIdentity {
                container_id: id.map(str::to_string),
                runtime,
                pod_uid: pod.map(str::to_string),
            },
            "cgroup content:\n{content}"
        );
    }

    /// cgroup file, expected container id, runtime, pod UID.
    type Case = (
        String,
        Option<&'static str>,
        Option<ContainerRuntime>,
        Option<&'static str>,
    );

    #[test]
    fn every_runtime_and_driver() {
        use ContainerRuntime::*;
        let cases: Vec<Case> = vec![
            // docker, cgroupfs driver, cgroup v1 (many controllers, same path)
            (
                format!("12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n"),
                Some(ID), Some(Docker), None,
            ),
            // docker, systemd driver, cgroup v2
            (format!("0::/system.slice/docker-{ID}.scope\n"), Some(ID), Some(Docker), None),
            // rootless docker under a user slice
            (
                format!("0::/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope\n"),
                Some(ID), Some(Docker), None,
            ),
            // containerd, kubelet systemd driver, cgroup v2
            (
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"),
                Some(ID), Some(Containerd), Some(UID),
            ),
            // guaranteed QoS pods have no QoS slice
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"),
                Some(ID), Some(Containerd), Some(UID),
            ),
            // containerd, cgroupfs driver, cgroup v1
            (
                format!("4:memory:/kubepods/burstable/pod{UID}/{ID}\n3:cpu:/kubepods/burstable/pod{UID}/{ID}\n"),
                Some(ID), Some(Containerd), Some(UID),
            ),
            // containerd, cgroupfs driver, besteffort, v2
            (format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"), Some(ID), Some(Containerd), Some(UID)),
            // cri-o, systemd driver
            (
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_UNDERSCORED}.slice/crio-{ID}.scope\n"),
                Some(ID), Some(CriO), Some(UID),
            ),
            // cri-o, cgroupfs driver
            (format!("0::/kubepods/burstable/pod{UID}/crio-{ID}\n"), Some(ID), Some(CriO), Some(UID)),
            // cri-o monitor: same pod, no container
            (
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_UNDERSCORED}.slice/crio-conmon-{ID}.scope\n"),
                None, None, Some(UID),
            ),
            // podman, v2, payload in a nested `container` group
            (format!("0::/machine.slice/libpod-{ID}.scope/container\n"), Some(ID), Some(Podman), None),
            // podman rootless
            (
                format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"),
                Some(ID), Some(Podman), None,
            ),
            // podman monitor
            (format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"), None, None, None),
            // kind: kubelet inside a container, nested slices
            (
                format!("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"),
                Some(ID), Some(Containerd), Some(UID),
            ),
            // docker in docker: the inner container is the process's
            (format!("0::/docker/{ID}/docker/{ID2}\n"), Some(ID2), Some(Docker), None),
            // bare id elsewhere: id known, runtime not
            (format!("0::/ecs/task/{ID}\n"), Some(ID), None, None),
            // hybrid host: v1 lines without container, v2 line with it
            (
                format!("2:cpu:/\n1:name=systemd:/\n0::/system.slice/docker-{ID}.scope\n"),
                Some(ID), Some(Docker), None,
            ),
            // upper-case hex is normalised
            (format!("0::/docker/{}\n", ID.to_ascii_uppercase()), Some(ID), Some(Docker), None),
            // host processes
            ("0::/\n".to_string(), None, None, None),
            ("0::/user.slice/user-1000.slice/session-3.scope\n".to_string(), None, None, None),
            ("12:memory:/system.slice/sshd.service\n0::/init.scope\n".to_string(), None, None, None),
        ];
        for (content, id, runtime, pod) in cases {
            expect(&content, id, runtime, pod);
        }
    }

    #[test]
    fn malformed_input_yields_nothing() {
        let cases = [
            "",
            "garbage",
            "0:",
            "0::",
            "0::relative/docker/abc",
            ":::::",
            // one hex digit short / long, non-hex
            &format!("0::/docker/{}", &ID[..63]),
            &format!("0::/docker/{ID}0"),
            &format!("0::/docker/{}g", &ID[..63]),
            // prefix without id
            "0::/system.slice/docker-.scope",
            "0::/system.slice/cri-containerd-xyz.scope",
            // `pod` followed by something that is not a UUID
            "0::/kubepods/burstable/podman/x",
            "0::/kubepods.slice/kubepods-burstable-podnot_a_uid.slice",
        ];
        for content in cases {
            expect(content, None, None, None);
        }
    }

    #[test]
    fn pod_uid_without_container_when_the_leaf_is_not_a_container() {
        // The pause/sandbox process under the systemd driver sits in a scope of its own.
        expect(
            &format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_UNDERSCORED}.slice\n"),
            None,
            None,
            Some(UID),
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(content in "\\PC*") {
            let _ = parse_cgroup(&content);
        }

        #[test]
        fn never_panics_on_cgroup_like_text(
            lines in proptest::collection::vec(
                "[0-9]{0,2}:[a-z,=]{0,12}:(/[a-z0-9_.@:-]{0,70}){0,6}",
                0..8,
            )
        ) {
            let content = lines.join("\n");
            let got = parse_cgroup(&content);
            if let Some(id) = got.container_id {
                proptest::prop_assert_eq!(id.len(), 64);
            }
        }
    }
}
