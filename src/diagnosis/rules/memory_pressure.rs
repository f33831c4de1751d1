//! `memory_pressure`: the device is (nearly) out of memory, or a process holds nearly all the
//! memory it could get, so its next allocation is likely to fail with out-of-memory. On a GPU in
//! MIG mode each MIG instance is judged on its own slice, and a process on its instance's: a
//! full 3g.40gb slice runs out of memory however empty the rest of the GPU is.

use crate::config::thresholds::MemoryPressure;
use crate::diagnosis::findings::{
    human_bytes, pct, Finding, Layer, RuleId, Severity, Subject, Value,
};
use crate::schema::DeviceField;

use super::{device_ref, memory_room, process_device_ref_in, Inputs};
use crate::diagnosis::findings::MigRef;

const ADVICE: &str = "Lower the peak memory of a step: a smaller batch size with gradient \
accumulation to keep the effective batch, mixed precision (torch.autocast with bf16/fp16), \
activation checkpointing (torch.utils.checkpoint); set \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to cut fragmentation; look for other processes \
on the same GPU (nvidia-smi) that should not be there.";

/// One device finding when the device's memory is nearly all taken; one workload finding per
/// process holding nearly all of what it could have.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &MemoryPressure) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in &inputs.window.devices {
        let free = d.last_u64(DeviceField::MemoryFree);
        let used = d.last_u64(DeviceField::MemoryUsed);
        let total = d.last_u64(DeviceField::MemoryTotal);
        out.extend(judge_room(inputs, t, device_ref(d), total, free, used));
        for m in &d.mig_instances {
            let mut subject = device_ref(d);
            subject.mig = Some(MigRef {
                uuid: m.info.uuid.clone(),
                gpu_instance_id: m.info.gpu_instance_id,
                compute_instance_id: m.info.compute_instance_id,
                profile: m.info.profile().to_string(),
            });
            out.extend(judge_room(
                inputs,
                t,
                subject,
                m.memory_total_bytes,
                m.memory_free_bytes,
                m.memory_used_bytes,
            ));
        }
    }
    for p in &inputs.window.processes {
        let Some(held) = p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64) else {
            continue;
        };
        if held < t.min_process_bytes {
            continue;
        }
        // On MIG, the free memory of its instance: the only memory it can allocate from.
        let Some(room) = memory_room(inputs, p) else {
            continue;
        };
        let Some(free) = room.free else {
            continue;
        };
        let reachable = free.saturating_add(held);
        let share = held as f64 / reachable as f64;
        if share < t.process_share_at_least {
            continue;
        }
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let summary = format!(
            "{subject} holds {} of the {} it could have ({}): {} left before out-of-memory",
            human_bytes(held as f64),
            human_bytes(reachable as f64),
            pct(share),
            human_bytes(free as f64),
        );
        out.push(Finding {
            rule: RuleId::MemoryPressure,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values: vec![
                ("process_share_ratio".into(), Value::from(share)),
                ("gpu_memory_bytes".into(), Value::from(held)),
                // On MIG, the instance's free memory (the subject names the instance).
                ("device_free_bytes".into(), Value::from(free)),
            ],
            since: inputs.window.start,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

/// The finding of one device or MIG instance (`subject`) whose memory is nearly all taken.
fn judge_room(
    inputs: &Inputs<'_>,
    t: &MemoryPressure,
    subject: crate::diagnosis::findings::DeviceRef,
    total: Option<u64>,
    free: Option<u64>,
    used: Option<u64>,
) -> Option<Finding> {
    let total = total.filter(|&t| t > 0)?;
    // Driver-reserved memory is not available to applications either: count it as taken.
    let taken = match (free, used) {
        (Some(free), _) => total.saturating_sub(free),
        (None, Some(used)) => used,
        (None, None) => return None,
    };
    let ratio = taken as f64 / total as f64;
    if ratio <= t.device_used_above {
        return None;
    }
    let severity = if ratio > t.device_used_error_above {
        Severity::Error
    } else {
        Severity::Warning
    };
    let subject = Subject::Device(subject);
    let summary = format!(
        "{subject} memory is {} full: {} of {} taken, {} free",
        pct(ratio),
        human_bytes(taken as f64),
        human_bytes(total as f64),
        human_bytes(total.saturating_sub(taken) as f64),
    );
    Some(Finding {
        rule: RuleId::MemoryPressure,
        related: Vec::new(),
        severity,
        subject,
        summary,
        advice: ADVICE.to_string(),
        values: vec![
            ("device_used_ratio".into(), Value::from(ratio)),
            ("memory_taken_bytes".into(), Value::from(taken)),
            ("memory_total_bytes".into(), Value::from(total)),
        ],
        since: inputs.window.start,
        evidence: vec![Layer::Nvml],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    #[test]
    fn nearly_full_device_and_its_holder_are_reported() {
        // 78 of 80 GiB taken (97.5%), the process holds 76 of the 78 it could have.
        let w = window(
            60,
            vec![device(0, 0.9, 78 * GIB)],
            vec![process(5, 0, 76 * GIB, None)],
        );
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &MemoryPressure::default());
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(matches!(found[0].subject, Subject::Device(_)));
        assert_eq!(found[0].severity, Severity::Warning);
        assert!(
            found[0].summary.contains("98% full"),
            "{}",
            found[0].summary
        );
        assert_eq!(found[1].subject.pid(), Some(5));
        assert!(found[1].advice.contains("expandable_segments:True"));
    }

    #[test]
    fn full_device_is_an_error() {
        let w = window(
            60,
            vec![device(0, 0.9, 80 * GIB - 100 * 1024 * 1024)],
            vec![],
        );
        let f = Fixture::new(vec![w]);
        let found = evaluate(&f.inputs(), &MemoryPressure::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].severity, Severity::Error);
    }

    #[test]
    fn comfortable_memory_is_not_pressure() {
        // 40 of 80 GiB: the process holds 40 of the 80 it could have (50%).
        let w = window(
            60,
            vec![device(0, 0.9, 40 * GIB)],
            vec![process(5, 0, 40 * GIB, None)],
        );
        let f = Fixture::new(vec![w]);
        assert!(evaluate(&f.inputs(), &MemoryPressure::default()).is_empty());
    }

    #[test]
    fn unknown_memory_is_not_pressure() {
        let mut d = device(0, 0.9, 79 * GIB);
        d.fields.set_gauge(DeviceField::MemoryFree, None);
        d.fields.set_gauge(DeviceField::MemoryUsed, None);
        let w = window(60, vec![d], vec![process(5, 0, 79 * GIB, None)]);
        let f = Fixture::new(vec![w]);
        assert!(evaluate(&f.inputs(), &MemoryPressure::default()).is_empty());
    }
}
