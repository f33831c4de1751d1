//! The bounded delivery queue between the export model and the transports. It owns the promise
//! that sampling never waits on the network, and the order and loss rules of what is sent.
//!
//! ## Contract
//! - [`QueueHandle::push`] is synchronous and never blocks on I/O: it appends the encoded request
//!   and returns.
//! - One **lane per signal** (metrics, logs, forwarded traces), each with its own sender
//!   workers and its own retry state, so a backend that keeps refusing one signal (an
//!   application's trace backend down) never delays the others. Metrics and logs have one
//!   request in flight, so they arrive oldest first, in order; traces may have up to
//!   [`TRACES_IN_FLIGHT`] (spans carry their own timestamps and need no order).
//! - A retryable failure keeps the request queued and pauses its lane with exponential backoff
//!   and full jitter (the server's `Retry-After`/`RetryInfo` as a floor); failures of one outage
//!   seen by several workers at once count as one attempt. Delivery is at least once: an
//!   attempt abandoned at the shutdown deadline may still have arrived.
//! - A permanent failure (400, INVALID_ARGUMENT...) drops the request, logs why and counts it.
//! - Bounds, shared by the lanes: total encoded bytes ([`DEFAULT_MAX_BYTES`], 64 MiB) and age
//!   ([`DEFAULT_MAX_AGE`], 1 h). A push over the byte bound drops the oldest requests of its
//!   own lane first, then the oldest of any lane (a stuck lane's backlog is what ages, so it is
//!   what goes once the pushing lane has nothing left to give), never the one pushed unless it
//!   alone is over the bound; requests being sent at that moment are
//!   not dropped either, so the bound can be passed by those for the length of one attempt.
//!   Requests older than the age bound are dropped. Every drop is counted (requests and points).
//! - Shutdown: [`QueueHandle::flush`] lets the lanes deliver what they can until a deadline,
//!   then reports what was left.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod backlog;
mod sender;

use crate::export::transport::{EncodedRequest, FailureReason, Signal, Transport, WarnLimiter};
use backlog::{Backlog, Entry};
pub use sender::SenderTask;

/// Default bound on the queued requests' encoded size: about an hour of a large node's metrics
/// at a 10 s interval, and small next to the memory of a GPU node.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Default bound on a request's age: GPU metrics older than an hour rarely matter, and many
/// backends refuse points that old anyway.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3600);
/// Forwarded trace requests in flight at once: an application may send spans faster than one
/// round trip per request allows, and their order does not matter.
pub const TRACES_IN_FLIGHT: usize = 4;

/// The lanes, in the order of their index.
const SIGNALS: [Signal; 3] = [Signal::Metrics, Signal::Logs, Signal::Traces];

const fn lane_index(signal: Signal) -> usize {
    match signal {
        Signal::Metrics => 0,
        Signal::Logs => 1,
        Signal::Traces => 2,
    }
}

/// Requests of `signal` sent at once.
const fn workers_for(signal: Signal) -> usize {
    match signal {
        Signal::Metrics | Signal::Logs => 1,
        Signal::Traces => TRACES_IN_FLIGHT,
    }
}

/// How much the queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Total encoded bytes of the queued requests, all lanes together.
    pub max_bytes: usize,
    /// A request queued longer than this is dropped.
    pub max_age: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_age: DEFAULT_MAX_AGE,
        }
    }
}

/// Retry timing, as the OTLP specification suggests: exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Ceiling of the first retry's delay (1 s).
    pub initial: Duration,
    /// The ceiling doubles per attempt up to this (30 s).
    pub max: Duration,
    /// A server's retry hint is honoured up to this (5 min), so a broken proxy's
    /// `Retry-After: 86400` cannot stall delivery for a day.
    pub max_retry_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(300),
        }
    }
}

/// The delay before retry number `attempt` (0 for the first retry): full jitter, a uniform draw
/// (`unit` in `[0, 1)`) below `min(max, initial * 2^attempt)`, and never less than the server's
/// hint (itself capped at `max_retry_after`).
pub fn backoff_delay(
    policy: &BackoffPolicy,
    attempt: u32,
    retry_after: Option<Duration>,
    unit: f64,
) -> Duration {
    let ceiling = policy
        .initial
        .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(policy.max)
        .min(policy.max);
    let jittered = ceiling.mul_f64(unit.clamp(0.0, 1.0));
    let floor = retry_after.map_or(Duration::ZERO, |d| d.min(policy.max_retry_after));
    jittered.max(floor)
}

/// Requests and data points (or log records, or spans) counted together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub requests: u64,
    pub points: u64,
}

impl Count {
    fn add(&mut self, other: Count) {
        self.requests += other.requests;
        self.points += other.points;
    }

    fn one(request: &EncodedRequest) -> Count {
        Count {
            requests: 1,
            points: request.items(),
        }
    }
}

/// What one lane holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Requests waiting (those being sent included).
    pub depth: usize,
    /// Their encoded bytes.
    pub bytes: usize,
    /// Requests being sent now.
    pub in_flight: usize,
    pub delivered: Count,
}

/// The queue's self-telemetry, read with [`QueueHandle::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests waiting in all lanes (those being sent included).
    pub depth: usize,
    /// Their encoded bytes: what the shared byte bound counts.
    pub bytes: usize,
    /// The same, per lane.
    pub by_signal: BTreeMap<Signal, LaneStats>,
    pub pushed: Count,
    pub delivered: Count,
    /// Dropped to stay under the byte bound (oldest first), or pushed alone over it.
    pub dropped_overflow: Count,
    /// Dropped for being older than the age bound.
    pub dropped_expired: Count,
    /// Dropped after a permanent failure.
    pub dropped_rejected: Count,
    /// Pushed after shutdown began.
    pub dropped_closed: Count,
    /// Points or log records the server refused in a partial success.
    pub rejected_in_partial_success: u64,
    /// Failed attempts (retryable or not) by reason.
    pub failures: BTreeMap<FailureReason, u64>,
    /// Duration of the last successful attempt.
    pub last_export_latency: Option<Duration>,
}

/// What a push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Whether the pushed request is now queued.
    pub queued: bool,
    /// Older requests dropped to make room (or the pushed one, when alone over the bound).
    pub overflow: Count,
    /// Requests dropped because they had expired.
    pub expired: Count,
}

/// What was left when the sender stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Delivered between the call to `flush`/`close` and the stop.
    pub delivered: Count,
    /// Still queued, now lost.
    pub undelivered: Count,
}

#[derive(Debug, Default)]
struct State {
    backlog: Backlog,
    next_id: u64,
    /// Set by `close`: stop once empty or at this instant.
    closing: Option<Instant>,
    delivered_since_close: Count,
    /// Set by the sender when it stops.
    finished: Option<FlushReport>,
    stats: QueueStats,
}

struct Shared {
    limits: QueueLimits,
    state: Mutex<State>,
    /// Wakes a lane's idle workers: a push to it, or `close`.
    wake: [Notify; 3],
    /// Wakes workers waiting on a backoff or an attempt early: only `close` (a push must not cut
    /// a backoff).
    closed: Notify,
    /// Wakes `flush` callers when the sender stops.
    done: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters and deques, consistent after every statement that holds
        // the lock; a panic elsewhere must not stop delivery.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves when a close deadline is set and reached; pending until then.
    async fn close_deadline(&self) {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            let deadline = self.lock().closing;
            match deadline {
                Some(deadline) => {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
                None => closed.await,
            }
        }
    }
}

/// The queue's constructor.
pub struct DeliveryQueue;

impl DeliveryQueue {
    /// Creates the queue: the handle pushes and reads stats; the task, once spawned, sends.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<T: Transport + 'static>(
        limits: QueueLimits,
        backoff: BackoffPolicy,
        transport: T,
    ) -> (QueueHandle, SenderTask<T>) {
        let shared = Arc::new(Shared {
            limits,
            state: Mutex::new(State::default()),
            wake: [Notify::new(), Notify::new(), Notify::new()],
            closed: Notify::new(),
            done: Notify::new(),
        });
        (
            QueueHandle {
                shared: Arc::clone(&shared),
            },
            SenderTask {
                shared,
                transport,
                backoff,
                jitter: fastrand::f64,
            },
        )
    }
}

/// The producer's side: push requests, read the counters, shut down. Cheap to clone.
#[derive(Clone)]
pub struct QueueHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QueueHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueHandle")
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl QueueHandle {
    /// Queues `request` in the lane of `signal`. Never waits: the only lock is held for a few
    /// deque operations.
    pub fn push(&self, signal: Signal, request: EncodedRequest) -> PushReport {
        let now = Instant::now();
        let limits = self.shared.limits;
        let report = {
            let mut state = self.shared.lock();
            let one = Count::one(&request);
            state.stats.pushed.add(one);
            if state.closing.is_some() {
                state.stats.dropped_closed.add(one);
                return PushReport::default();
            }
            let expired = state.backlog.expire(now, limits.max_age);
            let id = state.next_id;
            state.next_id += 1;
            let entry = Entry {
                id,
                signal,
                request,
                created_at: now,
                in_flight: false,
            };
            let (queued, overflow) = state.backlog.push(entry, limits.max_bytes);
            state.stats.dropped_expired.add(expired);
            state.stats.dropped_overflow.add(overflow);
            PushReport {
                queued,
                overflow,
                expired,
            }
        };
        if report.overflow.requests > 0 {
            static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(60));
            if let Some(suppressed) = LIMIT.permit() {
                tracing::warn!(
                    %signal,
                    dropped_requests = report.overflow.requests,
                    dropped_points = report.overflow.points,
                    max_bytes = limits.max_bytes,
                    suppressed_since_last = suppressed,
                    "the OTLP delivery queue is full, oldest requests dropped; a backend has \
                     been unreachable or slow for a while (see the export errors above)"
                );
            }
        }
        if report.queued {
            self.shared.wake[lane_index(signal)].notify_one();
        }
        report
    }

    /// Encoded bytes queued now, all lanes together: what the shared bound counts. Cheaper than
    /// [`QueueHandle::stats`], for a check on every incoming request.
    pub fn bytes(&self) -> usize {
        self.shared.lock().backlog.bytes
    }

    /// A copy of the counters.
    pub fn stats(&self) -> QueueStats {
        let state = self.shared.lock();
        let mut stats = state.stats.clone();
        stats.depth = state.backlog.len();
        stats.bytes = state.backlog.bytes;
        for signal in SIGNALS {
            let lane = state.backlog.lane(signal);
            stats.by_signal.insert(
                signal,
                LaneStats {
                    depth: lane.entries.len(),
                    bytes: lane.bytes,
                    in_flight: lane.in_flight,
                    delivered: lane.delivered,
                },
            );
        }
        stats
    }

    /// Asks the sender to deliver what is queued and stop, at the latest at `deadline`. Later
    /// pushes are refused and counted as `dropped_closed`.
    pub fn close(&self, deadline: Instant) {
        {
            let mut state = self.shared.lock();
            state.closing = Some(state.closing.map_or(deadline, |d| d.min(deadline)));
        }
        for wake in &self.shared.wake {
            wake.notify_waiters();
        }
        self.shared.closed.notify_waiters();
    }

    /// Closes the queue and waits until the sender stopped: everything delivered, or the
    /// deadline reached. If the sender task is not running, gives up shortly after the
    /// deadline and reports everything still queued as undelivered.
    pub async fn flush(&self, deadline: Instant) -> FlushReport {
        self.close(deadline);
        let give_up = deadline + Duration::from_millis(500);
        loop {
            let done = self.shared.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            {
                let state = self.shared.lock();
                if let Some(report) = state.finished {
                    return report;
                }
            }
            tokio::select! {
                _ = &mut done => {}
                _ = tokio::time::sleep_until(give_up) => {
                    let state = self.shared.lock();
                    return state.finished.unwrap_or_else(|| FlushReport {
                        delivered: state.delivered_since_close,
                        undelivered: undelivered(&state.backlog),
                    });
                }
            }
        }
    }
}

fn undelivered(backlog: &Backlog) -> Count {
    backlog.entries().fold(Count::default(), |mut c, e| {
        c.add(Count::one(&e.request));
        c
    })
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::export::transport::{SendError, SendOutcome};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn request(len: usize, items: u64) -> EncodedRequest {
        EncodedRequest::new(vec![0u8; len], items)
    }

    fn entry(id: u64, len: usize, at: Instant) -> Entry {
        Entry {
            id,
            signal: Signal::Metrics,
            request: request(len, 10),
            created_at: at,
            in_flight: false,
        }
    }

    #[test]
    fn backoff_grows_to_the_cap_and_respects_the_hint() {
        let p = BackoffPolicy::default();
        let s = Duration::from_secs;
        // unit 1.0 shows the ceiling.
        assert_eq!(backoff_delay(&p, 0, None, 1.0), s(1));
        assert_eq!(backoff_delay(&p, 1, None, 1.0), s(2));
        assert_eq!(backoff_delay(&p, 4, None, 1.0), s(16));
        assert_eq!(backoff_delay(&p, 5, None, 1.0), s(30));
        assert_eq!(backoff_delay(&p, 40, None, 1.0), s(30));
        assert_eq!(backoff_delay(&p, u32::MAX, None, 1.0), s(30));
        assert_eq!(backoff_delay(&p, 3, None, 0.5), s(4));
        assert_eq!(backoff_delay(&p, 3, None, 0.0), Duration::ZERO);
        // The server's hint is a floor, capped.
        assert_eq!(backoff_delay(&p, 0, Some(s(7)), 0.0), s(7));
        assert_eq!(backoff_delay(&p, 5, Some(s(7)), 1.0), s(30));
        assert_eq!(backoff_delay(&p, 0, Some(s(86_400)), 0.3), s(300));
    }

    #[test]
    fn push_over_the_bound_drops_the_oldest_first() {
        let now = Instant::now();
        let mut b = Backlog::default();
        for id in 0..4 {
            assert_eq!(b.push(entry(id, 100, now), 400), (true, Count::default()));
        }
        let (queued, dropped) = b.push(entry(4, 150, now), 400);
        assert!(queued);
        assert_eq!(
            dropped,
            Count {
                requests: 2,
                points: 20
            }
        );
        let ids: Vec<_> = b
            .lane(Signal::Metrics)
            .entries
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [2, 3, 4]);
        assert_eq!(b.bytes, 350);
    }

    #[test]
    fn a_request_alone_over_the_bound_is_refused_and_nothing_else_dropped() {
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 100, now), 400);
        let (queued, dropped) = b.push(entry(1, 401, now), 400);
        assert!(!queued);
        assert_eq!(dropped.requests, 1);
        assert_eq!(b.lane(Signal::Metrics).entries.len(), 1);
        assert_eq!(b.bytes, 100);
    }

    #[test]
    fn the_request_in_flight_is_not_evicted() {
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 200, now), 400);
        b.push(entry(1, 200, now), 400);
        assert_eq!(b.claim(Signal::Metrics).map(|e| e.id), Some(0));
        let (queued, dropped) = b.push(entry(2, 200, now), 400);
        assert!(queued);
        assert_eq!(dropped.requests, 1);
        let ids: Vec<_> = b
            .lane(Signal::Metrics)
            .entries
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [0, 2]);
    }

    fn entry_of(signal: Signal, id: u64, len: usize, at: Instant) -> Entry {
        Entry {
            signal,
            ..entry(id, len, at)
        }
    }

    #[test]
    fn the_shared_bound_drops_the_oldest_of_any_lane() {
        // A stuck traces lane fills the budget; a metrics push then drops the oldest traces,
        // not the metrics.
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry_of(Signal::Metrics, 0, 100, now), 400);
        b.push(entry_of(Signal::Traces, 1, 100, now), 400);
        b.push(entry_of(Signal::Traces, 2, 100, now), 400);
        b.push(entry_of(Signal::Traces, 3, 100, now), 400);
        // The metrics request 0 is being sent, so the oldest idle one is trace 1.
        b.claim(Signal::Metrics);
        let (queued, dropped) = b.push(entry_of(Signal::Metrics, 4, 150, now), 400);
        assert!(queued);
        assert_eq!(dropped.requests, 2);
        let ids = |b: &Backlog, s| b.lane(s).entries.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(&b, Signal::Metrics), [0, 4]);
        assert_eq!(ids(&b, Signal::Traces), [3]);
        assert_eq!(b.bytes, 350);
    }

    #[test]
    fn a_push_over_the_bound_drops_its_own_lanes_oldest_before_older_ones_of_other_lanes() {
        // Accepted spans wait while the upstream is down; gpulse's metrics windows keep coming.
        // A window pushes out the oldest window, not the spans, older as they are.
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry_of(Signal::Traces, 0, 100, now), 400);
        b.push(entry_of(Signal::Traces, 1, 100, now), 400);
        b.push(entry_of(Signal::Metrics, 2, 100, now), 400);
        b.push(entry_of(Signal::Metrics, 3, 100, now), 400);
        let (queued, dropped) = b.push(entry_of(Signal::Metrics, 4, 100, now), 400);
        assert!(queued);
        assert_eq!(dropped.requests, 1);
        let ids = |b: &Backlog, s| b.lane(s).entries.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(&b, Signal::Traces), [0, 1]);
        assert_eq!(ids(&b, Signal::Metrics), [3, 4]);
        assert_eq!(b.bytes, 400);
    }

    #[test]
    fn a_lane_hands_out_each_request_once_and_a_retry_keeps_its_place() {
        let now = Instant::now();
        let mut b = Backlog::default();
        for id in 0..3 {
            b.push(entry_of(Signal::Traces, id, 10, now), 1000);
        }
        assert_eq!(b.claim(Signal::Traces).map(|e| e.id), Some(0));
        assert_eq!(b.claim(Signal::Traces).map(|e| e.id), Some(1));
        assert!(b.claim(Signal::Metrics).is_none(), "lanes are separate");
        // 0 failed and may be retried: it is the oldest idle one again; 1 was delivered.
        b.settle(Signal::Traces, 0, false);
        b.settle(Signal::Traces, 1, true);
        assert_eq!(b.claim(Signal::Traces).map(|e| e.id), Some(0));
        assert_eq!(b.claim(Signal::Traces).map(|e| e.id), Some(2));
        assert!(b.claim(Signal::Traces).is_none());
        assert_eq!(b.bytes, 20);
        let lane = b.lane(Signal::Traces);
        assert_eq!((lane.bytes, lane.in_flight), (20, 2));
        b.settle(Signal::Traces, 0, false);
        b.settle(Signal::Traces, 2, true);
        let lane = b.lane(Signal::Traces);
        assert_eq!((lane.bytes, lane.in_flight, lane.entries.len()), (10, 0, 1));
    }

    #[test]
    fn expiry_drops_only_what_is_older_than_the_bound() {
        let t0 = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 10, t0), 1000);
        b.push(entry(1, 10, t0 + Duration::from_secs(10)), 1000);
        b.push(entry(2, 10, t0 + Duration::from_secs(20)), 1000);
        let now = t0 + Duration::from_secs(75);
        let dropped = b.expire(now, Duration::from_secs(60));
        assert_eq!(dropped.requests, 2);
        assert_eq!(
            b.lane(Signal::Metrics).entries.front().map(|e| e.id),
            Some(2)
        );
        assert_eq!(b.bytes, 10);
        // A request in flight survives; what follows it still expires.
        let mut b = Backlog::default();
        b.push(entry(0, 10, t0), 1000);
        b.push(entry(1, 10, t0), 1000);
        b.claim(Signal::Metrics);
        assert_eq!(b.expire(now, Duration::from_secs(60)).requests, 1);
        assert_eq!(b.lane(Signal::Metrics).entries.len(), 1);
    }

    #[test]
    fn many_pushes_over_the_bound_keep_it_and_count_every_drop() {
        // Also the push-cost figure quoted in the report: run with --nocapture.
        let (handle, _task) = DeliveryQueue::new(
            QueueLimits {
                max_bytes: 1024 * 1024,
                max_age: DEFAULT_MAX_AGE,
            },
            BackoffPolicy::default(),
            Scripted::new(vec![]),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let body = bytes::Bytes::from(vec![7u8; 1024]);
        let n = 100_000u64;
        let started = std::time::Instant::now();
        for _ in 0..n {
            handle.push(Signal::Metrics, EncodedRequest::new(body.clone(), 3));
        }
        let per_push = started.elapsed() / u32::try_from(n).unwrap();
        println!("push: {per_push:?} per 1 KiB request ({n} pushes, queue at its bound)");
        let stats = handle.stats();
        assert_eq!(stats.depth, 1024);
        assert_eq!(stats.bytes, 1024 * 1024);
        assert_eq!(
            stats.dropped_overflow,
            Count {
                requests: n - 1024,
                points: 3 * (n - 1024)
            }
        );
        assert_eq!(stats.pushed.requests, n);
    }

    /// Answers from a script: each call takes the next scripted result, then succeeds.
    struct Scripted {
        script: Mutex<VecDeque<Result<(), SendError>>>,
        sent: Mutex<Vec<(Signal, u64)>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn new(script: Vec<Result<(), SendError>>) -> Arc<Self> {
            Arc::new(Self {
                script: Mutex::new(script.into()),
                sent: Mutex::new(Vec::new()),
                calls: AtomicUsize::new(0),
            })
        }
    }

    impl Transport for Arc<Scripted> {
        async fn send(
            &self,
            signal: Signal,
            request: &EncodedRequest,
        ) -> Result<SendOutcome, SendError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = self.script.lock().unwrap().pop_front().unwrap_or(Ok(()));
            next?;
            self.sent.lock().unwrap().push((signal, request.items()));
            Ok(SendOutcome::default())
        }
    }

    fn unavailable() -> SendError {
        SendError::HttpStatus {
            signal: Signal::Metrics,
            endpoint: "http://test".into(),
            status: 503,
            message: "down".into(),
            retry_after: None,
        }
    }

    fn bad_request() -> SendError {
        SendError::HttpStatus {
            signal: Signal::Metrics,
            endpoint: "http://test".into(),
            status: 400,
            message: "bad".into(),
            retry_after: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_keep_order_and_a_permanent_failure_is_dropped_and_counted() {
        let transport = Scripted::new(vec![
            Err(unavailable()),
            Err(unavailable()),
            Ok(()),
            Err(bad_request()),
        ]);
        let (handle, task) = DeliveryQueue::new(
            QueueLimits::default(),
            BackoffPolicy::default(),
            Arc::clone(&transport),
        );
        let task = tokio::spawn(task.with_jitter(|| 1.0).run());
        for items in 1..=4 {
            handle.push(Signal::Metrics, request(10, items));
        }
        let report = handle.flush(Instant::now() + Duration::from_secs(60)).await;
        task.await.unwrap();
        // 1 fails twice then goes; 2 is refused for good; 3 and 4 follow in order.
        assert_eq!(
            *transport.sent.lock().unwrap(),
            [
                (Signal::Metrics, 1),
                (Signal::Metrics, 3),
                (Signal::Metrics, 4)
            ]
        );
        assert_eq!(report.undelivered, Count::default());
        let stats = handle.stats();
        assert_eq!(
            stats.delivered,
            Count {
                requests: 3,
                points: 8
            }
        );
        assert_eq!(
            stats.dropped_rejected,
            Count {
                requests: 1,
                points: 2
            }
        );
        assert_eq!(stats.failures.get(&FailureReason::Http(503)), Some(&2));
        assert_eq!(stats.failures.get(&FailureReason::Http(400)), Some(&1));
        assert_eq!(stats.depth, 0);
        assert_eq!(stats.bytes, 0);
    }

    /// Refuses every traces request (503), accepts the rest; counts traces attempts in flight.
    struct TracesDown {
        sent: Mutex<Vec<(Signal, u64)>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        attempts: AtomicUsize,
    }

    impl Transport for Arc<TracesDown> {
        async fn send(
            &self,
            signal: Signal,
            request: &EncodedRequest,
        ) -> Result<SendOutcome, SendError> {
            if signal != Signal::Traces {
                self.sent.lock().unwrap().push((signal, request.items()));
                return Ok(SendOutcome::default());
            }
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Err(SendError::HttpStatus {
                signal,
                endpoint: "http://test/v1/traces".into(),
                status: 503,
                message: "trace backend down".into(),
                retry_after: None,
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_traces_lane_never_delays_metrics_or_logs() {
        let transport = Arc::new(TracesDown {
            sent: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            attempts: AtomicUsize::new(0),
        });
        let (handle, task) = DeliveryQueue::new(
            QueueLimits::default(),
            BackoffPolicy::default(),
            Arc::clone(&transport),
        );
        let task = tokio::spawn(task.with_jitter(|| 1.0).run());
        // An application sends spans every 200 ms; gpulse exports metrics every second.
        for second in 0..20u64 {
            for _ in 0..5 {
                handle.push(Signal::Traces, request(100, 1));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            handle.push(Signal::Metrics, request(10, second));
            if second % 5 == 0 {
                handle.push(Signal::Logs, request(10, 1));
            }
            // Each metrics request is delivered within the interval it was pushed in.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let stats = handle.stats();
            assert_eq!(
                stats.by_signal[&Signal::Metrics].delivered.requests,
                second + 1,
                "metrics waited behind the failing traces after {second} s: {stats:?}"
            );
        }
        let sent = transport.sent.lock().unwrap().clone();
        let metrics: Vec<_> = sent
            .iter()
            .filter(|(s, _)| *s == Signal::Metrics)
            .map(|(_, items)| *items)
            .collect();
        assert_eq!(metrics, (0..20).collect::<Vec<_>>(), "in order, none lost");
        assert_eq!(sent.iter().filter(|(s, _)| *s == Signal::Logs).count(), 4);
        let stats = handle.stats();
        let traces = stats.by_signal[&Signal::Traces];
        assert_eq!(
            traces.depth, 100,
            "every span request is still queued for retry"
        );
        assert_eq!(traces.delivered.requests, 0);
        assert_eq!(
            stats.failures.get(&FailureReason::Http(503)).copied(),
            Some(transport.attempts.load(Ordering::SeqCst) as u64)
        );
        // Backoff holds for the lane: 1+2+4+8 s of pauses within 20 s leaves a few rounds of
        // at most TRACES_IN_FLIGHT attempts, not one attempt per span request.
        assert!(
            transport.attempts.load(Ordering::SeqCst) <= 6 * TRACES_IN_FLIGHT,
            "{} traces attempts",
            transport.attempts.load(Ordering::SeqCst)
        );
        handle.flush(Instant::now()).await;
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn forwarded_traces_have_several_requests_in_flight_at_most_the_bound() {
        let transport = Arc::new(TracesDown {
            sent: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            attempts: AtomicUsize::new(0),
        });
        let (handle, task) = DeliveryQueue::new(
            QueueLimits::default(),
            BackoffPolicy::default(),
            Arc::clone(&transport),
        );
        let task = tokio::spawn(task.run());
        for _ in 0..(3 * TRACES_IN_FLIGHT) {
            handle.push(Signal::Traces, request(10, 1));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            handle.stats().by_signal[&Signal::Traces].in_flight,
            TRACES_IN_FLIGHT
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            transport.max_in_flight.load(Ordering::SeqCst),
            TRACES_IN_FLIGHT
        );
        let report = handle
            .flush(Instant::now() + Duration::from_millis(10))
            .await;
        assert_eq!(report.undelivered.requests, 3 * TRACES_IN_FLIGHT as u64);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_waits_between_attempts() {
        let transport = Scripted::new(vec![Err(unavailable()), Err(unavailable())]);
        let (handle, task) = DeliveryQueue::new(
            QueueLimits::default(),
            BackoffPolicy::default(),
            Arc::clone(&transport),
        );
        let task = tokio::spawn(task.with_jitter(|| 1.0).run());
        let start = Instant::now();
        handle.push(Signal::Logs, request(10, 1));
        while handle.stats().delivered.requests == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // 1 s after the first failure, 2 s after the second.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
        handle.flush(Instant::now() + Duration::from_secs(1)).await;
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn flush_gives_up_at_the_deadline_and_reports_the_rest() {
        let transport = Scripted::new((0..1000).map(|_| Err(unavailable())).collect());
        let (handle, task) = DeliveryQueue::new(
            QueueLimits::default(),
            BackoffPolicy::default(),
            Arc::clone(&transport),
        );
        let task = tokio::spawn(task.with_jitter(|| 1.0).run());
        for items in 0..5 {
            handle.push(Signal::Metrics, request(10, items));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let report = handle.flush(deadline).await;
        assert!(Instant::now() <= deadline + Duration::from_millis(1));
        assert_eq!(
            report.undelivered,
            Count {
                requests: 5,
                points: 10
            }
        );
        assert_eq!(report.delivered, Count::default());
        assert_eq!(task.await.unwrap(), report);
        // After close, pushes are refused and counted.
        assert!(!handle.push(Signal::Metrics, request(10, 3)).queued);
        assert_eq!(
            handle.stats().dropped_closed,
            Count {
                requests: 1,
                points: 3
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_requests_are_dropped_and_counted() {
        let transport = Scripted::new((0..1000).map(|_| Err(unavailable())).collect());
        let limits = QueueLimits {
            max_bytes: 1000,
            max_age: Duration::from_secs(60),
        };
        let (handle, task) =
            DeliveryQueue::new(limits, BackoffPolicy::default(), Arc::clone(&transport));
        let task = tokio::spawn(task.with_jitter(|| 1.0).run());
        handle.push(Signal::Metrics, request(10, 4));
        tokio::time::sleep(Duration::from_secs(120)).await;
        let stats = handle.stats();
        assert_eq!(
            stats.dropped_expired,
            Count {
                requests: 1,
                points: 4
            }
        );
        assert_eq!(stats.depth, 0);
        handle.flush(Instant::now()).await;
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn flush_without_a_sender_reports_everything_undelivered() {
        let transport = Scripted::new(vec![]);
        let (handle, _task) =
            DeliveryQueue::new(QueueLimits::default(), BackoffPolicy::default(), transport);
        handle.push(Signal::Metrics, request(10, 2));
        let report = handle.flush(Instant::now() + Duration::from_secs(1)).await;
        assert_eq!(
            report.undelivered,
            Count {
                requests: 1,
                points: 2
            }
        );
    }
}
