//! `/status`: the running pipeline's latest [`View`] as the snapshot JSON contract
//! (`commands::snapshot::SnapshotReport`, the same shape as `gpulse snapshot --format json`),
//! plus the window it summarises (`window`: start, end, samples) and when it was analysed
//! (`at`), and each process's CPU use (`usage`). Built from the published view only: answering
//! never calls NVML or reads `/proc`, so a busy notebook polling it costs the sampler nothing.
//!
//! Device and process figures are the window's means (what gpulse exports), memory figures the
//! window's last sample. Before the first window closes the answer is 503 with a JSON error.

use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;

use crate::commands::analysis::View;
use crate::commands::snapshot::{DeviceReport, ProcessReport, SnapshotReport, WindowReport};
use crate::export::metrics::throttle_reason_names;
use crate::sampling::{DeviceWindow, ProcessWindow};

/// The status code and JSON body of a `/status` answer.
pub fn status_json(view: Option<&View>) -> (StatusCode, String) {
    let Some(view) = view else {
        let body = serde_json::json!({
            "error": "the first window is pending: gpulse has not finished its first export \
                      interval yet; retry after one --export-interval",
        });
        return (StatusCode::SERVICE_UNAVAILABLE, body.to_string() + "\n");
    };
    let report = report(view);
    match serde_json::to_string(&report) {
        Ok(json) => (StatusCode::OK, json + "\n"),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({ "error": format!("could not encode the status: {e}") }).to_string()
                + "\n",
        ),
    }
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The snapshot report of a view.
pub fn report(view: &View) -> SnapshotReport<'_> {
    let attributed = &view.attributed;
    let window = &attributed.window;
    let mut processes: Vec<&ProcessWindow> = window.processes.iter().collect();
    processes.sort_by_key(|p| (p.device_index, p.pid));
    SnapshotReport {
        timestamp: seconds(window.end),
        driver_version: window.driver_version.as_deref(),
        cuda_driver_version: window.cuda_driver_version.as_deref(),
        nvml_version: None,
        devices: window.devices.iter().map(device).collect(),
        processes: processes
            .into_iter()
            .map(|p| ProcessReport {
                pid: p.pid,
                device_index: p.device_index,
                device_uuid: &p.device_uuid,
                kind: p.kind,
                gpu_memory_bytes: p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64),
                sm_utilization: p.sm_utilization.map(|g| g.mean),
                memory_utilization: p.memory_utilization.map(|g| g.mean),
                encoder_utilization: p.encoder_utilization.map(|g| g.mean),
                decoder_utilization: p.decoder_utilization.map(|g| g.mean),
                mig_instance: window.mig_instance_of(p.pid, &p.device_uuid).map(|m| {
                    crate::sampling::ProcessMig {
                        uuid: m.info.uuid.clone(),
                        gpu_instance_id: m.info.gpu_instance_id,
                        compute_instance_id: m.info.compute_instance_id,
                    }
                }),
                workload: attributed.workloads.get(&p.pid),
                usage: attributed.usage.get(&p.pid),
            })
            .collect(),
        findings: view.findings.clone(),
        window: Some(WindowReport {
            start: seconds(window.start),
            end: seconds(window.end),
            samples: window.sample_count,
        }),
        at: Some(seconds(view.at)),
    }
}

fn device(d: &DeviceWindow) -> DeviceReport<'_> {
    let mhz = |g: Option<crate::sampling::Gauge>| g.map(|g| g.mean.round().max(0.0) as u32);
    // Reasons active in at least half of the window's samples, as the throttling rule reads them.
    let throttle = d.throttle_active_ratio.as_ref().map(|ratios| {
        let bits = ratios
            .iter()
            .filter(|(_, ratio)| **ratio >= 0.5)
            .fold(0u64, |bits, (bit, _)| bits | bit);
        throttle_reason_names(bits)
    });
    DeviceReport {
        index: d.info.index,
        uuid: &d.info.uuid,
        name: &d.info.name,
        pci_bus_id: &d.info.pci_bus_id,
        status: d.status,
        memory_total_bytes: d.memory_total_bytes.or(d.info.memory_total_bytes),
        memory_used_bytes: d.memory_used_bytes,
        memory_free_bytes: d.memory_free_bytes,
        memory_reserved_bytes: d.memory_reserved_bytes,
        utilization_gpu: d.utilization_gpu.map(|g| g.mean),
        utilization_memory: d.utilization_memory.map(|g| g.mean),
        utilization_encoder: d.utilization_encoder.map(|g| g.mean),
        utilization_decoder: d.utilization_decoder.map(|g| g.mean),
        temperature_celsius: d.temperature_celsius.map(|g| g.mean),
        power_watts: d.power_watts.map(|g| g.mean),
        power_limit_watts: d.power_limit_watts,
        energy_joules: d.energy_joules_total,
        sm_clock_mhz: mhz(d.sm_clock_mhz),
        memory_clock_mhz: mhz(d.memory_clock_mhz),
        graphics_clock_mhz: mhz(d.graphics_clock_mhz),
        fan_speed: d.fan_speed.map(|g| g.mean),
        // The window keeps PCIe totals, not rates; a rate needs two windows.
        pcie_tx_bytes_per_second: None,
        pcie_rx_bytes_per_second: None,
        throttle_reasons: throttle,
        ecc_corrected_total: d.ecc_corrected_total,
        ecc_uncorrected_total: d.ecc_uncorrected_total,
        performance_state: d.performance_state,
        activity: crate::commands::snapshot::GpmReport::of_window(&d.gpm),
        remapped_rows: d.remapped_rows,
        pcie_replays_total: d.pcie_replays_total,
        nvlink: d.nvlink.iter().map(|l| l.last).collect(),
        mig_instances: d
            .mig_instances
            .iter()
            .map(crate::commands::snapshot::MigInstanceReport::of_window)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::attribution::{AttributedWindow, ProcessUsage};
    use crate::diagnosis::rules::testkit::{device as device_window, process, window, GIB};

    #[test]
    fn before_the_first_window_the_answer_is_503_with_a_json_error() {
        let (status, body) = status_json(None);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(json["error"]
            .as_str()
            .unwrap()
            .contains("first window is pending"));
    }

    #[test]
    fn a_view_becomes_the_snapshot_contract_with_its_window() {
        let w = window(
            120,
            vec![device_window(0, 0.42, 20 * GIB)],
            vec![process(4242, 0, 10 * GIB, Some(0.3))],
        );
        let mut attributed = AttributedWindow::unattributed(w);
        attributed.usage.insert(
            4242,
            ProcessUsage {
                cpu_utilization: Some(0.5),
                tree_cpu_utilization: Some(1.5),
                memory_rss_bytes: Some(GIB),
            },
        );
        let view = View {
            attributed: Arc::new(attributed),
            findings: Vec::new(),
            at: UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_121),
        };
        let (status, body) = status_json(Some(&view));
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["devices"][0]["utilization_gpu"], 0.42);
        assert_eq!(json["devices"][0]["uuid"], "GPU-00000000");
        let p = &json["processes"][0];
        assert_eq!(p["pid"], 4242);
        assert_eq!(p["sm_utilization"], 0.3);
        assert_eq!(p["gpu_memory_bytes"], 10 * GIB);
        assert_eq!(p["workload"]["pid"], 4242);
        assert_eq!(p["usage"]["tree_cpu_utilization"], 1.5);
        assert_eq!(json["window"]["samples"], 60);
        assert_eq!(json["window"]["end"], 1_700_000_120.0);
        assert_eq!(json["at"], 1_700_000_121.0);
        assert!(json["findings"].as_array().unwrap().is_empty());
    }
}
