//! Resolving the settings only `run` (and `record`, which runs the same pipeline) reads: the
//! sample and export intervals, the retry queue's bounds, the health address and
//! `--wait-for-gpu`.

use std::net::SocketAddr;
use std::time::Duration;

use super::common::bool_setting;
use super::defaults::{
    DEFAULT_EXPORT_INTERVAL, DEFAULT_QUEUE_MAX_AGE, DEFAULT_QUEUE_MAX_BYTES,
    DEFAULT_SAMPLE_INTERVAL, DEFAULT_WAIT_FOR_GPU, MIN_SAMPLE_INTERVAL,
};
use super::env;
use super::error::{ConfigError, Origin};
use super::layers::{first, Layers};
use super::listen::parse_listen_addr;
use super::settings::QueueLimits;
use crate::cli::RunArgs;
use crate::values;

/// How often NVML is sampled and windows are exported.
pub(super) struct Intervals {
    /// At least [`MIN_SAMPLE_INTERVAL`].
    pub(super) sample: Duration,
    /// At least `sample`.
    pub(super) export: Duration,
}

pub(super) fn intervals(run: &RunArgs, layers: &Layers<'_>) -> Result<Intervals, ConfigError> {
    let sample = first([
        Layers::flag("--sample-interval", run.sample_interval.as_deref()),
        layers.env(env::SAMPLE_INTERVAL),
        layers.file("sample_interval", |f| &f.sample_interval),
    ]);
    let (sample_interval, sample_setting) = match sample {
        Some(raw) => {
            let d = raw.parse(values::parse_duration)?;
            if d < MIN_SAMPLE_INTERVAL {
                return Err(raw.invalid(format!(
                    "below the minimum of {}; NVML counters do not refresh faster",
                    values::format_duration(MIN_SAMPLE_INTERVAL)
                )));
            }
            (d, raw.setting())
        }
        None => (
            DEFAULT_SAMPLE_INTERVAL,
            format!(
                "the default sample interval {}",
                values::format_duration(DEFAULT_SAMPLE_INTERVAL)
            ),
        ),
    };

    let export = first([
        Layers::flag("--export-interval", run.export_interval.as_deref()),
        layers.env(env::EXPORT_INTERVAL),
        layers.env(env::OTEL_METRIC_EXPORT_INTERVAL),
        layers.file("export_interval", |f| &f.export_interval),
    ])
    .unwrap_or_else(|| {
        Layers::default(
            "export interval",
            &values::format_duration(DEFAULT_EXPORT_INTERVAL),
        )
    });
    let export_interval = if export.origin == Origin::Env(env::OTEL_METRIC_EXPORT_INTERVAL.into()) {
        export.parse(values::parse_millis)?
    } else {
        export.parse(values::parse_duration)?
    };
    if export_interval < sample_interval {
        return Err(export.invalid(format!(
            "shorter than {sample_setting}; the export interval must be at least the sample \
             interval, e.g. 10s"
        )));
    }
    Ok(Intervals {
        sample: sample_interval,
        export: export_interval,
    })
}

pub(super) fn health_addr(
    run: &RunArgs,
    layers: &Layers<'_>,
) -> Result<Option<SocketAddr>, ConfigError> {
    first([
        Layers::flag("--health-addr", run.health_addr.as_deref()),
        layers.env(env::HEALTH_ADDR),
        layers.file("health_addr", |f| &f.health_addr),
    ])
    .map(|raw| raw.parse(parse_listen_addr))
    .transpose()
}

pub(super) fn wait_for_gpu(run: &RunArgs, layers: &Layers<'_>) -> Result<bool, ConfigError> {
    bool_setting(
        Layers::switch("--wait-for-gpu", run.wait_for_gpu, true),
        layers,
        env::WAIT_FOR_GPU,
        "wait_for_gpu",
        |f| &f.wait_for_gpu,
        DEFAULT_WAIT_FOR_GPU,
    )
}

pub(super) fn queue_limits(run: &RunArgs, layers: &Layers<'_>) -> Result<QueueLimits, ConfigError> {
    let max_bytes = match first([
        Layers::flag("--queue-max-bytes", run.queue_max_bytes.as_deref()),
        layers.env(env::QUEUE_MAX_BYTES),
        layers.file("queue.max_bytes", |f| &f.queue.max_bytes),
    ]) {
        Some(raw) => {
            let n = raw.parse(values::parse_size)?;
            if n == 0 {
                return Err(raw.invalid("a queue of 0 bytes drops everything; expected e.g. 64MiB"));
            }
            n
        }
        None => DEFAULT_QUEUE_MAX_BYTES,
    };
    let max_age = match first([
        Layers::flag("--queue-max-age", run.queue_max_age.as_deref()),
        layers.env(env::QUEUE_MAX_AGE),
        layers.file("queue.max_age", |f| &f.queue.max_age),
    ]) {
        Some(raw) => {
            let d = raw.parse(values::parse_duration)?;
            if d.is_zero() {
                return Err(raw.invalid("a max age of 0 drops everything; expected e.g. 5m"));
            }
            d
        }
        None => DEFAULT_QUEUE_MAX_AGE,
    };
    Ok(QueueLimits { max_bytes, max_age })
}
