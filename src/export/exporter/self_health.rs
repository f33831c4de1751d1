//! Where gpulse's own health numbers come from: the delivery queue's stats, the sampler
//! thread's counters and the analyzer's latest `View`, gathered into one
//! `telemetry::HealthReading` each time the self-telemetry collects.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::diagnosis::RuleId;
use crate::export::queue::QueueHandle;
use crate::export::telemetry::{HealthReading, HealthSource, ReceiverCounters};
use crate::pipeline::SamplerHealth;
use crate::pipeline::ViewReceiver;

/// The closure `SelfTelemetry` calls once per collection.
pub(super) fn reader(
    queue: QueueHandle,
    sampler: Arc<SamplerHealth>,
    view: ViewReceiver,
    receiver: Arc<ReceiverCounters>,
) -> HealthSource {
    Box::new(move || read(&queue, &sampler, &view, &receiver))
}

fn read(
    queue: &QueueHandle,
    sampler: &SamplerHealth,
    view: &ViewReceiver,
    receiver: &ReceiverCounters,
) -> HealthReading {
    let stats = queue.stats();
    let durations = sampler.take_durations();
    let mut findings_active: BTreeMap<String, u64> = RuleId::ALL
        .iter()
        .map(|rule| (rule.as_str().to_string(), 0))
        .collect();
    if let Some(view) = view.borrow().as_ref() {
        for finding in &view.findings {
            *findings_active
                .entry(finding.rule.as_str().to_string())
                .or_default() += 1;
        }
    }
    HealthReading {
        queue_requests: stats.depth as u64,
        queue_bytes: stats.bytes as u64,
        dropped_requests_total: stats.dropped_overflow.requests
            + stats.dropped_expired.requests
            + stats.dropped_rejected.requests,
        dropped_points_total: stats.dropped_overflow.points
            + stats.dropped_expired.points
            + stats.dropped_rejected.points,
        export_failures_total: stats
            .failures
            .iter()
            .map(|(reason, count)| (reason.to_string(), *count))
            .collect(),
        export_duration_last_seconds: stats.last_export_latency.map(|d| d.as_secs_f64()),
        sample_duration_mean_seconds: (!durations.is_empty())
            .then(|| durations.iter().sum::<f64>() / durations.len() as f64),
        sample_duration_max_seconds: durations.iter().copied().reduce(f64::max),
        nvml_errors_total: sampler.nvml_errors(),
        stalled_ticks_total: sampler.stalled_ticks.load(Ordering::Relaxed),
        findings_active,
        receiver: receiver.read(),
    }
}
