//! The step phases the ledger (`attribution::ledger`) charges a window's held time by: from the
//! same framework evidence the rules read (the companion's recent `step` and `data_wait` spans
//! and each step's `pytorch.distributed.collective.wait`), and from the active `rank_straggler`
//! findings, which name the rank a job's others wait for.
//!
//! A process is **inside its steps** for a window while its newest step ended no earlier than
//! [`SPAN_DELAY`] plus two of its steps before the window began: spans reach gpulse in the
//! companion's batches, seconds after they end, so "no step seen yet for this window" is not yet
//! "outside the loop". The loop's shares are the means over the evidence's lookback
//! (`input_bound.step_lookback`): the ledger uses the loop's recent rhythm, not the instants of
//! one window, for the same reason.
//!
//! Back the other way, [`with_saving`] gives an `input_bound` or `rank_straggler` finding's
//! advice what fixing its cause alone would have saved so far, from the ledger.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::findings::{Finding, RuleId, Subject, Value};
use super::framework::FrameworkEvidence;
use crate::attribution::accounting::{Accounts, GroupKind};
use crate::attribution::{Cause, Ledger, Prices, StepPhases};

/// How late a finished step's span may reach gpulse: the OpenTelemetry SDK's batch span
/// processor sends every 5 s by default, and a request may be in flight for as long again.
pub const SPAN_DELAY: Duration = Duration::from_secs(10);

/// The phases of every process of `evidence` that is inside its steps during the window that
/// began at `window_start`, by host PID.
pub(crate) fn step_phases<'a>(
    evidence: &FrameworkEvidence,
    active: impl IntoIterator<Item = &'a Finding>,
    window_start: SystemTime,
) -> HashMap<u32, StepPhases> {
    let stragglers = stragglers(active);
    let mut phases = HashMap::new();
    for (pid, process) in &evidence.processes {
        let Some(steps) = process.steps else {
            continue;
        };
        if steps.step_seconds_mean <= 0.0 {
            continue;
        }
        let recent = steps.newest_end.is_some_and(|newest| {
            let slack = SPAN_DELAY + Duration::from_secs_f64(2.0 * steps.step_seconds_mean);
            window_start
                .checked_sub(slack)
                .is_none_or(|from| newest >= from)
        });
        if !recent {
            continue;
        }
        let job = process
            .distributed
            .as_ref()
            .and_then(|d| d.job_id.as_deref());
        let waited_for_rank = job
            .and_then(|job| stragglers.get(job))
            .filter(|(straggler_pid, _)| straggler_pid != pid)
            .map(|(_, rank)| *rank);
        phases.insert(
            *pid,
            StepPhases {
                in_step: 1.0,
                input_wait: steps.data_wait_ratio,
                collective_wait: steps.collective_wait_ratio().unwrap_or(0.0),
                waited_for_rank,
            },
        );
    }
    phases
}

/// `finding` with what fixing its cause alone would have saved over the run so far appended to
/// its advice: for `input_bound`, the process's `input_wait` GPU-hours on the finding's device
/// (every device without one); for `rank_straggler`, the `straggler_wait` GPU-hours of its job.
/// At most: where the GPU still ran queued work during a wait, fixing it saves less. Other
/// findings, and one whose cause has no time yet, are returned as they are.
pub(crate) fn with_saving(
    mut finding: Finding,
    accounts: &Accounts,
    ledger: &Ledger,
    prices: &Prices,
) -> Finding {
    let hours = match (&finding.rule, &finding.subject) {
        (RuleId::InputBound, Subject::Workload { pid, device, .. }) => {
            let on = |uuid: &str| device.as_ref().is_none_or(|d| d.uuid == uuid);
            ledger
                .processes
                .iter()
                .filter(|p| p.pid == *pid && on(&p.device_uuid))
                .map(|p| {
                    let share = accounts
                        .process(p.pid, &p.device_uuid)
                        .and_then(|a| a.gpu_share)
                        .unwrap_or(0.0);
                    let seconds: f64 = p
                        .total
                        .iter()
                        .filter(|c| c.cause == Cause::InputWait)
                        .map(|c| c.seconds)
                        .sum();
                    seconds * share / 3600.0
                })
                .sum::<f64>()
        }
        (RuleId::RankStraggler, _) => {
            let job = finding.values.iter().find_map(|(name, value)| match value {
                Value::Text(job) if name == "job_id" => Some(job.clone()),
                _ => None,
            });
            job.and_then(|job| ledger.rollup(GroupKind::Job, &job))
                .and_then(|r| r.cause(Cause::StragglerWait))
                .map_or(0.0, |c| c.gpu_hours)
        }
        _ => return finding,
    };
    if hours <= 0.0 {
        return finding;
    }
    let cost = prices.per_gpu_hour.map_or(String::new(), |p| {
        format!(", cost {:.2} at the GPU-hour price", p * hours)
    });
    let what = match finding.rule {
        RuleId::RankStraggler => "the other ranks' wait for this one",
        _ => "this wait",
    };
    finding.advice.push_str(&format!(
        " Fixing {what} alone would have saved up to {hours:.3} GPU-hours{cost} so far (gpulse's \
         ledger, docs/shared-gpus.md)."
    ));
    finding
}

/// The straggler `rank_straggler` names in each job: job id → (its host PID, its rank).
fn stragglers<'a>(active: impl IntoIterator<Item = &'a Finding>) -> HashMap<String, (u32, u32)> {
    let mut out = HashMap::new();
    for finding in active {
        if finding.rule != RuleId::RankStraggler {
            continue;
        }
        let Subject::Workload { pid, .. } = &finding.subject else {
            continue;
        };
        let value = |name: &str| finding.values.iter().find(|(n, _)| n == name);
        let (Some((_, Value::Text(job))), Some((_, Value::Int(rank)))) =
            (value("job_id"), value("rank"))
        else {
            continue;
        };
        if let Ok(rank) = u32::try_from(*rank) {
            out.insert(job.clone(), (*pid, rank));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::diagnosis::findings::Severity;
    use crate::diagnosis::framework::{DistributedIdentity, ProcessEvidence, StepEvidence};

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    fn rank(rank: u32, newest: u64, wait: f64) -> ProcessEvidence {
        ProcessEvidence {
            steps: Some(StepEvidence {
                steps: 50,
                step_seconds_mean: 0.5,
                data_wait_ratio: 0.1,
                data_wait_seconds_mean: 0.05,
                collective_wait_seconds_mean: Some(wait),
                newest_end: Some(t(newest)),
                ..StepEvidence::default()
            }),
            distributed: Some(DistributedIdentity {
                rank,
                job_id: Some("job-7".into()),
                ..DistributedIdentity::default()
            }),
            ..ProcessEvidence::default()
        }
    }

    fn straggler_finding(pid: u32, rank: u32) -> Finding {
        Finding {
            rule: RuleId::RankStraggler,
            related: Vec::new(),
            severity: Severity::Warning,
            subject: Subject::Workload {
                pid,
                vpid: None,
                device: None,
                container_id: None,
                pod_uid: None,
                service_name: "train".into(),
            },
            summary: String::new(),
            advice: String::new(),
            values: vec![
                ("rank".into(), Value::from(rank)),
                ("job_id".into(), Value::from("job-7")),
            ],
            since: t(0),
            evidence: Vec::new(),
        }
    }

    #[test]
    fn the_others_wait_for_the_named_rank_and_a_silent_loop_has_no_phases() {
        let mut evidence = FrameworkEvidence::default();
        evidence.processes.insert(10, rank(0, 100, 0.2));
        evidence.processes.insert(11, rank(1, 100, 0.0));
        // Its newest step ended 30 s before the window: out of its loop.
        evidence.processes.insert(12, rank(2, 70, 0.2));
        let finding = straggler_finding(11, 1);
        let phases = step_phases(&evidence, [&finding], t(100));
        assert_eq!(phases[&10].waited_for_rank, Some(1));
        assert!((phases[&10].collective_wait - 0.4).abs() < 1e-9);
        assert!((phases[&10].input_wait - 0.1).abs() < 1e-9);
        assert_eq!(
            phases[&11].waited_for_rank, None,
            "the straggler waits for nobody"
        );
        assert!(!phases.contains_key(&12));

        let phases = step_phases(&evidence, [], t(100));
        assert_eq!(
            phases[&10].waited_for_rank, None,
            "no finding, no named rank"
        );
    }

    /// An hour of rank 0 (job-7) waiting 40 % of its steps for rank 1, and rank 1 20 % on its
    /// loader, both 50 % busy.
    fn charged_hour() -> (Accounts, Ledger) {
        use crate::attribution::accounting::{ProcessAccount, Rollup};
        use crate::attribution::{CauseBook, Workload};
        let account = |pid| ProcessAccount {
            pid,
            device_uuid: "GPU-0".into(),
            mig_uuid: None,
            activity: Some(0.5),
            activity_source: None,
            energy_weight: None,
            window_held_seconds: 3600.0,
            window_energy_joules: None,
            held_seconds: 3600.0,
            active_seconds: None,
            idle_seconds: None,
            unknown_seconds: 0.0,
            energy_joules: None,
            gpu_share: Some(1.0),
            since: t(0),
        };
        let accounts = Accounts {
            processes: vec![account(10), account(11)],
            rollups: vec![Rollup::empty(GroupKind::Job, "job-7".into())],
            ..Accounts::default()
        };
        let workloads = [10, 11]
            .map(|pid| {
                let workload = Workload {
                    job_id: Some("job-7".into()),
                    ..Workload::unresolved(pid)
                };
                (pid, workload)
            })
            .into_iter()
            .collect();
        let waiting = StepPhases {
            in_step: 1.0,
            collective_wait: 0.4,
            waited_for_rank: Some(1),
            ..StepPhases::default()
        };
        let loading = StepPhases {
            in_step: 1.0,
            input_wait: 0.2,
            ..StepPhases::default()
        };
        let phases = [(10, waiting), (11, loading)].into_iter().collect();
        let ledger = CauseBook::default().charge(&accounts, &phases, &workloads);
        (accounts, ledger)
    }

    #[test]
    fn a_waits_finding_says_what_fixing_it_alone_would_have_saved() {
        let (accounts, ledger) = charged_hour();
        let prices = Prices {
            per_gpu_hour: Some(2.0),
            per_kwh: None,
        };
        let straggler = with_saving(straggler_finding(11, 1), &accounts, &ledger, &prices);
        let said = " Fixing the other ranks' wait for this one alone would have saved up to 0.400 \
                    GPU-hours, cost 0.80 at the GPU-hour price so far (gpulse's ledger, \
                    docs/shared-gpus.md).";
        assert!(straggler.advice.ends_with(said), "{}", straggler.advice);
        let mut input = straggler_finding(11, 1);
        input.rule = RuleId::InputBound;
        let input = with_saving(input, &accounts, &ledger, &Prices::default());
        let said = " Fixing this wait alone would have saved up to 0.200 GPU-hours so far \
                    (gpulse's ledger, docs/shared-gpus.md).";
        assert!(input.advice.ends_with(said), "{}", input.advice);
        // Nothing to save yet, or another rule: the advice stays as it was.
        let mut other = straggler_finding(10, 1);
        other.rule = RuleId::InputBound;
        assert_eq!(
            with_saving(other.clone(), &accounts, &ledger, &prices),
            other
        );
        let mut throttling = straggler_finding(11, 1);
        throttling.rule = RuleId::Throttling;
        assert_eq!(
            with_saving(throttling.clone(), &accounts, &ledger, &prices),
            throttling
        );
    }
}
