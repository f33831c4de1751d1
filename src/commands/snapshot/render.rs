//! How a snapshot is printed: the table that reads like `nvidia-smi` with a process section and
//! the findings, and the JSON other tools read (`null` where NVML gave nothing). Shared by the
//! one-sample snapshot and `--window`, so both print the same way.

use std::fmt::Write as _;

use crate::attribution::Workload;
use crate::diagnosis::framework::Layer;
use crate::diagnosis::Finding;
use crate::pipeline::report::DeviceReport;
use crate::pipeline::SnapshotReport;
use crate::sampling::{DeviceStatus, ProcessKind};
use crate::schema::{DeviceField as F, GpmField};

/// The JSON contract, pretty-printed.
pub(crate) fn render_json(report: &SnapshotReport) -> String {
    serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

const MIB: f64 = 1024.0 * 1024.0;

fn opt<T: std::fmt::Display>(value: Option<T>, unit: &str) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| format!("{v}{unit}"))
}

fn pct(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| format!("{:.0}%", v * 100.0))
}

fn mib(value: Option<u64>) -> String {
    value.map_or_else(
        || "n/a".to_string(),
        |v| format!("{:.0}MiB", v as f64 / MIB),
    )
}

const DEVICE_HEADER: [&str; 10] = [
    "GPU",
    "Name",
    "Bus-Id",
    "Temp",
    "Fan",
    "Power/Limit",
    "Memory used/total",
    "Util",
    "MemUt",
    "SM/Mem MHz",
];
const PROCESS_HEADER: [&str; 10] = [
    "GPU",
    "PID",
    "VPID",
    "Type",
    "GPU memory",
    "SM",
    "Mem",
    "Process",
    "Container",
    "Pod",
];

/// The human table: one block per GPU, then the processes.
pub(crate) fn render_table(report: &SnapshotReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Driver {}   CUDA {}   NVML {}",
        report.driver_version.unwrap_or("n/a"),
        report.cuda_driver_version.unwrap_or("n/a"),
        report.nvml_version.unwrap_or("n/a")
    );
    if let Some(w) = &report.window {
        let _ = writeln!(
            out,
            "Window of {:.1}s ({} samples): utilisation, power and clocks are means, memory the last sample",
            w.end - w.start,
            w.samples
        );
    }
    let h = DEVICE_HEADER;
    let _ = writeln!(
        out,
        "{:<3} {:<28} {:<16} {:>5} {:>6} {:>15} {:>19} {:>6} {:>6} {:>11}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]
    );
    for d in &report.devices {
        render_device(&mut out, d);
    }
    let _ = writeln!(out);
    render_processes(&mut out, report);
    if let (Some(accounting), Some(w)) = (&report.accounting, &report.window) {
        crate::attribution::rollup_table::render_rollups(
            &mut out,
            accounting.rollups,
            accounting.cause_rollups,
            w.end - w.start,
        );
    }
    render_findings(&mut out, &report.findings);
    render_rank_note(&mut out, report);
    out
}

/// One GPU's row of the table, then the lines only some GPUs have (`render_device_details`).
fn render_device(out: &mut String, d: &DeviceReport) {
    if d.status == DeviceStatus::Lost {
        let _ = writeln!(
            out,
            "{:<3} {:<28} {:<16} LOST: the GPU is not answering (fallen off the bus?)",
            d.index,
            truncate(d.name, 28),
            d.pci_bus_id
        );
        return;
    }
    let field = |f: F| d.fields.get(f);
    let power = match (field(F::Power), field(F::PowerLimit)) {
        (None, None) => "n/a".to_string(),
        (p, l) => format!(
            "{}/{}",
            p.map_or("n/a".into(), |v| format!("{v:.0}W")),
            l.map_or("n/a".into(), |v| format!("{v:.0}W"))
        ),
    };
    let clocks = format!(
        "{}/{}",
        opt(field(F::SmClock), ""),
        opt(field(F::MemoryClock), "")
    );
    let _ = writeln!(
        out,
        "{:<3} {:<28} {:<16} {:>5} {:>6} {:>15} {:>19} {:>6} {:>6} {:>11}",
        d.index,
        truncate(d.name, 28),
        truncate(d.pci_bus_id, 16),
        // A window's temperature is a mean: whole degrees, as nvidia-smi prints.
        opt(field(F::Temperature).map(f64::round), "C"),
        pct(field(F::FanSpeed)),
        power,
        format!(
            "{}/{}",
            mib(field(F::MemoryUsed).map(|b| b as u64)),
            mib(field(F::MemoryTotal).map(|b| b as u64))
        ),
        pct(field(F::UtilizationGpu)),
        pct(field(F::UtilizationMemory)),
        clocks
    );
    render_device_details(out, d);
}

/// What some GPUs add under their row: GPM activity, NVLink links down, a row remapping to act
/// on, the MIG devices, the notable throttle reasons.
fn render_device_details(out: &mut String, d: &DeviceReport) {
    if d.activity.get(GpmField::SmActivity).is_some()
        || d.activity.get(GpmField::TensorActivity).is_some()
    {
        // GPM: what share of the GPU works, next to Util's "some kernel ran".
        let _ = writeln!(
            out,
            "    activity: SM {}  occupancy {}  tensor {}  DRAM {}",
            pct(d.activity.get(GpmField::SmActivity)),
            pct(d.activity.get(GpmField::SmOccupancy)),
            pct(d.activity.get(GpmField::TensorActivity)),
            pct(d.activity.get(GpmField::DramActivity))
        );
    }
    if !d.nvlink.is_empty() {
        let down: Vec<String> = d
            .nvlink
            .iter()
            .filter(|l| l.active == Some(false))
            .map(|l| l.link.to_string())
            .collect();
        let _ = writeln!(
            out,
            "    nvlink: {} links, {}",
            d.nvlink.len(),
            if down.is_empty() {
                "none down".to_string()
            } else {
                format!("down: {}", down.join(", "))
            }
        );
    }
    if let Some(r) = d.remapped_rows.filter(|r| r.pending || r.failure) {
        // What an on-call engineer must act on; healthy remap counts stay in the JSON.
        let _ = writeln!(
            out,
            "    row remapping: {} correctable, {} uncorrectable, {}",
            r.correctable,
            r.uncorrectable,
            if r.failure {
                "a remapping FAILED: the memory cannot be repaired, replace the GPU"
            } else {
                "a remapping is pending: reset the GPU to apply it"
            }
        );
    }
    for m in &d.mig_instances {
        // A MIG device under its GPU: identity, memory slice, its GPU instance's activity.
        // NVML names a MIG device "<GPU name> MIG <profile>": the profile is what tells
        // instances apart here.
        let profile = crate::sampling::model::mig_profile(m.name);
        let _ = writeln!(
            out,
            "    MIG GI {} CI {}  {:<10} {:<40} {:>19}  SM {}  tensor {}  DRAM {}",
            m.gpu_instance_id,
            m.compute_instance_id,
            truncate(profile, 10),
            m.uuid,
            format!("{}/{}", mib(m.memory_used_bytes), mib(m.memory_total_bytes)),
            pct(m.activity.get(GpmField::SmActivity)),
            pct(m.activity.get(GpmField::TensorActivity)),
            pct(m.activity.get(GpmField::DramActivity))
        );
    }
    if let Some(reasons) = &d.throttle_reasons {
        let notable: Vec<&str> = reasons
            .iter()
            .copied()
            .filter(|r| *r != "gpu_idle")
            .collect();
        if !notable.is_empty() {
            let _ = writeln!(out, "    throttled: {}", notable.join(", "));
        }
    }
}

/// The process table (or the line saying there is none).
fn render_processes(out: &mut String, report: &SnapshotReport) {
    let _ = writeln!(out);
    if report.processes.is_empty() {
        let _ = writeln!(out, "No GPU processes.");
    } else {
        let h = PROCESS_HEADER;
        // The MIG instance column appears only when some process runs on one.
        let on_mig = report.processes.iter().any(|p| p.mig_instance.is_some());
        let mig_column = |label: &str| {
            if on_mig {
                format!(" {:<16}", truncate(label, 16))
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            out,
            "{:<3}{} {:>8} {:>8} {:<4} {:>12} {:>6} {:>6}  {:<16} {:<14} {}",
            h[0],
            mig_column("MIG instance"),
            h[1],
            h[2],
            h[3],
            h[4],
            h[5],
            h[6],
            h[7],
            h[8],
            h[9]
        );
        for p in &report.processes {
            let instance = p.mig_instance.as_ref().map_or("-".to_string(), |m| {
                let profile = report
                    .devices
                    .iter()
                    .flat_map(|d| &d.mig_instances)
                    .find(|i| i.uuid == m.uuid)
                    .map_or("", |i| crate::sampling::model::mig_profile(i.name));
                format!(
                    "GI{} CI{} {profile}",
                    m.gpu_instance_id, m.compute_instance_id
                )
            });
            let kind = match p.kind {
                ProcessKind::Compute => "C",
                ProcessKind::Graphics => "G",
                ProcessKind::ComputeAndGraphics => "C+G",
            };
            let w = p.workload;
            let field =
                |get: fn(&Workload) -> Option<&str>| w.and_then(get).unwrap_or("-").to_string();
            let container: String = field(|w| w.container_id.as_deref())
                .chars()
                .take(12)
                .collect();
            let pod = match w.and_then(|w| w.pod_name.as_deref()) {
                Some(name) => format!(
                    "{}/{}",
                    w.and_then(|w| w.namespace_name.as_deref()).unwrap_or("?"),
                    name
                ),
                None => field(|w| w.pod_uid.as_deref()),
            };
            let _ = writeln!(
                out,
                "{:<3}{} {:>8} {:>8} {:<4} {:>12} {:>6} {:>6}  {:<16} {:<14} {}",
                p.device_index,
                mig_column(&instance),
                p.pid,
                w.and_then(|w| w.vpid)
                    .map_or("-".to_string(), |v| v.to_string()),
                kind,
                mib(p.gpu_memory_bytes),
                pct(p.sm_utilization),
                pct(p.memory_utilization),
                truncate(&field(|w| w.executable_name.as_deref()), 16),
                container,
                pod
            );
        }
    }
}

/// A one-sample or windowed snapshot runs no OTLP receiver, so it never hears the ranks' step
/// spans and the rank rules cannot run: say so when the processes show a distributed job (job
/// id from their environment), rather than let "Findings: none" read as "no straggler".
/// `/status` (a window of `gpulse run`, which may have a receiver) prints no such note.
fn render_rank_note(out: &mut String, report: &SnapshotReport) {
    if report.window.is_some() {
        return;
    }
    // Each pid with the rank its environment gives, when it gives one.
    let mut jobs: std::collections::BTreeMap<&str, Vec<(u32, Option<u32>)>> = Default::default();
    for p in &report.processes {
        let Some(workload) = p.workload else { continue };
        if let Some(job) = workload.job_id.as_deref() {
            let pids = jobs.entry(job).or_default();
            if !pids.iter().any(|(pid, _)| *pid == p.pid) {
                pids.push((p.pid, workload.rank.map(|r| r.rank)));
            }
        }
    }
    if jobs.is_empty() {
        return;
    }
    let _ = writeln!(out);
    for (job, pids) in &jobs {
        let pids: Vec<String> = pids
            .iter()
            .map(|(pid, rank)| match rank {
                Some(rank) => format!("{pid} (rank {rank})"),
                None => pid.to_string(),
            })
            .collect();
        let _ = writeln!(out, "Distributed job {job}: pids {}", pids.join(", "));
    }
    let _ = writeln!(
        out,
        "  Ranks are not compared here: snapshot hears no step spans. rank_straggler and \
         collective_bound run in `gpulse run --otlp-receiver-http` (GET /status lists them); \
         across nodes, the GpulseRankStragglerAcrossNodes alert (docs/distributed.md)."
    );
}

fn render_findings(out: &mut String, findings: &[Finding]) {
    let _ = writeln!(out);
    if findings.is_empty() {
        let _ = writeln!(out, "Findings: none.");
        return;
    }
    let _ = writeln!(out, "Findings:");
    for f in findings {
        // Most summaries open with their subject; name it only when one does not.
        let subject = f.subject.to_string();
        let _ = if f.summary.starts_with(&subject) {
            writeln!(out, "  [{}] {}: {}", f.severity, f.rule, f.summary)
        } else {
            writeln!(
                out,
                "  [{}] {} ({subject}): {}",
                f.severity, f.rule, f.summary
            )
        };
        if !f.evidence.is_empty() {
            let _ = writeln!(
                out,
                "      evidence from: {}",
                evidence_sources(&f.evidence)
            );
        }
        let _ = writeln!(out, "      what to do: {}", f.advice);
    }
}

/// Where a finding's figures came from, in words an operator knows.
fn evidence_sources(layers: &[Layer]) -> String {
    let mut layers = layers.to_vec();
    layers.sort_unstable();
    layers.dedup();
    layers
        .iter()
        .map(|l| match l {
            Layer::Nvml => "the driver (NVML)",
            Layer::Procfs => "the kernel (/proc, cgroups)",
            Layer::Metrics => "the framework's metrics",
            Layer::Spans => "the framework's spans",
            Layer::Logs => "the framework's live state (log records)",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::report::ProcessReport;

    fn report<'a>(workloads: &'a [Workload]) -> SnapshotReport<'a> {
        SnapshotReport {
            timestamp: 0.0,
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            devices: Vec::new(),
            processes: workloads
                .iter()
                .map(|w| ProcessReport {
                    pid: w.pid,
                    device_index: 0,
                    device_uuid: "GPU-0",
                    kind: ProcessKind::Compute,
                    gpu_memory_bytes: None,
                    sm_utilization: None,
                    memory_utilization: None,
                    encoder_utilization: None,
                    decoder_utilization: None,
                    mig_instance: None,
                    workload: Some(w),
                    usage: None,
                    accounting: None,
                    causes: None,
                })
                .collect(),
            findings: Vec::new(),
            window: None,
            at: None,
            accounting: None,
        }
    }

    #[test]
    fn a_distributed_job_gets_the_note_that_ranks_are_not_compared() {
        let mut rank0 = Workload::unresolved(10);
        rank0.job_id = Some("run-7".into());
        let mut rank1 = Workload::unresolved(11);
        rank1.job_id = Some("run-7".into());
        rank1.rank = Some(crate::attribution::EnvRank {
            rank: 1,
            world_size: 2,
            local_rank: None,
        });
        let alone = Workload::unresolved(12);
        let text = render_table(&report(&[rank0, rank1, alone.clone()]));
        assert!(text.contains("Findings: none."), "{text}");
        assert!(
            text.contains("Distributed job run-7: pids 10, 11 (rank 1)\n"),
            "{text}"
        );
        assert!(text.contains("Ranks are not compared here"), "{text}");
        let text = render_table(&report(&[alone]));
        assert!(!text.contains("Distributed job"), "{text}");
    }
}
