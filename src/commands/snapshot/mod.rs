//! `gpulse snapshot`: one sample (or a short window, [`window()`]), printed as a table that reads
//! like `nvidia-smi` with a process section, or as JSON — the stable contract other tools read
//! (`null` where NVML gave nothing). Printing lives in [`render`].

mod render;
pub mod window;

pub(crate) use render::{render_json, render_table};
pub use window::{window, WindowError, MIN_WINDOW};

use std::collections::HashMap;
use std::time::Duration;

use crate::attribution::{
    AttributedWindow, AttributionSettings, Attributor, GpuProcessMig, GpuProcessRef, Workload,
};
use crate::config::InspectConfig;
use crate::diagnosis::{Diagnoser, Finding};
use crate::pipeline::SnapshotReport;
use crate::sampling::{Sampler, SessionError, Snapshot, WindowAggregator};

/// Takes one sample (or, with a `window`, samples for that long: see
/// [`window()`]), resolves its processes' workloads as `run` would, and renders it
/// in the configured format.
///
/// # Errors
/// NVML could not be opened or stopped answering; the message says what to do.
pub fn snapshot(config: &InspectConfig, window: Option<Duration>) -> Result<String, SessionError> {
    if let Some(span) = window {
        return match window::windowed_snapshot(config, span)? {
            Some(printed) => Ok(printed),
            // Unreachable with MIN_WINDOW ≥ 2 sample intervals; one sample is still an answer.
            None => snapshot(config, None),
        };
    }
    let mut sampler = Sampler::open(&config.common.nvml_lib)?;
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
/// multi-GPU use); rules that need a trend, a duration or CPU figures (memory growth, idle
/// holder, input bound) need a window (`--window`) or `gpulse run`'s history.
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
    let mut diagnoser = Diagnoser::new(config.common.analysis.diagnosis.clone());
    // One sample: no CPU figures or parent liveness yet, only who each process is.
    let attributed = AttributedWindow {
        window,
        workloads: workloads.clone(),
        usage: HashMap::new(),
        parent_alive: HashMap::new(),
        accounts: Default::default(),
        departed: Default::default(),
        ledger: Default::default(),
    };
    diagnoser.observe(&attributed);
    diagnoser.tracker().active().cloned().collect()
}

/// Workloads of the snapshot's processes; pod names are fetched once from the kubelet socket
/// when it is there.
pub(crate) fn resolve_workloads(
    config: &InspectConfig,
    snapshot: &Snapshot,
) -> HashMap<u32, Workload> {
    let settings = AttributionSettings {
        proc_root: config.common.analysis.proc_root.clone(),
        include_command_line: config.common.analysis.include_command_line,
        read_environ: config.common.analysis.read_environ,
        kubelet_socket: config.common.analysis.kubelet_socket.clone(),
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
    attributor.resolve_processes(&snapshot_processes(snapshot))
}

/// The snapshot's GPU processes with what pod matching needs besides the UUID: the minor number
/// and the MIG device (UUID and profile) that a DRA device name is made of, the same facts the
/// exporting path takes from its windows (`Attributor::resolve_window_in`).
fn snapshot_processes(snapshot: &Snapshot) -> Vec<GpuProcessRef<'_>> {
    snapshot
        .processes
        .iter()
        .map(|p| {
            let device = snapshot
                .devices
                .iter()
                .find(|d| d.info.uuid == p.device_uuid);
            let mig = p.mig.as_ref().map(|mig| GpuProcessMig {
                uuid: &mig.uuid,
                profile: device
                    .and_then(|d| d.mig_instances.iter().find(|m| m.info.uuid == mig.uuid))
                    .map_or("", |m| m.info.profile()),
            });
            GpuProcessRef {
                pid: p.pid,
                device_uuid: &p.device_uuid,
                device_minor: device.and_then(|d| d.info.minor_number),
                mig,
            }
        })
        .collect()
}
