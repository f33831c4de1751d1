//! The window loop `gpulse run`, `gpulse record` and `gpulse top` share: fed every snapshot,
//! asked for the closed window once per export interval (or refresh, for `top`), it answers
//! with the [`Analysis`] of that window and publishes its [`View`](super::View).
//!
//! ```text
//! Snapshot ──▶ receivers' history (span enrichment)
//!          └─▶ WindowAggregator ──take──▶ Analyzer (attribution + diagnosis, framework evidence)
//!                                           ──▶ Analysis, View ──▶ history learns the identities
//! ```
//!
//! It owns the one place where what the applications send through the local OTLP receiver
//! meets the attributed window: the receivers' intake (built here, by [`WindowLoop::start_receivers`])
//! writes the framework evidence the analyzer reads at [`WindowLoop::close_window`], and the
//! attributed window's identities go back into the receivers' history for span enrichment.
//! Each command keeps only its own select loop and its sinks (the exporter, the recorder, the
//! live view).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::analyzer::{Analysis, Analyzer};
use super::view::ViewReceiver;
use crate::config::ReceiverSettings;
use crate::enrich::{
    HistoryHandle, Intake, IntakeSettings, ReceiverError, Receivers, SpanObserver,
};
use crate::export::queue::QueueHandle;
use crate::export::transport::Signal;
use crate::sampling::{Snapshot, WindowAggregator};

/// Snapshots in, analysed windows out, with the state kept between windows.
pub struct WindowLoop {
    aggregator: WindowAggregator,
    analyzer: Analyzer,
    /// The local OTLP receivers, once started: their history takes every snapshot and the
    /// identities of every attributed window.
    receivers: Option<Receivers>,
}

/// How the receivers' intake is built: what `run`, `record` and `top` tell apart.
#[derive(Debug)]
pub struct IntakePlan {
    /// The addresses to listen on and how far back the history reaches.
    pub receiver: ReceiverSettings,
    /// The sample interval: the history's resolution, and how long a span ending after the
    /// newest sample waits for the next one.
    pub sample_interval: Duration,
    /// Where the senders' `/proc` entries are read.
    pub proc_root: PathBuf,
    /// Where accepted telemetry goes upstream; `None` forwards nothing (`top`).
    pub upstream: Option<Upstream>,
    /// Handed every accepted trace request (`record`'s report).
    pub span_observer: Option<SpanObserver>,
}

/// The delivery queue the intake forwards into, shared with gpulse's own telemetry.
#[derive(Debug)]
pub struct Upstream {
    pub queue: QueueHandle,
    /// The queue's byte bound: the intake refuses rather than evicts.
    pub max_queue_bytes: usize,
    /// The signals no transport carries: accepted for diagnosis, never queued.
    pub not_forwarded: Vec<Signal>,
}

impl WindowLoop {
    pub fn new(analyzer: Analyzer) -> Self {
        Self {
            aggregator: WindowAggregator::new(),
            analyzer,
            receivers: None,
        }
    }

    /// A receiver of every future [`View`](super::View) (and the current one, if any).
    pub fn subscribe(&self) -> ViewReceiver {
        self.analyzer.subscribe()
    }

    /// Builds the receivers' intake as `plan` says (with the analyzer's framework history, so
    /// that the rules see what the applications send) and starts listening.
    ///
    /// # Errors
    /// [`ReceiverError::Bind`] when an address cannot be bound; the loop then runs without
    /// receivers.
    pub async fn start_receivers(&mut self, plan: IntakePlan) -> Result<(), ReceiverError> {
        let history = HistoryHandle::new(plan.receiver.history, plan.sample_interval);
        let max_queue_bytes = plan.upstream.as_ref().map_or(0, |up| up.max_queue_bytes);
        let settings = IntakeSettings {
            proc_root: plan.proc_root,
            max_queue_bytes,
            max_wait: plan.sample_interval,
        };
        let mut intake = match plan.upstream {
            Some(upstream) => Intake::new(upstream.queue, history, settings)
                .without_forwarding(&upstream.not_forwarded),
            None => Intake::local(history, settings),
        }
        .with_framework(self.analyzer.framework());
        if let Some(observer) = plan.span_observer {
            intake = intake.with_span_observer(observer);
        }
        let receivers =
            Receivers::start(plan.receiver.grpc, plan.receiver.http, Arc::new(intake)).await?;
        self.receivers = Some(receivers);
        Ok(())
    }

    /// Stops accepting; what the intake already queued is delivered by the queue's flush.
    pub fn stop_receivers(&self) {
        if let Some(receivers) = &self.receivers {
            receivers.stop();
        }
    }

    /// Adds a snapshot to the receivers' history and to the open window.
    pub fn add(&mut self, snapshot: &Snapshot) {
        if let Some(receivers) = &self.receivers {
            receivers.intake.history().record(snapshot);
        }
        self.aggregator.add(snapshot);
    }

    /// Closes the open window, analyses it (publishing its view) and gives the receivers'
    /// history the identities attribution found. `None` when no snapshot came since the last.
    pub fn close_window(&mut self) -> Option<Analysis> {
        let window = self.aggregator.take()?;
        let analysis = self.analyzer.analyze(window);
        if let Some(receivers) = &self.receivers {
            receivers.intake.history().note_window(&analysis.attributed);
        }
        Some(analysis)
    }
}
