//! The environment variables gpulse reads, one documented constant each, and the injectable
//! lookup through which they are read (tests pass a map; `main` passes [`process_env`]).
//!
//! gpulse's own settings are `GPULSE_*`. The OTLP flags have no `GPULSE_*` twin: their
//! environment form is the standard `OTEL_EXPORTER_OTLP_*` family, so that one deployment
//! manifest configures gpulse and the applications' SDKs alike.

/// How configuration reads the environment: the variable's value, or `None` when unset.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Reads the real process environment. A variable set to a value that is not valid Unicode is
/// treated as unset, as the OTel SDKs do.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Reads `name` through `env`, treating an empty value as unset, as the OTel specification
/// requires ("an empty value ... the same way as when the variable is unset").
pub(crate) fn get(env: EnvLookup<'_>, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

/// Path or name of the NVML library to dlopen (`--nvml-lib`).
pub(crate) const NVML_LIB: &str = "GPULSE_NVML_LIB";
/// Config file (`--config`).
pub const CONFIG: &str = "GPULSE_CONFIG";
/// Log filter (`--log-level`): a level or `RUST_LOG` directives.
pub(crate) const LOG: &str = "GPULSE_LOG";
/// Read when `GPULSE_LOG` is unset, so the usual Rust habit works too.
pub const RUST_LOG: &str = "RUST_LOG";
/// `text` or `json` (`--log-format`).
pub(crate) const LOG_FORMAT: &str = "GPULSE_LOG_FORMAT";

/// `--sample-interval`, a duration.
pub(crate) const SAMPLE_INTERVAL: &str = "GPULSE_SAMPLE_INTERVAL";
/// `--export-interval`, a duration. Wins over [`OTEL_METRIC_EXPORT_INTERVAL`].
pub(crate) const EXPORT_INTERVAL: &str = "GPULSE_EXPORT_INTERVAL";
/// The OTel SDK variable for the export interval, in milliseconds.
pub const OTEL_METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
/// `--exporter`, every signal at once: `otlp`, `stdout` (or `console`) or `none`.
pub(crate) const EXPORTER: &str = "GPULSE_EXPORTER";
/// The SDK's metrics exporter list: `otlp`, `prometheus`, `console`, `none`.
pub const OTEL_METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
/// The SDK's logs exporter (gpulse's findings): `otlp`, `console`, `none`.
pub const OTEL_LOGS_EXPORTER: &str = "OTEL_LOGS_EXPORTER";
/// The SDK's Prometheus exporter host (default `localhost`), used when metrics include
/// `prometheus` and no `--prometheus-addr` is given.
pub const OTEL_EXPORTER_PROMETHEUS_HOST: &str = "OTEL_EXPORTER_PROMETHEUS_HOST";
/// The SDK's Prometheus exporter port (default 9464).
pub const OTEL_EXPORTER_PROMETHEUS_PORT: &str = "OTEL_EXPORTER_PROMETHEUS_PORT";
/// `--proc-root`. Wins over [`HOST_PROC`].
pub(crate) const PROC_ROOT: &str = "GPULSE_PROC_ROOT";
/// The host's proc mount, as gopsutil and the node exporters spell it.
pub const HOST_PROC: &str = "HOST_PROC";
/// `--include-command-line`, a boolean.
pub(crate) const INCLUDE_COMMAND_LINE: &str = "GPULSE_INCLUDE_COMMAND_LINE";
/// A boolean; `false` is what `--no-read-environ` says.
pub(crate) const READ_ENVIRON: &str = "GPULSE_READ_ENVIRON";
/// `--kubelet-socket`: a path, or `none`.
pub(crate) const KUBELET_SOCKET: &str = "GPULSE_KUBELET_SOCKET";
/// `--health-addr`.
pub(crate) const HEALTH_ADDR: &str = "GPULSE_HEALTH_ADDR";
/// `--prometheus-addr`: where `/metrics` is served.
pub(crate) const PROMETHEUS_ADDR: &str = "GPULSE_PROMETHEUS_ADDR";
/// `--prometheus-names`: `otel` or `dcgm`.
pub(crate) const PROMETHEUS_NAMES: &str = "GPULSE_PROMETHEUS_NAMES";
/// `--prometheus-max-series`, a count.
pub(crate) const PROMETHEUS_MAX_SERIES: &str = "GPULSE_PROMETHEUS_MAX_SERIES";
/// `--dcgm-counters`: dcgm-exporter's own variable for its counters file (its `-f`), so a
/// DaemonSet's environment carries over.
pub(crate) const DCGM_EXPORTER_COLLECTORS: &str = "DCGM_EXPORTER_COLLECTORS";
/// `--dcgm-counters-unknown`: `error` or `warn`.
pub(crate) const DCGM_COUNTERS_UNKNOWN: &str = "GPULSE_DCGM_COUNTERS_UNKNOWN";
/// `--cost-per-gpu-hour`.
pub(crate) const COST_PER_GPU_HOUR: &str = "GPULSE_COST_PER_GPU_HOUR";
/// `--cost-per-kwh`.
pub(crate) const COST_PER_KWH: &str = "GPULSE_COST_PER_KWH";
/// Comma-separated metric names to export even if the file or the defaults switch them off.
pub(crate) const METRICS_ENABLED: &str = "GPULSE_METRICS_ENABLED";
/// Comma-separated metric names not to export (nor read from NVML when nothing else needs it).
pub(crate) const METRICS_DISABLED: &str = "GPULSE_METRICS_DISABLED";
/// A boolean: `false` leaves out every `.max`/`.min` companion (`[metrics] companions`).
pub(crate) const METRICS_COMPANIONS: &str = "GPULSE_METRICS_COMPANIONS";
/// `--wait-for-gpu`, a boolean.
pub(crate) const WAIT_FOR_GPU: &str = "GPULSE_WAIT_FOR_GPU";
/// `--queue-max-bytes`, a size.
pub(crate) const QUEUE_MAX_BYTES: &str = "GPULSE_QUEUE_MAX_BYTES";
/// `--queue-max-age`, a duration.
pub(crate) const QUEUE_MAX_AGE: &str = "GPULSE_QUEUE_MAX_AGE";
/// `--otlp-receiver-grpc`: the local OTLP/gRPC receiver's address.
pub(crate) const OTLP_RECEIVER_GRPC: &str = "GPULSE_OTLP_RECEIVER_GRPC";
/// `--otlp-receiver-http`: the local OTLP/HTTP receiver's address.
pub(crate) const OTLP_RECEIVER_HTTP: &str = "GPULSE_OTLP_RECEIVER_HTTP";
/// `--enrich-history`, a duration.
pub(crate) const ENRICH_HISTORY: &str = "GPULSE_ENRICH_HISTORY";
/// `--service-name`. Wins over [`OTEL_SERVICE_NAME`].
pub(crate) const SERVICE_NAME: &str = "GPULSE_SERVICE_NAME";
/// The OTel `service.name` of gpulse itself (the node resource).
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `key=value,...` attributes of the node resource, values percent-encoded.
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// Kubernetes Downward API: gpulse's own pod UID (`metadata.uid`).
pub const K8S_POD_UID: &str = "K8S_POD_UID";
/// Kubernetes Downward API: gpulse's own pod name (`metadata.name`).
pub const K8S_POD_NAME: &str = "K8S_POD_NAME";
/// Kubernetes Downward API: gpulse's own pod namespace (`metadata.namespace`).
pub const K8S_POD_NAMESPACE: &str = "K8S_POD_NAMESPACE";
/// Kubernetes Downward API: the node's name (`spec.nodeName`), exported as `k8s.node.name`.
pub const K8S_NODE_NAME: &str = "K8S_NODE_NAME";

/// The generic OTLP exporter variables. Each has a signal-specific form,
/// `OTEL_EXPORTER_OTLP_METRICS_<SETTING>` / `OTEL_EXPORTER_OTLP_LOGS_<SETTING>`, that wins over
/// it (see [`signal_var`]).
pub mod otlp {
    pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    pub(crate) const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    pub(crate) const HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
    /// Milliseconds.
    pub(crate) const TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
    pub(crate) const COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
    pub const CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
    pub const CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_CLIENT_KEY";
    pub const CLIENT_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
    pub(crate) const INSECURE: &str = "OTEL_EXPORTER_OTLP_INSECURE";
}

/// The signal-specific form of a generic OTLP variable: `signal_var(otlp::ENDPOINT, "METRICS")`
/// is `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`.
pub fn signal_var(generic: &str, signal: &str) -> String {
    let setting = generic.trim_start_matches("OTEL_EXPORTER_OTLP_");
    format!("OTEL_EXPORTER_OTLP_{signal}_{setting}")
}
