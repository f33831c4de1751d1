//! `low_sm_efficiency`: GPU-Util says the GPU is busy, GPM SM activity says few of its SMs work.
//! `GPU-Util` is the share of time any kernel ran (one small kernel on one SM reads 100 %); a
//! loop of tiny kernels, launch overhead or small batches keeps it high while most SMs idle.
//! Needs GPM (Hopper and newer): without it the rule never fires.

use crate::config::thresholds::LowSmEfficiency;
use crate::diagnosis::findings::{human_duration, pct, Finding, Layer, RuleId, Severity, Value};
use crate::schema::GpmField;

use super::{process_device_ref_in, sustained_main_holders, Inputs, SustainedHolder};

const ADVICE: &str = "The GPU is busy but most SMs idle: kernels too small to fill it, or the \
CPU launching them one by one. Raise the batch size if memory allows; fuse the small kernels \
with torch.compile(model) (mode=\"reduce-overhead\" also captures CUDA graphs), or capture the \
step in a CUDA graph (torch.cuda.graphs) so launches stop costing host time. Check with \
torch.profiler whether the step is dominated by many short kernels.";

/// One finding per device whose main holder ran past `min_duration` with high GPU-Util and low
/// SM activity.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &LowSmEfficiency) -> Vec<Finding> {
    let mut out = Vec::new();
    let sustained = sustained_main_holders(inputs, t.min_duration, |s| {
        matches!(
            (s.device_utilization_mean, s.device_sm_activity_mean),
            (Some(util), Some(sm))
                if util >= t.gpu_utilization_at_least && sm < t.sm_activity_below
        )
    });
    for holder in &sustained {
        let SustainedHolder {
            process: p,
            since,
            seconds,
            ..
        } = *holder;
        let (Some(util), Some(sm)) = (
            holder.utilization(),
            holder.gpm().gauge(GpmField::SmActivity),
        ) else {
            continue;
        };
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let summary = format!(
            "{subject} keeps the GPU {} busy but only {} of its SMs active for {}",
            pct(util.mean),
            pct(sm.mean),
            human_duration(seconds)
        );
        out.push(Finding {
            rule: RuleId::LowSmEfficiency,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values: vec![
                ("gpu_utilization_ratio".into(), Value::from(util.mean)),
                ("sm_activity_ratio".into(), Value::from(sm.mean)),
                ("duration_seconds".into(), Value::from(seconds)),
            ],
            since,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    fn minutes(n: u64, util: f64, sm: Option<f64>) -> Fixture {
        let windows = (1..=n)
            .map(|i| {
                let mut d = device(0, util, 10 * GIB);
                d.gpm.set(GpmField::SmActivity, sm.map(gauge));
                window(i * 60, vec![d], vec![process(42, 0, 8 * GIB, None)])
            })
            .collect();
        Fixture::new(windows)
    }

    #[test]
    fn busy_gpu_with_few_active_sms_fires_after_min_duration() {
        let found = evaluate(
            &minutes(6, 0.95, Some(0.12)).inputs(),
            &LowSmEfficiency::default(),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, RuleId::LowSmEfficiency);
        assert_eq!(found[0].subject.pid(), Some(42));
        assert!(found[0].advice.contains("torch.compile"));
    }

    #[test]
    fn working_sms_short_runs_idle_gpus_and_no_gpm_are_quiet() {
        let t = LowSmEfficiency::default();
        assert!(evaluate(&minutes(6, 0.95, Some(0.7)).inputs(), &t).is_empty());
        assert!(evaluate(&minutes(4, 0.95, Some(0.12)).inputs(), &t).is_empty());
        assert!(evaluate(&minutes(6, 0.5, Some(0.12)).inputs(), &t).is_empty());
        assert!(evaluate(&minutes(6, 0.95, None).inputs(), &t).is_empty());
    }
}
