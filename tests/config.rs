//! Integration tests: config. Flags, environment and file merged into `Config` through the public
//! API the binary uses, with an injected environment (a map) so no test touches the process's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use gpulse::cli::{Cli, Command, GlobalArgs, InspectArgs, OutputFormat, RunArgs};
use gpulse::config::otlp::{Compression, ExporterKind, Protocol, SignalEndpoint};
use gpulse::config::{
    self, Config, ConfigError, InspectConfig, LoadedFile, LogFormat, SignalSinks, Sink,
};
use gpulse::values;
use proptest::prelude::*;

/// An environment for one test.
#[derive(Default, Clone)]
struct Env(HashMap<String, String>);

impl Env {
    fn with(pairs: &[(&str, &str)]) -> Self {
        Env(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |name| self.0.get(name).cloned()
    }
}

fn parse_run(args: &[&str]) -> (GlobalArgs, RunArgs) {
    let mut argv = vec!["gpulse", "run"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).expect("test flags parse");
    match cli.command {
        Command::Run(run) => (cli.global, *run),
        other => panic!("expected run, got {other:?}"),
    }
}

fn file(text: &str) -> LoadedFile {
    LoadedFile::parse(Path::new("/etc/gpulse/gpulse.toml"), text.to_string())
        .expect("test file parses")
}

fn resolve(args: &[&str], env: &Env, file: Option<&LoadedFile>) -> Result<Config, ConfigError> {
    let (global, run) = parse_run(args);
    Config::resolve_with_file(&global, &run, &env.lookup(), file)
}

fn resolved(args: &[&str], env: &Env, file: Option<&LoadedFile>) -> Config {
    resolve(args, env, file).unwrap_or_else(|e| panic!("resolve failed: {e}"))
}

fn err(args: &[&str], env: &Env, file: Option<&LoadedFile>) -> String {
    match resolve(args, env, file) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn otlp(config: &Config) -> (&SignalEndpoint, &SignalEndpoint) {
    match &config.export.exporter {
        ExporterKind::Otlp { metrics, logs, .. } => (metrics, logs),
        other => panic!("expected OTLP, got {other:?}"),
    }
}

fn headers(endpoint: &SignalEndpoint) -> Vec<(String, String)> {
    endpoint
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.expose().to_string()))
        .collect()
}

#[test]
fn defaults() {
    let c = resolved(&[], &Env::default(), None);
    assert_eq!(c.common.nvml_lib, PathBuf::from("libnvidia-ml.so.1"));
    assert_eq!(c.sample_interval, Duration::from_secs(1));
    assert_eq!(c.export_interval, Duration::from_secs(10));
    assert_eq!(c.common.analysis.proc_root, PathBuf::from("/proc"));
    assert!(!c.common.analysis.include_command_line);
    assert!(c.common.analysis.read_environ);
    assert_eq!(
        c.common.analysis.kubelet_socket,
        Some(PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"))
    );
    assert_eq!(c.health_addr, None);
    assert!(!c.wait_for_gpu);
    assert_eq!(c.export.queue.max_bytes, 64 << 20);
    assert_eq!(c.export.queue.max_age, Duration::from_secs(300));
    assert_eq!(c.export.service_name, "gpulse");
    assert!(c.export.resource_attributes.is_empty());
    assert_eq!(c.common.log.filter, "info");
    assert_eq!(c.common.log.format, LogFormat::Text);
    assert!(c.warnings.is_empty());
    let (metrics, logs) = otlp(&c);
    assert_eq!(metrics.protocol, Protocol::HttpProtobuf);
    assert_eq!(metrics.url, "http://localhost:4318/v1/metrics");
    assert_eq!(logs.url, "http://localhost:4318/v1/logs");
    assert_eq!(metrics.timeout, Duration::from_secs(10));
    assert_eq!(metrics.compression, Compression::None);
    assert!(metrics.headers.is_empty());
    assert!(!metrics.insecure);
}

/// One setting at four layers: what each combination of layers resolves to.
struct PrecedenceCase {
    name: &'static str,
    flag: [&'static str; 2],
    env: (&'static str, &'static str),
    file: &'static str,
    /// What to compare, as text.
    read: fn(&Config) -> String,
    flag_value: &'static str,
    env_value: &'static str,
    file_value: &'static str,
    default_value: &'static str,
}

#[test]
fn precedence_flag_beats_env_beats_file_beats_default() {
    let cases = [
        PrecedenceCase {
            name: "sample_interval",
            flag: ["--sample-interval", "200ms"],
            env: ("GPULSE_SAMPLE_INTERVAL", "300ms"),
            file: "sample_interval = \"400ms\"",
            read: |c| format!("{:?}", c.sample_interval),
            flag_value: "200ms",
            env_value: "300ms",
            file_value: "400ms",
            default_value: "1s",
        },
        PrecedenceCase {
            name: "export_interval",
            flag: ["--export-interval", "20s"],
            env: ("GPULSE_EXPORT_INTERVAL", "30s"),
            file: "export_interval = \"40s\"",
            read: |c| format!("{:?}", c.export_interval),
            flag_value: "20s",
            env_value: "30s",
            file_value: "40s",
            default_value: "10s",
        },
        PrecedenceCase {
            name: "service_name",
            flag: ["--service-name", "from-flag"],
            env: ("OTEL_SERVICE_NAME", "from-env"),
            file: "service_name = \"from-file\"",
            read: |c| c.export.service_name.clone(),
            flag_value: "from-flag",
            env_value: "from-env",
            file_value: "from-file",
            default_value: "gpulse",
        },
        PrecedenceCase {
            name: "nvml_lib",
            flag: ["--nvml-lib", "/flag/libnvidia-ml.so.1"],
            env: ("GPULSE_NVML_LIB", "/env/libnvidia-ml.so.1"),
            file: "nvml_lib = \"/file/libnvidia-ml.so.1\"",
            read: |c| c.common.nvml_lib.display().to_string(),
            flag_value: "/flag/libnvidia-ml.so.1",
            env_value: "/env/libnvidia-ml.so.1",
            file_value: "/file/libnvidia-ml.so.1",
            default_value: "libnvidia-ml.so.1",
        },
        PrecedenceCase {
            name: "otlp endpoint",
            flag: ["--otlp-endpoint", "http://flag:4318"],
            env: ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            file: "[otlp]\nendpoint = \"http://file:4318\"",
            read: |c| otlp(c).0.url.clone(),
            flag_value: "http://flag:4318/v1/metrics",
            env_value: "http://env:4318/v1/metrics",
            file_value: "http://file:4318/v1/metrics",
            default_value: "http://localhost:4318/v1/metrics",
        },
        PrecedenceCase {
            name: "otlp timeout (env in milliseconds)",
            flag: ["--otlp-timeout", "2s"],
            env: ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000"),
            file: "[otlp]\ntimeout = \"4s\"",
            read: |c| format!("{:?}", otlp(c).0.timeout),
            flag_value: "2s",
            env_value: "3s",
            file_value: "4s",
            default_value: "10s",
        },
        PrecedenceCase {
            name: "log level",
            flag: ["--log-level", "debug"],
            env: ("GPULSE_LOG", "warn"),
            file: "[log]\nlevel = \"error\"",
            read: |c| c.common.log.filter.clone(),
            flag_value: "debug",
            env_value: "warn",
            file_value: "error",
            default_value: "info",
        },
        PrecedenceCase {
            name: "queue max bytes",
            flag: ["--queue-max-bytes", "1MiB"],
            env: ("GPULSE_QUEUE_MAX_BYTES", "2MiB"),
            file: "[queue]\nmax_bytes = 3145728",
            read: |c| c.export.queue.max_bytes.to_string(),
            flag_value: "1048576",
            env_value: "2097152",
            file_value: "3145728",
            default_value: "67108864",
        },
    ];
    for case in cases {
        let env = Env::with(&[case.env]);
        let f = file(case.file);
        let all = resolved(&case.flag, &env, Some(&f));
        let no_flag = resolved(&[], &env, Some(&f));
        let file_only = resolved(&[], &Env::default(), Some(&f));
        let nothing = resolved(&[], &Env::default(), None);
        let norm = |s: &str| match values::parse_duration(s) {
            Ok(d) => format!("{d:?}"),
            Err(_) => s.to_string(),
        };
        assert_eq!(
            (case.read)(&all),
            norm(case.flag_value),
            "{}: flag",
            case.name
        );
        assert_eq!(
            (case.read)(&no_flag),
            norm(case.env_value),
            "{}: env",
            case.name
        );
        assert_eq!(
            (case.read)(&file_only),
            norm(case.file_value),
            "{}: file",
            case.name
        );
        assert_eq!(
            (case.read)(&nothing),
            norm(case.default_value),
            "{}: default",
            case.name
        );
    }
}

#[test]
fn gpulse_specific_variables_beat_generic_ones() {
    let env = Env::with(&[
        ("GPULSE_EXPORT_INTERVAL", "15s"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "60000"),
        ("GPULSE_SERVICE_NAME", "gpulse-a"),
        ("OTEL_SERVICE_NAME", "other"),
        ("GPULSE_LOG", "debug"),
        ("RUST_LOG", "trace"),
    ]);
    let c = resolved(&[], &env, None);
    assert_eq!(c.export_interval, Duration::from_secs(15));
    assert_eq!(c.export.service_name, "gpulse-a");
    assert_eq!(c.common.log.filter, "debug");

    let env = Env::with(&[
        ("OTEL_METRIC_EXPORT_INTERVAL", "60000"),
        ("RUST_LOG", "info,gpulse=trace"),
    ]);
    let c = resolved(&[], &env, None);
    assert_eq!(
        c.export_interval,
        Duration::from_secs(60),
        "OTEL_METRIC_EXPORT_INTERVAL is milliseconds"
    );
    assert_eq!(c.common.log.filter, "info,gpulse=trace");
}

#[test]
fn empty_variables_count_as_unset() {
    let env = Env::with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        ("GPULSE_SAMPLE_INTERVAL", "  "),
        ("OTEL_SERVICE_NAME", ""),
    ]);
    let c = resolved(&[], &env, None);
    assert_eq!(otlp(&c).0.url, "http://localhost:4318/v1/metrics");
    assert_eq!(c.sample_interval, Duration::from_secs(1));
    assert_eq!(c.export.service_name, "gpulse");
}

#[test]
fn proc_root_sources() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let c = resolved(&[], &Env::with(&[("HOST_PROC", path)]), None);
    assert_eq!(c.common.analysis.proc_root, dir.path());
    let c = resolved(
        &[],
        &Env::with(&[("HOST_PROC", "/nonexistent"), ("GPULSE_PROC_ROOT", path)]),
        None,
    );
    assert_eq!(
        c.common.analysis.proc_root,
        dir.path(),
        "GPULSE_PROC_ROOT wins over HOST_PROC"
    );
    let msg = err(
        &["--proc-root", "/nonexistent/host/proc"],
        &Env::default(),
        None,
    );
    assert!(msg.contains("--proc-root /nonexistent/host/proc"), "{msg}");
    assert!(msg.contains("not found"), "{msg}");
}

#[test]
fn switches_flags_env_and_file() {
    let c = resolved(
        &[
            "--include-command-line",
            "--no-read-environ",
            "--wait-for-gpu",
        ],
        &Env::default(),
        None,
    );
    assert!(
        c.common.analysis.include_command_line && !c.common.analysis.read_environ && c.wait_for_gpu
    );

    let env = Env::with(&[
        ("GPULSE_READ_ENVIRON", "false"),
        ("GPULSE_WAIT_FOR_GPU", "1"),
    ]);
    let c = resolved(&[], &env, None);
    assert!(!c.common.analysis.read_environ && c.wait_for_gpu);

    let f = file("include_command_line = true\nread_environ = false\n");
    let c = resolved(
        &[],
        &Env::with(&[("GPULSE_INCLUDE_COMMAND_LINE", "no")]),
        Some(&f),
    );
    assert!(!c.common.analysis.include_command_line, "env beats file");
    assert!(!c.common.analysis.read_environ);

    let msg = err(&[], &Env::with(&[("GPULSE_WAIT_FOR_GPU", "maybe")]), None);
    assert!(
        msg.starts_with("GPULSE_WAIT_FOR_GPU=\"maybe\": expected true or false"),
        "{msg}"
    );
}

#[test]
fn kubelet_socket_none_disables() {
    assert_eq!(
        resolved(&["--kubelet-socket", "none"], &Env::default(), None)
            .common
            .analysis
            .kubelet_socket,
        None
    );
    let c = resolved(
        &[],
        &Env::with(&[("GPULSE_KUBELET_SOCKET", "/run/k.sock")]),
        None,
    );
    assert_eq!(
        c.common.analysis.kubelet_socket,
        Some(PathBuf::from("/run/k.sock"))
    );
    let f = file("kubelet_socket = \"NONE\"");
    assert_eq!(
        resolved(&[], &Env::default(), Some(&f))
            .common
            .analysis
            .kubelet_socket,
        None
    );
}

#[test]
fn health_addr_forms() {
    let cases = [
        ("9464", "127.0.0.1:9464"),
        (":9464", "127.0.0.1:9464"),
        ("localhost:9464", "127.0.0.1:9464"),
        ("0.0.0.0:9464", "0.0.0.0:9464"),
        ("[::]:9464", "[::]:9464"),
    ];
    for (given, want) in cases {
        let c = resolved(&["--health-addr", given], &Env::default(), None);
        assert_eq!(
            c.health_addr.map(|a| a.to_string()).as_deref(),
            Some(want),
            "{given}"
        );
    }
    let msg = err(
        &[],
        &Env::with(&[("GPULSE_HEALTH_ADDR", "everywhere")]),
        None,
    );
    assert!(
        msg.contains("GPULSE_HEALTH_ADDR=\"everywhere\"") && msg.contains("e.g. 9464"),
        "{msg}"
    );
}

#[test]
fn interval_errors_name_the_setting_and_the_limit() {
    let msg = err(&["--sample-interval", "10ms"], &Env::default(), None);
    assert!(
        msg.starts_with("--sample-interval 10ms: below the minimum of 50ms"),
        "{msg}"
    );

    let msg = err(&[], &Env::with(&[("GPULSE_SAMPLE_INTERVAL", "20ms")]), None);
    assert!(
        msg.starts_with("GPULSE_SAMPLE_INTERVAL=\"20ms\": below the minimum of 50ms"),
        "{msg}"
    );

    let f = file("\n\nsample_interval = \"1ms\"\n");
    let msg = err(&[], &Env::default(), Some(&f));
    assert!(
        msg.starts_with(
            "sample_interval = \"1ms\" (/etc/gpulse/gpulse.toml:3:19): below the minimum"
        ),
        "{msg}"
    );

    let msg = err(
        &["--sample-interval", "5s", "--export-interval", "2s"],
        &Env::default(),
        None,
    );
    assert!(
        msg.starts_with("--export-interval 2s: shorter than --sample-interval 5s"),
        "{msg}"
    );
    let msg = err(&["--sample-interval", "20s"], &Env::default(), None);
    assert!(
        msg.starts_with("default export interval 10s: shorter than --sample-interval 20s"),
        "{msg}"
    );

    let msg = err(
        &[],
        &Env::with(&[("OTEL_METRIC_EXPORT_INTERVAL", "10s")]),
        None,
    );
    assert!(
        msg.contains(
            "OTEL_METRIC_EXPORT_INTERVAL=\"10s\": expected a whole number of milliseconds"
        ),
        "{msg}"
    );

    let f = file("export_interval = 30");
    let msg = err(&[], &Env::default(), Some(&f));
    assert!(
        msg.contains("missing unit; write e.g. 30ms or 30s"),
        "{msg}"
    );
}

#[test]
fn exporter_choice() {
    assert_eq!(
        resolved(&["--exporter", "stdout"], &Env::default(), None)
            .export
            .exporter,
        ExporterKind::Stdout
    );
    let c = resolved(&[], &Env::with(&[("GPULSE_EXPORTER", "stdout")]), None);
    assert_eq!(c.export.exporter, ExporterKind::Stdout);
    let msg = err(&[], &Env::with(&[("GPULSE_EXPORTER", "prometheus")]), None);
    assert!(
        msg.contains("GPULSE_EXPORTER") && msg.contains("--metrics-exporter prometheus"),
        "{msg}"
    );
    // With stdout the OTLP settings are not read, so a broken one does not stop a debug run.
    let env = Env::with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcc")]);
    assert_eq!(
        resolved(&["--exporter", "stdout"], &env, None)
            .export
            .exporter,
        ExporterKind::Stdout
    );
}

#[test]
fn http_endpoint_path_appending() {
    let cases = [
        (
            "http://x:4318",
            "http://x:4318/v1/metrics",
            "http://x:4318/v1/logs",
        ),
        (
            "http://x:4318/",
            "http://x:4318/v1/metrics",
            "http://x:4318/v1/logs",
        ),
        (
            "http://x:4318/otlp",
            "http://x:4318/otlp/v1/metrics",
            "http://x:4318/otlp/v1/logs",
        ),
        (
            "https://x/otlp/",
            "https://x/otlp/v1/metrics",
            "https://x/otlp/v1/logs",
        ),
        (
            "http://x:4318/a?tenant=t1",
            "http://x:4318/a/v1/metrics?tenant=t1",
            "http://x:4318/a/v1/logs?tenant=t1",
        ),
        (
            "http://[::1]:4318",
            "http://[::1]:4318/v1/metrics",
            "http://[::1]:4318/v1/logs",
        ),
    ];
    for (endpoint, want_metrics, want_logs) in cases {
        let c = resolved(
            &[],
            &Env::with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]),
            None,
        );
        let (metrics, logs) = otlp(&c);
        assert_eq!(metrics.url, want_metrics, "{endpoint}");
        assert_eq!(logs.url, want_logs, "{endpoint}");
    }
}

#[test]
fn per_signal_endpoints_are_used_as_given() {
    let env = Env::with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "https://m.example.com/custom/path",
        ),
    ]);
    let c = resolved(&[], &env, None);
    let (metrics, logs) = otlp(&c);
    assert_eq!(metrics.url, "https://m.example.com/custom/path");
    assert_eq!(logs.url, "http://generic:4318/v1/logs");

    let f = file("[otlp]\nendpoint = \"http://file:4318\"\n[otlp.logs]\nendpoint = \"http://logs:9999/ingest\"\n");
    let c = resolved(&[], &Env::default(), Some(&f));
    let (metrics, logs) = otlp(&c);
    assert_eq!(metrics.url, "http://file:4318/v1/metrics");
    assert_eq!(logs.url, "http://logs:9999/ingest");

    // The generic variable beats the file's signal-specific key: environment beats file.
    let env = Env::with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")]);
    let c = resolved(&[], &env, Some(&f));
    assert_eq!(otlp(&c).1.url, "http://env:4318/v1/logs");
}

#[test]
fn per_signal_protocol_and_grpc_defaults() {
    let env = Env::with(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf"),
    ]);
    let c = resolved(&[], &env, None);
    let (metrics, logs) = otlp(&c);
    assert_eq!(
        (metrics.protocol, metrics.url.as_str()),
        (Protocol::Grpc, "http://localhost:4317")
    );
    assert_eq!(
        (logs.protocol, logs.url.as_str()),
        (Protocol::HttpProtobuf, "http://localhost:4318/v1/logs")
    );

    // gRPC: no path appended; a bare host:port is TLS unless OTEL_EXPORTER_OTLP_INSECURE.
    let c = resolved(
        &[
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            "collector:4317",
        ],
        &Env::default(),
        None,
    );
    assert_eq!(otlp(&c).0.url, "https://collector:4317");
    let env = Env::with(&[("OTEL_EXPORTER_OTLP_INSECURE", "true")]);
    let c = resolved(
        &[
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            "collector:4317",
        ],
        &env,
        None,
    );
    assert_eq!(otlp(&c).0.url, "http://collector:4317");
    assert!(otlp(&c).0.insecure);
    let c = resolved(
        &[
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            "http://c:4317/",
        ],
        &Env::default(),
        None,
    );
    assert_eq!(otlp(&c).0.url, "http://c:4317/");
}

#[test]
fn protocol_and_endpoint_errors() {
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcc")]),
        None,
    );
    assert_eq!(
        msg,
        "OTEL_EXPORTER_OTLP_PROTOCOL=\"grpcc\": expected grpc or http/protobuf"
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")]),
        None,
    );
    assert!(
        msg.starts_with(
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=\"http/json\": http/json is not supported"
        ),
        "{msg}"
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
        None,
    );
    assert!(
        msg.contains("no scheme") && msg.contains("http://collector:4318"),
        "{msg}"
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")]),
        None,
    );
    assert!(
        msg.contains("OTEL_EXPORTER_OTLP_ENDPOINT=\"not a url\": not a URL"),
        "{msg}"
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]),
        None,
    );
    assert!(msg.contains("expected none or gzip"), "{msg}");
}

#[test]
fn headers_percent_decoded_lowercased_and_signal_specific() {
    let env = Env::with(&[
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            " API-Key = abc%20def ,X-Tenant=a%2Cb",
        ),
        (
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
            "authorization=Bearer%20tok==",
        ),
    ]);
    let c = resolved(&[], &env, None);
    let (metrics, logs) = otlp(&c);
    assert_eq!(
        headers(metrics),
        vec![
            ("api-key".into(), "abc def".into()),
            ("x-tenant".into(), "a,b".into())
        ]
    );
    assert_eq!(
        headers(logs),
        vec![("authorization".into(), "Bearer tok==".into())]
    );

    // Flags replace the whole set, for both signals.
    let c = resolved(&["--otlp-header", "X-Only=1"], &env, None);
    assert_eq!(headers(otlp(&c).0), vec![("x-only".into(), "1".into())]);
    assert_eq!(headers(otlp(&c).1), vec![("x-only".into(), "1".into())]);

    let f = file("[otlp.headers]\n\"X-From-File\" = \"v\"\n");
    let c = resolved(&[], &Env::default(), Some(&f));
    assert_eq!(
        headers(otlp(&c).0),
        vec![("x-from-file".into(), "v".into())]
    );
}

#[test]
fn malformed_header_names_variable_and_position_never_value() {
    let env = Env::with(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=ok,sk-live-123456")]);
    let msg = err(&[], &env, None);
    assert!(
        msg.starts_with("OTEL_EXPORTER_OTLP_HEADERS: entry 2"),
        "{msg}"
    );
    assert!(
        !msg.contains("sk-live-123456") && !msg.contains("=ok"),
        "{msg}"
    );

    let env = Env::with(&[("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "token=%E2%28")]);
    let msg = err(&[], &env, None);
    assert!(
        msg.starts_with("OTEL_EXPORTER_OTLP_METRICS_HEADERS: entry 1 (key \"token\")"),
        "{msg}"
    );
    assert!(!msg.contains("%E2"), "{msg}");
}

#[test]
fn debug_of_config_contains_no_header_value() {
    let env = Env::with(&[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=envsecret1")]);
    let f = file("[otlp.logs.headers]\napi-key = \"filesecret2\"\n");
    let c = resolved(&[], &env, Some(&f));
    let (global, run) = parse_run(&["--otlp-header", "api-key=flagsecret3"]);
    let with_flag = Config::resolve_with_file(&global, &run, &env.lookup(), Some(&f)).unwrap();
    let debug = format!("{c:?} {with_flag:?} {run:?} {f:?}");
    for secret in ["envsecret1", "filesecret2", "flagsecret3"] {
        assert!(!debug.contains(secret), "{secret} leaked: {debug}");
    }
    // The values are there, just not printed.
    assert_eq!(headers(otlp(&c).0)[0].1, "envsecret1");
    assert_eq!(headers(otlp(&with_flag).0)[0].1, "flagsecret3");
}

#[test]
fn timeouts_by_source() {
    let env = Env::with(&[
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "500"),
    ]);
    let c = resolved(&[], &env, None);
    assert_eq!(otlp(&c).0.timeout, Duration::from_millis(500));
    assert_eq!(otlp(&c).1.timeout, Duration::from_millis(2500));
    let f = file("[otlp.metrics]\ntimeout = \"1m30s\"\n");
    assert_eq!(
        otlp(&resolved(&[], &Env::default(), Some(&f))).0.timeout,
        Duration::from_secs(90)
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]),
        None,
    );
    assert!(
        msg.starts_with(
            "OTEL_EXPORTER_OTLP_TIMEOUT=\"10s\": expected a whole number of milliseconds"
        ),
        "{msg}"
    );
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")]),
        None,
    );
    assert!(msg.contains("zero timeout"), "{msg}");
}

#[test]
fn tls_files_must_exist() {
    let msg = err(
        &[],
        &Env::with(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/x.pem")]),
        None,
    );
    assert_eq!(
        msg,
        "OTEL_EXPORTER_OTLP_CERTIFICATE=\"/x.pem\": file not found; mount it or fix the path"
    );

    let dir = tempfile::tempdir().unwrap();
    for name in ["ca.pem", "client.pem", "client-key.pem"] {
        std::fs::write(dir.path().join(name), "-----BEGIN CERTIFICATE-----\n").unwrap();
    }
    let ca = dir.path().join("ca.pem");
    let env = Env::with(&[(
        "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        ca.to_str().unwrap(),
    )]);
    let c = resolved(&[], &env, None);
    assert_eq!(otlp(&c).0.tls.ca_certificate.as_deref(), Some(ca.as_path()));
    assert_eq!(otlp(&c).1.tls.ca_certificate, None);

    // Relative paths in the file are relative to the file.
    let text = "[otlp]\ncertificate = \"ca.pem\"\nclient_certificate = \"client.pem\"\nclient_key = \"client-key.pem\"\n";
    let f = LoadedFile::parse(&dir.path().join("gpulse.toml"), text.to_string()).unwrap();
    let c = resolved(&[], &Env::default(), Some(&f));
    let tls = &otlp(&c).1.tls;
    assert_eq!(
        tls.client_certificate.as_deref(),
        Some(dir.path().join("client.pem").as_path())
    );
    assert_eq!(
        tls.client_key.as_deref(),
        Some(dir.path().join("client-key.pem").as_path())
    );

    let env = Env::with(&[(
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        dir.path().join("client.pem").to_str().unwrap(),
    )]);
    let msg = err(&[], &env, None);
    assert!(
        msg.contains("needs the client key too") && msg.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        "{msg}"
    );
}

#[test]
fn resource_attributes_and_service_name() {
    let env = Env::with(&[(
        "OTEL_RESOURCE_ATTRIBUTES",
        "k8s.cluster.name=gpu%20a,service.name=from-attrs,deployment.environment.name=prod",
    )]);
    let f =
        file("[resource_attributes]\n\"k8s.cluster.name\" = \"file\"\n\"host.role\" = \"gpu\"\n");
    let c = resolved(&[], &env, Some(&f));
    assert_eq!(c.export.service_name, "from-attrs");
    assert_eq!(
        c.export.resource_attributes,
        vec![
            ("deployment.environment.name".into(), "prod".into()),
            ("host.role".into(), "gpu".into()),
            ("k8s.cluster.name".into(), "gpu a".into()),
        ]
    );
    // OTEL_SERVICE_NAME beats service.name in OTEL_RESOURCE_ATTRIBUTES (the specification).
    let mut env2 = env.clone();
    env2.0.insert("OTEL_SERVICE_NAME".into(), "svc".into());
    assert_eq!(resolved(&[], &env2, None).export.service_name, "svc");

    // Malformed: the whole variable is discarded and reported, not fatal.
    let env = Env::with(&[("OTEL_RESOURCE_ATTRIBUTES", "a=1,broken")]);
    let c = resolved(&[], &env, Some(&f));
    assert_eq!(
        c.export.resource_attributes.len(),
        2,
        "{:?}",
        c.export.resource_attributes
    );
    assert_eq!(c.warnings.len(), 1);
    assert!(
        c.warnings[0].contains("OTEL_RESOURCE_ATTRIBUTES entry 2 has no '='"),
        "{}",
        c.warnings[0]
    );
}

#[test]
fn log_settings_are_validated() {
    let c = resolved(
        &[
            "--log-format",
            "json",
            "--log-level",
            "warn,gpulse::export=debug",
        ],
        &Env::default(),
        None,
    );
    assert_eq!(c.common.log.format, LogFormat::Json);
    assert_eq!(c.common.log.filter, "warn,gpulse::export=debug");
    let msg = err(&[], &Env::with(&[("GPULSE_LOG", "info,gpulse=loud")]), None);
    assert!(
        msg.starts_with("GPULSE_LOG=\"info,gpulse=loud\": not a log filter"),
        "{msg}"
    );
    let msg = err(&[], &Env::with(&[("GPULSE_LOG_FORMAT", "xml")]), None);
    assert!(msg.contains("expected text or json"), "{msg}");
}

#[test]
fn file_errors_carry_path_line_and_column() {
    let path = Path::new("/etc/gpulse/gpulse.toml");
    let e = LoadedFile::parse(
        path,
        "sample_interval = \"1s\"\n[otlp]\nendpiont = \"x\"\n".into(),
    )
    .unwrap_err();
    match &e {
        ConfigError::File {
            path: p,
            line,
            column,
            message,
        } => {
            assert_eq!(p, path);
            assert_eq!((*line, *column), (3, 1));
            assert!(message.contains("endpiont"), "{message}");
        }
        other => panic!("expected a File error, got {other:?}"),
    }
    let e = LoadedFile::parse(path, "[log]\nlevel = \"info\nformat = 1\n".into()).unwrap_err();
    assert!(
        e.to_string().starts_with("/etc/gpulse/gpulse.toml:2:"),
        "{e}"
    );
    let e = LoadedFile::parse(path, "sample_interval = [1, 2]\n".into()).unwrap_err();
    assert!(
        e.to_string().starts_with("/etc/gpulse/gpulse.toml:1:19:"),
        "{e}"
    );
}

#[test]
fn config_file_from_flag_or_env() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpulse.toml");
    std::fs::write(&path, "sample_interval = \"250ms\"\n").unwrap();
    let p = path.to_str().unwrap();

    let (global, run) = parse_run(&["--config", p]);
    let c = Config::resolve(&global, &run, &Env::default().lookup()).unwrap();
    assert_eq!(c.sample_interval, Duration::from_millis(250));
    assert_eq!(c.common.config_file.as_deref(), Some(path.as_path()));

    let env = Env::with(&[("GPULSE_CONFIG", p)]);
    let (global, run) = parse_run(&[]);
    let c = Config::resolve(&global, &run, &env.lookup()).unwrap();
    assert_eq!(c.sample_interval, Duration::from_millis(250));

    let (global, run) = parse_run(&["--config", "/nonexistent/gpulse.toml"]);
    let e = Config::resolve(&global, &run, &env.lookup()).unwrap_err();
    assert!(matches!(e, ConfigError::ReadFile { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("/nonexistent/gpulse.toml") && msg.contains("--config"),
        "{msg}"
    );
}

#[test]
fn example_config_parses_and_matches_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpulse.toml");
    let text = std::fs::read_to_string(&path).expect("examples/gpulse.toml is readable");
    let f = LoadedFile::parse(&path, text).unwrap_or_else(|e| panic!("{e}"));
    let mut from_example = resolved(&[], &Env::default(), Some(&f));
    assert_eq!(
        from_example.common.config_file.take().as_deref(),
        Some(path.as_path())
    );
    // It names the default endpoint, which is a choice `record` honours (it then exports).
    assert!(from_example.export.otlp_endpoint_explicit);
    from_example.export.otlp_endpoint_explicit = false;
    assert_eq!(from_example, resolved(&[], &Env::default(), None));
}

#[test]
fn inspect_config_reads_the_shared_settings() {
    let cli = Cli::try_parse_from([
        "gpulse",
        "--nvml-lib",
        "/opt/libnvml.so",
        "check",
        "--format",
        "json",
    ])
    .unwrap();
    let Command::Check(args) = &cli.command else {
        panic!("expected check")
    };
    let env = Env::with(&[
        ("GPULSE_READ_ENVIRON", "false"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "broken"),
    ]);
    let c =
        InspectConfig::resolve_with_file(&cli.global, &args.inspect, &env.lookup(), None).unwrap();
    assert_eq!(c.common.nvml_lib, PathBuf::from("/opt/libnvml.so"));
    assert_eq!(c.format, OutputFormat::Json);
    assert!(
        !c.common.analysis.read_environ,
        "the environment applies to snapshot/check too"
    );
    assert_eq!(c.common.analysis.proc_root, PathBuf::from("/proc"));
    let c = InspectConfig::resolve_with_file(
        &GlobalArgs::default(),
        &InspectArgs::default(),
        &Env::default().lookup(),
        None,
    )
    .unwrap();
    assert_eq!(c.common.nvml_lib, PathBuf::from(config::DEFAULT_NVML_LIB));
}

#[test]
fn diagnosis_table_is_read_and_validated() {
    let f = file("[diagnosis]\nclear_after_windows = 5\n");
    assert_eq!(
        resolved(&[], &Env::default(), Some(&f))
            .common
            .analysis
            .diagnosis
            .clear_after_windows,
        5
    );
    let e = LoadedFile::parse(
        Path::new("/g.toml"),
        "[diagnosis]\nno_such_rule = 1\n".into(),
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("/g.toml:2:1:"), "{e}");
}

// Property tests: the parsers never panic on anything, and round-trip what they print.

fn header_key() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9._-]{0,15}"
}

proptest! {
    #[test]
    fn key_value_list_never_panics(text in any::<String>()) {
        let _ = values::parse_key_value_list(&text);
    }

    #[test]
    fn key_value_list_round_trips(entries in proptest::collection::vec((header_key(), any::<String>()), 0..6)) {
        let encoded: Vec<String> = entries
            .iter()
            .map(|(k, v)| {
                format!("{k}={}", percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC))
            })
            .collect();
        let parsed = values::parse_key_value_list(&encoded.join(",")).unwrap();
        prop_assert_eq!(parsed, entries);
    }

    #[test]
    fn key_value_list_errors_never_echo_the_value(key in header_key(), secret in "[A-Za-z0-9]{12,20}") {
        let text = format!("{key}=ok,{secret}");
        let e = values::parse_key_value_list(&text).unwrap_err();
        prop_assert!(!e.to_string().contains(&secret));
    }

    #[test]
    fn duration_parser_never_panics(text in any::<String>()) {
        let _ = values::parse_duration(&text);
        let _ = values::parse_millis(&text);
    }

    #[test]
    fn duration_round_trips(ms in 0u64..10_000_000_000) {
        let d = Duration::from_millis(ms);
        prop_assert_eq!(values::parse_duration(&values::format_duration(d)), Ok(d));
    }

    #[test]
    fn size_parser_never_panics(text in any::<String>()) {
        let _ = values::parse_size(&text);
    }

    #[test]
    fn size_round_trips(bytes in any::<u64>(), shift in 0u32..40) {
        let bytes = bytes >> shift << shift.min(30);
        prop_assert_eq!(values::parse_size(&values::format_size(bytes)), Ok(bytes));
        prop_assert_eq!(values::parse_size(&bytes.to_string()), Ok(bytes));
    }

    #[test]
    fn toml_loading_never_panics(text in any::<String>()) {
        let _ = LoadedFile::parse(Path::new("/p.toml"), text);
    }

    #[test]
    fn toml_loading_of_key_value_lines_never_panics(
        lines in proptest::collection::vec(("[a-z_.]{1,20}", "[ -~]{0,30}"), 0..8)
    ) {
        let text: String = lines.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        if let Err(ConfigError::File { line, column, .. }) = LoadedFile::parse(Path::new("/p.toml"), text.clone()) {
            prop_assert!(line >= 1 && line <= lines.len() + 1, "line {} of {}", line, lines.len());
            prop_assert!(column >= 1);
        }
    }

    #[test]
    fn resolve_with_arbitrary_environment_never_panics(
        vars in proptest::collection::vec((
            prop::sample::select(vec![
                "GPULSE_SAMPLE_INTERVAL", "GPULSE_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_INTERVAL",
                "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT",
                "OTEL_RESOURCE_ATTRIBUTES", "GPULSE_HEALTH_ADDR", "GPULSE_QUEUE_MAX_BYTES", "GPULSE_LOG",
            ]),
            any::<String>(),
        ), 0..6)
    ) {
        let env = Env(vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
        let _ = Config::resolve_with_file(&GlobalArgs::default(), &RunArgs::default(), &env.lookup(), None);
    }
}

#[test]
fn example_config_lists_every_diagnosis_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpulse.toml");
    let table: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let defaults = toml::Value::try_from(gpulse::diagnosis::Thresholds::default()).unwrap();
    assert_eq!(
        table.get("diagnosis"),
        Some(&defaults),
        "examples/gpulse.toml [diagnosis] drifted from Thresholds::default()"
    );
}

#[test]
fn nested_signal_tables_and_bad_file_headers_are_refused() {
    let f = file("[otlp.metrics.logs]\nendpoint = \"http://x:4318\"\n");
    let msg = err(&[], &Env::default(), Some(&f));
    assert!(
        msg.starts_with("[otlp.metrics] in /etc/gpulse/gpulse.toml: holds another signal table"),
        "{msg}"
    );
    let f = file("[otlp.headers]\n\"bad header\" = \"tok3n\"\n");
    let msg = err(&[], &Env::default(), Some(&f));
    assert!(
        msg.starts_with("otlp.headers (/etc/gpulse/gpulse.toml): entry 1"),
        "{msg}"
    );
    assert!(!msg.contains("tok3n"), "{msg}");
}

#[test]
fn prometheus_settings_follow_the_one_precedence() {
    use gpulse::config::{PrometheusNames, PrometheusSettings};
    let off = resolved(&[], &Env::default(), None).prometheus;
    assert_eq!(off, PrometheusSettings::default());
    assert_eq!(off.addr, None, "no port unless asked for");

    let f = file("[prometheus]\naddr = \"0.0.0.0:9400\"\nnames = \"dcgm\"\nmax_series = 500\n");
    let from_file = resolved(&[], &Env::default(), Some(&f)).prometheus;
    assert_eq!(
        from_file,
        PrometheusSettings {
            addr: Some("0.0.0.0:9400".parse().unwrap()),
            names: PrometheusNames::Dcgm,
            max_series: 500,
            dcgm_counters: None,
        }
    );
    let env = Env::with(&[
        ("GPULSE_PROMETHEUS_ADDR", "9401"),
        ("GPULSE_PROMETHEUS_NAMES", "otel"),
    ]);
    let from_env = resolved(&[], &env, Some(&f)).prometheus;
    assert_eq!(from_env.addr, Some("127.0.0.1:9401".parse().unwrap()));
    assert_eq!(from_env.names, PrometheusNames::Otel);
    assert_eq!(
        from_env.max_series, 500,
        "the file still gives what the env does not"
    );
    let from_flags = resolved(
        &[
            "--prometheus-addr",
            "[::1]:9402",
            "--prometheus-names",
            "dcgm",
            "--prometheus-max-series",
            "7",
        ],
        &env,
        Some(&f),
    )
    .prometheus;
    assert_eq!(
        from_flags,
        PrometheusSettings {
            addr: Some("[::1]:9402".parse().unwrap()),
            names: PrometheusNames::Dcgm,
            max_series: 7,
            dcgm_counters: None,
        }
    );
}

/// The counters file: `--dcgm-counters` over dcgm-exporter's `DCGM_EXPORTER_COLLECTORS` over
/// `prometheus.dcgm_counters`; it implies the dcgm names, and refuses `otel` beside it.
#[test]
fn the_dcgm_counters_file_follows_the_precedence_and_implies_dcgm_names() {
    use gpulse::config::{PrometheusNames, PrometheusSettings};
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf-8").to_string()
    };
    let temp = write("temp.csv", "DCGM_FI_DEV_GPU_TEMP, gauge, t\n");
    let power = write("power.csv", "DCGM_FI_DEV_POWER_USAGE, gauge, p\n");
    let energy = write(
        "energy.csv",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, e\n",
    );
    let selected = |p: &PrometheusSettings| -> Vec<&'static str> {
        let counters = p.dcgm_counters.as_ref().expect("a counters file");
        counters.counters.iter().map(|c| c.series.name).collect()
    };
    let f = file(&format!("[prometheus]\ndcgm_counters = {energy:?}\n"));
    let from_file = resolved(&[], &Env::default(), Some(&f)).prometheus;
    assert_eq!(
        selected(&from_file),
        ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    );
    assert_eq!(from_file.names, PrometheusNames::Dcgm, "implied");
    let env = Env::with(&[("DCGM_EXPORTER_COLLECTORS", power.as_str())]);
    let from_env = resolved(&[], &env, Some(&f)).prometheus;
    assert_eq!(selected(&from_env), ["DCGM_FI_DEV_POWER_USAGE"]);
    let from_flag = resolved(&["--dcgm-counters", &temp], &env, Some(&f)).prometheus;
    assert_eq!(selected(&from_flag), ["DCGM_FI_DEV_GPU_TEMP"]);

    let conflict = err(
        &["--dcgm-counters", &temp, "--prometheus-names", "otel"],
        &Env::default(),
        None,
    );
    assert!(
        conflict.contains("--prometheus-names otel") && conflict.contains("only"),
        "{conflict}"
    );
    let missing = err(
        &["--dcgm-counters", "/nonexistent/custom.csv"],
        &Env::default(),
        None,
    );
    assert!(
        missing.contains("/nonexistent/custom.csv") && missing.contains("--dcgm-counters"),
        "{missing}"
    );
    let unknown = write("unknown.csv", "# x\nDCGM_FI_DEV_NOT_A_FIELD, gauge, x\n");
    let refused = err(&["--dcgm-counters", &unknown], &Env::default(), None);
    assert!(
        refused.contains("unknown.csv:2: gpulse cannot serve DCGM_FI_DEV_NOT_A_FIELD"),
        "{refused}"
    );
    let warned = resolved(
        &["--dcgm-counters", &unknown],
        &Env::with(&[("GPULSE_DCGM_COUNTERS_UNKNOWN", "warn")]),
        None,
    );
    assert!(warned
        .prometheus
        .dcgm_counters
        .expect("file")
        .counters
        .is_empty());
    assert!(
        warned
            .warnings
            .iter()
            .any(|w| w.contains("DCGM_FI_DEV_NOT_A_FIELD skipped")),
        "{:?}",
        warned.warnings
    );
}

#[test]
fn bad_prometheus_settings_say_what_to_write() {
    let zero = err(
        &[],
        &Env::default(),
        Some(&file("[prometheus]\nmax_series = 0\n")),
    );
    assert!(
        zero.contains("prometheus.max_series") && zero.contains("e.g. 20000"),
        "{zero}"
    );
    let names = err(
        &[],
        &Env::with(&[("GPULSE_PROMETHEUS_NAMES", "DCGM_FI")]),
        None,
    );
    assert!(
        names.contains("GPULSE_PROMETHEUS_NAMES")
            && names.contains("otel")
            && names.contains("dcgm"),
        "{names}"
    );
    let addr = err(&["--prometheus-addr", "everywhere"], &Env::default(), None);
    assert!(
        addr.contains("--prometheus-addr") && addr.contains("0.0.0.0:9464"),
        "{addr}"
    );
}

// --- Per-signal exporters (OTEL_METRICS_EXPORTER, OTEL_LOGS_EXPORTER, Prometheus address) ---

fn sinks(args: &[&str], env: &[(&str, &str)], file_text: Option<&str>) -> SignalSinks {
    let loaded = file_text.map(file);
    resolved(args, &Env::with(env), loaded.as_ref())
        .export
        .sinks
}

fn sink_pair(s: SignalSinks) -> (Sink, bool, Sink) {
    (s.metrics, s.prometheus, s.logs)
}

#[test]
fn exporters_default_to_otlp_for_both_signals() {
    let c = resolved(&[], &Env::default(), None);
    assert_eq!(c.export.sinks, SignalSinks::default());
    assert!(matches!(c.export.exporter, ExporterKind::Otlp { .. }));
    assert_eq!(c.prometheus.addr, None);
}

#[test]
fn otel_exporter_variables_choose_per_signal() {
    use Sink::*;
    for (metrics, logs, want) in [
        ("otlp", "otlp", (Otlp, false, Otlp)),
        ("prometheus", "none", (Off, true, Off)),
        ("prometheus", "otlp", (Off, true, Otlp)),
        ("otlp,prometheus", "none", (Otlp, true, Off)),
        ("none", "otlp", (Off, false, Otlp)),
        ("console", "console", (Stdout, false, Stdout)),
        ("stdout", "none", (Stdout, false, Off)),
        ("none", "none", (Off, false, Off)),
        ("console,prometheus", "otlp", (Stdout, true, Otlp)),
    ] {
        let got = sinks(
            &[],
            &[
                ("OTEL_METRICS_EXPORTER", metrics),
                ("OTEL_LOGS_EXPORTER", logs),
            ],
            None,
        );
        assert_eq!(sink_pair(got), want, "metrics={metrics} logs={logs}");
    }
}

#[test]
fn exporter_precedence_flag_env_gpulse_file() {
    use Sink::*;
    let env_otel = [
        ("OTEL_METRICS_EXPORTER", "prometheus"),
        ("OTEL_LOGS_EXPORTER", "none"),
    ];
    let text = "metrics_exporter = \"console\"\nlogs_exporter = \"console\"\nexporter = \"none\"\n";
    // File: the signal key beats the all-signal key.
    assert_eq!(
        sink_pair(sinks(&[], &[], Some(text))),
        (Stdout, false, Stdout)
    );
    assert_eq!(
        sink_pair(sinks(&[], &[], Some("exporter = \"none\"\n"))),
        (Off, false, Off)
    );
    // GPULSE_EXPORTER beats the file; OTEL_*_EXPORTER beats GPULSE_EXPORTER.
    assert_eq!(
        sink_pair(sinks(&[], &[("GPULSE_EXPORTER", "none")], Some(text))),
        (Off, false, Off)
    );
    let mut env = env_otel.to_vec();
    env.push(("GPULSE_EXPORTER", "stdout"));
    assert_eq!(sink_pair(sinks(&[], &env, Some(text))), (Off, true, Off));
    // --exporter beats every variable; --metrics-exporter beats --exporter.
    assert_eq!(
        sink_pair(sinks(&["--exporter", "otlp"], &env, Some(text))),
        (Otlp, false, Otlp)
    );
    assert_eq!(
        sink_pair(sinks(
            &[
                "--exporter",
                "none",
                "--metrics-exporter",
                "otlp,prometheus"
            ],
            &env,
            None
        )),
        (Otlp, true, Off)
    );
    assert_eq!(
        sink_pair(sinks(&["--logs-exporter", "otlp"], &env_otel, None)),
        (Off, true, Otlp)
    );
    // An empty variable counts as unset.
    assert_eq!(
        sink_pair(sinks(&[], &[("OTEL_METRICS_EXPORTER", "")], None)),
        (Otlp, false, Otlp)
    );
}

#[test]
fn unknown_exporters_name_the_setting_value_and_choices() {
    let msg = err(
        &[],
        &Env::with(&[("OTEL_METRICS_EXPORTER", "zipkin")]),
        None,
    );
    assert!(msg.contains("OTEL_METRICS_EXPORTER"), "{msg}");
    assert!(msg.contains("zipkin"), "{msg}");
    assert!(msg.contains("otlp, prometheus, console"), "{msg}");
    let msg = err(
        &[],
        &Env::with(&[("OTEL_LOGS_EXPORTER", "prometheus")]),
        None,
    );
    assert!(
        msg.contains("OTEL_LOGS_EXPORTER") && msg.contains("metrics only"),
        "{msg}"
    );
    let msg = err(
        &["--metrics-exporter", "otlp,console"],
        &Env::default(),
        None,
    );
    assert!(
        msg.contains("--metrics-exporter") && msg.contains("one delivery lane"),
        "{msg}"
    );
    let msg = err(&["--logs-exporter", "jaeger"], &Env::default(), None);
    assert!(
        msg.contains("--logs-exporter") && msg.contains("otlp, console"),
        "{msg}"
    );
    let loaded = file("metrics_exporter = \"none,otlp\"\n");
    let msg = err(&[], &Env::default(), Some(&loaded));
    assert!(
        msg.contains("metrics_exporter") && msg.contains("gpulse.toml:1"),
        "{msg}"
    );
}

#[test]
fn prometheus_only_reads_no_otlp_setting_and_forwards_nothing() {
    // A broken OTLP variable cannot stop a deployment that does not use OTLP.
    let env = Env::with(&[
        ("OTEL_METRICS_EXPORTER", "prometheus"),
        ("OTEL_LOGS_EXPORTER", "none"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcc"),
    ]);
    let c = resolved(&["--otlp-receiver-http", "14318"], &env, None);
    assert_eq!(c.export.exporter, ExporterKind::Off);
    assert_eq!(c.export.sinks.forward, Sink::Off);
    assert_eq!(c.export.sinks.traces_lane(), Sink::Off);
    assert!(!c.export.sinks.uses_otlp());
    // An explicit upstream makes the receiver forward (metrics, logs and traces lanes).
    let env = Env::with(&[
        ("OTEL_METRICS_EXPORTER", "prometheus"),
        ("OTEL_LOGS_EXPORTER", "none"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://collector:4318/v1/traces",
        ),
    ]);
    let c = resolved(&["--otlp-receiver-http", "14318"], &env, None);
    assert_eq!(c.export.sinks.forward, Sink::Otlp);
    assert_eq!(c.export.sinks.metrics, Sink::Off);
    assert_eq!(c.export.sinks.metrics_lane(), Sink::Otlp);
    match &c.export.exporter {
        ExporterKind::Otlp { traces, .. } => {
            assert_eq!(traces.url, "http://collector:4318/v1/traces")
        }
        other => panic!("expected OTLP endpoints, got {other:?}"),
    }
    let c = resolved(
        &[
            "--exporter",
            "none",
            "--otlp-endpoint",
            "http://collector:4318",
            "--otlp-receiver-grpc",
            "14317",
        ],
        &Env::default(),
        None,
    );
    assert_eq!(c.export.sinks.forward, Sink::Otlp);
    // Without a receiver there is nothing to forward: an endpoint alone opens no lane.
    let c = resolved(
        &[
            "--exporter",
            "none",
            "--otlp-endpoint",
            "http://collector:4318",
        ],
        &Env::default(),
        None,
    );
    assert_eq!(c.export.sinks.forward, Sink::Off);
    assert_eq!(c.export.exporter, ExporterKind::Off);
}

#[test]
fn prometheus_address_from_otel_variables_flag_wins() {
    use std::net::SocketAddr;
    let prom = [("OTEL_METRICS_EXPORTER", "prometheus")];
    let addr =
        |args: &[&str], env: &[(&str, &str)]| resolved(args, &Env::with(env), None).prometheus.addr;
    assert_eq!(
        addr(&[], &prom),
        Some("127.0.0.1:9464".parse::<SocketAddr>().unwrap())
    );
    let mut env = prom.to_vec();
    env.extend([
        ("OTEL_EXPORTER_PROMETHEUS_HOST", "0.0.0.0"),
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "9400"),
    ]);
    assert_eq!(addr(&[], &env), Some("0.0.0.0:9400".parse().unwrap()));
    assert_eq!(
        addr(
            &[],
            &[
                ("OTEL_METRICS_EXPORTER", "prometheus"),
                ("OTEL_EXPORTER_PROMETHEUS_HOST", "::1")
            ]
        ),
        Some("[::1]:9464".parse().unwrap())
    );
    // --prometheus-addr (or its variable) wins over the OTEL_* pair.
    assert_eq!(
        addr(&["--prometheus-addr", ":9500"], &env),
        Some("127.0.0.1:9500".parse().unwrap())
    );
    let mut gp = env.clone();
    gp.push(("GPULSE_PROMETHEUS_ADDR", "0.0.0.0:9600"));
    assert_eq!(addr(&[], &gp), Some("0.0.0.0:9600".parse().unwrap()));
    // Without prometheus in the list the OTEL_* pair is not read; an explicit address still
    // serves /metrics beside OTLP, as before.
    let host_only = [("OTEL_EXPORTER_PROMETHEUS_PORT", "not-a-port")];
    assert_eq!(addr(&[], &host_only), None);
    assert_eq!(
        addr(&["--prometheus-addr", "9401"], &[]),
        Some("127.0.0.1:9401".parse().unwrap())
    );
    // Bad values name the variable.
    let mut bad = prom.to_vec();
    bad.push(("OTEL_EXPORTER_PROMETHEUS_PORT", "94640"));
    let msg = err(&[], &Env::with(&bad), None);
    assert!(
        msg.contains("OTEL_EXPORTER_PROMETHEUS_PORT") && msg.contains("94640"),
        "{msg}"
    );
    let mut bad = prom.to_vec();
    bad.push(("OTEL_EXPORTER_PROMETHEUS_HOST", "gpu-node.example"));
    let msg = err(&[], &Env::with(&bad), None);
    assert!(
        msg.contains("OTEL_EXPORTER_PROMETHEUS_HOST") && msg.contains("0.0.0.0"),
        "{msg}"
    );
}

/// `record` exports only when an endpoint was named: by the flag, the generic or a
/// signal-specific variable, or the file's `[otlp]` or `[otlp.<signal>]` key. Other OTLP
/// settings, and the defaults, do not count.
#[test]
fn an_endpoint_counts_as_explicit_only_when_some_layer_names_one() {
    let none = Env::default();
    assert!(!resolved(&[], &none, None).export.otlp_endpoint_explicit);
    assert!(
        !resolved(
            &["--otlp-protocol", "grpc", "--otlp-timeout", "2s"],
            &Env::with(&[("OTEL_EXPORTER_OTLP_HEADERS", "a=b")]),
            Some(&file("[otlp]\ncompression = \"gzip\"\n")),
        )
        .export
        .otlp_endpoint_explicit,
        "settings other than the endpoint"
    );
    assert!(
        resolved(&["--otlp-endpoint", "http://c:4318"], &none, None)
            .export
            .otlp_endpoint_explicit
    );
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        let env = Env::with(&[(var, "http://c:4318/v1/x")]);
        assert!(
            resolved(&[], &env, None).export.otlp_endpoint_explicit,
            "{var}"
        );
    }
    for text in [
        "[otlp]\nendpoint = \"http://c:4318\"\n",
        "[otlp.logs]\nendpoint = \"http://c:4318/v1/logs\"\n",
    ] {
        assert!(
            resolved(&[], &none, Some(&file(text)))
                .export
                .otlp_endpoint_explicit,
            "{text}"
        );
    }
}
