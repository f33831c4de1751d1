//! `rank_straggler`: one rank of a synchronous data-parallel job is slower than the others, and
//! every other rank waits for it inside its collectives.
//!
//! In DDP every step ends in an all-reduce that completes only when the last rank arrives, so all
//! ranks show the same step time: the symptom (the others' collective wait) and the cause (one
//! rank's extra time outside collectives) sit in different processes. The rule compares, among the
//! ranks of one job on this node (the same `pytorch.distributed.job.id`, as the PyTorch companion
//! reports it; never ranks of different jobs), each rank's mean step time outside collectives
//! (`step` span minus its `pytorch.distributed.collective.wait`). The slowest rank is a straggler
//! when it exceeds the median of the others by `excess_ratio_at_least` (and
//! `excess_seconds_at_least`) while the others spend `others_wait_ratio_at_least` of their steps in
//! collectives, and every compared rank has sent steps for `min_duration`. The means are over the
//! framework evidence's lookback (`input_bound.step_lookback`).
//!
//! Why it is slow, first match wins:
//! - `data_wait`: its extra time is mostly time blocked on its DataLoader (step spans);
//! - `gpu_clocks`: its GPU runs at lower SM clocks than the others' GPUs (NVML);
//! - `gpu_shared`: another process, not a rank of the job, uses its GPU (NVML);
//! - `host_cpu`: its process tree uses its cgroup's whole CPU quota (procfs, cgroups);
//! - `compute`: none of these: it has more work (uneven shards, variable sequence lengths).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::thresholds::RankStraggler;
use crate::diagnosis::findings::{pct, Finding, Layer, RuleId, Severity, Value};
use crate::diagnosis::framework::{DistributedIdentity, StepEvidence};
use crate::sampling::ProcessWindow;
use crate::schema::DeviceField;

use super::{process_device_ref, Inputs};

/// One rank of a job as the rules compare it.
#[derive(Debug, Clone)]
pub(crate) struct Rank<'a> {
    pub pid: u32,
    pub identity: &'a DistributedIdentity,
    pub steps: StepEvidence,
    /// Mean seconds of a step outside collectives.
    pub busy: f64,
    /// Mean seconds of a step with a collective in flight.
    pub wait: f64,
    pub processes: Vec<&'a ProcessWindow>,
}

/// The ranks of each job on this node that sent enough steps with their collective wait, by job
/// id, ranks ascending. A process without a job id is compared with nobody.
pub(crate) fn jobs<'a>(
    inputs: &Inputs<'a>,
    min_steps: usize,
    min_duration: Duration,
) -> BTreeMap<&'a str, Vec<Rank<'a>>> {
    let mut jobs: BTreeMap<&'a str, Vec<Rank<'a>>> = BTreeMap::new();
    for (pid, processes) in inputs.processes_by_pid() {
        let Some(evidence) = inputs.framework.process(pid) else {
            continue;
        };
        let Some(identity) = evidence.distributed.as_ref() else {
            continue;
        };
        let Some(job) = identity.job_id.as_deref() else {
            continue;
        };
        let Some(steps) = evidence.steps else {
            continue;
        };
        let (Some(busy), Some(wait)) = (
            steps.busy_seconds_mean(),
            steps.collective_wait_seconds_mean,
        ) else {
            continue;
        };
        if steps.steps < min_steps || steps.heard_seconds < min_duration.as_secs_f64() {
            continue;
        }
        jobs.entry(job).or_default().push(Rank {
            pid,
            identity,
            steps,
            busy,
            wait,
            processes: processes.to_vec(),
        });
    }
    for ranks in jobs.values_mut() {
        ranks.sort_by_key(|r| (r.identity.rank, r.pid));
    }
    jobs.retain(|_, ranks| ranks.len() >= 2);
    jobs
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The straggler of a job: `(index in ranks, excess seconds, others' median busy seconds,
/// others' median wait ratio)`, when the slowest rank is one by the thresholds.
pub(crate) fn straggler(ranks: &[Rank<'_>], t: &RankStraggler) -> Option<(usize, f64, f64, f64)> {
    let (index, slowest) = ranks
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.busy.total_cmp(&b.1.busy))?;
    let others: Vec<&Rank<'_>> = ranks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != index)
        .map(|(_, r)| r)
        .collect();
    let others_busy = median(others.iter().map(|r| r.busy).collect());
    let others_wait = median(
        others
            .iter()
            .filter_map(|r| r.steps.collective_wait_ratio())
            .collect(),
    );
    let excess = slowest.busy - others_busy;
    let holds = excess >= t.excess_seconds_at_least
        && excess >= t.excess_ratio_at_least * others_busy
        && others_wait >= t.others_wait_ratio_at_least;
    holds.then_some((index, excess, others_busy, others_wait))
}

const DATA_WAIT_ADVICE: &str = "This rank waits on its DataLoader while the others wait for it \
in their all-reduce: the whole job runs at this rank's input speed. Find what is different on it: \
its shard (larger or slower-to-decode files), its node's storage or network, its CPU quota. Raise \
DataLoader(num_workers=N) and prefetch_factor on every rank, set persistent_workers=True and \
pin_memory=True, and check that the dataset is sharded evenly (DistributedSampler).";

const GPU_CLOCKS_ADVICE: &str = "This rank's GPU runs at lower clocks than the others' and \
every rank waits for it. Check the GPU's throttle reasons (`nvidia-smi -q -d PERFORMANCE`; gpulse's \
`throttling` finding and nvidia.gpu.throttle): power cap, thermal slowdown (airflow, a failed fan) \
or an application-clock setting. Fix the cooling or power limit, or move the rank to another GPU; \
a persistently slow GPU may need an RMA.";

const GPU_SHARED_ADVICE: &str = "Another process shares this rank's GPU, so this rank computes \
slower and every rank waits for it. Give each rank a GPU of its own: stop the other process, set \
CUDA_VISIBLE_DEVICES/LOCAL_RANK so ranks do not land on the same GPU, or ask the scheduler for \
exclusive GPUs (Kubernetes: whole nvidia.com/gpu, not time-slicing or MPS).";

const HOST_CPU_ADVICE: &str = "This rank's processes use their whole CPU quota, so its host \
side (Python, DataLoader workers, kernel launches) is throttled and every rank waits for it. \
Raise the container's CPU limit to match the other ranks' needs, or lower num_workers so the \
workers do not starve the training process.";

const COMPUTE_ADVICE: &str = "This rank computes longer than the others and they wait for it, \
though its loader, GPU clocks, GPU sharing and CPU quota look like the others'. Look for uneven \
work: shards of different sizes, variable sequence lengths (bucket by length, pad to a fixed \
size), rank-specific work (logging, evaluation, checkpointing on rank 0: move it off the step or \
spread it), or a GPU model that differs from the others'.";

/// One finding per job whose slowest rank holds the others back.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &RankStraggler) -> Vec<Finding> {
    let mut out = Vec::new();
    for (job, ranks) in jobs(inputs, t.min_steps, t.min_duration) {
        let Some((index, excess, others_busy, others_wait)) = straggler(&ranks, t) else {
            continue;
        };
        let slow = &ranks[index];
        let others: Vec<&Rank<'_>> = ranks
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, r)| r)
            .collect();
        let device = match slow.processes.as_slice() {
            [only] => Some(process_device_ref(only)),
            _ => None,
        };
        let subject = inputs.workload_subject(slow.pid, device);
        let mut values = vec![
            ("cause".to_string(), Value::from("compute")),
            ("rank".to_string(), Value::from(slow.identity.rank)),
            ("job_id".to_string(), Value::from(job)),
            (
                "ranks_compared".to_string(),
                Value::from(ranks.len() as u64),
            ),
            ("excess_seconds".to_string(), Value::from(excess)),
            (
                "excess_ratio".to_string(),
                Value::from(ratio(excess, others_busy)),
            ),
            ("busy_seconds".to_string(), Value::from(slow.busy)),
            ("others_busy_seconds".to_string(), Value::from(others_busy)),
            (
                "step_seconds".to_string(),
                Value::from(slow.steps.step_seconds_mean),
            ),
            (
                "others_collective_wait_ratio".to_string(),
                Value::from(others_wait),
            ),
            (
                "collective_wait_ratio".to_string(),
                Value::from(slow.steps.collective_wait_ratio().unwrap_or_default()),
            ),
            ("steps".to_string(), Value::from(slow.steps.steps as u64)),
        ];
        let mut evidence = vec![Layer::Spans];
        let (cause, why, advice) =
            cause(inputs, t, slow, &others, excess, &mut values, &mut evidence);
        values[0].1 = Value::from(cause);
        let summary = format!(
            "rank {} of job {job} ({subject}) is a straggler: {:.0} ms more per step outside \
             collectives than the other {} ranks ({} more), which spend {} of each step waiting \
             for it; {why}",
            slow.identity.rank,
            excess * 1e3,
            others.len(),
            pct(ratio(excess, others_busy)),
            pct(others_wait),
        );
        out.push(Finding {
            rule: RuleId::RankStraggler,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: advice.to_string(),
            values,
            since: inputs.window.start,
            evidence,
        });
    }
    out
}

fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

/// The first cause that fits, its one-line explanation and advice; adds its figures to `values`.
fn cause(
    inputs: &Inputs<'_>,
    t: &RankStraggler,
    slow: &Rank<'_>,
    others: &[&Rank<'_>],
    excess: f64,
    values: &mut Vec<(String, Value)>,
    evidence: &mut Vec<Layer>,
) -> (&'static str, String, &'static str) {
    let data_wait = slow.steps.data_wait_seconds_mean;
    let others_data_wait = median(
        others
            .iter()
            .map(|r| r.steps.data_wait_seconds_mean)
            .collect(),
    );
    values.push(("data_wait_seconds".to_string(), Value::from(data_wait)));
    values.push((
        "others_data_wait_seconds".to_string(),
        Value::from(others_data_wait),
    ));
    if data_wait - others_data_wait >= t.data_wait_share_of_excess * excess {
        return (
            "data_wait",
            format!(
                "it waits {:.0} ms per step on its DataLoader against {:.0} ms on the others",
                data_wait * 1e3,
                others_data_wait * 1e3
            ),
            DATA_WAIT_ADVICE,
        );
    }
    evidence.push(Layer::Nvml);
    let clock = |r: &Rank<'_>| -> Option<f64> {
        let devices: Vec<f64> = r
            .processes
            .iter()
            .filter_map(|p| inputs.device(&p.device_uuid)?.gauge(DeviceField::SmClock))
            .map(|g| g.mean)
            .collect();
        (!devices.is_empty()).then(|| devices.iter().copied().fold(f64::INFINITY, f64::min))
    };
    let others_clocks: Vec<f64> = others.iter().filter_map(|r| clock(r)).collect();
    if let (Some(own), false) = (clock(slow), others_clocks.is_empty()) {
        let others_clock = median(others_clocks);
        values.push(("sm_clock_mhz".to_string(), Value::from(own)));
        values.push(("others_sm_clock_mhz".to_string(), Value::from(others_clock)));
        if own < t.sm_clock_ratio_below * others_clock {
            return (
                "gpu_clocks",
                format!(
                    "its GPU's SM clock averages {own:.0} MHz against {others_clock:.0} MHz on the others'"
                ),
                GPU_CLOCKS_ADVICE,
            );
        }
    }
    let job_pids: Vec<u32> = others.iter().map(|r| r.pid).chain([slow.pid]).collect();
    let mut sharing: Vec<u32> = inputs
        .window
        .processes
        .iter()
        .filter(|p| {
            !job_pids.contains(&p.pid)
                && slow
                    .processes
                    .iter()
                    .any(|own| own.device_uuid == p.device_uuid)
        })
        .map(|p| p.pid)
        .collect();
    sharing.sort_unstable();
    sharing.dedup();
    if !sharing.is_empty() {
        let list: Vec<String> = sharing.iter().map(u32::to_string).collect();
        values.push(("sharing_pids".to_string(), Value::from(list.join(","))));
        return (
            "gpu_shared",
            format!("its GPU is shared with pid {}", list.join(", ")),
            GPU_SHARED_ADVICE,
        );
    }
    let quota = inputs
        .framework
        .process(slow.pid)
        .and_then(|f| f.cpu_quota_cores);
    let tree_cpu = inputs
        .usage
        .get(&slow.pid)
        .and_then(|u| u.tree_cpu_utilization);
    if let (Some(quota), Some(cpu)) = (quota, tree_cpu) {
        evidence.push(Layer::Procfs);
        values.push(("cpu_quota_cores".to_string(), Value::from(quota)));
        values.push(("tree_cpu_cores".to_string(), Value::from(cpu)));
        if cpu >= t.cpu_quota_used_at_least * quota {
            return (
                "host_cpu",
                format!("its processes use {cpu:.1} of the {quota:.1} CPUs its cgroup may use"),
                HOST_CPU_ADVICE,
            );
        }
    }
    (
        "compute",
        "its loader, GPU clocks, GPU sharing and CPU quota look like the others': it has more work"
            .to_string(),
        COMPUTE_ADVICE,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::diagnosis::framework::ProcessEvidence;
    use crate::diagnosis::rules::testkit::*;

    /// A rank's evidence: step, collective wait and data wait means in seconds.
    pub(crate) fn rank_evidence(
        rank: u32,
        job: &str,
        step: f64,
        wait: f64,
        data_wait: f64,
    ) -> ProcessEvidence {
        ProcessEvidence {
            steps: Some(StepEvidence {
                data_wait_ratio: data_wait / step,
                steps: 50,
                observed_seconds: 60.0,
                step_seconds_mean: step,
                data_wait_seconds_mean: data_wait,
                collective_wait_seconds_mean: Some(wait),
                heard_seconds: 120.0,
                newest_end: None,
            }),
            distributed: Some(DistributedIdentity {
                rank,
                local_rank: Some(rank),
                world_size: Some(4),
                backend: Some("nccl".into()),
                job_id: Some(job.into()),
            }),
            ..Default::default()
        }
    }

    /// Four ranks of job "j" on GPUs 0..3 (pids 100..103); rank `slow` spends `extra` seconds
    /// more per step in `extra_data_wait` of data wait, the others wait that long in collectives.
    pub(crate) fn job(slow: Option<u32>, extra: f64, extra_data_wait: f64) -> Fixture {
        let devices = (0..4).map(|i| device(i, 0.6, 20 * GIB)).collect();
        let processes = (0..4)
            .map(|i| process(100 + i, i, 20 * GIB, None))
            .collect();
        let mut f = Fixture::new(vec![window(60, devices, processes)]);
        for r in 0..4u32 {
            let evidence = if Some(r) == slow {
                rank_evidence(r, "j", 0.3 + extra, 0.01, 0.02 + extra_data_wait)
            } else if slow.is_some() {
                rank_evidence(r, "j", 0.3 + extra, 0.01 + extra, 0.02)
            } else {
                rank_evidence(r, "j", 0.3, 0.01, 0.02)
            };
            f.framework.processes.insert(100 + r, evidence);
        }
        f
    }

    #[test]
    fn a_rank_slowed_by_its_loader_is_named_with_cause_data_wait() {
        let f = job(Some(2), 0.2, 0.2);
        let found = evaluate(&f.inputs(), &RankStraggler::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let finding = &found[0];
        assert_eq!(finding.subject.pid(), Some(102));
        assert_eq!(finding.value("rank"), Some(&Value::Int(2)));
        assert_eq!(finding.value("cause"), Some(&Value::from("data_wait")));
        assert_eq!(finding.value("job_id"), Some(&Value::from("j")));
        let Some(Value::Float(excess)) = finding.value("excess_seconds") else {
            panic!("{finding:#?}")
        };
        assert!((excess - 0.2).abs() < 1e-9);
        assert!(
            finding.summary.contains("rank 2 of job j"),
            "{}",
            finding.summary
        );
        assert!(finding.advice.contains("DataLoader"));
        assert_eq!(finding.evidence, vec![Layer::Spans]);
    }

    #[test]
    fn even_ranks_give_no_finding() {
        let f = job(None, 0.0, 0.0);
        assert!(evaluate(&f.inputs(), &RankStraggler::default()).is_empty());
        // Jitter below the margin is not a straggler either.
        let f = job(Some(1), 0.03, 0.03);
        assert!(evaluate(&f.inputs(), &RankStraggler::default()).is_empty());
    }

    #[test]
    fn a_rank_on_a_slower_gpu_is_gpu_clocks() {
        let mut f = job(Some(3), 0.2, 0.0);
        let slow = f
            .window
            .devices
            .iter_mut()
            .find(|d| d.info.index == 3)
            .unwrap();
        slow.fields
            .set_gauge(DeviceField::SmClock, Some(gauge(1400.0)));
        let found = evaluate(&f.inputs(), &RankStraggler::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].value("cause"), Some(&Value::from("gpu_clocks")));
        assert_eq!(found[0].value("sm_clock_mhz"), Some(&Value::Float(1400.0)));
        assert_eq!(
            found[0].value("others_sm_clock_mhz"),
            Some(&Value::Float(1980.0))
        );
    }

    #[test]
    fn a_rank_sharing_its_gpu_is_gpu_shared_and_a_full_quota_host_cpu() {
        let mut f = job(Some(1), 0.2, 0.0);
        f.window.processes.push(process(555, 1, 4 * GIB, None));
        let found = evaluate(&f.inputs(), &RankStraggler::default());
        assert_eq!(found[0].value("cause"), Some(&Value::from("gpu_shared")));
        assert_eq!(found[0].value("sharing_pids"), Some(&Value::from("555")));

        let mut f = job(Some(1), 0.2, 0.0).cpu(101, 1.0, 3.9);
        f.framework.processes.get_mut(&101).unwrap().cpu_quota_cores = Some(4.0);
        let found = evaluate(&f.inputs(), &RankStraggler::default());
        assert_eq!(found[0].value("cause"), Some(&Value::from("host_cpu")));
        assert!(found[0].evidence.contains(&Layer::Procfs));

        let f = job(Some(1), 0.2, 0.0).cpu(101, 1.0, 1.0);
        let found = evaluate(&f.inputs(), &RankStraggler::default());
        assert_eq!(found[0].value("cause"), Some(&Value::from("compute")));
    }

    #[test]
    fn ranks_of_different_jobs_are_never_compared() {
        let mut f = job(Some(2), 0.2, 0.2);
        // Ranks 2 and 3 belong to another job: each job now has two ranks, neither slower.
        for (pid, rank) in [(102, 0), (103, 1)] {
            let other = rank_evidence(rank, "k", 0.5, 0.01, 0.22);
            f.framework.processes.insert(pid, other);
        }
        assert!(evaluate(&f.inputs(), &RankStraggler::default()).is_empty());
    }

    #[test]
    fn too_short_a_history_gives_no_finding() {
        let f = job(Some(2), 0.2, 0.2);
        let t = RankStraggler {
            min_duration: Duration::from_secs(600),
            ..Default::default()
        };
        assert!(evaluate(&f.inputs(), &t).is_empty());
        let t = RankStraggler {
            min_steps: 100,
            ..Default::default()
        };
        assert!(evaluate(&f.inputs(), &t).is_empty());
    }

    #[test]
    fn thresholds_validate() {
        assert!(RankStraggler::default().validate().is_ok());
        let bad = RankStraggler {
            others_wait_ratio_at_least: 1.5,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
