"""container.id and k8s.pod.uid from /proc/self/cgroup and /proc/self/mountinfo, per runtime."""

from __future__ import annotations

import pytest

from otel_torch_train.identity import (
    ContainerIdentity,
    detect_container,
    parse_cgroup,
    parse_mountinfo,
)

DOCKER_V1 = "2a759f8fac4d817ff2bc28c224d51c5030f915c0c14997110517984ca9aa8d0f"
DOCKER_V2 = "523c835670a5065bb35e0b537f4ab7fffdb6fa0d55b6d72d7b6bb4af0cf13045"
CONTAINERD = "2397d068a8d1552a4c3f9147ba9c94e086bfd66fb2acb5bbaf47197105127d5f"
CONTAINERD_V1 = "69d7ef3dffccbb999d4cef1516f2e4001e2d8dba96b0b9a2d3eaa71c6b5a9534"
CRIO = "c64064614423cb790e88b3e5492ff5ccf673b25ae823089f7a60c65cda24d809"
CRIO_CONMON = "4e367f78eaf4f16997334692e59f703955ebbb6321340b0b019522272c5a1e54"
PODMAN = "2f259bab93aaaaa2542ba43ef33eb990d0999ee1b9924b557b7be53c0b7a1bb9"
PODMAN_CONMON = "7228cec8886bbd8be02bd210bf9366f5e81b28d188dd0de09639eb5153573fb8"
PODMAN_V1 = "7610ee7b6c7446cf1ef0a7374a61bf6d6449d8ceec518b0c7f4b4463044a3074"
DIND_OUTER = "da15599c093481a92ee93fb9e4deee74036b6f5ec2ea7215bb4a3fe33dbb3d52"
DIND_INNER = "25437081047c7971d2f51245b48f1164f706d9c60766dccb09958fc914ad08f1"
STATIC = "2053dbbf6ec7135c4e994d3464c478db6f48d3ca21052c8f44915edc96e02c39"
DOCKERSHIM = "a8dc47c3a9abf70f452b6663ee8d663ac58124ea71e42ac56263b01186c4cfca"
MNT_DOCKER = "4a4996f29bbd421f22ed38088653aae3fdfad1565656133a8e6a023f5674eadf"
MNT_DOCKER_SEP = "adca017c4972fd3764601763883a74e85a9889db79a957716f1f4bc56d7cb17b"
MNT_PODMAN = "ece4a0532830d499d5e185a08a91140f7f0952dbb60acf10db9210413af1b8b3"
SANDBOX = "b7ad567477c83756aab9a542b2be04f77dbae25115d85f22070d74d8cc4779dc"
MNT_V1 = "51d713f61e683599f70935f82db28c890bad80a39fc37a3692b517faca4fda48"
CRIO_SANDBOX = "a18bfabd3cf1d74d0267b59ef276e9c1c94d4e31a9fb482340d884a4c4275b94"

POD = "7d1a8f0e-3c5b-4d2a-9e6f-0a1b2c3d4e5f"
POD_SYSTEMD = POD.replace("-", "_")
STATIC_POD = "6b4a8a5b3b1f7c8d9e0a1b2c3d4e5f6a"

CGROUP_CASES = {
    "docker, cgroup v1, cgroupfs driver": (
        f"12:hugetlb:/docker/{DOCKER_V1}\n"
        f"11:memory:/docker/{DOCKER_V1}\n"
        f"4:cpu,cpuacct:/docker/{DOCKER_V1}\n"
        f"1:name=systemd:/docker/{DOCKER_V1}\n"
        "0::/system.slice/containerd.service\n",
        ContainerIdentity(DOCKER_V1, "docker", None, "cgroup"),
    ),
    "docker, cgroup v2, systemd driver, host cgroupns": (
        f"0::/system.slice/docker-{DOCKER_V2}.scope\n",
        ContainerIdentity(DOCKER_V2, "docker", None, "cgroup"),
    ),
    "docker, cgroup v2, private cgroupns": ("0::/\n", ContainerIdentity()),
    "containerd, kubernetes, cgroup v2, systemd driver": (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD_SYSTEMD}.slice/cri-containerd-{CONTAINERD}.scope\n",
        ContainerIdentity(CONTAINERD, "containerd", POD, "cgroup"),
    ),
    "containerd, kubernetes, cgroup v1, cgroupfs driver (bare id)": (
        f"11:memory:/kubepods/besteffort/pod{POD}/{CONTAINERD_V1}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{POD}/{CONTAINERD_V1}\n",
        ContainerIdentity(CONTAINERD_V1, "containerd", POD, "cgroup"),
    ),
    "cri-o, kubernetes guaranteed pod, cgroup v2": (
        f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/crio-{CRIO}.scope\n",
        ContainerIdentity(CRIO, "cri-o", POD, "cgroup"),
    ),
    "cri-o monitor (conmon) is not the container": (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD_SYSTEMD}.slice/crio-conmon-{CRIO_CONMON}.scope\n",
        ContainerIdentity(None, None, POD, None),
    ),
    "podman rootless, cgroup v2, nested container group": (
        "0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
        f"libpod-{PODMAN}.scope/container\n",
        ContainerIdentity(PODMAN, "podman", None, "cgroup"),
    ),
    "podman monitor (conmon) is not the container": (
        f"0::/machine.slice/libpod-conmon-{PODMAN_CONMON}.scope\n",
        ContainerIdentity(),
    ),
    "podman, cgroup v1, cgroupfs manager": (
        f"3:memory:/libpod_parent/libpod-{PODMAN_V1}\n1:name=systemd:/libpod_parent/libpod-{PODMAN_V1}\n",
        ContainerIdentity(PODMAN_V1, "podman", None, "cgroup"),
    ),
    "docker in docker: the inner container": (
        f"11:memory:/docker/{DIND_OUTER}/docker/{DIND_INNER}\n",
        ContainerIdentity(DIND_INNER, "docker", None, "cgroup"),
    ),
    "kubernetes static pod (32-hex uid), cgroup v1": (
        f"9:pids:/kubepods/burstable/pod{STATIC_POD}/{STATIC}\n",
        ContainerIdentity(STATIC, "containerd", STATIC_POD, "cgroup"),
    ),
    "kubernetes with docker (dockershim), systemd driver": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/"
        f"docker-{DOCKERSHIM}.scope\n",
        ContainerIdentity(DOCKERSHIM, "docker", POD, "cgroup"),
    ),
    "a process on the host": (
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        ContainerIdentity(),
    ),
    "bare 64-hex outside kubepods (ECS): an id, runtime unnamed (as gpulse reads it)": (
        f"9:perf_event:/ecs/5a0d5ceb2a4b4b3f9a1e4c1c6e0b1d2f/{DOCKER_V2}\n",
        ContainerIdentity(DOCKER_V2, None, None, "cgroup"),
    ),
    "upper-case hex is lowered, as gpulse does": (
        f"0::/system.slice/docker-{DOCKER_V2.upper()}.scope\n",
        ContainerIdentity(DOCKER_V2, "docker", None, "cgroup"),
    ),
    "63 hex digits are not an id": (
        f"0::/system.slice/docker-{DOCKER_V2[:63]}.scope\n",
        ContainerIdentity(),
    ),
    "empty file (not Linux)": ("", ContainerIdentity()),
}


@pytest.mark.parametrize("text, expected", CGROUP_CASES.values(), ids=CGROUP_CASES.keys())
def test_parse_cgroup(text, expected):
    assert parse_cgroup(text) == expected


def _mount(mount_id, root, mount_point, fs_type="ext4", source="/dev/vda1"):
    return f"{mount_id} 1100 253:1 {root} {mount_point} rw,relatime - {fs_type} {source} rw\n"


OVERLAY_ROOT = (
    "1100 1000 0:52 / / rw,relatime master:1 - overlay overlay "
    "rw,lowerdir=/var/lib/docker/overlay2/l/ABC,upperdir=/var/lib/docker/overlay2/x/diff\n"
)
CGROUP2_NS = "1101 1100 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec - cgroup2 cgroup rw\n"

MOUNTINFO_CASES = {
    "docker, cgroup v2 private cgroupns: /etc/hostname from containers/<id>": (
        OVERLAY_ROOT
        + CGROUP2_NS
        + _mount(1102, f"/var/lib/docker/containers/{MNT_DOCKER}/resolv.conf", "/etc/resolv.conf")
        + _mount(1103, f"/var/lib/docker/containers/{MNT_DOCKER}/hostname", "/etc/hostname")
        + _mount(1104, f"/var/lib/docker/containers/{MNT_DOCKER}/hosts", "/etc/hosts"),
        ContainerIdentity(MNT_DOCKER, "docker", None, "mountinfo"),
    ),
    "docker with /var/lib/docker on its own filesystem": (
        OVERLAY_ROOT + _mount(1103, f"/containers/{MNT_DOCKER_SEP}/hostname", "/etc/hostname"),
        ContainerIdentity(MNT_DOCKER_SEP, "docker", None, "mountinfo"),
    ),
    "podman rootless: overlay-containers/<id>/userdata": (
        OVERLAY_ROOT
        + _mount(
            1105,
            "/home/u/.local/share/containers/storage/overlay-containers/"
            f"{MNT_PODMAN}/userdata/hostname",
            "/etc/hostname",
        )
        + _mount(
            1106,
            f"/home/u/.local/share/containers/storage/overlay-containers/{MNT_PODMAN}"
            "/userdata/.containerenv",
            "/run/.containerenv",
            fs_type="tmpfs",
            source="tmpfs",
        ),
        ContainerIdentity(MNT_PODMAN, "podman", None, "mountinfo"),
    ),
    "containerd pod, cgroup v2: hostname is the sandbox's, only the pod uid counts": (
        OVERLAY_ROOT
        + CGROUP2_NS
        + _mount(
            1107,
            f"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{SANDBOX}/hostname",
            "/etc/hostname",
        )
        + _mount(1108, f"/var/lib/kubelet/pods/{POD}/etc-hosts", "/etc/hosts")
        + _mount(
            1109, f"/var/lib/kubelet/pods/{POD}/containers/app/0c8f1a2b", "/dev/termination-log"
        ),
        ContainerIdentity(None, None, POD, None),
    ),
    "cri-o pod, cgroup v2: overlay-containers/<sandbox> must not be taken": (
        OVERLAY_ROOT
        + _mount(
            1110,
            f"/run/containers/storage/overlay-containers/{CRIO_SANDBOX}/userdata/hostname",
            "/etc/hostname",
            fs_type="tmpfs",
            source="tmpfs",
        )
        + _mount(1111, f"/var/lib/kubelet/pods/{POD}/etc-hosts", "/etc/hosts"),
        ContainerIdentity(None, None, POD, None),
    ),
    "cgroup v1 mount roots name the container": (
        OVERLAY_ROOT
        + f"1112 1100 0:30 /docker/{MNT_V1} /sys/fs/cgroup/memory ro,nosuid"
        + " - cgroup cgroup rw,memory\n",
        ContainerIdentity(MNT_V1, "docker", None, "mountinfo"),
    ),
    "octal escapes in paths are decoded": (
        _mount(1113, "/data/my\\040disk", "/mnt/my\\040disk")
        + _mount(1114, f"/srv/docker\\040root/containers/{MNT_DOCKER}/hostname", "/etc/hostname"),
        ContainerIdentity(MNT_DOCKER, "docker", None, "mountinfo"),
    ),
    "hostname bind-mounted from elsewhere is not a container": (
        _mount(1115, "/home/u/containers/notes/hostname", "/etc/hostname"),
        ContainerIdentity(),
    ),
    "a process on the host": (
        "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        "25 22 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n",
        ContainerIdentity(),
    ),
    "truncated line is ignored": ("1100 1000 0:52 /\n", ContainerIdentity()),
}


@pytest.mark.parametrize("text, expected", MOUNTINFO_CASES.values(), ids=MOUNTINFO_CASES.keys())
def test_parse_mountinfo(text, expected):
    assert parse_mountinfo(text) == expected


def _proc(tmp_path, cgroup=None, mountinfo=None):
    own = tmp_path / "self"
    own.mkdir()
    if cgroup is not None:
        (own / "cgroup").write_text(cgroup)
    if mountinfo is not None:
        (own / "mountinfo").write_text(mountinfo)
    return str(tmp_path)


def test_detect_prefers_cgroup_over_mountinfo(tmp_path):
    root = _proc(
        tmp_path,
        cgroup=f"0::/system.slice/docker-{DOCKER_V2}.scope\n",
        mountinfo=_mount(1, f"/var/lib/docker/containers/{MNT_DOCKER}/hostname", "/etc/hostname"),
    )
    assert detect_container(root) == ContainerIdentity(DOCKER_V2, "docker", None, "cgroup")


def test_detect_falls_back_to_mountinfo_when_cgroupns_hides_the_path(tmp_path):
    root = _proc(
        tmp_path,
        cgroup="0::/\n",
        mountinfo=_mount(1, f"/var/lib/docker/containers/{MNT_DOCKER}/hostname", "/etc/hostname"),
    )
    assert detect_container(root) == ContainerIdentity(MNT_DOCKER, "docker", None, "mountinfo")


def test_detect_keeps_the_pod_uid_from_cgroup_when_the_id_comes_from_nowhere(tmp_path):
    root = _proc(
        tmp_path,
        cgroup=f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/crio-conmon-{CRIO_CONMON}.scope\n",
        mountinfo="",
    )
    assert detect_container(root) == ContainerIdentity(None, None, POD, None)


def test_detect_without_proc_files_finds_nothing(tmp_path):
    assert detect_container(_proc(tmp_path)) == ContainerIdentity()
