//! Window-by-window bookkeeping of which findings are active: a finding STARTS the first window
//! a rule reports it (keyed by rule + subject), ESCALATES when a later window reports it with a
//! higher severity (a critical XID after an application one must not hide behind the first
//! record), and CLEARS after `clear_after_windows` consecutive windows without it. `gpulse run` exports one log record per event and the
//! `gpulse.diagnosis.active` gauge from `active_counts`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

use super::findings::{Finding, FindingKey, RuleId};
use crate::schema::health::HealthMetricId;

/// Whether a finding began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingState {
    Started,
    /// Already active, now reported with a higher severity.
    Escalated,
    Cleared,
}

impl FindingState {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            FindingState::Started => "started",
            FindingState::Escalated => "escalated",
            FindingState::Cleared => "cleared",
        }
    }
}

/// A finding that started or cleared at `at` (the end of the window that decided it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FindingEvent {
    pub state: FindingState,
    /// For `Started` and `Escalated`, the finding as reported in that window; for `Cleared`, as
    /// last reported.
    pub finding: Finding,
    #[serde(with = "crate::sampling::model::unix_nanos")]
    pub at: SystemTime,
}

#[derive(Debug, Clone)]
struct Tracked {
    finding: Finding,
    /// Consecutive windows without the finding.
    missing: u32,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct FindingTracker {
    clear_after_windows: u32,
    active: BTreeMap<FindingKey, Tracked>,
}

impl FindingTracker {
    /// `clear_after_windows` below 1 is taken as 1.
    pub(crate) fn new(clear_after_windows: u32) -> Self {
        Self {
            clear_after_windows: clear_after_windows.max(1),
            active: BTreeMap::new(),
        }
    }

    /// Feeds one window's findings; returns the events: started and escalated first, then
    /// cleared, each group in key order.
    ///
    /// A finding already active is refreshed (values, severity, summary) and keeps its earliest
    /// `since`; it yields an `Escalated` event only when its severity rose. Two findings with the same key in one batch: the more severe one is kept.
    pub(crate) fn update(&mut self, findings: Vec<Finding>, at: SystemTime) -> Vec<FindingEvent> {
        let mut batch: BTreeMap<FindingKey, Finding> = BTreeMap::new();
        for f in findings {
            let key = f.key();
            match batch.get(&key) {
                Some(existing) if existing.severity >= f.severity => {}
                _ => {
                    batch.insert(key, f);
                }
            }
        }

        let mut started = Vec::new();
        for (key, mut finding) in batch.iter().map(|(k, f)| (k.clone(), f.clone())) {
            match self.active.get_mut(&key) {
                Some(tracked) => {
                    finding.since = finding.since.min(tracked.finding.since);
                    if finding.severity > tracked.finding.severity {
                        started.push(FindingEvent {
                            state: FindingState::Escalated,
                            finding: finding.clone(),
                            at,
                        });
                    }
                    tracked.finding = finding;
                    tracked.missing = 0;
                }
                None => {
                    started.push(FindingEvent {
                        state: FindingState::Started,
                        finding: finding.clone(),
                        at,
                    });
                    self.active.insert(
                        key,
                        Tracked {
                            finding,
                            missing: 0,
                        },
                    );
                }
            }
        }

        let mut cleared = Vec::new();
        let limit = self.clear_after_windows;
        self.active.retain(|key, tracked| {
            if batch.contains_key(key) {
                return true;
            }
            tracked.missing += 1;
            if tracked.missing >= limit {
                cleared.push(FindingEvent {
                    state: FindingState::Cleared,
                    finding: tracked.finding.clone(),
                    at,
                });
                false
            } else {
                true
            }
        });
        started.extend(cleared);
        started
    }

    /// Findings active now, in key order.
    pub(crate) fn active(&self) -> impl Iterator<Item = &Finding> {
        self.active.values().map(|t| &t.finding)
    }

    /// Active findings by rule, every rule present (0 when none), for the
    /// `gpulse.diagnosis.active` gauge: a series that drops to 0 is clearer than one that stops.
    pub fn active_counts(&self) -> BTreeMap<RuleId, u64> {
        let mut counts: BTreeMap<RuleId, u64> = RuleId::ALL.iter().map(|r| (*r, 0)).collect();
        for key in self.active.keys() {
            *counts.entry(key.rule).or_default() += 1;
        }
        counts
    }
}

/// Name of the gauge of active findings, with attribute `gpulse.diagnosis.rule`: its row of the
/// health metric table, so OTLP (`crate::export::telemetry`) and Prometheus say the same.
pub(crate) const ACTIVE_GAUGE_NAME: &str = HealthMetricId::DiagnosisActive.spec().name;
/// Its unit and description.
pub(crate) const ACTIVE_GAUGE_UNIT: &str = HealthMetricId::DiagnosisActive.spec().unit;
pub(crate) const ACTIVE_GAUGE_DESCRIPTION: &str =
    HealthMetricId::DiagnosisActive.spec().description;

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::diagnosis::findings::{DeviceRef, Severity, Subject};

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn finding(rule: RuleId, gpu: u32, since: u64, severity: Severity) -> Finding {
        Finding {
            rule,
            severity,
            subject: Subject::Device(DeviceRef {
                uuid: format!("GPU-{gpu}"),
                index: gpu,
                mig: None,
            }),
            summary: format!("gpu {gpu}"),
            advice: String::new(),
            values: vec![],
            since: at(since),
            evidence: vec![],
            related: Vec::new(),
        }
    }

    #[test]
    fn start_continue_clear_with_hysteresis() {
        let mut tr = FindingTracker::new(2);
        let ev = tr.update(
            vec![finding(RuleId::Throttling, 0, 0, Severity::Error)],
            at(60),
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].state, FindingState::Started);
        assert_eq!(tr.active_counts()[&RuleId::Throttling], 1);

        // Still there: no event, earliest since kept.
        let ev = tr.update(
            vec![finding(RuleId::Throttling, 0, 60, Severity::Error)],
            at(120),
        );
        assert!(ev.is_empty());
        assert_eq!(tr.active().next().map(|f| f.since), Some(at(0)));

        // Missing once: still active (hysteresis 2).
        assert!(tr.update(vec![], at(180)).is_empty());
        assert_eq!(tr.active().count(), 1);

        // Missing twice: cleared.
        let ev = tr.update(vec![], at(240));
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].state, FindingState::Cleared);
        assert_eq!(ev[0].at, at(240));
        assert_eq!(tr.active_counts()[&RuleId::Throttling], 0);
        assert_eq!(tr.active_counts().len(), RuleId::ALL.len());
    }

    #[test]
    fn higher_severity_escalates_lower_does_not() {
        let mut tr = FindingTracker::new(2);
        tr.update(
            vec![finding(RuleId::HardwareErrors, 0, 0, Severity::Error)],
            at(60),
        );
        let ev = tr.update(
            vec![finding(RuleId::HardwareErrors, 0, 60, Severity::Critical)],
            at(120),
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].state, FindingState::Escalated);
        assert_eq!(ev[0].finding.severity, Severity::Critical);
        assert_eq!(ev[0].finding.since, at(0));
        let ev = tr.update(
            vec![finding(RuleId::HardwareErrors, 0, 60, Severity::Error)],
            at(180),
        );
        assert!(ev.is_empty(), "{ev:?}");
        assert_eq!(tr.active().count(), 1);
    }

    #[test]
    fn reappearing_before_clear_resets_the_count() {
        let mut tr = FindingTracker::new(2);
        tr.update(
            vec![finding(RuleId::Throttling, 0, 0, Severity::Error)],
            at(60),
        );
        tr.update(vec![], at(120));
        assert!(tr
            .update(
                vec![finding(RuleId::Throttling, 0, 0, Severity::Error)],
                at(180)
            )
            .is_empty());
        assert!(tr.update(vec![], at(240)).is_empty());
        assert_eq!(tr.active().count(), 1);
    }

    #[test]
    fn different_subjects_and_rules_are_different_findings() {
        let mut tr = FindingTracker::new(1);
        let ev = tr.update(
            vec![
                finding(RuleId::Throttling, 0, 0, Severity::Error),
                finding(RuleId::Throttling, 1, 0, Severity::Error),
                finding(RuleId::HardwareErrors, 0, 0, Severity::Critical),
                // Duplicate key in one batch: counted once, the more severe kept.
                finding(RuleId::Throttling, 1, 0, Severity::Critical),
            ],
            at(60),
        );
        assert_eq!(ev.len(), 3);
        assert_eq!(tr.active_counts()[&RuleId::Throttling], 2);
        assert_eq!(tr.active_counts()[&RuleId::HardwareErrors], 1);
        let gpu1 = tr
            .active()
            .find(|f| f.rule == RuleId::Throttling && f.summary == "gpu 1")
            .map(|f| f.severity);
        assert_eq!(gpu1, Some(Severity::Critical));
        // With clear_after 1, one empty window clears all three.
        let ev = tr.update(vec![], at(120));
        assert_eq!(
            ev.iter()
                .filter(|e| e.state == FindingState::Cleared)
                .count(),
            3
        );
    }
}
