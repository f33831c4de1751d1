//! `input_bound`: the GPU is mostly idle while the process tree keeps the CPU busy, so the
//! training step waits on data loading or host-side preprocessing.

use crate::diagnosis::findings::{human_bytes, pct, Finding, RuleId, Severity, Value};
use crate::diagnosis::thresholds::InputBound;

use super::{process_device_ref, Inputs};

const ADVICE: &str = "The GPU waits for the input pipeline. In PyTorch raise \
DataLoader(num_workers=N) towards the free CPU cores, set pin_memory=True, prefetch_factor=2..4 and \
persistent_workers=True; move decoding/augmentation to the GPU (DALI, torchvision v2 on tensors) \
or preprocess the dataset once offline. Check the loader with torch.profiler or py-spy.";

/// One finding per process whose GPUs are starved while its tree uses at least
/// `tree_cpu_cores_at_least` cores.
pub fn evaluate(inputs: &Inputs<'_>, t: &InputBound) -> Vec<Finding> {
    let mut out = Vec::new();
    for (pid, procs) in inputs.processes_by_pid() {
        let Some(usage) = inputs.usage.get(&pid) else {
            continue;
        };
        let Some(tree_cpu) = usage.tree_cpu_utilization.or(usage.cpu_utilization) else {
            continue;
        };
        if tree_cpu < t.tree_cpu_cores_at_least {
            continue;
        }
        let memory: u64 = procs
            .iter()
            .filter_map(|p| p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64))
            .sum();
        if memory < t.min_gpu_memory_bytes {
            continue;
        }
        // The busiest of its GPUs decides: one busy GPU means the pipeline keeps up somewhere.
        let mut busiest: Option<(f64, &'static str)> = None;
        for p in &procs {
            let util = match p.sm_utilization {
                Some(g) => Some((g.mean, "process_sm")),
                // GPM SM activity (how much of the GPU works) over GPU-Util (whether any
                // kernel ran) where the GPU gives it.
                None => inputs.device(&p.device_uuid).and_then(|d| {
                    d.gpm
                        .sm_activity
                        .map(|g| (g.mean, "device_sm_activity"))
                        .or(d.utilization_gpu.map(|g| (g.mean, "device")))
                }),
            };
            if let Some(u) = util {
                if busiest.is_none_or(|b| u.0 > b.0) {
                    busiest = Some(u);
                }
            }
        }
        let Some((gpu_util, source)) = busiest else {
            continue;
        };
        if gpu_util >= t.gpu_utilization_below {
            continue;
        }
        let device = match procs.as_slice() {
            [only] => Some(process_device_ref(only)),
            _ => None,
        };
        let subject = inputs.workload_subject(pid, device);
        let summary = format!(
            "{subject} is input-bound: GPU {} busy while its process tree uses {tree_cpu:.1} CPU cores ({} GPU memory held)",
            pct(gpu_util),
            human_bytes(memory as f64),
        );
        let mut values = vec![
            ("gpu_utilization_ratio".to_string(), Value::from(gpu_util)),
            ("utilization_source".to_string(), Value::from(source)),
            ("tree_cpu_cores".to_string(), Value::from(tree_cpu)),
            ("gpu_memory_bytes".to_string(), Value::from(memory)),
        ];
        if let Some(own) = usage.cpu_utilization {
            values.push(("process_cpu_cores".to_string(), Value::from(own)));
        }
        out.push(Finding {
            rule: RuleId::InputBound,
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since: inputs.window.start,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    fn fixture(gpu_util: f64, sm: Option<f64>, tree_cpu: f64) -> Fixture {
        let w = window(
            60,
            vec![device(0, gpu_util, 20 * GIB)],
            vec![process(100, 0, 20 * GIB, sm)],
        );
        Fixture::new(vec![w]).cpu(100, 0.9, tree_cpu)
    }

    #[test]
    fn starved_gpu_with_busy_workers_is_input_bound() {
        let f = fixture(0.12, None, 3.5);
        let found = evaluate(&f.inputs(), &InputBound::default());
        assert_eq!(found.len(), 1);
        let finding = &found[0];
        assert_eq!(finding.rule, RuleId::InputBound);
        assert_eq!(finding.subject.pid(), Some(100));
        assert_eq!(finding.value("tree_cpu_cores"), Some(&Value::Float(3.5)));
        assert_eq!(
            finding.value("utilization_source"),
            Some(&Value::from("device"))
        );
        assert!(finding.summary.contains("12%"), "{}", finding.summary);
        assert!(finding.advice.contains("num_workers"));
    }

    #[test]
    fn busy_gpu_is_not_input_bound() {
        let f = fixture(0.85, None, 6.0);
        assert!(evaluate(&f.inputs(), &InputBound::default()).is_empty());
    }

    #[test]
    fn idle_cpu_is_not_input_bound() {
        // GPU idle and CPU idle: nothing is feeding the GPU because nothing runs (idle_holder's
        // business, not this rule's).
        let f = fixture(0.05, None, 0.1);
        assert!(evaluate(&f.inputs(), &InputBound::default()).is_empty());
    }

    #[test]
    fn own_sm_utilization_wins_over_shared_device() {
        // The device is busy because of another process; this one's own SM share is 5%.
        let f = fixture(0.9, Some(0.05), 2.0);
        let found = evaluate(&f.inputs(), &InputBound::default());
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].value("utilization_source"),
            Some(&Value::from("process_sm"))
        );
    }

    #[test]
    fn unknown_cpu_reports_nothing() {
        let w = window(
            60,
            vec![device(0, 0.1, 20 * GIB)],
            vec![process(100, 0, 20 * GIB, None)],
        );
        let f = Fixture::new(vec![w]);
        assert!(evaluate(&f.inputs(), &InputBound::default()).is_empty());
    }
}
