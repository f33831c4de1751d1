//! `gpulse report` over many recordings: one report for a training job spread over many nodes.
//!
//! Each file is one node's OTLP/JSON lines ([`node`]); the job's processes are found on every
//! node by their job id (`gpulse.job.id`, else `pytorch.distributed.job.id`) and their ranks'
//! steps by the companion's span resources. [`answers`] compares every rank of the job (the
//! straggler and why, the ledger with the waiting ranks rebooked, the what-if, a hang's
//! culprit); [`page`] draws the HTML, with a lane per rank, node by node. The [`JobReport`] is
//! also the JSON (`--json`) and the summary lines.

pub(crate) mod answers;
pub(crate) mod node;
pub(crate) mod page;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use self::answers::{Hang, JobLedger, RankFigures, Straggler, WhatIf};
use self::node::{Node, Problem};
use crate::config::thresholds::RankStraggler;
use crate::diagnosis::findings::RuleId;
use crate::record::recording::FindingMark;
use crate::record::summary::{duration, gpu_hours};
use crate::values::Prices;

/// Why no job report could be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    #[error("no recording could be read:\n{}", list(.0))]
    NothingRead(Vec<Problem>),
    #[error("the recordings hold no training job (no process with `gpulse.job.id` or `pytorch.distributed.job.id`): a job report needs the ranks' job id, which the PyTorch companion or TORCHELASTIC_RUN_ID / SLURM_JOB_ID give. For one node's report, give one file without --job")]
    NoJob,
    #[error("the recordings hold {} jobs: {}. Pick one with --job ID", .0.len(), .0.join(", "))]
    SeveralJobs(Vec<String>),
    #[error("job {wanted:?} is not in the recordings; they hold: {}. Pick one of those with --job", .found.join(", "))]
    NoSuchJob { wanted: String, found: Vec<String> },
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A finding of one node, as the job report lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodeFinding {
    pub node: String,
    #[serde(flatten)]
    pub finding: FindingMark,
}

/// The job report: what `gpulse report FILE...` writes as JSON and draws as HTML.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobReport {
    pub job_id: String,
    /// Seconds since the Unix epoch of the first and last step of any rank.
    pub started: Option<f64>,
    pub ended: Option<f64>,
    pub nodes: Vec<String>,
    pub files: Vec<PathBuf>,
    pub ranks: Vec<RankFigures>,
    pub straggler: Option<Straggler>,
    pub what_if: Option<WhatIf>,
    pub hang: Option<Hang>,
    pub ledger: JobLedger,
    /// Every node's findings, with the node; a hang's per-node findings stay here too.
    pub findings: Vec<NodeFinding>,
    pub problems: Vec<Problem>,
    /// Where the HTML was written.
    pub report: Option<String>,
    #[serde(skip)]
    pub(crate) steps: BTreeMap<u32, Vec<node::Step>>,
}

/// Reads every file and builds the report of `job` (or of the one job they hold).
///
/// # Errors
/// No file could be read, or the job to report is not known (see [`JobError`]).
pub(crate) fn build(
    files: &[PathBuf],
    job: Option<&str>,
    prices: &Prices,
) -> Result<JobReport, JobError> {
    let mut problems = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for file in files {
        let read = node::read_file(file);
        problems.extend(read.problems);
        let Some(node) = read.node else {
            continue;
        };
        // Two files of one node (a run recorded in parts) are one node.
        match nodes.iter_mut().find(|n| n.name == node.name) {
            Some(known) => merge(known, node),
            None => nodes.push(node),
        }
    }
    report_of(nodes, problems, job, prices)
}

/// The report of `job` (or of the one job they hold) over `nodes`, already read.
///
/// # Errors
/// No node, or the job to report is not known (see [`JobError`]).
pub(crate) fn report_of(
    nodes: Vec<Node>,
    problems: Vec<Problem>,
    job: Option<&str>,
    prices: &Prices,
) -> Result<JobReport, JobError> {
    if nodes.is_empty() {
        return Err(JobError::NothingRead(problems));
    }
    let jobs: Vec<String> = {
        let mut ids: Vec<String> = nodes
            .iter()
            .flat_map(|n| {
                n.processes
                    .iter()
                    .filter_map(|p| p.job_id.clone())
                    .chain(n.steps.keys().map(|(job, _)| job.clone()))
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let job_id = match job {
        Some(wanted) if jobs.iter().any(|j| j == wanted) => wanted.to_string(),
        Some(wanted) => {
            return Err(JobError::NoSuchJob {
                wanted: wanted.into(),
                found: jobs,
            })
        }
        None => match jobs.as_slice() {
            [] => return Err(JobError::NoJob),
            [one] => one.clone(),
            _ => return Err(JobError::SeveralJobs(jobs)),
        },
    };
    let thresholds = RankStraggler::default();
    let ranks = answers::ranks(&nodes, &job_id);
    let hang = answers::hang(&nodes, &job_id);
    let mut straggler = answers::straggler(&nodes, &job_id, &ranks, &thresholds);
    // A rank that stopped the job for a while is also the slowest on average: the hang is why.
    if let (Some(s), Some(h)) = (&mut straggler, &hang) {
        if h.culprit_rank == Some(s.rank) && s.cause == "compute" {
            s.cause = "hang".into();
            s.evidence.pop();
            s.evidence.push(format!(
                "it hung the job (distributed_hang, cause {})",
                h.cause
            ));
        }
    }
    let ledger = answers::ledger(&nodes, &job_id, straggler.as_ref(), prices);
    let what_if = straggler
        .as_ref()
        .and_then(|s| answers::what_if(&ranks, s, &ledger, prices));
    let steps: BTreeMap<u32, Vec<node::Step>> = nodes
        .iter()
        .flat_map(|n| &n.steps)
        .filter(|((job, _), _)| *job == job_id)
        .map(|((_, rank), steps)| (*rank, steps.clone()))
        .collect();
    let all_steps = steps.values().flatten();
    let started = all_steps.clone().map(|s| s.start).reduce(f64::min);
    let ended = all_steps.map(|s| s.end).reduce(f64::max);
    let findings = nodes
        .iter()
        .flat_map(|n| {
            n.recording
                .iter()
                .flat_map(|r| &r.findings)
                .map(|f| NodeFinding {
                    node: n.name.clone(),
                    finding: f.clone(),
                })
        })
        .collect();
    Ok(JobReport {
        job_id,
        started,
        ended,
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        files: nodes.iter().flat_map(|n| n.files.clone()).collect(),
        ranks,
        straggler,
        what_if,
        hang,
        ledger,
        findings,
        problems,
        report: None,
        steps,
    })
}

/// `later`, a second file of the same node, folded into `known`.
fn merge(known: &mut Node, later: Node) {
    known.files.extend(later.files);
    for process in later.processes {
        match known
            .processes
            .iter_mut()
            .find(|p| p.pid == process.pid && p.device_uuid == process.device_uuid)
        {
            // Counters since the process was first seen: the larger total is the later one.
            Some(p) => {
                for (key, seconds) in process.seconds {
                    let slot = p.seconds.entry(key).or_insert(0.0);
                    *slot = slot.max(seconds);
                }
                for (key, joules) in process.joules {
                    let slot = p.joules.entry(key).or_insert(0.0);
                    *slot = slot.max(joules);
                }
            }
            None => known.processes.push(process),
        }
    }
    for (key, steps) in later.steps {
        let list = known.steps.entry(key).or_default();
        list.extend(steps);
        list.sort_by(|a, b| a.start.total_cmp(&b.start));
        list.dedup_by(|a, b| a.start == b.start && a.end == b.end);
    }
    known.raised.extend(later.raised);
    match (&mut known.recording, later.recording) {
        (Some(recording), Some(other)) => recording.findings.extend(other.findings),
        (slot @ None, other) => *slot = other,
        _ => {}
    }
}

impl JobReport {
    /// How long the job's steps ran, from the first step's start to the last step's end.
    pub(crate) fn steps_seconds(&self) -> Option<f64> {
        Some(self.ended? - self.started?)
    }

    /// The summary lines, in the form `gpulse record` prints its own.
    pub(crate) fn render_text(&self) -> String {
        let mut out = String::new();
        let span = self
            .steps_seconds()
            .map_or(String::new(), |s| format!(" over {}", duration(s)));
        let _ = writeln!(
            out,
            "gpulse report: job {} on {} node{} ({}), {} rank{}{span}",
            self.job_id,
            self.nodes.len(),
            if self.nodes.len() == 1 { "" } else { "s" },
            self.nodes.join(", "),
            self.ranks.len(),
            if self.ranks.len() == 1 { "" } else { "s" },
        );
        for r in &self.ranks {
            let _ = writeln!(
                out,
                "  rank {} on {}{}: {} steps of {:.3} s, {:.3} s outside collectives, {:.3} s in collectives, {:.3} s on its DataLoader; {} GPU-h",
                r.rank,
                r.node,
                r.device_index.map_or(String::new(), |i| format!(" GPU {i}")),
                r.steps,
                r.step_seconds,
                r.busy_seconds,
                r.collective_wait_seconds,
                r.data_wait_seconds,
                gpu_hours(r.gpu_hours)
            );
        }
        match &self.straggler {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "  straggler: rank {} on {} (cause {}): {:.3} s per step outside collectives against the others' {:.3} s",
                    s.rank, s.node, s.cause, s.busy_seconds, s.others_busy_seconds
                );
                for e in &s.evidence {
                    let _ = writeln!(out, "      evidence: {e}");
                }
            }
            None if self.ranks.len() > 1 => {
                let _ = writeln!(out, "  straggler: none (the ranks kept pace)");
            }
            None => {}
        }
        if let Some(w) = &self.what_if {
            let cost = w
                .saved_cost
                .map_or(String::new(), |c| format!(" (cost {c:.2})"));
            let _ = writeln!(
                out,
                "  what if: at the median rank's pace a step would take {:.3} s instead of {:.3} s: {} GPU-h{cost} saved over {} steps × {} ranks, {:.0}% of the job's GPU time",
                w.step_seconds_at_median_pace,
                w.step_seconds,
                gpu_hours(w.saved_gpu_hours),
                w.steps,
                w.ranks,
                w.saved_share * 100.0
            );
        }
        if let Some(h) = &self.hang {
            match (h.culprit_rank, &h.culprit_node) {
                (Some(rank), Some(node)) => {
                    let _ = writeln!(
                        out,
                        "  hang: rank {rank} on {node} holds the job (cause {}): {}",
                        h.cause, h.summary
                    );
                }
                _ => {
                    let _ = writeln!(out, "  hang: {} ({})", h.summary, h.cause);
                }
            }
            for (node, ranks) in &h.waiting {
                let _ = writeln!(out, "      waiting on {node}: ranks {ranks}");
            }
        }
        let l = &self.ledger;
        let cost = l.cost.map_or(String::new(), |c| format!(", cost {c:.2}"));
        let _ = writeln!(
            out,
            "  where the job's GPU time went: {} GPU-h, {:.3} kWh{cost} (docs/job-report.md):",
            gpu_hours(l.gpu_hours),
            l.kwh
        );
        for c in &l.by_cause {
            let share = if l.gpu_hours > 0.0 {
                c.gpu_hours / l.gpu_hours
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "    {}{}: {} GPU-h, {:.0}%",
                c.cause,
                c.straggler_rank
                    .map_or(String::new(), |r| format!(" (waiting for rank {r})")),
                gpu_hours(c.gpu_hours),
                share * 100.0
            );
        }
        for n in &l.by_node {
            let cost = n.cost.map_or(String::new(), |c| format!(", cost {c:.2}"));
            let _ = writeln!(
                out,
                "    node {} (ranks {}): {} GPU-h, {:.3} kWh{cost}",
                n.node,
                n.ranks
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                gpu_hours(n.gpu_hours),
                n.kwh
            );
        }
        let hang_rule = RuleId::DistributedHang.as_str();
        let shown: Vec<&NodeFinding> = self
            .findings
            .iter()
            .filter(|f| self.hang.is_none() || f.finding.rule != hang_rule)
            .collect();
        if shown.is_empty() {
            let _ = writeln!(out, "  findings: none");
        }
        for f in shown {
            let _ = writeln!(
                out,
                "  [{}] {} on {}: {}",
                f.finding.severity, f.finding.rule, f.node, f.finding.summary
            );
        }
        for p in &self.problems {
            let _ = writeln!(out, "  problem: {p}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::node::tests::export_line;
    use super::*;

    fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn files_of_two_jobs_without_job_name_both_and_with_it_one_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.jsonl",
            &export_line("node-a", 1_000_000_000, &[(1, "train-1", 0, 5.0)]),
        );
        let b = write(
            dir.path(),
            "b.jsonl",
            &export_line("node-b", 1_000_000_000, &[(2, "train-2", 0, 5.0)]),
        );
        let files = [a, b];
        let err = build(&files, None, &Prices::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the recordings hold 2 jobs: train-1, train-2. Pick one with --job ID"
        );
        let report = build(&files, Some("train-2"), &Prices::default()).unwrap();
        assert_eq!(report.ledger.by_node.len(), 1);
        assert_eq!(report.ledger.by_node[0].node, "node-b");
        let err = build(&files, Some("train-3"), &Prices::default()).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "job \"train-3\" is not in the recordings; they hold: train-1, train-2"
            ),
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_file_is_a_problem_of_the_report_and_the_others_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.jsonl",
            &export_line("node-a", 1_000_000_000, &[(1, "j", 0, 5.0)]),
        );
        let missing = dir.path().join("missing.jsonl");
        let report = build(&[a, missing.clone()], None, &Prices::default()).unwrap();
        assert_eq!(report.nodes, vec!["node-a".to_string()]);
        assert_eq!(report.problems.len(), 1);
        assert_eq!(report.problems[0].file, missing);
        assert!(
            report.render_text().contains("problem: "),
            "{}",
            report.render_text()
        );
        let err = build(&[missing], None, &Prices::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("no recording could be read:"),
            "{err}"
        );
    }
}
