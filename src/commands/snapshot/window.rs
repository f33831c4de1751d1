//! `gpulse snapshot --window D`: samples for `D` and analyses the samples as one window, with the
//! [`Analyzer`] `gpulse run` uses, so the answer is what `run` would export for a window of that
//! length (and what its `/status` would show): utilisation and power as means, each process's CPU
//! use, and the findings one window supports. A single sample cannot tell a busy CPU (no second
//! reading of its counters) nor how long a process has been idle; a few seconds can.

use std::time::{Duration, Instant};

use crate::cli::SnapshotArgs;
use crate::config::{InspectConfig, MIN_SAMPLE_INTERVAL};
use crate::pipeline::{Analyzer, SnapshotReport};
use crate::sampling::{Sampler, SessionError, WindowAggregator};
use crate::values;

use super::render::{render_json, render_table};

/// Samples taken over a window, at most: enough for means and throttle shares, few enough
/// that a long window does not sample faster than `run` would.
const SAMPLES_PER_WINDOW: u32 = 20;
/// The slowest a window is sampled, `run`'s default sample interval.
const MAX_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest window: two samples at the fastest sample interval.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// A `--window` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--window {given}: {reason}")]
pub struct WindowError {
    given: String,
    reason: String,
}

/// The window `--window` asks for; `None` for one sample.
///
/// # Errors
/// Not a duration, or shorter than [`MIN_WINDOW`].
pub fn window(args: &SnapshotArgs) -> Result<Option<Duration>, WindowError> {
    let Some(given) = &args.window else {
        return Ok(None);
    };
    let window = values::parse_duration(given).map_err(|reason| WindowError {
        given: given.clone(),
        reason,
    })?;
    if window < MIN_WINDOW {
        return Err(WindowError {
            given: given.clone(),
            reason: format!(
                "shorter than {}, too short for two samples; use e.g. 5s, or leave --window out \
                 for one sample",
                values::format_duration(MIN_WINDOW)
            ),
        });
    }
    Ok(Some(window))
}

/// How often a window of `span` is sampled: [`SAMPLES_PER_WINDOW`] times, between the fastest
/// sample interval and [`MAX_SAMPLE_INTERVAL`].
pub(crate) fn sample_interval(span: Duration) -> Duration {
    (span / SAMPLES_PER_WINDOW).clamp(MIN_SAMPLE_INTERVAL, MAX_SAMPLE_INTERVAL)
}

/// Samples for `span`, analyses the samples as one window and renders the result in the
/// configured format; `None` when the samples made no window (the caller prints one sample).
///
/// # Errors
/// NVML could not be opened or stopped answering; the message says what to do.
pub(crate) fn windowed_snapshot(
    config: &InspectConfig,
    span: Duration,
) -> Result<Option<String>, SessionError> {
    let mut sampler = Sampler::open(&config.common.nvml_lib)?;
    // The attributor fetches pod names from the kubelet socket on a task of this runtime, while
    // the window is sampled; without a runtime only the names are missing.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gpulse-snapshot-rt")
        .enable_all()
        .build()
        .inspect_err(|e| tracing::warn!("no pod names for this snapshot: {e}"))
        .ok();
    let _entered = runtime.as_ref().map(|r| r.enter());
    let mut analyzer = Analyzer::new(&config.common.analysis);
    let views = analyzer.subscribe();
    let interval = sample_interval(span);
    sampler.prime_gpm();

    let mut aggregator = WindowAggregator::new();
    // The first sample gives each process's CPU counters a starting point (as `run`'s first
    // window does); the window proper is every later sample. Ticks count from after it, so a
    // slow first sample (many processes, a busy machine) does not shorten the window.
    let first = sampler.sample()?;
    let start = Instant::now();
    aggregator.add(&first);
    if let Some(priming) = aggregator.take() {
        analyzer.prime(priming);
    }
    let mut last = first;
    for tick in 1.. {
        let due = start + interval * tick;
        if due > start + span {
            break;
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        last = sampler.sample()?;
        aggregator.add(&last);
    }
    if let Some(window) = aggregator.take() {
        analyzer.analyze(window);
    }
    let view = views.borrow().clone();
    let Some(view) = view else {
        return Ok(None);
    };
    let mut report = SnapshotReport::of_view(&view);
    report.nvml_version = last.nvml_version.as_deref();
    Ok(Some(match config.format {
        crate::cli::OutputFormat::Json => render_json(&report) + "\n",
        crate::cli::OutputFormat::Table => render_table(&report),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(window: &str) -> SnapshotArgs {
        SnapshotArgs {
            window: Some(window.into()),
            ..SnapshotArgs::default()
        }
    }

    #[test]
    fn a_window_is_sampled_twenty_times_within_the_sample_interval_bounds() {
        assert_eq!(
            sample_interval(Duration::from_secs(4)),
            Duration::from_millis(200)
        );
        assert_eq!(sample_interval(MIN_WINDOW), MIN_SAMPLE_INTERVAL);
        assert_eq!(
            sample_interval(Duration::from_secs(600)),
            MAX_SAMPLE_INTERVAL
        );
    }

    #[test]
    fn window_flag_is_checked() {
        assert_eq!(window(&SnapshotArgs::default()).unwrap(), None);
        assert_eq!(window(&args("4s")).unwrap(), Some(Duration::from_secs(4)));
        let e = window(&args("10ms")).unwrap_err().to_string();
        assert!(e.starts_with("--window 10ms: shorter than 100ms"), "{e}");
        let e = window(&args("soon")).unwrap_err().to_string();
        assert!(e.starts_with("--window soon: "), "{e}");
    }
}
