//! `gpulse check`: a node health verdict from `HealthFacts` — each check Pass, Warn or Fail with
//! a reason an on-call engineer can act on — its exit code (0 all pass, 1 warnings, 2
//! failures) and its table and JSON renderings. `collect::collect_health_facts` reads the facts
//! from NVML; everything else here is pure.
//!
//! A field the device does not support is "n/a" and passes, except where its absence hides a
//! risk the operator should know about (documented per check in `docs/diagnosis.md`, "gpulse check").

pub(crate) mod agent;
pub(crate) mod collect;
pub(crate) mod facts;
pub(crate) mod ranks;

use std::fmt::Write as _;

use serde::Serialize;

pub use collect::collect_health_facts;
pub use facts::{
    DeviceFacts, EccCounts, EccMode, Fact, HealthFacts, MemoryFacts, MigMode, ProcessHolding,
    RemappedRows,
};

use super::findings::human_bytes;
use super::findings::Severity;
use super::rules::throttling::REASONS;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

impl CheckStatus {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// One line of the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// What was checked, e.g. `ECC mode`.
    pub name: String,
    /// NVML index of the device, for per-device checks.
    pub device: Option<u32>,
    pub status: CheckStatus,
    /// The value seen and, unless it passed, what to do.
    pub reason: String,
}

/// How strict the check is about what is expected on the node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CheckOptions {
    /// No GPU process is expected (a node about to receive a job): any process holding memory
    /// is a warning. Default false.
    pub expect_idle: bool,
    /// With no process listed, free memory below this ratio of (total − reserved) is a warning
    /// (memory held by something NVML does not list: another container's MIG instance, a leaked
    /// context, a zombie). Default 0.90.
    pub min_free_ratio_when_idle: f64,
    /// ECC disabled on a device that supports it is a warning. Default true.
    pub warn_ecc_disabled: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            expect_idle: false,
            min_free_ratio_when_idle: 0.90,
            warn_ecc_disabled: true,
        }
    }
}

/// `evaluate_with` with the default options.
pub fn evaluate(facts: &HealthFacts) -> Vec<CheckResult> {
    evaluate_with(facts, &CheckOptions::default())
}

/// The checks, node-wide first, then per device in index order.
pub(crate) fn evaluate_with(facts: &HealthFacts, opts: &CheckOptions) -> Vec<CheckResult> {
    let mut out = Vec::new();
    if let Some(err) = &facts.nvml_error {
        out.push(node(
            "GPU visible",
            CheckStatus::Fail,
            format!("NVML could not be used: {err}"),
        ));
        return out;
    }
    match facts.device_count {
        Some(0) | None => {
            out.push(node(
                "GPU visible",
                CheckStatus::Fail,
                "NVML reports no GPU: check that the driver sees the board (`nvidia-smi`), that \
                 the container was started with GPUs (--gpus / NVIDIA_VISIBLE_DEVICES / a \
                 nvidia.com/gpu resource limit) and that CUDA_VISIBLE_DEVICES is not empty"
                    .to_string(),
            ));
            return out;
        }
        Some(n) => out.push(node(
            "GPU visible",
            CheckStatus::Pass,
            format!("{n} device(s)"),
        )),
    }
    out.push(match &facts.driver_version {
        Some(v) => node("Driver version", CheckStatus::Pass, v.clone()),
        None => node(
            "Driver version",
            CheckStatus::Warn,
            "n/a: NVML did not report the driver version".to_string(),
        ),
    });
    out.push(match &facts.cuda_driver_version {
        Some(v) => node(
            "CUDA version",
            CheckStatus::Pass,
            format!("driver supports CUDA {v}"),
        ),
        None => node(
            "CUDA version",
            CheckStatus::Warn,
            "n/a: NVML did not report the CUDA version the driver supports".to_string(),
        ),
    });
    for d in &facts.devices {
        device_checks(d, opts, &mut out);
    }
    out
}

fn node(name: &str, status: CheckStatus, reason: String) -> CheckResult {
    CheckResult {
        name: name.to_string(),
        device: None,
        status,
        reason,
    }
}

fn device_checks(d: &DeviceFacts, opts: &CheckOptions, out: &mut Vec<CheckResult>) {
    let mut push = |name: &str, status: CheckStatus, reason: String| {
        out.push(CheckResult {
            name: name.to_string(),
            device: Some(d.index),
            status,
            reason,
        });
    };
    if let Some(err) = &d.unreachable {
        push(
            "Device reachable",
            CheckStatus::Fail,
            format!(
                "GPU {} could not be read: {err}. If NVML says the GPU is lost, drain the node \
                 and check dmesg for XID 79; otherwise check permissions on /dev/nvidia*",
                d.index
            ),
        );
        return;
    }
    let label = match (&d.name, &d.uuid) {
        (Some(n), Some(u)) => format!("{n} ({u})"),
        (Some(n), None) => n.clone(),
        (None, Some(u)) => u.clone(),
        (None, None) => "identity n/a".to_string(),
    };
    push("Device reachable", CheckStatus::Pass, label);
    for (name, check) in DEVICE_CHECKS {
        let (status, reason) = check(d, opts);
        push(name, status, reason);
    }
}

/// A check's verdict on one device: its status and the reason shown beside it.
type Verdict = (CheckStatus, String);

/// How one check judges a device's facts.
type DeviceCheck = fn(&DeviceFacts, &CheckOptions) -> Verdict;

/// The checks of a reachable device, in the checklist's order: each its name and its verdict.
const DEVICE_CHECKS: [(&str, DeviceCheck); 9] = [
    ("Persistence mode", persistence_mode),
    ("ECC mode", ecc_mode),
    ("ECC errors", ecc_errors),
    ("Throttling", throttling),
    ("MIG mode", mig_mode),
    ("GPU processes", gpu_processes),
    ("Free memory", free_memory),
    ("Retired pages", retired_pages),
    ("Row remapping", row_remapping),
];

/// Persistence mode: off, every job start pays the driver's initialisation.
fn persistence_mode(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.persistence_mode {
        Fact::Known(true) => (CheckStatus::Pass, "enabled".to_string()),
        Fact::Known(false) => (
            CheckStatus::Warn,
            "disabled: the driver is torn down when the last client exits, so every job start \
             pays seconds of initialisation and clock/ECC settings reset; enable it with \
             nvidia-persistenced (or `nvidia-smi -pm 1`)"
                .to_string(),
        ),
        Fact::NotSupported => (CheckStatus::Pass, "n/a (not supported)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// ECC mode: a pending change, or (with `warn_ecc_disabled`) ECC off.
fn ecc_mode(d: &DeviceFacts, opts: &CheckOptions) -> Verdict {
    match &d.ecc_mode {
        Fact::Known(m) if m.current != m.pending => (
            CheckStatus::Warn,
            format!(
                "{} now, {} after the next reboot/GPU reset: schedule the reset",
                on_off(m.current),
                on_off(m.pending)
            ),
        ),
        Fact::Known(m) if m.current => (CheckStatus::Pass, "enabled".to_string()),
        Fact::Known(_) if opts.warn_ecc_disabled => (
            CheckStatus::Warn,
            "disabled: memory errors go undetected and results can be silently wrong; enable \
             with `nvidia-smi -e 1` and reboot unless this was deliberate"
                .to_string(),
        ),
        Fact::Known(_) => (CheckStatus::Pass, "disabled".to_string()),
        Fact::NotSupported => (CheckStatus::Pass, "n/a (board without ECC)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// Uncorrectable ECC errors since the driver loaded, then over the board's lifetime.
fn ecc_errors(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.ecc_errors {
        Fact::Known(c) if c.uncorrected_volatile > 0 => (
            CheckStatus::Fail,
            format!(
                "{} uncorrectable ECC error(s) since the driver loaded: drain the GPU, inspect \
                 `nvidia-smi -q -d ECC,ROW_REMAPPER`, reset it; RMA if errors recur",
                c.uncorrected_volatile
            ),
        ),
        Fact::Known(c) if c.uncorrected_aggregate.unwrap_or(0) > 0 => (
            CheckStatus::Warn,
            format!(
                "none since the driver loaded, {} over the board's lifetime: watch the trend",
                c.uncorrected_aggregate.unwrap_or(0)
            ),
        ),
        Fact::Known(c) => (
            CheckStatus::Pass,
            match c.corrected_volatile {
                Some(n) => format!("no uncorrectable errors ({n} corrected since driver load)"),
                None => "no uncorrectable errors".to_string(),
            },
        ),
        Fact::NotSupported => (
            CheckStatus::Pass,
            "n/a (ECC off or not supported)".to_string(),
        ),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// The active clock-throttle reasons (`throttle_verdict`).
fn throttling(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.throttle_reasons {
        Fact::Known(bits) => throttle_verdict(*bits),
        Fact::NotSupported => (CheckStatus::Pass, "n/a (not supported)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// MIG mode: a change that waits for a GPU reset.
fn mig_mode(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.mig_mode {
        Fact::Known(m) if m.current != m.pending => (
            CheckStatus::Warn,
            format!(
                "{} now, {} after the next GPU reset: reset the GPU (drained) to apply",
                on_off(m.current),
                on_off(m.pending)
            ),
        ),
        Fact::Known(m) => (CheckStatus::Pass, on_off(m.current).to_string()),
        Fact::NotSupported => (CheckStatus::Pass, "n/a (not a MIG-capable GPU)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Pass, format!("n/a: {e}")),
    }
}

/// The processes holding the GPU (a warning when the node was expected idle).
fn gpu_processes(d: &DeviceFacts, opts: &CheckOptions) -> Verdict {
    match &d.processes {
        Fact::Known(list) if list.is_empty() => (CheckStatus::Pass, "none".to_string()),
        Fact::Known(list) => {
            let held: u64 = list.iter().filter_map(|p| p.used_bytes).sum();
            let pids: Vec<String> = list.iter().take(8).map(|p| p.pid.to_string()).collect();
            let more = if list.len() > 8 { ", ..." } else { "" };
            let text = format!(
                "{} process(es) holding {} (pids {}{more})",
                list.len(),
                human_bytes(held as f64),
                pids.join(", ")
            );
            if opts.expect_idle {
                (
                    CheckStatus::Warn,
                    format!("{text}: the node was expected idle; check they are meant to run"),
                )
            } else {
                (CheckStatus::Pass, text)
            }
        }
        Fact::NotSupported => (CheckStatus::Pass, "n/a (not supported)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// Free memory, and memory held with no process listed.
fn free_memory(d: &DeviceFacts, opts: &CheckOptions) -> Verdict {
    match &d.memory {
        Fact::Known(m) => {
            let usable = m.total.saturating_sub(m.reserved).max(1);
            let ratio = m.free as f64 / usable as f64;
            let text = format!(
                "{} free of {} ({:.0}%)",
                human_bytes(m.free as f64),
                human_bytes(usable as f64),
                ratio * 100.0
            );
            let idle = d.processes.known().is_some_and(|p| p.is_empty());
            if idle && ratio < opts.min_free_ratio_when_idle {
                (
                    CheckStatus::Warn,
                    format!(
                        "{text} with no process listed: memory is held by something NVML does \
                         not show (a process in another PID namespace, a leaked context); \
                         check `nvidia-smi` on the host and `fuser -v /dev/nvidia*`"
                    ),
                )
            } else {
                (CheckStatus::Pass, text)
            }
        }
        Fact::NotSupported => (CheckStatus::Pass, "n/a (not supported)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Warn, format!("n/a: {e}")),
    }
}

/// Pages waiting to be retired (boards before row remapping).
fn retired_pages(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.retired_pages_pending {
        Fact::Known(true) => (
            CheckStatus::Warn,
            "pages are pending retirement: reboot or reset the GPU (drained) to retire them"
                .to_string(),
        ),
        Fact::Known(false) => (CheckStatus::Pass, "none pending".to_string()),
        Fact::NotSupported => (CheckStatus::Pass, "n/a (row remapping instead)".to_string()),
        Fact::Unavailable(e) => (CheckStatus::Pass, format!("n/a: {e}")),
    }
}

/// The row remapper: a failed or pending remapping.
fn row_remapping(d: &DeviceFacts, _opts: &CheckOptions) -> Verdict {
    match &d.remapped_rows {
        Fact::Known(r) if r.failure => (
            CheckStatus::Fail,
            format!(
                "row remapping failed ({} uncorrectable, {} correctable rows remapped): the \
                 memory can no longer be repaired; drain the GPU and RMA it",
                r.uncorrectable, r.correctable
            ),
        ),
        Fact::Known(r) if r.pending => (
            CheckStatus::Warn,
            format!(
                "a remapping is pending ({} uncorrectable, {} correctable rows): reset the GPU \
                 (drained) to apply it",
                r.uncorrectable, r.correctable
            ),
        ),
        Fact::Known(r) => (
            CheckStatus::Pass,
            format!(
                "{} uncorrectable, {} correctable rows remapped, none pending",
                r.uncorrectable, r.correctable
            ),
        ),
        // Say what NVML answered, not a guess at the architecture: an H100 behind an old
        // library lacks the call without being "pre-Ampere".
        Fact::NotSupported => (
            CheckStatus::Pass,
            "n/a (the GPU answered NOT_SUPPORTED: it has no row remapper)".to_string(),
        ),
        Fact::Unavailable(e) => (CheckStatus::Pass, format!("n/a: {e}")),
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "enabled"
    } else {
        "disabled"
    }
}

fn throttle_verdict(bits: u64) -> (CheckStatus, String) {
    let active: Vec<_> = REASONS.iter().filter(|r| bits & r.bit != 0).collect();
    if active.is_empty() {
        return (
            CheckStatus::Pass,
            "no thermal, power or hardware slowdown".to_string(),
        );
    }
    let names: Vec<&str> = active.iter().map(|r| r.name).collect();
    let worst = active
        .iter()
        .map(|r| r.severity)
        .max()
        .unwrap_or(Severity::Info);
    match worst {
        Severity::Info => (
            CheckStatus::Pass,
            format!(
                "{} (at the power limit: normal under load)",
                names.join(", ")
            ),
        ),
        Severity::Warning => (
            CheckStatus::Warn,
            format!("{} active: check cooling and airflow", names.join(", ")),
        ),
        _ => (
            CheckStatus::Fail,
            format!(
                "{} active: the GPU runs at reduced clocks now; check cooling and power \
                 supplies (`nvidia-smi -q -d PERFORMANCE`)",
                names.join(", ")
            ),
        ),
    }
}

/// 0 when every check passed, 1 when the worst is a warning, 2 when any failed.
pub fn exit_code(results: &[CheckResult]) -> i32 {
    match results.iter().map(|r| r.status).max() {
        Some(CheckStatus::Fail) => 2,
        Some(CheckStatus::Warn) => 1,
        _ => 0,
    }
}

/// A fixed-width table: STATUS, GPU, CHECK, REASON; then a one-line total.
pub fn render_table(results: &[CheckResult]) -> String {
    let name_w = results
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<6} {:<4} {:<name_w$} REASON",
        "STATUS", "GPU", "CHECK"
    );
    for r in results {
        let gpu = r.device.map_or_else(|| "-".to_string(), |i| i.to_string());
        let _ = writeln!(
            s,
            "{:<6} {:<4} {:<name_w$} {}",
            r.status.as_str().to_uppercase(),
            gpu,
            r.name,
            r.reason
        );
    }
    let count = |st: CheckStatus| results.iter().filter(|r| r.status == st).count();
    let _ = writeln!(
        s,
        "{} passed, {} warning(s), {} failed",
        count(CheckStatus::Pass),
        count(CheckStatus::Warn),
        count(CheckStatus::Fail)
    );
    s
}

#[derive(Serialize)]
struct JsonReport<'a> {
    status: CheckStatus,
    exit_code: i32,
    checks: &'a [CheckResult],
}

/// `{"status": "warn", "exit_code": 1, "checks": [{"name", "device", "status", "reason"}]}`.
pub fn render_json(results: &[CheckResult]) -> String {
    let report = JsonReport {
        status: results
            .iter()
            .map(|r| r.status)
            .max()
            .unwrap_or(CheckStatus::Pass),
        exit_code: exit_code(results),
        checks: results,
    };
    // Serialising plain strings, integers and enums cannot fail.
    serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn healthy_device(index: u32) -> DeviceFacts {
        DeviceFacts {
            index,
            uuid: Some(format!("GPU-{index}")),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            unreachable: None,
            persistence_mode: Fact::Known(true),
            ecc_mode: Fact::Known(EccMode {
                current: true,
                pending: true,
            }),
            ecc_errors: Fact::Known(EccCounts {
                uncorrected_volatile: 0,
                uncorrected_aggregate: Some(0),
                corrected_volatile: Some(0),
            }),
            throttle_reasons: Fact::Known(0x1),
            mig_mode: Fact::Known(MigMode {
                current: false,
                pending: false,
            }),
            processes: Fact::Known(vec![]),
            memory: Fact::Known(MemoryFacts {
                total: 80 << 30,
                free: (80 << 30) - (600 << 20),
                used: 100 << 20,
                reserved: 500 << 20,
            }),
            retired_pages_pending: Fact::NotSupported,
            remapped_rows: Fact::Known(RemappedRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
        }
    }

    fn facts(devices: Vec<DeviceFacts>) -> HealthFacts {
        HealthFacts {
            nvml_error: None,
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            nvml_version: Some("12.550.54.15".into()),
            device_count: Some(devices.len() as u32),
            devices,
        }
    }

    #[test]
    fn healthy_node_passes() {
        let results = evaluate(&facts(vec![healthy_device(0), healthy_device(1)]));
        assert!(
            results.iter().all(|r| r.status == CheckStatus::Pass),
            "{results:#?}"
        );
        assert_eq!(exit_code(&results), 0);
        assert_eq!(results.iter().filter(|r| r.device == Some(1)).count(), 10);
    }

    #[test]
    fn no_nvml_is_one_failure() {
        let results = evaluate(&HealthFacts::nvml_unavailable(
            "libnvidia-ml.so.1 not found: install the NVIDIA driver",
        ));
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].name, "GPU visible");
        assert_eq!(results[0].status, CheckStatus::Fail);
        assert!(results[0].reason.contains("libnvidia-ml.so.1"));
        assert_eq!(exit_code(&results), 2);
    }

    #[test]
    fn zero_devices_fails() {
        let results = evaluate(&facts(vec![]));
        assert_eq!(exit_code(&results), 2);
        assert!(results[0].reason.contains("NVIDIA_VISIBLE_DEVICES"));
    }

    #[test]
    fn warnings_without_failures_exit_1() {
        let mut d = healthy_device(0);
        d.persistence_mode = Fact::Known(false);
        d.mig_mode = Fact::Known(MigMode {
            current: false,
            pending: true,
        });
        let results = evaluate(&facts(vec![d]));
        let warned: Vec<&str> = results
            .iter()
            .filter(|r| r.status == CheckStatus::Warn)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(warned, vec!["Persistence mode", "MIG mode"]);
        assert_eq!(exit_code(&results), 1);
    }

    #[test]
    fn ecc_errors_thermal_and_remap_failure_fail() {
        let mut d = healthy_device(0);
        d.ecc_errors = Fact::Known(EccCounts {
            uncorrected_volatile: 3,
            uncorrected_aggregate: Some(3),
            corrected_volatile: None,
        });
        d.throttle_reasons = Fact::Known(0x40 | 0x1);
        d.remapped_rows = Fact::Known(RemappedRows {
            correctable: 0,
            uncorrectable: 4,
            pending: false,
            failure: true,
        });
        let results = evaluate(&facts(vec![d]));
        let failed: Vec<&str> = results
            .iter()
            .filter(|r| r.status == CheckStatus::Fail)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(failed, vec!["ECC errors", "Throttling", "Row remapping"]);
        assert_eq!(exit_code(&results), 2);
    }

    #[test]
    fn idle_node_with_memory_held_and_no_process_warns() {
        let mut d = healthy_device(0);
        d.memory = Fact::Known(MemoryFacts {
            total: 80 << 30,
            free: 40 << 30,
            used: 40 << 30,
            reserved: 0,
        });
        let results = evaluate(&facts(vec![d.clone()]));
        let mem = results.iter().find(|r| r.name == "Free memory");
        assert_eq!(mem.map(|r| r.status), Some(CheckStatus::Warn));
        // The same memory held by a listed process is fine unless the node was expected idle.
        d.processes = Fact::Known(vec![ProcessHolding {
            pid: 77,
            used_bytes: Some(40 << 30),
        }]);
        let results = evaluate(&facts(vec![d.clone()]));
        assert_eq!(exit_code(&results), 0);
        let strict = CheckOptions {
            expect_idle: true,
            ..CheckOptions::default()
        };
        let results = evaluate_with(&facts(vec![d]), &strict);
        let procs = results.iter().find(|r| r.name == "GPU processes");
        assert_eq!(procs.map(|r| r.status), Some(CheckStatus::Warn));
        assert!(procs.is_some_and(|r| r.reason.contains("pids 77")));
    }

    #[test]
    fn unsupported_fields_pass_as_na_and_unreachable_fails() {
        let mut d = healthy_device(0);
        d.ecc_mode = Fact::NotSupported;
        d.ecc_errors = Fact::NotSupported;
        d.mig_mode = Fact::NotSupported;
        d.remapped_rows = Fact::NotSupported;
        let results = evaluate(&facts(vec![d, DeviceFacts::unreachable(1, "GPU is lost")]));
        let dev0: Vec<&CheckResult> = results.iter().filter(|r| r.device == Some(0)).collect();
        assert!(dev0.iter().all(|r| r.status == CheckStatus::Pass));
        assert!(dev0.iter().any(|r| r.reason.starts_with("n/a")));
        let dev1: Vec<&CheckResult> = results.iter().filter(|r| r.device == Some(1)).collect();
        assert_eq!(dev1.len(), 1);
        assert_eq!(dev1[0].status, CheckStatus::Fail);
        assert!(dev1[0].reason.contains("XID 79"));
    }

    #[test]
    fn renderings() {
        let mut d = healthy_device(0);
        d.persistence_mode = Fact::Known(false);
        let results = evaluate(&facts(vec![d]));
        let table = render_table(&results);
        assert!(table.starts_with("STATUS GPU"), "{table}");
        assert!(table.contains("WARN   0    Persistence mode"), "{table}");
        assert!(
            table
                .trim_end()
                .ends_with("12 passed, 1 warning(s), 0 failed"),
            "{table}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render_json(&results)).expect("valid JSON");
        assert_eq!(json["status"], "warn");
        assert_eq!(json["exit_code"], 1);
        assert_eq!(json["checks"][0]["name"], "GPU visible");
        assert_eq!(json["checks"][0]["device"], serde_json::Value::Null);
    }
}
