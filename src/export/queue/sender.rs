//! The sending side of the queue: a few workers per lane that claim the oldest idle request,
//! send it, and settle the outcome (delivered, retried after a backoff with jitter, or dropped
//! for good), until the queue is closed and empty or its deadline passes.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::backlog::Entry;
use super::{
    backoff_delay, lane_index, undelivered, workers_for, BackoffPolicy, Count, FlushReport, Shared,
    SIGNALS,
};
use crate::export::transport::{Retryability, SendError, Signal, Transport, WarnLimiter};

/// The consumer's side: spawn [`SenderTask::run`] once.
pub struct SenderTask<T> {
    pub(super) shared: Arc<Shared>,
    pub(super) transport: T,
    pub(super) backoff: BackoffPolicy,
    pub(super) jitter: fn() -> f64,
}

/// What a lane worker does next.
enum Next {
    Send(Entry),
    /// The lane is backing off until then.
    Pause(Instant),
    Idle,
    Stop,
}

impl<T: Transport + 'static> SenderTask<T> {
    /// Replaces the jitter source (a uniform draw in `[0, 1)`), for deterministic tests.
    pub fn with_jitter(mut self, jitter: fn() -> f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Runs every lane's workers until the queue is closed and empty, or its close deadline
    /// passes.
    ///
    /// # Cancel safety
    /// Dropping the future stops the workers and loses nothing queued: a request being sent
    /// stays queued.
    pub async fn run(self) -> FlushReport {
        let task = Arc::new(self);
        let mut workers = JoinSet::new();
        for signal in SIGNALS {
            for _ in 0..workers_for(signal) {
                workers.spawn(Arc::clone(&task).lane_worker(signal));
            }
        }
        while let Some(result) = workers.join_next().await {
            if let Err(err) = result {
                if err.is_panic() {
                    tracing::error!(
                        "an OTLP delivery worker panicked; its lane goes on with fewer workers \
                         (a bug: please report it with the log above): {err}"
                    );
                }
            }
        }
        task.finish()
    }

    /// One worker of `signal`'s lane: claims the oldest idle request, sends it, settles it.
    async fn lane_worker(self: Arc<Self>, signal: Signal) {
        let shared = &self.shared;
        let lane = lane_index(signal);
        loop {
            let wake = shared.wake[lane].notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let (next, closing) = {
                let mut state = shared.lock();
                let now = Instant::now();
                let expired = state.backlog.expire(now, shared.limits.max_age);
                state.stats.dropped_expired.add(expired);
                let closing = state.closing;
                let next = if closing.is_some_and(|deadline| now >= deadline) {
                    Next::Stop
                } else {
                    match state.backlog.lane(signal).resume_at {
                        Some(until) if until > now => Next::Pause(until),
                        _ => match state.backlog.claim(signal) {
                            Some(entry) => Next::Send(entry),
                            None if closing.is_some() => Next::Stop,
                            None => Next::Idle,
                        },
                    }
                };
                (next, closing)
            };
            let entry = match next {
                Next::Stop => return,
                Next::Idle => {
                    wake.await;
                    continue;
                }
                Next::Pause(until) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        () = shared.close_deadline() => {}
                    }
                    continue;
                }
                Next::Send(entry) => entry,
            };

            let started = Instant::now();
            let result = tokio::select! {
                result = self.transport.send(signal, &entry.request) => result,
                () = shared.close_deadline() => {
                    shared.lock().backlog.settle(signal, entry.id, false);
                    return;
                }
            };
            let elapsed = started.elapsed();
            self.settle(&entry, result, elapsed, closing);
        }
    }

    /// Records the end of an attempt: counts, removes or requeues the entry, pauses the lane
    /// after a retryable failure.
    fn settle(
        &self,
        entry: &Entry,
        result: Result<crate::export::transport::SendOutcome, SendError>,
        elapsed: Duration,
        closing_at_start: Option<Instant>,
    ) {
        let signal = entry.signal;
        let mut state = self.shared.lock();
        match result {
            Ok(outcome) => {
                state.backlog.settle(signal, entry.id, true);
                let one = Count::one(&entry.request);
                state.stats.delivered.add(one);
                if state.closing.is_some() || closing_at_start.is_some() {
                    state.delivered_since_close.add(one);
                }
                state.stats.last_export_latency = Some(elapsed);
                if let Some(partial) = &outcome.partial_success {
                    state.stats.rejected_in_partial_success +=
                        u64::try_from(partial.rejected).unwrap_or(0);
                }
                let lane = state.backlog.lane_mut(signal);
                lane.delivered.add(one);
                lane.attempt = 0;
                lane.resume_at = None;
                let more = lane.first_idle().is_some();
                drop(state);
                if more {
                    // Back to full concurrency after a pause, which only one worker sleeps on.
                    self.shared.wake[lane_index(signal)].notify_waiters();
                }
            }
            Err(err) => {
                *state.stats.failures.entry(err.reason()).or_default() += 1;
                match err.retryability() {
                    Retryability::Permanent => {
                        state.backlog.settle(signal, entry.id, true);
                        state.stats.dropped_rejected.add(Count::one(&entry.request));
                        drop(state);
                        log_rejected(&err, entry);
                    }
                    Retryability::Retryable { after } => {
                        state.backlog.settle(signal, entry.id, false);
                        let now = Instant::now();
                        let lane = state.backlog.lane_mut(signal);
                        // Workers failing together in one outage back off once, not N times.
                        if lane.resume_at.is_none_or(|until| until <= now) {
                            let delay =
                                backoff_delay(&self.backoff, lane.attempt, after, (self.jitter)());
                            lane.attempt = lane.attempt.saturating_add(1);
                            lane.resume_at = Some(now + delay);
                            drop(state);
                            log_retry(&err, signal, delay);
                        }
                    }
                }
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

fn log_retry(err: &SendError, signal: Signal, delay: Duration) {
    // One limiter per lane: a trace backend failing all day must not mute a metrics outage.
    static LIMITS: [WarnLimiter; 3] = [
        WarnLimiter::new(Duration::from_secs(30)),
        WarnLimiter::new(Duration::from_secs(30)),
        WarnLimiter::new(Duration::from_secs(30)),
    ];
    if let Some(suppressed) = LIMITS[lane_index(signal)].permit() {
        tracing::warn!(
            reason = %err.reason(),
            retry_in = ?delay,
            suppressed_since_last = suppressed,
            "OTLP export failed, will retry (the data stays queued, the other signals go on): {err}"
        );
    }
}
