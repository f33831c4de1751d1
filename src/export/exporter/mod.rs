//! The export half of `gpulse run` and `gpulse record`, in one place: the node's identity, the
//! delivery queue and its sender task (a lane per signal, over the transports the sinks choose),
//! gpulse's own health riding in each window's metrics request, and the bounded flush at exit.
//! Each analysed window becomes one metrics request and, when findings started or cleared, one
//! logs request; nothing here waits on the network except [`Exporter::shutdown`], and only up to
//! the bound it is given. The receivers' intake pushes the telemetry it forwards into the same
//! queue ([`Exporter::queue`]), so one byte budget and one retry policy cover everything.

mod self_health;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::otlp::ExporterKind;
use crate::config::{ExportSettings, SignalSinks, Sink};
use crate::export::logs::{findings_request, log_record_count};
use crate::export::metrics::{
    metrics_batch_cached, EncodeCache, Extremes, MetricsBatch, ProcessResources,
};
use crate::export::queue::{
    BackoffPolicy, Count, DeliveryQueue, FlushReport, QueueHandle, QueueLimits, QueueStats,
};
use crate::export::resource::{host_name, NodeIdentity};
use crate::export::telemetry::{ReceiverCounters, SelfTelemetry};
use crate::export::transport::{EncodedRequest, Signal, SignalTransports, TransportBuildError};
use crate::pipeline::{Analysis, SamplerHealth, ViewReceiver};
use crate::schema::MetricSwitches;

/// The running export: built once at start, fed one [`Analysis`] per window.
pub struct Exporter {
    node: NodeIdentity,
    queue: QueueHandle,
    sender: tokio::task::JoinHandle<FlushReport>,
    /// gpulse's own health metrics, on the OTel SDK, collected into each window's request.
    telemetry: SelfTelemetry,
    /// What the OTLP receiver accepted and refused, counted by its intake.
    receiver: Arc<ReceiverCounters>,
    /// The process resources of the last window, encoded: reused while a process stays.
    resources: ProcessResources,
    /// The encoder's state between windows: unchanged attribute lists stay encoded.
    encoder: EncodeCache,
    /// Whether gauges carry `.max`/`.min`: fixed by the sample and export intervals.
    extremes: Extremes,
    /// The metrics switched on and off (`[metrics]`).
    switches: MetricSwitches,
    /// Where gpulse's own metrics and findings go; an `Off` signal is never built nor queued.
    sinks: SignalSinks,
    /// The signals no transport carries: the receivers' intake must not queue them.
    not_forwarded: Vec<Signal>,
    /// Where the lanes that carry something send to, for people reading the outcome.
    destinations: Vec<String>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("sinks", &self.sinks)
            .field("destinations", &self.destinations)
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// Builds the transports `settings.sinks` use (none at all when every sink is off: no
    /// connection is ever made), then [`Exporter::with_transports`]. `extremes`: whether the
    /// gauges carry `.max`/`.min` (`Extremes::for_intervals` of the run's intervals);
    /// `switches`: the metrics left out.
    ///
    /// # Errors
    /// [`TransportBuildError`] from an endpoint.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(
        settings: &ExportSettings,
        (extremes, switches): (Extremes, MetricSwitches),
        sampler: Arc<SamplerHealth>,
        view: ViewReceiver,
    ) -> Result<Self, TransportBuildError> {
        let transports = SignalTransports::from_exporter(&settings.exporter, &settings.sinks)?;
        Ok(Self::with_transports(
            settings,
            (extremes, switches),
            transports,
            sampler,
            view,
        ))
    }

    /// Starts the queue's sender over `transports` (built from the same `settings`, earlier: a
    /// caller that must refuse a bad endpoint before anything else starts builds them first),
    /// and the self-telemetry that reads the sampler's counters and the analyzer's latest view.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn with_transports(
        settings: &ExportSettings,
        (extremes, switches): (Extremes, MetricSwitches),
        transports: SignalTransports,
        sampler: Arc<SamplerHealth>,
        view: ViewReceiver,
    ) -> Self {
        let node = node_identity(settings);
        let not_forwarded: Vec<Signal> = [Signal::Metrics, Signal::Logs, Signal::Traces]
            .into_iter()
            .filter(|signal| !transports.carries(*signal))
            .collect();
        let destinations = destinations(&settings.exporter, &settings.sinks);
        let (queue, sender) =
            DeliveryQueue::new(queue_limits(settings), BackoffPolicy::default(), transports);
        let sender = tokio::spawn(sender.run());
        let receiver = Arc::new(ReceiverCounters::default());
        let telemetry = SelfTelemetry::start(
            &node,
            self_health::reader(queue.clone(), sampler, view, Arc::clone(&receiver)),
        );
        Self {
            node,
            queue,
            receiver,
            sender,
            telemetry,
            resources: ProcessResources::new(),
            encoder: EncodeCache::new(),
            extremes,
            switches,
            sinks: settings.sinks,
            not_forwarded,
            destinations,
        }
    }

    /// The node resource every request carries.
    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    /// The queue, for the receivers' intake to forward into.
    pub fn queue(&self) -> &QueueHandle {
        &self.queue
    }

    /// The OTLP receiver's counters, exported with the health once a receiver attaches.
    pub fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        &self.receiver
    }

    /// The signals no transport carries (pass to `Intake::without_forwarding`).
    pub fn not_forwarded(&self) -> &[Signal] {
        &self.not_forwarded
    }

    /// Whether anything at all leaves gpulse through the queue.
    pub fn sends_anything(&self) -> bool {
        self.not_forwarded.len() < 3
    }

    /// Queues the window's metrics request (gpulse's own health included, alone when the window
    /// had no sample) and, when findings started or cleared, its logs request. Never waits on
    /// the network.
    pub fn export(&mut self, analysis: Option<&Analysis>) {
        if self.sinks.metrics != Sink::Off {
            self.export_metrics(analysis);
        }
        if let Some(analysis) = analysis.filter(|a| !a.events.is_empty()) {
            if self.sinks.logs != Sink::Off {
                let request = findings_request(&self.node, &analysis.events, &analysis.attributed);
                let records = log_record_count(&request) as u64;
                self.queue.push(
                    Signal::Logs,
                    EncodedRequest::from_message(&request, records),
                );
            }
        }
    }

    fn export_metrics(&mut self, analysis: Option<&Analysis>) {
        let batch = match analysis {
            Some(a) => metrics_batch_cached(
                &a.attributed,
                &a.training,
                &self.node,
                &mut self.resources,
                self.extremes,
                &self.switches,
            ),
            None => MetricsBatch::default(),
        };
        // One metrics request per export interval: gpulse's own health rides in it.
        let (body, points) = self.telemetry.window_request(&batch, &mut self.encoder);
        if points > 0 {
            // The queue itself logs (rate-limited) when its bound makes it drop.
            self.queue
                .push(Signal::Metrics, EncodedRequest::new(body, points));
        }
    }

    /// Gives the queue up to `bound` to deliver what it holds, then stops the sender. Call it
    /// after the last [`Exporter::export`] and after the receivers stopped.
    pub async fn shutdown(self, bound: Duration) -> ExportOutcome {
        self.telemetry.shutdown();
        let flush = self.queue.flush(Instant::now() + bound).await;
        self.sender.abort();
        ExportOutcome {
            flush,
            stats: self.queue.stats(),
            bound,
            destinations: self.destinations,
        }
    }
}

/// What became of everything queued, read once the sender stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOutcome {
    /// Delivered during the flush, and still queued (now lost) when it ended.
    pub flush: FlushReport,
    /// The queue's totals since start.
    pub stats: QueueStats,
    /// The flush's bound.
    pub bound: Duration,
    /// Where the lanes sent to.
    pub destinations: Vec<String>,
}

impl ExportOutcome {
    /// Requests that never reached a backend: dropped on the way (over the byte bound, expired,
    /// refused for good, pushed after shutdown began) or still queued when the flush ended.
    pub fn lost(&self) -> Count {
        let s = &self.stats;
        [
            s.dropped_overflow,
            s.dropped_expired,
            s.dropped_rejected,
            s.dropped_closed,
            self.flush.undelivered,
        ]
        .into_iter()
        .fold(Count::default(), |total, c| Count {
            requests: total.requests + c.requests,
            points: total.points + c.points,
        })
    }

    /// For people, one line when everything was delivered; else what was lost, where to, why,
    /// and what to check, over a few lines (no indentation: the caller indents).
    pub fn describe(&self) -> String {
        let to = origins(&self.destinations);
        let delivered = self.stats.delivered;
        let lost = self.lost();
        if lost.requests == 0 {
            return format!(
                "export: {} delivered to {to}",
                requests(delivered.requests, delivered.points)
            );
        }
        let s = &self.stats;
        let mut why = Vec::new();
        if self.flush.undelivered.requests > 0 {
            why.push(format!(
                "{} still queued when the {:?} flush bound ran out",
                self.flush.undelivered.requests, self.bound
            ));
        }
        for (count, what) in [
            (s.dropped_rejected, "refused by the backend for good"),
            (s.dropped_expired, "older than the queue's max age"),
            (s.dropped_overflow, "over the queue's byte bound"),
            (s.dropped_closed, "queued after shutdown began"),
        ] {
            if count.requests > 0 {
                why.push(format!("{} {what}", count.requests));
            }
        }
        let delivered = match delivered.requests {
            0 => "nothing was delivered".to_string(),
            _ => format!(
                "{} were delivered",
                requests(delivered.requests, delivered.points)
            ),
        };
        let failures = match failures(&s.failures) {
            f if f.is_empty() => String::new(),
            f => format!("failed attempts: {f}; "),
        };
        format!(
            "export FAILED: {} NOT delivered to {to}\n({}); {delivered}.\n{failures}check that \
             the collector is up and reachable there (--otlp-endpoint, \
             OTEL_EXPORTER_OTLP_ENDPOINT)",
            requests(lost.requests, lost.points),
            why.join("; "),
        )
    }
}

/// The destinations' origins (`http://host:port`), each once: the signals' paths would only
/// repeat the address the reader must check.
fn origins(destinations: &[String]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for url in destinations {
        let origin = match url.find("://") {
            Some(scheme) => url[scheme + 3..]
                .find('/')
                .map_or(url.as_str(), |path| &url[..scheme + 3 + path]),
            None => url.as_str(),
        };
        if !out.contains(&origin) {
            out.push(origin);
        }
    }
    match out.as_slice() {
        [] => "nowhere".to_string(),
        many => many.join(", "),
    }
}

fn requests(requests: u64, items: u64) -> String {
    let plural = if requests == 1 { "" } else { "s" };
    format!("{requests} request{plural} ({items} data points, log records or spans)")
}

/// `connect ×4, timeout ×1`.
fn failures(by_reason: &BTreeMap<crate::export::transport::FailureReason, u64>) -> String {
    by_reason
        .iter()
        .map(|(reason, n)| format!("{reason} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn queue_limits(settings: &ExportSettings) -> QueueLimits {
    QueueLimits {
        max_bytes: usize::try_from(settings.queue.max_bytes).unwrap_or(usize::MAX),
        max_age: settings.queue.max_age,
    }
}

/// The URLs of the lanes that carry something (`stdout` for the console exporter), each once.
fn destinations(kind: &ExporterKind, sinks: &SignalSinks) -> Vec<String> {
    let lanes = [
        (sinks.metrics_lane(), Signal::Metrics),
        (sinks.logs_lane(), Signal::Logs),
        (sinks.traces_lane(), Signal::Traces),
    ];
    let mut out: Vec<String> = Vec::new();
    for (sink, signal) in lanes {
        let to = match (sink, kind) {
            (Sink::Stdout, _) => "stdout".to_string(),
            (
                Sink::Otlp,
                ExporterKind::Otlp {
                    metrics,
                    logs,
                    traces,
                },
            ) => match signal {
                Signal::Metrics => metrics.url.clone(),
                Signal::Logs => logs.url.clone(),
                Signal::Traces => traces.url.clone(),
            },
            _ => continue,
        };
        if !out.contains(&to) {
            out.push(to);
        }
    }
    out
}

/// The node resource: the resolved service name and resource attributes, this host's name, a
/// fresh `service.instance.id`, and `k8s.node.name` from the Downward API when given.
fn node_identity(settings: &ExportSettings) -> NodeIdentity {
    let instance = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    NodeIdentity::resolve(
        settings.service_name.clone(),
        &settings.resource_attributes,
        host_name(),
        instance,
        settings.node_name.clone(),
    )
}
