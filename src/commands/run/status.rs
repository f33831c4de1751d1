//! `/status`: the running pipeline's latest [`View`] as the snapshot JSON contract
//! (`pipeline::SnapshotReport`, the same shape as `gpulse snapshot --format json`),
//! plus the window it summarises (`window`: start, end, samples) and when it was analysed
//! (`at`), and each process's CPU use (`usage`). Built from the published view only: answering
//! never calls NVML or reads `/proc`, so a busy notebook polling it costs the sampler nothing.
//!
//! Device and process figures are the window's means (what gpulse exports), memory figures the
//! window's last sample. Before the first window closes the answer is 503 with a JSON error.

use http::StatusCode;

use crate::pipeline::SnapshotReport;
use crate::pipeline::View;

/// The status code and JSON body of a `/status` answer.
pub(crate) fn status_json(view: Option<&View>) -> (StatusCode, String) {
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

/// The snapshot report of a view.
pub(crate) fn report(view: &View) -> SnapshotReport<'_> {
    SnapshotReport::of_view(view)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

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
            training: Default::default(),
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
