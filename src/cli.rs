//! The command line: `gpulse run`, `gpulse snapshot`, `gpulse check`, and their flags (clap
//! derive). This is the lowest layer of configuration: values stay as close to what was typed as
//! possible, checked for syntax only, so that a typo fails at once with clap's usage message.
//! Merging with environment and file, defaults and range checks happen in
//! [`crate::config`], which names the flag in its messages.
//!
//! clap does not read the environment here (no `#[arg(env)]`): the environment is read by
//! `config` through an injectable lookup, with the OTel variables' own rules (milliseconds,
//! signal-specific names), and the flag help names each variable instead.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::values;
use crate::values::SecretString;

/// NVIDIA GPU metrics as OpenTelemetry (OTLP), each GPU process under its own resource.
///
/// Precedence of every setting: flags > environment > config file > defaults.
#[derive(Debug, Parser)]
#[command(name = "gpulse", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand takes (before or after the subcommand's name).
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// NVML library to load: a file name searched like dlopen does, or a path.
    /// [env: GPULSE_NVML_LIB] [default: libnvidia-ml.so.1]
    #[arg(long, global = true, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// TOML config file; unknown keys are errors. [env: GPULSE_CONFIG]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log filter: a level (error, warn, info, debug, trace) or RUST_LOG directives such as
    /// `info,gpulse=debug`. [env: GPULSE_LOG, else RUST_LOG] [default: info]
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log line format. [env: GPULSE_LOG_FORMAT] [default: text]
    #[arg(long, global = true, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample the GPUs and export OTLP metrics (and findings as logs) until stopped.
    Run(Box<RunArgs>),
    /// Sample once (or over a short --window) and print devices, processes, their workloads and
    /// what the diagnosis rules find.
    Snapshot(SnapshotArgs),
    /// Sample briefly, run the diagnosis rules and print the findings; exit status says whether
    /// any finding is serious.
    Check(CheckArgs),
    /// A live terminal view of the GPUs, their processes (container, pod, service) and findings,
    /// refreshed every --interval; q or Ctrl-C quits.
    Top(TopArgs),
    /// Run a command as a child, record what its GPUs did, and at its exit print a summary and
    /// write a self-contained HTML report; exits with the command's exit status.
    Record(Box<RecordArgs>),
    /// Write the HTML report of a past run from OTLP/JSON lines (what `--exporter stdout` or a
    /// Collector's file exporter writes); with several files, or --job, one report for a
    /// training job over every node's recording.
    Report(ReportArgs),
}

/// `gpulse record [OPTIONS] -- CMD [ARGS...]`.
#[derive(Debug, Clone, Default, Args)]
pub struct RecordArgs {
    /// Where to write the HTML report, or `none`; by default `gpulse-record-<time>.html` in the
    /// current directory.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,

    /// Also write the summary as JSON (the conventions of `snapshot --format json`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Sampling, attribution and export settings, as `gpulse run` takes them.
    #[command(flatten)]
    pub run: RunArgs,

    /// The command to run and its arguments (after `--` when they start with `-`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<std::ffi::OsString>,
}

/// `gpulse report RECORDING... -o FILE.html`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// OTLP/JSON lines, one request per line; `-` for standard input. Several files (one per
    /// node of a training job, say) make one job report.
    #[arg(value_name = "RECORDING", required = true, num_args = 1..)]
    pub recordings: Vec<PathBuf>,

    /// The training job to report (`gpulse.job.id` / `pytorch.distributed.job.id`), when the
    /// recordings hold several; with one file, asks for the job report instead of the node's.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,

    #[command(flatten)]
    pub cost: CostArgs,

    /// The HTML file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE.html")]
    pub output: PathBuf,

    /// Also write the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `gpulse top`.
#[derive(Debug, Clone, Default, Args)]
pub struct TopArgs {
    /// How often the view samples NVML and refreshes, e.g. 500ms or 2s; at least 50ms.
    /// [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub interval: Option<String>,

    #[command(flatten)]
    pub cost: CostArgs,

    /// Hear local applications' OTLP/gRPC here (the PyTorch companion's step spans), so the
    /// view shows each rank's step figures and marks a straggler; nothing is forwarded: PORT,
    /// :PORT (both 127.0.0.1) or IP:PORT, e.g. 4317. [env: GPULSE_OTLP_RECEIVER_GRPC]
    /// [file: otlp_receiver.grpc] [default: off]
    #[arg(long, value_name = "ADDR")]
    pub otlp_receiver_grpc: Option<String>,

    /// The same for OTLP/HTTP (protobuf) on /v1/traces, /v1/metrics and /v1/logs, e.g. 4318.
    /// [env: GPULSE_OTLP_RECEIVER_HTTP] [file: otlp_receiver.http] [default: off]
    #[arg(long, value_name = "ADDR")]
    pub otlp_receiver_http: Option<String>,
}

/// `gpulse snapshot` / `gpulse check`.
#[derive(Debug, Clone, Default, Args)]
pub struct InspectArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
}

/// `gpulse check`.
#[derive(Debug, Clone, Default, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub inspect: InspectArgs,

    /// Also ask the gpulse agent running on this node (the address of its `run --health-addr`,
    /// e.g. 127.0.0.1:9400) whether it finds a job stuck: check alone hears no spans and cannot
    /// see a hang.
    #[arg(long, value_name = "HOST:PORT")]
    pub agent: Option<String>,
}

/// `gpulse snapshot`.
#[derive(Debug, Clone, Default, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub inspect: InspectArgs,

    /// Sample over this long instead of once, e.g. 5s, and report the window as `gpulse run`
    /// would export it: utilisation as means, each process's CPU use, and every rule that one
    /// window can support (input-bound, throttling, an idle holder past its min_duration).
    /// [default: one sample]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub window: Option<String>,

    /// Prices the window's roll-ups by job, pod and container are costed with.
    #[command(flatten)]
    pub cost: CostArgs,
}

/// Prices the per-job, per-pod and per-container roll-ups are costed with (`run`'s /status,
/// `top`, `snapshot --window`).
#[derive(Debug, Clone, Default, Args)]
pub struct CostArgs {
    /// Price of one GPU for one hour, in your currency (a MIG instance costs its slice).
    /// [env: GPULSE_COST_PER_GPU_HOUR] [file: cost.per_gpu_hour] [default: none]
    #[arg(long, value_name = "PRICE")]
    pub cost_per_gpu_hour: Option<String>,

    /// Price of one kWh of GPU energy, in your currency.
    /// [env: GPULSE_COST_PER_KWH] [file: cost.per_kwh] [default: none]
    #[arg(long, value_name = "PRICE")]
    pub cost_per_kwh: Option<String>,
}

/// How `snapshot` and `check` print.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON document for scripts.
    Json,
}

/// `gpulse run`. Every flag also has an environment variable and a config-file key; values are
/// kept as typed (syntax-checked) and resolved by [`crate::config::Config::resolve`].
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// How often NVML is sampled, e.g. 500ms; at least 50ms.
    /// [env: GPULSE_SAMPLE_INTERVAL] [file: sample_interval] [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub sample_interval: Option<String>,

    /// How often one OTLP request is sent; at least the sample interval.
    /// [env: GPULSE_EXPORT_INTERVAL (duration), else OTEL_METRIC_EXPORT_INTERVAL (milliseconds)]
    /// [file: export_interval] [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub export_interval: Option<String>,

    /// Where every signal goes: an OTLP endpoint, OTLP JSON lines on standard output, or
    /// nowhere (e.g. with --prometheus-addr). --metrics-exporter/--logs-exporter and
    /// OTEL_METRICS_EXPORTER/OTEL_LOGS_EXPORTER choose per signal.
    /// [env: GPULSE_EXPORTER] [file: exporter] [default: otlp]
    #[arg(long, value_parser = ["otlp", "stdout", "console", "none"])]
    pub exporter: Option<String>,

    /// Where gpulse's metrics go: a comma list of otlp, prometheus (serve /metrics at
    /// --prometheus-addr, else OTEL_EXPORTER_PROMETHEUS_HOST:PORT, default localhost:9464),
    /// console (= stdout), or none. [env: OTEL_METRICS_EXPORTER] [file: metrics_exporter]
    /// [default: otlp]
    #[arg(long, value_name = "LIST")]
    pub metrics_exporter: Option<String>,

    /// Where the findings (OTLP log records) go: otlp, console (= stdout) or none.
    /// [env: OTEL_LOGS_EXPORTER] [file: logs_exporter] [default: otlp]
    #[arg(long, value_name = "EXPORTER")]
    pub logs_exporter: Option<String>,

    /// OTLP base URL; for HTTP, /v1/metrics and /v1/logs are appended.
    /// [env: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_{METRICS,LOGS}_ENDPOINT]
    /// [file: otlp.endpoint] [default: http://localhost:4318, or :4317 for grpc]
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// OTLP transport. [env: OTEL_EXPORTER_OTLP_PROTOCOL and per-signal forms]
    /// [file: otlp.protocol] [default: http/protobuf]
    #[arg(long, value_name = "PROTOCOL", value_parser = ["grpc", "http/protobuf"])]
    pub otlp_protocol: Option<String>,

    /// Header sent with every OTLP request (repeatable). Replaces the headers of the environment
    /// and file. [env: OTEL_EXPORTER_OTLP_HEADERS=k1=v1,k2=v2] [file: [otlp.headers]]
    #[arg(long = "otlp-header", value_name = "KEY=VALUE", value_parser = header_arg)]
    pub otlp_headers: Vec<HeaderArg>,

    /// Timeout of one OTLP request. [env: OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds)]
    /// [file: otlp.timeout] [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub otlp_timeout: Option<String>,

    /// OTLP body compression. [env: OTEL_EXPORTER_OTLP_COMPRESSION] [file: otlp.compression]
    /// [default: none]
    #[arg(long, value_name = "COMPRESSION", value_parser = ["none", "gzip"])]
    pub otlp_compression: Option<String>,

    /// procfs root processes are looked up in, e.g. /host/proc.
    /// [env: GPULSE_PROC_ROOT, else HOST_PROC] [file: proc_root] [default: /proc]
    #[arg(long, value_name = "PATH")]
    pub proc_root: Option<PathBuf>,

    /// Attach process.command_line (command lines can carry secrets).
    /// [env: GPULSE_INCLUDE_COMMAND_LINE] [file: include_command_line]
    #[arg(long)]
    pub include_command_line: bool,

    /// Do not read OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES from the processes' environ.
    /// [env: GPULSE_READ_ENVIRON=false] [file: read_environ = false]
    #[arg(long)]
    pub no_read_environ: bool,

    /// kubelet pod-resources socket, or `none`.
    /// [env: GPULSE_KUBELET_SOCKET] [file: kubelet_socket]
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(long, value_name = "PATH")]
    pub kubelet_socket: Option<String>,

    /// Serve /healthz and /readyz here: PORT, :PORT (both 127.0.0.1) or IP:PORT.
    /// [env: GPULSE_HEALTH_ADDR] [file: health_addr] [default: off]
    #[arg(long, value_name = "ADDR")]
    pub health_addr: Option<String>,

    /// Serve Prometheus /metrics here (text or OpenMetrics by Accept header): PORT, :PORT (both
    /// 127.0.0.1) or IP:PORT, e.g. 0.0.0.0:9400. [env: GPULSE_PROMETHEUS_ADDR]
    /// [file: prometheus.addr] [default: off]
    #[arg(long, value_name = "ADDR")]
    pub prometheus_addr: Option<String>,

    /// Metric names on /metrics: otel (OTLP names as Prometheus translates them) or dcgm (those
    /// plus dcgm-exporter's DCGM_FI_* names and labels). [env: GPULSE_PROMETHEUS_NAMES]
    /// [file: prometheus.names] [default: otel]
    #[arg(long, value_name = "NAMES", value_parser = ["otel", "dcgm"])]
    pub prometheus_names: Option<String>,

    /// A dcgm-exporter counters CSV (its -f file, as it is): its rows select the DCGM_FI_*
    /// series served, with their type and help; implies --prometheus-names dcgm.
    /// [env: DCGM_EXPORTER_COLLECTORS] [file: prometheus.dcgm_counters] [default: every series]
    #[arg(long, value_name = "FILE")]
    pub dcgm_counters: Option<String>,

    /// What a --dcgm-counters row naming a field gpulse cannot serve does: error (refuse to
    /// start) or warn (skip it). [env: GPULSE_DCGM_COUNTERS_UNKNOWN]
    /// [file: prometheus.dcgm_counters_unknown] [default: error]
    #[arg(long, value_name = "WHAT", value_parser = ["error", "warn"])]
    pub dcgm_counters_unknown: Option<String>,

    /// Most series one scrape of /metrics carries; more are dropped and counted.
    /// [env: GPULSE_PROMETHEUS_MAX_SERIES] [file: prometheus.max_series] [default: 20000]
    #[arg(long, value_name = "COUNT")]
    pub prometheus_max_series: Option<String>,

    /// Wait for the NVIDIA driver instead of exiting when NVML cannot start.
    /// [env: GPULSE_WAIT_FOR_GPU] [file: wait_for_gpu]
    #[arg(long)]
    pub wait_for_gpu: bool,

    /// Bytes of unsent requests kept for retry, e.g. 64MiB.
    /// [env: GPULSE_QUEUE_MAX_BYTES] [file: queue.max_bytes] [default: 64MiB]
    #[arg(long, value_name = "SIZE", value_parser = size_text)]
    pub queue_max_bytes: Option<String>,

    /// Unsent requests older than this are dropped.
    /// [env: GPULSE_QUEUE_MAX_AGE] [file: queue.max_age] [default: 5m]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub queue_max_age: Option<String>,

    #[command(flatten)]
    pub cost: CostArgs,

    /// service.name of the node resource.
    /// [env: GPULSE_SERVICE_NAME, else OTEL_SERVICE_NAME] [file: service_name] [default: gpulse]
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,

    /// Accept OTLP/gRPC traces, metrics and logs from local applications here and forward them
    /// upstream, spans enriched with their process's GPU usage: PORT, :PORT (both 127.0.0.1)
    /// or IP:PORT, e.g. 4317. [env: GPULSE_OTLP_RECEIVER_GRPC] [file: otlp_receiver.grpc]
    /// [default: off]
    #[arg(long, value_name = "ADDR")]
    pub otlp_receiver_grpc: Option<String>,

    /// The same for OTLP/HTTP (protobuf) on /v1/traces, /v1/metrics and /v1/logs, e.g. 4318.
    /// [env: GPULSE_OTLP_RECEIVER_HTTP] [file: otlp_receiver.http] [default: off]
    #[arg(long, value_name = "ADDR")]
    pub otlp_receiver_http: Option<String>,

    /// How far back per-process GPU samples are kept for enriching received spans, e.g. 10m.
    /// [env: GPULSE_ENRICH_HISTORY] [file: otlp_receiver.enrich_history] [default: 10m]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub enrich_history: Option<String>,
}

/// One `--otlp-header KEY=VALUE`. The value is taken literally (no percent-decoding: that is the
/// environment variable's syntax) and kept out of `Debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderArg {
    /// Trimmed and lower-cased.
    pub name: String,
    pub value: SecretString,
}

fn duration_text(text: &str) -> Result<String, String> {
    values::parse_duration(text).map(|_| text.to_string())
}

fn size_text(text: &str) -> Result<String, String> {
    values::parse_size(text).map(|_| text.to_string())
}

fn header_arg(text: &str) -> Result<HeaderArg, String> {
    // Errors here are printed by clap next to the whole argument, so they cannot hide the value;
    // they at least do not repeat it.
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| "expected KEY=VALUE, e.g. --otlp-header api-key=abc123".to_string())?;
    let name = name.trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
    {
        return Err(
            "the header name must be a non-empty HTTP token (letters, digits, - _ .)".into(),
        );
    }
    Ok(HeaderArg {
        name: name.to_ascii_lowercase(),
        value: SecretString::new(value.trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_names_the_environment_variables() {
        let mut cmd = Cli::command();
        // Global flags reach the subcommands' help only once the command is built.
        cmd.build();
        let run = cmd.find_subcommand_mut("run").expect("run subcommand");
        let help = run.render_long_help().to_string();
        if std::env::var_os("GPULSE_PRINT_HELP").is_some() {
            println!("{help}");
        }
        for name in [
            "GPULSE_SAMPLE_INTERVAL",
            "OTEL_METRIC_EXPORT_INTERVAL",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "HOST_PROC",
            "GPULSE_LOG",
        ] {
            assert!(help.contains(name), "{name} missing from run --help");
        }
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let a = Cli::try_parse_from(["gpulse", "--nvml-lib", "/x.so", "snapshot"]).unwrap();
        let b = Cli::try_parse_from(["gpulse", "snapshot", "--nvml-lib", "/x.so"]).unwrap();
        assert_eq!(a.global.nvml_lib, Some(PathBuf::from("/x.so")));
        assert_eq!(b.global.nvml_lib, Some(PathBuf::from("/x.so")));
    }

    #[test]
    fn run_flags_parse() {
        let cli = Cli::try_parse_from([
            "gpulse",
            "run",
            "--sample-interval",
            "100ms",
            "--otlp-header",
            " Api-Key = s3cr3t ",
            "--otlp-header",
            "x-tenant=a=b",
            "--no-read-environ",
            "--otlp-protocol",
            "grpc",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(run.sample_interval.as_deref(), Some("100ms"));
        assert_eq!(run.otlp_headers[0].name, "api-key");
        assert_eq!(run.otlp_headers[0].value.expose(), "s3cr3t");
        assert_eq!(run.otlp_headers[1].value.expose(), "a=b");
        assert!(run.no_read_environ);
        assert!(!format!("{run:?}").contains("s3cr3t"));
    }

    #[test]
    fn syntax_errors_fail_at_parse_time() {
        for args in [
            &["gpulse", "run", "--sample-interval", "fast"][..],
            &["gpulse", "run", "--queue-max-bytes", "lots"],
            &["gpulse", "run", "--otlp-protocol", "grpcc"],
            &["gpulse", "run", "--otlp-header", "novalue"],
            &["gpulse", "snapshot", "--format", "yaml"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn snapshot_format_defaults_to_table() {
        let cli = Cli::try_parse_from(["gpulse", "check", "--format", "json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Check(CheckArgs {
                inspect: InspectArgs {
                    format: OutputFormat::Json
                },
                agent: None,
            })
        ));
        let cli = Cli::try_parse_from(["gpulse", "snapshot"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Snapshot(SnapshotArgs {
                inspect: InspectArgs {
                    format: OutputFormat::Table
                },
                window: None,
                cost: CostArgs {
                    cost_per_gpu_hour: None,
                    cost_per_kwh: None,
                },
            })
        ));
        let cli = Cli::try_parse_from(["gpulse", "snapshot", "--window", "3s"]).unwrap();
        let Command::Snapshot(args) = cli.command else {
            panic!("snapshot expected");
        };
        assert_eq!(args.window.as_deref(), Some("3s"));
        let cli = Cli::try_parse_from(["gpulse", "snapshot", "--cost-per-kwh", "0.3"]).unwrap();
        let Command::Snapshot(args) = cli.command else {
            panic!("snapshot expected");
        };
        assert_eq!(args.cost.cost_per_kwh.as_deref(), Some("0.3"));
        assert!(Cli::try_parse_from(["gpulse", "snapshot", "--window", "soon"]).is_err());
    }
}
