//! `collective_stall`: a distributed job that looks stuck, read from its GPUs alone. When one
//! rank never reaches a collective (a deadlocked data loader, a rank stuck in I/O, a dead
//! process), every other rank waits inside it, and their GPUs say so long before PyTorch's
//! process-group watchdog fires (10 to 30 minutes):
//!
//! - **NCCL's spin**: the collective's kernel polls for its peers, so the device reads busy
//!   (utilisation near 100 %) while doing no work: SM activity (GPM) near zero and power near
//!   idle (NVIDIA/nccl#968: "util 100 % but power ~70 W");
//! - **gloo's wait**: the ranks wait on the CPU, so their GPUs sit at 0 % with the job's memory
//!   still held.
//!
//! The job is the processes that share a job id (`gpulse.job.id`: torchrun's run id, SLURM's
//! job, the companion's `pytorch.distributed.job.id`), two at least. Every (process, device) of
//! the job must have shown the same signature for `min_duration`, window after window in the
//! history; one GPU that works or one recent step span (a job that is merely communication
//! heavy still finishes steps) is no stall. Which rank holds the others cannot be seen from the
//! devices: the advice names the way to find it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::config::thresholds::CollectiveStall;
use crate::diagnosis::findings::{
    human_bytes, human_duration, pct, DeviceRef, Finding, JobKey, Layer, RuleId, Severity, Subject,
    Value,
};
use crate::diagnosis::history::{Series, WindowSummary};

use super::{process_device_ref_in, Inputs};

const ADVICE: &str = "One rank has most likely not reached the collective the others wait in \
(a hung data loader, a rank stuck in I/O or a lock, a dead process), and PyTorch's watchdog \
will only abort the job after its timeout. To name the rank: send the job's telemetry through \
gpulse with the PyTorch companion (otel-torch-train), or dump every rank's Python stack with \
`py-spy dump --pid PID` for each PID listed and look for the one that is not inside \
all_reduce/barrier/broadcast. Then fix or restart it; the others cannot go on without it.";

/// What the job's GPUs show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signature {
    /// Busy at near-idle power with no SM activity: NCCL polling for peers.
    NcclSpin,
    /// Idle with the job's memory held: ranks waiting on the CPU (gloo).
    IdleWithMemory,
}

impl Signature {
    fn as_str(self) -> &'static str {
        match self {
            Signature::NcclSpin => "nccl_spin",
            Signature::IdleWithMemory => "idle_with_memory",
        }
    }

    /// The signature one window of one (process, device) shows, if any.
    fn of(summary: &WindowSummary, t: &CollectiveStall) -> Option<Signature> {
        let util = summary.device_utilization_mean?;
        let spin = util >= t.spin_utilization_at_least
            && summary
                .device_sm_activity_mean
                .is_some_and(|sm| sm <= t.spin_sm_activity_at_most)
            && summary
                .device_power_ratio_mean
                .is_some_and(|p| p <= t.spin_power_ratio_at_most);
        if spin {
            return Some(Signature::NcclSpin);
        }
        let held = summary
            .gpu_memory_last_bytes
            .is_some_and(|b| b > t.min_gpu_memory_bytes);
        (util <= t.idle_utilization_at_most && held).then_some(Signature::IdleWithMemory)
    }
}

/// How long the newest windows of a series have shown one signature.
#[derive(Debug, Clone, Copy)]
struct Stalled {
    signature: Signature,
    since: SystemTime,
    seconds: f64,
    latest: WindowSummary,
}

fn stalled(series: &Series, t: &CollectiveStall) -> Option<Stalled> {
    let mut newest_first = series.summaries().rev();
    let latest = newest_first.next()?;
    let signature = Signature::of(&latest, t)?;
    // A series holds one summary per window its process was listed in, without gaps (the
    // history drops a series its process left), so the run is the newest summaries alike.
    let since = newest_first
        .take_while(|summary| Signature::of(summary, t) == Some(signature))
        .last()
        .map_or(latest.start, |oldest| oldest.start);
    let seconds = latest
        .end
        .duration_since(since)
        .unwrap_or_default()
        .as_secs_f64();
    Some(Stalled {
        signature,
        since,
        seconds,
        latest,
    })
}

/// One finding per job whose every GPU has shown one stall signature for `min_duration`.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &CollectiveStall) -> Vec<Finding> {
    let mut jobs: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (pid, workload) in inputs.workloads {
        if let Some(job) = workload.job_id.as_deref() {
            jobs.entry(job).or_default().push(*pid);
        }
    }
    let mut out = Vec::new();
    for (job, mut pids) in jobs {
        pids.sort_unstable();
        if pids.len() < 2 || steps_recently(inputs, &pids, t) {
            continue;
        }
        let rows: Vec<_> = inputs
            .window
            .processes
            .iter()
            .filter(|p| pids.binary_search(&p.pid).is_ok())
            .collect();
        // Every process of the job must be on a GPU in this window (one that holds none is
        // not waiting in a GPU collective), and every one of its GPUs must be stalled alike.
        if pids.iter().any(|pid| !rows.iter().any(|p| p.pid == *pid)) {
            continue;
        }
        let stalls: Option<Vec<(DeviceRef, Stalled)>> = rows
            .iter()
            .map(|p| {
                let series = inputs.history.series(p.pid, &p.device_uuid)?;
                Some((
                    process_device_ref_in(inputs.window, p),
                    stalled(&series, t)?,
                ))
            })
            .collect();
        let Some(stalls) = stalls else { continue };
        let signature = stalls[0].1.signature;
        if stalls.iter().any(|(_, s)| s.signature != signature) {
            continue;
        }
        let seconds = stalls
            .iter()
            .map(|(_, s)| s.seconds)
            .fold(f64::MAX, f64::min);
        if seconds < t.min_duration.as_secs_f64() {
            continue;
        }
        out.push(finding(inputs, job, pids, &stalls, signature, seconds));
    }
    out
}

/// Whether a process of the job sent a step span that ended within `min_duration`: the job
/// advances, however slowly.
fn steps_recently(inputs: &Inputs<'_>, pids: &[u32], t: &CollectiveStall) -> bool {
    let Some(recent) = inputs.window.end.checked_sub(t.min_duration) else {
        return false;
    };
    pids.iter().any(|pid| {
        inputs
            .framework
            .process(*pid)
            .and_then(|p| p.steps.as_ref())
            .and_then(|steps| steps.newest_end)
            .is_some_and(|end| end >= recent)
    })
}

fn finding(
    inputs: &Inputs<'_>,
    job: &str,
    pids: Vec<u32>,
    stalls: &[(DeviceRef, Stalled)],
    signature: Signature,
    seconds: f64,
) -> Finding {
    let mean = |f: fn(&WindowSummary) -> Option<f64>| {
        let values: Vec<f64> = stalls.iter().filter_map(|(_, s)| f(&s.latest)).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let utilization = mean(|s| s.device_utilization_mean).unwrap_or(0.0);
    let mut devices: Vec<DeviceRef> = stalls.iter().map(|(d, _)| d.clone()).collect();
    devices.sort_by_key(|d| d.index);
    devices.dedup_by_key(|d| d.index);
    let subject = Subject::Job {
        key: JobKey::Distributed(job.to_string()),
        pids: pids.clone(),
        devices: devices.clone(),
    };
    let gpus = devices.len();
    let summary = match signature {
        Signature::NcclSpin => format!(
            "{subject} looks stuck in a collective: its {gpus} GPUs read {} utilisation at {} of \
             their power limit with {} SM activity for {} (NCCL waiting for a rank that does not \
             come)",
            pct(utilization),
            pct(mean(|s| s.device_power_ratio_mean).unwrap_or(0.0)),
            pct(mean(|s| s.device_sm_activity_mean).unwrap_or(0.0)),
            human_duration(seconds),
        ),
        Signature::IdleWithMemory => format!(
            "{subject} looks stuck: its {gpus} GPUs have been idle ({}) for {} while its {} \
             processes hold {} (ranks waiting in a collective, or for a rank that is stuck \
             outside one)",
            pct(utilization),
            human_duration(seconds),
            pids.len(),
            human_bytes(
                stalls
                    .iter()
                    .filter_map(|(_, s)| s.latest.gpu_memory_last_bytes)
                    .sum::<u64>() as f64
            ),
        ),
    };
    let mut values = vec![
        ("cause".to_string(), Value::from(signature.as_str())),
        ("stalled_seconds".to_string(), Value::from(seconds)),
        ("gpu_count".to_string(), Value::from(gpus as u64)),
        ("process_count".to_string(), Value::from(pids.len() as u64)),
        ("utilization_ratio".to_string(), Value::from(utilization)),
    ];
    if let Some(power) = mean(|s| s.device_power_ratio_mean) {
        values.push(("power_limit_ratio".to_string(), Value::from(power)));
    }
    if let Some(sm) = mean(|s| s.device_sm_activity_mean) {
        values.push(("sm_activity_ratio".to_string(), Value::from(sm)));
    }
    let since = stalls
        .iter()
        .map(|(_, s)| s.since)
        .max()
        .unwrap_or(inputs.window.start);
    Finding {
        rule: RuleId::CollectiveStall,
        related: Vec::new(),
        severity: Severity::Error,
        subject,
        summary,
        advice: ADVICE.to_string(),
        values,
        since,
        evidence: vec![Layer::Nvml, Layer::Procfs],
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::attribution::Workload;
    use crate::diagnosis::framework::{ProcessEvidence, StepEvidence};
    use crate::diagnosis::rules::testkit::*;
    use crate::schema::{DeviceField, GpmField};

    /// What each of the job's two GPUs reads in a window.
    #[derive(Clone, Copy)]
    struct Reads {
        util: f64,
        sm: f64,
        power_w: f64,
    }

    const SPIN: Reads = Reads {
        util: 1.0,
        sm: 0.01,
        power_w: 90.0,
    };
    const IDLE: Reads = Reads {
        util: 0.0,
        sm: 0.0,
        power_w: 70.0,
    };
    const WORKING: Reads = Reads {
        util: 0.97,
        sm: 0.7,
        power_w: 550.0,
    };

    /// One-minute windows, one per entry of `minutes`, of ranks 10 and 11 of job `run-7` on
    /// GPUs 0 and 1 (8 GiB each) and of PID 12, in no job, on GPU 2.
    fn job(minutes: &[[Reads; 2]]) -> Fixture {
        let windows = minutes
            .iter()
            .enumerate()
            .map(|(i, reads)| {
                let mut devices: Vec<_> = reads
                    .iter()
                    .enumerate()
                    .map(|(index, r)| {
                        let mut d = device(index as u32, r.util, 10 * GIB);
                        d.gpm.set(GpmField::SmActivity, Some(gauge(r.sm)));
                        d.fields
                            .set_gauge(DeviceField::Power, Some(gauge(r.power_w)));
                        d
                    })
                    .collect();
                devices.push(device(2, 0.0, 10 * GIB));
                window(
                    (i as u64 + 1) * 60,
                    devices,
                    vec![
                        process(10, 0, 8 * GIB, None),
                        process(11, 1, 8 * GIB, None),
                        process(12, 2, 8 * GIB, None),
                    ],
                )
            })
            .collect();
        let mut f = Fixture::new(windows);
        for pid in [10, 11] {
            f.workloads.insert(
                pid,
                Workload {
                    job_id: Some("run-7".into()),
                    ..Workload::unresolved(pid)
                },
            );
        }
        f.workloads.insert(12, Workload::unresolved(12));
        f
    }

    #[test]
    fn every_gpu_spinning_past_min_duration_is_a_stall_of_the_job() {
        let found = evaluate(
            &job(&[[WORKING; 2], [SPIN; 2], [SPIN; 2]]).inputs(),
            &Default::default(),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        let f = &found[0];
        assert_eq!(
            (f.rule, f.severity),
            (RuleId::CollectiveStall, Severity::Error)
        );
        let Subject::Job { key, pids, devices } = &f.subject else {
            panic!("not a job: {:?}", f.subject);
        };
        assert_eq!(key, &JobKey::Distributed("run-7".into()));
        assert_eq!(
            pids,
            &vec![10, 11],
            "the process outside the job is not in it"
        );
        assert_eq!(devices.len(), 2);
        assert_eq!(f.value("cause"), Some(&Value::from("nccl_spin")));
        assert_eq!(f.value("stalled_seconds"), Some(&Value::from(120.0)));
        assert!(
            f.summary.contains("looks stuck in a collective"),
            "{}",
            f.summary
        );
        assert!(f.advice.contains("py-spy dump") && f.advice.contains("companion"));
        assert_eq!(f.since, t(60), "since the first spinning window began");
    }

    #[test]
    fn every_gpu_idle_with_memory_held_is_a_stall_too() {
        let found = evaluate(&job(&[[IDLE; 2], [IDLE; 2]]).inputs(), &Default::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(
            found[0].value("cause"),
            Some(&Value::from("idle_with_memory"))
        );
        assert!(
            found[0].summary.contains("16.0 GiB"),
            "{}",
            found[0].summary
        );
    }

    #[test]
    fn one_working_gpu_a_short_stall_mixed_signatures_or_a_recent_step_is_no_stall() {
        let limits = CollectiveStall::default();
        for (what, minutes) in [
            ("one GPU works", vec![[SPIN, WORKING], [SPIN, WORKING]]),
            ("one spins, one idles", vec![[SPIN, IDLE], [SPIN, IDLE]]),
            (
                "busy and drawing power",
                vec![
                    [Reads {
                        power_w: 600.0,
                        ..SPIN
                    }; 2];
                    3
                ],
            ),
        ] {
            assert!(
                evaluate(&job(&minutes).inputs(), &limits).is_empty(),
                "{what}"
            );
        }
        // One spinning minute, under a 90 s bound.
        let ninety = CollectiveStall {
            min_duration: Duration::from_secs(90),
            ..CollectiveStall::default()
        };
        let short = job(&[[WORKING; 2], [SPIN; 2]]);
        assert!(
            evaluate(&short.inputs(), &ninety).is_empty(),
            "under min_duration"
        );
        assert_eq!(
            evaluate(&short.inputs(), &limits).len(),
            1,
            "at min_duration"
        );
        // Without GPM, a busy GPU cannot be told from one that works.
        let mut f = job(&[[SPIN; 2], [SPIN; 2]]);
        let windows: Vec<_> = (1..=2)
            .map(|i| {
                let mut w = f.window.clone();
                for d in &mut w.devices {
                    d.gpm = Default::default();
                }
                w.start = t(i * 60 - 60);
                w.end = t(i * 60);
                w
            })
            .collect();
        let workloads = f.workloads.clone();
        f = Fixture::new(windows);
        f.workloads = workloads;
        assert!(evaluate(&f.inputs(), &limits).is_empty(), "no GPM");

        // A step that ended within min_duration: the job advances.
        let mut f = job(&[[SPIN; 2], [SPIN; 2]]);
        f.framework.processes.insert(
            10,
            ProcessEvidence {
                steps: Some(StepEvidence {
                    newest_end: Some(t(120) - Duration::from_secs(20)),
                    ..StepEvidence::default()
                }),
                ..ProcessEvidence::default()
            },
        );
        assert!(evaluate(&f.inputs(), &limits).is_empty(), "a recent step");
        // One that ended before the stall began is no evidence of progress.
        f.framework.processes.get_mut(&10).unwrap().steps = Some(StepEvidence {
            newest_end: Some(t(50)),
            ..StepEvidence::default()
        });
        assert_eq!(evaluate(&f.inputs(), &limits).len(), 1, "an old step");
    }

    #[test]
    fn a_lone_process_is_no_job() {
        let mut f = job(&[[IDLE; 2], [IDLE; 2]]);
        f.workloads.get_mut(&11).unwrap().job_id = Some("other".into());
        assert!(evaluate(&f.inputs(), &Default::default()).is_empty());
    }
}
