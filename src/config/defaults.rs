//! Every default and bound of gpulse's settings, in one place: what a setting is when no flag,
//! variable or file key gives it, and the limits resolution enforces. The docs
//! (docs/configuration.md) and the example file (examples/gpulse.toml) quote these values. Two
//! kinds of default stay with their types: where each signal goes (`SignalSinks`' `Default`,
//! which the OpenTelemetry variables' defaults decide) and the rules' thresholds, documented
//! rule by rule in the `[diagnosis]` table (`thresholds`).

use std::time::Duration;

use super::otlp::Protocol;
use super::settings::LogFormat;

/// The NVML library gpulse loads unless told otherwise. nvml-wrapper's own default,
/// `libnvidia-ml.so`, is the unversioned name that only the driver's development package
/// installs; the driver itself ships `libnvidia-ml.so.1`.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";
pub const DEFAULT_LOG_LEVEL: &str = "info";
pub(crate) const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;

pub(crate) const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Below this NVML's own counters do not refresh, and the sampler thread would only burn CPU.
pub const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
pub(crate) const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(10);
pub(crate) const DEFAULT_WAIT_FOR_GPU: bool = false;

pub const DEFAULT_PROC_ROOT: &str = "/proc";
pub const DEFAULT_KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Command lines carry secrets: off unless asked for.
pub(crate) const DEFAULT_INCLUDE_COMMAND_LINE: bool = false;
pub(crate) const DEFAULT_READ_ENVIRON: bool = true;

pub(crate) const DEFAULT_SERVICE_NAME: &str = "gpulse";
pub(crate) const DEFAULT_QUEUE_MAX_BYTES: u64 = 64 << 20;
pub(crate) const DEFAULT_QUEUE_MAX_AGE: Duration = Duration::from_secs(300);
/// The specification's default protocol for new SDKs.
pub(crate) const DEFAULT_PROTOCOL: Protocol = Protocol::HttpProtobuf;
/// Default OTLP/HTTP endpoint.
pub(crate) const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318";
/// Default OTLP/gRPC endpoint.
pub(crate) const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
/// Default per-request timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How far back the span-enrichment history reaches by default (see `enrich::sample_history`).
pub(crate) const DEFAULT_ENRICH_HISTORY: Duration = Duration::from_secs(600);
/// The longest history accepted: a day of 50 ms samples would be ~1.7 M frames.
pub const MAX_ENRICH_HISTORY: Duration = Duration::from_secs(24 * 3600);

/// How many series one scrape may carry by default. Counted from the builders: a device has up
/// to about 60 series (with the dcgm names), a process on one device up to 13, so 8 GPUs with
/// 100 processes each make about 11k.
pub(crate) const DEFAULT_PROMETHEUS_MAX_SERIES: usize = 20_000;
/// The OpenTelemetry specification's default for `OTEL_EXPORTER_PROMETHEUS_PORT`.
pub(crate) const DEFAULT_OTEL_PROMETHEUS_PORT: u16 = 9464;
