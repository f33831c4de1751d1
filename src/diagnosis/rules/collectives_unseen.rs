//! `collectives_unseen`: a rank of a distributed job whose steps carry no collective, so the
//! rank rules (`rank_straggler`, `collective_bound`, `distributed_hang`) cannot judge it. Most
//! often a DDP model the companion was not told about (`tel.watch_ddp(model)`), whose gradient
//! all-reduces run inside `backward()` where the companion's wrappers do not see them.
//!
//! Raised (info) on a process whose resource names a job of more than one rank
//! (`pytorch.distributed.world_size` ≥ 2) when its newest `min_steps` steps in a row carried no
//! collective, and its newest step is recent (the framework evidence's lookback). Gradient
//! accumulation leaves some steps without a collective; `min_steps` in a row is longer than any
//! accumulation.

use crate::config::thresholds::CollectivesUnseen;
use crate::diagnosis::findings::{Finding, Layer, RuleId, Severity, Value};

use super::{process_device_ref, Inputs};

const UNWATCHED_ADVICE: &str = "Its steps carry the companion's collective figures, but no \
collective: DDP's all-reduces run inside backward(), where the companion sees them only through \
its communication hook. Wrap the model once, before the first step: `model = \
tel.watch_ddp(DistributedDataParallel(model, ...))` (FSDP and other libraries: wrap their \
communication in `with tel.collective(\"all_gather\"):`). Without it gpulse cannot name a \
straggler or the rank that holds a hung job.";

const UNTIMED_ADVICE: &str = "Its steps carry no collective figures at all: the companion does \
not time collectives here (`TrainingTelemetry(collectives=False)`, torch.distributed not \
initialised when it was built, or another instrumentation). Build TrainingTelemetry after \
`init_process_group()` with collectives on (the default) and wrap a DDP model with \
`tel.watch_ddp(model)`. Without it gpulse cannot name a straggler or the rank that holds a \
hung job.";

pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &CollectivesUnseen) -> Vec<Finding> {
    let mut out = Vec::new();
    for (pid, processes) in inputs.processes_by_pid() {
        let Some(evidence) = inputs.framework.process(pid) else {
            continue;
        };
        let Some(identity) = evidence.distributed.as_ref() else {
            continue;
        };
        if identity.world_size.is_none_or(|w| w < 2)
            || evidence.steps.is_none()
            || evidence.steps_without_collectives < t.min_steps
        {
            continue;
        }
        let (how, advice) = if evidence.collectives_timed {
            ("the companion timed none", UNWATCHED_ADVICE)
        } else {
            ("they carry no collective figures", UNTIMED_ADVICE)
        };
        let device = match processes {
            [only] => Some(process_device_ref(only)),
            _ => None,
        };
        let subject = inputs.workload_subject(pid, device);
        let job = identity.job_id.as_deref().unwrap_or("?");
        let mut values = vec![
            ("rank".to_string(), Value::from(identity.rank)),
            (
                "steps_without_collectives".to_string(),
                Value::from(evidence.steps_without_collectives),
            ),
            (
                "cause".to_string(),
                Value::from(if evidence.collectives_timed {
                    "not_watched"
                } else {
                    "not_timed"
                }),
            ),
        ];
        if let Some(job) = identity.job_id.as_deref() {
            values.push(("job_id".to_string(), Value::from(job)));
        }
        out.push(Finding {
            rule: RuleId::CollectivesUnseen,
            related: Vec::new(),
            severity: Severity::Info,
            subject,
            summary: format!(
                "rank {} of job {job} ({subject_pid}): its last {} steps show no collective ({how}), \
                 so gpulse cannot compare its ranks or name the one that holds a hung job",
                identity.rank,
                evidence.steps_without_collectives,
                subject_pid = format_args!("pid {pid}"),
            ),
            advice: advice.to_string(),
            values,
            since: inputs.window.start,
            evidence: vec![Layer::Spans],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::framework::{DistributedIdentity, ProcessEvidence, StepEvidence};
    use crate::diagnosis::rules::testkit::*;

    fn fixture(world: u32, without: u64, timed: bool) -> Fixture {
        let mut f = Fixture::new(vec![window(
            60,
            vec![device(0, 0.5, 20 * GIB)],
            vec![process(100, 0, 20 * GIB, None)],
        )]);
        f.framework.processes.insert(
            100,
            ProcessEvidence {
                steps: Some(StepEvidence {
                    steps: 30,
                    ..Default::default()
                }),
                distributed: Some(DistributedIdentity {
                    rank: 1,
                    world_size: Some(world),
                    job_id: Some("j".into()),
                    ..Default::default()
                }),
                steps_without_collectives: without,
                collectives_timed: timed,
                ..Default::default()
            },
        );
        f
    }

    #[test]
    fn a_rank_whose_steps_show_no_collective_is_told_to_watch_ddp() {
        let found = evaluate(
            &fixture(4, 25, true).inputs(),
            &CollectivesUnseen::default(),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].severity, Severity::Info);
        assert_eq!(found[0].subject.pid(), Some(100));
        assert!(
            found[0].advice.contains("tel.watch_ddp("),
            "{}",
            found[0].advice
        );
        assert_eq!(found[0].value("cause"), Some(&Value::from("not_watched")));
        let untimed = evaluate(
            &fixture(4, 25, false).inputs(),
            &CollectivesUnseen::default(),
        );
        assert_eq!(untimed[0].value("cause"), Some(&Value::from("not_timed")));
    }

    #[test]
    fn a_single_process_job_or_a_few_accumulation_steps_are_not_findings() {
        let t = CollectivesUnseen::default();
        assert!(evaluate(&fixture(1, 100, true).inputs(), &t).is_empty());
        assert!(evaluate(&fixture(4, 8, true).inputs(), &t).is_empty());
    }
}
