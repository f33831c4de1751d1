//! The hot-path benchmarks, shared by one bench binary per nvml-sim scenario (the simulator
//! reads its scenario once per process, so a scenario cannot change inside one binary).
//!
//! Groups, each named after the scenario (`8x64`, `64x1024`):
//! - `sample_cycle/gpulse` is `Sampler::sample`, and `sample_cycle/bare_nvml` the floor
//!   (`gpulse::sampling::floor::Floor`): the same NVML calls, derived from the schema and
//!   checked call for call by tests/floor.rs, through the same library and the same
//!   nvml-wrapper, with none of gpulse's bookkeeping (error classification, process merge,
//!   snapshot building);
//! - `aggregate/add` folds one snapshot into the open window, `aggregate/take_10` closes a
//!   window of ten samples;
//! - `attribution/warm` resolves every GPU process with a warm cache (one `stat` read per PID),
//!   `attribution/churn` with an eighth of the PIDs new on every call (their files read in
//!   full), against a generated procfs tree (containerd pods, `OTEL_SERVICE_NAME` in environ);
//! - `attribution_real/per_reader` and `attribution_real/shared_table`: one window's procfs work
//!   on real sleeping processes under `/proc`, before and after the shared per-window process
//!   table, in CPU time of the benchmark thread;
//! - `export/build` is `metrics_batch` over a ten-sample window, `export/build_encode` the
//!   same plus `MetricsBatch::encode`, the bytes the transports put on the wire;
//!   `export/prost_build_encode` is the reference it replaced: the same request built as
//!   prost messages (`metrics_request`) and encoded with `encode_to_vec`, the same bytes.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BatchSize, Criterion};
use gpulse::attribution::{
    AttributedWindow, AttributionSettings, Attributor, CauseBook, GpuAccountant, GpuProcessRef,
    ParentWatch, ProcessUsage, StepPhases,
};
use gpulse::export::metrics::{metrics_batch, metrics_request};
use gpulse::export::resource::NodeIdentity;
use gpulse::sampling::floor::Floor;
use gpulse::sampling::{Sampler, Snapshot, Window, WindowAggregator};
use prost::Message;

/// Samples per export window in the aggregation and export benches (1 s export, 100 ms sampling).
const WINDOW_SAMPLES: usize = 10;

/// Runs every group against `scenario` (a file name under `nvml-sim/scenarios/`).
pub fn run(label: &str, scenario: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Before the first NVML init of this process: the simulator reads it once.
    std::env::set_var(
        "NVML_SIM_SCENARIO",
        root.join("nvml-sim/scenarios").join(scenario),
    );
    let lib = sim_lib(root);

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();

    let mut sampler = match Sampler::open(&lib) {
        Ok(sampler) => sampler,
        Err(e) => panic!("benchmark needs the simulator: {e}"),
    };
    let first = sample(&mut sampler);
    assert!(
        !first.devices.is_empty() && !first.processes.is_empty(),
        "scenario {scenario} gave {} devices and {} processes: expected both",
        first.devices.len(),
        first.processes.len()
    );

    let mut group = c.benchmark_group(format!("sample_cycle/{label}"));
    group.bench_function("gpulse", |b| b.iter(|| black_box(sample(&mut sampler))));
    let mut floor = Floor::new(std::sync::Arc::clone(sampler.nvml()));
    floor.tick();
    group.bench_function("bare_nvml", |b| b.iter(|| black_box(floor.tick())));
    group.finish();

    let snapshots: Vec<Snapshot> = (0..WINDOW_SAMPLES).map(|_| sample(&mut sampler)).collect();
    let mut group = c.benchmark_group(format!("aggregate/{label}"));
    let mut aggregator = WindowAggregator::new();
    let mut next = 0usize;
    group.bench_function("add", |b| {
        b.iter(|| {
            aggregator.add(&snapshots[next % WINDOW_SAMPLES]);
            next += 1;
            // Keep the window bounded, as the export task would.
            if aggregator.sample_count() as usize >= WINDOW_SAMPLES {
                black_box(aggregator.take());
            }
        })
    });
    group.bench_function("take_10", |b| {
        b.iter_batched(
            || {
                let mut a = WindowAggregator::new();
                for s in &snapshots {
                    a.add(s);
                }
                a
            },
            |mut a| black_box(a.take()),
            BatchSize::SmallInput,
        )
    });
    group.finish();

    let window = window_of(&snapshots);
    let pids: Vec<u32> = {
        let mut pids: Vec<u32> = window.processes.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    };
    let tree = FakeProc::new(&pids);
    let mut group = c.benchmark_group(format!("attribution/{label}"));
    let mut warm = tree.attributor();
    let refs: Vec<GpuProcessRef<'_>> = window
        .processes
        .iter()
        .map(|p| GpuProcessRef {
            pid: p.pid,
            device_uuid: &p.device_uuid,
            device_minor: None,
            mig: None,
        })
        .collect();
    let workloads = warm.resolve_processes(&refs);
    assert!(
        workloads.values().all(|w| w.container_id.is_some()),
        "the generated procfs tree should attribute every PID to a container"
    );
    group.bench_function("warm", |b| {
        b.iter(|| black_box(warm.resolve_processes(&refs)))
    });
    let mut churning = tree.attributor();
    let mut round = 0usize;
    group.bench_function("churn_1_in_8", |b| {
        b.iter(|| {
            round += 1;
            black_box(churning.resolve_processes(&tree.churned(&refs, round)))
        })
    });
    group.finish();
    real_processes(&mut c, label, &window);

    let node = NodeIdentity {
        host_name: "gpu-node-17".into(),
        service_name: "gpulse".into(),
        service_instance_id: "6f1c1e0e-6b1a-4a61-9d0e-4f6f8f0a2b11".into(),
        service_version: "0.1.0".into(),
        extra_attributes: vec![("k8s.node.name".into(), "gpu-node-17".into())],
    };
    let usage: HashMap<u32, ProcessUsage> = pids
        .iter()
        .map(|&pid| {
            let u = ProcessUsage {
                cpu_utilization: Some(0.93),
                tree_cpu_utilization: Some(3.1),
                memory_rss_bytes: Some(12 << 30),
            };
            (pid, u)
        })
        .collect();
    let mut accountant = GpuAccountant::default();
    let mut group = c.benchmark_group(format!("accounting/{label}"));
    group.bench_function("account", |b| {
        b.iter(|| black_box(accountant.account(&window, &workloads)))
    });
    // The ledger of the same window, every process a training loop waiting on data and in
    // collectives (the most causes a process can have).
    let accounts = GpuAccountant::default().account(&window, &workloads);
    let phases: HashMap<u32, StepPhases> = pids
        .iter()
        .map(|&pid| {
            let phases = StepPhases {
                in_step: 1.0,
                input_wait: 0.2,
                collective_wait: 0.3,
                waited_for_rank: None,
            };
            (pid, phases)
        })
        .collect();
    let mut book = CauseBook::default();
    group.bench_function("ledger", |b| {
        b.iter(|| black_box(book.charge(&accounts, &phases, &workloads)))
    });
    group.finish();
    let ledger = CauseBook::default().charge(&accounts, &phases, &workloads);
    let attributed = AttributedWindow {
        window: window.clone(),
        workloads,
        usage,
        parent_alive: HashMap::new(),
        accounts,
        departed: Default::default(),
        ledger,
    };
    let mut group = c.benchmark_group(format!("export/{label}"));
    group.bench_function("build", |b| {
        b.iter(|| black_box(metrics_batch(&attributed, &node)))
    });
    group.bench_function("build_encode", |b| {
        b.iter(|| {
            let batch = metrics_batch(&attributed, &node);
            black_box(batch.encode())
        })
    });
    group.bench_function("prost_build_encode", |b| {
        b.iter(|| {
            let request = metrics_request(&attributed, &node);
            black_box(request.encode_to_vec())
        })
    });
    group.finish();

    c.final_summary();
}

/// `attribution_real/{label}`: one export window's procfs work (identity, CPU/RSS usage with
/// descendants, parent liveness) for the window's processes as real sleeping processes under
/// `/proc`, timed in CPU time of the benchmark thread (user + system, so a loaded machine's
/// waiting is not counted; the kernel's work for `/proc` is):
/// - `per_reader`: the attributor, the usage tracker and the parent watch each reading what
///   they need (every `stat` under `/proc` for descendants);
/// - `shared_table`: one `ProcessTable` per window (each `stat` read once, descendants through
///   the threads' `children` files) given to all three, as `gpulse run` does.
fn real_processes(c: &mut Criterion, label: &str, window: &Window) {
    let mut distinct: Vec<u32> = window.processes.iter().map(|p| p.pid).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let mut sleepers: Vec<std::process::Child> = Vec::with_capacity(distinct.len());
    for _ in &distinct {
        match std::process::Command::new("sleep").arg("100000").spawn() {
            Ok(child) => sleepers.push(child),
            Err(e) => panic!("cannot start a sleeping process: {e}"),
        }
    }
    let real: HashMap<u32, u32> = distinct
        .iter()
        .zip(&sleepers)
        .map(|(&sim, child)| (sim, child.id()))
        .collect();
    let refs: Vec<GpuProcessRef<'_>> = window
        .processes
        .iter()
        .map(|p| GpuProcessRef {
            pid: real[&p.pid],
            device_uuid: &p.device_uuid,
            device_minor: None,
            mig: None,
        })
        .collect();
    let pids: Vec<u32> = sleepers.iter().map(std::process::Child::id).collect();
    let settings = AttributionSettings {
        proc_root: PathBuf::from("/proc"),
        include_command_line: false,
        read_environ: true,
        kubelet_socket: None,
    };
    let mut group = c.benchmark_group(format!("attribution_real/{label}"));
    let mut attributor = Attributor::new(settings.clone());
    let mut parents = ParentWatch::new("/proc");
    group.bench_function("per_reader", |b| {
        b.iter_custom(|iters| {
            thread_cpu(|| {
                for _ in 0..iters {
                    black_box(attributor.resolve_processes(&refs));
                    black_box(attributor.usage(&pids));
                    black_box(parents.parent_alive(&pids));
                }
            })
        })
    });
    let mut attributor = Attributor::new(settings);
    let mut parents = ParentWatch::new("/proc");
    group.bench_function("shared_table", |b| {
        b.iter_custom(|iters| {
            thread_cpu(|| {
                for _ in 0..iters {
                    let table = attributor.process_table_of(&pids);
                    black_box(attributor.resolve_processes_in(&refs, &table));
                    black_box(attributor.usage_in(&pids, &table));
                    black_box(parents.parent_alive_in(&pids, &table));
                }
            })
        })
    });
    group.finish();
    for mut child in sleepers {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// CPU time (user + system) of the calling thread while `f` runs.
fn thread_cpu(f: impl FnOnce()) -> Duration {
    fn now() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer for clock_gettime; the clock id is a constant.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
    let start = now();
    f();
    now().saturating_sub(start)
}

/// The simulator built in release mode (`cargo build --release -p nvml-sim`), or
/// `GPULSE_BENCH_NVML_LIB`.
fn sim_lib(root: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os("GPULSE_BENCH_NVML_LIB") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let lib = target.join("release/libnvidia_ml.so");
    assert!(
        lib.exists(),
        "{} is missing: run `cargo build --release -p nvml-sim` first, or set \
         GPULSE_BENCH_NVML_LIB to a libnvidia-ml.so.1",
        lib.display()
    );
    lib
}

fn sample(sampler: &mut Sampler) -> Snapshot {
    match sampler.sample() {
        Ok(snapshot) => snapshot,
        Err(e) => panic!("the simulator stopped answering: {e}"),
    }
}

fn window_of(snapshots: &[Snapshot]) -> Window {
    let mut aggregator = WindowAggregator::new();
    for s in snapshots {
        aggregator.add(s);
    }
    match aggregator.take() {
        Some(window) => window,
        None => panic!("a window of {} snapshots came out empty", snapshots.len()),
    }
}

/// A procfs tree with one directory per PID: `stat`, `status`, `cgroup` (a containerd
/// container in a Kubernetes pod, cgroup v2), `environ` and an `exe` link, as the attributor
/// reads them. Holds twice the PIDs asked for, so churn can swap new processes in.
struct FakeProc {
    dir: tempfile::TempDir,
    pids: Vec<u32>,
    spares: Vec<u32>,
}

impl FakeProc {
    fn new(pids: &[u32]) -> Self {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("cannot create a temporary procfs tree: {e}"),
        };
        let top = pids.iter().copied().max().unwrap_or(0);
        let spares: Vec<u32> = (1..=pids.len() as u32).map(|i| top + i).collect();
        for (i, &pid) in pids.iter().chain(&spares).enumerate() {
            if let Err(e) = write_process(dir.path(), pid, i) {
                panic!("cannot write the procfs tree entry of {pid}: {e}");
            }
        }
        Self {
            dir,
            pids: pids.to_vec(),
            spares,
        }
    }

    fn attributor(&self) -> Attributor {
        Attributor::new(AttributionSettings {
            proc_root: self.dir.path().to_path_buf(),
            include_command_line: false,
            read_environ: true,
            kubelet_socket: None,
        })
    }

    /// `refs` with every eighth PID slot, shifted by `round`, replaced by a spare PID: a
    /// different eighth each round, so the attributor sees new processes on every call.
    fn churned<'a>(&self, refs: &[GpuProcessRef<'a>], round: usize) -> Vec<GpuProcessRef<'a>> {
        let replace: HashMap<u32, u32> = self
            .pids
            .iter()
            .enumerate()
            .filter(|(i, _)| (i + round) % 8 == 0)
            .map(|(i, &pid)| (pid, self.spares[(i + round * 7) % self.spares.len()]))
            .collect();
        refs.iter()
            .map(|r| GpuProcessRef {
                pid: replace.get(&r.pid).copied().unwrap_or(r.pid),
                ..*r
            })
            .collect()
    }
}

fn write_process(root: &Path, pid: u32, i: usize) -> std::io::Result<()> {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir)?;
    // Fields 3..=52 after "pid (comm)"; field 22 is the start time in clock ticks.
    let mut fields = vec!["0".to_string(); 50];
    fields[0] = "S".into();
    fields[22 - 3] = (1_000_000 + pid as u64).to_string();
    std::fs::write(
        dir.join("stat"),
        format!("{pid} (python3) {}\n", fields.join(" ")),
    )?;
    std::fs::write(
        dir.join("status"),
        format!(
            "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n\
             PPid:\t1\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n\
             NSpid:\t{pid}\t{}\nVmRSS:\t12582912 kB\n",
            1 + i % 8
        ),
    )?;
    let pod = format!("{:08x}-1c2d-4e5f-8a9b-{:012x}", i / 8, i / 8);
    std::fs::write(
        dir.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{:064x}.scope\n",
            pod.replace('-', "_"),
            i
        ),
    )?;
    std::fs::write(
        dir.join("environ"),
        format!(
            "PATH=/usr/bin\0HOME=/root\0OTEL_SERVICE_NAME=trainer-{}\0\
             OTEL_RESOURCE_ATTRIBUTES=team=ml,job.id={}\0",
            i / 8,
            i
        ),
    )?;
    let exe = dir.join("exe");
    if !exe.exists() {
        std::os::unix::fs::symlink("/usr/bin/python3.11", exe)?;
    }
    Ok(())
}
