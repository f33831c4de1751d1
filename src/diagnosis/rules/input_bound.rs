//! `input_bound`: the training step waits on data loading or host-side preprocessing.
//!
//! Two ways to know it. With the framework's `step` spans (the companion sends them through
//! gpulse's receiver), the share of step time spent in `data_wait` is the primary evidence: at
//! `data_wait_ratio_at_least` or more with the GPU below `spans_gpu_utilization_below`, the
//! process is input-bound whether its CPU is busy (a CPU-bound loader: too few workers) or idle
//! (an I/O-bound loader: storage or network), and the finding says which. A process whose spans
//! show little waiting is not input-bound, whatever its CPU does. Without spans the rule infers
//! it: the GPU mostly idle while the process tree keeps the CPU busy.

use crate::config::thresholds::InputBound;
use crate::diagnosis::findings::{human_bytes, pct, Finding, Layer, RuleId, Severity, Value};
use crate::diagnosis::framework::{LoaderSettings, ProcessEvidence, StepEvidence};
use crate::schema::{DeviceField, GpmField};

use super::{process_device_ref, Inputs};

const ADVICE: &str = "The GPU waits for the input pipeline. In PyTorch raise \
DataLoader(num_workers=N) towards the free CPU cores, set pin_memory=True, prefetch_factor=2..4 and \
persistent_workers=True; move decoding/augmentation to the GPU (DALI, torchvision v2 on tensors) \
or preprocess the dataset once offline. Check the loader with torch.profiler or py-spy.";

const CPU_BOUND_ADVICE: &str = "The DataLoader workers cannot produce batches fast enough and \
the CPU is busy: raise DataLoader(num_workers=N) towards the CPUs the container may use, set \
persistent_workers=True and prefetch_factor=2..4, pin_memory=True; move decoding/augmentation to \
the GPU (DALI, torchvision v2 on tensors) or preprocess the dataset once offline.";

const IO_BOUND_ADVICE: &str = "The step waits for data while the CPU is idle: the loader is \
blocked on storage or the network, not on computation. Raise prefetch_factor and num_workers so \
more reads are in flight, set persistent_workers=True, cache or copy the dataset to local disk \
(or memory), use larger sequential shards (WebDataset, TFRecord-style) instead of many small \
files, and check the storage throughput (iostat, the object store's latency).";

/// How the loader is bound, from the CPU use of the process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    Cpu,
    Io,
    Unknown,
}

impl Bound {
    const fn as_str(self) -> &'static str {
        match self {
            Bound::Cpu => "cpu",
            Bound::Io => "io",
            Bound::Unknown => "unknown",
        }
    }
}

/// Why a process is input-bound.
enum Verdict<'a> {
    /// Its step spans show the wait on the DataLoader.
    Spans {
        steps: StepEvidence,
        framework: &'a ProcessEvidence,
        bound: Bound,
    },
    /// Without spans: its process tree keeps `cpu` cores busy while the GPU idles.
    Inferred { cpu: f64 },
}

/// One finding per input-bound process; see the module documentation.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &InputBound) -> Vec<Finding> {
    let mut out = Vec::new();
    for (pid, procs) in inputs.processes_by_pid() {
        let usage = inputs.usage.get(&pid);
        let tree_cpu = usage.and_then(|u| u.tree_cpu_utilization.or(u.cpu_utilization));
        let memory: u64 = procs
            .iter()
            .filter_map(|p| p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64))
            .sum();
        if memory < t.min_gpu_memory_bytes {
            continue;
        }
        // The busiest of its GPUs decides: one busy GPU means the pipeline keeps up somewhere.
        let mut busiest: Option<(f64, &'static str)> = None;
        for p in procs {
            let util = match p.sm_utilization {
                Some(g) => Some((g.mean, "process_sm")),
                // GPM SM activity (how much of the GPU works) over GPU-Util (whether any
                // kernel ran) where the GPU gives it.
                None => inputs.device(&p.device_uuid).and_then(|d| {
                    d.gpm
                        .gauge(GpmField::SmActivity)
                        .map(|g| (g.mean, "device_sm_activity"))
                        .or(d
                            .gauge(DeviceField::UtilizationGpu)
                            .map(|g| (g.mean, "device")))
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
        let framework = inputs.framework.process(pid);
        let steps = framework.and_then(|f| {
            f.steps
                .filter(|s| s.steps >= t.min_steps)
                .map(|steps| (steps, f))
        });
        // Decided before the finding is built: most processes are not input-bound, and the
        // rule runs for every one of them every window.
        let verdict = match steps {
            Some((steps, framework)) => {
                if steps.data_wait_ratio < t.data_wait_ratio_at_least
                    || gpu_util >= t.spans_gpu_utilization_below
                {
                    continue;
                }
                let bound = match tree_cpu {
                    Some(cpu) if cpu >= t.tree_cpu_cores_at_least => Bound::Cpu,
                    Some(_) => Bound::Io,
                    None => Bound::Unknown,
                };
                Verdict::Spans {
                    steps,
                    framework,
                    bound,
                }
            }
            None => {
                let Some(cpu) = tree_cpu else {
                    continue;
                };
                if cpu < t.tree_cpu_cores_at_least || gpu_util >= t.gpu_utilization_below {
                    continue;
                }
                Verdict::Inferred { cpu }
            }
        };
        let device = match procs {
            [only] => Some(process_device_ref(only)),
            _ => None,
        };
        let subject = inputs.workload_subject(pid, device);
        let mut values = vec![
            ("gpu_utilization_ratio".to_string(), Value::from(gpu_util)),
            ("utilization_source".to_string(), Value::from(source)),
            ("gpu_memory_bytes".to_string(), Value::from(memory)),
        ];
        if let Some(cpu) = tree_cpu {
            values.push(("tree_cpu_cores".to_string(), Value::from(cpu)));
        }
        if let Some(own) = usage.and_then(|u| u.cpu_utilization) {
            values.push(("process_cpu_cores".to_string(), Value::from(own)));
        }
        let (summary, advice, evidence) = match verdict {
            Verdict::Spans {
                steps,
                framework,
                bound,
            } => {
                with_spans(&mut values, steps, bound, framework);
                let how = match bound {
                    Bound::Cpu => format!(
                        "CPU-bound loader: its process tree uses {:.1} CPU cores",
                        tree_cpu.unwrap_or_default()
                    ),
                    Bound::Io => format!(
                        "I/O-bound loader: its CPU is idle ({:.2} cores), so the loader waits on storage or the network",
                        tree_cpu.unwrap_or_default()
                    ),
                    Bound::Unknown => "its CPU use is unknown".to_string(),
                };
                let summary = format!(
                    "{subject} is input-bound: {} of each step waits on the DataLoader (over {} steps) and the GPU is {} busy; {how}",
                    pct(steps.data_wait_ratio),
                    steps.steps,
                    pct(gpu_util),
                );
                let mut evidence = vec![Layer::Nvml, Layer::Spans];
                if tree_cpu.is_some() || framework.cpu_quota_cores.is_some() {
                    evidence.push(Layer::Procfs);
                }
                (summary, loader_advice(bound, framework), evidence)
            }
            Verdict::Inferred { cpu } => {
                let summary = format!(
                    "{subject} is input-bound: GPU {} busy while its process tree uses {cpu:.1} CPU cores ({} GPU memory held)",
                    pct(gpu_util),
                    human_bytes(memory as f64),
                );
                (
                    summary,
                    ADVICE.to_string(),
                    vec![Layer::Nvml, Layer::Procfs],
                )
            }
        };
        out.push(Finding {
            rule: RuleId::InputBound,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice,
            values,
            since: inputs.window.start,
            evidence,
        });
    }
    out
}

fn with_spans(
    values: &mut Vec<(String, Value)>,
    steps: StepEvidence,
    bound: Bound,
    framework: &ProcessEvidence,
) {
    values.push((
        "data_wait_ratio".to_string(),
        Value::from(steps.data_wait_ratio),
    ));
    values.push(("steps".to_string(), Value::from(steps.steps as u64)));
    values.push((
        "observed_seconds".to_string(),
        Value::from(steps.observed_seconds),
    ));
    values.push(("loader_bound".to_string(), Value::from(bound.as_str())));
    if let Some(cores) = framework.cpu_quota_cores {
        values.push(("cpu_quota_cores".to_string(), Value::from(cores)));
    }
}

/// The advice for a loader, naming the settings the companion reported and the CPU quota.
fn loader_advice(bound: Bound, framework: &ProcessEvidence) -> String {
    let mut advice = match bound {
        Bound::Io => IO_BOUND_ADVICE,
        Bound::Cpu | Bound::Unknown => CPU_BOUND_ADVICE,
    }
    .to_string();
    let loader: &LoaderSettings = &framework.loader;
    if loader.is_empty() {
        advice.push_str(
            " The run did not report its DataLoader settings (the otel_torch_train companion \
             puts them on its run and epoch spans).",
        );
    } else {
        advice.push_str(&format!(" Its DataLoader now: {}.", loader.describe()));
    }
    match framework.cpu_quota_cores {
        Some(cores) => advice.push_str(&format!(
            " The container may use {cores:.1} CPUs (cgroup CPU quota): keep num_workers \
             within that, or raise the container's CPU limit."
        )),
        None => advice.push_str(" No CPU quota was found for its cgroup."),
    }
    advice
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

    fn with_steps(mut f: Fixture, ratio: f64) -> Fixture {
        use crate::diagnosis::framework::{LoaderSettings, ProcessEvidence, StepEvidence};
        f.framework.processes.insert(
            100,
            ProcessEvidence {
                steps: Some(StepEvidence {
                    data_wait_ratio: ratio,
                    steps: 20,
                    observed_seconds: 30.0,
                    ..Default::default()
                }),
                loader: LoaderSettings {
                    settings: vec![("pytorch.dataloader.num_workers".into(), "2".into())],
                },
                cpu_quota_cores: Some(4.0),
                ..Default::default()
            },
        );
        f
    }

    #[test]
    fn data_wait_with_idle_cpu_is_an_io_bound_loader() {
        let f = with_steps(fixture(0.3, Some(0.25), 0.05), 0.7);
        let found = evaluate(&f.inputs(), &InputBound::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let finding = &found[0];
        assert_eq!(finding.value("data_wait_ratio"), Some(&Value::Float(0.7)));
        assert_eq!(finding.value("loader_bound"), Some(&Value::from("io")));
        assert_eq!(finding.value("cpu_quota_cores"), Some(&Value::Float(4.0)));
        assert!(finding.summary.contains("I/O-bound"), "{}", finding.summary);
        assert!(
            finding.advice.contains("num_workers=2"),
            "{}",
            finding.advice
        );
        assert!(finding.advice.contains("4.0 CPUs"), "{}", finding.advice);
        assert_eq!(
            finding.evidence,
            vec![Layer::Nvml, Layer::Spans, Layer::Procfs]
        );
    }

    #[test]
    fn data_wait_with_busy_cpu_is_a_cpu_bound_loader() {
        let f = with_steps(fixture(0.3, Some(0.25), 3.0), 0.5);
        let found = evaluate(&f.inputs(), &InputBound::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].value("loader_bound"), Some(&Value::from("cpu")));
        assert!(
            found[0].summary.contains("CPU-bound"),
            "{}",
            found[0].summary
        );
    }

    #[test]
    fn little_data_wait_overrules_a_busy_cpu() {
        // The old inference would fire (GPU 10 %, 3 cores busy); the spans say the steps do not
        // wait on data, so the GPU is idle for another reason.
        let f = with_steps(fixture(0.1, None, 3.0), 0.05);
        assert!(evaluate(&f.inputs(), &InputBound::default()).is_empty());
    }

    #[test]
    fn data_wait_with_a_busy_gpu_is_not_input_bound() {
        let f = with_steps(fixture(0.9, Some(0.8), 0.05), 0.4);
        assert!(evaluate(&f.inputs(), &InputBound::default()).is_empty());
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
