//! Integration tests: diagnosis through its public API — the `Diagnoser` loop over sequences of
//! windows (start/clear events, active counts), the OTLP log record shape (also as OTLP JSON),
//! the `[diagnosis]` config table, history bounds, and `gpulse check` evaluation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpulse::attribution::{AttributedWindow, ProcessUsage, Workload};
use gpulse::config::thresholds::HistoryLimits;
use gpulse::diagnosis::check::{
    self, CheckStatus, DeviceFacts, EccCounts, EccMode, Fact, HealthFacts, MemoryFacts, MigMode,
    RemappedRows,
};
use gpulse::diagnosis::log_records::{to_log_record, EVENT_NAME};
use gpulse::diagnosis::{
    Diagnoser, FindingEvent, FindingState, History, RuleId, Severity, Thresholds,
};
use gpulse::sampling::{
    DeviceInfo, DeviceStatus, DeviceWindow, Gauge, ProcessKind, ProcessWindow, Window, XidEvent,
};
use gpulse::schema::DeviceField;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::logs::v1::LogRecord;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_750_000_000 + secs)
}

fn gauge(v: f64) -> Gauge {
    Gauge {
        mean: v,
        min: v,
        max: v,
        last: v,
        count: 60,
    }
}

fn info(index: u32) -> Arc<DeviceInfo> {
    Arc::new(DeviceInfo {
        index,
        uuid: format!("GPU-1111-{index}"),
        name: "NVIDIA A100-SXM4-80GB".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x20 + index),
        serial: None,
        minor_number: Some(index),
        memory_total_bytes: Some(80 * GIB),
        max_sm_clock_mhz: Some(1410),
        max_memory_clock_mhz: Some(1593),
        compute_capability: Some("8.0".into()),
        fan_count: Some(0),
    })
}

fn device(index: u32, util: f64, used: u64) -> DeviceWindow {
    use DeviceField as F;
    let mut d = DeviceWindow::empty(info(index), t(0));
    d.throttle_active_ratio = Some(Default::default());
    for (field, value) in [
        (F::UtilizationGpu, util),
        (F::Temperature, 55.0),
        (F::Power, 250.0),
        (F::MemoryUsed, used as f64),
        (F::MemoryFree, (80 * GIB - used) as f64),
        (F::MemoryReserved, 0.0),
        (F::MemoryTotal, (80 * GIB) as f64),
        (F::PowerLimit, 400.0),
        (F::PerformanceState, 0.0),
    ] {
        d.fields.set_gauge(field, Some(gauge(value)));
    }
    d.fields.set_total(F::EccCorrected, Some(0.0));
    d.fields.set_total(F::EccUncorrected, Some(0.0));
    d
}

fn process(pid: u32, dev: u32, mem: u64, sm: f64) -> ProcessWindow {
    ProcessWindow {
        pid,
        device_index: dev,
        device_uuid: format!("GPU-1111-{dev}"),
        kind: ProcessKind::Compute,
        first_seen: t(0),
        samples: 1,
        gpu_memory_bytes: Some(gauge(mem as f64)),
        sm_utilization: Some(gauge(sm)),
        memory_utilization: None,
        encoder_utilization: None,
        decoder_utilization: None,
    }
}

/// The window ending at minute `m` (60 s long).
fn window(m: u64, devices: Vec<DeviceWindow>, processes: Vec<ProcessWindow>) -> Window {
    Window {
        start: t((m - 1) * 60),
        end: t(m * 60),
        sample_count: 60,
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some("12.4".into()),
        devices,
        processes,
        xid_events: Vec::new(),
    }
}

struct Loop {
    diagnoser: Diagnoser,
    workloads: HashMap<u32, Workload>,
    usage: HashMap<u32, ProcessUsage>,
    parent_alive: HashMap<u32, bool>,
}

impl Loop {
    fn new(t: Thresholds) -> Self {
        Self {
            diagnoser: Diagnoser::new(t),
            workloads: HashMap::new(),
            usage: HashMap::new(),
            parent_alive: HashMap::new(),
        }
    }

    fn observe(&mut self, w: &Window) -> Vec<FindingEvent> {
        let attributed = AttributedWindow {
            window: w.clone(),
            workloads: self.workloads.clone(),
            usage: self.usage.clone(),
            parent_alive: self.parent_alive.clone(),
            accounts: Default::default(),
            departed: Default::default(),
            ledger: Default::default(),
        };
        self.diagnoser.observe(&attributed)
    }
}

fn attr<'a>(r: &'a LogRecord, key: &str) -> Option<&'a Any> {
    r.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr_str<'a>(r: &'a LogRecord, key: &str) -> Option<&'a str> {
    match attr(r, key) {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

#[test]
fn idle_holder_starts_after_five_minutes_and_clears_after_two_busy_windows() {
    let mut lp = Loop::new(Thresholds::default());
    let mut workload = Workload::unresolved(4242);
    workload.executable_name = Some("python3".into());
    workload.container_id = Some("a".repeat(64));
    workload.vpid = Some(1);
    lp.workloads.insert(4242, workload);

    let idle = |m| {
        window(
            m,
            vec![device(0, 0.0, 6 * GIB)],
            vec![process(4242, 0, 6 * GIB, 0.0)],
        )
    };
    let busy = |m| {
        window(
            m,
            vec![device(0, 0.9, 6 * GIB)],
            vec![process(4242, 0, 6 * GIB, 0.9)],
        )
    };

    for m in 1..=4 {
        assert!(lp.observe(&idle(m)).is_empty(), "minute {m}: too early");
    }
    let events = lp.observe(&idle(5));
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].state, FindingState::Started);
    assert_eq!(events[0].finding.rule, RuleId::IdleHolder);
    assert_eq!(events[0].finding.since, t(0));
    assert_eq!(
        lp.diagnoser.tracker().active_counts()[&RuleId::IdleHolder],
        1
    );

    let record = to_log_record(&events[0]);
    assert_eq!(record.event_name, EVENT_NAME);
    assert_eq!(record.severity_text, "WARN");
    assert_eq!(record.severity_number, 13);
    assert_eq!(attr(&record, "process.pid"), Some(&Any::IntValue(4242)));
    assert_eq!(attr(&record, "process.vpid"), Some(&Any::IntValue(1)));
    assert_eq!(attr_str(&record, "hw.id"), Some("GPU-1111-0"));
    assert_eq!(
        attr_str(&record, "container.id"),
        Some("a".repeat(64).as_str())
    );
    assert_eq!(
        attr_str(&record, "gpulse.diagnosis.value.reason"),
        Some("idle")
    );

    assert!(lp.observe(&idle(6)).is_empty(), "continuing: no event");
    assert!(lp.observe(&busy(7)).is_empty(), "hysteresis: one window");
    let events = lp.observe(&busy(8));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].state, FindingState::Cleared);
    assert_eq!(events[0].at, t(8 * 60));
    let cleared = to_log_record(&events[0]);
    assert_eq!(cleared.severity_text, "INFO");
    assert_eq!(
        attr_str(&cleared, "gpulse.diagnosis.state"),
        Some("cleared")
    );
    assert_eq!(
        attr_str(&cleared, "gpulse.diagnosis.severity"),
        Some("warning")
    );
    assert!(attr(&cleared, "gpulse.diagnosis.advice").is_none());
    match cleared.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(Any::StringValue(s)) => assert!(s.starts_with("Cleared: pid 4242"), "{s}"),
        other => panic!("body {other:?}"),
    }
    assert_eq!(
        lp.diagnoser.tracker().active_counts()[&RuleId::IdleHolder],
        0
    );
}

#[test]
fn leak_is_found_and_clears_when_the_process_exits() {
    let mut lp = Loop::new(Thresholds::default());
    let leaking = |m: u64| {
        let mem = 10 * GIB + m * 120 * MIB;
        window(m, vec![device(0, 0.8, mem)], vec![process(77, 0, mem, 0.8)])
    };
    let mut started = None;
    for m in 1..=20 {
        for e in lp.observe(&leaking(m)) {
            if e.finding.rule == RuleId::MemoryGrowth && e.state == FindingState::Started {
                started.get_or_insert((m, e));
            }
        }
    }
    let (minute, event) = started.expect("memory_growth never started");
    // Needs 10 minutes of history (the first window starts at minute 0).
    assert!((10..=12).contains(&minute), "started at minute {minute}");
    let record = to_log_record(&event);
    let Some(Any::DoubleValue(rate)) = attr(
        &record,
        "gpulse.diagnosis.value.growth_rate_bytes_per_second",
    ) else {
        panic!("no rate attribute: {:?}", record.attributes);
    };
    assert!((rate - 2.0 * MIB as f64).abs() < 1.0, "rate {rate}");
    assert!(attr(&record, "gpulse.diagnosis.value.time_to_full_seconds").is_some());

    // The process is gone: its series is dropped, the finding clears after two windows.
    let gone = |m| window(m, vec![device(0, 0.0, 0)], vec![]);
    assert!(lp.observe(&gone(21)).is_empty());
    assert_eq!(lp.diagnoser.history().series_count(), 0);
    let events = lp.observe(&gone(22));
    assert!(events
        .iter()
        .any(|e| e.state == FindingState::Cleared && e.finding.rule == RuleId::MemoryGrowth));
}

#[test]
fn xid_record_shape_and_otlp_json() {
    let mut lp = Loop::new(Thresholds::default());
    let mut w = window(1, vec![device(0, 0.5, GIB)], vec![]);
    w.xid_events.push(XidEvent {
        at: t(30),
        device_uuid: "GPU-1111-0".into(),
        device_index: 0,
        xid: 48,
    });
    w.devices[0]
        .fields
        .set_total(DeviceField::EccUncorrected, Some(1.0));
    let events = lp.observe(&w);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].finding.severity, Severity::Critical);
    let record = to_log_record(&events[0]);
    assert_eq!(record.severity_number, 21);
    assert_eq!(record.severity_text, "FATAL");
    assert_eq!(record.time_unix_nano, 1_750_000_060 * 1_000_000_000);
    assert_eq!(
        attr_str(&record, "gpulse.diagnosis.rule"),
        Some("hardware_errors")
    );
    assert_eq!(attr_str(&record, "gpulse.diagnosis.value.xids"), Some("48"));
    assert_eq!(
        attr(&record, "gpulse.diagnosis.value.ecc_uncorrected_new"),
        Some(&Any::IntValue(1))
    );
    assert_eq!(attr(&record, "gpu.index"), Some(&Any::IntValue(0)));
    assert!(attr(&record, "process.pid").is_none());
    assert!(attr_str(&record, "gpulse.diagnosis.advice").is_some_and(|a| a.contains("XID 48")));

    // The OTLP JSON encoding (what the stdout exporter and the file exporter write).
    let json = serde_json::to_value(&record).expect("serialisable");
    assert_eq!(json["eventName"], EVENT_NAME);
    assert_eq!(json["severityText"], "FATAL");
    let body = json["body"]["stringValue"].as_str().unwrap_or_default();
    assert!(
        body.contains("XID 48 (double-bit (uncorrectable) ECC error; memory, fatal)"),
        "{body}"
    );
    // The Xid catalog's reading travels with the record: class and fatality as values.
    assert_eq!(
        attr_str(&record, "gpulse.diagnosis.value.xid_classes"),
        Some("memory")
    );
    assert_eq!(
        attr_str(&record, "gpulse.diagnosis.value.xid_fatal"),
        Some("true")
    );
}

#[test]
fn uneven_pod_gets_a_job_record_with_all_pids_and_gpus() {
    let mut lp = Loop::new(Thresholds {
        clear_after_windows: 1,
        ..Thresholds::default()
    });
    for pid in [10, 11] {
        let mut w = Workload::unresolved(pid);
        w.pod_uid = Some("0b6c3a52-0000-4000-8000-000000000001".into());
        lp.workloads.insert(pid, w);
    }
    let w = window(
        1,
        vec![device(0, 0.95, 30 * GIB), device(1, 0.2, 30 * GIB)],
        vec![
            process(10, 0, 30 * GIB, 0.95),
            process(11, 1, 30 * GIB, 0.2),
        ],
    );
    let events = lp.observe(&w);
    let uneven: Vec<&FindingEvent> = events
        .iter()
        .filter(|e| e.finding.rule == RuleId::UnevenMultiGpu)
        .collect();
    assert_eq!(uneven.len(), 1, "{events:#?}");
    let record = to_log_record(uneven[0]);
    assert_eq!(
        attr_str(&record, "k8s.pod.uid"),
        Some("0b6c3a52-0000-4000-8000-000000000001")
    );
    match attr(&record, "gpulse.diagnosis.pids") {
        Some(Any::ArrayValue(a)) => assert_eq!(a.values.len(), 2),
        other => panic!("pids {other:?}"),
    }
    match attr(&record, "hw.ids") {
        Some(Any::ArrayValue(a)) => assert_eq!(a.values.len(), 2),
        other => panic!("hw.ids {other:?}"),
    }
}

#[test]
fn input_bound_needs_cpu_usage_of_the_tree() {
    let mut lp = Loop::new(Thresholds::default());
    let w = window(
        1,
        vec![device(0, 0.1, 20 * GIB)],
        vec![process(5, 0, 20 * GIB, 0.1)],
    );
    assert!(lp.observe(&w).is_empty(), "no CPU data, no finding");
    lp.usage.insert(
        5,
        ProcessUsage {
            cpu_utilization: Some(1.0),
            tree_cpu_utilization: Some(7.5),
            memory_rss_bytes: None,
        },
    );
    let w = window(
        2,
        vec![device(0, 0.1, 20 * GIB)],
        vec![process(5, 0, 20 * GIB, 0.1)],
    );
    let events = lp.observe(&w);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].finding.rule, RuleId::InputBound);
    assert!(events[0].finding.summary.contains("7.5 CPU cores"));
}

#[test]
fn disabled_rules_report_nothing() {
    let mut t = Thresholds::default();
    t.hardware_errors.enabled = false;
    let mut lp = Loop::new(t);
    let mut w = window(1, vec![device(0, 0.5, GIB)], vec![]);
    w.devices[0].status = DeviceStatus::Lost;
    w.devices[0].lost_samples = 60;
    assert!(lp.observe(&w).is_empty());
    let mut lp = Loop::new(Thresholds {
        enabled: false,
        ..Thresholds::default()
    });
    assert!(lp.observe(&w).is_empty());
}

#[test]
fn diagnosis_table_in_a_config_file() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        diagnosis: Thresholds,
    }
    let file: File = toml::from_str(
        r#"
[diagnosis]
clear_after_windows = 3
[diagnosis.history]
max_windows = 120
max_age = "2h"
[diagnosis.input_bound]
gpu_utilization_below = 0.3
[diagnosis.hardware_errors]
ignore_xids = [45]
"#,
    )
    .expect("valid [diagnosis] table");
    let d = file.diagnosis;
    assert_eq!(d.clear_after_windows, 3);
    assert_eq!(d.history.max_windows, 120);
    assert_eq!(d.history.max_age, Duration::from_secs(7200));
    assert_eq!(d.input_bound.gpu_utilization_below, 0.3);
    assert_eq!(d.hardware_errors.ignore_xids, vec![45]);
    assert_eq!(d.memory_growth, Thresholds::default().memory_growth);
    assert_eq!(d.validate(), Ok(()));
}

#[test]
fn history_stays_bounded() {
    let mut h = History::new(HistoryLimits {
        max_windows: 10,
        max_age: Duration::from_secs(3600),
        max_series: 4,
    });
    // 8 processes for 50 windows: at most 4 series of 10 summaries.
    for m in 1..=50 {
        let procs = (0..8).map(|p| process(100 + p, 0, GIB, 0.5)).collect();
        h.record(&window(m, vec![device(0, 0.5, 8 * GIB)], procs));
    }
    assert_eq!(h.series_count(), 4);
    assert_eq!(h.summary_count(), 40);
    // Age bound: a window 2 h later drops everything older than 1 h.
    let mut h = History::new(HistoryLimits::default());
    for m in [1, 2, 3, 130] {
        h.record(&window(
            m,
            vec![device(0, 0.5, GIB)],
            vec![process(1, 0, GIB, 0.5)],
        ));
    }
    assert_eq!(h.series(1, "GPU-1111-0").map(|s| s.len()), Some(1));
}

fn healthy(index: u32) -> DeviceFacts {
    DeviceFacts {
        index,
        uuid: Some(format!("GPU-1111-{index}")),
        name: Some("NVIDIA A100-SXM4-80GB".into()),
        unreachable: None,
        persistence_mode: Fact::Known(true),
        ecc_mode: Fact::Known(EccMode {
            current: true,
            pending: true,
        }),
        ecc_errors: Fact::Known(EccCounts {
            uncorrected_volatile: 0,
            uncorrected_aggregate: Some(0),
            corrected_volatile: Some(2),
        }),
        throttle_reasons: Fact::Known(0),
        mig_mode: Fact::NotSupported,
        processes: Fact::Known(vec![]),
        memory: Fact::Known(MemoryFacts {
            total: 80 * GIB,
            free: 79 * GIB,
            used: 512 * MIB,
            reserved: 512 * MIB,
        }),
        retired_pages_pending: Fact::Known(false),
        remapped_rows: Fact::Unavailable("Insufficient Permissions".into()),
    }
}

fn node(devices: Vec<DeviceFacts>) -> HealthFacts {
    HealthFacts {
        nvml_error: None,
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some("12.4".into()),
        nvml_version: None,
        device_count: Some(devices.len() as u32),
        devices,
    }
}

#[test]
fn check_healthy_node_exits_0() {
    let results = check::evaluate(&node(vec![healthy(0), healthy(1)]));
    assert_eq!(
        check::exit_code(&results),
        0,
        "{}",
        check::render_table(&results)
    );
    let json: serde_json::Value =
        serde_json::from_str(&check::render_json(&results)).expect("JSON");
    assert_eq!(json["status"], "pass");
    assert_eq!(json["checks"].as_array().map(Vec::len), Some(3 + 2 * 10));
}

#[test]
fn check_unhealthy_node_exits_2_with_reasons() {
    let mut bad = healthy(1);
    bad.ecc_mode = Fact::Known(EccMode {
        current: true,
        pending: false,
    });
    bad.mig_mode = Fact::Known(MigMode {
        current: true,
        pending: true,
    });
    bad.remapped_rows = Fact::Known(RemappedRows {
        correctable: 0,
        uncorrectable: 2,
        pending: true,
        failure: false,
    });
    bad.throttle_reasons = Fact::Known(0x8);
    let results = check::evaluate(&node(vec![
        healthy(0),
        bad,
        DeviceFacts::unreachable(2, "GPU is lost"),
    ]));
    assert_eq!(check::exit_code(&results), 2);
    let status = |gpu: u32, name: &str| {
        results
            .iter()
            .find(|r| r.device == Some(gpu) && r.name == name)
            .map(|r| r.status)
    };
    assert_eq!(status(1, "ECC mode"), Some(CheckStatus::Warn));
    assert_eq!(status(1, "Row remapping"), Some(CheckStatus::Warn));
    assert_eq!(status(1, "Throttling"), Some(CheckStatus::Fail));
    assert_eq!(status(1, "MIG mode"), Some(CheckStatus::Pass));
    assert_eq!(status(2, "Device reachable"), Some(CheckStatus::Fail));
    let table = check::render_table(&results);
    assert!(table.contains("FAIL   2    Device reachable"), "{table}");
}

#[test]
fn check_without_nvml_is_one_clear_failure() {
    let facts = check::collect_health_facts(Err(
        "libnvidia-ml.so.1 not found: install the NVIDIA driver or mount it into the container"
            .to_string(),
    ));
    let results = check::evaluate(&facts);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].status, CheckStatus::Fail);
    assert!(results[0].reason.contains("libnvidia-ml.so.1 not found"));
    assert_eq!(check::exit_code(&results), 2);
}

/// Set in the child process that opens the simulated NVML (its state is process-wide, so it
/// gets a process of its own rather than sharing the test binary with other areas).
const SIM_CHILD_ENV: &str = "GPULSE_TEST_DIAGNOSIS_SIM_CHILD";
const SIM_MARKER: &str = "DIAGNOSIS-CHECK-JSON:";

/// `libnvidia_ml.so` built from `nvml-sim` next to this test binary (`target/<profile>/`).
fn sim_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test binary>");
    let lib = profile_dir.join("libnvidia_ml.so");
    assert!(
        lib.exists(),
        "{} is missing: build the simulator first with `cargo build -p nvml-sim` (or run the \
         tests with `cargo test --workspace`)",
        lib.display()
    );
    lib
}

fn sim_check_child() {
    let lib = std::env::var_os("GPULSE_TEST_SIM_LIB").expect("library path from the parent");
    let nvml = nvml_wrapper::Nvml::builder().lib_path(&lib).init();
    let facts = match &nvml {
        Ok(n) => check::collect_health_facts(Ok(n)),
        Err(e) => check::collect_health_facts(Err(format!("NVML init failed: {e}"))),
    };
    let results = check::evaluate(&facts);
    println!(
        "{SIM_MARKER}{}",
        check::render_json(&results).replace('\n', "")
    );
    println!("{}", check::render_table(&results));
}

#[test]
fn check_facts_from_the_simulated_node() {
    if std::env::var_os(SIM_CHILD_ENV).is_some() {
        sim_check_child();
        return;
    }
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/nvml-sim/scenarios/diagnosis-check.toml"
    );
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "diagnosis::check_facts_from_the_simulated_node",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SIM_CHILD_ENV, "1")
        .env("GPULSE_TEST_SIM_LIB", sim_library())
        .env("NVML_SIM_SCENARIO", scenario)
        .output()
        .expect("child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(SIM_MARKER).map(|(_, json)| json))
        .unwrap_or_else(|| {
            panic!(
                "child printed no verdict.\nstdout:\n{stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let json: serde_json::Value = serde_json::from_str(line).expect("verdict JSON");
    let status = |gpu: u64, name: &str| -> String {
        json["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["device"] == gpu && c["name"] == name)
            .and_then(|c| c["status"].as_str())
            .unwrap_or("missing")
            .to_string()
    };
    assert_eq!(json["exit_code"], 2, "{stdout}");
    let gpu0: Vec<&serde_json::Value> = json["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["device"] == 0)
        .collect();
    assert_eq!(gpu0.len(), 10, "{stdout}");
    assert!(gpu0.iter().all(|c| c["status"] == "pass"), "{stdout}");
    assert_eq!(status(1, "Device reachable"), "fail", "{stdout}");
    assert_eq!(status(2, "Persistence mode"), "warn", "{stdout}");
    assert_eq!(status(2, "Throttling"), "fail", "{stdout}");
    assert_eq!(status(2, "ECC errors"), "fail", "{stdout}");
    assert_eq!(status(2, "Row remapping"), "warn", "{stdout}");
}

#[test]
fn critical_xid_after_an_application_xid_escalates() {
    let mut lp = Loop::new(Thresholds::default());
    let with_xid = |m: u64, xid: u64| {
        let mut w = window(m, vec![device(0, 0.5, GIB)], vec![]);
        w.xid_events.push(XidEvent {
            at: t(m * 60 - 30),
            device_uuid: "GPU-1111-0".into(),
            device_index: 0,
            xid,
        });
        w
    };
    let events = lp.observe(&with_xid(1, 13));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].finding.severity, Severity::Error);
    let events = lp.observe(&with_xid(2, 79));
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].state, FindingState::Escalated);
    let record = to_log_record(&events[0]);
    assert_eq!(
        attr_str(&record, "gpulse.diagnosis.state"),
        Some("escalated")
    );
    assert_eq!(record.severity_text, "FATAL");
    assert_eq!(attr_str(&record, "gpulse.diagnosis.value.xids"), Some("79"));
    // The same XID again within the hysteresis: still the same active finding, no new record.
    assert!(lp.observe(&with_xid(3, 79)).is_empty());
    assert_eq!(
        lp.diagnoser.tracker().active_counts()[&RuleId::HardwareErrors],
        1
    );
}
