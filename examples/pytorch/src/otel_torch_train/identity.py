"""Who this process is, named the way gpulse names the GPU process it sees from the host.

gpulse reads ``/proc/<host pid>/cgroup`` from the host; this module reads the same facts from
inside: ``/proc/self/cgroup`` first and, when a private cgroup namespace hides the path (cgroup v2
with Docker or containerd, where the file just says ``0::/``), ``/proc/self/mountinfo``. The rules
for a cgroup path are gpulse's, so both sides derive the same ``container.id`` from the same path:

* Docker: ``/docker/<id>`` (cgroupfs driver) or ``docker-<id>.scope`` (systemd driver);
* containerd (CRI): ``cri-containerd-<id>.scope``;
* CRI-O: ``crio-<id>.scope`` or ``crio-<id>``, never ``crio-conmon-<id>`` (the monitor process);
* Podman: ``libpod-<id>.scope`` or ``libpod-<id>``, never ``libpod-conmon-<id>``;
* a bare 64-hex segment: under ``kubepods`` (cgroupfs driver) it is containerd's, since CRI-O
  prefixes its cgroups and dockershim is gone; elsewhere (``/ecs/<task>/<id>``...) the runtime
  is not named;
* ``k8s.pod.uid`` from a ``pod<uid>`` segment, with ``_`` turned back into ``-`` (systemd driver).

The deepest matching segment wins (Docker-in-Docker names the inner container last).

In mountinfo, the files a runtime bind-mounts into the container (``/etc/hostname``,
``/etc/hosts``, ``/etc/resolv.conf``, ``/run/.containerenv``) come from a per-container directory:
``.../containers/<id>/`` for Docker, ``.../overlay-containers/<id>/userdata/`` for Podman. Inside a
Kubernetes pod those files belong to the pod sandbox (the pause container), not to this container,
so there the id is not taken from them; the pod uid is (``/var/lib/kubelet/pods/<uid>/etc-hosts``),
and the join then falls back on ``k8s.pod.uid``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
# Runtime prefixes as they appear in a cgroup segment; conmon scopes do not match because the
# 64 hex digits must follow the prefix directly.
_PREFIXED = re.compile(
    r"^(?P<prefix>docker|cri-containerd|crio|libpod)-(?P<id>[0-9a-fA-F]{64})(?:\.scope)?$"
)
_RUNTIME_BY_PREFIX = {
    "docker": "docker",
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "libpod": "podman",
}
# Pod UIDs are RFC 4122 UUIDs, except static (mirror) pods whose uid is a 32-hex hash.
_POD = re.compile(
    r"(?:^|-)pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
)
_KUBELET_POD_DIR = re.compile(
    r"/kubelet/pods/(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|[0-9a-f]{32})/"
)
_RUNTIME_FILES = frozenset(
    {"/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/run/.containerenv"}
)
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class ContainerIdentity:
    """What the cgroup and mount tables say about the container this process runs in.

    Every field is ``None`` when it could not be found: a process on the bare host has none.
    """

    container_id: Optional[str] = None
    #: docker, containerd, cri-o, podman; ``None`` when the path does not say (bare 64-hex id).
    runtime: Optional[str] = None
    pod_uid: Optional[str] = None
    #: ``"cgroup"`` or ``"mountinfo"``: which file gave the container id.
    source: Optional[str] = None


@dataclass(frozen=True)
class _PathMatch:
    container_id: Optional[str]
    runtime: Optional[str]
    pod_uid: Optional[str]


def parse_cgroup_path(path: str) -> _PathMatch:
    """Container id, runtime and pod uid named by one cgroup path (``/kubepods.slice/...``)."""
    container_id = runtime = pod_uid = None
    under_kubepods = False
    previous = ""
    for segment in path.split("/"):
        if not segment:
            continue
        if segment.startswith("kubepods"):
            under_kubepods = True
        pod = _POD.search(segment)
        if pod:
            pod_uid = pod.group("uid").replace("_", "-")
        prefixed = _PREFIXED.match(segment)
        if prefixed:
            container_id = prefixed.group("id").lower()
            runtime = _RUNTIME_BY_PREFIX[prefixed.group("prefix")]
        elif _HEX64.match(segment):
            container_id = segment.lower()
            if previous == "docker":
                runtime = "docker"
            elif under_kubepods:
                runtime = "containerd"
            else:
                runtime = None
        previous = segment
    return _PathMatch(container_id, runtime, pod_uid)


def parse_cgroup(text: str) -> ContainerIdentity:
    """Read ``/proc/<pid>/cgroup`` text (v1 ``id:controllers:path`` lines or the v2 ``0::path``).

    The first line naming a container wins; v1 lists one line per hierarchy and they agree.
    """
    container_id = runtime = pod_uid = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        match = parse_cgroup_path(parts[2])
        if pod_uid is None and match.pod_uid:
            pod_uid = match.pod_uid
        if container_id is None and match.container_id:
            container_id, runtime = match.container_id, match.runtime
    return ContainerIdentity(
        container_id=container_id,
        runtime=runtime,
        pod_uid=pod_uid,
        source="cgroup" if container_id else None,
    )


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class _Mount:
    root: str
    mount_point: str
    fs_type: str


def _parse_mountinfo_lines(text: str) -> Iterable[_Mount]:
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields = head.split(" ")
        after = tail.split(" ")
        if len(fields) < 5 or not after:
            continue
        yield _Mount(_unescape(fields[3]), _unescape(fields[4]), after[0])


def _id_after(segments: list, names: tuple) -> Optional[str]:
    found = None
    for before, segment in zip(segments, segments[1:]):
        if before in names and _HEX64.match(segment):
            found = segment.lower()
    return found


def parse_mountinfo(text: str) -> ContainerIdentity:
    """Read ``/proc/<pid>/mountinfo`` text; see the module docs for which mounts count."""
    mounts = list(_parse_mountinfo_lines(text))
    pod_uid = None
    for mount in mounts:
        kubelet = _KUBELET_POD_DIR.search(mount.root)
        if kubelet:
            pod_uid = kubelet.group("uid")
            break

    # A cgroup mount's root is the cgroup path when no cgroup namespace hides it (cgroup v1).
    for mount in mounts:
        if mount.fs_type in ("cgroup", "cgroup2"):
            match = parse_cgroup_path(mount.root)
            if pod_uid is None and match.pod_uid:
                pod_uid = match.pod_uid
            if match.container_id:
                return ContainerIdentity(match.container_id, match.runtime, pod_uid, "mountinfo")

    if pod_uid is not None:
        # In a pod the runtime files are the sandbox's: an id from them would name the pause
        # container and join with nothing.
        return ContainerIdentity(pod_uid=pod_uid)

    for mount in mounts:
        if mount.mount_point not in _RUNTIME_FILES:
            continue
        segments = mount.root.split("/")
        podman = _id_after(segments, ("overlay-containers",))
        if podman:
            return ContainerIdentity(podman, "podman", None, "mountinfo")
        docker = _id_after(segments, ("containers",))
        if docker:
            return ContainerIdentity(docker, "docker", None, "mountinfo")
    return ContainerIdentity()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        # Not Linux, or a hardened /proc: no container identity, which is not an error.
        return ""


def detect_container(proc_root: str = "/proc", pid: str = "self") -> ContainerIdentity:
    """The container identity of ``pid`` (this process by default) under ``proc_root``.

    ``proc_root`` is injectable so tests can point it at a tree they wrote.
    """
    base = Path(proc_root) / pid
    from_cgroup = parse_cgroup(_read(base / "cgroup"))
    if from_cgroup.container_id:
        return from_cgroup
    from_mounts = parse_mountinfo(_read(base / "mountinfo"))
    return ContainerIdentity(
        container_id=from_mounts.container_id,
        runtime=from_mounts.runtime,
        pod_uid=from_cgroup.pod_uid or from_mounts.pod_uid,
        source=from_mounts.source,
    )
