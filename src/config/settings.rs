//! The resolved settings each stage is built from, and how the commands' configurations are
//! composed of them: [`CommonSettings`] (what every command resolves the same way, embedded once
//! in both `Config` and `InspectConfig`), within it the [`AnalysisSettings`] the analyzer
//! (attribution and diagnosis) is built from, and the [`ExportSettings`] of `run`'s and
//! `record`'s exporter. Value types only: nothing here reads a flag, a variable or the file.

use std::path::PathBuf;
use std::time::Duration;

use super::downward::DownwardApi;
use super::otlp::ExporterKind;
use super::sinks::SignalSinks;
use super::thresholds::Thresholds;
use crate::schema::MetricSwitches;
use crate::values::Prices;

/// The settings every command resolves the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct CommonSettings {
    /// The config file that was read, if any (for the start-up log line).
    pub config_file: Option<PathBuf>,
    /// Passed to `Nvml::builder().lib_path(..)`.
    pub nvml_lib: PathBuf,
    pub log: LogSettings,
    /// What attribution reads and diagnosis judges by, so that every command shows workloads
    /// and findings as `run` exports them.
    pub analysis: AnalysisSettings,
    /// Which metrics are exported (`[metrics]`, `GPULSE_METRICS_*`); resolved by every command,
    /// so that `check` reports them and a misspelt name fails wherever the file is read.
    pub metrics: MetricSwitches,
}

/// What the analyzer is built from: attribution's sources, the rules' thresholds, gpulse's own
/// pod and the prices the roll-ups are costed with.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisSettings {
    pub proc_root: PathBuf,
    pub include_command_line: bool,
    pub read_environ: bool,
    /// `None` when disabled with `none`.
    pub kubelet_socket: Option<PathBuf>,
    /// The diagnosis rules' thresholds (`[diagnosis]` in the file), validated.
    pub diagnosis: Thresholds,
    /// gpulse's own pod and node, from the Kubernetes Downward API (`K8S_*`).
    pub downward: DownwardApi,
    /// Prices the roll-ups are costed with (`--cost-per-*`).
    pub prices: Prices,
}

/// What `run`'s and `record`'s exporter is built from: where each signal goes, the retry
/// queue's bounds and the node resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// The OTLP endpoints (or stdout) of the lanes `sinks` sends through.
    pub exporter: ExporterKind,
    /// Where each signal goes (`--metrics-exporter`, `OTEL_LOGS_EXPORTER`, ...).
    pub sinks: SignalSinks,
    /// An OTLP endpoint was set (flag, variable or file), not defaulted: `record` exports only then.
    pub otlp_endpoint_explicit: bool,
    pub queue: QueueLimits,
    /// `service.name` of the node resource.
    pub service_name: String,
    /// Other node-resource attributes, `service.name` excluded (it is `service_name`), sorted by
    /// key.
    pub resource_attributes: Vec<(String, String)>,
    /// `k8s.node.name` of the node resource (the Downward API's `K8S_NODE_NAME`).
    pub node_name: Option<String>,
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
