//! `tensor_cores_idle`: the GPU's SMs are busy (GPM SM activity) while its tensor cores do
//! nothing (GPM tensor activity), for a while, on the process holding the GPU. Matrix math in
//! FP32 without TF32 or autocast runs on the FP32 pipes at a fraction of the tensor cores' rate.
//! Needs GPM (Hopper and newer): without it the rule never fires.

use crate::config::thresholds::TensorCoresIdle;
use crate::diagnosis::findings::{human_duration, pct, Finding, Layer, RuleId, Severity, Value};

use super::{process_device_ref_in, sustained_main_holders, Inputs, SustainedHolder};
use crate::schema::GpmField;

const ADVICE: &str = "The SMs work but the tensor cores do not: the math runs in FP32 on the \
ordinary pipes. In PyTorch wrap the forward pass and loss in torch.autocast(\"cuda\", \
dtype=torch.bfloat16) (or float16 with torch.amp.GradScaler), and allow TF32 for the FP32 that \
remains: torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 = True \
(or torch.set_float32_matmul_precision(\"high\")). Keep matrix dimensions multiples of 8.";

/// One finding per device whose main holder ran past `min_duration` with busy SMs and idle
/// tensor cores.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &TensorCoresIdle) -> Vec<Finding> {
    let mut out = Vec::new();
    let sustained = sustained_main_holders(inputs, t.min_duration, |s| {
        matches!(
            (s.device_sm_activity_mean, s.device_tensor_activity_mean),
            (Some(sm), Some(tensor))
                if sm >= t.sm_activity_at_least && tensor < t.tensor_activity_below
        )
    });
    for holder in &sustained {
        let SustainedHolder {
            process: p,
            since,
            seconds,
            ..
        } = *holder;
        let (Some(sm), Some(tensor)) = (
            holder.gpm().gauge(GpmField::SmActivity),
            holder.gpm().gauge(GpmField::TensorActivity),
        ) else {
            continue;
        };
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let summary = format!(
            "{subject} keeps the SMs busy ({} SM activity) with the tensor cores idle ({} tensor activity) for {}",
            pct(sm.mean),
            pct(tensor.mean),
            human_duration(seconds)
        );
        out.push(Finding {
            rule: RuleId::TensorCoresIdle,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values: vec![
                ("sm_activity_ratio".into(), Value::from(sm.mean)),
                ("tensor_activity_ratio".into(), Value::from(tensor.mean)),
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

    /// `n` one-minute windows of GPU 0 at 95 % GPU-Util with the given GPM activity, held by
    /// PID 42 (8 GiB) and PID 43 (1 GiB).
    fn minutes(n: u64, sm: f64, tensor: f64) -> Fixture {
        let windows = (1..=n)
            .map(|i| {
                let mut d = device(0, 0.95, 10 * GIB);
                d.gpm.set(GpmField::SmActivity, Some(gauge(sm)));
                d.gpm.set(GpmField::TensorActivity, Some(gauge(tensor)));
                window(
                    i * 60,
                    vec![d],
                    vec![process(42, 0, 8 * GIB, None), process(43, 0, GIB, None)],
                )
            })
            .collect();
        Fixture::new(windows)
    }

    #[test]
    fn busy_sms_with_idle_tensor_cores_fire_on_the_main_holder_after_min_duration() {
        let found = evaluate(&minutes(6, 0.8, 0.0).inputs(), &TensorCoresIdle::default());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, RuleId::TensorCoresIdle);
        assert_eq!(found[0].subject.pid(), Some(42));
        assert!(found[0].advice.contains("autocast") && found[0].advice.contains("TF32"));
    }

    #[test]
    fn shorter_than_min_duration_or_tensor_busy_or_no_gpm_is_quiet() {
        let t = TensorCoresIdle::default();
        assert!(evaluate(&minutes(4, 0.8, 0.0).inputs(), &t).is_empty());
        assert!(evaluate(&minutes(6, 0.8, 0.4).inputs(), &t).is_empty());
        assert!(evaluate(&minutes(6, 0.3, 0.0).inputs(), &t).is_empty());
        let windows = (1..=6)
            .map(|i| {
                window(
                    i * 60,
                    vec![device(0, 0.95, 10 * GIB)],
                    vec![process(42, 0, 8 * GIB, None)],
                )
            })
            .collect();
        assert!(evaluate(&Fixture::new(windows).inputs(), &t).is_empty());
    }
}
