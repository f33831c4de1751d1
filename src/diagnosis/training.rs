//! The training figures of one window, per GPU process: the per-step means a process's step spans
//! gave (step time, time blocked in collectives, time waiting on data) and its place in a
//! distributed job. Taken from the same [`FrameworkEvidence`] the rules read, so what gpulse
//! exports (`gpulse.training.step.*`), what `/metrics` and `gpulse top` show and what
//! `rank_straggler` judged are one set of numbers.
//!
//! Each node's gpulse only sees the ranks on its node; exporting these figures with the job id
//! and rank is what lets a backend compare the ranks of a job across nodes
//! (examples/kubernetes/prometheus-operator's cross-node straggler rule).

use std::collections::BTreeMap;

use super::framework::{DistributedIdentity, FrameworkEvidence};

/// What one process's recent steps say (the means over `input_bound.step_lookback`, as the
/// rules see them).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessTraining {
    /// Mean seconds of one step.
    pub step_seconds: f64,
    /// Mean seconds per step with a torch.distributed collective in flight; `None` unless every
    /// counted step carried it (a mix would understate it).
    pub collective_wait_seconds: Option<f64>,
    /// Mean seconds per step spent waiting on the DataLoader.
    pub data_wait_seconds: f64,
    /// Steps the means are taken over.
    pub steps: usize,
    /// Its rank and job, when the companion reported them.
    pub distributed: Option<DistributedIdentity>,
}

impl ProcessTraining {
    /// Share of the step spent in collectives.
    pub(crate) fn collective_wait_ratio(&self) -> Option<f64> {
        let wait = self.collective_wait_seconds?;
        (self.step_seconds > 0.0).then(|| (wait / self.step_seconds).min(1.0))
    }

    /// `job-7/2`: the job id and rank, for one column of a table.
    pub(crate) fn rank_label(&self) -> Option<String> {
        let d = self.distributed.as_ref()?;
        Some(match &d.job_id {
            Some(job) => format!("{job}/{}", d.rank),
            None => format!("?/{}", d.rank),
        })
    }
}

/// The training figures of a window's processes, by host PID; empty without a receiver or
/// without step spans.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingWindow {
    pub processes: BTreeMap<u32, ProcessTraining>,
}

impl TrainingWindow {
    /// The figures of every process whose recent step spans the evidence holds.
    pub(crate) fn from_evidence(evidence: &FrameworkEvidence) -> Self {
        let processes = evidence
            .processes
            .iter()
            .filter_map(|(pid, process)| {
                let steps = process.steps?;
                Some((
                    *pid,
                    ProcessTraining {
                        step_seconds: steps.step_seconds_mean,
                        collective_wait_seconds: steps.collective_wait_seconds_mean,
                        data_wait_seconds: steps.data_wait_seconds_mean,
                        steps: steps.steps,
                        distributed: process.distributed.clone(),
                    },
                ))
            })
            .collect();
        Self { processes }
    }

    pub(crate) fn process(&self, pid: u32) -> Option<&ProcessTraining> {
        self.processes.get(&pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::framework::{ProcessEvidence, StepEvidence};

    #[test]
    fn only_processes_with_steps_have_figures_and_they_keep_the_rank() {
        let mut evidence = FrameworkEvidence::default();
        evidence.processes.insert(
            10,
            ProcessEvidence {
                steps: Some(StepEvidence {
                    steps: 20,
                    step_seconds_mean: 0.5,
                    collective_wait_seconds_mean: Some(0.2),
                    data_wait_seconds_mean: 0.05,
                    ..StepEvidence::default()
                }),
                distributed: Some(DistributedIdentity {
                    rank: 3,
                    job_id: Some("job-7".into()),
                    ..DistributedIdentity::default()
                }),
                ..ProcessEvidence::default()
            },
        );
        // Allocator gauges only: no step figures.
        evidence.processes.insert(11, ProcessEvidence::default());
        let training = TrainingWindow::from_evidence(&evidence);
        assert_eq!(training.processes.len(), 1);
        let p = training.process(10).unwrap();
        assert_eq!(p.steps, 20);
        assert!((p.collective_wait_ratio().unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(p.rank_label().as_deref(), Some("job-7/3"));
        assert!(training.process(11).is_none());
    }

    #[test]
    fn without_collective_timings_there_is_no_busy_time() {
        let p = ProcessTraining {
            step_seconds: 0.5,
            collective_wait_seconds: None,
            data_wait_seconds: 0.0,
            steps: 3,
            distributed: None,
        };
        assert_eq!(p.collective_wait_ratio(), None);
        assert_eq!(p.rank_label(), None);
    }
}
