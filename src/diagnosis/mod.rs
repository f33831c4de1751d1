//! Diagnosis: rules over the export window and each workload's history that say why a job is slow
//! or about to fail, as `Finding`s; the tracker that turns findings into started/cleared events;
//! their OTLP log records; and the `gpulse check` health evaluation.
//!
//! Everything here is pure except `check::collect_health_facts` (reads NVML) and the small
//! amount of state in `History` and `FindingTracker`, which the caller owns. The usual loop,
//! once per export window, is what `Diagnoser::observe` does:
//! `history.record(&window)` → `rules::evaluate_all(&inputs, &thresholds)` →
//! `tracker.update(findings, window.end)` → `log_records::to_log_record` for each event.

pub mod check;
pub mod findings;
pub mod framework;
pub mod history;
pub(crate) mod ledger_phases;
pub mod live;
pub mod log_records;
pub(crate) mod max_queue;
pub(crate) mod rules;
pub(crate) mod tracker;
pub mod training;
pub(crate) mod xid;
pub(crate) mod xid_catalog;

use crate::attribution::AttributedWindow;

/// The rules' thresholds are the config file's `[diagnosis]` table, a value type of
/// [`crate::config`] (which resolves it), re-exported here where the rules are.
pub use crate::config::thresholds::{Thresholds, ThresholdsError};
pub use findings::{DeviceRef, Finding, FindingKey, JobKey, RuleId, Severity, Subject, Value};
pub use framework::{FrameworkEvidence, FrameworkHandle, Layer};
pub use history::{History, WindowSummary};
pub(crate) use rules::{evaluate_all, Inputs};
pub use tracker::{FindingEvent, FindingState, FindingTracker};

/// The diagnosis stage's state for `gpulse run`: thresholds, history and tracker together.
#[derive(Debug, Clone)]
pub struct Diagnoser {
    thresholds: Thresholds,
    history: History,
    tracker: FindingTracker,
}

impl Diagnoser {
    /// `thresholds` should have passed `Thresholds::validate` (the config loader does that);
    /// out-of-range values make rules never or always fire, they do not panic.
    pub fn new(thresholds: Thresholds) -> Self {
        Self {
            history: History::new(thresholds.history.clone()),
            tracker: FindingTracker::new(thresholds.clear_after_windows),
            thresholds,
        }
    }

    /// Records the window, runs the rules over it and its attributed processes (identity,
    /// CPU/memory use, parent liveness), and returns the findings that started or cleared.
    pub fn observe(&mut self, attributed: &AttributedWindow) -> Vec<FindingEvent> {
        let framework = FrameworkEvidence::default();
        self.observe_with_framework(attributed, &framework)
    }

    /// [`Diagnoser::observe`] with what the training framework reported about the processes.
    pub(crate) fn observe_with_framework(
        &mut self,
        attributed: &AttributedWindow,
        framework: &FrameworkEvidence,
    ) -> Vec<FindingEvent> {
        let window = &attributed.window;
        self.history.record(window);
        let inputs = Inputs {
            window,
            workloads: &attributed.workloads,
            departed: &attributed.departed,
            usage: &attributed.usage,
            parent_alive: &attributed.parent_alive,
            history: &self.history,
            by_pid: rules::sorted_by_pid(window),
            main_holders: Default::default(),
            framework,
        };
        let findings = evaluate_all(&inputs, &self.thresholds);
        self.tracker.update(findings, window.end)
    }

    /// Findings active now (for `snapshot` and the `gpulse.diagnosis.active` gauge).
    pub fn tracker(&self) -> &FindingTracker {
        &self.tracker
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub(crate) fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }
}
