//! `distributed_hang`: a job none of whose ranks on this node has finished a step for longer
//! than a bound, while ranks wait inside a collective; the finding is raised on the rank that
//! holds the others. `long_phase_wait`: the same wait, for a rank in a phase known to take long
//! (a checkpoint), until `checkpoint_max`.
//!
//! The ranks of a job are the processes on this node with the same `pytorch.distributed.job.id`
//! (as in `rank_straggler`). The bound is the larger of `min_stall` and `median_steps` times the
//! job's median step. Where each rank is comes from the companion's live states (`live`): a rank
//! is *waiting* (a collective in flight), *busy* (in a phase, outside any collective) or *silent*
//! (no live state within `live_fresh_for`). The rank that holds the others, first match wins:
//! - `exited`: a rank of the job whose process left since the job last made progress;
//! - `phase`: a rank busy outside any collective while others wait;
//! - `earlier_collective`: a waiting rank in a collective of an earlier step than the others', or
//!   of another operation in the same step (ranks that called different collectives). Collective
//!   numbers are each process's own count and are not compared across ranks: a rank may have
//!   issued collectives the others did not (at start-up);
//! - `silent`: a rank that stopped saying where it is while others wait (frozen, or stopped);
//! - `remote`: every rank here waits in the same collective and the job has ranks on other
//!   nodes: the culprit is among them (raised on the lowest rank here, naming the missing ranks);
//! - `all_waiting`: every rank of the job is here and waits in the same collective: a
//!   communication failure rather than a rank (raised on the lowest rank).
//!
//! Nothing is raised unless at least one rank waits in a collective: a job whose loop is outside
//! its steps (evaluation) has no rank waiting, and a job that ends has no ranks left.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::config::thresholds::DistributedHang;
use crate::diagnosis::findings::{
    human_duration, Finding, Layer, RelatedEvidence, RuleId, Severity, Value,
};
use crate::diagnosis::framework::{DistributedIdentity, ProcessEvidence};
use crate::diagnosis::live::{DepartedRank, InFlight};
use crate::sampling::ProcessWindow;

use super::rank_straggler::median;
use super::{process_device_ref, Inputs};

/// One rank of a job on this node.
struct LocalRank<'a> {
    pid: u32,
    identity: &'a DistributedIdentity,
    evidence: &'a ProcessEvidence,
    processes: Vec<&'a ProcessWindow>,
}

/// Where a rank is, from its newest fresh live state.
#[derive(Debug, Clone, Copy)]
enum Place<'a> {
    Waiting(&'a InFlight),
    Busy,
    Silent,
}

fn place<'a>(evidence: &'a ProcessEvidence, now: SystemTime, t: &DistributedHang) -> Place<'a> {
    let fresh = evidence.live.as_ref().filter(|live| {
        now.duration_since(live.at)
            .map_or(true, |age| age <= t.live_fresh_for)
    });
    match fresh {
        Some(live) => match &live.collective {
            Some(collective) => Place::Waiting(collective),
            None => Place::Busy,
        },
        None => Place::Silent,
    }
}

/// The rank that holds the others, and why.
enum Culprit<'a> {
    Exited(&'a DepartedRank),
    Local {
        rank: &'a LocalRank<'a>,
        cause: &'static str,
    },
    /// Not on this node (`remote`), or no rank at all (`all_waiting`): raised on the lowest
    /// rank here.
    Nobody {
        cause: &'static str,
    },
}

pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &DistributedHang) -> Vec<Finding> {
    let now = inputs.window.end;
    let mut out = Vec::new();
    for (job, ranks) in jobs(inputs) {
        if let Some(finding) = evaluate_job(inputs, t, job, &ranks, now) {
            out.push(finding);
        }
    }
    out
}

fn jobs<'a>(inputs: &Inputs<'a>) -> BTreeMap<&'a str, Vec<LocalRank<'a>>> {
    let mut jobs: BTreeMap<&'a str, Vec<LocalRank<'a>>> = BTreeMap::new();
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
        jobs.entry(job).or_default().push(LocalRank {
            pid,
            identity,
            evidence,
            processes: processes.to_vec(),
        });
    }
    for ranks in jobs.values_mut() {
        ranks.sort_by_key(|r| (r.identity.rank, r.pid));
    }
    jobs
}

fn evaluate_job(
    inputs: &Inputs<'_>,
    t: &DistributedHang,
    job: &str,
    ranks: &[LocalRank<'_>],
    now: SystemTime,
) -> Option<Finding> {
    let last_progress = ranks
        .iter()
        .filter_map(|r| r.evidence.last_step_end)
        .max()?;
    let median_step = {
        let medians: Vec<f64> = ranks
            .iter()
            .filter_map(|r| r.evidence.step_seconds_median)
            .collect();
        (!medians.is_empty()).then(|| median(medians))
    };
    let bound = t.bound(median_step);
    let stalled = now.duration_since(last_progress).ok()?;
    if stalled < bound {
        return None;
    }
    let places: Vec<Place<'_>> = ranks.iter().map(|r| place(r.evidence, now, t)).collect();
    let waiting: Vec<(&LocalRank<'_>, &InFlight)> = ranks
        .iter()
        .zip(&places)
        .filter_map(|(r, p)| match p {
            Place::Waiting(c) => Some((r, *c)),
            _ => None,
        })
        .collect();
    // The collective the others wait in, as the rank that issued the most names it (its number
    // is that process's count).
    let (op, seq) = {
        let newest = waiting.iter().map(|(_, c)| c.seq).max()?;
        let op = waiting
            .iter()
            .find(|(_, c)| c.seq == newest)
            .map(|(_, c)| c.op.as_str())?;
        (op, newest)
    };
    let step_of = |r: &LocalRank<'_>| r.evidence.live.as_ref().and_then(|l| l.step);
    let newest_step = waiting.iter().filter_map(|(r, _)| step_of(r)).max();
    let local: Vec<u32> = ranks.iter().map(|r| r.identity.rank).collect();
    let departed: Vec<&DepartedRank> = inputs
        .framework
        .departed
        .iter()
        .filter(|d| d.identity.job_id.as_deref() == Some(job))
        .filter(|d| !local.contains(&d.identity.rank))
        .filter(|d| {
            last_progress
                .checked_sub(bound)
                .is_none_or(|from| d.left_at >= from)
        })
        .collect();
    // A rank that left counts once gone for `min_stall` while the others still wait: the ranks
    // of a job being stopped leave a second or two apart. Until then nothing is said of the job.
    if departed.iter().any(|d| {
        now.duration_since(d.left_at)
            .map_or(true, |gone| gone < t.min_stall)
    }) {
        return None;
    }
    let culprit = if let Some(d) = departed.first() {
        Culprit::Exited(d)
    } else if let Some((rank, _)) = ranks
        .iter()
        .zip(&places)
        .find(|(_, p)| matches!(p, Place::Busy))
    {
        Culprit::Local {
            rank,
            cause: "phase",
        }
    } else if let Some((rank, _)) = waiting.iter().find(|(r, c)| {
        // Steps compare across ranks; collective numbers need not (a rank may have issued
        // collectives the others did not, at start-up), so within a step only the operation does.
        let step = step_of(r);
        step.is_some() && (step < newest_step || (step == newest_step && c.op != op))
    }) {
        Culprit::Local {
            rank,
            cause: "earlier_collective",
        }
    } else if let Some((rank, _)) = ranks
        .iter()
        .zip(&places)
        .find(|(_, p)| matches!(p, Place::Silent))
    {
        Culprit::Local {
            rank,
            cause: "silent",
        }
    } else {
        let world = ranks.iter().filter_map(|r| r.identity.world_size).max();
        let cause = if world.is_some_and(|w| w as usize > ranks.len()) {
            "remote"
        } else {
            "all_waiting"
        };
        Culprit::Nobody { cause }
    };
    let waiting_ranks: Vec<u32> = waiting
        .iter()
        .filter(|(r, _)| !matches!(&culprit, Culprit::Local { rank, .. } if rank.pid == r.pid))
        .map(|(r, _)| r.identity.rank)
        .collect();
    let longest_wait = waiting
        .iter()
        .filter_map(|(_, c)| now.duration_since(c.since).ok())
        .max()
        .unwrap_or_default();
    Some(finding(
        inputs,
        t,
        Context {
            job,
            ranks,
            culprit,
            op,
            seq,
            waiting_ranks,
            stalled_seconds: stalled.as_secs_f64(),
            bound_seconds: bound.as_secs_f64(),
            wait_seconds: longest_wait.as_secs_f64(),
            since: last_progress,
            now,
        },
    ))
}

struct Context<'a> {
    job: &'a str,
    ranks: &'a [LocalRank<'a>],
    culprit: Culprit<'a>,
    op: &'a str,
    seq: u64,
    waiting_ranks: Vec<u32>,
    stalled_seconds: f64,
    bound_seconds: f64,
    wait_seconds: f64,
    since: SystemTime,
    now: SystemTime,
}

fn list(ranks: &[u32]) -> String {
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

const PHASE_ADVICE: &str = "This rank is busy outside any collective while every other rank waits \
for it: the job is stuck on it. Its stack (the finding's `stack` value, every thread) shows where. \
Common causes: a DataLoader worker that died or deadlocked, a read from slow or hung storage, \
rank-specific work (logging, evaluation, a checkpoint) that never ends, a GPU that fell off the \
bus (check XID and `nvidia-smi` on this rank's GPU). `py-spy dump --pid` on the process shows \
the same live. Restart the job from its last checkpoint once the cause is fixed; the others \
would otherwise wait until the process-group watchdog's timeout (TORCH_NCCL_TIMEOUT, default \
10 min) kills them.";

const EXITED_ADVICE: &str = "This rank's process exited while the other ranks wait for it in a \
collective: they will hang until the process-group watchdog's timeout kills them. Read the \
rank's own log for its exit (an exception, the OOM killer in `dmesg`, a signal), fix it and \
restart the job; run under torchrun (or your launcher) with fault tolerance so the job restarts \
when a rank dies.";

const EARLIER_ADVICE: &str = "This rank waits in a different collective from the others (an \
earlier one, or another operation): the ranks called collectives in different orders, a \
classic deadlock (a collective inside an `if rank == 0`, an uneven number of batches per rank \
without `join()`, different model code on one rank). Its stack shows the call; make every rank \
issue the same collectives in the same order (DistributedSampler with drop_last, DDP's \
`join()` context for uneven inputs).";

const SILENT_ADVICE: &str = "This rank stopped saying where it is while the others wait for it \
in a collective: it is frozen (a stopped process, a GIL held by native code, a blocking system \
call) or its companion's reporter is off. `py-spy dump --pid` (or `gdb -p`) on the process shows \
where it is; check its state in /proc/<pid>/status and its GPU's health.";

const REMOTE_ADVICE: &str = "Every rank of this job on this node waits in the same collective, \
and the job has ranks on other nodes: the rank that holds them is on another node. gpulse on \
that node names it (the same finding on its resource); without gpulse there, look for the rank \
that is not in this collective (`py-spy dump` on each, or PyTorch's Flight Recorder: \
TORCH_NCCL_TRACE_BUFFER_SIZE). Check that node's health and network first.";

const ALL_WAITING_ADVICE: &str = "Every rank of this job waits in the same collective and none is \
elsewhere: the collective itself does not complete. Suspect the communication layer: a failed \
NVLink or network link (check the interconnect counters and XIDs), an NCCL or gloo setting that \
differs between ranks, a firewall between ranks. NCCL_DEBUG=INFO and PyTorch's Flight Recorder \
(TORCH_NCCL_TRACE_BUFFER_SIZE) show the collective's state.";

const LONG_PHASE_ADVICE: &str = "A rank is in a phase known to take long (configured in \
`[diagnosis.distributed_hang] checkpoint_phases`) while the other ranks wait for it. This is \
not a hang until `checkpoint_max`; if it happens every time, write checkpoints asynchronously \
(torch.distributed.checkpoint.async_save) or from every rank's shard in parallel, so the others \
do not wait.";

fn finding(inputs: &Inputs<'_>, t: &DistributedHang, c: Context<'_>) -> Finding {
    let lowest = &c.ranks[0];
    let (pid, processes, rank, cause, live) = match &c.culprit {
        Culprit::Exited(d) => (
            d.pid,
            Vec::new(),
            d.identity.rank,
            "exited",
            d.last_live.as_ref(),
        ),
        Culprit::Local { rank, cause } => (
            rank.pid,
            rank.processes.clone(),
            rank.identity.rank,
            *cause,
            rank.evidence.live.as_ref(),
        ),
        Culprit::Nobody { cause } => (
            lowest.pid,
            lowest.processes.clone(),
            lowest.identity.rank,
            *cause,
            lowest.evidence.live.as_ref(),
        ),
    };
    let device = match processes.as_slice() {
        [only] => Some(process_device_ref(only)),
        _ => None,
    };
    let phase = live.and_then(|l| l.phase.as_deref());
    let phase_seconds = live
        .and_then(|l| l.phase_since)
        .and_then(|since| c.now.duration_since(since).ok())
        .map(|d| d.as_secs_f64());
    let long_phase = cause == "phase"
        && phase.is_some_and(|p| t.checkpoint_phases.iter().any(|known| known == p))
        && phase_seconds.is_some_and(|s| s < t.checkpoint_max.as_secs_f64());
    let world = c.ranks.iter().filter_map(|r| r.identity.world_size).max();
    let here: Vec<u32> = c.ranks.iter().map(|r| r.identity.rank).collect();
    let elsewhere: Vec<u32> = world
        .map(|w| (0..w).filter(|r| !here.contains(r)).collect())
        .unwrap_or_default();
    let mut values = vec![
        ("cause".to_string(), Value::from(cause)),
        ("rank".to_string(), Value::from(rank)),
        ("job_id".to_string(), Value::from(c.job)),
        (
            "stalled_seconds".to_string(),
            Value::from(c.stalled_seconds),
        ),
        ("bound_seconds".to_string(), Value::from(c.bound_seconds)),
        ("collective_op".to_string(), Value::from(c.op)),
        ("collective_seq".to_string(), Value::from(c.seq)),
        (
            "collective_wait_seconds".to_string(),
            Value::from(c.wait_seconds),
        ),
        (
            "waiting_ranks".to_string(),
            Value::from(list(&c.waiting_ranks)),
        ),
    ];
    if let Some(phase) = phase {
        values.push(("phase".to_string(), Value::from(phase)));
    }
    if let Some(seconds) = phase_seconds {
        values.push(("phase_seconds".to_string(), Value::from(seconds)));
    }
    if let Some(step) = live.and_then(|l| l.step) {
        values.push(("step".to_string(), Value::from(step)));
    }
    if !elsewhere.is_empty() {
        values.push(("ranks_elsewhere".to_string(), Value::from(list(&elsewhere))));
    }
    if let Some(stack) = live.and_then(|l| l.stack.as_deref()) {
        values.push(("stack".to_string(), Value::from(stack)));
    }
    let waiting = format!(
        "rank{} {} wait{} in {} #{} for {}",
        if c.waiting_ranks.len() == 1 { "" } else { "s" },
        list(&c.waiting_ranks),
        if c.waiting_ranks.len() == 1 { "s" } else { "" },
        c.op,
        c.seq,
        human_duration(c.wait_seconds),
    );
    let in_phase = match (phase, phase_seconds) {
        (Some(p), Some(s)) => format!("in phase {p} for {}", human_duration(s)),
        (Some(p), None) => format!("in phase {p}"),
        _ => "outside any phase it reported".to_string(),
    };
    let stalled = human_duration(c.stalled_seconds);
    let (summary, advice) = match cause {
        "exited" => (
            format!("job {} is stuck: rank {rank} (pid {pid}) exited, and no rank has finished a step for {stalled}; {waiting}", c.job),
            EXITED_ADVICE,
        ),
        "phase" if long_phase => (
            format!("job {}: rank {rank} is {in_phase} while {waiting}; no step for {stalled} (not a hang before {})", c.job, human_duration(t.checkpoint_max.as_secs_f64())),
            LONG_PHASE_ADVICE,
        ),
        "phase" => (
            format!("job {} is stuck on rank {rank}: it is {in_phase}, outside any collective, while {waiting}; no rank has finished a step for {stalled}", c.job),
            PHASE_ADVICE,
        ),
        "earlier_collective" => (
            format!("job {} is stuck on rank {rank}: it waits in a different collective from the others ({waiting}); no rank has finished a step for {stalled}", c.job),
            EARLIER_ADVICE,
        ),
        "silent" => (
            format!("job {} is stuck: rank {rank} stopped reporting where it is while {waiting}; no rank has finished a step for {stalled}", c.job),
            SILENT_ADVICE,
        ),
        "remote" => (
            format!("job {} is stuck: every rank on this node ({}) waits in {} #{} for {}; the rank that holds them is among ranks {} on other nodes", c.job, list(&here), c.op, c.seq, human_duration(c.wait_seconds), list(&elsewhere)),
            REMOTE_ADVICE,
        ),
        _ => (
            format!("job {} is stuck: all its ranks wait in {} #{} for {} and none is elsewhere; no step for {stalled}", c.job, c.op, c.seq, human_duration(c.wait_seconds)),
            ALL_WAITING_ADVICE,
        ),
    };
    let subject = inputs.workload_subject(pid, device);
    // The waiting ranks' stacks go with the finding, on their own resources.
    let related = c
        .ranks
        .iter()
        .filter(|r| r.pid != pid && c.waiting_ranks.contains(&r.identity.rank))
        .filter_map(|r| {
            Some(RelatedEvidence {
                pid: r.pid,
                rank: Some(r.identity.rank),
                stack: r.evidence.live.as_ref()?.stack.clone()?,
            })
        })
        .collect();
    Finding {
        rule: if long_phase {
            RuleId::LongPhaseWait
        } else {
            RuleId::DistributedHang
        },
        severity: if long_phase {
            Severity::Info
        } else {
            Severity::Critical
        },
        subject,
        summary,
        advice: advice.to_string(),
        values,
        related,
        since: c.since,
        evidence: match cause {
            // The process left NVML's list.
            "exited" => vec![Layer::Spans, Layer::Logs, Layer::Nvml],
            _ => vec![Layer::Spans, Layer::Logs],
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::diagnosis::live::LiveReport;
    use crate::diagnosis::rules::testkit::*;

    const NOW: u64 = 600;

    /// Four ranks of job "j" (pids 100..103 on GPUs 0..3, world size `world`) whose last step
    /// ended `stalled` seconds before the window's end, each with the live state `live(rank)`.
    fn job(stalled: u64, world: u32, live: impl Fn(u32) -> Option<LiveReport>) -> Fixture {
        let devices = (0..4).map(|i| device(i, 0.0, 20 * GIB)).collect();
        let processes = (0..4)
            .map(|i| process(100 + i, i, 20 * GIB, None))
            .collect();
        let mut f = Fixture::new(vec![window(NOW, devices, processes)]);
        for rank in 0..4u32 {
            f.framework.processes.insert(
                100 + rank,
                ProcessEvidence {
                    distributed: Some(DistributedIdentity {
                        rank,
                        local_rank: Some(rank),
                        world_size: Some(world),
                        backend: Some("gloo".into()),
                        job_id: Some("j".into()),
                    }),
                    live: live(rank),
                    last_step_end: Some(t(NOW - stalled)),
                    step_seconds_median: Some(0.5),
                    ..Default::default()
                },
            );
        }
        f
    }

    fn waiting(seq: u64) -> Option<LiveReport> {
        Some(LiveReport {
            at: t(NOW - 1),
            step: Some(30),
            phase: Some("backward".into()),
            phase_since: Some(t(NOW - 95)),
            collective: Some(InFlight {
                op: "all_reduce".into(),
                seq,
                since: t(NOW - 90),
            }),
            stack: Some("waiting stack".into()),
        })
    }

    fn busy(phase: &str, for_seconds: u64) -> Option<LiveReport> {
        Some(LiveReport {
            at: t(NOW - 1),
            step: Some(30),
            phase: Some(phase.into()),
            phase_since: Some(t(NOW - for_seconds)),
            collective: None,
            stack: Some("File \"train.py\", line 12, in main\n    time.sleep(600)".into()),
        })
    }

    fn one(f: &Fixture, t: &DistributedHang) -> Finding {
        let found = evaluate(&f.inputs(), t);
        assert_eq!(found.len(), 1, "{found:#?}");
        found.into_iter().next().unwrap()
    }

    #[test]
    fn the_rank_busy_outside_the_collective_the_others_wait_in_is_named_with_its_stack() {
        let f = job(100, 4, |r| {
            if r == 2 {
                busy("stuck", 98)
            } else {
                waiting(431)
            }
        });
        let finding = one(&f, &DistributedHang::default());
        assert_eq!(finding.rule, RuleId::DistributedHang);
        assert_eq!(finding.severity, Severity::Critical);
        assert_eq!(finding.subject.pid(), Some(102));
        assert_eq!(finding.value("cause"), Some(&Value::from("phase")));
        assert_eq!(finding.value("rank"), Some(&Value::from(2u32)));
        assert_eq!(finding.value("phase"), Some(&Value::from("stuck")));
        assert_eq!(finding.value("collective_seq"), Some(&Value::from(431u64)));
        assert_eq!(finding.value("waiting_ranks"), Some(&Value::from("0,1,3")));
        let Some(Value::Text(stack)) = finding.value("stack") else {
            panic!("{finding:#?}")
        };
        assert!(stack.contains("time.sleep(600)"));
        assert!(
            finding.summary.contains("stuck on rank 2"),
            "{}",
            finding.summary
        );
        assert_eq!(finding.since, t(NOW - 100));
    }

    #[test]
    fn within_the_bound_or_with_nobody_waiting_nothing_is_raised() {
        let t = DistributedHang::default();
        // 50 s without a step: under the default 60 s bound.
        let f = job(50, 4, |r| {
            if r == 2 {
                busy("stuck", 48)
            } else {
                waiting(431)
            }
        });
        assert!(evaluate(&f.inputs(), &t).is_empty());
        // The bound grows with the job's steps: 5 x 30 s steps = 150 s.
        let mut f = job(100, 4, |r| {
            if r == 2 {
                busy("stuck", 98)
            } else {
                waiting(431)
            }
        });
        for evidence in f.framework.processes.values_mut() {
            evidence.step_seconds_median = Some(30.0);
        }
        assert!(evaluate(&f.inputs(), &t).is_empty());
        // No rank in a collective (evaluation outside the steps): no hang.
        let f = job(100, 4, |_| busy("eval", 98));
        assert!(evaluate(&f.inputs(), &t).is_empty());
    }

    #[test]
    fn a_checkpoint_is_a_long_phase_wait_until_checkpoint_max() {
        let t = DistributedHang::default();
        let f = job(300, 4, |r| {
            if r == 0 {
                busy("checkpoint", 290)
            } else {
                waiting(12)
            }
        });
        let finding = one(&f, &t);
        assert_eq!(
            (finding.rule, finding.severity),
            (RuleId::LongPhaseWait, Severity::Info)
        );
        assert_eq!(finding.subject.pid(), Some(100));
        let f = job(590, 4, |r| {
            if r == 0 {
                busy("checkpoint", 580)
            } else {
                waiting(12)
            }
        });
        let short = DistributedHang {
            checkpoint_max: Duration::from_secs(300),
            ..t
        };
        assert_eq!(one(&f, &short).rule, RuleId::DistributedHang);
    }

    #[test]
    fn an_earlier_collective_a_silent_rank_and_an_exited_rank_are_named() {
        let hang = DistributedHang::default();
        // Rank 1 waits in a collective of step 29; the others, in step 30.
        let f = job(100, 4, |r| {
            let mut live = waiting(431);
            if r == 1 {
                live.as_mut().unwrap().step = Some(29);
            }
            live
        });
        let finding = one(&f, &hang);
        assert_eq!(finding.subject.pid(), Some(101));
        assert_eq!(
            finding.value("cause"),
            Some(&Value::from("earlier_collective"))
        );

        let f = job(100, 4, |r| if r == 3 { None } else { waiting(431) });
        let finding = one(&f, &hang);
        assert_eq!(finding.subject.pid(), Some(103));
        assert_eq!(finding.value("cause"), Some(&Value::from("silent")));

        // Rank 3's process left 95 s ago; ranks 0-2 wait for it.
        let mut f = job(100, 4, |_| waiting(431));
        let gone = f.framework.processes.remove(&103).unwrap();
        f.window.processes.retain(|p| p.pid != 103);
        f.framework.departed.push(DepartedRank {
            pid: 103,
            identity: gone.distributed.clone().unwrap(),
            left_at: t(NOW - 95),
            last_live: None,
        });
        let finding = one(&f, &hang);
        assert_eq!(finding.subject.pid(), Some(103));
        assert_eq!(finding.value("cause"), Some(&Value::from("exited")));
        assert_eq!(finding.value("waiting_ranks"), Some(&Value::from("0,1,2")));
        assert!(
            finding.summary.contains("rank 3 (pid 103) exited"),
            "{}",
            finding.summary
        );
    }

    #[test]
    fn every_rank_here_waiting_names_the_ranks_on_other_nodes() {
        let f = job(100, 8, |_| waiting(431));
        let finding = one(&f, &DistributedHang::default());
        assert_eq!(finding.value("cause"), Some(&Value::from("remote")));
        assert_eq!(finding.subject.pid(), Some(100));
        assert_eq!(
            finding.value("ranks_elsewhere"),
            Some(&Value::from("4,5,6,7"))
        );
        assert!(
            finding.summary.contains("among ranks 4,5,6,7"),
            "{}",
            finding.summary
        );
        let f = job(100, 4, |_| waiting(431));
        let finding = one(&f, &DistributedHang::default());
        assert_eq!(finding.value("cause"), Some(&Value::from("all_waiting")));
    }
}
