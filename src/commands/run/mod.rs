//! `gpulse run`: the sidecar pipeline. It only moves values between the stages:
//!
//! ```text
//! sampler thread ──Snapshot──▶ WindowLoop (aggregator, then every export interval the
//!   Analyzer: attribution + diagnosis, published to observers) ──▶ metrics + logs requests
//!   ──▶ delivery queue (a lane per signal) ──▶ transports
//! ```
//!
//! Sampling never waits on the network: snapshots go through a bounded channel that the thread
//! never blocks on, and requests go into the delivery queue, whose lanes (metrics, logs,
//! forwarded traces) retry on their own, so one failing endpoint holds back only its signal.
//! SIGTERM/SIGINT stop sampling, export the last (partial) window, give the queue a bounded
//! time to deliver what it holds, and return, so the process exits 0.

mod health;
mod prometheus;
pub(crate) mod status;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::receivers::{self, IntakePlan};
use crate::config::{Config, Sink};
use crate::diagnosis::FindingEvent;
use crate::enrich::Receivers;
use crate::export::metrics::Extremes;
use crate::export::transport::TransportBuildError;
use crate::export::Exporter;
use crate::pipeline::{
    snapshot_channel, SamplerHealth, SamplerSettings, SamplerThread, WindowLoop,
};
use crate::sampling::{SessionError, Snapshot};

/// Why `gpulse run` could not start. Once running, nothing is fatal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    #[error(transparent)]
    Nvml(#[from] SessionError),
    #[error(transparent)]
    Transport(#[from] TransportBuildError),
    #[error("could not listen for health checks on {addr}: {source}. Pick a free address with --health-addr")]
    Health {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Receiver(#[from] crate::enrich::ReceiverError),
    #[error("could not serve Prometheus metrics on {addr}: {source}. Pick a free address with --prometheus-addr")]
    Prometheus {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How long the last flush may take at shutdown, at most: Kubernetes gives 30 s by default
/// between SIGTERM and SIGKILL.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(10);

/// Runs until SIGTERM or SIGINT.
///
/// # Errors
/// Only at start: NVML cannot be opened (without `--wait-for-gpu`), the exporter settings are
/// refused, or the health address is taken.
pub async fn run(config: Config) -> Result<(), RunError> {
    let mut pipeline = Pipeline::start(&config).await?;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut export_tick = tokio::time::interval_at(
        Instant::now() + config.export_interval,
        config.export_interval,
    );
    export_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let watchdog_after = (config.sample_interval * 3).max(Duration::from_secs(2));
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(snapshot) = pipeline.snapshots.recv() => pipeline.windows.add(&snapshot),
            _ = export_tick.tick() => {
                pipeline.watch_sampler(watchdog_after);
                pipeline.export_window();
            }
        }
    }
    pipeline.shutdown().await;
    Ok(())
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: flushing and stopping"),
                _ = int.recv() => tracing::info!("SIGINT: flushing and stopping"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

struct Pipeline {
    snapshots: mpsc::Receiver<Snapshot>,
    sampler: Option<SamplerThread>,
    sampler_health: Arc<SamplerHealth>,
    /// Snapshots → windows → analyses.
    windows: WindowLoop,
    /// The node identity, the delivery queue and gpulse's own health metrics.
    exporter: Exporter,
    stall_reported: bool,
    _health_server: Option<tokio::task::JoinHandle<()>>,
    /// The local OTLP receivers (`--otlp-receiver-*`), whose history observes the window loop.
    receivers: Option<Receivers>,
    /// `/metrics` (`--prometheus-addr`).
    _prometheus: Option<prometheus::MetricsEndpoint>,
}

impl Pipeline {
    async fn start(config: &Config) -> Result<Self, RunError> {
        // Created first so that every observer (health, /status, /metrics) can subscribe to it.
        let mut windows = WindowLoop::new(&config.common.analysis);

        let (tx, snapshots) = snapshot_channel(config.sample_interval, config.export_interval);
        let sampler = SamplerThread::spawn(
            SamplerSettings {
                nvml_lib: config.common.nvml_lib.clone(),
                interval: config.sample_interval,
                wait_for_gpu: config.wait_for_gpu,
                // Fields of switched-off metrics that no rule, accounting or enrichment reads.
                unread_fields: crate::pipeline::unread_fields(&config.common.metrics),
            },
            tx,
        )?;
        let sampler_health = Arc::clone(&sampler.health);
        let exporter = Exporter::start(
            &config.export,
            (
                Extremes::for_intervals(config.sample_interval, config.export_interval),
                config.common.metrics,
            ),
            Arc::clone(&sampler_health),
            windows.subscribe(),
        )?;
        tracing::info!(
            nvml_lib = %config.common.nvml_lib.display(),
            sample_interval = ?config.sample_interval,
            export_interval = ?config.export_interval,
            service.name = %exporter.node().service_name,
            "gpulse {} starting",
            env!("CARGO_PKG_VERSION")
        );
        log_sinks(config);
        log_switches(&config.common.metrics);
        let health_server = match config.health_addr {
            Some(addr) => Some(
                health::serve(
                    addr,
                    Arc::clone(&sampler_health),
                    config.sample_interval,
                    windows.subscribe(),
                )
                .await
                .map_err(|source| RunError::Health { addr, source })?,
            ),
            None => None,
        };
        let receivers = if config.otlp_receiver.enabled() {
            Some(
                receivers::start(
                    IntakePlan::forwarding(config, &exporter, None),
                    &mut windows,
                )
                .await?,
            )
        } else {
            None
        };
        let prometheus = match config.prometheus.addr {
            Some(addr) => Some(
                prometheus::start(
                    addr,
                    config.prometheus.clone(),
                    config.common.metrics,
                    exporter.node().clone(),
                    windows.subscribe(),
                )
                .await
                .map_err(|source| RunError::Prometheus { addr, source })?,
            ),
            None => None,
        };
        warn_if_no_processes_visible(&config.common.analysis.proc_root);
        Ok(Self {
            snapshots,
            sampler: Some(sampler),
            sampler_health,
            windows,
            exporter,
            stall_reported: false,
            _health_server: health_server,
            receivers,
            _prometheus: prometheus,
        })
    }

    /// Says (once per stall) when the sampler thread has not finished a tick for a while: an
    /// NVML call is hanging. Ticks are being skipped meanwhile, not queued.
    fn watch_sampler(&mut self, after: Duration) {
        match self.sampler_health.since_last_tick() {
            Some(since) if since > after => {
                if !self.stall_reported {
                    tracing::error!(
                        "the sampler has not completed a tick for {:.0?}: an NVML call is hanging \
                         (driver busy or GPU in a bad state). Ticks are skipped until it returns; \
                         check `nvidia-smi` and the kernel log (dmesg) for Xid errors",
                        since
                    );
                    self.stall_reported = true;
                }
            }
            _ => self.stall_reported = false,
        }
    }

    /// Closes the window and queues its requests. Never waits on the network.
    fn export_window(&mut self) {
        let analysis = self.windows.close_window();
        // Logged whatever the logs exporter: with `none` (Prometheus-only) these lines and the
        // /metrics findings gauge are what the on-call engineer has.
        if let Some(analysis) = &analysis {
            analysis.events.iter().for_each(log_finding);
        }
        self.exporter.export(analysis.as_ref());
    }

    async fn shutdown(mut self) {
        if let Some(receivers) = &self.receivers {
            receivers.stop().await;
        }
        if let Some(sampler) = self.sampler.take() {
            if !sampler.stop(Duration::from_secs(2)) {
                tracing::warn!("the sampler thread is stuck in an NVML call; leaving it behind");
            }
        }
        while let Ok(snapshot) = self.snapshots.try_recv() {
            self.windows.add(&snapshot);
        }
        self.export_window();
        let outcome = self.exporter.shutdown(SHUTDOWN_FLUSH).await;
        if outcome.flush.undelivered.requests > 0 {
            tracing::warn!(
                "stopped with {} request(s) ({} points) not delivered: the backend did not accept \
                 them within {:?}",
                outcome.flush.undelivered.requests,
                outcome.flush.undelivered.points,
                SHUTDOWN_FLUSH
            );
        }
        tracing::info!("gpulse stopped");
    }
}

/// One line at start naming the metrics switched off (`[metrics]`) and the NVML fields left
/// unread for them, so that a missing series can be traced to its switch.
fn log_switches(switches: &crate::schema::MetricSwitches) {
    let off: Vec<&str> = switches
        .disabled_metrics()
        .map(|id| id.spec().name)
        .collect();
    if off.is_empty() {
        return;
    }
    let unread_fields = crate::pipeline::unread_fields(switches);
    let unread: Vec<&str> = (unread_fields.device.iter().map(|f| f.spec().key))
        .chain(
            crate::schema::GPM_FIELDS
                .iter()
                .filter(|spec| unread_fields.gpm.contains(&spec.field))
                .map(|spec| spec.key),
        )
        .collect();
    tracing::info!(
        "metrics switched off: {}; NVML fields not read for them: {}",
        off.join(", "),
        if unread.is_empty() {
            "none (the analysis reads them)".to_string()
        } else {
            unread.join(", ")
        }
    );
}

/// One line at start saying where each signal goes, so that a Prometheus-only or logs-only
/// deployment can be told from a misconfigured one at a glance.
fn log_sinks(config: &Config) {
    let sinks = &config.export.sinks;
    let metrics = match (sinks.metrics, config.prometheus.addr) {
        (Sink::Off, Some(addr)) => format!("prometheus http://{addr}/metrics"),
        (sink, Some(addr)) => format!("{} and prometheus http://{addr}/metrics", sink.as_str()),
        (sink, None) => sink.as_str().to_string(),
    };
    tracing::info!(
        metrics = %metrics,
        logs = sinks.logs.as_str(),
        forwarded = sinks.forward.as_str(),
        "exporters"
    );
}

/// One warning at start when the procfs root shows no process at all (an empty or wrong
/// `--proc-root`, or a sidecar without the host's PIDs): every GPU process would then be exported
/// with its PID only, and nothing else would say why.
fn warn_if_no_processes_visible(proc_root: &std::path::Path) {
    let visible = std::fs::read_dir(proc_root)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        })
        .unwrap_or(false);
    if !visible {
        tracing::warn!(
            "no process is visible under the proc root {}: GPU processes will be exported with \
             their PID only (no container, pod or service name). Mount the host's /proc \
             read-only (e.g. at /host/proc) and point --proc-root or HOST_PROC at it",
            proc_root.display()
        );
    }
}

fn log_finding(event: &FindingEvent) {
    let f = &event.finding;
    tracing::info!(
        rule = f.rule.as_str(),
        state = event.state.as_str(),
        "finding {}: {}",
        event.state.as_str(),
        f.summary
    );
}
