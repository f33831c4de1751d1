//! The bounded delivery queue between the export model and the transports. It owns the promise
//! that sampling never waits on the network, and the order and loss rules of what is sent.
//!
//! ## Contract
//! - [`QueueHandle::push`] is synchronous and never blocks on I/O: it appends the encoded request
//!   and returns.
//! - One sender task ([`SenderTask::run`]) sends the oldest request, one at a time. A retryable
//!   failure keeps it at the head and retries it with exponential backoff and full jitter (the
//!   server's `Retry-After`/`RetryInfo` as a floor), so after an outage everything still queued
//!   arrives oldest first, in order. Delivery is at least once: an attempt abandoned at the
//!   shutdown deadline may still have arrived.
//! - A permanent failure (400, INVALID_ARGUMENT...) drops the request, logs why and counts it.
//! - Bounds: total encoded bytes ([`DEFAULT_MAX_BYTES`], 64 MiB) and age ([`DEFAULT_MAX_AGE`],
//!   1 h). A push over the byte bound drops the oldest requests first, never the one pushed
//!   unless it alone is over the bound; the request being sent at that moment is not dropped
//!   either, so the bound can be passed by that one request for the length of one attempt.
//!   Requests older than the age bound are dropped. Every drop is counted (requests and points).
//! - Shutdown: [`QueueHandle::flush`] lets the sender deliver what it can until a deadline, then
//!   reports what was left.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::export::transport::{
    EncodedRequest, FailureReason, Retryability, SendError, Signal, Transport, WarnLimiter,
};

/// Default bound on the queued requests' encoded size: about an hour of a large node's metrics
/// at a 10 s interval, and small next to the memory of a GPU node.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Default bound on a request's age: GPU metrics older than an hour rarely matter, and many
/// backends refuse points that old anyway.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3600);

/// How much the queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Total encoded bytes of the queued requests.
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

/// Requests and data points (or log records) counted together.
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

/// The queue's self-telemetry, read with [`QueueHandle::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests waiting (the one being sent included).
    pub depth: usize,
    /// Their encoded bytes.
    pub bytes: usize,
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

/// One queued request.
#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    signal: Signal,
    request: EncodedRequest,
    created_at: Instant,
}

/// The FIFO and its byte total: the eviction policy, free of locks and clocks.
#[derive(Debug, Default)]
struct Backlog {
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl Backlog {
    fn pop_front(&mut self) -> Option<Entry> {
        let entry = self.entries.pop_front()?;
        self.bytes -= entry.request.len();
        Some(entry)
    }

    /// Drops entries older than `max_age` (they are oldest first, so from the front), except a
    /// protected head (the one being sent).
    fn expire(&mut self, now: Instant, max_age: Duration, protect: Option<u64>) -> Count {
        let mut dropped = Count::default();
        let start =
            usize::from(matches!((self.entries.front(), protect), (Some(e), Some(p)) if e.id == p));
        while let Some(entry) = self.entries.get(start) {
            if now.saturating_duration_since(entry.created_at) <= max_age {
                break;
            }
            let entry = self
                .entries
                .remove(start)
                .expect("index checked just above");
            self.bytes -= entry.request.len();
            dropped.add(Count::one(&entry.request));
        }
        dropped
    }

    /// Appends `entry`, dropping the oldest (but not a protected head) while the bound would
    /// be passed. An entry alone over the bound is refused and counted instead.
    fn push(&mut self, entry: Entry, max_bytes: usize, protect: Option<u64>) -> (bool, Count) {
        let mut dropped = Count::default();
        let len = entry.request.len();
        if len > max_bytes {
            dropped.add(Count::one(&entry.request));
            return (false, dropped);
        }
        let start =
            usize::from(matches!((self.entries.front(), protect), (Some(e), Some(p)) if e.id == p));
        while self.bytes + len > max_bytes {
            let Some(old) = self.entries.remove(start) else {
                break;
            };
            self.bytes -= old.request.len();
            dropped.add(Count::one(&old.request));
        }
        self.bytes += len;
        self.entries.push_back(entry);
        (true, dropped)
    }
}

#[derive(Debug, Default)]
struct State {
    backlog: Backlog,
    next_id: u64,
    /// The entry an attempt is under way for.
    in_flight: Option<u64>,
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
    /// Wakes the sender: a push, or `close`.
    wake: Notify,
    /// Wakes a backing-off sender early: only `close`, since a push must not cut a backoff.
    closed: Notify,
    /// Wakes `flush` callers when the sender stops.
    done: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters and a deque, consistent after every statement that holds
        // the lock; a panic elsewhere must not stop delivery.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The queue's constructor.
pub struct DeliveryQueue;

impl DeliveryQueue {
    /// Creates the queue: the handle pushes and reads stats; the task, once spawned, sends.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<T: Transport>(
        limits: QueueLimits,
        backoff: BackoffPolicy,
        transport: T,
    ) -> (QueueHandle, SenderTask<T>) {
        let shared = Arc::new(Shared {
            limits,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
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
    /// Queues `request` for `signal`. Never waits: the only lock is held for a few deque
    /// operations.
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
            let protect = state.in_flight;
            let expired = state.backlog.expire(now, limits.max_age, protect);
            let id = state.next_id;
            state.next_id += 1;
            let entry = Entry {
                id,
                signal,
                request,
                created_at: now,
            };
            let (queued, overflow) = state.backlog.push(entry, limits.max_bytes, protect);
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
                    dropped_requests = report.overflow.requests,
                    dropped_points = report.overflow.points,
                    max_bytes = limits.max_bytes,
                    suppressed_since_last = suppressed,
                    "the OTLP delivery queue is full, oldest requests dropped; the backend has \
                     been unreachable or slow for a while (see the export errors above)"
                );
            }
        }
        if report.queued {
            self.shared.wake.notify_one();
        }
        report
    }

    /// A copy of the counters.
    pub fn stats(&self) -> QueueStats {
        let state = self.shared.lock();
        let mut stats = state.stats.clone();
        stats.depth = state.backlog.entries.len();
        stats.bytes = state.backlog.bytes;
        stats
    }

    /// Asks the sender to deliver what is queued and stop, at the latest at `deadline`. Later
    /// pushes are refused and counted as `dropped_closed`.
    pub fn close(&self, deadline: Instant) {
        {
            let mut state = self.shared.lock();
            state.closing = Some(state.closing.map_or(deadline, |d| d.min(deadline)));
        }
        self.shared.wake.notify_one();
        self.shared.closed.notify_one();
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
    backlog.entries.iter().fold(Count::default(), |mut c, e| {
        c.add(Count::one(&e.request));
        c
    })
}

/// The consumer's side: spawn [`SenderTask::run`] once.
pub struct SenderTask<T> {
    shared: Arc<Shared>,
    transport: T,
    backoff: BackoffPolicy,
    jitter: fn() -> f64,
}

impl<T: Transport> SenderTask<T> {
    /// Replaces the jitter source (a uniform draw in `[0, 1)`), for deterministic tests.
    pub fn with_jitter(mut self, jitter: fn() -> f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sends until the queue is closed and empty, or its close deadline passes.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing queued: the request being sent stays at the head.
    pub async fn run(self) -> FlushReport {
        let mut attempt: u32 = 0;
        loop {
            let wake = self.shared.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let (next, closing) = {
                let mut state = self.shared.lock();
                let now = Instant::now();
                let expired = state.backlog.expire(now, self.shared.limits.max_age, None);
                state.stats.dropped_expired.add(expired);
                if expired.requests > 0 {
                    attempt = 0;
                }
                let closing = state.closing;
                if closing.is_some_and(|deadline| now >= deadline) {
                    break;
                }
                let next = state.backlog.entries.front().cloned();
                if let Some(entry) = &next {
                    state.in_flight = Some(entry.id);
                }
                (next, closing)
            };
            let Some(entry) = next else {
                if closing.is_some() {
                    break;
                }
                wake.await;
                continue;
            };

            let started = Instant::now();
            let sent = self.transport.send(entry.signal, &entry.request);
            let result = match closing {
                Some(deadline) => match tokio::time::timeout_at(deadline, sent).await {
                    Ok(result) => result,
                    Err(_) => {
                        self.shared.lock().in_flight = None;
                        break;
                    }
                },
                None => sent.await,
            };
            let elapsed = started.elapsed();

            let retry = {
                let mut state = self.shared.lock();
                state.in_flight = None;
                match &result {
                    Ok(outcome) => {
                        remove_head(&mut state.backlog, entry.id);
                        let one = Count::one(&entry.request);
                        state.stats.delivered.add(one);
                        if state.closing.is_some() {
                            state.delivered_since_close.add(one);
                        }
                        state.stats.last_export_latency = Some(elapsed);
                        if let Some(partial) = &outcome.partial_success {
                            state.stats.rejected_in_partial_success +=
                                u64::try_from(partial.rejected).unwrap_or(0);
                        }
                        None
                    }
                    Err(err) => {
                        *state.stats.failures.entry(err.reason()).or_default() += 1;
                        match err.retryability() {
                            Retryability::Permanent => {
                                remove_head(&mut state.backlog, entry.id);
                                state.stats.dropped_rejected.add(Count::one(&entry.request));
                                None
                            }
                            Retryability::Retryable { after } => Some(after),
                        }
                    }
                }
            };
            match (result, retry) {
                (Ok(_), _) => attempt = 0,
                (Err(err), None) => {
                    attempt = 0;
                    log_rejected(&err, &entry);
                }
                (Err(err), Some(after)) => {
                    let delay = backoff_delay(&self.backoff, attempt, after, (self.jitter)());
                    attempt = attempt.saturating_add(1);
                    log_retry(&err, delay);
                    self.back_off(delay).await;
                }
            }
        }
        self.finish()
    }

    /// Sleeps `delay`, cut short by a close deadline that comes sooner.
    async fn back_off(&self, delay: Duration) {
        let until = Instant::now() + delay;
        loop {
            let closed = self.shared.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            let until = match self.shared.lock().closing {
                Some(deadline) => until.min(deadline),
                None => until,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                _ = &mut closed => {}
            }
        }
    }

    fn finish(&self) -> FlushReport {
        let report = {
            let mut state = self.shared.lock();
            let report = FlushReport {
                delivered: state.delivered_since_close,
                undelivered: undelivered(&state.backlog),
            };
            state.finished = Some(report);
            report
        };
        self.shared.done.notify_waiters();
        report
    }
}

/// Removes the entry just sent, if a push's eviction has not already taken it.
fn remove_head(backlog: &mut Backlog, id: u64) {
    if backlog.entries.front().is_some_and(|e| e.id == id) {
        backlog.pop_front();
    }
}

fn log_rejected(err: &SendError, entry: &Entry) {
    static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(10));
    if let Some(suppressed) = LIMIT.permit() {
        tracing::error!(
            signal = %entry.signal,
            points = entry.request.items(),
            reason = %err.reason(),
            suppressed_since_last = suppressed,
            "OTLP request dropped, the endpoint refused it for good: {err}"
        );
    }
}

fn log_retry(err: &SendError, delay: Duration) {
    static LIMIT: WarnLimiter = WarnLimiter::new(Duration::from_secs(30));
    if let Some(suppressed) = LIMIT.permit() {
        tracing::warn!(
            reason = %err.reason(),
            retry_in = ?delay,
            suppressed_since_last = suppressed,
            "OTLP export failed, will retry (the data stays queued): {err}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::transport::SendOutcome;
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
            assert_eq!(
                b.push(entry(id, 100, now), 400, None),
                (true, Count::default())
            );
        }
        let (queued, dropped) = b.push(entry(4, 150, now), 400, None);
        assert!(queued);
        assert_eq!(
            dropped,
            Count {
                requests: 2,
                points: 20
            }
        );
        let ids: Vec<_> = b.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, [2, 3, 4]);
        assert_eq!(b.bytes, 350);
    }

    #[test]
    fn a_request_alone_over_the_bound_is_refused_and_nothing_else_dropped() {
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 100, now), 400, None);
        let (queued, dropped) = b.push(entry(1, 401, now), 400, None);
        assert!(!queued);
        assert_eq!(dropped.requests, 1);
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.bytes, 100);
    }

    #[test]
    fn the_request_in_flight_is_not_evicted() {
        let now = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 200, now), 400, None);
        b.push(entry(1, 200, now), 400, None);
        let (queued, dropped) = b.push(entry(2, 200, now), 400, Some(0));
        assert!(queued);
        assert_eq!(dropped.requests, 1);
        let ids: Vec<_> = b.entries.iter().map(|e| e.id).collect();
        assert_eq!(ids, [0, 2]);
    }

    #[test]
    fn expiry_drops_only_what_is_older_than_the_bound() {
        let t0 = Instant::now();
        let mut b = Backlog::default();
        b.push(entry(0, 10, t0), 1000, None);
        b.push(entry(1, 10, t0 + Duration::from_secs(10)), 1000, None);
        b.push(entry(2, 10, t0 + Duration::from_secs(20)), 1000, None);
        let now = t0 + Duration::from_secs(75);
        let dropped = b.expire(now, Duration::from_secs(60), None);
        assert_eq!(dropped.requests, 2);
        assert_eq!(b.entries.front().map(|e| e.id), Some(2));
        assert_eq!(b.bytes, 10);
        // A protected head survives; what follows it still expires.
        let mut b = Backlog::default();
        b.push(entry(0, 10, t0), 1000, None);
        b.push(entry(1, 10, t0), 1000, None);
        assert_eq!(b.expire(now, Duration::from_secs(60), Some(0)).requests, 1);
        assert_eq!(b.entries.len(), 1);
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
