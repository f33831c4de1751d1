//! `gpulse check`'s line about distributed training: which jobs' ranks run on this node (job id
//! and rank from each GPU process's environment), and that check does not compare them. The rank
//! rules (`rank_straggler`, `collective_bound`) need each rank's step spans over minutes; check
//! takes one NVML reading and runs no receiver, so without this line "all passed" would read as
//! "no straggler".

use std::collections::BTreeMap;

use super::{CheckResult, CheckStatus};

/// One GPU process of a distributed job, as its environment names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankProcess {
    pub job_id: String,
    pub pid: u32,
    pub rank: Option<u32>,
}

/// The `Distributed training` line, when any GPU process belongs to a job: it always passes
/// (nothing was judged) and says what would judge it.
pub(crate) fn distributed_training(processes: &[RankProcess]) -> Option<CheckResult> {
    let mut jobs: BTreeMap<&str, Vec<&RankProcess>> = BTreeMap::new();
    for p in processes {
        let ranks = jobs.entry(p.job_id.as_str()).or_default();
        if !ranks.iter().any(|r| r.pid == p.pid) {
            ranks.push(p);
        }
    }
    if jobs.is_empty() {
        return None;
    }
    let listed: Vec<String> = jobs
        .iter()
        .map(|(job, ranks)| {
            let mut ranks = ranks.clone();
            ranks.sort_by_key(|r| (r.rank.is_none(), r.rank, r.pid));
            let pids: Vec<String> = ranks
                .iter()
                .map(|r| match r.rank {
                    Some(rank) => format!("rank {rank} pid {}", r.pid),
                    None => format!("pid {}", r.pid),
                })
                .collect();
            format!("job {job} ({})", pids.join(", "))
        })
        .collect();
    Some(CheckResult {
        name: "Distributed training".into(),
        device: None,
        status: CheckStatus::Pass,
        reason: format!(
            "n/a: {} on this node; ranks NOT compared: check hears no step spans, and \
             rank_straggler/collective_bound need each rank's spans over minutes. See them in \
             `gpulse top --otlp-receiver-http PORT` or `gpulse run --otlp-receiver-http PORT` \
             (GET /status), the companion sending there; across nodes the \
             GpulseRankStragglerAcrossNodes alert",
            listed.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(job: &str, pid: u32, rank: Option<u32>) -> RankProcess {
        RankProcess {
            job_id: job.into(),
            pid,
            rank,
        }
    }

    #[test]
    fn each_job_is_listed_with_its_ranks_and_the_line_says_they_are_not_compared() {
        let line = distributed_training(&[
            rank("run-7", 11, Some(1)),
            rank("run-7", 10, Some(0)),
            rank("run-7", 10, Some(0)), // the same process on a second GPU
            rank("slurm-55", 20, None),
        ])
        .expect("a line");
        assert_eq!(line.status, CheckStatus::Pass);
        assert_eq!(line.device, None);
        assert!(
            line.reason.starts_with(
                "n/a: job run-7 (rank 0 pid 10, rank 1 pid 11); job slurm-55 (pid 20) on this \
                 node; ranks NOT compared: check hears no step spans"
            ),
            "{}",
            line.reason
        );
        assert!(
            line.reason.contains("--otlp-receiver-http"),
            "{}",
            line.reason
        );
    }

    #[test]
    fn no_job_no_line() {
        assert_eq!(distributed_training(&[]), None);
    }
}
