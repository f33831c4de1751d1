//! The TOML config file, low level: the keys as written (every one documented here and in
//! `examples/gpulse.toml`), each scalar kept as text with its position so that a bad value is
//! reported with the file, line and column. Unknown keys are errors (`deny_unknown_fields`).
//! Turning the text into typed, validated settings is `resolve`'s job, shared with flags and
//! environment.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::error::{ConfigError, Origin, Raw};

/// A scalar as written in the file (string, integer, float or boolean), kept as text: the same
/// parsers then serve flags, environment and file, so `sample_interval = 5` gets the same
/// "missing unit" message as `--sample-interval 5`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// A header value from the file: kept out of `Debug` output, since it is usually a token.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct FileSecret(pub String);

impl fmt::Debug for FileSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// `[cost]`: the prices roll-ups are costed with, in the user's currency.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFile {
    /// Price of one GPU for one hour (a MIG instance costs its slice). Default: none.
    pub per_gpu_hour: Value,
    /// Price of one kWh of GPU energy. Default: none.
    pub per_kwh: Value,
}

/// A scalar key of the file, with its position.
pub type Value = Option<Spanned<Scalar>>;

/// The whole file. Every key is optional; what is left out falls back to the environment and then
/// the defaults (only flags and environment beat the file).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// NVML library to dlopen: a file name searched like `dlopen` does, or a path.
    /// Default `libnvidia-ml.so.1`.
    pub nvml_lib: Value,
    /// How often NVML is sampled, e.g. `"1s"`, at least `"50ms"`. Default `"1s"`.
    pub sample_interval: Value,
    /// How often one OTLP request is sent; at least the sample interval. Default `"10s"`.
    pub export_interval: Value,
    /// Every signal at once: `"otlp"`, `"stdout"` (OTLP JSON lines) or `"none"`. Default
    /// `"otlp"`.
    pub exporter: Value,
    /// Metrics only, as `OTEL_METRICS_EXPORTER`: e.g. `"prometheus"` or `"otlp,prometheus"`.
    pub metrics_exporter: Value,
    /// Findings only, as `OTEL_LOGS_EXPORTER`: `"otlp"`, `"console"` or `"none"`.
    pub logs_exporter: Value,
    /// The procfs root processes are looked up in, e.g. `"/host/proc"`. Default `"/proc"`.
    pub proc_root: Value,
    /// Attach `process.command_line` (command lines can carry secrets). Default `false`.
    pub include_command_line: Value,
    /// Read `OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES` from `/proc/<pid>/environ`.
    /// Default `true`.
    pub read_environ: Value,
    /// kubelet pod-resources socket, or `"none"`.
    /// Default `"/var/lib/kubelet/pod-resources/kubelet.sock"`.
    pub kubelet_socket: Value,
    /// Health endpoint address, `"PORT"`, `":PORT"` (both bind 127.0.0.1) or `"IP:PORT"`.
    /// Default: no health endpoint.
    pub health_addr: Value,
    /// Wait (with backoff) for the driver instead of failing when NVML is not ready.
    /// Default `false`.
    pub wait_for_gpu: Value,
    /// `service.name` of the node resource. Default `"gpulse"`.
    pub service_name: Value,
    /// Extra attributes of the node resource; `OTEL_RESOURCE_ATTRIBUTES` overrides per key.
    #[serde(default)]
    pub resource_attributes: BTreeMap<String, String>,
    #[serde(default)]
    pub log: LogFile,
    #[serde(default)]
    pub queue: QueueFile,
    #[serde(default)]
    pub otlp: OtlpFile,
    #[serde(default)]
    pub otlp_receiver: ReceiverFile,
    #[serde(default)]
    pub prometheus: PrometheusFile,
    #[serde(default)]
    pub cost: CostFile,
    /// `[metrics]`: a switch per metric and one for the `.max`/`.min` companions, resolved by
    /// `super::metrics`.
    #[serde(default)]
    pub metrics: MetricsFile,
    /// `[diagnosis]`: the rules' thresholds, defined and documented by
    /// [`super::thresholds::Thresholds`].
    #[serde(default)]
    pub diagnosis: super::thresholds::Thresholds,
}

/// `[metrics]`: `companions`, and one `[metrics."<name>"]` table per metric switched.
#[derive(Debug, Default)]
pub struct MetricsFile {
    /// Every `.max`/`.min` companion at once. Default `true`.
    pub companions: Value,
    /// `[metrics."<name>"]` tables, as written (names checked when resolving).
    pub metrics: Vec<(String, Spanned<MetricFile>)>,
}

/// `[metrics."<name>"]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricFile {
    /// Whether the metric is exported (and read from NVML, when nothing else needs it).
    /// Default: as docs/metrics.md says (every metric on).
    pub enabled: Value,
}

/// The table mixes one fixed key with names chosen by the user, which neither
/// `deny_unknown_fields` nor `serde(flatten)` (which loses `Spanned`) can express.
impl<'de> Deserialize<'de> for MetricsFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MetricsVisitor;
        impl<'de> Visitor<'de> for MetricsVisitor {
            type Value = MetricsFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a table of `companions = true|false` and `[metrics.\"<metric name>\"]` \
                     tables with `enabled = true|false`",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetricsFile, A::Error> {
                let mut file = MetricsFile::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "companions" {
                        file.companions = Some(map.next_value::<Spanned<Scalar>>()?);
                    } else {
                        let table = map.next_value::<Spanned<MetricFile>>().map_err(|e| {
                            de::Error::custom(format!(
                                "metrics.\"{key}\": {e}; a metric is switched by a table: \
                                 [metrics.\"{key}\"] enabled = false"
                            ))
                        })?;
                        file.metrics.push((key, table));
                    }
                }
                Ok(file)
            }
        }
        deserializer.deserialize_map(MetricsVisitor)
    }
}

/// `[otlp]`: settings for both signals, overridden per signal by `[otlp.metrics]` and
/// `[otlp.logs]` (same keys). One struct serves all three so the keys cannot drift apart; a
/// signal table nested in a signal table is refused when resolving.
pub(crate) type OtlpFile = OtlpSignalFile;

/// `[log]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFile {
    /// A level (`"info"`) or `RUST_LOG` directives (`"info,gpulse=debug"`). Default `"info"`.
    pub level: Value,
    /// `"text"` or `"json"`. Default `"text"`.
    pub format: Value,
}

/// `[otlp_receiver]`: the local OTLP endpoint applications send to (off unless an address is
/// set), whose spans are enriched with GPU usage and forwarded.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverFile {
    /// OTLP/gRPC address: `"PORT"`, `":PORT"` (both bind 127.0.0.1) or `"IP:PORT"`.
    pub grpc: Value,
    /// OTLP/HTTP address, same forms.
    pub http: Value,
    /// How far back per-process GPU samples are kept for enrichment. Default `"10m"`.
    pub enrich_history: Value,
}

/// `[prometheus]`: the `/metrics` endpoint (off unless `addr` is set).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusFile {
    /// `"PORT"`, `":PORT"` (both bind 127.0.0.1) or `"IP:PORT"`, e.g. `"0.0.0.0:9400"`.
    pub addr: Value,
    /// `"otel"` (default) or `"dcgm"` (adds dcgm-exporter's `DCGM_FI_*` names).
    pub names: Value,
    /// Most series per scrape; more are dropped and counted. Default `20000`.
    pub max_series: Value,
    /// A dcgm-exporter counters CSV selecting the `DCGM_FI_*` series (implies `names = "dcgm"`).
    pub dcgm_counters: Value,
    /// `"error"` (default) or `"warn"`: what a row gpulse cannot serve does.
    pub dcgm_counters_unknown: Value,
}

/// `[queue]`: what is kept for retry while the backend is unreachable.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueFile {
    /// Bytes of encoded requests kept, oldest dropped first: `"64MiB"` or a number of bytes.
    /// Default `"64MiB"`.
    pub max_bytes: Value,
    /// Requests older than this are dropped. Default `"5m"`.
    pub max_age: Value,
}

/// The settings of one OTLP signal (or of both, in `[otlp]`).
/// `serde(flatten)` would have shared the keys too, but it does not work with
/// `deny_unknown_fields` nor with `Spanned`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSignalFile {
    /// In `[otlp]`: the base URL, `/v1/metrics` and `/v1/logs` are appended for HTTP.
    /// In `[otlp.metrics]`/`[otlp.logs]`: the full URL, used as is.
    /// Default `"http://localhost:4318"` (HTTP) or `"http://localhost:4317"` (gRPC).
    pub endpoint: Value,
    /// `"http/protobuf"` or `"grpc"`. Default `"http/protobuf"`.
    pub protocol: Value,
    /// Sent with every request. Replaces (does not merge with) headers from a lower layer.
    pub headers: Option<BTreeMap<String, FileSecret>>,
    /// Per request, a duration. Default `"10s"`.
    pub timeout: Value,
    /// `"none"` or `"gzip"`. Default `"none"`.
    pub compression: Value,
    /// CA bundle (PEM) to verify the server with.
    pub certificate: Value,
    /// Client certificate (PEM) for mutual TLS; needs `client_key`.
    pub client_certificate: Value,
    /// Client private key (PEM) for mutual TLS; needs `client_certificate`.
    pub client_key: Value,
    /// gRPC only: an endpoint without scheme is plaintext (`http://`) instead of TLS.
    /// Default `false`.
    pub insecure: Value,
    /// `[otlp.metrics]`, only meaningful inside `[otlp]`.
    pub metrics: Option<Box<OtlpSignalFile>>,
    /// `[otlp.logs]`, only meaningful inside `[otlp]`.
    pub logs: Option<Box<OtlpSignalFile>>,
    /// `[otlp.traces]`: where spans received by the local OTLP receiver are forwarded; only
    /// meaningful inside `[otlp]`.
    pub traces: Option<Box<OtlpSignalFile>>,
}

/// A parsed config file, with what is needed to point at a line in it.
pub struct LoadedFile {
    pub path: PathBuf,
    /// Kept for line/column lookups; never printed (it may hold header tokens).
    text: String,
    pub config: FileConfig,
}

impl fmt::Debug for LoadedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedFile")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LoadedFile {
    /// Reads and parses `path`. `given_by` (`--config`, `GPULSE_CONFIG`) goes into the error.
    pub fn read(path: &Path, given_by: &str) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            given_by: given_by.to_string(),
            source,
        })?;
        Self::parse(path, text)
    }

    /// Parses `text` as the contents of `path` (which is only used in messages).
    pub fn parse(path: &Path, text: String) -> Result<Self, ConfigError> {
        match toml::from_str::<FileConfig>(&text) {
            Ok(config) => Ok(Self {
                path: path.to_path_buf(),
                text,
                config,
            }),
            Err(e) => {
                let (line, column) = e
                    .span()
                    .map(|span| line_column(&text, span.start))
                    .unwrap_or((0, 0));
                Err(ConfigError::File {
                    path: path.to_path_buf(),
                    line,
                    column,
                    message: e.message().trim().to_string(),
                })
            }
        }
    }

    /// `path:line:column` of a span in this file.
    pub(crate) fn location(&self, span: Range<usize>) -> String {
        let (line, column) = line_column(&self.text, span.start);
        format!("{}:{line}:{column}", self.path.display())
    }

    /// A value of the file as a [`Raw`] naming `key` and its position.
    pub fn raw(&self, key: &str, value: &Value) -> Option<Raw> {
        value.as_ref().map(|v| Raw {
            text: v.get_ref().0.clone(),
            origin: Origin::File {
                key: key.to_string(),
                location: self.location(v.span()),
            },
        })
    }

    /// Names a table of the file (no position: tables are checked entry by entry).
    pub(crate) fn table_origin(&self, key: &str) -> Origin {
        Origin::File {
            key: key.to_string(),
            location: self.path.display().to_string(),
        }
    }
}

/// 1-based line and column (in characters) of byte offset `at` in `text`.
pub(crate) fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LoadedFile, ConfigError> {
        LoadedFile::parse(Path::new("/etc/gpulse.toml"), text.to_string())
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("abc", 0), (1, 1));
        assert_eq!(line_column("a\nbc", 3), (2, 2));
        assert_eq!(line_column("é\nxé", 6), (2, 3));
        // Inside a multi-byte character: the character it belongs to.
        assert_eq!(line_column("é\nxé", 5), (2, 2));
        assert_eq!(line_column("x", 99), (1, 2));
    }

    #[test]
    fn unknown_key_is_reported_with_path_line_and_column() {
        let err = parse("sample_interval = \"1s\"\nsampel_interval = \"2s\"\n").unwrap_err();
        match &err {
            ConfigError::File {
                path,
                line,
                column,
                message,
            } => {
                assert_eq!(path, Path::new("/etc/gpulse.toml"));
                assert_eq!((*line, *column), (2, 1));
                assert!(message.contains("sampel_interval"), "{message}");
            }
            other => panic!("expected File error, got {other:?}"),
        }
        assert!(
            err.to_string().starts_with("/etc/gpulse.toml:2:1: "),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_in_nested_table() {
        let err = parse("[otlp.metrics]\nendpoint = \"http://x\"\nendpont = \"y\"\n").unwrap_err();
        assert!(err.to_string().starts_with("/etc/gpulse.toml:3:"), "{err}");
        let err = parse("[queue]\nmax_size = 1\n").unwrap_err();
        assert!(err.to_string().contains("max_size"), "{err}");
    }

    #[test]
    fn syntax_error_position() {
        let err = parse("a = \n").unwrap_err();
        assert!(matches!(err, ConfigError::File { line: 1, .. }), "{err}");
    }

    #[test]
    fn values_keep_their_position() {
        let file = parse("\n[otlp]\ntimeout = 5\n").unwrap();
        let raw = file.raw("otlp.timeout", &file.config.otlp.timeout).unwrap();
        assert_eq!(raw.text, "5");
        assert_eq!(
            raw.setting(),
            "otlp.timeout = \"5\" (/etc/gpulse.toml:3:11)"
        );
    }

    #[test]
    fn header_values_are_redacted_in_debug() {
        let file = parse("[otlp.headers]\napi-key = \"s3cr3t\"\n").unwrap();
        assert!(!format!("{file:?}").contains("s3cr3t"));
    }
}
