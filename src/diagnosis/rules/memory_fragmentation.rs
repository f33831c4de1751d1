//! `memory_fragmentation`: PyTorch's caching allocator holds much more than its live tensors
//! need (reserved − allocated at least `unused_reserved_ratio_at_least` of reserved and
//! `unused_reserved_bytes_at_least`) in every allocator reading over `min_duration`, while the
//! device is under memory pressure (used at least `device_used_at_least` of its total in this
//! window; on a GPU in MIG mode, the process's MIG instance: its slice is all it can allocate
//! from). The cached blocks are split into pieces too small for the next large allocation, so
//! it can fail with out-of-memory although the process holds plenty in total. Needs the
//! framework's allocator gauges; without them the rule says nothing.

use crate::config::thresholds::MemoryFragmentation;
use crate::diagnosis::findings::{
    human_bytes, human_duration, pct, Finding, Layer, RuleId, Severity, Value,
};
use crate::diagnosis::framework::AllocatorPoint;

use super::{memory_room, process_device_ref_in, Inputs};

const ADVICE: &str = "The caching allocator's reserve is fragmented: start the job with \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of leaving \
unusable gaps); with variable input shapes, pad or bucket them to a few sizes. \
torch.cuda.memory_summary() shows the inactive split blocks; torch.cuda.empty_cache() between \
phases only hides it.";

/// One finding per (process, device) whose reserve stays fragmented under memory pressure.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &MemoryFragmentation) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &inputs.window.processes {
        let Some(points) = inputs
            .framework
            .process(p.pid)
            .and_then(|f| f.allocator_on(&p.device_uuid, inputs.on_one_device(p.pid)))
        else {
            continue;
        };
        let Some(room) = memory_room(inputs, p) else {
            continue;
        };
        let (Some(used), Some(total)) = (room.used, room.total) else {
            continue;
        };
        if total == 0 {
            continue;
        }
        let used = used + room.reserved.unwrap_or(0);
        let used_ratio = used as f64 / total as f64;
        if used_ratio < t.device_used_at_least {
            continue;
        }
        let Some(latest) = points.last() else {
            continue;
        };
        let Some(since) = latest.at.checked_sub(t.min_duration) else {
            continue;
        };
        // Every reading over the last min_duration, and one at or before its start, so the
        // gap is known to have held the whole time.
        let start = points.iter().rposition(|q| q.at <= since);
        let Some(start) = start else {
            continue;
        };
        let run = &points[start..];
        if !run.iter().all(|q| fragmented(q, t)) {
            continue;
        }
        let (Some(reserved), Some(allocated)) = (latest.reserved_bytes, latest.allocated_bytes)
        else {
            continue;
        };
        let unused = reserved.saturating_sub(allocated);
        let observed = latest
            .at
            .duration_since(run[0].at)
            .unwrap_or_default()
            .as_secs_f64();
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let summary = format!(
            "{subject}: PyTorch reserves {} but its tensors use {} ({} of the reserve unused) for {}, while the {} is {} full",
            human_bytes(reserved as f64),
            human_bytes(allocated as f64),
            pct(unused as f64 / reserved as f64),
            human_duration(observed),
            if room.instance { "MIG instance" } else { "GPU" },
            pct(used_ratio),
        );
        out.push(Finding {
            rule: RuleId::MemoryFragmentation,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values: vec![
                ("reserved_bytes".into(), Value::from(reserved)),
                ("allocated_bytes".into(), Value::from(allocated)),
                ("unused_reserved_bytes".into(), Value::from(unused)),
                (
                    "unused_reserved_ratio".into(),
                    Value::from(unused as f64 / reserved as f64),
                ),
                ("device_memory_used_ratio".into(), Value::from(used_ratio)),
                ("observed_seconds".into(), Value::from(observed)),
            ],
            since: run[0].at,
            evidence: vec![Layer::Nvml, Layer::Metrics],
        });
    }
    out
}

fn fragmented(point: &AllocatorPoint, t: &MemoryFragmentation) -> bool {
    let (Some(reserved), Some(allocated)) = (point.reserved_bytes, point.allocated_bytes) else {
        return false;
    };
    let unused = reserved.saturating_sub(allocated);
    reserved > 0
        && unused >= t.unused_reserved_bytes_at_least
        && unused as f64 >= t.unused_reserved_ratio_at_least * reserved as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::framework::ProcessEvidence;
    use crate::diagnosis::rules::testkit::*;

    /// A device `device_used` full, the process with allocator readings every 30 s for 5 min.
    fn fixture(device_used: u64, reading: impl Fn(u64) -> (u64, u64)) -> Fixture {
        let w = window(
            300,
            vec![device(0, 0.9, device_used)],
            vec![process(9, 0, device_used - GIB, Some(0.8))],
        );
        let mut f = Fixture::new(vec![w]);
        let points = (0..=10)
            .map(|i| {
                let (reserved, allocated) = reading(i);
                AllocatorPoint {
                    at: t(i * 30),
                    allocated_bytes: Some(allocated),
                    reserved_bytes: Some(reserved),
                    max_allocated_bytes: None,
                }
            })
            .collect();
        let mut evidence = ProcessEvidence::default();
        evidence.allocator.insert("GPU-00000000".into(), points);
        f.framework.processes.insert(9, evidence);
        f
    }

    #[test]
    fn a_large_unused_reserve_under_pressure_is_fragmentation() {
        // 76 of 80 GiB used; PyTorch reserves 72 GiB for 48 GiB of tensors (33 % unused).
        let f = fixture(76 * GIB, |_| (72 * GIB, 48 * GIB));
        let found = evaluate(&f.inputs(), &MemoryFragmentation::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let finding = &found[0];
        assert_eq!(finding.rule, RuleId::MemoryFragmentation);
        assert_eq!(
            finding.value("unused_reserved_bytes"),
            Some(&Value::from(24 * GIB))
        );
        assert!(finding.advice.contains("expandable_segments:True"));
        assert_eq!(
            finding.since,
            t(180),
            "the reading at the start of the 2 min"
        );
        assert_eq!(finding.evidence, vec![Layer::Nvml, Layer::Metrics]);
    }

    #[test]
    fn no_pressure_no_finding() {
        // The same reserve on a device with room to spare.
        let f = fixture(40 * GIB, |_| (36 * GIB, 24 * GIB));
        assert!(evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty());
    }

    #[test]
    fn a_small_or_brief_gap_is_not_fragmentation() {
        // 20 % unused: under the ratio.
        let f = fixture(76 * GIB, |_| (72 * GIB, 58 * GIB));
        assert!(evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty());
        // 30 % but only 1.5 GiB: under the byte threshold.
        let f = fixture(76 * GIB, |_| (5 * GIB, 7 * GIB / 2));
        assert!(evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty());
        // Large only for the last minute.
        let f = fixture(76 * GIB, |i| {
            if i >= 8 {
                (72 * GIB, 48 * GIB)
            } else {
                (72 * GIB, 70 * GIB)
            }
        });
        assert!(evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty());
    }

    #[test]
    fn without_allocator_gauges_nothing_is_said() {
        let w = window(
            300,
            vec![device(0, 0.9, 79 * GIB)],
            vec![process(9, 0, 78 * GIB, Some(0.8))],
        );
        let f = Fixture::new(vec![w]);
        assert!(evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty());
    }
}
