//! GPU metrics from a Rust program's own OpenTelemetry SDK, without the gpulse sidecar:
//! `gpulse::otel` registers the GPU instruments on this program's `Meter`, and the SDK exports
//! them with `opentelemetry-otlp` under the program's own `service.name`.
//!
//! ```text
//! OTEL_SERVICE_NAME=trainer OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \
//!     cargo run --release --features otel-sdk --example otel_sdk
//! ```
//!
//! Environment:
//! - `GPULSE_NVML_LIB`: the NVML library (default `libnvidia-ml.so.1`).
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource (the SDK reads them).
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` (and the per-signal variables), read by opentelemetry-otlp.
//! - `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` or `http/protobuf` (default, as the OTel spec says).
//! - `OTEL_METRIC_EXPORT_INTERVAL`: milliseconds between exports (SDK default 60000).
//! - `GPULSE_EXAMPLE_SECONDS`: how long to run (default 10); the provider is then shut down, so
//!   the last collection is exported before the program exits.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use gpulse::otel::{GpuMetrics, GpuMetricsOptions};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{MetricExporter, WithExportConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("otel_sdk: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Which OTLP transport `OTEL_EXPORTER_OTLP_PROTOCOL` asks for.
enum Transport {
    Grpc,
    HttpProtobuf,
}

fn transport() -> Result<Transport, String> {
    match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Err(_) | Ok("") | Ok("http/protobuf") => Ok(Transport::HttpProtobuf),
        Ok("grpc") => Ok(Transport::Grpc),
        Ok(other) => Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported by this example: use `grpc` \
             or `http/protobuf`"
        )),
    }
}

fn run_for() -> Result<Duration, String> {
    match std::env::var("GPULSE_EXAMPLE_SECONDS") {
        Err(_) => Ok(Duration::from_secs(10)),
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                format!(
                    "GPULSE_EXAMPLE_SECONDS={text:?} is not a number of seconds: give e.g. 10 \
                     or 2.5"
                )
            }),
    }
}

async fn run() -> Result<(), String> {
    let nvml_lib: PathBuf = std::env::var_os("GPULSE_NVML_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(gpulse::sampling::DEFAULT_NVML_LIB));
    let seconds = run_for()?;
    // The exporter reads the endpoint, headers, timeout and compression variables itself.
    let exporter = match transport()? {
        Transport::Grpc => MetricExporter::builder().with_tonic().build(),
        Transport::HttpProtobuf => MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
    }
    .map_err(|e| format!("cannot build the OTLP metric exporter: {e}"))?;
    // `Resource::builder()` applies OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    let provider = SdkMeterProvider::builder()
        .with_resource(Resource::builder().build())
        .with_reader(PeriodicReader::builder(exporter).build())
        .build();

    let gpu = GpuMetrics::open(&nvml_lib).map_err(|e| e.to_string())?;
    let registration = gpu.register(&provider.meter("otel_sdk"), GpuMetricsOptions::default());
    eprintln!(
        "otel_sdk: exporting GPU metrics from {} for {seconds:?}",
        nvml_lib.display()
    );

    tokio::select! {
        () = tokio::time::sleep(seconds) => {}
        _ = tokio::signal::ctrl_c() => eprintln!("otel_sdk: interrupted, flushing"),
    }
    // Shutdown collects and exports once more; it blocks, so off the runtime's workers, which
    // the gRPC exporter needs meanwhile.
    let result = tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .map_err(|e| format!("the shutdown task failed: {e}"))?;
    drop(registration);
    result.map_err(|e| format!("the last export did not complete: {e}"))
}
