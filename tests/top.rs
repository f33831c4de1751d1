//! `gpulse top` end to end, as a person sees it: the binary runs in a real terminal (tmux at
//! 160×50, `terminal::Tmux`) against the independent NVML implementation
//! (tests/fixtures/other-nvml) that lists real sleeping processes, one of them in a Docker-style
//! cgroup with a child of its own. The screen is read with `capture-pane` and driven with
//! `send-keys`.
//!
//! Needs Debian's `tmux` (/usr/bin/tmux) and root with a writable cgroup2 hierarchy; without them
//! the test fails and says what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kernel::{child_of, is_root, join_cgroup, CgroupGuard, ChildGuard, KillOnDrop};
use crate::other_nvml::build_library;
use crate::sampling::gpulse_bin;
use crate::terminal::Tmux;

/// A Docker container id; the view shows its first 12 characters.
const CONTAINER_ID: &str = "70b5c0ffee00d15ea5ed0123456789abcdef0123456789abcdef0123456789ab";

/// The cgroup2 mount: `/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on a hybrid
/// one.
fn cgroup2_root() -> PathBuf {
    let pure = Path::new("/sys/fs/cgroup");
    if pure.join("cgroup.controllers").exists() {
        return pure.to_path_buf();
    }
    let hybrid = pure.join("unified");
    assert!(
        hybrid.join("cgroup.procs").exists(),
        "no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified: the test needs one to \
         put a process in a Docker-style cgroup"
    );
    hybrid
}

/// Whether `line` is the process table's row of `pid` on GPU `gpu`: "│GPU [MIG] PID …", the MIG
/// column (GI and profile) between them while a process runs on a MIG instance.
fn is_row(line: &str, gpu: u32, pid: u32) -> bool {
    let Some(rest) = line.strip_prefix('│') else {
        return false;
    };
    let mut words = rest.split_whitespace();
    words.next() == Some(gpu.to_string().as_str()) && words.take(3).any(|w| w == pid.to_string())
}

/// The line of the process table of `pid` on GPU `gpu`.
fn table_row(screen: &str, gpu: u32, pid: u32) -> Option<&str> {
    screen.lines().find(|l| is_row(l, gpu, pid))
}

fn row_index(screen: &str, pid: u32) -> usize {
    screen
        .lines()
        .position(|l| is_row(l, 0, pid))
        .unwrap_or_else(|| panic!("no table row for pid {pid}:\n{screen}"))
}

#[test]
fn top_in_tmux_shows_gpus_processes_containers_and_findings_and_obeys_keys() {
    assert!(
        is_root(),
        "this test moves a process into a Docker-style cgroup and needs root"
    );
    let lib_dir = tempfile::tempdir().expect("temp dir");
    let lib = build_library(lib_dir.path());

    // Declared before the processes, so their cgroup is removed after they are killed.
    let mut cgroups = CgroupGuard::default();
    let container = cgroups
        .create(&cgroup2_root(), &format!("docker/{CONTAINER_ID}"))
        .unwrap_or_else(|e| panic!("cannot create a cgroup under {:?}: {e}", cgroup2_root()));
    // The "trainer": a shell whose child (the "DataLoader worker") sleeps.
    let trainer = ChildGuard::spawn(Command::new("sh").args(["-c", "sleep 1000 & wait"]))
        .expect("spawn the trainer");
    let worker = child_of(trainer.pid()).expect("the trainer's child");
    let _worker_guard = KillOnDrop(worker);
    join_cgroup(&container, trainer.pid()).expect("move the trainer into the container cgroup");
    let other = ChildGuard::spawn(Command::new("sleep").arg("1000")).expect("spawn a sleeper");
    let (trainer_pid, other_pid) = (trainer.pid(), other.pid());

    // Memory: the trainer 1 GiB, the other 3 GiB, so the GPU-memory sort puts the other first.
    let command = format!(
        "env OTHER_NVML_PIDS={trainer_pid}:1073741824,{other_pid}:3221225472 \
         GPULSE_KUBELET_SOCKET=none GPULSE_LOG=warn {bin} top --nvml-lib {lib}; \
         echo gpulse-exit=$?; stty -a | tr ' ' '\\n' | grep -x -e icanon -e echo | tr '\\n' ' '; \
         echo; exec sleep 600",
        bin = gpulse_bin(),
        lib = lib.display(),
    );
    let tmux = Tmux::new("top");
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "50",
        "sh",
        "-c",
        &command,
    ]);
    let short = &CONTAINER_ID[..12];
    let screen = tmux.wait_for(
        "both GPUs and both processes",
        Duration::from_secs(30),
        |s| table_row(s, 0, trainer_pid).is_some() && table_row(s, 0, other_pid).is_some(),
    );
    assert!(screen.contains("Other Board A"), "{screen}");
    assert!(screen.contains("Other Board B"), "{screen}");
    assert!(screen.contains("driver 999.12.34"), "{screen}");
    let row = table_row(&screen, 0, trainer_pid).unwrap();
    assert!(row.contains(short), "container short id: {row}");
    assert!(
        !row.contains(&CONTAINER_ID[..13]),
        "only the short id: {row}"
    );
    assert!(row.contains("1024M"), "{row}");
    assert!(table_row(&screen, 0, other_pid).unwrap().contains("3072M"));
    // GPU 0 is in MIG mode (the library puts process i in GI 3 or GI 5 by i % 2): each row names
    // its instance, and each process, alone on it, shows its graphics-engine activity as SM%
    // once a GPM pair (two samples) exists.
    let mig_rows = [
        (trainer_pid, "GI3 2g.12gb", "83"),
        (other_pid, "GI5 1g.6gb", "9"),
    ];
    tmux.wait_for(
        "each MIG process's instance and activity",
        Duration::from_secs(30),
        |s| {
            mig_rows.iter().all(|(pid, instance, activity)| {
                table_row(s, 0, *pid).is_some_and(|row| {
                    row.contains(instance) && row.split_whitespace().any(|w| w == *activity)
                })
            })
        },
    );
    assert!(screen.contains("Findings ("), "{screen}");
    assert!(screen.contains("q quit"), "the key footer: {screen}");
    // Sorted by GPU memory: the 3 GiB process first.
    assert!(
        row_index(&screen, other_pid) < row_index(&screen, trainer_pid),
        "{screen}"
    );

    // Sort by PID: ascending.
    tmux.keys(&["p"]);
    let screen = tmux.wait_for("sort by PID", Duration::from_secs(5), |s| {
        s.contains("sort: PID")
    });
    assert_eq!(
        row_index(&screen, trainer_pid) < row_index(&screen, other_pid),
        trainer_pid < other_pid,
        "{screen}"
    );

    // Filter by the container short id: only the trainer is left.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", short]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the filter", Duration::from_secs(5), |s| {
        s.contains(&format!("filter: {short}")) && table_row(s, 0, other_pid).is_none()
    });
    assert!(table_row(&screen, 0, trainer_pid).is_some(), "{screen}");
    tmux.keys(&["/", "Escape"]);
    tmux.wait_for("the filter cleared", Duration::from_secs(5), |s| {
        table_row(s, 0, other_pid).is_some() && !s.contains("filter:")
    });

    // Tree: the trainer's child under it.
    tmux.keys(&["t"]);
    let screen = tmux.wait_for("the tree", Duration::from_secs(5), |s| {
        s.lines()
            // A descendant has no GPU (nor MIG instance): its PID is the row's first word.
            .any(|l| {
                l.strip_prefix('│')
                    .and_then(|rest| rest.split_whitespace().next())
                    == Some(worker.to_string().as_str())
                    && l.contains("└ sleep")
            })
    });
    assert!(screen.contains("tree"), "{screen}");

    // Enter on the trainer (first by PID when it is the lower one; select it explicitly).
    let trainer_first = row_index(&screen, trainer_pid) < row_index(&screen, other_pid);
    tmux.keys(&[if trainer_first { "g" } else { "G" }]);
    if !trainer_first {
        // In the tree the trainer's worker follows it: from the end, go up to the trainer.
        tmux.keys(&["k"]);
    }
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the detail pane", Duration::from_secs(5), |s| {
        s.contains(&format!("pid {trainer_pid} (Enter or Esc closes)"))
    });
    assert!(
        screen.contains(CONTAINER_ID),
        "full container id in the detail: {screen}"
    );
    assert!(
        screen.contains(&format!("{worker} sleep")),
        "its child: {screen}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_for("the detail closed", Duration::from_secs(5), |s| {
        !s.contains("Enter or Esc closes")
    });

    // q: exits 0 within 2 s, and the shell after it has a sane terminal back.
    let asked = Instant::now();
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(5), |s| {
        s.contains("gpulse-exit=")
    });
    let took = asked.elapsed();
    assert!(screen.contains("gpulse-exit=0"), "{screen}");
    assert!(took < Duration::from_secs(2), "q took {took:?}");
    let modes = tmux.wait_for("stty's answer", Duration::from_secs(5), |s| {
        s.contains("icanon echo")
    });
    assert!(
        !modes.contains("Other Board A"),
        "the alternate screen was left: {modes}"
    );
}

#[test]
fn top_without_a_terminal_says_so_and_points_to_snapshot() {
    let output = Command::new(gpulse_bin())
        .args(["top", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env("GPULSE_KUBELET_SOCKET", "none")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run gpulse top");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
    assert!(stderr.contains("standard output is not one"), "{stderr}");
    assert!(stderr.contains("gpulse snapshot"), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing drawn on a pipe");
}

#[test]
fn top_restores_the_terminal_on_sigterm_and_sighup() {
    let lib_dir = tempfile::tempdir().expect("temp dir");
    let lib = build_library(lib_dir.path());
    let sleeper = ChildGuard::spawn(Command::new("sleep").arg("1000")).expect("spawn a sleeper");
    for signal in ["TERM", "HUP"] {
        let pid_file = lib_dir.path().join(format!("top-{signal}.pid"));
        // The inner shell writes its PID and becomes gpulse, in the foreground of the terminal.
        let command = format!(
            "sh -c 'echo $$ > {pid_file}; exec env OTHER_NVML_PIDS={pid}:1073741824 \
             GPULSE_KUBELET_SOCKET=none GPULSE_LOG=warn {bin} top --nvml-lib {lib}'; \
             echo gpulse-exit=$?; stty -a | tr ' ' '\\n' | grep -x -e icanon -e echo | tr '\\n' ' '; \
             echo; exec sleep 600",
            pid_file = pid_file.display(),
            pid = sleeper.pid(),
            bin = gpulse_bin(),
            lib = lib.display(),
        );
        let tmux = Tmux::new("top");
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "120",
            "-y",
            "40",
            "sh",
            "-c",
            &command,
        ]);
        tmux.wait_for("the view", Duration::from_secs(20), |s| {
            s.contains("Other Board A")
        });
        let gpulse: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("a pid");
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &gpulse.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {gpulse}");
        let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(5), |s| {
            s.contains("gpulse-exit=")
        });
        assert!(screen.contains("gpulse-exit=0"), "SIG{signal}: {screen}");
        let modes = tmux.wait_for("stty's answer", Duration::from_secs(5), |s| {
            s.contains("icanon echo")
        });
        assert!(
            !modes.contains("Other Board A"),
            "SIG{signal} left the alternate screen: {modes}"
        );
    }
}

/// The cells of the roll-up panel's line of job `job`: KIND ID NAME PROCS GPU-HOURS KWH IDLE COST.
fn rollup_cells<'a>(screen: &'a str, job: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .find(|l| l.starts_with("│job ") && l.split_whitespace().nth(1) == Some(job))
        .map(|l| l.trim_matches('│').split_whitespace().collect())
}

#[test]
fn top_in_tmux_rolls_a_time_sliced_job_up_with_its_energy_and_cost() {
    // Two ranks of SLURM job 7001 (job id slurm-7001) time-slice GPU 1 of nvml-sim's shared-gpus scenario (300 W,
    // 40 % and 20 % SM busy): the job holds 2 GPU-seconds a second and is charged
    // 300 W × (0.4 + 0.2) of energy, so its kWh are 0.09 × its GPU-hours at any moment.
    let (a, b) = (
        crate::energy::slurm_sleeper("7001"),
        crate::energy::slurm_sleeper("7001"),
    );
    let (alone, pair) = (
        crate::energy::sleeper(),
        [crate::energy::sleeper(), crate::energy::sleeper()],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("scenario.toml");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/nvml-sim/scenarios/shared-gpus.toml"
        ),
        &scenario,
    )
    .expect("copy scenario");
    let command = format!(
        "env NVML_SIM_SCENARIO={scenario} SHARED_SLICE_A_PID={a} SHARED_SLICE_B_PID={b} \
         SHARED_MIG_ALONE_PID={alone} SHARED_MIG_PAIR_PIDS={p0},{p1} \
         GPULSE_KUBELET_SOCKET=none GPULSE_LOG=warn \
         {bin} top --nvml-lib {lib} --cost-per-gpu-hour 3.6; echo gpulse-exit=$?; exec sleep 600",
        scenario = scenario.display(),
        a = a.pid(),
        b = b.pid(),
        alone = alone.pid(),
        p0 = pair[0].pid(),
        p1 = pair[1].pid(),
        bin = gpulse_bin(),
        lib = crate::sampling::sim_lib().display(),
    );
    let tmux = Tmux::new("top-rollups");
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top-rollups",
        "-x",
        "120",
        "-y",
        "40",
        "sh",
        "-c",
        &command,
    ]);
    tmux.wait_for("the processes", Duration::from_secs(30), |s| {
        table_row(s, 1, a.pid()).is_some() && table_row(s, 1, b.pid()).is_some()
    });
    assert!(
        !tmux.screen().contains("Roll-ups"),
        "hidden until asked: {}",
        tmux.screen()
    );
    tmux.keys(&["r"]);
    // 120 columns: every column, KIND ID NAME PROCS GPU-HOURS KWH IDLE COST (a job has no name).
    let hours = |cells: &[&str]| cells[4].parse::<f64>().expect("GPU-hours");
    // At least 4 s of the two ranks: 8 GPU-seconds, 0.002222 GPU-hours.
    let screen = tmux.wait_for("the job's roll-up", Duration::from_secs(30), |s| {
        rollup_cells(s, "slurm-7001").is_some_and(|c| c.len() == 8 && hours(&c) >= 0.002222)
    });
    assert!(
        screen.contains("Roll-ups (1) since the view started"),
        "only the job: no process here has a pod or a container: {screen}"
    );
    assert!(!screen.contains("no price"), "a price was given: {screen}");
    let cells = rollup_cells(&screen, "slurm-7001").expect("the job's line");
    let (gpu_hours, kwh, cost): (f64, f64, f64) = (
        cells[4].parse().expect("GPU-hours"),
        cells[5].parse().expect("kWh"),
        cells[7].parse().expect("cost"),
    );
    assert_eq!(
        (cells[0], cells[2], cells[3], cells[6]),
        ("job", "-", "2", "0%"),
        "{cells:?}"
    );
    assert!((cost - gpu_hours * 3.6).abs() <= 1e-4, "{cells:?}");
    // Six decimals of kWh: about 2e-4 kWh here, so 1 % covers the rounding.
    assert!(
        (kwh - 0.09 * gpu_hours).abs() <= 0.01 * kwh + 1e-6,
        "300 W × 0.6 per 2 GPUs: {cells:?}"
    );
    // The totals grow from one window to the next.
    tmux.wait_for("the job's hours to grow", Duration::from_secs(10), |s| {
        rollup_cells(s, "slurm-7001").is_some_and(|c| c.len() == 8 && hours(&c) > gpu_hours)
    });
    tmux.keys(&["r"]);
    tmux.wait_for("the panel hidden", Duration::from_secs(5), |s| {
        !s.contains("Roll-ups")
    });
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(5), |s| {
        s.contains("gpulse-exit=")
    });
    assert!(screen.contains("gpulse-exit=0"), "{screen}");
}

/// The nvml-sim node of the ranks test: one GPU per process listed in `GPULSE_TOP_PID_<i>`.
fn ranks_scenario(count: usize) -> String {
    let mut text = String::from(
        "[driver]\nversion = \"570.124.06\"\nnvml_version = \"12.570.124.06\"\n\
         cuda_version = \"12.8\"\n",
    );
    for i in 0..count {
        text.push_str(&format!(
            "\n[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\n\
             uuid = \"GPU-70970000-1111-2222-3333-00000000000{i}\"\n\
             pci_bus_id = \"00000000:{bus:02X}:00.0\"\nmemory_total_mib = 81559\n\n\
             [device.signals]\ngpu_util = 60\n\n[[device.process]]\n\
             pid_env = \"GPULSE_TOP_PID_{i}\"\nname = \"python3\"\nkind = \"compute\"\n\
             memory_used_mib = 2048\nsm_util = 50\n",
            bus = 0x18 + i
        ));
    }
    text
}

/// Ranks in a real terminal: a process whose launcher variables (`RANK`, `WORLD_SIZE`,
/// `SLURM_JOB_ID`) are all gpulse knows of it shows `slurm-55/0` from its environment alone;
/// three ranks of job `job-t` that send the companion's step spans (tests/backends/rank.py, as
/// the PyTorch companion would) to `top --otlp-receiver-http` show their job and rank, and the
/// one the others wait for in all-reduce (rank 2: no collective wait while ranks 0 and 1 wait
/// 60 % of each step) is marked SLOW, with its step figures in the detail pane.
#[test]
fn top_in_tmux_shows_ranks_from_the_environment_and_marks_the_straggler_it_hears() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = crate::framework::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let rank_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/backends/rank.py");
    // (rank, collective wait per 0.2 s step): rank 2 waits for nobody.
    let ranks: Vec<ChildGuard> = [(0, "0.12"), (1, "0.12"), (2, "0.0")]
        .into_iter()
        .map(|(rank, wait)| {
            let rank = rank.to_string();
            ChildGuard::spawn(
                Command::new(crate::common::python())
                    .arg(&rank_py)
                    .args([url.as_str(), "job-t", &rank, "0.2", wait])
                    .env("TORCHELASTIC_RUN_ID", "job-t")
                    .env("RANK", &rank)
                    .env("LOCAL_RANK", &rank)
                    .env("WORLD_SIZE", "3"),
            )
            .expect("spawn a rank")
        })
        .collect();
    let env_only = ChildGuard::spawn(
        Command::new("sleep")
            .arg("1000")
            .env("SLURM_JOB_ID", "55")
            .env("RANK", "0")
            .env("WORLD_SIZE", "1"),
    )
    .expect("spawn the environment-only rank");
    let mut pids: Vec<u32> = ranks.iter().map(ChildGuard::pid).collect();
    pids.push(env_only.pid());
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, ranks_scenario(pids.len())).expect("write the scenario");
    // The rule's thresholds made short enough to decide within the test (defaults: 1 min).
    let config = dir.path().join("gpulse.toml");
    std::fs::write(
        &config,
        "[diagnosis.input_bound]\nstep_lookback = \"8s\"\nmin_steps = 5\n\n\
         [diagnosis.rank_straggler]\nmin_duration = \"3s\"\nmin_steps = 5\n",
    )
    .expect("write the config");
    let pid_vars: String = pids
        .iter()
        .enumerate()
        .map(|(i, pid)| format!("GPULSE_TOP_PID_{i}={pid} "))
        .collect();
    let command = format!(
        "env {pid_vars}NVML_SIM_SCENARIO={scenario} GPULSE_KUBELET_SOCKET=none GPULSE_LOG=warn \
         {bin} top --nvml-lib {lib} --config {config} --otlp-receiver-http {port}; \
         echo gpulse-exit=$?; exec sleep 600",
        scenario = scenario.display(),
        bin = gpulse_bin(),
        lib = crate::sampling::sim_lib().display(),
        config = config.display(),
    );
    let tmux = Tmux::new("ranks");
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "ranks",
        "-x",
        "200",
        "-y",
        "50",
        "sh",
        "-c",
        &command,
    ]);
    let row_of = |screen: &str, gpu: u32, pid: u32| table_row(screen, gpu, pid).map(str::to_string);
    let screen = tmux.wait_for(
        "the environment-only rank's job/rank",
        Duration::from_secs(60),
        |s| row_of(s, 3, env_only.pid()).is_some_and(|r| r.contains("slurm-55/0")),
    );
    assert!(screen.contains("JOB/RANK"), "{screen}");

    let straggler = ranks[2].pid();
    let screen = tmux.wait_for(
        "rank 2 marked SLOW from the spans top hears",
        // 3 s of min_duration after 5 steps of every rank, on a loaded 2-core machine.
        Duration::from_secs(120),
        |s| row_of(s, 2, straggler).is_some_and(|r| r.contains("job-t/2 SLOW")),
    );
    for (gpu, rank) in ranks.iter().take(2).enumerate() {
        let row = row_of(&screen, gpu as u32, rank.pid()).expect("a row per rank");
        assert!(row.contains(&format!("job-t/{gpu}")), "{row}");
        assert!(!row.contains("SLOW"), "only rank 2 is the straggler: {row}");
    }
    assert!(!row_of(&screen, 3, env_only.pid()).unwrap().contains("SLOW"));
    assert!(screen.contains("rank_straggler"), "the finding: {screen}");

    // The detail pane of rank 2: sort by PID and walk to its row.
    tmux.keys(&["p", "g"]);
    let mut sorted = pids.clone();
    sorted.sort_unstable();
    let index = sorted.iter().position(|p| *p == straggler).unwrap();
    for _ in 0..index {
        tmux.keys(&["j"]);
    }
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("rank 2's detail pane", Duration::from_secs(10), |s| {
        s.contains(&format!("pid {straggler} (Enter or Esc closes)"))
            && s.contains("step / in collectives")
    });
    let line = screen
        .lines()
        .find(|l| l.contains("step / in collectives"))
        .unwrap();
    assert!(line.contains("200 ms / 0 ms (0% of the step)"), "{line}");
    assert!(
        screen.contains("job-t/2  ← the straggler of its job"),
        "{screen}"
    );
    tmux.keys(&["Escape", "q"]);
    let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(5), |s| {
        s.contains("gpulse-exit=")
    });
    assert!(screen.contains("gpulse-exit=0"), "{screen}");
    drop(dir);
}

/// `top --otlp-receiver-http` on an address already taken fails before drawing, saying which
/// address and what to do.
#[test]
fn top_with_its_receiver_on_a_taken_port_says_so() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let port = taken.local_addr().unwrap().port();
    let sleeper = ChildGuard::spawn(Command::new("sleep").arg("1000")).expect("spawn a sleeper");
    let lib_dir = tempfile::tempdir().expect("temp dir");
    let lib = build_library(lib_dir.path());
    let command = format!(
        "env OTHER_NVML_PIDS={pid}:1073741824 GPULSE_KUBELET_SOCKET=none {bin} top \
         --nvml-lib {lib} --otlp-receiver-http {port}; echo gpulse-exit=$?; exec sleep 600",
        pid = sleeper.pid(),
        bin = gpulse_bin(),
        lib = lib.display(),
    );
    let tmux = Tmux::new("taken");
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "taken",
        "-x",
        "160",
        "-y",
        "40",
        "sh",
        "-c",
        &command,
    ]);
    let screen = tmux.wait_for("gpulse to exit", Duration::from_secs(20), |s| {
        s.contains("gpulse-exit=")
    });
    let flat = screen.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!flat.contains("gpulse-exit=0"), "{screen}");
    assert!(
        flat.contains(&format!(
            "could not listen for OTLP/HTTP on 127.0.0.1:{port}"
        )),
        "{screen}"
    );
    assert!(flat.contains("--otlp-receiver-http"), "{screen}");
    drop(taken);
}
