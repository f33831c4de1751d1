//! What both receivers do with one export request, whatever carried it: check that it is OTLP
//! protobuf, enrich its spans, and put it in gpulse's own delivery queue, so that it goes
//! upstream over the same connection, with the same retry and bounds, as gpulse's metrics.
//!
//! ## Contract toward the sending application
//! - Accepted means queued, or about to be: delivery is then gpulse's business (at least once,
//!   oldest first, the queue's age and byte bounds). A span that ends after the newest GPU
//!   sample needs the next one (at most one sample interval away) to be enriched: its request is
//!   answered at once and queued when that sample is in ([`Intake::settle`] waits for those at
//!   shutdown), so the application never waits on gpulse's sampling. Its bytes are reserved in
//!   the bound meanwhile. A partial success upstream is logged by the queue; the application has
//!   already been answered.
//! - Nothing is dropped because enrichment could not be done: a span of a process gpulse does
//!   not know, or older than the history, goes on unchanged. A request in which no span was
//!   enriched is forwarded as the very bytes received (prost does not keep unknown fields, so
//!   a re-encoded request could lose fields of a newer OTLP version); one with enriched spans is
//!   re-encoded, every known field kept.
//! - Malformed (not protobuf of the signal's request): refused with a message, never retried.
//! - Queue full (accepting would push out queued data): refused with a retry hint
//!   ([`RETRY_AFTER`]), so the application's SDK keeps the data and tries again, instead of gpulse
//!   dropping older data to make room.
//! - Shutting down: refused as unavailable, retryable.
//!
//! ## Without a queue
//! [`Intake::local`] has no export queue (`gpulse top`, which exports nothing): every request is
//! checked and its framework telemetry kept for diagnosis, then accepted and dropped, spans not
//! enriched. The application is answered as by any receiver, so its SDK does not retry.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

use super::identity::{identify_new, match_resource, Match, ResourceKey};
use super::peer::{resolve_peer, PeerCache};
use super::sample_history::SampleHistoryHandle;
use super::span_attributes::{enrich_request, latest_end, span_count, MatchedBy, ResourcePids};
use crate::diagnosis::framework::FrameworkHandle;
use crate::export::logs::log_record_count;
use crate::export::metrics::data_point_count;
use crate::export::queue::QueueHandle;
use crate::export::telemetry::{ReceiverCounters, Refusal};
use crate::export::transport::WarnLimiter;
use crate::export::transport::{EncodedRequest, Signal};

/// Blocking-pool threads enriching the requests that waited for a sample, at most.
const ENRICH_THREADS: usize = 2;

/// The retry hint sent with a "queue full" refusal.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The connection a request came over, for finding its sender when the resource does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Our end (the receiver's address).
    pub local: SocketAddr,
    /// The application's end.
    pub remote: SocketAddr,
}

/// Why a received request was refused. The messages go back to the application's SDK, which
/// logs them, so they say what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntakeError {
    /// Not protobuf of the signal's export request.
    #[error(
        "the body is not a valid OTLP {signal} export request in protobuf ({detail}); gpulse's \
         receiver takes OTLP/gRPC or OTLP/HTTP with application/x-protobuf bodies"
    )]
    Malformed { signal: Signal, detail: String },
    /// Taking it would push older data out of gpulse's bounded queue: `queued` bytes are in it,
    /// and what the receivers forward may fill `max` of its bound (the rest is gpulse's own).
    #[error(
        "gpulse's export queue is full ({queued} bytes queued; forwarded data may fill {max}): \
         the upstream collector is unreachable or slow. Retry after {}s; raise \
         --queue-max-bytes to buffer more",
        retry_after.as_secs()
    )]
    QueueFull {
        queued: usize,
        max: usize,
        retry_after: Duration,
    },
    /// gpulse is stopping.
    #[error("gpulse is shutting down and no longer accepts data; retry against its replacement")]
    ShuttingDown,
}

/// What was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Spans, data points or log records.
    pub items: u64,
    /// Spans given GPU attributes; 0 for a request enriched after the answer (counted in
    /// [`IntakeStats::enriched_spans`] when it is queued).
    pub enriched: u64,
}

/// Counters of what the receivers took and refused.
#[derive(Debug, Default)]
pub struct IntakeStats {
    pub requests: AtomicU64,
    pub spans: AtomicU64,
    pub enriched_spans: AtomicU64,
    pub refused_malformed: AtomicU64,
    pub refused_full: AtomicU64,
}

/// Settings of the intake.
#[derive(Debug, Clone)]
pub struct IntakeSettings {
    /// Where `<pid>/status`, `net/tcp` and `<pid>/fd` are read.
    pub proc_root: PathBuf,
    /// The queue's byte bound, to refuse rather than evict.
    pub max_queue_bytes: usize,
    /// How long a span ending after the newest sample waits for the next one: one sample
    /// interval.
    pub max_wait: Duration,
}

/// Called with every trace request the intake accepts, before enrichment (`gpulse record` keeps
/// the companion's epoch, step and data-wait spans for its report).
#[derive(Clone)]
pub struct SpanObserver(pub Arc<dyn Fn(&ExportTraceServiceRequest) + Send + Sync>);

impl std::fmt::Debug for SpanObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpanObserver")
    }
}

/// The shared request handler of the gRPC and HTTP receivers.
#[derive(Debug)]
pub struct Intake {
    /// Where accepted requests go upstream; `None` for a local intake, which forwards nothing.
    queue: Option<QueueHandle>,
    history: SampleHistoryHandle,
    settings: IntakeSettings,
    peers: PeerCache,
    pub stats: IntakeStats,
    /// Where the framework's allocator gauges and step spans go for diagnosis, when set.
    framework: Option<FrameworkHandle>,
    span_observer: Option<SpanObserver>,
    /// Signals received but not forwarded, because no exporter carries them (e.g. traces in
    /// Prometheus-only mode without an explicit OTLP upstream). They still feed diagnosis.
    not_forwarded: Vec<Signal>,
    /// Trace requests answered and waiting for the next sample before they are queued, and
    /// their encoded bytes, which count against the queue's bound meanwhile.
    later: AtomicUsize,
    reserved_bytes: AtomicUsize,
    later_done: tokio::sync::Notify,
    /// Bounds the blocking-pool threads that enrich those requests: each thread would bring its
    /// own allocator arena (tens of MiB of RSS at 40 000 spans/s), and two keep up.
    enrich_slots: Arc<tokio::sync::Semaphore>,
    /// gpulse's own metrics of the receiver (`gpulse.receiver.*`), when it forwards.
    counters: Option<Arc<ReceiverCounters>>,
}

/// A trace request's way into the queue.
enum TraceIntake {
    /// Enriched (or not to be) now.
    Now(EncodedRequest, Accepted),
    /// Ends after the newest sample: answered now, enriched and queued when the next sample is
    /// in (or after the intake's `max_wait`).
    Later(Pending),
}

struct Pending {
    request: ExportTraceServiceRequest,
    pids: ResourcePids,
    end: u64,
    items: u64,
    bytes: usize,
}

impl Intake {
    pub fn new(queue: QueueHandle, history: SampleHistoryHandle, settings: IntakeSettings) -> Self {
        Self {
            queue: Some(queue),
            ..Self::local(history, settings)
        }
    }

    /// An intake with no export queue: it keeps the framework telemetry of known GPU processes
    /// (with [`Intake::with_framework`]) and forwards nothing (see the module's documentation).
    pub(crate) fn local(history: SampleHistoryHandle, settings: IntakeSettings) -> Self {
        Self {
            queue: None,
            history,
            settings,
            peers: PeerCache::default(),
            stats: IntakeStats::default(),
            framework: None,
            span_observer: None,
            not_forwarded: Vec::new(),
            later: AtomicUsize::new(0),
            reserved_bytes: AtomicUsize::new(0),
            later_done: tokio::sync::Notify::new(),
            enrich_slots: Arc::new(tokio::sync::Semaphore::new(ENRICH_THREADS)),
            counters: None,
        }
    }

    /// Also counts what is accepted and refused in `counters` (gpulse's own metrics).
    #[must_use]
    pub(crate) fn counted_in(mut self, counters: Arc<ReceiverCounters>) -> Self {
        counters.attach();
        self.counters = Some(counters);
        self
    }

    fn count_refusal(&self, why: Refusal) {
        if let Some(counters) = &self.counters {
            counters.refused(why);
        }
    }

    fn count_spans(&self, spans: u64, enriched: u64) {
        self.stats.spans.fetch_add(spans, Ordering::Relaxed);
        self.stats
            .enriched_spans
            .fetch_add(enriched, Ordering::Relaxed);
        if let Some(counters) = &self.counters {
            counters.accepted_spans(spans);
        }
    }

    /// Whether accepted requests go upstream (false for [`Intake::local`]).
    pub(crate) fn forwards(&self) -> bool {
        self.queue.is_some()
    }

    /// Also keeps the framework telemetry of known GPU processes in `framework`, for the
    /// diagnosis rules (see `enrich::framework_intake`).
    #[must_use]
    pub(crate) fn with_framework(mut self, framework: FrameworkHandle) -> Self {
        self.framework = Some(framework);
        self
    }

    /// Also hands every accepted trace request to `observer`.
    #[must_use]
    pub(crate) fn with_span_observer(mut self, observer: SpanObserver) -> Self {
        self.span_observer = Some(observer);
        self
    }

    /// Accepts `signals` without forwarding them (nothing carries them upstream), instead of
    /// queueing requests that would never leave.
    #[must_use]
    pub(crate) fn without_forwarding(mut self, signals: &[Signal]) -> Self {
        self.not_forwarded = signals.to_vec();
        self
    }

    /// How long a span ending after the newest sample waits for the next one.
    pub(crate) fn max_wait(&self) -> Duration {
        self.settings.max_wait
    }

    pub(crate) fn history(&self) -> &SampleHistoryHandle {
        &self.history
    }

    /// Checks, enriches (traces) and queues one request body (already decompressed).
    ///
    /// # Errors
    /// [`IntakeError`]: malformed, queue full, or shutting down.
    pub async fn accept(
        self: &Arc<Self>,
        signal: Signal,
        body: Bytes,
        peer: Option<Peer>,
    ) -> Result<Accepted, IntakeError> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let malformed = |e: prost::DecodeError| {
            self.stats.refused_malformed.fetch_add(1, Ordering::Relaxed);
            self.count_refusal(Refusal::Malformed);
            IntakeError::Malformed {
                signal,
                detail: e.to_string(),
            }
        };
        let (request, accepted) = match signal {
            Signal::Metrics => {
                let decoded =
                    ExportMetricsServiceRequest::decode(body.clone()).map_err(malformed)?;
                let items = data_point_count(&decoded) as u64;
                self.note_metrics(&decoded, peer).await;
                (
                    EncodedRequest::new(body, items),
                    Accepted { items, enriched: 0 },
                )
            }
            Signal::Logs => {
                let decoded = ExportLogsServiceRequest::decode(body.clone()).map_err(malformed)?;
                let items = log_record_count(&decoded) as u64;
                self.note_logs(&decoded, peer).await;
                (
                    EncodedRequest::new(body, items),
                    Accepted { items, enriched: 0 },
                )
            }
            Signal::Traces => {
                let decoded = ExportTraceServiceRequest::decode(body.clone()).map_err(malformed)?;
                match self.traces(decoded, body, peer).await {
                    TraceIntake::Now(request, accepted) => (request, accepted),
                    TraceIntake::Later(pending) => return self.enrich_later(pending),
                }
            }
        };
        if accepted.items == 0 {
            // An empty request is valid OTLP and needs no forwarding.
            return Ok(accepted);
        }
        let Some(queue) = self
            .queue
            .as_ref()
            .filter(|_| !self.not_forwarded.contains(&signal))
        else {
            return Ok(accepted);
        };
        self.push(queue, signal, request)?;
        if signal == Signal::Traces {
            self.count_spans(accepted.items, accepted.enriched);
        }
        Ok(accepted)
    }

    /// Refuses `bytes` more when they would push queued data out of the bound (counting the
    /// bytes reserved by requests waiting to be enriched).
    fn room_for(&self, queue: &QueueHandle, bytes: usize) -> Result<(), IntakeError> {
        let queued = queue
            .bytes()
            .saturating_add(self.reserved_bytes.load(Ordering::Relaxed));
        let max = self.settings.max_queue_bytes;
        if queued.saturating_add(bytes) > max {
            self.stats.refused_full.fetch_add(1, Ordering::Relaxed);
            self.count_refusal(Refusal::QueueFull);
            static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(60));
            if let Some(suppressed) = LIMIT.permit() {
                tracing::warn!(
                    queued_bytes = queued,
                    max_bytes = max,
                    refused_since_last = suppressed + 1,
                    "the OTLP receiver refuses requests: the export queue is full (the upstream \
                     is unreachable or slow); the senders' SDKs are told to retry in {}s and drop \
                     what they cannot keep; counted in gpulse.receiver.refused{{error.type=queue_full}}",
                    RETRY_AFTER.as_secs()
                );
            }
            return Err(IntakeError::QueueFull {
                queued,
                max,
                retry_after: RETRY_AFTER,
            });
        }
        Ok(())
    }

    fn push(
        &self,
        queue: &QueueHandle,
        signal: Signal,
        request: EncodedRequest,
    ) -> Result<(), IntakeError> {
        self.room_for(queue, request.len())?;
        let report = queue.push(signal, request);
        if report.queued {
            Ok(())
        } else {
            self.count_refusal(Refusal::ShuttingDown);
            Err(IntakeError::ShuttingDown)
        }
    }

    /// Answers `pending` now (after reserving its bytes in the bound) and queues it once the
    /// sample its spans need is in, so the application never waits on gpulse's sampling.
    fn enrich_later(self: &Arc<Self>, pending: Pending) -> Result<Accepted, IntakeError> {
        let Some(queue) = self.queue.clone() else {
            // `traces` defers only what is forwarded.
            return Ok(Accepted {
                items: pending.items,
                enriched: 0,
            });
        };
        self.room_for(&queue, pending.bytes)?;
        self.reserved_bytes
            .fetch_add(pending.bytes, Ordering::Relaxed);
        self.later.fetch_add(1, Ordering::AcqRel);
        let items = pending.items;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let Pending {
                mut request,
                pids,
                end,
                items,
                bytes,
            } = pending;
            me.history.wait_for_sample(end, me.settings.max_wait).await;
            // Every request that waited for this sample wakes with it: enriching and encoding
            // them all on the async workers stalled the receivers' answers for long enough that
            // an SDK's batch processor dropped spans at 40 000 spans/s (BENCHMARKS.md). On the
            // blocking pool the kernel shares the CPU with the answers instead.
            let worker = Arc::clone(&me);
            let slot = Arc::clone(&me.enrich_slots).acquire_owned().await;
            let done = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                let enriched = enrich_request(&mut request, &pids, &worker.history.read());
                let report = queue.push(
                    Signal::Traces,
                    EncodedRequest::from_message(&request, items),
                );
                (enriched, report)
            })
            .await;
            me.reserved_bytes.fetch_sub(bytes, Ordering::Relaxed);
            // A panic while enriching leaves the request unqueued: reported below as lost.
            let (enriched, report) = done.unwrap_or_default();
            if report.queued {
                me.count_spans(items, enriched);
            } else {
                tracing::warn!(
                    spans = items,
                    "gpulse stopped before a trace request it had accepted could be queued; \
                     its spans are lost"
                );
            }
            if me.later.fetch_sub(1, Ordering::AcqRel) == 1 {
                me.later_done.notify_waiters();
            }
        });
        Ok(Accepted { items, enriched: 0 })
    }

    /// Waits until every trace request answered but not yet queued is queued, at most until
    /// `deadline`; called at shutdown, after the receivers stopped and before the queue's flush.
    /// Returns how many are still waiting.
    pub(crate) async fn settle(&self, deadline: tokio::time::Instant) -> usize {
        loop {
            let done = self.later_done.notified();
            let waiting = self.later.load(Ordering::Acquire);
            if waiting == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return self.later.load(Ordering::Acquire);
            }
        }
    }

    async fn traces(
        self: &Arc<Self>,
        mut request: ExportTraceServiceRequest,
        body: Bytes,
        peer: Option<Peer>,
    ) -> TraceIntake {
        let items = span_count(&request) as u64;
        if let Some(observer) = &self.span_observer {
            (observer.0)(&request);
        }
        let unchanged = |body| {
            TraceIntake::Now(
                EncodedRequest::new(body, items),
                Accepted { items, enriched: 0 },
            )
        };
        if items == 0 || self.history.read().is_empty() {
            return unchanged(body);
        }
        let pids = self.resolve(&request, peer).await;
        if let Some(framework) = &self.framework {
            let mut framework = framework.lock();
            let resources = request.resource_spans.iter().map(|rs| rs.resource.as_ref());
            super::framework_intake::record_identities(&mut framework, resources, &pids);
            if super::framework_intake::has_framework_spans(&request) {
                super::framework_intake::record_spans(&mut framework, &request, &pids);
            }
        }
        if self.queue.is_none() || self.not_forwarded.contains(&Signal::Traces) {
            // Nothing goes upstream: enriching would be work for nobody.
            return unchanged(body);
        }
        let Some(end) = latest_end(&request, &pids) else {
            return unchanged(body);
        };
        if self
            .history
            .read()
            .newest()
            .is_some_and(|newest| newest < end)
        {
            return TraceIntake::Later(Pending {
                request,
                pids,
                end,
                items,
                bytes: body.len(),
            });
        }
        let enriched = enrich_request(&mut request, &pids, &self.history.read());
        if enriched == 0 {
            return unchanged(body);
        }
        TraceIntake::Now(
            EncodedRequest::from_message(&request, items),
            Accepted { items, enriched },
        )
    }

    /// Keeps what a metrics request says of known GPU processes for diagnosis and attribution:
    /// each resource's identity, and the allocator gauges.
    async fn note_metrics(
        self: &Arc<Self>,
        request: &ExportMetricsServiceRequest,
        peer: Option<Peer>,
    ) {
        let resources = request
            .resource_metrics
            .iter()
            .map(|rm| rm.resource.as_ref());
        let Some(pids) = self.resolve_for_framework(resources.clone(), peer).await else {
            return;
        };
        let Some(framework) = &self.framework else {
            return;
        };
        let mut framework = framework.lock();
        super::framework_intake::record_identities(&mut framework, resources, &pids);
        if super::framework_intake::has_allocator_metrics(request) {
            super::framework_intake::record_metrics(&mut framework, request, &pids);
        }
    }

    /// Keeps what each resource of a logs request says of its known GPU process (its
    /// identity), so an application that sends only logs is named as it names itself too, and
    /// the companion's live states (`pytorch.training.live`).
    async fn note_logs(self: &Arc<Self>, request: &ExportLogsServiceRequest, peer: Option<Peer>) {
        let resources = request.resource_logs.iter().map(|rl| rl.resource.as_ref());
        let Some(pids) = self.resolve_for_framework(resources.clone(), peer).await else {
            return;
        };
        if let Some(framework) = &self.framework {
            let mut framework = framework.lock();
            super::framework_intake::record_identities(&mut framework, resources, &pids);
            if super::live_intake::has_live_records(request) {
                super::live_intake::record_live(&mut framework, request, &pids);
            }
        }
    }

    /// The process of each resource, when there is a framework history to write and GPU
    /// processes to match; `None` when neither would be of use.
    async fn resolve_for_framework<'a>(
        self: &Arc<Self>,
        resources: impl Iterator<Item = Option<&'a Resource>>,
        peer: Option<Peer>,
    ) -> Option<ResourcePids> {
        if self.framework.is_none() || self.history.read().is_empty() {
            return None;
        }
        let keys = resources.map(ResourceKey::of).collect();
        Some(self.resolve_keys(keys, peer).await)
    }

    /// The process of each resource: from its attributes, else from the connection.
    async fn resolve(
        self: &Arc<Self>,
        request: &ExportTraceServiceRequest,
        peer: Option<Peer>,
    ) -> ResourcePids {
        let keys = request
            .resource_spans
            .iter()
            .map(|rs| ResourceKey::of(rs.resource.as_ref()))
            .collect();
        self.resolve_keys(keys, peer).await
    }

    /// The process of each resource key, in order: by its attributes, else by the connection.
    async fn resolve_keys(
        self: &Arc<Self>,
        keys: Vec<ResourceKey>,
        peer: Option<Peer>,
    ) -> ResourcePids {
        if !self.history.read().unidentified().is_empty() {
            let me = Arc::clone(self);
            // Reads a few small procfs files; kept off the async worker threads.
            let _ = tokio::task::spawn_blocking(move || {
                identify_new(&me.history, &me.settings.proc_root);
            })
            .await;
        }
        let mut pids: ResourcePids = {
            let history = self.history.read();
            keys.iter()
                .map(|key| match match_resource(&history, key) {
                    Match::Pid(pid) => Some((pid, MatchedBy::Resource)),
                    Match::Ambiguous | Match::None => None,
                })
                .collect()
        };
        if let (true, Some(peer)) = (pids.iter().any(Option::is_none), peer) {
            // A connection's answer is cached: only a miss reads /proc, off the async workers
            // (a hop to the blocking pool on every request costs an SDK's exporter latency).
            let found = match self.peers.cached(peer.local, peer.remote) {
                Some(found) => found,
                None => {
                    let me = Arc::clone(self);
                    tokio::task::spawn_blocking(move || {
                        me.peers.get_or_resolve(peer.local, peer.remote, || {
                            resolve_peer(&me.settings.proc_root, peer.local, peer.remote)
                        })
                    })
                    .await
                    .ok()
                    .flatten()
                }
            };
            // One connection is one SDK, so every resource it sent that is not named otherwise
            // is that process's.
            if let Some(pid) = found.filter(|&pid| self.history.read().knows(pid)) {
                for slot in pids.iter_mut().filter(|p| p.is_none()) {
                    *slot = Some((pid, MatchedBy::Connection));
                }
            }
        }
        pids
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    use super::*;
    use crate::enrich::sample_history::tests::{device, process, snapshot};
    use crate::export::queue::{BackoffPolicy, DeliveryQueue, QueueLimits};
    use crate::export::transport::{SendError, SendOutcome, Transport};

    struct Never;

    impl Transport for Never {
        async fn send(&self, _: Signal, _: &EncodedRequest) -> Result<SendOutcome, SendError> {
            Ok(SendOutcome::default())
        }
    }

    /// An intake whose queue is never drained (the sender task is not spawned), and a history
    /// with process 42 on GPU-a from t = 100 s to 110 s.
    fn intake(max_bytes: usize, max_wait: Duration) -> (Arc<Intake>, QueueHandle) {
        let (queue, _sender) = DeliveryQueue::new(
            QueueLimits {
                max_bytes,
                max_age: Duration::from_secs(3600),
            },
            BackoffPolicy::default(),
            Never,
        );
        let history = SampleHistoryHandle::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=110 {
            history.record(&snapshot(
                t,
                vec![device("GPU-a", 0.5, 10.0)],
                vec![process(42, "GPU-a", 1, Some(0.5))],
            ));
        }
        let intake = Intake::new(
            queue.clone(),
            history,
            IntakeSettings {
                proc_root: "/nonexistent".into(),
                max_queue_bytes: max_bytes,
                max_wait,
            },
        );
        (Arc::new(intake), queue)
    }

    fn traces(pid: i64, start_s: u64, end_s: u64) -> Bytes {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "process.pid".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::IntValue(pid)),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        name: "s".into(),
                        start_time_unix_nano: start_s * 1_000_000_000,
                        end_time_unix_nano: end_s * 1_000_000_000,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        Bytes::from(request.encode_to_vec())
    }

    #[tokio::test]
    async fn an_unknown_process_is_forwarded_as_sent_and_a_known_one_enriched() {
        let (intake, queue) = intake(1 << 20, Duration::ZERO);
        let unknown_body = traces(7, 101, 103);
        let unknown = intake
            .accept(Signal::Traces, unknown_body.clone(), None)
            .await
            .unwrap();
        assert_eq!(
            unknown,
            Accepted {
                items: 1,
                enriched: 0
            }
        );
        // Not re-encoded: the queued request is the received one.
        assert_eq!(queue.stats().bytes, unknown_body.len());
        let known_body = traces(42, 101, 103);
        let known = intake
            .accept(Signal::Traces, known_body.clone(), None)
            .await
            .unwrap();
        assert_eq!(
            known,
            Accepted {
                items: 1,
                enriched: 1
            }
        );
        let stats = queue.stats();
        assert_eq!(stats.depth, 2);
        // The enriched one grew by its attributes.
        assert!(
            stats.bytes > unknown_body.len() + known_body.len() + 100,
            "{stats:?}"
        );
        assert_eq!(intake.stats.enriched_spans.load(Ordering::Relaxed), 1);
    }

    /// A local intake (`gpulse top`) keeps a known process's step spans for diagnosis and
    /// forwards nothing; it still refuses what is not OTLP.
    #[tokio::test]
    async fn a_local_intake_keeps_step_spans_for_diagnosis_and_forwards_nothing() {
        use crate::diagnosis::framework::{FrameworkHandle, FrameworkLimits};
        let (queued, _) = intake(1 << 20, Duration::ZERO);
        let framework = FrameworkHandle::new(FrameworkLimits::default());
        let intake = Arc::new(
            Intake::local(queued.history().clone(), queued.settings.clone())
                .with_framework(framework.clone()),
        );
        assert!(!intake.forwards() && queued.forwards());
        let mut request = ExportTraceServiceRequest::decode(traces(42, 101, 103)).unwrap();
        request.resource_spans[0].scope_spans[0].spans[0].name = "step".into();
        let accepted = intake
            .accept(Signal::Traces, Bytes::from(request.encode_to_vec()), None)
            .await
            .unwrap();
        assert_eq!(
            accepted,
            Accepted {
                items: 1,
                enriched: 0
            }
        );
        assert_eq!(framework.lock().len(), 1, "pid 42's step span is kept");
        let err = intake
            .accept(Signal::Traces, Bytes::from_static(&[0xff, 0xff]), None)
            .await
            .unwrap_err();
        assert!(matches!(err, IntakeError::Malformed { .. }), "{err}");
    }

    /// Whatever the signal, and without any companion span or gauge, what a known process's
    /// resource says of it (its service, version, rank) is kept for attribution; an unknown
    /// process's is not, and a process's first word stays.
    #[tokio::test]
    async fn every_signal_tells_the_identity_of_a_known_process() {
        use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
        use opentelemetry_proto::tonic::metrics::v1::{
            metric, Gauge, Metric, ResourceMetrics, ScopeMetrics,
        };

        use crate::diagnosis::framework::{FrameworkHandle, FrameworkLimits};

        let text = |key: &str, value: &str| KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            ..Default::default()
        };
        let resource = |pid: i64, name: &str| {
            let attributes = vec![
                text("service.name", name),
                text("service.version", "3"),
                KeyValue {
                    key: "process.pid".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::IntValue(pid)),
                    }),
                    ..Default::default()
                },
            ];
            Some(Resource {
                attributes,
                ..Default::default()
            })
        };
        let metrics = |pid, name: &str| ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(pid, name),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "app.queue.depth".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![Default::default()],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let logs = |pid, name: &str| ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: resource(pid, name),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord::default()],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut spans = ExportTraceServiceRequest::decode(traces(42, 101, 103)).unwrap();
        spans.resource_spans[0].resource = resource(42, "from-spans");

        for (signal, body, expected) in [
            (
                Signal::Metrics,
                metrics(42, "from-metrics").encode_to_vec(),
                "from-metrics",
            ),
            (
                Signal::Logs,
                logs(42, "from-logs").encode_to_vec(),
                "from-logs",
            ),
            (Signal::Traces, spans.encode_to_vec(), "from-spans"),
        ] {
            let (plain, queue) = intake(1 << 20, Duration::ZERO);
            let framework = FrameworkHandle::new(FrameworkLimits::default());
            let intake = Arc::new(
                Intake::new(queue, plain.history().clone(), plain.settings.clone())
                    .with_framework(framework.clone()),
            );
            intake
                .accept(signal, Bytes::from(body), None)
                .await
                .unwrap();
            // A process gpulse does not know names nobody.
            intake
                .accept(
                    Signal::Metrics,
                    Bytes::from(metrics(7, "stranger").encode_to_vec()),
                    None,
                )
                .await
                .unwrap();
            // A later, different name does not replace the first.
            intake
                .accept(
                    Signal::Logs,
                    Bytes::from(logs(42, "second-word").encode_to_vec()),
                    None,
                )
                .await
                .unwrap();
            let sent = framework.lock().sent_identities();
            assert_eq!(sent.len(), 1, "{signal:?}: only pid 42: {sent:?}");
            assert_eq!(
                sent[&42].service_name.as_deref(),
                Some(expected),
                "{signal:?}"
            );
            assert_eq!(
                sent[&42].attributes,
                vec![("service.version".to_string(), "3".to_string())]
            );
        }
    }

    #[tokio::test]
    async fn malformed_bodies_are_refused_and_nothing_is_queued() {
        let (intake, queue) = intake(1 << 20, Duration::ZERO);
        for signal in [Signal::Traces, Signal::Metrics, Signal::Logs] {
            let err = intake
                .accept(signal, Bytes::from_static(&[0xff, 0xff]), None)
                .await
                .unwrap_err();
            assert!(matches!(err, IntakeError::Malformed { .. }), "{err}");
            assert!(err.to_string().contains(signal.as_str()), "{err}");
        }
        assert_eq!(queue.stats().depth, 0);
        // An empty request is valid and needs no forwarding.
        let ok = intake
            .accept(Signal::Metrics, Bytes::new(), None)
            .await
            .unwrap();
        assert_eq!(ok.items, 0);
        assert_eq!(queue.stats().depth, 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_instead_of_evicting() {
        let body = traces(7, 101, 103);
        let (intake, queue) = intake(body.len() * 2 + 1, Duration::ZERO);
        intake
            .accept(Signal::Traces, body.clone(), None)
            .await
            .unwrap();
        intake
            .accept(Signal::Traces, body.clone(), None)
            .await
            .unwrap();
        let err = intake
            .accept(Signal::Traces, body.clone(), None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, IntakeError::QueueFull { retry_after, .. } if retry_after == RETRY_AFTER),
            "{err}"
        );
        assert_eq!(queue.stats().depth, 2);
        assert_eq!(queue.stats().dropped_overflow.requests, 0);
    }

    #[tokio::test]
    async fn a_span_ending_after_the_newest_sample_is_answered_at_once_and_queued_enriched_after_it(
    ) {
        let (intake, queue) = intake(1 << 20, Duration::from_secs(5));
        let (sample_in, sample_wanted) = tokio::sync::oneshot::channel::<()>();
        let writer = intake.history().clone();
        let late = tokio::spawn(async move {
            sample_wanted.await.unwrap();
            writer.record(&snapshot(
                112,
                vec![device("GPU-a", 0.9, 10.0)],
                vec![process(42, "GPU-a", 1, Some(0.9))],
            ));
        });
        // Answered while the sample it needs is not in yet: the application never waits on it.
        let accepted = intake
            .accept(Signal::Traces, traces(42, 109, 112), None)
            .await
            .unwrap();
        assert_eq!(accepted.items, 1);
        assert_eq!(queue.stats().depth, 0, "queued before its sample was in");
        // Its bytes count against the bound meanwhile.
        assert!(intake.reserved_bytes.load(Ordering::Relaxed) > 0);
        sample_in.send(()).unwrap();
        late.await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
        assert_eq!(intake.settle(deadline).await, 0);
        assert_eq!(queue.stats().depth, 1);
        assert_eq!(intake.stats.enriched_spans.load(Ordering::Relaxed), 1);
        assert_eq!(intake.reserved_bytes.load(Ordering::Relaxed), 0);
        // Without a next sample the wait ends after max_wait and the span still goes.
        let (intake, queue) = intake_with_wait(Duration::from_millis(30));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let accepted = intake
            .accept(Signal::Traces, traces(42, 105, now + 60), None)
            .await
            .unwrap();
        assert_eq!(accepted.items, 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        assert_eq!(intake.settle(deadline).await, 0);
        assert_eq!(queue.stats().depth, 1);
    }

    #[tokio::test]
    async fn requests_waiting_for_their_sample_count_against_the_bound() {
        let body = traces(42, 109, 200);
        // Room for one such request, not two: the second is refused while the first waits.
        let (intake, queue) = intake(body.len() * 3 / 2, Duration::from_secs(5));
        intake
            .accept(Signal::Traces, body.clone(), None)
            .await
            .unwrap();
        let err = intake.accept(Signal::Traces, body, None).await.unwrap_err();
        assert!(matches!(err, IntakeError::QueueFull { .. }), "{err}");
        assert_eq!(queue.stats().depth, 0);
    }

    fn intake_with_wait(wait: Duration) -> (Arc<Intake>, QueueHandle) {
        intake(1 << 20, wait)
    }
}
