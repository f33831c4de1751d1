//! The sampler thread: NVML calls block, so they run on one dedicated thread that ticks at the
//! sample interval and hands each `Snapshot` to the pipeline without ever waiting for it.
//!
//! A tick that overruns (a slow or hung NVML call) makes the thread skip the ticks it missed
//! instead of bursting to catch up (tokio's `MissedTickBehavior::Skip`), and each skipped tick is
//! counted. If NVML as a whole stops answering (driver unloaded), the session is dropped and
//! re-opened with exponential backoff; the pipeline keeps exporting gpulse's own health meanwhile.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::reads::UnreadFields;
use crate::sampling::events::XidWatcher;
use crate::sampling::{Sampler, SessionError, Snapshot};

/// The channel between the sampler thread and a loop that closes a window every `window`:
/// room for two windows of snapshots (4 to 4096 of them, twice), so that a loop busy with one
/// window never makes the thread wait (a full channel drops the snapshot and counts it).
pub fn snapshot_channel(
    sample_interval: Duration,
    window: Duration,
) -> (mpsc::Sender<Snapshot>, mpsc::Receiver<Snapshot>) {
    let per_window = (window.as_nanos() / sample_interval.as_nanos()).clamp(4, 4096) as usize;
    mpsc::channel(per_window * 2)
}

/// Longest wait between two attempts to re-open NVML.
const MAX_REOPEN_BACKOFF: Duration = Duration::from_secs(30);

/// What the sampler thread tells the rest of gpulse about itself.
#[derive(Debug, Default)]
pub struct SamplerHealth {
    /// Ticks skipped because a sample took longer than the interval.
    pub stalled_ticks: AtomicU64,
    /// Snapshots dropped because the pipeline was not keeping up.
    pub dropped_snapshots: AtomicU64,
    /// Nanoseconds since the thread started at which the last tick finished (0: none yet).
    pub last_tick_done_ns: AtomicU64,
    /// Whether an NVML session is open now.
    pub session_up: AtomicBool,
    /// Durations of the samples taken since the last `take_durations`, seconds.
    durations: Mutex<Vec<f64>>,
    /// NVML call errors by kind, cumulative over every session (copied from the sessions).
    nvml_errors: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Failed attempts to open NVML, by kind; kept apart so a session's copy cannot overwrite them.
    open_errors: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    started: Option<Instant>,
}

impl SamplerHealth {
    fn new() -> Self {
        Self {
            started: Some(Instant::now()),
            ..Self::default()
        }
    }

    /// Sample durations (seconds) since the previous call.
    pub fn take_durations(&self) -> Vec<f64> {
        std::mem::take(&mut *self.durations.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// NVML errors by kind since gpulse started.
    pub(crate) fn nvml_errors(&self) -> std::collections::BTreeMap<String, u64> {
        let mut total: std::collections::BTreeMap<String, u64> = self
            .nvml_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        for (kind, count) in self
            .open_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            *total.entry(kind.to_string()).or_insert(0) += count;
        }
        total
    }

    /// How long ago the last tick finished; `None` before the first.
    pub(crate) fn since_last_tick(&self) -> Option<Duration> {
        let done = self.last_tick_done_ns.load(Ordering::Relaxed);
        let started = self.started?;
        (done > 0).then(|| started.elapsed().saturating_sub(Duration::from_nanos(done)))
    }

    fn tick_done(&self, took: Duration) {
        if let Some(started) = self.started {
            self.last_tick_done_ns
                .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        self.durations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(took.as_secs_f64());
    }

    fn merge_errors(
        &self,
        session: &std::collections::BTreeMap<&'static str, u64>,
        base: &std::collections::BTreeMap<&'static str, u64>,
    ) {
        let mut errors = self.nvml_errors.lock().unwrap_or_else(|p| p.into_inner());
        for (kind, count) in session {
            errors.insert(kind, base.get(kind).copied().unwrap_or(0) + count);
        }
    }

    fn count_open_error(&self, kind: &'static str) {
        *self
            .open_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_insert(0) += 1;
    }
}

/// Settings of the sampler thread.
#[derive(Debug, Clone)]
pub struct SamplerSettings {
    pub nvml_lib: PathBuf,
    pub interval: Duration,
    /// Keep retrying when NVML cannot be opened at start, instead of failing.
    pub wait_for_gpu: bool,
    /// Device fields and GPM metrics not read from NVML ([`super::unread_fields`]); empty
    /// reads everything.
    pub unread_fields: UnreadFields,
}

/// The running sampler thread; stop it with `stop`.
pub struct SamplerThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    pub health: Arc<SamplerHealth>,
}

impl SamplerThread {
    /// Opens NVML and starts ticking.
    ///
    /// # Errors
    /// The `SessionError` of the first open, unless `wait_for_gpu` is set and the error is
    /// transient ([`SessionError::is_transient`]), in which case the thread keeps retrying (with
    /// backoff) and the error is only logged.
    pub fn spawn(
        settings: SamplerSettings,
        snapshots: mpsc::Sender<Snapshot>,
    ) -> Result<Self, SessionError> {
        let health = Arc::new(SamplerHealth::new());
        let first = match Sampler::open(&settings.nvml_lib) {
            Ok(mut sampler) => {
                settings.unread_fields.apply(&mut sampler);
                Some(sampler)
            }
            Err(e) if settings.wait_for_gpu && !e.is_transient() => {
                tracing::error!(
                    "--wait-for-gpu waits for a driver that is not loaded or installed yet, not \
                     for a library path that cannot be loaded: fix --nvml-lib / GPULSE_NVML_LIB"
                );
                return Err(e);
            }
            Err(e) if settings.wait_for_gpu => {
                tracing::warn!("{e}. Waiting for the GPU (--wait-for-gpu): retrying with backoff");
                health.count_open_error(e.kind());
                None
            }
            Err(e) => return Err(e),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread_health = Arc::clone(&health);
        let handle = std::thread::Builder::new()
            .name("gpulse-sampler".into())
            .spawn(move || tick_loop(settings, first, snapshots, &thread_stop, &thread_health))
            .expect("spawning the sampler thread");
        Ok(Self {
            stop,
            handle: Some(handle),
            health,
        })
    }

    /// Asks the thread to stop and waits for it to finish its current tick. A hung NVML call
    /// cannot be interrupted: after `patience` the thread is left behind (the process is
    /// exiting anyway) and `false` is returned.
    pub fn stop(mut self, patience: Duration) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        let Some(handle) = self.handle.take() else {
            return true;
        };
        handle.thread().unpark();
        let deadline = Instant::now() + patience;
        while !handle.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = handle.join();
        true
    }
}

/// Sleeps until `until`, waking early when `stop` is set (`SamplerThread::stop` unparks the
/// thread). Returns false when stopping. One wake-up per tick: polling the flag would cost more
/// CPU than sampling does.
fn sleep_until(until: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        // Spurious and early wake-ups just go round the loop again.
        std::thread::park_timeout(until - now);
    }
}

struct Session {
    sampler: Sampler,
    xid: XidWatcher,
    /// Error counts of the sessions before this one, so the totals stay cumulative.
    base_errors: std::collections::BTreeMap<&'static str, u64>,
}

fn tick_loop(
    settings: SamplerSettings,
    first: Option<Sampler>,
    snapshots: mpsc::Sender<Snapshot>,
    stop: &AtomicBool,
    health: &SamplerHealth,
) {
    let mut base_errors = std::collections::BTreeMap::new();
    let mut session = first.map(|sampler| Session {
        xid: XidWatcher::start(Arc::clone(sampler.nvml())),
        sampler,
        base_errors: base_errors.clone(),
    });
    let mut backoff = Duration::from_secs(1);
    let mut next_open = Instant::now();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if session.is_none() && started >= next_open {
            match Sampler::open(&settings.nvml_lib) {
                Ok(mut sampler) => {
                    settings.unread_fields.apply(&mut sampler);
                    tracing::info!("NVML session opened from {:?}", settings.nvml_lib);
                    session = Some(Session {
                        xid: XidWatcher::start(Arc::clone(sampler.nvml())),
                        sampler,
                        base_errors: base_errors.clone(),
                    });
                    backoff = Duration::from_secs(1);
                }
                Err(e) => {
                    health.count_open_error(e.kind());
                    tracing::warn!("{e}. Retrying in {}s", backoff.as_secs());
                    next_open = started + backoff;
                    backoff = (backoff * 2).min(MAX_REOPEN_BACKOFF);
                }
            }
        }
        health
            .session_up
            .store(session.is_some(), Ordering::Relaxed);
        if let Some(s) = session.as_mut() {
            match s.sampler.sample() {
                Ok(mut snapshot) => {
                    snapshot.events = s.xid.drain();
                    health.merge_errors(s.sampler.error_counts(), &s.base_errors);
                    if snapshots.try_send(snapshot).is_err() {
                        if snapshots.is_closed() {
                            return;
                        }
                        health.dropped_snapshots.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    health.merge_errors(s.sampler.error_counts(), &s.base_errors);
                    for (kind, count) in s.sampler.error_counts() {
                        *base_errors.entry(kind).or_insert(0) += count;
                    }
                    tracing::error!(
                        "{e}. NVML stopped answering as a whole; gpulse re-opens it with backoff \
                         and keeps exporting its own health meanwhile"
                    );
                    session = None;
                    health.session_up.store(false, Ordering::Relaxed);
                    next_open = Instant::now() + backoff;
                }
            }
        }
        health.tick_done(started.elapsed());
        next += settings.interval;
        let now = Instant::now();
        if now > next {
            let behind = now - next;
            let missed = (behind.as_nanos() / settings.interval.as_nanos()) as u32 + 1;
            health
                .stalled_ticks
                .fetch_add(u64::from(missed), Ordering::Relaxed);
            let took = started.elapsed();
            if took > settings.interval {
                tracing::warn!(
                    "a sample took {took:.0?}, longer than the {:.0?} interval (a slow NVML \
                     call): skipped {missed} tick(s)",
                    settings.interval
                );
            } else {
                // The sample itself was quick: the thread woke late (CPU contention, a
                // throttled container quota, a suspended VM), so blaming NVML would mislead.
                tracing::warn!(
                    "gpulse ran {behind:.0?} late (the sample itself took {took:.0?}; the \
                     process was not scheduled in time, e.g. CPU contention or a CPU quota): \
                     skipped {missed} tick(s) of {:.0?}",
                    settings.interval
                );
            }
            next += settings.interval * missed;
        }
        if !sleep_until(next, stop) {
            break;
        }
    }
}
