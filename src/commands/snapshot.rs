//! `gpulse snapshot`: one sample, printed as a table that reads like `nvidia-smi` with a process
//! section, or as JSON — the stable contract other tools read (`null` where NVML gave nothing).

use std::fmt::Write as _;

use serde::Serialize;

use std::collections::HashMap;
use std::time::Duration;

use crate::attribution::{AttributedWindow, AttributionSettings, Attributor, Workload};
use crate::config::InspectConfig;
use crate::diagnosis::{Diagnoser, Finding};
use crate::export::metrics::throttle_reason_names;
use crate::sampling::{
    DeviceSample, DeviceStatus, GpmActivity, GpmWindow, MigInstanceSample, MigInstanceWindow,
    ProcessKind, ProcessMig, ProcessSample, Sampler, SessionError, Snapshot, WindowAggregator,
};

/// Takes one sample, resolves its processes' workloads as `run` would, and renders it in the
/// configured format.
///
/// # Errors
/// NVML could not be opened or stopped answering; the message says what to do.
pub fn snapshot(config: &InspectConfig) -> Result<String, SessionError> {
    let mut sampler = Sampler::open(&config.nvml_lib)?;
    // GPM activity is a rate between two GPM samples: take the first one now.
    if sampler.prime_gpm() {
        std::thread::sleep(crate::sampling::gpm::MIN_PAIR_INTERVAL + Duration::from_millis(10));
    }
    let snapshot = sampler.sample()?;
    let workloads = resolve_workloads(config, &snapshot);
    let findings = current_findings(config, &snapshot, &workloads);
    let mut report = SnapshotReport::new(&snapshot, &workloads);
    report.findings = findings;
    Ok(match config.format {
        crate::cli::OutputFormat::Json => render_json(&report) + "\n",
        crate::cli::OutputFormat::Table => render_table(&report),
    })
}

/// The findings one sample can support (memory pressure, throttling, hardware errors, uneven
/// multi-GPU use); rules that need a trend or a duration (memory growth, idle holder, input
/// bound) need `gpulse run`'s history and do not fire on a single sample.
fn current_findings(
    config: &InspectConfig,
    snapshot: &Snapshot,
    workloads: &HashMap<u32, Workload>,
) -> Vec<Finding> {
    let mut aggregator = WindowAggregator::new();
    aggregator.add(snapshot);
    let Some(window) = aggregator.take() else {
        return Vec::new();
    };
    let mut diagnoser = Diagnoser::new(config.diagnosis.clone());
    // One sample: no CPU figures or parent liveness yet, only who each process is.
    let attributed = AttributedWindow {
        window,
        workloads: workloads.clone(),
        usage: HashMap::new(),
        parent_alive: HashMap::new(),
    };
    diagnoser.observe(&attributed);
    diagnoser.tracker().active().cloned().collect()
}

/// Workloads of the snapshot's processes; pod names are fetched once from the kubelet socket
/// when it is there.
pub fn resolve_workloads(config: &InspectConfig, snapshot: &Snapshot) -> HashMap<u32, Workload> {
    let settings = AttributionSettings {
        proc_root: config.proc_root.clone(),
        include_command_line: config.include_command_line,
        read_environ: config.read_environ,
        kubelet_socket: config.kubelet_socket.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok();
    // Inside a runtime the attributor can reach the kubelet socket for pod names.
    let _entered = runtime.as_ref().map(|r| r.enter());
    let mut attributor = Attributor::new(settings);
    if let (Some(pods), Some(runtime)) = (attributor.pod_directory().cloned(), &runtime) {
        if let Err(e) = runtime.block_on(pods.refresh()) {
            tracing::debug!("no pod names for this snapshot: {e}");
        }
    }
    let processes: Vec<(u32, String)> = snapshot
        .processes
        .iter()
        .map(|p| (p.pid, p.device_uuid.clone()))
        .collect();
    attributor.resolve(&processes)
}

/// The JSON document `gpulse snapshot --format json` prints. Field names are a stable contract.
#[derive(Debug, Serialize)]
pub struct SnapshotReport<'a> {
    /// Unix time of the sample, in seconds.
    pub timestamp: f64,
    pub driver_version: Option<&'a str>,
    pub cuda_driver_version: Option<&'a str>,
    pub nvml_version: Option<&'a str>,
    pub devices: Vec<DeviceReport<'a>>,
    pub processes: Vec<ProcessReport<'a>>,
    /// What the diagnosis rules say about this sample; empty when there is nothing to say.
    pub findings: Vec<Finding>,
    /// `/status` only: the export window the figures summarise (device and process figures are
    /// then window means, memory the last sample). Absent from `gpulse snapshot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowReport>,
    /// `/status` only: Unix time, in seconds, at which the window was analysed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<f64>,
}

/// The export window behind a `/status` answer.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WindowReport {
    /// Unix time, in seconds.
    pub start: f64,
    pub end: f64,
    pub samples: u32,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport<'a> {
    pub index: u32,
    pub uuid: &'a str,
    pub name: &'a str,
    pub pci_bus_id: &'a str,
    pub status: DeviceStatus,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_reserved_bytes: Option<u64>,
    pub utilization_gpu: Option<f64>,
    pub utilization_memory: Option<f64>,
    pub utilization_encoder: Option<f64>,
    pub utilization_decoder: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub energy_joules: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub graphics_clock_mhz: Option<u32>,
    pub fan_speed: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub throttle_reasons: Option<Vec<&'static str>>,
    pub ecc_corrected_total: Option<u64>,
    pub ecc_uncorrected_total: Option<u64>,
    pub performance_state: Option<u32>,
    /// GPM activity ratios (Hopper and newer), `null` where the GPU gives none.
    #[serde(flatten)]
    pub activity: GpmReport,
    /// Row remapper state (Ampere and newer): rows remapped for correctable and uncorrectable
    /// errors, and whether a remapping waits for a GPU reset (`pending`) or failed (`failure`).
    pub remapped_rows: Option<crate::sampling::model::RemappedRows>,
    /// PCIe replays since the driver loaded.
    pub pcie_replays_total: Option<u64>,
    /// NVLink links (link, active, the driver's tx/rx byte and error totals); left out on a
    /// GPU without NVLink.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nvlink: Vec<crate::sampling::NvLinkSample>,
    /// The MIG devices of a GPU in MIG mode, each a device of its own; empty otherwise.
    pub mig_instances: Vec<MigInstanceReport<'a>>,
}

/// One MIG device: its identity, its memory slice and its GPU instance's GPM activity.
#[derive(Debug, Serialize)]
pub struct MigInstanceReport<'a> {
    /// `MIG-…` UUID (the instance's `hw.id`).
    pub uuid: &'a str,
    /// What NVML names the MIG device, with its profile (e.g. `… MIG 3g.40gb`).
    pub name: &'a str,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    #[serde(flatten)]
    pub activity: GpmReport,
}

/// GPM activity ratios under the keys a device report uses, `null` where NVML gave none.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GpmReport {
    pub sm_activity: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_activity: Option<f64>,
    pub tensor_hmma_activity: Option<f64>,
    pub tensor_imma_activity: Option<f64>,
    pub tensor_dfma_activity: Option<f64>,
    pub dram_activity: Option<f64>,
    pub fp16_activity: Option<f64>,
    pub fp32_activity: Option<f64>,
    pub fp64_activity: Option<f64>,
    pub integer_activity: Option<f64>,
    pub graphics_activity: Option<f64>,
}

impl GpmReport {
    fn of_sample(a: &GpmActivity) -> Self {
        Self {
            sm_activity: a.sm_activity,
            sm_occupancy: a.sm_occupancy,
            tensor_activity: a.tensor_activity,
            tensor_hmma_activity: a.tensor_hmma_activity,
            tensor_imma_activity: a.tensor_imma_activity,
            tensor_dfma_activity: a.tensor_dfma_activity,
            dram_activity: a.dram_activity,
            fp16_activity: a.fp16_activity,
            fp32_activity: a.fp32_activity,
            fp64_activity: a.fp64_activity,
            integer_activity: a.integer_activity,
            graphics_activity: a.graphics_activity,
        }
    }

    /// The window means.
    pub fn of_window(w: &GpmWindow) -> Self {
        let mean = |g: Option<crate::sampling::Gauge>| g.map(|g| g.mean);
        Self {
            sm_activity: mean(w.sm_activity),
            sm_occupancy: mean(w.sm_occupancy),
            tensor_activity: mean(w.tensor_activity),
            tensor_hmma_activity: mean(w.tensor_hmma_activity),
            tensor_imma_activity: mean(w.tensor_imma_activity),
            tensor_dfma_activity: mean(w.tensor_dfma_activity),
            dram_activity: mean(w.dram_activity),
            fp16_activity: mean(w.fp16_activity),
            fp32_activity: mean(w.fp32_activity),
            fp64_activity: mean(w.fp64_activity),
            integer_activity: mean(w.integer_activity),
            graphics_activity: mean(w.graphics_activity),
        }
    }
}

impl<'a> MigInstanceReport<'a> {
    fn of_sample(m: &'a MigInstanceSample) -> Self {
        Self {
            uuid: &m.info.uuid,
            name: &m.info.name,
            gpu_instance_id: m.info.gpu_instance_id,
            compute_instance_id: m.info.compute_instance_id,
            memory_total_bytes: m.memory_total_bytes,
            memory_used_bytes: m.memory_used_bytes,
            memory_free_bytes: m.memory_free_bytes,
            activity: GpmReport::of_sample(&m.gpm),
        }
    }

    /// A window's MIG device (`/status`): last memory values, mean activity.
    pub fn of_window(m: &'a MigInstanceWindow) -> Self {
        Self {
            uuid: &m.info.uuid,
            name: &m.info.name,
            gpu_instance_id: m.info.gpu_instance_id,
            compute_instance_id: m.info.compute_instance_id,
            memory_total_bytes: m.memory_total_bytes,
            memory_used_bytes: m.memory_used_bytes,
            memory_free_bytes: m.memory_free_bytes,
            activity: GpmReport::of_window(&m.gpm),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ProcessReport<'a> {
    pub pid: u32,
    pub device_index: u32,
    pub device_uuid: &'a str,
    pub kind: ProcessKind,
    pub gpu_memory_bytes: Option<u64>,
    pub sm_utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    pub encoder_utilization: Option<f64>,
    pub decoder_utilization: Option<f64>,
    /// The MIG device the process runs in (`uuid`, `gpu_instance_id`, `compute_instance_id`),
    /// `null` on a GPU not in MIG mode.
    pub mig_instance: Option<ProcessMig>,
    /// Who the process is (container, pod, namespaced PID), as `run` exports it.
    pub workload: Option<&'a Workload>,
    /// `/status` only: CPU and memory of the process (and its tree) over the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<&'a crate::attribution::ProcessUsage>,
}

impl<'a> SnapshotReport<'a> {
    pub fn new(snapshot: &'a Snapshot, workloads: &'a HashMap<u32, Workload>) -> Self {
        Self {
            timestamp: snapshot
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            driver_version: snapshot.driver_version.as_deref(),
            cuda_driver_version: snapshot.cuda_driver_version.as_deref(),
            nvml_version: snapshot.nvml_version.as_deref(),
            devices: snapshot.devices.iter().map(DeviceReport::new).collect(),
            processes: snapshot
                .processes
                .iter()
                .map(|p| ProcessReport::new(p, workloads.get(&p.pid)))
                .collect(),
            findings: Vec::new(),
            window: None,
            at: None,
        }
    }
}

impl<'a> DeviceReport<'a> {
    fn new(d: &'a DeviceSample) -> Self {
        Self {
            index: d.info.index,
            uuid: &d.info.uuid,
            name: &d.info.name,
            pci_bus_id: &d.info.pci_bus_id,
            status: d.status,
            memory_total_bytes: d.memory_total_bytes.or(d.info.memory_total_bytes),
            memory_used_bytes: d.memory_used_bytes,
            memory_free_bytes: d.memory_free_bytes,
            memory_reserved_bytes: d.memory_reserved_bytes,
            utilization_gpu: d.utilization_gpu,
            utilization_memory: d.utilization_memory,
            utilization_encoder: d.utilization_encoder,
            utilization_decoder: d.utilization_decoder,
            temperature_celsius: d.temperature_celsius,
            power_watts: d.power_watts,
            power_limit_watts: d.power_limit_watts,
            energy_joules: d.energy_joules,
            sm_clock_mhz: d.sm_clock_mhz,
            memory_clock_mhz: d.memory_clock_mhz,
            graphics_clock_mhz: d.graphics_clock_mhz,
            fan_speed: d.fan_speed,
            pcie_tx_bytes_per_second: d.pcie_tx_bytes_per_second,
            pcie_rx_bytes_per_second: d.pcie_rx_bytes_per_second,
            throttle_reasons: d.throttle_reasons.map(throttle_reason_names),
            ecc_corrected_total: d.ecc_corrected_total,
            ecc_uncorrected_total: d.ecc_uncorrected_total,
            performance_state: d.performance_state,
            activity: GpmReport::of_sample(&d.gpm),
            remapped_rows: d.remapped_rows,
            pcie_replays_total: d.pcie_replays_total,
            nvlink: d.nvlink.clone(),
            mig_instances: d
                .mig_instances
                .iter()
                .map(MigInstanceReport::of_sample)
                .collect(),
        }
    }
}

impl<'a> ProcessReport<'a> {
    fn new(p: &'a ProcessSample, workload: Option<&'a Workload>) -> Self {
        Self {
            pid: p.pid,
            device_index: p.device_index,
            device_uuid: &p.device_uuid,
            kind: p.kind,
            gpu_memory_bytes: p.gpu_memory_bytes,
            sm_utilization: p.sm_utilization,
            memory_utilization: p.memory_utilization,
            encoder_utilization: p.encoder_utilization,
            decoder_utilization: p.decoder_utilization,
            mig_instance: p.mig.clone(),
            workload,
            usage: None,
        }
    }
}

/// The JSON contract, pretty-printed.
pub fn render_json(report: &SnapshotReport) -> String {
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
pub fn render_table(report: &SnapshotReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Driver {}   CUDA {}   NVML {}",
        report.driver_version.unwrap_or("n/a"),
        report.cuda_driver_version.unwrap_or("n/a"),
        report.nvml_version.unwrap_or("n/a")
    );
    let h = DEVICE_HEADER;
    let _ = writeln!(
        out,
        "{:<3} {:<28} {:<16} {:>5} {:>6} {:>15} {:>19} {:>6} {:>6} {:>11}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]
    );
    for d in &report.devices {
        if d.status == DeviceStatus::Lost {
            let _ = writeln!(
                out,
                "{:<3} {:<28} {:<16} LOST: the GPU is not answering (fallen off the bus?)",
                d.index,
                truncate(d.name, 28),
                d.pci_bus_id
            );
            continue;
        }
        let power = match (d.power_watts, d.power_limit_watts) {
            (None, None) => "n/a".to_string(),
            (p, l) => format!(
                "{}/{}",
                p.map_or("n/a".into(), |v| format!("{v:.0}W")),
                l.map_or("n/a".into(), |v| format!("{v:.0}W"))
            ),
        };
        let clocks = format!(
            "{}/{}",
            opt(d.sm_clock_mhz, ""),
            opt(d.memory_clock_mhz, "")
        );
        let _ = writeln!(
            out,
            "{:<3} {:<28} {:<16} {:>5} {:>6} {:>15} {:>19} {:>6} {:>6} {:>11}",
            d.index,
            truncate(d.name, 28),
            truncate(d.pci_bus_id, 16),
            opt(d.temperature_celsius, "C"),
            pct(d.fan_speed),
            power,
            format!("{}/{}", mib(d.memory_used_bytes), mib(d.memory_total_bytes)),
            pct(d.utilization_gpu),
            pct(d.utilization_memory),
            clocks
        );
        if d.activity.sm_activity.is_some() || d.activity.tensor_activity.is_some() {
            // GPM: what share of the GPU works, next to Util's "some kernel ran".
            let _ = writeln!(
                out,
                "    activity: SM {}  occupancy {}  tensor {}  DRAM {}",
                pct(d.activity.sm_activity),
                pct(d.activity.sm_occupancy),
                pct(d.activity.tensor_activity),
                pct(d.activity.dram_activity)
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
            let profile = m.name.rsplit_once("MIG ").map_or(m.name, |(_, p)| p);
            let _ = writeln!(
                out,
                "    MIG GI {} CI {}  {:<10} {:<40} {:>19}  SM {}  tensor {}  DRAM {}",
                m.gpu_instance_id,
                m.compute_instance_id,
                truncate(profile, 10),
                m.uuid,
                format!("{}/{}", mib(m.memory_used_bytes), mib(m.memory_total_bytes)),
                pct(m.activity.sm_activity),
                pct(m.activity.tensor_activity),
                pct(m.activity.dram_activity)
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
    let _ = writeln!(out);
    if report.processes.is_empty() {
        let _ = writeln!(out, "No GPU processes.");
    } else {
        let h = PROCESS_HEADER;
        let _ = writeln!(
            out,
            "{:<3} {:>8} {:>8} {:<4} {:>12} {:>6} {:>6}  {:<16} {:<14} {}",
            h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]
        );
        for p in &report.processes {
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
                "{:<3} {:>8} {:>8} {:<4} {:>12} {:>6} {:>6}  {:<16} {:<14} {}",
                p.device_index,
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
    render_findings(&mut out, &report.findings);
    out
}

fn render_findings(out: &mut String, findings: &[Finding]) {
    let _ = writeln!(out);
    if findings.is_empty() {
        let _ = writeln!(out, "Findings: none.");
        return;
    }
    let _ = writeln!(out, "Findings:");
    for f in findings {
        let _ = writeln!(
            out,
            "  [{}] {} ({}): {}",
            f.severity.as_str(),
            f.rule.as_str(),
            f.subject,
            f.summary
        );
        let _ = writeln!(out, "      what to do: {}", f.advice);
    }
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
