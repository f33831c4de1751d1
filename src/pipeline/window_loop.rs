//! The window loop `gpulse run`, `gpulse record` and `gpulse top` share: fed every snapshot,
//! asked for the closed window once per export interval (or refresh, for `top`), it answers
//! with the [`Analysis`] of that window and publishes its [`View`](super::View).
//!
//! ```text
//! Snapshot ──▶ observer (the receivers' history: span enrichment)
//!          └─▶ WindowAggregator ──take──▶ Analyzer (attribution + diagnosis, with the
//!                framework evidence)  ──▶ Analysis, View ──▶ observer learns the identities
//! ```
//!
//! It is the one place where what the applications send through the local OTLP receiver meets
//! the attributed window: the receivers' intake writes the framework history
//! ([`WindowLoop::framework`]: allocator gauges, step and collective spans, what each process
//! says about itself) that the analyzer reads at every [`WindowLoop::close_window`], before
//! attribution rolls processes up (the identity a process sent) and before the rules run (the
//! evidence); and the
//! receivers' history, registered as the loop's [`WindowObserver`], gets every snapshot and the
//! identities of every attributed window. A feature that needs the receivers' live per-rank
//! state at each window (a rule, a ledger, an identity the process sends) reads it there, from
//! the framework history, at `close_window`. The intake itself is built by
//! `commands::receivers`, above the exporter whose queue it forwards into; this module imports
//! neither, so that the consumers of the view stay above the pipeline. Each command keeps only
//! its own select loop and its sinks (the exporter, the recorder, the live view).

use super::analyzer::{Analysis, Analyzer};
use super::view::ViewReceiver;
use crate::attribution::AttributedWindow;
use crate::config::AnalysisSettings;
use crate::diagnosis::FrameworkHandle;
use crate::sampling::{Snapshot, WindowAggregator};

/// Snapshots in, analysed windows out, with the state kept between windows.
pub struct WindowLoop {
    aggregator: WindowAggregator,
    analyzer: Analyzer,
    observer: Option<Box<dyn WindowObserver>>,
}

/// What learns from the loop besides the analyzer: every snapshot as it arrives, and the
/// attributed window once it is closed (the local OTLP receivers' history, which enriches the
/// spans of a process with its GPU usage and needs the identities attribution found).
pub trait WindowObserver: Send {
    fn snapshot(&self, snapshot: &Snapshot);
    fn window(&self, attributed: &AttributedWindow);
}

impl WindowLoop {
    /// A loop with no window open yet and no observer. Build it inside the tokio runtime the
    /// command runs: with a kubelet socket set, attribution keeps the pod list fresh on a task
    /// of that runtime (outside one it says so, and pod names are not refreshed).
    pub fn new(settings: &AnalysisSettings) -> Self {
        Self {
            aggregator: WindowAggregator::new(),
            analyzer: Analyzer::new(settings),
            observer: None,
        }
    }

    /// A receiver of every future [`View`](super::View) (and the current one, if any).
    pub fn subscribe(&self) -> ViewReceiver {
        self.analyzer.subscribe()
    }

    /// Where the receivers' intake writes what the training framework sends (allocator gauges,
    /// step spans, ranks); the analyzer reads it at every window.
    pub fn framework(&self) -> FrameworkHandle {
        self.analyzer.framework()
    }

    /// Hands `observer` every snapshot and attributed window from now on.
    pub fn observe(&mut self, observer: impl WindowObserver + 'static) {
        self.observer = Some(Box::new(observer));
    }

    /// Adds a snapshot to the open window (and hands it to the observer).
    pub fn add(&mut self, snapshot: &Snapshot) {
        if let Some(observer) = &self.observer {
            observer.snapshot(snapshot);
        }
        self.aggregator.add(snapshot);
    }

    /// Closes the open window, analyses it (publishing its view) and hands the observer the
    /// attributed window. `None` when no snapshot came since the last.
    pub fn close_window(&mut self) -> Option<Analysis> {
        let window = self.aggregator.take()?;
        let analysis = self.analyzer.analyze(window);
        if let Some(observer) = &self.observer {
            observer.window(&analysis.attributed);
        }
        Some(analysis)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::time::SystemTime;

    use super::*;
    use crate::config::thresholds::Thresholds;
    use crate::sampling::{DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample};

    /// What the observer was handed, in order.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl WindowObserver for Seen {
        fn snapshot(&self, snapshot: &Snapshot) {
            let pids: Vec<u32> = snapshot.processes.iter().map(|p| p.pid).collect();
            self.0.lock().unwrap().push(format!("snapshot {pids:?}"));
        }
        fn window(&self, attributed: &AttributedWindow) {
            let mut pids: Vec<u32> = attributed.workloads.keys().copied().collect();
            pids.sort_unstable();
            self.0.lock().unwrap().push(format!("window {pids:?}"));
        }
    }

    /// One device with this test's own process on it, so attribution reads a real `/proc`.
    fn snapshot(pid: u32) -> Snapshot {
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: "GPU-loop".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:01:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: Some(80 << 30),
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        });
        Snapshot {
            at: SystemTime::now(),
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            devices: vec![DeviceSample::empty(info, DeviceStatus::Ok)],
            processes: vec![ProcessSample {
                pid,
                device_index: 0,
                device_uuid: "GPU-loop".into(),
                kind: ProcessKind::Compute,
                gpu_memory_bytes: Some(1 << 30),
                sm_utilization: None,
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
                mig: None,
            }],
            events: Vec::new(),
        }
    }

    fn analysis_settings() -> AnalysisSettings {
        AnalysisSettings {
            proc_root: PathBuf::from("/proc"),
            include_command_line: false,
            read_environ: false,
            kubelet_socket: None,
            diagnosis: Thresholds::default(),
            downward: Default::default(),
            prices: Default::default(),
        }
    }

    /// A window closes only after a snapshot; closing it publishes the view the analysis
    /// describes, and the observer is handed each snapshot and then the attributed window.
    #[test]
    fn snapshots_in_one_analysed_window_out_seen_by_the_observer_and_the_view() {
        let pid = std::process::id();
        let mut windows = WindowLoop::new(&analysis_settings());
        let views = windows.subscribe();
        let seen = Seen::default();
        windows.observe(seen.clone());

        assert!(windows.close_window().is_none(), "no snapshot, no window");
        assert!(
            views.borrow().is_none(),
            "nothing published without a window"
        );

        windows.add(&snapshot(pid));
        windows.add(&snapshot(pid));
        let analysis = windows
            .close_window()
            .expect("a window after two snapshots");
        assert!(analysis.attributed.workloads.contains_key(&pid));
        let view = views
            .borrow()
            .clone()
            .expect("the window's view is published");
        assert!(Arc::ptr_eq(&view.attributed, &analysis.attributed));
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                format!("snapshot [{pid}]"),
                format!("snapshot [{pid}]"),
                format!("window [{pid}]"),
            ]
        );

        assert!(
            windows.close_window().is_none(),
            "the window was taken; nothing came since"
        );
    }
}
