//! Configuration: command-line flags, environment (`GPULSE_*` and the standard `OTEL_*`
//! variables) and the TOML config file, merged into one validated [`Config`] (for `run`) or
//! [`InspectConfig`] (for `snapshot` and `check`).
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
//!         let config = InspectConfig::resolve(&cli.global, args, &config::process_env)?;
//!         println!("{:?}", config.format);
//!     }
//!     // `top` reads the same settings as `snapshot`, with the default output format.
//!     Command::Top(_) => {
//!         let config =
//!             InspectConfig::resolve(&cli.global, &Default::default(), &config::process_env)?;
//!         println!("{}", config.proc_root.display());
//!     }
//!     // `record` resolves `run`'s settings from its own flags; `report` reads a file only.
//!     Command::Record(_) | Command::Report(_) => {}
//! }
//! # Ok::<(), config::ConfigError>(())
//! ```

mod common;
pub mod cost;
pub mod downward;
pub mod env;
pub mod error;
pub mod exporter;
pub mod file;
mod layers;
pub mod otlp;
pub mod prometheus;
mod receiver;
pub mod sinks;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use env::{process_env, EnvLookup};
pub use error::{ConfigError, Origin, Raw};
pub use file::{FileConfig, LoadedFile};
pub use prometheus::{PrometheusNames, PrometheusSettings};
use receiver::receiver_settings;
pub use receiver::ReceiverSettings;
pub use sinks::{SignalSinks, Sink};

use crate::cli::{GlobalArgs, InspectArgs, OutputFormat, RunArgs};
use crate::diagnosis::Thresholds;
use crate::values;
use common::{bool_setting, resource, Common};
use layers::{first, Layers};
use otlp::ExporterKind;

/// The NVML library gpulse loads unless told otherwise. nvml-wrapper's own default,
/// `libnvidia-ml.so`, is the unversioned name that only the driver's development package
/// installs; the driver itself ships `libnvidia-ml.so.1`.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";
pub(crate) const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Below this NVML's own counters do not refresh, and the sampler thread would only burn CPU.
pub const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
pub(crate) const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_PROC_ROOT: &str = "/proc";
pub const DEFAULT_KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
pub(crate) const DEFAULT_QUEUE_MAX_BYTES: u64 = 64 << 20;
pub(crate) const DEFAULT_QUEUE_MAX_AGE: Duration = Duration::from_secs(300);
pub(crate) const DEFAULT_SERVICE_NAME: &str = "gpulse";
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// How far back the span-enrichment history reaches by default (see `enrich::history`).
pub(crate) const DEFAULT_ENRICH_HISTORY: Duration = Duration::from_secs(600);
/// The longest history accepted: a day of 50 ms samples would be ~1.7 M frames.
pub const MAX_ENRICH_HISTORY: Duration = Duration::from_secs(24 * 3600);

/// Everything `gpulse run` needs, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The config file that was read, if any (for the start-up log line).
    pub config_file: Option<PathBuf>,
    /// Passed to `Nvml::builder().lib_path(..)`.
    pub nvml_lib: PathBuf,
    /// At least [`MIN_SAMPLE_INTERVAL`].
    pub sample_interval: Duration,
    /// At least `sample_interval`.
    pub export_interval: Duration,
    /// The OTLP endpoints (or stdout) of the lanes `sinks` sends through.
    pub exporter: ExporterKind,
    /// Where each signal goes (`--metrics-exporter`, `OTEL_LOGS_EXPORTER`, ...).
    pub sinks: SignalSinks,
    /// An OTLP endpoint was set (flag, variable or file), not defaulted: `record` exports only then.
    pub otlp_endpoint_explicit: bool,
    pub proc_root: PathBuf,
    pub include_command_line: bool,
    pub read_environ: bool,
    /// `None` when disabled with `none`.
    pub kubelet_socket: Option<PathBuf>,
    /// `None`: no health endpoint.
    pub health_addr: Option<SocketAddr>,
    pub wait_for_gpu: bool,
    pub queue: QueueLimits,
    /// `service.name` of the node resource.
    pub service_name: String,
    /// Other node-resource attributes, `service.name` excluded (it is `service_name`), sorted by
    /// key.
    pub resource_attributes: Vec<(String, String)>,
    pub log: LogSettings,
    /// The diagnosis rules' thresholds (`[diagnosis]` in the file), validated.
    pub diagnosis: Thresholds,
    /// The local OTLP receiver and span enrichment (`enrich`).
    pub otlp_receiver: ReceiverSettings,
    /// gpulse's own pod and node, from the Kubernetes Downward API (`K8S_*`).
    pub downward: downward::DownwardApi,
    /// `/metrics` for Prometheus (`--prometheus-*`).
    pub prometheus: PrometheusSettings,
    /// Prices the roll-ups are costed with (`--cost-per-*`).
    pub prices: values::Prices,
    /// Problems that did not stop the start and that `main` should log once logging is up (the
    /// specification says a malformed `OTEL_RESOURCE_ATTRIBUTES` is discarded and reported, not
    /// fatal).
    pub warnings: Vec<String>,
}

/// Bounds of the retry queue of unsent requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Encoded bytes kept; oldest dropped first. Greater than zero.
    pub max_bytes: u64,
    /// Requests older than this are dropped. Greater than zero.
    pub max_age: Duration,
}

/// How gpulse logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing_subscriber::EnvFilter` directive string, already checked to parse.
    pub filter: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What `gpulse snapshot` and `gpulse check` need: NVML, output format, logging, and the
/// attribution settings so that they show workloads as `run` would export them. Run-only
/// settings (intervals, exporter, queue) are not read, so a broken exporter setting does not stop
/// a diagnosis.
#[derive(Debug, Clone, PartialEq)]
pub struct InspectConfig {
    pub config_file: Option<PathBuf>,
    pub nvml_lib: PathBuf,
    pub format: OutputFormat,
    pub log: LogSettings,
    pub proc_root: PathBuf,
    pub include_command_line: bool,
    pub read_environ: bool,
    pub kubelet_socket: Option<PathBuf>,
    /// `check` runs the same rules as `run`.
    pub diagnosis: Thresholds,
    /// gpulse's own pod and node (`K8S_*`), for `top`'s naming of this pod's processes.
    pub downward: downward::DownwardApi,
    /// Prices `top`'s roll-ups are costed with (`--cost-per-*`).
    pub prices: values::Prices,
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
        let common = Common::resolve(global, run, &layers)?;

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
        let export_interval =
            if export.origin == Origin::Env(env::OTEL_METRIC_EXPORT_INTERVAL.into()) {
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

        let health_addr = first([
            Layers::flag("--health-addr", run.health_addr.as_deref()),
            layers.env(env::HEALTH_ADDR),
            layers.file("health_addr", |f| &f.health_addr),
        ])
        .map(|raw| raw.parse(parse_health_addr))
        .transpose()?;

        let wait_for_gpu = bool_setting(
            Layers::switch("--wait-for-gpu", run.wait_for_gpu, true),
            &layers,
            env::WAIT_FOR_GPU,
            "wait_for_gpu",
            |f| &f.wait_for_gpu,
            false,
        )?;

        let max_bytes = match first([
            Layers::flag("--queue-max-bytes", run.queue_max_bytes.as_deref()),
            layers.env(env::QUEUE_MAX_BYTES),
            layers.file("queue.max_bytes", |f| &f.queue.max_bytes),
        ]) {
            Some(raw) => {
                let n = raw.parse(values::parse_size)?;
                if n == 0 {
                    return Err(
                        raw.invalid("a queue of 0 bytes drops everything; expected e.g. 64MiB")
                    );
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

        let mut warnings = Vec::new();
        let (service_name, resource_attributes) = resource(run, &layers, &mut warnings)?;
        let otlp_receiver = receiver_settings(run, &layers, &exporter)?;
        let prometheus = prometheus::resolve(run, &layers, sinks.prometheus)?;
        let prices = cost::resolve(&run.cost, &layers)?;

        Ok(Config {
            config_file: file.map(|f| f.path.clone()),
            nvml_lib: common.nvml_lib,
            sample_interval,
            export_interval,
            exporter,
            sinks,
            otlp_endpoint_explicit: exporter::any_endpoint_explicit(run, &layers),
            proc_root: common.proc_root,
            include_command_line: common.include_command_line,
            read_environ: common.read_environ,
            kubelet_socket: common.kubelet_socket,
            health_addr,
            wait_for_gpu,
            queue: QueueLimits { max_bytes, max_age },
            service_name,
            resource_attributes,
            log: common.log,
            diagnosis: common.diagnosis,
            otlp_receiver,
            downward: downward::DownwardApi::from_env(env),
            prometheus,
            prices,
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
        Self::resolve_with_cost(global, args, &crate::cli::CostArgs::default(), env, file)
    }

    /// [`InspectConfig::resolve`] for `top`, whose flags include the prices.
    ///
    /// # Errors
    ///
    /// As [`Config::resolve`], for the settings read here.
    pub fn resolve_for_top(
        global: &GlobalArgs,
        args: &crate::cli::TopArgs,
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
        cost: &crate::cli::CostArgs,
        env: EnvLookup<'_>,
    ) -> Result<InspectConfig, ConfigError> {
        let file = load_file(global, env)?;
        Self::resolve_with_cost(global, args, cost, env, file.as_ref())
    }

    fn resolve_with_cost(
        global: &GlobalArgs,
        args: &InspectArgs,
        cost: &crate::cli::CostArgs,
        env: EnvLookup<'_>,
        file: Option<&LoadedFile>,
    ) -> Result<InspectConfig, ConfigError> {
        let layers = Layers { env, file };
        let common = Common::resolve(global, &RunArgs::default(), &layers)?;
        let prices = cost::resolve(cost, &layers)?;
        Ok(InspectConfig {
            config_file: file.map(|f| f.path.clone()),
            nvml_lib: common.nvml_lib,
            format: args.format,
            log: common.log,
            proc_root: common.proc_root,
            include_command_line: common.include_command_line,
            read_environ: common.read_environ,
            kubelet_socket: common.kubelet_socket,
            diagnosis: common.diagnosis,
            downward: downward::DownwardApi::from_env(env),
            prices,
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
pub(crate) fn load_file(
    global: &GlobalArgs,
    env: EnvLookup<'_>,
) -> Result<Option<LoadedFile>, ConfigError> {
    let (path, given_by) = match (&global.config, env::get(env, env::CONFIG)) {
        (Some(path), _) => (path.clone(), "--config"),
        (None, Some(path)) => (PathBuf::from(path), env::CONFIG),
        (None, None) => return Ok(None),
    };
    LoadedFile::read(&path, given_by).map(Some)
}

/// `PORT`, `:PORT` (both 127.0.0.1: a health endpoint is for the local kubelet or a sidecar, not
/// the network), `localhost:PORT`, or `IP:PORT`.
pub(crate) fn parse_health_addr(text: &str) -> Result<SocketAddr, String> {
    const EXPECTED: &str =
        "expected PORT, :PORT, IP:PORT or [IPv6]:PORT, e.g. 9464 or 0.0.0.0:9464";
    let text = text.trim();
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("bad port; {EXPECTED}"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| EXPECTED.to_string())
}
