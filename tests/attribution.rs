//! Integration tests: attribution.
//!
//! Against the real kernel (cgroups this test creates, a PID namespace from `unshare`, a child's
//! real environment) where the machine allows it — CI runs as root — and against procfs trees
//! written to a temp dir for what this kernel cannot produce (other runtimes and drivers,
//! malformed files, a host whose PIDs are not visible).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kernel::{child_of, join_cgroup, CgroupGuard, ChildGuard, KillOnDrop};
use gpulse::attribution::podresources::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpulse::attribution::podresources::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
    ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use gpulse::attribution::{
    AttributionMethod, AttributionSettings, Attributor, GpuProcessMig, GpuProcessRef,
    PodResourcesClient, Workload,
};

const ID_A: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const ID_B: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const POD_UID: &str = "6a1f2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const GPU_0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const GPU_1: &str = "GPU-66666666-7777-8888-9999-000000000000";

fn settings(proc_root: &Path) -> AttributionSettings {
    AttributionSettings {
        proc_root: proc_root.to_path_buf(),
        include_command_line: false,
        read_environ: true,
        kubelet_socket: None,
    }
}

fn resolve_one(attributor: &mut Attributor, pid: u32) -> Workload {
    let mut resolved = attributor.resolve(&[(pid, GPU_0.to_string())]);
    resolved
        .remove(&pid)
        .unwrap_or_else(|| panic!("resolve returns a workload for every pid, not for {pid}"))
}

// ---------------------------------------------------------------------------------------------
// Real kernel state.

const ID_C: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
const ID_D: &str = "d00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00d";
const POD_UID_CRIO: &str = "0b1c2d3e-4f50-4617-8829-3a4b5c6d7e8f";

/// The paths Docker (systemd driver), containerd and CRI-O create on the host's cgroup2
/// hierarchy, wherever it is mounted (the root on a pure v2 host, `unified/` on a hybrid one),
/// plus Docker's cgroupfs path in the v1 memory hierarchy where there is one.
#[test]
#[ignore = "needs root (creates cgroups); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn real_cgroups_give_container_runtime_and_pod() {
    let layout = crate::kernel::require_cgroups();
    let mut cgroups = CgroupGuard(Vec::new());
    let docker = cgroups
        .create(
            &layout.unified,
            &format!("system.slice/docker-{ID_A}.scope"),
        )
        .expect("create the docker scope");
    let pod_slice = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        POD_UID.replace('-', "_")
    );
    let containerd = cgroups
        .create(
            &layout.unified,
            &format!("{pod_slice}/cri-containerd-{ID_B}.scope"),
        )
        .expect("create the containerd scope");
    let crio = cgroups
        .create(
            &layout.unified,
            &format!(
                "kubepods.slice/kubepods-pod{}.slice/crio-{ID_C}.scope",
                POD_UID_CRIO.replace('-', "_")
            ),
        )
        .expect("create the CRI-O scope");
    let docker_v1 = layout.v1_memory.as_ref().map(|memory| {
        cgroups
            .create(memory, &format!("docker/{ID_D}"))
            .expect("create the docker cgroupfs cgroup in the v1 memory hierarchy")
    });

    let spawn = || ChildGuard::spawn(Command::new("sleep").arg("30")).expect("spawn sleep");
    let in_docker = spawn();
    let in_pod = spawn();
    let in_crio = spawn();
    let in_docker_v1 = docker_v1.as_ref().map(|_| spawn());
    join_cgroup(&docker, in_docker.pid()).expect("move a child into the docker scope");
    join_cgroup(&containerd, in_pod.pid()).expect("move a child into the containerd scope");
    join_cgroup(&crio, in_crio.pid()).expect("move a child into the CRI-O scope");
    if let (Some(dir), Some(child)) = (&docker_v1, &in_docker_v1) {
        join_cgroup(dir, child.pid()).expect("move a child into the v1 docker cgroup");
    }

    let mut attributor = Attributor::new(settings(Path::new("/proc")));
    let mut gpu_processes = vec![
        (in_docker.pid(), GPU_0.to_string()),
        (in_pod.pid(), GPU_1.to_string()),
        (in_crio.pid(), GPU_1.to_string()),
    ];
    gpu_processes.extend(in_docker_v1.iter().map(|c| (c.pid(), GPU_0.to_string())));
    let resolved = attributor.resolve(&gpu_processes);

    let docker_workload = &resolved[&in_docker.pid()];
    assert_eq!(docker_workload.attributed_by, AttributionMethod::HostPid);
    assert_eq!(docker_workload.container_id.as_deref(), Some(ID_A));
    assert_eq!(docker_workload.container_runtime.as_deref(), Some("docker"));
    assert_eq!(docker_workload.pod_uid, None);
    assert_eq!(docker_workload.executable_name.as_deref(), Some("sleep"));

    let pod_workload = &resolved[&in_pod.pid()];
    assert_eq!(pod_workload.container_id.as_deref(), Some(ID_B));
    assert_eq!(
        pod_workload.container_runtime.as_deref(),
        Some("containerd")
    );
    assert_eq!(pod_workload.pod_uid.as_deref(), Some(POD_UID));

    let crio_workload = &resolved[&in_crio.pid()];
    assert_eq!(crio_workload.container_id.as_deref(), Some(ID_C));
    assert_eq!(crio_workload.container_runtime.as_deref(), Some("cri-o"));
    assert_eq!(crio_workload.pod_uid.as_deref(), Some(POD_UID_CRIO));

    if let Some(child) = &in_docker_v1 {
        let w = &resolved[&child.pid()];
        assert_eq!(w.container_id.as_deref(), Some(ID_D));
        assert_eq!(w.container_runtime.as_deref(), Some("docker"));
    }

    // The children die before the guard removes their cgroups (reverse declaration order).
    drop(in_docker_v1);
    drop(in_crio);
    drop(in_pod);
    drop(in_docker);
}

#[test]
#[ignore = "needs root (creates a PID namespace); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn pid_namespace_gives_vpid() {
    crate::kernel::require_root("create a PID namespace");
    let unshare =
        ChildGuard::spawn(Command::new("unshare").args(["--pid", "--fork", "sleep", "30"]))
            .expect("run unshare (util-linux)");
    let inner = child_of(unshare.pid())
        .expect("unshare made no child within 5 s: is CAP_SYS_ADMIN missing (a container)?");
    // The namespace's init ignores signals from outside it except SIGKILL; unshare itself dying
    // does not stop it, so kill it by PID even when an assertion fails.
    let _inner_guard = KillOnDrop(inner);
    let mut attributor = Attributor::new(settings(Path::new("/proc")));
    let workload = resolve_one(&mut attributor, inner);
    assert_eq!(workload.pid, inner);
    let vpid = workload.vpid.expect("NSpid is read");
    assert_ne!(vpid, inner, "the namespaced PID differs from the host PID");
    assert_eq!(
        vpid, 1,
        "the first process in a new PID namespace is its PID 1"
    );
}

#[test]
fn environ_gives_service_name_and_keeps_no_secret() {
    let secret = "s3cr3t-token-do-not-keep";
    let child = ChildGuard::spawn(
        Command::new("sleep")
            .arg("30")
            .env("OTEL_SERVICE_NAME", "trainer")
            .env(
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.namespace=ml,deployment.environment.name=prod%2Ceu",
            )
            .env("API_TOKEN", secret),
    )
    .expect("spawn sleep");
    // On a loaded machine the child may not have exec'd yet: until then its environ is the
    // test's own. Wait for the kernel to show the new one, then ask the attributor.
    let environ = format!("/proc/{}/environ", child.pid());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read(&environ)
        .map(|e| e.windows(17).any(|w| w == b"OTEL_SERVICE_NAME"))
        .unwrap_or(false)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut attributor = Attributor::new(settings(Path::new("/proc")));
    let workload = resolve_one(&mut attributor, child.pid());
    assert_eq!(workload.service_name.as_deref(), Some("trainer"));
    assert_eq!(
        workload.resource_attributes,
        vec![
            ("service.namespace".to_string(), "ml".to_string()),
            (
                "deployment.environment.name".to_string(),
                "prod,eu".to_string()
            ),
        ]
    );
    assert_eq!(
        workload.command_line, None,
        "command line is off by default"
    );
    let debug = format!("{workload:?}");
    assert!(!debug.contains(secret), "secret leaked into {debug}");
    assert!(
        !debug.contains("API_TOKEN"),
        "other keys leaked into {debug}"
    );

    // Switched off: nothing from the environment at all.
    let mut no_environ = Attributor::new(AttributionSettings {
        read_environ: false,
        include_command_line: true,
        ..settings(Path::new("/proc"))
    });
    let workload = resolve_one(&mut no_environ, child.pid());
    assert_eq!(workload.service_name, None);
    assert!(workload.resource_attributes.is_empty());
    assert_eq!(workload.command_line.as_deref(), Some("sleep 30"));
    // Our own real uid, named through /etc/passwd (or the number where it has no name).
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let owner = workload.owner.expect("owner is read from status");
    if uid == 0 {
        assert_eq!(owner, "root");
    } else {
        assert!(!owner.is_empty());
    }
}

/// Spawns `sleep 30` with `env` and waits until the kernel shows its new environment.
pub fn sleeper_with_env(env: &[(&str, &str)]) -> ChildGuard {
    let mut command = Command::new("sleep");
    command.arg("30");
    for (key, value) in env {
        command.env(key, value);
    }
    let child = ChildGuard::spawn(&mut command).expect("spawn sleep");
    let (marker_key, _) = env.first().expect("at least one variable");
    let environ = format!("/proc/{}/environ", child.pid());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read(&environ)
        .map(|e| {
            e.windows(marker_key.len())
                .any(|w| w == marker_key.as_bytes())
        })
        .unwrap_or(false)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn environ_gives_the_job_id_in_its_order_and_keeps_nothing_else() {
    use gpulse::attribution::JobIdSource;
    let mut attributor = Attributor::new(settings(Path::new("/proc")));

    let slurm = sleeper_with_env(&[("SLURM_JOB_ID", "4242"), ("SLURM_JOB_NAME", "secret-name")]);
    let workload = resolve_one(&mut attributor, slurm.pid());
    // As the PyTorch companion names it (examples/pytorch, distributed.job_id).
    assert_eq!(workload.job_id.as_deref(), Some("slurm-4242"));
    assert_eq!(workload.job_id_source, Some(JobIdSource::Slurm));
    assert!(!format!("{workload:?}").contains("secret-name"));

    let both = sleeper_with_env(&[("TORCHELASTIC_RUN_ID", "run-7"), ("SLURM_JOB_ID", "4242")]);
    let workload = resolve_one(&mut attributor, both.pid());
    assert_eq!(workload.job_id.as_deref(), Some("run-7"));
    assert_eq!(workload.job_id_source, Some(JobIdSource::TorchElastic));

    // torchrun's placeholder run id names no job; the companion's attribute outranks both.
    let placeholder = sleeper_with_env(&[("TORCHELASTIC_RUN_ID", "none")]);
    let workload = resolve_one(&mut attributor, placeholder.pid());
    assert_eq!(workload.job_id, None);
    let attributed = sleeper_with_env(&[
        ("OTEL_RESOURCE_ATTRIBUTES", "pytorch.distributed.job.id=j-1"),
        ("TORCHELASTIC_RUN_ID", "run-7"),
    ]);
    let workload = resolve_one(&mut attributor, attributed.pid());
    assert_eq!(workload.job_id.as_deref(), Some("j-1"));
    assert_eq!(
        workload.job_id_source,
        Some(JobIdSource::ResourceAttributes)
    );

    // With the environment switched off, no job id either.
    let mut no_environ = Attributor::new(AttributionSettings {
        read_environ: false,
        ..settings(Path::new("/proc"))
    });
    assert_eq!(resolve_one(&mut no_environ, both.pid()).job_id, None);
}

/// A torchrun rank's variables, read from its real `/proc/<pid>/environ`: its rank, world size
/// and local rank, and the job id the companion would derive (`MASTER_ADDR:MASTER_PORT` when
/// torchrun's run id is its placeholder); with the environment switched off, neither.
#[test]
fn environ_gives_the_rank_and_the_companions_job_id() {
    use gpulse::attribution::{EnvRank, JobIdSource};
    let mut attributor = Attributor::new(settings(Path::new("/proc")));
    let rank = sleeper_with_env(&[
        ("RANK", "3"),
        ("LOCAL_RANK", "1"),
        ("WORLD_SIZE", "4"),
        ("TORCHELASTIC_RUN_ID", "none"),
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "29500"),
    ]);
    let workload = resolve_one(&mut attributor, rank.pid());
    assert_eq!(
        workload.rank,
        Some(EnvRank {
            rank: 3,
            world_size: 4,
            local_rank: Some(1)
        })
    );
    assert_eq!(workload.job_id.as_deref(), Some("10.0.0.7:29500"));
    assert_eq!(workload.job_id_source, Some(JobIdSource::Master));

    let mut no_environ = Attributor::new(AttributionSettings {
        read_environ: false,
        ..settings(Path::new("/proc"))
    });
    let workload = resolve_one(&mut no_environ, rank.pid());
    assert_eq!((workload.rank, workload.job_id), (None, None));
}

#[test]
fn usage_counts_a_busy_descendant() {
    // The shell waits (idle) while its child spins without forking: own CPU low, tree CPU high.
    let parent = ChildGuard::spawn(
        Command::new("sh").args(["-c", "timeout 30 sh -c 'while :; do :; done' & wait"]),
    )
    .expect("spawn sh");
    let timeout = child_of(parent.pid()).expect("the timeout process");
    let spinner = child_of(timeout).expect("the spinning shell");
    let _spinner_guard = KillOnDrop(spinner);
    let mut attributor = Attributor::new(settings(Path::new("/proc")));
    let first = attributor.usage(&[parent.pid()]);
    let spun_before = cpu_seconds(spinner);
    let measured_from = Instant::now();
    assert_eq!(
        first[&parent.pid()].cpu_utilization,
        None,
        "first reading has no rate"
    );
    // Until the spinner has had 0.5 s of CPU (50 ticks of 10 ms, so its rate is good to a few
    // per cent), or 3 s have passed on a machine too loaded to give it that (the rates are then
    // compared over those 3 s, well inside the spinner's 30 s life).
    let deadline = Instant::now() + Duration::from_secs(3);
    while cpu_seconds(spinner) - spun_before < 0.5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = attributor.usage(&[parent.pid()]);
    // What the spinner really got: on a loaded machine that can be far below one core, so the
    // tree's rate is compared with it rather than with a fixed share.
    let spun = (cpu_seconds(spinner) - spun_before) / measured_from.elapsed().as_secs_f64();
    let usage = second[&parent.pid()];
    let own = usage.cpu_utilization.expect("own rate");
    let tree = usage.tree_cpu_utilization.expect("tree rate");
    assert!(
        spun > 0.02,
        "the spinner never ran ({spun}); the machine is starved"
    );
    assert!(own < 0.2, "the waiting shell is idle: {own}");
    assert!(
        tree > own && (tree - spun).abs() < 0.25 * spun + 0.05,
        "the tree's rate {tree} is its spinning grandchild's {spun} (own {own})"
    );
    assert!(usage.memory_rss_bytes.is_some_and(|rss| rss > 0));
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); after "pid (comm) " the state is index 0, utime index 11.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

// ---------------------------------------------------------------------------------------------
// Fixture procfs trees.

/// One fake process under a fixture root.
struct FakeProc {
    pid: u32,
    comm: &'static str,
    ppid: u32,
    start: u64,
    cgroup: String,
    nspid: Vec<u32>,
    uid: u32,
    environ: Vec<u8>,
    cmdline: &'static [u8],
}

impl FakeProc {
    fn new(pid: u32, cgroup: impl Into<String>) -> Self {
        Self {
            pid,
            comm: "python3",
            ppid: 1,
            start: 1000 + u64::from(pid),
            cgroup: cgroup.into(),
            nspid: vec![pid],
            uid: 1000,
            environ: Vec::new(),
            cmdline: b"python3\0train.py\0",
        }
    }

    fn write(&self, root: &Path) {
        let dir = root.join(self.pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir pid dir");
        let stat = format!(
            "{} ({}) S {} {} {} 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 4 0 {} 1000000 256 \
             18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
            self.pid, self.comm, self.ppid, self.pid, self.pid, self.start
        );
        let nspid: Vec<String> = self.nspid.iter().map(u32::to_string).collect();
        let status = format!(
            "Name:\t{}\nState:\tS (sleeping)\nPid:\t{}\nPPid:\t{}\nUid:\t{u}\t{u}\t{u}\t{u}\n\
             NSpid:\t{}\nVmRSS:\t  1024 kB\n",
            self.comm,
            self.pid,
            self.ppid,
            nspid.join("\t"),
            u = self.uid
        );
        std::fs::write(dir.join("stat"), stat).expect("write stat");
        std::fs::write(dir.join("status"), status).expect("write status");
        std::fs::write(dir.join("cgroup"), &self.cgroup).expect("write cgroup");
        std::fs::write(dir.join("environ"), &self.environ).expect("write environ");
        std::fs::write(dir.join("cmdline"), self.cmdline).expect("write cmdline");
    }
}

/// A fixture root with a host passwd next to it, as `<root>/1/root/etc/passwd`.
fn fixture_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    let etc = root.path().join("1/root/etc");
    std::fs::create_dir_all(&etc).expect("mkdir etc");
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/bash\nml:x:1000:1000::/home/ml:/bin/sh\n",
    )
    .expect("write passwd");
    root
}

fn systemd_pod_cgroup(runtime_scope: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/{runtime_scope}\n",
        POD_UID.replace('-', "_")
    )
}

/// pid, cgroup file, expected container.id, container.runtime.name, k8s.pod.uid.
type RuntimeCase = (
    u32,
    String,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

#[test]
fn fixture_runtimes_and_drivers() {
    let root = fixture_root();
    let cases: Vec<RuntimeCase> = vec![
        (101, systemd_pod_cgroup(&format!("crio-{ID_A}.scope")), Some(ID_A), Some("cri-o"), Some(POD_UID)),
        (102, format!("0::/machine.slice/libpod-{ID_A}.scope/container\n"), Some(ID_A), Some("podman"), None),
        (103, systemd_pod_cgroup(&format!("cri-containerd-{ID_B}.scope")), Some(ID_B), Some("containerd"), Some(POD_UID)),
        (
            104,
            format!("11:memory:/kubepods/burstable/pod{POD_UID}/{ID_B}\n10:cpu,cpuacct:/kubepods/burstable/pod{POD_UID}/{ID_B}\n0::/\n"),
            Some(ID_B), Some("containerd"), Some(POD_UID),
        ),
        (105, systemd_pod_cgroup(&format!("crio-conmon-{ID_A}.scope")), None, None, Some(POD_UID)),
        (106, format!("0::/machine.slice/libpod-conmon-{ID_A}.scope\n"), None, None, None),
        (107, "0::/user.slice/user-1000.slice/session-2.scope\n".to_string(), None, None, None),
        // Malformed files: no identity, no panic.
        (108, "\u{0}\u{1}garbage:::\n::\n".to_string(), None, None, None),
        (109, String::new(), None, None, None),
    ];
    for (pid, cgroup, ..) in &cases {
        FakeProc::new(*pid, cgroup.clone()).write(root.path());
    }
    let mut attributor = Attributor::new(settings(root.path()));
    let processes: Vec<(u32, String)> = cases.iter().map(|c| (c.0, GPU_0.to_string())).collect();
    let resolved = attributor.resolve(&processes);
    for (pid, _, id, runtime, pod) in &cases {
        let w = &resolved[pid];
        assert_eq!(w.attributed_by, AttributionMethod::HostPid, "pid {pid}");
        assert_eq!(w.container_id.as_deref(), *id, "pid {pid}");
        assert_eq!(w.container_runtime.as_deref(), *runtime, "pid {pid}");
        assert_eq!(w.pod_uid.as_deref(), *pod, "pid {pid}");
        // No exe link in a fixture: the comm from stat.
        assert_eq!(w.executable_name.as_deref(), Some("python3"), "pid {pid}");
        assert_eq!(
            w.owner.as_deref(),
            Some("ml"),
            "pid {pid}: uid 1000 named by the host passwd"
        );
    }
}

#[test]
fn fixture_malformed_process_files() {
    let root = fixture_root();
    // stat unparsable, status garbage, environ binary noise: a workload, never a panic.
    let dir = root.path().join("300");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("stat"), "300 (x").expect("write");
    let resolved = attributor_for(root.path()).resolve(&[(300, GPU_0.to_string())]);
    assert_eq!(resolved[&300], Workload::unresolved(300));

    let mut proc = FakeProc::new(301, "0::/\n");
    proc.environ = b"\xff\xfeOTEL_SERVICE_NAME\0OTEL_RESOURCE_ATTRIBUTES=a=1,broken\0".to_vec();
    proc.uid = 4242;
    proc.write(root.path());
    std::fs::write(root.path().join("301/status"), "\0\0 nonsense\nUid:\tx\n").expect("write");
    let resolved = attributor_for(root.path()).resolve(&[(301, GPU_0.to_string())]);
    let w = &resolved[&301];
    assert_eq!(w.attributed_by, AttributionMethod::HostPid);
    assert_eq!(w.vpid, None);
    assert_eq!(w.owner, None);
    assert_eq!(w.service_name, None);
    assert!(
        w.resource_attributes.is_empty(),
        "a malformed OTEL_RESOURCE_ATTRIBUTES is discarded whole"
    );

    // An uid no passwd names is exported as the number.
    let mut proc = FakeProc::new(302, "0::/\n");
    proc.uid = 4242;
    proc.write(root.path());
    let resolved = attributor_for(root.path()).resolve(&[(302, GPU_0.to_string())]);
    assert_eq!(resolved[&302].owner.as_deref(), Some("4242"));
}

fn attributor_for(root: &Path) -> Attributor {
    Attributor::new(settings(root))
}

#[test]
fn fixture_nspid_command_line_and_environ() {
    let root = fixture_root();
    let mut proc = FakeProc::new(
        400,
        systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope")),
    );
    proc.nspid = vec![400, 57, 1];
    proc.environ = b"HOME=/root\0OTEL_RESOURCE_ATTRIBUTES=service.name=from-attrs,team=ml\0\
        PASSWORD=hunter2\0"
        .to_vec();
    proc.write(root.path());
    let mut attributor = Attributor::new(AttributionSettings {
        include_command_line: true,
        ..settings(root.path())
    });
    let w = resolve_one(&mut attributor, 400);
    assert_eq!(w.vpid, Some(1));
    assert_eq!(w.command_line.as_deref(), Some("python3 train.py"));
    assert_eq!(w.service_name.as_deref(), Some("from-attrs"));
    assert_eq!(w.effective_service_name(), "from-attrs");
    assert!(!format!("{w:?}").contains("hunter2"));
}

#[test]
fn warm_cache_reads_only_the_start_time() {
    let root = fixture_root();
    FakeProc::new(
        500,
        systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope")),
    )
    .write(root.path());
    FakeProc::new(501, "0::/\n").write(root.path());
    let mut attributor = attributor_for(root.path());
    let both = [(500, GPU_0.to_string()), (501, GPU_1.to_string())];
    assert_eq!(
        attributor.resolve(&both)[&500].container_id.as_deref(),
        Some(ID_A)
    );
    assert_eq!(attributor.cached_len(), 2);

    // Same start time: the cgroup file is not read again, the cached identity stays.
    std::fs::write(
        root.path().join("500/cgroup"),
        format!("0::/docker/{ID_B}\n"),
    )
    .expect("write");
    assert_eq!(
        attributor.resolve(&both)[&500].container_id.as_deref(),
        Some(ID_A)
    );

    // The PID is reused (new start time): read again.
    let mut reused = FakeProc::new(500, format!("0::/docker/{ID_B}\n"));
    reused.start = 999_999;
    reused.write(root.path());
    let w = &attributor.resolve(&both)[&500];
    assert_eq!(w.container_id.as_deref(), Some(ID_B));
    assert_eq!(w.container_runtime.as_deref(), Some("docker"));

    // The process exits while its window is still reported: it keeps its identity.
    std::fs::remove_dir_all(root.path().join("500")).expect("rm");
    let w = &attributor.resolve(&both)[&500];
    assert_eq!(w.container_id.as_deref(), Some(ID_B));

    // Not reported anymore: dropped from the cache (bounded memory).
    attributor.resolve(&[(501, GPU_1.to_string())]);
    assert_eq!(attributor.cached_len(), 1);
    // Gone and no longer cached: unresolved, not an error.
    let w = &attributor.resolve(&both)[&500];
    assert_eq!(w, &Workload::unresolved(500));
}

#[test]
fn unreadable_root_degrades_to_unresolved() {
    let missing = tempfile::tempdir()
        .expect("temp dir")
        .path()
        .join("no-proc-here");
    let mut attributor = attributor_for(&missing);
    for _ in 0..3 {
        let resolved = attributor.resolve(&[(1, GPU_0.to_string()), (2, GPU_0.to_string())]);
        assert_eq!(resolved.len(), 2);
        assert!(resolved
            .values()
            .all(|w| w.attributed_by == AttributionMethod::Unresolved));
    }
}

#[test]
fn pid_on_two_gpus_is_one_workload() {
    let root = fixture_root();
    FakeProc::new(600, "0::/\n").write(root.path());
    let resolved =
        attributor_for(root.path()).resolve(&[(600, GPU_0.to_string()), (600, GPU_1.to_string())]);
    assert_eq!(resolved.len(), 1);
}

#[test]
fn device_file_fallback_when_host_pids_are_not_visible() {
    let root = fixture_root();
    // The sidecar's view: local PID 7 holds /dev/nvidia0; NVML says host PID 90001 is on it.
    let mut local = FakeProc::new(7, format!("0::/kubepods/burstable/pod{POD_UID}/{ID_A}\n"));
    local.nspid = vec![7];
    local.write(root.path());
    let fd = root.path().join("7/fd");
    std::fs::create_dir_all(&fd).expect("mkdir fd");
    std::os::unix::fs::symlink("/dev/nvidiactl", fd.join("3")).expect("symlink");
    std::os::unix::fs::symlink("/dev/nvidia0", fd.join("4")).expect("symlink");
    // Two local holders of /dev/nvidia1: ambiguous.
    for pid in [8, 9] {
        FakeProc::new(pid, "0::/\n").write(root.path());
        let fd = root.path().join(format!("{pid}/fd"));
        std::fs::create_dir_all(&fd).expect("mkdir fd");
        std::os::unix::fs::symlink("/dev/nvidia1", fd.join("4")).expect("symlink");
    }
    let mut attributor = attributor_for(root.path());
    let resolved = attributor.resolve_processes(&[
        GpuProcessRef {
            pid: 90001,
            device_uuid: GPU_0,
            device_minor: Some(0),
            mig: None,
        },
        GpuProcessRef {
            pid: 90002,
            device_uuid: GPU_1,
            device_minor: Some(1),
            mig: None,
        },
    ]);
    let w = &resolved[&90001];
    assert_eq!(w.attributed_by, AttributionMethod::DeviceFile);
    assert_eq!(w.pid, 90001, "process.pid stays the host PID NVML reported");
    assert_eq!(w.vpid, Some(7));
    assert_eq!(w.container_id.as_deref(), Some(ID_A));
    assert_eq!(w.pod_uid.as_deref(), Some(POD_UID));
    assert_eq!(resolved[&90002], Workload::unresolved(90002));

    // Without minors there is nothing to match on.
    let resolved = attributor.resolve(&[(90001, GPU_0.to_string())]);
    assert_eq!(
        resolved[&90001].attributed_by,
        AttributionMethod::Unresolved
    );
}

#[test]
fn warm_resolve_of_1024_pids() {
    let root = fixture_root();
    let pids: Vec<u32> = (10_000..11_024).collect();
    for &pid in &pids {
        FakeProc::new(
            pid,
            systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope")),
        )
        .write(root.path());
    }
    let processes: Vec<(u32, String)> = pids.iter().map(|&p| (p, GPU_0.to_string())).collect();
    let mut attributor = attributor_for(root.path());
    let started = Instant::now();
    let cold = attributor.resolve(&processes);
    let cold_time = started.elapsed();
    let started = Instant::now();
    let warm = attributor.resolve(&processes);
    let warm_time = started.elapsed();
    assert_eq!(cold.len(), 1024);
    assert_eq!(cold, warm);
    eprintln!("resolve of 1024 PIDs: cold {cold_time:?}, warm {warm_time:?}");
    assert!(
        warm_time < cold_time,
        "a warm resolve reads less than a cold one"
    );
}

// ---------------------------------------------------------------------------------------------
// Kubelet pod-resources over a Unix socket.

#[derive(Clone)]
struct FakeKubelet {
    pods: Vec<PodResources>,
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used by gpulse"))
    }

    async fn get(
        &self,
        _request: tonic::Request<GetPodResourcesRequest>,
    ) -> Result<tonic::Response<GetPodResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used by gpulse"))
    }
}

fn pod(namespace: &str, name: &str, container: &str, gpus: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: gpus.iter().map(|g| g.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
    }
}

/// Serves `kubelet` on `<dir>/kubelet.sock` until the returned task is aborted.
async fn serve(dir: &Path, kubelet: FakeKubelet) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let socket = dir.join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind unix socket");
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let server = tokio::spawn(async move {
        // A single service needs no router (tonic's `router` feature would pull in axum).
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming(PodResourcesListerServer::new(kubelet), incoming)
            .await;
    });
    (socket, server)
}

const GPU_SHARED: &str = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_resources_names_the_process_using_the_gpu() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubelet = FakeKubelet {
        pods: vec![
            pod("ml", "train-7f9c", "trainer", &[GPU_0]),
            pod("ml", "infer-a", "server", &[GPU_SHARED]),
            pod("ml", "infer-b", "server", &[GPU_SHARED]),
        ],
    };
    let (socket, server) = serve(dir.path(), kubelet).await;

    // The client on its own.
    let mut client = PodResourcesClient::connect(&socket).await.expect("connect");
    let listed = client.list().await.expect("list");
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0].pod_name, "train-7f9c");
    assert_eq!(listed[0].device_ids, vec![GPU_0.to_string()]);

    let root = fixture_root();
    let in_pod = systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope"));
    FakeProc::new(700, in_pod.clone()).write(root.path()); // on GPU_0
    FakeProc::new(701, in_pod).write(root.path()); // on the shared GPU
    FakeProc::new(702, "0::/system.slice/sshd.service\n").write(root.path()); // host, on GPU_0
    let mut attributor = Attributor::new(AttributionSettings {
        kubelet_socket: Some(socket.clone()),
        ..settings(root.path())
    });
    let directory = attributor
        .pod_directory()
        .expect("socket configured")
        .clone();
    assert_eq!(directory.refresh().await.expect("refresh"), 3);

    let resolved = tokio::task::block_in_place(|| {
        attributor.resolve(&[
            (700, GPU_0.to_string()),
            (701, GPU_SHARED.to_string()),
            (702, GPU_0.to_string()),
        ])
    });
    let w = &resolved[&700];
    assert_eq!(w.pod_name.as_deref(), Some("train-7f9c"));
    assert_eq!(w.namespace_name.as_deref(), Some("ml"));
    assert_eq!(w.container_name.as_deref(), Some("trainer"));
    assert_eq!(w.pod_uid.as_deref(), Some(POD_UID));
    let ambiguous = &resolved[&701];
    assert_eq!(ambiguous.pod_name, None, "two pods hold that GPU: no names");
    assert_eq!(ambiguous.container_name, None);
    let host = &resolved[&702];
    assert_eq!(
        host.pod_name, None,
        "a process outside any pod gets no pod names"
    );

    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_names_stay_consistent_with_cgroup_pod_uids() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubelet = FakeKubelet {
        pods: vec![pod("ml", "train-0", "trainer", &[GPU_0, GPU_1])],
    };
    let (socket, server) = serve(dir.path(), kubelet).await;
    let root = fixture_root();
    let other_uid = "11111111-2222-4333-8444-555555555555";
    FakeProc::new(
        800,
        systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope")),
    )
    .write(root.path());
    FakeProc::new(
        801,
        format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID_B}.scope\n",
            other_uid.replace('-', "_")
        ),
    )
    .write(root.path());
    let mut attributor = Attributor::new(AttributionSettings {
        kubelet_socket: Some(socket),
        ..settings(root.path())
    });
    attributor
        .pod_directory()
        .expect("socket configured")
        .refresh()
        .await
        .expect("refresh");
    let resolved = tokio::task::block_in_place(|| {
        attributor.resolve(&[(800, GPU_0.to_string()), (801, GPU_1.to_string())])
    });
    // Both match train-0 by device, but their cgroups say they are in two different pods.
    assert_eq!(resolved[&800].pod_name, None);
    assert_eq!(resolved[&801].pod_name, None);

    // Alone, the process matches.
    let resolved = tokio::task::block_in_place(|| attributor.resolve(&[(800, GPU_0.to_string())]));
    assert_eq!(resolved[&800].pod_name.as_deref(), Some("train-0"));
    server.abort();
}

/// A pod whose container got `devices` from NVIDIA's DRA driver through the claim `claim`, as
/// the kubelet lists it (driver, pool = node name, device name, the CDI id the driver writes).
fn dra_pod(
    namespace: &str,
    name: &str,
    container: &str,
    claim: &str,
    devices: &[&str],
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            dynamic_resources: vec![DynamicResource {
                claim_name: claim.into(),
                claim_namespace: namespace.into(),
                claim_resources: devices
                    .iter()
                    .map(|device| ClaimResource {
                        cdi_devices: vec![CdiDevice {
                            name: format!(
                                "k8s.gpu.nvidia.com/claim=4c1d9a52-6a0e-4f7e-9d55-0f3b8e1a2c77-{device}"
                            ),
                        }],
                        driver_name: "gpu.nvidia.com".into(),
                        pool_name: "gpu-node-1".into(),
                        device_name: (*device).into(),
                    })
                    .collect(),
            }],
            ..Default::default()
        }],
    }
}

fn pod_cgroup(uid: &str, container_id: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{container_id}.scope\n",
        uid.replace('-', "_")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_resources_names_device_plugin_and_dra_gpus_and_mig_devices() {
    const GPU_2: &str = "GPU-22222222-2222-4222-8222-222222222222";
    const GPU_3: &str = "GPU-33333333-3333-4333-8333-333333333333";
    const GPU_4: &str = "GPU-44444444-4444-4444-8444-444444444444";
    const MIG_A: &str = "MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
    const MIG_B: &str = "MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
    const MIG_C: &str = "MIG-cccccccc-cccc-4ccc-8ccc-cccccccccccc";
    let dir = tempfile::tempdir().expect("temp dir");
    let mut mig_plugin = pod("ml", "dp-mig", "worker", &[]);
    mig_plugin.containers[0].devices[0] = ContainerDevices {
        resource_name: "nvidia.com/mig-3g.40gb".into(),
        device_ids: vec![MIG_B.into()],
        topology: None,
    };
    let kubelet = FakeKubelet {
        pods: vec![
            // Device plugin, whole GPU (minor 0).
            pod("ml", "dp-gpu", "trainer", &[GPU_0]),
            // DRA, whole GPUs 1 and 3 (minors 1 and 3) in one claim.
            dra_pod(
                "research",
                "dra-gpu",
                "train",
                "two-gpus",
                &["gpu-1", "gpu-3"],
            ),
            // DRA, a 1g.10gb MIG device on the GPU with minor 2.
            dra_pod(
                "infer",
                "dra-mig",
                "server",
                "mig-small",
                &["gpu-2-mig-1g10gb-19-0"],
            ),
            // Device plugin (mixed strategy), a 3g.40gb MIG device on the same GPU.
            mig_plugin,
        ],
    };
    let (socket, server) = serve(dir.path(), kubelet).await;

    let uids = [
        "00000000-0000-4000-8000-000000000001",
        "00000000-0000-4000-8000-000000000002",
        "00000000-0000-4000-8000-000000000003",
        "00000000-0000-4000-8000-000000000004",
        "00000000-0000-4000-8000-000000000005",
    ];
    let root = fixture_root();
    for (pid, uid) in (910..).zip(uids) {
        FakeProc::new(pid, pod_cgroup(uid, ID_A)).write(root.path());
    }
    let mut attributor = Attributor::new(AttributionSettings {
        kubelet_socket: Some(socket),
        ..settings(root.path())
    });
    let directory = attributor.pod_directory().expect("socket").clone();
    // Four containers: one per device-plugin resource, one per DRA claim.
    assert_eq!(directory.refresh().await.expect("refresh"), 4);

    let gpu = |pid, uuid, minor| GpuProcessRef {
        pid,
        device_uuid: uuid,
        device_minor: Some(minor),
        mig: None,
    };
    let mig = |pid, uuid: &'static str, profile: &'static str| GpuProcessRef {
        pid,
        device_uuid: GPU_2,
        device_minor: Some(2),
        mig: Some(GpuProcessMig { uuid, profile }),
    };
    let resolved = tokio::task::block_in_place(|| {
        attributor.resolve_processes(&[
            gpu(910, GPU_0, 0),
            // One process on both GPUs of the DRA claim.
            gpu(911, GPU_1, 1),
            gpu(911, GPU_3, 3),
            mig(912, MIG_A, "1g.10gb"),
            mig(913, MIG_B, "3g.40gb"),
            // A MIG device on that GPU no pod was allocated, and a GPU no pod holds.
            mig(914, MIG_C, "2g.20gb"),
            gpu(914, GPU_4, 4),
        ])
    });
    let names = |pid: u32| {
        let w = &resolved[&pid];
        (
            w.namespace_name.as_deref(),
            w.pod_name.as_deref(),
            w.container_name.as_deref(),
        )
    };
    assert_eq!(names(910), (Some("ml"), Some("dp-gpu"), Some("trainer")));
    assert_eq!(
        names(911),
        (Some("research"), Some("dra-gpu"), Some("train"))
    );
    assert_eq!(names(912), (Some("infer"), Some("dra-mig"), Some("server")));
    assert_eq!(names(913), (Some("ml"), Some("dp-mig"), Some("worker")));
    assert_eq!(names(914), (None, None, None));
    assert_eq!(resolved[&912].pod_uid.as_deref(), Some(uids[2]));

    // Without the minor number, a DRA GPU cannot be told from another: no names.
    let resolved = tokio::task::block_in_place(|| {
        attributor.resolve_processes(&[GpuProcessRef {
            device_minor: None,
            ..gpu(911, GPU_1, 1)
        }])
    });
    assert_eq!(resolved[&911].pod_name, None);
    server.abort();
}

#[tokio::test]
async fn missing_kubelet_socket_means_no_pod_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = fixture_root();
    FakeProc::new(
        900,
        systemd_pod_cgroup(&format!("cri-containerd-{ID_A}.scope")),
    )
    .write(root.path());
    let mut attributor = Attributor::new(AttributionSettings {
        kubelet_socket: Some(dir.path().join("kubelet.sock")),
        ..settings(root.path())
    });
    let error = attributor
        .pod_directory()
        .expect("socket configured")
        .refresh()
        .await
        .expect_err("nothing listens there");
    assert!(error.to_string().contains("does not exist"), "{error}");
    let resolved = attributor.resolve(&[(900, GPU_0.to_string())]);
    assert_eq!(resolved[&900].container_id.as_deref(), Some(ID_A));
    assert_eq!(resolved[&900].pod_name, None);
}

#[test]
fn resolve_works_outside_a_runtime_and_is_not_a_map_of_one() {
    let root = fixture_root();
    FakeProc::new(1000, "0::/\n").write(root.path());
    FakeProc::new(1001, "0::/\n").write(root.path());
    let mut attributor = Attributor::new(AttributionSettings {
        kubelet_socket: Some(root.path().join("kubelet.sock")),
        ..settings(root.path())
    });
    let resolved: HashMap<u32, Workload> =
        attributor.resolve(&[(1000, GPU_0.to_string()), (1001, GPU_0.to_string())]);
    assert_eq!(resolved.len(), 2);
    assert!(resolved
        .values()
        .all(|w| w.attributed_by == AttributionMethod::HostPid));
}

/// gpulse reads `/proc/<pid>/environ` with its own permissions: run as another user (nobody,
/// no capabilities) it may not read a root process's environment, and that process then shows
/// no job and no rank (and gpulse carries on: the process is still listed); run as root it
/// shows both. Through the binary, `gpulse snapshot --format json` against nvml-sim.
#[test]
#[ignore = "needs root (runs gpulse as another user against a root process); scripts/test runs it as root and with CI=true, or: cargo test -- --include-ignored"]
fn an_environ_gpulse_may_not_read_gives_no_job_or_rank() {
    crate::kernel::require_root("run gpulse as nobody against a root process");
    let rank = sleeper_with_env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("TORCHELASTIC_RUN_ID", "run-7"),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(
        &scenario,
        "[driver]\nversion = \"550.54.15\"\ncuda_version = \"12.4\"\n\n[[device]]\n\
         name = \"NVIDIA H100 80GB HBM3\"\nmemory_total_mib = 81559\n\n[[device.process]]\n\
         pid_env = \"RANK_PID\"\nname = \"python3\"\nkind = \"compute\"\nmemory_used_mib = 1024\n",
    )
    .expect("write scenario");
    // The temporary directory is root's 0700: let nobody read the scenario.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&scenario, std::fs::Permissions::from_mode(0o644)).unwrap();
    let workload_as = |user: Option<&str>| {
        let mut command = match user {
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={uid}"),
                    &format!("--regid={uid}"),
                    "--clear-groups",
                    "--inh-caps=-all",
                ]);
                c.arg(crate::sampling::gpulse_bin());
                c
            }
            None => Command::new(crate::sampling::gpulse_bin()),
        };
        let out = command
            .args(["snapshot", "--format", "json", "--nvml-lib"])
            .arg(crate::sampling::sim_lib())
            .env("NVML_SIM_SCENARIO", &scenario)
            .env("RANK_PID", rank.pid().to_string())
            .env("GPULSE_KUBELET_SOCKET", "none")
            .env("GPULSE_LOG", "warn")
            .output()
            .expect("run gpulse snapshot");
        assert!(out.status.success(), "{user:?}: {out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let process = json["processes"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["pid"] == rank.pid()))
            .unwrap_or_else(|| panic!("{user:?}: the rank is listed: {json:#}"))
            .clone();
        process["workload"].clone()
    };
    let as_root = workload_as(None);
    assert_eq!(as_root["job_id"], "run-7", "{as_root:#}");
    assert_eq!(as_root["rank"]["rank"], 1, "{as_root:#}");
    let as_nobody = workload_as(Some("65534"));
    assert!(as_nobody["job_id"].is_null(), "{as_nobody:#}");
    assert!(as_nobody["rank"].is_null(), "{as_nobody:#}");
    // What nobody may read still comes: the executable's name from /proc/<pid>/stat.
    assert!(!as_nobody["executable_name"].is_null(), "{as_nobody:#}");
}

/// The names a DRA allocation gives reach what users read, not just the attributor: `/metrics`
/// (dcgm-exporter's GPU series and gpulse's process series) and `snapshot`, from the real
/// binary on nvml-sim, a proc root of pod processes and a kubelet stand-in serving the
/// pod-resources protobuf with one device-plugin GPU and one DRA GPU (minor 3, not its index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_and_device_plugin_pods_are_named_in_metrics_and_snapshot() {
    const GPU_1: &str = "GPU-11111111-1111-4111-8111-111111111111";
    let scenario = format!(
        r#"
[driver]
version = "550.54.15"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{GPU_0}"

[device.signals]
gpu_util = 60

[[device.process]]
pid = 920
memory_used_mib = 1000
sm_util = 50

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "{GPU_1}"
minor = 3

[device.signals]
gpu_util = 40

[[device.process]]
pid = 921
memory_used_mib = 2000
sm_util = 30
"#
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let kubelet = FakeKubelet {
        pods: vec![
            pod("ml", "dp-gpu", "trainer", &[GPU_0]),
            dra_pod("research", "dra-gpu", "train", "one-gpu", &["gpu-3"]),
        ],
    };
    let (socket, server) = serve(dir.path(), kubelet).await;
    let root = fixture_root();
    FakeProc::new(
        920,
        pod_cgroup("00000000-0000-4000-8000-000000000020", ID_A),
    )
    .write(root.path());
    FakeProc::new(
        921,
        pod_cgroup("00000000-0000-4000-8000-000000000021", ID_A),
    )
    .write(root.path());
    let socket_arg = socket.to_str().expect("utf-8").to_string();
    let root_arg = root.path().to_str().expect("utf-8").to_string();
    let pod_flags = [
        "--proc-root",
        root_arg.as_str(),
        "--kubelet-socket",
        socket_arg.as_str(),
    ];

    let mut args = crate::prometheus::SCRAPED_RUN.to_vec();
    args.extend_from_slice(&pod_flags);
    args.extend_from_slice(&["--prometheus-names", "dcgm"]);
    let text = tokio::task::block_in_place(|| {
        // `Gpulse::start` turns the kubelet off for tests that do not serve one: turn it on.
        let gpulse = crate::run::Gpulse::start(
            &scenario,
            &[],
            &args,
            &[("GPULSE_KUBELET_SOCKET", socket_arg.clone())],
        );
        let port = crate::prometheus::metrics_port(&gpulse);
        crate::prometheus::scrape_until(port, |t| {
            t.contains("pod=\"dra-gpu\"") && t.contains("pod=\"dp-gpu\"")
        })
    });
    let gpu_series = crate::prometheus::series(&text, "DCGM_FI_DEV_GPU_UTIL");
    let labels_of = |uuid: &str| {
        gpu_series
            .iter()
            .find(|(labels, _)| labels.contains(&format!("UUID=\"{uuid}\"")))
            .unwrap_or_else(|| panic!("no DCGM_FI_DEV_GPU_UTIL for {uuid}: {gpu_series:?}"))
            .0
    };
    let dp = labels_of(GPU_0);
    assert!(
        dp.contains("pod=\"dp-gpu\"")
            && dp.contains("namespace=\"ml\"")
            && dp.contains("container=\"trainer\""),
        "{dp}"
    );
    let dra = labels_of(GPU_1);
    assert!(
        dra.contains("pod=\"dra-gpu\"")
            && dra.contains("namespace=\"research\"")
            && dra.contains("container=\"train\""),
        "{dra}"
    );
    // gpulse's own per-process series carry the pod as a resource label.
    let process = crate::prometheus::series(&text, "process_gpu_memory_usage_bytes");
    assert!(
        process
            .iter()
            .any(|(l, _)| l.contains("process_pid=\"921\"") && l.contains("dra-gpu")),
        "{process:?}"
    );

    let snapshot = tokio::task::block_in_place(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, &scenario).expect("write scenario");
        Command::new(crate::sampling::gpulse_bin())
            .args(["snapshot", "--format", "json", "--nvml-lib"])
            .arg(crate::sampling::sim_lib())
            // `snapshot` has no flags for these: the environment, as in a DaemonSet.
            .env("GPULSE_PROC_ROOT", &root_arg)
            .env("GPULSE_KUBELET_SOCKET", &socket_arg)
            .env("NVML_SIM_SCENARIO", &path)
            .output()
            .expect("run gpulse snapshot")
    });
    let stdout = String::from_utf8_lossy(&snapshot.stdout);
    assert!(
        snapshot.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&snapshot.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("snapshot JSON");
    let names_of = |pid: u64| {
        let workload = json["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("snapshot lists pid {pid}: {json:#}"))["workload"]
            .clone();
        (
            workload["namespace_name"].as_str().map(str::to_string),
            workload["pod_name"].as_str().map(str::to_string),
            workload["container_name"].as_str().map(str::to_string),
        )
    };
    let some = |a: &str, b: &str, c: &str| (Some(a.into()), Some(b.into()), Some(c.into()));
    assert_eq!(names_of(920), some("ml", "dp-gpu", "trainer"));
    assert_eq!(names_of(921), some("research", "dra-gpu", "train"));
    server.abort();
}
