//! Layout tests: a fixed window (two GPUs, a trainer in a container with a DataLoader worker, a
//! second process without one, one finding) drawn on ratatui's `TestBackend` at 80×24 and
//! 200×60, asserting on what a person would read on the screen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ratatui::backend::TestBackend;
use ratatui::style::Color;
use ratatui::Terminal;

use super::app::{App, RankMark, RowKind};
use super::input::Action;
use super::input::SortKey;
use super::procinfo::ProcessTrees;
use super::ui;
use crate::attribution::procfs::Stat;
use crate::attribution::usage::ProcessTable;
use crate::attribution::{AttributedWindow, AttributionMethod, ProcessUsage, Workload};
use crate::attribution::{GpuAccountant, Prices};
use crate::diagnosis::{DeviceRef, Finding, RuleId, Severity, Subject};
use crate::pipeline::View;
use crate::sampling::model::{DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample};
use crate::sampling::{Snapshot, WindowAggregator};
use crate::schema::DeviceField;

const CONTAINER: &str = "4f3c2b1a0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
const TRAINER: u32 = 4242;
const WORKER: u32 = 4300;
const OTHER: u32 = 5151;

fn info(index: u32, name: &str) -> Arc<DeviceInfo> {
    Arc::new(DeviceInfo {
        index,
        uuid: format!("GPU-{index}"),
        name: name.into(),
        pci_bus_id: format!("00000000:0{index}:00.0"),
        serial: None,
        minor_number: Some(index),
        memory_total_bytes: Some(80 << 30),
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        compute_capability: None,
        fan_count: None,
    })
}

fn snapshot(at: SystemTime) -> Snapshot {
    let mut devices = Vec::new();
    for (index, name) in [(0, "NVIDIA H100 80GB HBM3"), (1, "NVIDIA A100-SXM4-40GB")] {
        let mut d = DeviceSample::empty(info(index, name), DeviceStatus::Ok);
        d.set(
            DeviceField::UtilizationGpu,
            Some(if index == 0 { 0.12 } else { 0.97 }),
        );
        d.set(DeviceField::MemoryUsed, Some((20u64 << 30) as f64));
        d.set(DeviceField::MemoryTotal, Some((80u64 << 30) as f64));
        d.set(DeviceField::Temperature, Some(61.0));
        d.set(DeviceField::Power, Some(450.0));
        d.set(DeviceField::PowerLimit, Some(700.0));
        d.set(DeviceField::SmClock, Some(1755.0));
        d.set(DeviceField::MemoryClock, Some(2619.0));
        d.throttle_reasons = Some(if index == 1 { 0x4 } else { 0 });
        devices.push(d);
    }
    let process = |pid, device_index: u32, mem: u64, sm: f64| ProcessSample {
        pid,
        device_index,
        device_uuid: format!("GPU-{device_index}"),
        kind: ProcessKind::Compute,
        gpu_memory_bytes: Some(mem),
        sm_utilization: Some(sm),
        memory_utilization: None,
        encoder_utilization: None,
        decoder_utilization: None,
        mig: None,
    };
    Snapshot {
        at,
        driver_version: Some("570.124.06".into()),
        cuda_driver_version: Some("12.8".into()),
        nvml_version: None,
        devices,
        processes: vec![
            process(TRAINER, 0, 18 << 30, 0.11),
            process(OTHER, 1, 2 << 30, 0.95),
        ],
        events: vec![],
    }
}

fn view() -> Arc<View> {
    // A fixed moment, so that two renderings are identical.
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_400_000);
    let mut aggregator = WindowAggregator::new();
    aggregator.add(&snapshot(at));
    let window = aggregator.take().expect("a window");
    let trainer = Workload {
        vpid: Some(1),
        executable_name: Some("python3".into()),
        owner: Some("alice".into()),
        container_id: Some(CONTAINER.into()),
        container_runtime: Some("docker".into()),
        pod_uid: Some("0d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d".into()),
        pod_name: Some("trainer-0".into()),
        namespace_name: Some("ml".into()),
        service_name: Some("resnet-train".into()),
        attributed_by: AttributionMethod::HostPid,
        ..Workload::unresolved(TRAINER)
    };
    let other = Workload {
        executable_name: Some("llama-server".into()),
        owner: Some("bob".into()),
        attributed_by: AttributionMethod::HostPid,
        ..Workload::unresolved(OTHER)
    };
    let usage = |cpu| ProcessUsage {
        cpu_utilization: Some(cpu),
        tree_cpu_utilization: Some(cpu * 4.0),
        memory_rss_bytes: Some(3 << 30),
    };
    let finding = Finding {
        rule: RuleId::InputBound,
        related: Vec::new(),
        severity: Severity::Warning,
        subject: Subject::Workload {
            pid: TRAINER,
            vpid: Some(1),
            device: Some(DeviceRef {
                uuid: "GPU-0".into(),
                index: 0,
                mig: None,
            }),
            container_id: Some(CONTAINER.into()),
            pod_uid: None,
            service_name: "resnet-train".into(),
        },
        // As the rules write it: the subject first.
        summary: "pid 4242 (resnet-train) on GPU 0 is input-bound: GPU 12% busy while its \
                  process tree uses 4.0 CPU cores"
            .into(),
        advice: "raise DataLoader num_workers".into(),
        values: vec![],
        evidence: vec![
            crate::diagnosis::findings::Layer::Nvml,
            crate::diagnosis::findings::Layer::Procfs,
        ],
        since: at - Duration::from_secs(125),
    };
    Arc::new(View {
        attributed: Arc::new(AttributedWindow {
            window,
            workloads: HashMap::from([(TRAINER, trainer), (OTHER, other)]),
            usage: HashMap::from([(TRAINER, usage(1.0)), (OTHER, usage(0.05))]),
            parent_alive: HashMap::from([(TRAINER, true)]),
            accounts: Default::default(),
            departed: Default::default(),
            ledger: Default::default(),
        }),
        findings: vec![finding],
        training: Default::default(),
        at,
    })
}

fn app(color: bool) -> App {
    let mut app = App::new(Duration::from_secs(1), "gpu-node-7".into(), color);
    let stat = |comm: &str, ppid| Stat {
        comm: comm.into(),
        state: 'S',
        ppid,
        utime_ticks: 0,
        stime_ticks: 0,
        cutime_ticks: 0,
        cstime_ticks: 0,
        start_time_ticks: 1,
        num_threads: 1,
        rss_pages: 100,
    };
    let mut table = ProcessTable::default();
    table.insert(TRAINER, stat("python3", 1));
    table.insert(WORKER, stat("pt_data_worker", TRAINER));
    table.insert(OTHER, stat("llama-server", 1));
    let mut process_trees = ProcessTrees::new("/nonexistent");
    process_trees.refresh_from(&[TRAINER, OTHER], &table, Instant::now());
    app.process_trees = process_trees;
    app.observe(view(), Some(0.004));
    app
}

fn render(app: &App, width: u16, height: u16) -> (String, ratatui::buffer::Buffer) {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| ui::draw(f, app)).expect("draw");
    let buffer = terminal.backend().buffer().clone();
    let mut text = String::new();
    for y in 0..height {
        for x in 0..width {
            text.push_str(buffer[(x, y)].symbol());
        }
        text.push('\n');
    }
    (text, buffer)
}

fn line_with<'a>(screen: &'a str, needle: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} on\n{screen}"))
}

#[test]
fn at_80x24_everything_that_matters_is_on_screen() {
    let (screen, _) = render(&app(true), 80, 24);
    assert!(screen.contains("gpulse top"), "{screen}");
    assert!(screen.contains("host gpu-node-7"), "{screen}");
    assert!(screen.contains("driver 570.124.06"), "{screen}");
    assert!(screen.contains("CUDA 12.8"), "{screen}");
    assert!(screen.contains("gpulse CPU 0.4%"), "{screen}");
    // One line per GPU, names truncated to fit, both utilisation figures.
    let gpu0 = line_with(&screen, " 0 NVIDIA H100");
    assert!(
        gpu0.contains("12%") && gpu0.contains("20.0G/80.0G"),
        "{gpu0}"
    );
    let gpu1 = line_with(&screen, " 1 NVIDIA A100");
    assert!(gpu1.contains("97%"), "{gpu1}");
    // The process table keeps PID, container short id, service and command at this width.
    let trainer = line_with(&screen, &TRAINER.to_string());
    assert!(trainer.contains(&CONTAINER[..12]), "{trainer}");
    assert!(
        !trainer.contains(&CONTAINER[..13]),
        "short id only: {trainer}"
    );
    assert!(trainer.contains("resnet-train"), "{trainer}");
    assert!(trainer.contains("18432M"), "{trainer}");
    assert!(line_with(&screen, &OTHER.to_string()).contains("llama-server"));
    // Findings and the key footer.
    let finding = line_with(&screen, "input_bound");
    assert!(finding.contains("warning"), "{finding}");
    assert!(screen.contains("Findings (1)"), "{screen}");
    assert!(line_with(&screen, "q quit").contains("/ filter"));
    for line in screen.lines() {
        assert_eq!(line.chars().count(), 80);
    }
}

#[test]
fn at_200x60_every_column_and_the_gpu_history_are_shown() {
    let (screen, _) = render(&app(true), 200, 60);
    let header = line_with(&screen, "GPU MEM");
    for column in [
        "GPU",
        "PID",
        "VPID",
        "USER",
        "CONTAINER",
        "POD/NAMESPACE",
        "SERVICE",
        "SM%",
        "CPU%",
        "RSS",
        "COMMAND",
    ] {
        assert!(header.contains(column), "{column} missing: {header}");
    }
    let trainer = line_with(&screen, &TRAINER.to_string());
    for cell in [
        "alice",
        "ml/trainer-0",
        "resnet-train",
        "python3",
        "100",
        "3072M",
    ] {
        assert!(trainer.contains(cell), "{cell} missing: {trainer}");
    }
    // Full GPU names, and a second line with clocks, throttle reasons and sparklines.
    assert!(screen.contains("NVIDIA H100 80GB HBM3"), "{screen}");
    let clocks = screen
        .lines()
        .filter(|l| l.contains("clocks SM 1755 mem 2619 MHz"))
        .collect::<Vec<_>>();
    assert_eq!(clocks.len(), 2, "{screen}");
    assert!(clocks[1].contains("throttle sw_power_cap"), "{}", clocks[1]);
    assert!(clocks[0].contains("throttle none"), "{}", clocks[0]);
    assert!(
        clocks[0].contains("util ▂") && clocks[0].contains("mem ▃"),
        "{}",
        clocks[0]
    );
    // The finding has its advice and since-when on the large screen.
    assert!(screen.contains("raise DataLoader num_workers"), "{screen}");
    assert!(
        line_with(&screen, "input_bound").contains("(2m05s)"),
        "{screen}"
    );
}

#[test]
fn sort_filter_tree_and_detail_change_what_is_shown() {
    let mut app = app(true);
    // GPU memory first by default: the trainer (18 GiB) above the other (2 GiB).
    assert_eq!(app.rows[0].pid, TRAINER);
    app.apply(Action::Sort(SortKey::Sm));
    assert_eq!(app.rows[0].pid, OTHER, "95% SM first");
    app.apply(Action::Sort(SortKey::Pid));
    assert_eq!(app.rows[0].pid, TRAINER);

    for c in "llama".chars() {
        app.apply(Action::StartFilter);
        app.apply(Action::FilterChar(c));
    }
    app.apply(Action::FilterDone);
    let (screen, _) = render(&app, 120, 30);
    assert!(screen.contains("filter: llama"), "{screen}");
    assert!(screen.contains(&OTHER.to_string()), "{screen}");
    let trainer_row = format!("│0   {TRAINER}");
    assert!(
        !screen.lines().any(|l| l.starts_with(&trainer_row)),
        "{screen}"
    );
    assert!(
        screen.contains(&format!("pid {TRAINER}")),
        "findings are not filtered"
    );
    app.apply(Action::StartFilter);
    app.apply(Action::FilterCancel);
    assert_eq!(app.rows.len(), 2);

    app.apply(Action::ToggleTree);
    let kinds: Vec<(u32, RowKind, usize)> =
        app.rows.iter().map(|r| (r.pid, r.kind, r.depth)).collect();
    assert_eq!(
        kinds,
        vec![
            (TRAINER, RowKind::Gpu { device_index: 0 }, 0),
            (WORKER, RowKind::Descendant, 1),
            (OTHER, RowKind::Gpu { device_index: 1 }, 0),
        ]
    );
    let (screen, _) = render(&app, 120, 30);
    assert!(
        line_with(&screen, &WORKER.to_string()).contains("└ pt_data_worker"),
        "{screen}"
    );

    app.apply(Action::Home);
    app.apply(Action::ToggleDetail);
    let (screen, _) = render(&app, 120, 40);
    assert!(screen.contains(&format!("pid {TRAINER}")), "{screen}");
    assert!(line_with(&screen, "service.name").contains("resnet-train"));
    assert!(
        screen.contains(&CONTAINER[..60]),
        "full container id: {screen}"
    );
    assert!(line_with(&screen, "children").contains("4300 pt_data_worker"));
    assert!(line_with(&screen, "parent alive").contains("true"));
    assert!(screen.contains("SM % (history)"), "{screen}");
    app.apply(Action::CloseDetail);
    let (screen, _) = render(&app, 120, 40);
    assert!(!screen.contains("service.name"), "{screen}");
}

#[test]
fn no_color_draws_the_same_screen_without_colours() {
    let (coloured_text, coloured) = render(&app(true), 120, 30);
    let (plain_text, plain) = render(&app(false), 120, 30);
    assert_eq!(coloured_text, plain_text);
    let uses_colour = |b: &ratatui::buffer::Buffer| {
        b.content()
            .iter()
            .any(|c| c.fg != Color::Reset || c.bg != Color::Reset)
    };
    assert!(uses_colour(&coloured), "the coloured screen has colours");
    assert!(!uses_colour(&plain), "NO_COLOR: no colour at all");
}

#[test]
fn before_the_first_window_it_says_it_is_waiting() {
    let app = App::new(Duration::from_secs(1), "h".into(), false);
    let (screen, _) = render(&app, 80, 24);
    assert!(screen.contains("waiting for the first sample"), "{screen}");
}

#[test]
fn mig_devices_are_listed_under_their_gpu() {
    use crate::sampling::{GpmActivity, MigInstanceInfo, MigInstanceSample};
    use crate::schema::GpmField;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_400_000);
    let mut s = snapshot(at);
    let instance = |gi: u32, profile: &str, used: u64, sm: f64| MigInstanceSample {
        info: Arc::new(MigInstanceInfo {
            uuid: format!("MIG-{gi}"),
            name: format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
            parent_uuid: "GPU-0".into(),
            parent_index: 0,
            mig_index: gi - 1,
            gpu_instance_id: gi,
            compute_instance_id: 0,
        }),
        memory_used_bytes: Some(used),
        memory_free_bytes: None,
        memory_total_bytes: Some(40 << 30),
        gpm: GpmActivity::of([
            (GpmField::SmActivity, sm),
            (GpmField::TensorActivity, sm / 2.0),
        ]),
    };
    s.devices[0].mig_instances = vec![
        instance(1, "3g.40gb", 30 << 30, 0.85),
        instance(2, "3g.40gb", 4 << 30, 0.06),
    ];
    let mut aggregator = WindowAggregator::new();
    aggregator.add(&s);
    let mut app = app(true);
    let view = Arc::new(View {
        attributed: Arc::new(AttributedWindow::unattributed(
            aggregator.take().expect("a window"),
        )),
        findings: vec![],
        training: Default::default(),
        at,
    });
    app.observe(view, None);
    for (width, height) in [(80, 24), (200, 60)] {
        let (screen, _) = render(&app, width, height);
        let lines: Vec<&str> = screen.lines().collect();
        let gpu0 = lines
            .iter()
            .position(|l| l.contains(" 0 NVIDIA H100"))
            .expect("GPU 0");
        let first = lines
            .iter()
            .position(|l| l.contains("└ MIG 3g.40gb") && l.contains("GI 1 CI 0"))
            .unwrap_or_else(|| panic!("instance 1 missing at {width}x{height}:\n{screen}"));
        let second = lines
            .iter()
            .position(|l| l.contains("└ MIG 3g.40gb") && l.contains("GI 2 CI 0"))
            .expect("instance 2");
        let gpu1 = lines
            .iter()
            .position(|l| l.contains(" 1 NVIDIA A100"))
            .expect("GPU 1");
        assert!(
            gpu0 < first && first < second && second < gpu1,
            "instances under GPU 0, before GPU 1:\n{screen}"
        );
        assert!(
            lines[first].contains("SM  85%") && lines[first].contains("30.0G/40.0G"),
            "{}",
            lines[first]
        );
        assert!(lines[second].contains("SM   6%"), "{}", lines[second]);
    }
}

#[test]
fn processes_on_mig_show_their_instance_and_only_a_lone_ones_activity() {
    use crate::sampling::{GpmActivity, MigInstanceInfo, MigInstanceSample, ProcessMig};
    use crate::schema::GpmField;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_400_000);
    let mut s = snapshot(at);
    let info = |gi: u32, profile: &str| {
        Arc::new(MigInstanceInfo {
            uuid: format!("MIG-{gi}"),
            name: format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
            parent_uuid: "GPU-0".into(),
            parent_index: 0,
            mig_index: gi - 1,
            gpu_instance_id: gi,
            compute_instance_id: 0,
        })
    };
    let (alone, shared) = (info(1, "3g.40gb"), info(2, "2g.20gb"));
    s.devices[0].mig_instances = [(&alone, 0.73), (&shared, 0.9)]
        .into_iter()
        .map(|(info, graphics)| MigInstanceSample {
            info: Arc::clone(info),
            memory_used_bytes: Some(8 << 30),
            memory_free_bytes: None,
            memory_total_bytes: Some(40 << 30),
            gpm: GpmActivity::of([(GpmField::GraphicsActivity, graphics)]),
        })
        .collect();
    // NVML gives MIG processes no SM figure; the trainer is alone on GI 1, two others share GI 2.
    let on = |pid: u32, info: &MigInstanceInfo| {
        let mut p = s.processes[0].clone();
        p.pid = pid;
        p.sm_utilization = None;
        p.mig = Some(ProcessMig {
            uuid: info.uuid.clone(),
            gpu_instance_id: info.gpu_instance_id,
            compute_instance_id: 0,
        });
        p
    };
    let mig_processes = [on(TRAINER, &alone), on(7001, &shared), on(7002, &shared)];
    s.processes.retain(|p| p.device_index != 0);
    s.processes.extend(mig_processes);
    let mut aggregator = WindowAggregator::new();
    aggregator.add(&s);
    let mut app = app(false);
    app.observe(
        Arc::new(View {
            attributed: Arc::new(AttributedWindow::unattributed(
                aggregator.take().expect("a window"),
            )),
            findings: vec![],
            training: Default::default(),
            at,
        }),
        None,
    );
    for (width, height) in [(80, 24), (200, 60)] {
        let (screen, _) = render(&app, width, height);
        let row = |pid: u32| {
            screen
                .lines()
                .find(|l| l.split_whitespace().any(|w| w == pid.to_string()))
                .unwrap_or_else(|| panic!("no row for {pid} at {width}x{height}:\n{screen}"))
                .split(|c: char| c == '│' || c.is_whitespace())
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert!(
            screen
                .lines()
                .any(|l| l.contains("MIG") && l.contains("PID")),
            "MIG column header at {width}x{height}:\n{screen}"
        );
        let trainer = row(TRAINER);
        assert_eq!(trainer[..4], ["0", "GI1", "3g.40gb", "4242"], "{trainer:?}");
        assert!(
            trainer.contains(&"73".to_string()),
            "its instance's activity: {trainer:?}"
        );
        for pid in [7001, 7002] {
            let shared_row = row(pid);
            assert_eq!(shared_row[1..3], ["GI2", "2g.20gb"], "{shared_row:?}");
            assert!(
                !shared_row.contains(&"90".to_string()),
                "no split: {shared_row:?}"
            );
        }
        assert_eq!(row(OTHER)[..3], ["1", "-", "5151"], "GPU 1 is whole");
    }
}

/// TRAINER as rank 0 and OTHER as rank 1 of job `job-7`, 40 steps of 500 ms each, with
/// `(collective wait, data wait)` in seconds per rank.
fn job_7(waits: impl Fn(u32) -> (f64, f64)) -> crate::diagnosis::training::TrainingWindow {
    use crate::diagnosis::framework::DistributedIdentity;
    use crate::diagnosis::training::{ProcessTraining, TrainingWindow};
    let mut training = TrainingWindow::default();
    for (pid, rank) in [(TRAINER, 0), (OTHER, 1)] {
        let (wait, data_wait) = waits(rank);
        training.processes.insert(
            pid,
            ProcessTraining {
                step_seconds: 0.5,
                collective_wait_seconds: Some(wait),
                data_wait_seconds: data_wait,
                steps: 40,
                distributed: Some(DistributedIdentity {
                    rank,
                    job_id: Some("job-7".into()),
                    ..DistributedIdentity::default()
                }),
            },
        );
    }
    training
}

/// A hung job: the rank `distributed_hang` names is marked HUNG, the ranks that wait WAIT, and
/// the culprit's detail pane says where it is.
#[test]
fn a_hung_job_marks_its_culprit_and_the_waiting_ranks() {
    use crate::diagnosis::Value;
    let mut app = app(false);
    let mut view = (*view()).clone();
    view.training = Arc::new(job_7(|_| (0.1, 0.0)));
    let mut hang = view.findings[0].clone();
    hang.rule = RuleId::DistributedHang;
    hang.subject = Subject::Workload {
        pid: OTHER,
        vpid: None,
        device: None,
        container_id: None,
        pod_uid: None,
        service_name: "llama-server".into(),
    };
    hang.values = vec![
        ("job_id".into(), Value::from("job-7")),
        ("waiting_ranks".into(), Value::from("0")),
    ];
    hang.summary = "job job-7 is stuck on rank 1: it is in phase stuck for 2m".into();
    view.findings.push(hang);
    app.observe(Arc::new(view), None);

    let row = |pid| app.rows.iter().find(|r| r.pid == pid).unwrap();
    assert_eq!(row(OTHER).mark, Some(RankMark::Hung));
    assert_eq!(row(TRAINER).mark, Some(RankMark::Waiting));
    let (screen, _) = render(&app, 200, 60);
    assert!(
        line_with(&screen, &format!("{OTHER} ")).contains("job-7/1 HUNG"),
        "{screen}"
    );
    assert!(
        line_with(&screen, &format!("{TRAINER} ")).contains("job-7/0 WAIT"),
        "{screen}"
    );

    app.apply(Action::Sort(SortKey::Pid));
    let other_index = app.rows.iter().position(|r| r.pid == OTHER).unwrap();
    app.apply(Action::Home);
    app.apply(Action::Move(other_index as isize));
    app.apply(Action::ToggleDetail);
    let (screen, _) = render(&app, 160, 50);
    assert!(
        line_with(&screen, "job / rank").contains("HUNG"),
        "{screen}"
    );
    assert!(
        line_with(&screen, "distributed_hang   ").contains("stuck on rank 1"),
        "{screen}"
    );
}

/// A rank shows its job and rank, the straggler `rank_straggler` names is marked SLOW in the
/// table, and the detail pane gives its step figures.
#[test]
fn ranks_show_their_job_and_the_straggler_is_marked() {
    let mut app = app(false);
    let mut view = (*view()).clone();
    // Rank 0 waits 300 ms a step in collectives for rank 1, whose loader takes 250 ms.
    view.training = Arc::new(job_7(
        |rank| if rank == 0 { (0.3, 0.0) } else { (0.0, 0.25) },
    ));
    let mut straggler = view.findings[0].clone();
    straggler.rule = RuleId::RankStraggler;
    straggler.subject = Subject::Workload {
        pid: OTHER,
        vpid: None,
        device: None,
        container_id: None,
        pod_uid: None,
        service_name: "llama-server".into(),
    };
    straggler.summary = "rank 1 of job job-7 is the straggler".into();
    view.findings.push(straggler);
    app.observe(Arc::new(view), None);

    let row = |pid| app.rows.iter().find(|r| r.pid == pid).unwrap();
    assert_eq!(row(TRAINER).rank.as_deref(), Some("job-7/0"));
    assert_eq!(row(TRAINER).mark, None);
    assert_eq!(row(OTHER).rank.as_deref(), Some("job-7/1"));
    assert_eq!(row(OTHER).mark, Some(RankMark::Slow));

    let (screen, _) = render(&app, 200, 60);
    assert!(screen.contains("JOB/RANK"), "{screen}");
    assert!(
        line_with(&screen, &format!("{OTHER} ")).contains("job-7/1 SLOW"),
        "{screen}"
    );
    assert!(
        !line_with(&screen, &format!("{TRAINER} ")).contains("SLOW"),
        "{screen}"
    );

    app.apply(Action::Sort(SortKey::Pid));
    let other_index = app.rows.iter().position(|r| r.pid == OTHER).unwrap();
    app.apply(Action::Home);
    app.apply(Action::Move(other_index as isize));
    app.apply(Action::ToggleDetail);
    let (screen, _) = render(&app, 160, 50);
    assert!(
        line_with(&screen, "job / rank").contains("job-7/1  ← the straggler"),
        "{screen}"
    );
    assert!(
        line_with(&screen, "step / in collectives")
            .contains("500 ms / 0 ms (0% of the step), data wait 250 ms, over 40 steps"),
        "{screen}"
    );
}

/// Without spans, a rank shows the job and rank its launcher's variables gave it (read from
/// its environment), `?` for what they do not give, and nothing for a process outside a job.
#[test]
fn without_spans_ranks_show_their_environments_job_and_rank() {
    use crate::attribution::EnvRank;
    let mut app = app(false);
    let mut view = (*view()).clone();
    let mut attributed = (*view.attributed).clone();
    let trainer = attributed.workloads.get_mut(&TRAINER).unwrap();
    trainer.job_id = Some("run-9".into());
    trainer.rank = Some(EnvRank {
        rank: 3,
        world_size: 4,
        local_rank: Some(1),
    });
    view.attributed = Arc::new(attributed.clone());
    app.observe(Arc::new(view.clone()), None);
    let label = |app: &App, pid| app.rows.iter().find(|r| r.pid == pid).unwrap().rank.clone();
    assert_eq!(label(&app, TRAINER).as_deref(), Some("run-9/3"));
    assert_eq!(label(&app, OTHER), None);
    let (screen, _) = render(&app, 200, 60);
    assert!(
        line_with(&screen, &format!("{TRAINER} ")).contains("run-9/3"),
        "{screen}"
    );

    // Only one half known: the other is `?`.
    let trainer = attributed.workloads.get_mut(&TRAINER).unwrap();
    trainer.job_id = None;
    let other = attributed.workloads.get_mut(&OTHER).unwrap();
    other.job_id = Some("run-9".into());
    view.attributed = Arc::new(attributed);
    app.observe(Arc::new(view), None);
    assert_eq!(label(&app, TRAINER).as_deref(), Some("?/3"));
    assert_eq!(label(&app, OTHER).as_deref(), Some("run-9/?"));
}

/// The view of [`view`] after a second window an hour later, accounted with prices: the trainer
/// held GPU 0 (450 W) for the hour at 11 % SM, so its pod and container each count 1 GPU-hour,
/// 450 W × 3600 s × 0.11 = 0.0495 kWh, and 2.5 × 1 + 0.3 × 0.0495 = 2.51485 of cost.
fn accounted_view() -> Arc<View> {
    let first = view();
    let at = first.at + Duration::from_secs(3600);
    let mut aggregator = WindowAggregator::new();
    aggregator.add(&snapshot(at));
    let second = aggregator.take().expect("a window");
    let mut accountant = GpuAccountant::new(Prices {
        per_gpu_hour: Some(2.5),
        per_kwh: Some(0.3),
    });
    let workloads = &first.attributed.workloads;
    accountant.account(&first.attributed.window, workloads);
    let accounts = accountant.account(&second, workloads);
    let ledger =
        crate::attribution::CauseBook::default().charge(&accounts, &Default::default(), workloads);
    let attributed = AttributedWindow {
        window: second,
        accounts,
        ledger,
        ..(*first.attributed).clone()
    };
    Arc::new(View {
        attributed: Arc::new(attributed),
        at,
        ..(*first).clone()
    })
}

#[test]
fn r_shows_the_rollups_with_their_hours_energy_and_cost() {
    let mut app = app(true);
    app.observe(accounted_view(), None);
    let (screen, _) = render(&app, 200, 60);
    assert!(!screen.contains("Roll-ups"), "hidden until asked: {screen}");

    app.apply(Action::ToggleRollups);
    let (screen, _) = render(&app, 200, 60);
    assert!(
        screen.contains("Roll-ups (2) since the view started"),
        "{screen}"
    );
    let header = line_with(&screen, "GPU-HOURS");
    for column in ["KIND", "ID", "NAME", "PROCS", "KWH", "IDLE", "COST"] {
        assert!(header.contains(column), "{column}: {header}");
    }
    let pod = line_with(&screen, "│pod ");
    let cells: Vec<&str> = pod.trim_matches('│').split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "pod",
            "0d1c2b3a-4e5f-6a7b-8c9d…",
            "ml/trainer-0",
            "1",
            "1.000000",
            "0.049500",
            "0%",
            "2.5149",
            // By cause: no step spans, so 11 % compute and 89 % idle.
            "11%",
            "0%",
            "0%",
            "0%",
            "0%",
            "89%",
            "0%"
        ],
        "{pod}"
    );
    let header = line_with(&screen, "COMPUTE");
    for column in ["INPUT", "COLL", "STRAG", "HOST", "UNUSED", "UNKN"] {
        assert!(header.contains(column), "{column}: {header}");
    }
    let container = line_with(&screen, "│container ");
    assert!(container.contains(&CONTAINER[..12]), "{container}");
    assert!(!container.contains(&CONTAINER[..13]), "{container}");
    assert!(container.contains("2.5149"), "{container}");

    // At 80×24 the panel still fits beside the table and findings, without the name column.
    let (screen, _) = render(&app, 80, 24);
    let pod = line_with(&screen, "│pod ");
    assert!(pod.contains("1.000000") && pod.contains("2.5149"), "{pod}");
    assert!(!pod.contains("trainer-0"), "no name at 80 columns: {pod}");
    assert!(
        !screen.contains("COMPUTE"),
        "no causes at 80 columns: {screen}"
    );
    assert!(screen.contains("Findings (1)"), "{screen}");
    assert!(
        line_with(&screen, "q quit").contains("r roll-ups"),
        "{screen}"
    );
    for line in screen.lines() {
        assert_eq!(line.chars().count(), 80);
    }

    app.apply(Action::ToggleRollups);
    assert!(!render(&app, 200, 60).0.contains("Roll-ups"));
}

#[test]
fn the_rollups_panel_says_why_it_is_empty_and_that_no_price_was_given() {
    let mut app = app(true);
    app.apply(Action::ToggleRollups);
    let (screen, _) = render(&app, 120, 40);
    assert!(screen.contains("Roll-ups (0)"), "{screen}");
    assert!(screen.contains("no price: --cost-per-gpu-hour"), "{screen}");
    assert!(
        screen.contains("none yet: processes are grouped by job"),
        "{screen}"
    );
}
