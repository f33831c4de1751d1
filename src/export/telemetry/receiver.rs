//! The OTLP receiver's counters (`gpulse.receiver.*`): shared by the receivers' intake, which
//! counts, and the self-telemetry, which reads them once per collection. They live here, below
//! the receivers, so that the exporter can read them without depending on `crate::enrich`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The OTLP receiver's counters as one reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverReading {
    pub spans_total: u64,
    /// Refused requests by reason (`error.type`).
    pub refused_total: BTreeMap<String, u64>,
}

/// The OTLP receiver's counters, shared by its intake (which counts) and the self-telemetry
/// (which reads them). They describe the receiver, so they live here, below it.
#[derive(Debug, Default)]
pub struct ReceiverCounters {
    /// Set when a receiver forwards through this exporter: only then are they exported.
    in_use: AtomicBool,
    spans: AtomicU64,
    refused_queue_full: AtomicU64,
    refused_malformed: AtomicU64,
    refused_shutting_down: AtomicU64,
}

/// Why the receiver refused a request, as `error.type` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    QueueFull,
    Malformed,
    ShuttingDown,
}

impl ReceiverCounters {
    pub fn attach(&self) {
        self.in_use.store(true, Ordering::Relaxed);
    }

    pub fn accepted_spans(&self, spans: u64) {
        self.spans.fetch_add(spans, Ordering::Relaxed);
    }

    pub fn refused(&self, why: Refusal) {
        match why {
            Refusal::QueueFull => &self.refused_queue_full,
            Refusal::Malformed => &self.refused_malformed,
            Refusal::ShuttingDown => &self.refused_shutting_down,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// The reading, or `None` while no receiver is attached.
    pub fn read(&self) -> Option<ReceiverReading> {
        if !self.in_use.load(Ordering::Relaxed) {
            return None;
        }
        let refused_total = [
            ("queue_full", &self.refused_queue_full),
            ("malformed", &self.refused_malformed),
            ("shutting_down", &self.refused_shutting_down),
        ]
        .into_iter()
        .map(|(why, n)| (why.to_string(), n.load(Ordering::Relaxed)))
        .collect();
        Some(ReceiverReading {
            spans_total: self.spans.load(Ordering::Relaxed),
            refused_total,
        })
    }
}
