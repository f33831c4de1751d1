//! `uneven_multi_gpu`: one job spread over several GPUs keeps them unequally busy — a
//! straggler rank, uneven sharding, or a pipeline stage that does more than the others.
//!
//! A job is the processes of one pod (`k8s.pod.uid`), else of one container (`container.id`),
//! else one process using several GPUs. Ranks launched as separate bare processes (torchrun
//! outside a container) are separate jobs here: their grouping would need the process tree.

use std::collections::BTreeMap;

use crate::config::thresholds::UnevenMultiGpu;
use crate::diagnosis::findings::{
    pct, DeviceRef, Finding, JobKey, Layer, RuleId, Severity, Subject, Value,
};
use crate::sampling::ProcessWindow;
use crate::schema::DeviceField;

use super::Inputs;

const ADVICE: &str = "Some GPUs of the job wait for the others: check that every rank gets an \
equal shard (DistributedSampler, drop_last=True, equal sequence lengths per batch), that \
pipeline stages are balanced, and whether the slow GPU is throttled or on a slower link \
(`nvidia-smi topo -m`); compare per-rank step times.";

/// The job a process belongs to.
pub(crate) fn job_key(inputs: &Inputs<'_>, pid: u32) -> JobKey {
    let w = inputs.workloads.get(&pid);
    if let Some(uid) = w.and_then(|w| w.pod_uid.clone()) {
        return JobKey::PodUid(uid);
    }
    if let Some(id) = w.and_then(|w| w.container_id.clone()) {
        return JobKey::ContainerId(id);
    }
    JobKey::Pid(pid)
}

/// The window's processes grouped by job ([`job_key`]), keeping only the jobs on two or more
/// GPUs: what the rules that compare a job's GPUs (this one, interconnect_bound) look at. A job
/// on one GPU (most processes) has nothing to compare.
pub(super) fn multi_gpu_jobs<'a>(
    inputs: &Inputs<'a>,
) -> impl Iterator<Item = (JobKey, Vec<&'a ProcessWindow>)> {
    let mut jobs: BTreeMap<JobKey, Vec<&'a ProcessWindow>> = BTreeMap::new();
    for p in &inputs.window.processes {
        jobs.entry(job_key(inputs, p.pid)).or_default().push(p);
    }
    jobs.into_iter().filter(|(_, procs)| {
        procs
            .iter()
            .any(|p| p.device_index != procs[0].device_index)
    })
}

/// One finding per job on two or more GPUs with uneven utilisation.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &UnevenMultiGpu) -> Vec<Finding> {
    let mut out = Vec::new();
    for (key, procs) in multi_gpu_jobs(inputs) {
        let mut by_device: BTreeMap<u32, (String, Vec<&ProcessWindow>)> = BTreeMap::new();
        for p in &procs {
            by_device
                .entry(p.device_index)
                .or_insert_with(|| (p.device_uuid.clone(), Vec::new()))
                .1
                .push(p);
        }
        if by_device.len() < 2 {
            continue;
        }
        let mut utils: Vec<(DeviceRef, f64)> = Vec::new();
        for (index, (uuid, on_device)) in &by_device {
            // The job's own SM share when NVML gives it for all its processes there; else the
            // device's utilisation (exact when the job has the GPU to itself, as usual).
            let own: Option<f64> = on_device
                .iter()
                .map(|p| p.sm_utilization.map(|g| g.mean))
                .sum();
            let util = own.map(|u| u.min(1.0)).or_else(|| {
                inputs
                    .device(uuid)
                    .and_then(|d| d.gauge(DeviceField::UtilizationGpu))
                    .map(|g| g.mean)
            });
            if let Some(u) = util {
                utils.push((
                    DeviceRef {
                        uuid: uuid.clone(),
                        index: *index,
                        mig: None,
                    },
                    u,
                ));
            }
        }
        if utils.len() < 2 {
            continue;
        }
        let busiest = utils.iter().max_by(|a, b| a.1.total_cmp(&b.1)).cloned();
        let least = utils.iter().min_by(|a, b| a.1.total_cmp(&b.1)).cloned();
        let (Some((busy_dev, busy)), Some((least_dev, low))) = (busiest, least) else {
            continue;
        };
        if busy < t.busiest_at_least {
            continue;
        }
        let spread = busy - low;
        if spread <= t.spread_above && low >= t.least_to_busiest_below * busy {
            continue;
        }
        let mut pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let subject = Subject::Job {
            key,
            pids,
            devices: utils.iter().map(|(d, _)| d.clone()).collect(),
        };
        let per_gpu: Vec<String> = utils
            .iter()
            .map(|(d, u)| format!("GPU {} {}", d.index, pct(*u)))
            .collect();
        let summary = format!(
            "{subject} is unevenly busy: {} (GPU {} at {} of GPU {}'s load)",
            per_gpu.join(", "),
            least_dev.index,
            pct(if busy > 0.0 { low / busy } else { 0.0 }),
            busy_dev.index,
        );
        let mut values = vec![
            ("busiest_utilization_ratio".to_string(), Value::from(busy)),
            ("least_utilization_ratio".to_string(), Value::from(low)),
            ("spread_ratio".to_string(), Value::from(spread)),
            ("busiest_gpu_index".to_string(), Value::from(busy_dev.index)),
            ("least_gpu_index".to_string(), Value::from(least_dev.index)),
        ];
        for (d, u) in &utils {
            values.push((
                format!("gpu_{}_utilization_ratio", d.index),
                Value::from(*u),
            ));
        }
        out.push(Finding {
            rule: RuleId::UnevenMultiGpu,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since: inputs.window.start,
            evidence: vec![Layer::Nvml, Layer::Procfs],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Workload;
    use crate::diagnosis::rules::testkit::*;

    fn pod_workload(pid: u32, uid: &str) -> Workload {
        Workload {
            pod_uid: Some(uid.into()),
            ..Workload::unresolved(pid)
        }
    }

    fn two_rank_pod(u0: f64, u1: f64) -> Fixture {
        let w = window(
            60,
            vec![device(0, u0, 30 * GIB), device(1, u1, 30 * GIB)],
            vec![
                process(10, 0, 30 * GIB, None),
                process(11, 1, 30 * GIB, None),
            ],
        );
        let mut f = Fixture::new(vec![w]);
        f.workloads.insert(10, pod_workload(10, "pod-a"));
        f.workloads.insert(11, pod_workload(11, "pod-a"));
        f
    }

    #[test]
    fn straggler_in_a_pod_is_reported() {
        let f = two_rank_pod(0.95, 0.30);
        let found = evaluate(&f.inputs(), &UnevenMultiGpu::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let Subject::Job { key, pids, devices } = &found[0].subject else {
            panic!("not a job subject");
        };
        assert_eq!(key, &JobKey::PodUid("pod-a".into()));
        assert_eq!(pids, &vec![10, 11]);
        assert_eq!(devices.len(), 2);
        assert_eq!(found[0].value("least_gpu_index"), Some(&Value::Int(1)));
        assert!(
            found[0].summary.contains("GPU 1 30%"),
            "{}",
            found[0].summary
        );
    }

    #[test]
    fn balanced_pod_is_not_uneven() {
        let f = two_rank_pod(0.92, 0.88);
        assert!(evaluate(&f.inputs(), &UnevenMultiGpu::default()).is_empty());
    }

    #[test]
    fn idle_everywhere_is_not_uneven() {
        let f = two_rank_pod(0.10, 0.0);
        assert!(evaluate(&f.inputs(), &UnevenMultiGpu::default()).is_empty());
    }

    #[test]
    fn separate_unattributed_processes_are_separate_jobs() {
        let w = window(
            60,
            vec![device(0, 0.95, 30 * GIB), device(1, 0.1, 30 * GIB)],
            vec![
                process(10, 0, 30 * GIB, None),
                process(11, 1, 30 * GIB, None),
            ],
        );
        let f = Fixture::new(vec![w]);
        assert!(evaluate(&f.inputs(), &UnevenMultiGpu::default()).is_empty());
    }

    #[test]
    fn one_process_on_two_gpus_uses_its_own_sm_share() {
        let w = window(
            60,
            vec![device(0, 0.9, 30 * GIB), device(1, 0.9, 30 * GIB)],
            vec![
                process(10, 0, 30 * GIB, Some(0.9)),
                process(10, 1, 30 * GIB, Some(0.15)),
            ],
        );
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &UnevenMultiGpu::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].subject.key(), "job:pid:10");
    }
}
