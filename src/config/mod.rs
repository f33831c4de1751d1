//! Configuration: command-line flags, environment (`GPULSE_*` and the standard `OTEL_*`
//! variables) and the TOML config file, merged into one validated [`Config`] (for `run` and
//! `record`) or [`InspectConfig`] (for `snapshot`, `check` and `top`).
//!
//! # Composition
//!
//! Both configurations embed the same [`CommonSettings`] (NVML, logging, and the
//! [`AnalysisSettings`] the analyzer is built from); `Config` adds the [`ExportSettings`] of the
//! exporter and the rest of `run`'s own settings. Each stage is handed its own part, never a whole
//! configuration. The value types are in `settings` (and `otlp`, `sinks`, `prometheus`,
//! `receiver`, `downward`, `thresholds`: the `[diagnosis]` table), every default and bound in
//! `defaults`; the other files resolve. Nothing here imports a stage: `config` sits below all of
//! them, above only [`crate::cli`] and [`crate::values`].
//!
//! # Precedence
//!
//! **flags > environment > config file > defaults**, for every setting. Within the environment
//! a gpulse-specific or signal-specific variable beats the generic one
//! (`GPULSE_EXPORT_INTERVAL` > `OTEL_METRIC_EXPORT_INTERVAL`, `GPULSE_PROC_ROOT` > `HOST_PROC`,
//! `GPULSE_SERVICE_NAME` > `OTEL_SERVICE_NAME` > `service.name` in `OTEL_RESOURCE_ATTRIBUTES`,
//! `GPULSE_LOG` > `RUST_LOG`, `OTEL_EXPORTER_OTLP_METRICS_*` > `OTEL_EXPORTER_OTLP_*`); within
//! the file a `[otlp.metrics]` key beats the `[otlp]` one. An empty variable counts as unset, as
//! the OTel specification requires. Only the winning value is parsed. Resource attributes are
//! the one merge: file attributes, then `OTEL_RESOURCE_ATTRIBUTES` per key on top.
//!
//! # Layers
//!
//! As in ripgrep: a low level close to what was written ([`crate::cli`] for flags,
//! [`file::FileConfig`] for the file, the raw environment through an injectable lookup), and the
//! resolved [`Config`], validated, which may touch the filesystem (TLS files and the proc root
//! must exist). Every error names the flag, variable or file key (with `path:line:column`) and
//! says what a valid value looks like; see [`ConfigError`].
//!
//! # Example
//!
//! ```no_run
//! use clap::Parser;
//! use gpulse::cli::{Cli, Command};
//! use gpulse::config::{self, Config, InspectConfig};
//!
//! let cli = Cli::parse();
//! match &cli.command {
//!     Command::Run(run) => {
//!         let config = Config::resolve(&cli.global, run, &config::process_env)?;
//!         for warning in &config.warnings {
//!             eprintln!("warning: {warning}");
//!         }
//!     }
//!     Command::Snapshot(args) => {
//!         let config = InspectConfig::resolve(&cli.global, &args.inspect, &config::process_env)?;
//!         println!("{:?}", config.format);
//!     }
//!     Command::Check(args) => {
//!         let config = InspectConfig::resolve(&cli.global, &args.inspect, &config::process_env)?;
//!         println!("{:?}", config.format);
//!     }
//!     // `top` reads the same settings as `snapshot`, with the default output format.
//!     Command::Top(_) => {
//!         let config =
//!             InspectConfig::resolve(&cli.global, &Default::default(), &config::process_env)?;
//!         println!("{}", config.common.analysis.proc_root.display());
//!     }
//!     // `record` resolves `run`'s settings from its own flags; `report` reads a file only.
//!     Command::Record(_) | Command::Report(_) => {}
//! }
//! # Ok::<(), config::ConfigError>(())
//! ```

mod common;
pub mod cost;
pub mod dcgm_counters;
pub mod defaults;
pub mod downward;
pub mod env;
pub mod error;
pub mod exporter;
pub mod file;
mod layers;
mod listen;
pub mod metrics;
pub mod otlp;
pub mod prometheus;
mod receiver;
mod run;
pub mod settings;
pub mod sinks;
pub mod thresholds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use defaults::{
    DEFAULT_KUBELET_SOCKET, DEFAULT_LOG_LEVEL, DEFAULT_NVML_LIB, DEFAULT_PROC_ROOT,
    MAX_ENRICH_HISTORY, MIN_SAMPLE_INTERVAL,
};
pub use env::{process_env, EnvLookup};
pub use error::{ConfigError, Origin, Raw};
pub use file::{FileConfig, LoadedFile};
pub use prometheus::{PrometheusNames, PrometheusSettings};
pub use receiver::ReceiverSettings;
pub use settings::{
    AnalysisSettings, CommonSettings, ExportSettings, LogFormat, LogSettings, QueueLimits,
};
pub use sinks::{SignalSinks, Sink};

use crate::cli::{CostArgs, GlobalArgs, InspectArgs, OutputFormat, RunArgs, TopArgs};
use common::resource;
use layers::Layers;
use otlp::ExporterKind;

/// Everything `gpulse run` (and `gpulse record`) needs, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// NVML, logging and the analysis settings, as every command resolves them.
    pub common: CommonSettings,
    /// At least [`MIN_SAMPLE_INTERVAL`].
    pub sample_interval: Duration,
    /// At least `sample_interval`.
    pub export_interval: Duration,
    /// What the exporter is built from.
    pub export: ExportSettings,
    /// `None`: no health endpoint.
    pub health_addr: Option<SocketAddr>,
    pub wait_for_gpu: bool,
    /// The local OTLP receiver and span enrichment (`enrich`).
    pub otlp_receiver: ReceiverSettings,
    /// `/metrics` for Prometheus (`--prometheus-*`).
    pub prometheus: PrometheusSettings,
    /// Problems that did not stop the start and that `main` should log once logging is up (the
    /// specification says a malformed `OTEL_RESOURCE_ATTRIBUTES` is discarded and reported, not
    /// fatal).
    pub warnings: Vec<String>,
}

/// What `gpulse snapshot`, `check` and `top` need: the common settings (so that they show
/// workloads as `run` would export them) and the output format. Run-only settings (intervals,
/// exporter, queue) are not read, so a broken exporter setting does not stop a diagnosis.
#[derive(Debug, Clone, PartialEq)]
pub struct InspectConfig {
    pub common: CommonSettings,
    pub format: OutputFormat,
    /// `top`'s local OTLP receiver (`--otlp-receiver-*`, as `run` resolves it); always off for
    /// `snapshot` and `check`.
    pub otlp_receiver: ReceiverSettings,
}

impl Config {
    /// Resolves `gpulse run`'s configuration from its flags, the environment (through `env`, e.g.
    /// [`process_env`]) and the config file named by `--config` / `GPULSE_CONFIG`.
    ///
    /// # Errors
    ///
    /// The first problem found, naming the setting to fix; see [`ConfigError`].
    pub fn resolve(
        global: &GlobalArgs,
        run: &RunArgs,
        env: EnvLookup<'_>,
    ) -> Result<Config, ConfigError> {
        let file = load_file(global, env)?;
        Self::resolve_with_file(global, run, env, file.as_ref())
    }

    /// [`Config::resolve`] with the file already loaded (or none), for tests and for callers
    /// that read the file themselves.
    pub fn resolve_with_file(
        global: &GlobalArgs,
        run: &RunArgs,
        env: EnvLookup<'_>,
        file: Option<&LoadedFile>,
    ) -> Result<Config, ConfigError> {
        let layers = Layers { env, file };
        let common = CommonSettings::resolve(global, run, &run.cost, &layers)?;
        let intervals = run::intervals(run, &layers)?;

        let sinks = sinks::resolve(
            sinks::SinkFlags {
                exporter: run.exporter.as_deref(),
                metrics_exporter: run.metrics_exporter.as_deref(),
                logs_exporter: run.logs_exporter.as_deref(),
            },
            &layers,
            receiver::receiver_configured(run, &layers)
                && exporter::traces_endpoint_explicit(run, &layers),
        )?;
        // OTLP settings are resolved (and can fail the start) only when a signal uses them.
        let exporter = if sinks.uses_otlp() {
            exporter::resolve_otlp(run, &layers)?
        } else if sinks.uses_stdout() {
            ExporterKind::Stdout
        } else {
            ExporterKind::Off
        };

        let health_addr = run::health_addr(run, &layers)?;
        let wait_for_gpu = run::wait_for_gpu(run, &layers)?;
        let queue = run::queue_limits(run, &layers)?;

        let mut warnings = Vec::new();
        let (service_name, resource_attributes) = resource(run, &layers, &mut warnings)?;
        let otlp_receiver = receiver::receiver_settings(run, &layers, &exporter)?;
        let prometheus = prometheus::resolve(run, &layers, sinks.prometheus, &mut warnings)?;
        let export = ExportSettings {
            exporter,
            sinks,
            otlp_endpoint_explicit: exporter::any_endpoint_explicit(run, &layers),
            queue,
            service_name,
            resource_attributes,
            node_name: common.analysis.downward.node_name.clone(),
        };

        Ok(Config {
            common,
            sample_interval: intervals.sample,
            export_interval: intervals.export,
            export,
            health_addr,
            wait_for_gpu,
            otlp_receiver,
            prometheus,
            warnings,
        })
    }
}

impl InspectConfig {
    /// Resolves `snapshot`/`check`'s configuration; same sources and precedence as
    /// [`Config::resolve`].
    ///
    /// # Errors
    ///
    /// As [`Config::resolve`], for the settings read here.
    pub fn resolve(
        global: &GlobalArgs,
        args: &InspectArgs,
        env: EnvLookup<'_>,
    ) -> Result<InspectConfig, ConfigError> {
        let file = load_file(global, env)?;
        Self::resolve_with_file(global, args, env, file.as_ref())
    }

    /// [`InspectConfig::resolve`] with the file already loaded (or none).
    pub fn resolve_with_file(
        global: &GlobalArgs,
        args: &InspectArgs,
        env: EnvLookup<'_>,
        file: Option<&LoadedFile>,
    ) -> Result<InspectConfig, ConfigError> {
        Self::resolve_with_cost(global, args, &CostArgs::default(), env, file)
    }

    /// [`InspectConfig::resolve`] for `top`, whose flags include the prices.
    ///
    /// # Errors
    ///
    /// As [`Config::resolve`], for the settings read here.
    pub fn resolve_for_top(
        global: &GlobalArgs,
        args: &TopArgs,
        env: EnvLookup<'_>,
    ) -> Result<InspectConfig, ConfigError> {
        let file = load_file(global, env)?;
        let mut config = Self::resolve_with_cost(
            global,
            &InspectArgs::default(),
            &args.cost,
            env,
            file.as_ref(),
        )?;
        let layers = Layers {
            env,
            file: file.as_ref(),
        };
        config.otlp_receiver = receiver::top_receiver_settings(args, &layers)?;
        Ok(config)
    }

    /// [`InspectConfig::resolve`] for `snapshot`, whose flags include the prices.
    ///
    /// # Errors
    ///
    /// As [`Config::resolve`], for the settings read here.
    pub fn resolve_with_prices(
        global: &GlobalArgs,
        args: &InspectArgs,
        cost: &CostArgs,
        env: EnvLookup<'_>,
    ) -> Result<InspectConfig, ConfigError> {
        let file = load_file(global, env)?;
        Self::resolve_with_cost(global, args, cost, env, file.as_ref())
    }

    fn resolve_with_cost(
        global: &GlobalArgs,
        args: &InspectArgs,
        cost: &CostArgs,
        env: EnvLookup<'_>,
        file: Option<&LoadedFile>,
    ) -> Result<InspectConfig, ConfigError> {
        let layers = Layers { env, file };
        Ok(InspectConfig {
            common: CommonSettings::resolve(global, &RunArgs::default(), cost, &layers)?,
            format: args.format,
            otlp_receiver: ReceiverSettings::off(),
        })
    }
}

/// Reads the config file named by `--config` or `GPULSE_CONFIG`, if any. There is no default
/// path: a file gpulse would find by itself is a file an operator forgets about.
///
/// # Errors
///
/// [`ConfigError::ReadFile`] or [`ConfigError::File`].
fn load_file(global: &GlobalArgs, env: EnvLookup<'_>) -> Result<Option<LoadedFile>, ConfigError> {
    let (path, given_by) = match (&global.config, env::get(env, env::CONFIG)) {
        (Some(path), _) => (path.clone(), "--config"),
        (None, Some(path)) => (PathBuf::from(path), env::CONFIG),
        (None, None) => return Ok(None),
    };
    LoadedFile::read(&path, given_by).map(Some)
}
