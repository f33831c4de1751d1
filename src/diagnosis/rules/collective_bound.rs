//! `collective_bound`: every rank of a job spends a large share of each step in collectives and
//! no rank holds the others back: the communication itself (the interconnect, the collective's
//! size or frequency) sets the pace, not a straggler.
//!
//! Read from the same per-rank evidence as `rank_straggler` (ranks of one job on this node, by the
//! companion's `pytorch.distributed.job.id`): the lowest rank's collective wait share is at least
//! `wait_ratio_at_least`, and `rank_straggler` with its own thresholds finds no straggler among
//! them. The finding is on the job, and quotes the NVLink or PCIe traffic gpulse reads on the
//! ranks' GPUs this window, so the reader sees whether the links are busy (bandwidth-bound) or
//! quiet (latency-bound, or the wait is on another node's ranks).

use crate::config::thresholds::{CollectiveBound, RankStraggler};
use crate::diagnosis::findings::{
    human_bytes, pct, DeviceRef, Finding, JobKey, Layer, RuleId, Severity, Subject, Value,
};
use crate::diagnosis::history::InterconnectTraffic;

use super::rank_straggler::{jobs, median, straggler};
use super::{process_device_ref, Inputs};

const ADVICE: &str = "Every rank spends much of each step in collectives and none holds the \
others back: communication sets the pace. Overlap it with compute (DDP bucket_cap_mb, \
gradient_as_bucket_view=True; FSDP prefetch), communicate less often (gradient accumulation \
under no_sync()), send less (bf16 gradients: DDP's bf16_compress_hook; a larger per-GPU batch so \
each byte carries more compute). If the NVLink/PCIe traffic below is near what the links carry, \
check the placement (`nvidia-smi topo -m`, NCCL_DEBUG=INFO for the transport NCCL chose); if it \
is low, the wait is latency or other nodes' ranks: look at the job's ranks on the other nodes \
(their step spans in your tracing backend).";

/// One finding per job whose ranks all wait in collectives without a straggler.
pub(crate) fn evaluate(
    inputs: &Inputs<'_>,
    t: &CollectiveBound,
    straggler_thresholds: &RankStraggler,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (job, ranks) in jobs(inputs, t.min_steps, t.min_duration) {
        let ratios: Vec<f64> = ranks
            .iter()
            .filter_map(|r| r.steps.collective_wait_ratio())
            .collect();
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        if ratios.len() != ranks.len() || lowest < t.wait_ratio_at_least {
            continue;
        }
        if straggler(&ranks, straggler_thresholds).is_some() {
            continue;
        }
        let mut pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
        pids.sort_unstable();
        let mut devices: Vec<DeviceRef> = ranks
            .iter()
            .flat_map(|r| r.processes.iter().map(|p| process_device_ref(p)))
            .collect();
        devices.sort_by_key(|d| d.index);
        devices.dedup();
        let mut values = vec![
            ("job_id".to_string(), Value::from(job)),
            (
                "ranks_compared".to_string(),
                Value::from(ranks.len() as u64),
            ),
            ("collective_wait_ratio_min".to_string(), Value::from(lowest)),
            (
                "collective_wait_ratio_median".to_string(),
                Value::from(median(ratios.clone())),
            ),
            (
                "step_seconds_median".to_string(),
                Value::from(median(
                    ranks.iter().map(|r| r.steps.step_seconds_mean).collect(),
                )),
            ),
            (
                "collective_wait_seconds_median".to_string(),
                Value::from(median(ranks.iter().map(|r| r.wait).collect())),
            ),
        ];
        let mut links = Vec::new();
        for d in &devices {
            let Some(traffic) = inputs.device(&d.uuid).and_then(InterconnectTraffic::of) else {
                continue;
            };
            values.push((
                format!(
                    "gpu_{}_{}_bytes_per_second",
                    d.index,
                    traffic.interconnect.as_str()
                ),
                Value::from(traffic.bytes_per_second),
            ));
            links.push(format!(
                "GPU {} {} {}/s",
                d.index,
                traffic.interconnect.as_str(),
                human_bytes(traffic.bytes_per_second)
            ));
        }
        let mut evidence = vec![Layer::Spans];
        if !links.is_empty() {
            evidence.push(Layer::Nvml);
        }
        let traffic = if links.is_empty() {
            "gpulse read no interconnect traffic on their GPUs".to_string()
        } else {
            links.join(", ")
        };
        let subject = Subject::Job {
            key: JobKey::Distributed(job.to_string()),
            pids,
            devices,
        };
        let summary = format!(
            "job {job}'s {} ranks on this node spend {}–{} of each step in collectives with no \
             straggler: communication sets the pace ({traffic})",
            ranks.len(),
            pct(lowest),
            pct(ratios.iter().copied().fold(0.0, f64::max)),
        );
        out.push(Finding {
            rule: RuleId::CollectiveBound,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since: inputs.window.start,
            evidence,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::rank_straggler::tests::{job, rank_evidence};

    #[test]
    fn every_rank_waiting_without_a_straggler_is_collective_bound() {
        let mut f = job(None, 0.0, 0.0);
        for r in 0..4u32 {
            f.framework
                .processes
                .insert(100 + r, rank_evidence(r, "j", 0.5, 0.25, 0.01));
        }
        let found = evaluate(
            &f.inputs(),
            &CollectiveBound::default(),
            &RankStraggler::default(),
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        let finding = &found[0];
        assert!(
            matches!(&finding.subject, Subject::Job { key: JobKey::Distributed(j), pids, devices } if j == "j" && pids.len() == 4 && devices.len() == 4)
        );
        assert_eq!(
            finding.value("collective_wait_ratio_min"),
            Some(&Value::Float(0.5))
        );
        assert!(finding.summary.contains("50%"), "{}", finding.summary);
    }

    #[test]
    fn a_straggler_or_little_waiting_is_not_collective_bound() {
        // The others wait a lot, but because rank 2 is slow: rank_straggler's business.
        let f = job(Some(2), 0.3, 0.3);
        let t = CollectiveBound {
            wait_ratio_at_least: 0.0,
            ..Default::default()
        };
        assert!(evaluate(&f.inputs(), &t, &RankStraggler::default()).is_empty());
        let f = job(None, 0.0, 0.0);
        assert!(evaluate(
            &f.inputs(),
            &CollectiveBound::default(),
            &RankStraggler::default()
        )
        .is_empty());
    }
}
