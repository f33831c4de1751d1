//! The local OTLP receivers of `run`, `record` and `top` (`--otlp-receiver-grpc/-http`), started
//! in one place: the intake is built from an [`IntakePlan`] (what the three commands tell apart:
//! forwarding through the exporter's queue or not, `record`'s span observer), writes the
//! framework evidence of the [`WindowLoop`]'s analyzer, and its history becomes the loop's
//! observer, so that every snapshot and every attributed window reach it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::attribution::AttributedWindow;
use crate::config::{Config, ReceiverSettings};
use crate::enrich::{
    Intake, IntakeSettings, ReceiverError, Receivers, SampleHistoryHandle, SpanObserver,
};
use crate::export::queue::QueueHandle;
use crate::export::telemetry::ReceiverCounters;
use crate::export::transport::Signal;
use crate::export::Exporter;
use crate::pipeline::{WindowLoop, WindowObserver};
use crate::sampling::Snapshot;

/// How the receivers' intake is built: what `run`, `record` and `top` tell apart.
#[derive(Debug)]
pub(crate) struct IntakePlan {
    /// The addresses to listen on and how far back the history reaches.
    receiver: ReceiverSettings,
    /// The sample interval: the history's resolution, and how long a span ending after the
    /// newest sample waits for the next one.
    sample_interval: Duration,
    /// Where the senders' `/proc` entries are read.
    proc_root: PathBuf,
    /// Forwards accepted telemetry through the exporter's queue; `None` forwards nothing.
    upstream: Option<Upstream>,
    /// Handed every accepted trace request (`record`'s report).
    span_observer: Option<SpanObserver>,
}

/// The exporter's delivery queue, shared by gpulse's own telemetry and what the intake forwards.
#[derive(Debug)]
struct Upstream {
    queue: QueueHandle,
    /// The part of the queue's byte bound the intake may fill: it refuses rather than evicts.
    max_queue_bytes: usize,
    /// The signals no transport carries: accepted for diagnosis, never queued.
    not_forwarded: Vec<Signal>,
    /// Where the intake counts what it accepts and refuses, for gpulse's own metrics.
    counters: Arc<ReceiverCounters>,
}

impl IntakePlan {
    /// `run`'s and `record`'s intake: what it accepts is enriched, feeds the framework evidence,
    /// and is forwarded through `exporter`'s queue when a transport carries its signal.
    pub(crate) fn forwarding(
        config: &Config,
        exporter: &Exporter,
        span_observer: Option<SpanObserver>,
    ) -> Self {
        Self {
            receiver: config.otlp_receiver,
            sample_interval: config.sample_interval,
            proc_root: config.common.analysis.proc_root.clone(),
            upstream: Some(Upstream {
                queue: exporter.queue().clone(),
                max_queue_bytes: forwarding_share(
                    usize::try_from(config.export.queue.max_bytes).unwrap_or(usize::MAX),
                ),
                not_forwarded: exporter.not_forwarded().to_vec(),
                counters: Arc::clone(exporter.receiver_counters()),
            }),
            span_observer,
        }
    }

    /// `top`'s intake: it keeps the framework telemetry of the GPU processes for the rules and
    /// forwards nothing (top exports nothing).
    pub(crate) fn local(
        receiver: ReceiverSettings,
        sample_interval: Duration,
        proc_root: PathBuf,
    ) -> Self {
        Self {
            receiver,
            sample_interval,
            proc_root,
            upstream: None,
            span_observer: None,
        }
    }
}

/// The part of the queue's byte bound the intake fills before it refuses: three quarters. The
/// rest is gpulse's own telemetry's during an outage, so that its windows, pushed every export
/// interval, find room (and push out their own oldest) instead of pushing out spans the
/// receiver has already accepted.
fn forwarding_share(max_queue_bytes: usize) -> usize {
    max_queue_bytes / 4 * 3
}

/// Builds the intake as `plan` says, starts listening, and makes the receivers' history the
/// observer of `windows`.
///
/// # Errors
/// [`ReceiverError::Bind`] when an address cannot be bound; `windows` then has no observer.
pub(crate) async fn start(
    plan: IntakePlan,
    windows: &mut WindowLoop,
) -> Result<Receivers, ReceiverError> {
    let history = SampleHistoryHandle::new(plan.receiver.history, plan.sample_interval);
    let max_queue_bytes = plan.upstream.as_ref().map_or(0, |up| up.max_queue_bytes);
    let settings = IntakeSettings {
        proc_root: plan.proc_root,
        max_queue_bytes,
        max_wait: plan.sample_interval,
    };
    let mut intake = match plan.upstream {
        Some(upstream) => Intake::new(upstream.queue, history, settings)
            .without_forwarding(&upstream.not_forwarded)
            .counted_in(upstream.counters),
        None => Intake::local(history, settings),
    }
    .with_framework(windows.framework());
    if let Some(observer) = plan.span_observer {
        intake = intake.with_span_observer(observer);
    }
    let receivers =
        Receivers::start(plan.receiver.grpc, plan.receiver.http, Arc::new(intake)).await?;
    windows.observe(receivers.intake.history().clone());
    Ok(receivers)
}

/// The receivers' history learns each snapshot (spans are enriched from it) and the identities
/// of each attributed window (which process a span's resource names).
impl WindowObserver for SampleHistoryHandle {
    fn snapshot(&self, snapshot: &Snapshot) {
        self.record(snapshot);
    }

    fn window(&self, attributed: &AttributedWindow) {
        self.note_window(attributed);
    }
}
