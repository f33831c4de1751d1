//! gpulse: NVIDIA GPU metrics as OpenTelemetry (OTLP), each GPU process under its own resource.
//!
//! # Data flow
//!
//! ```text
//!  NVML ─► sampling ─► attribution ─► diagnosis ─► pipeline ─► View ─► export (OTLP, /metrics)
//!          Snapshot,   Workloads,     Findings     WindowLoop,         top (terminal view)
//!          Window      ledger                      Analyzer            record (summary, HTML)
//!                                         ▲
//!  applications' OTLP ─► enrich ──────────┘ framework evidence; their spans get GPU usage
//!                                           and go upstream through export's queue
//! ```
//!
//! Each stage is a pure function of its input where it can be; the commands' loops only move
//! values between them. docs/architecture.md draws the same map with the contract between the stages.
//!
//! # Modules, from the bottom up
//!
//! A module imports only modules listed before it: nothing reaches up. (`enrich` comes
//! after `export` because it forwards through the export queue; it meets the pipeline at run
//! time where `commands::receivers` connects them: the intake writes the `WindowLoop`'s
//! framework evidence, and the sample history is the loop's `WindowObserver`.)
//!
//! - [`values`]: value syntaxes (durations, sizes, `key=value` lists) and `SecretString`; a leaf.
//! - `fast_map`: `FastMap`/`FastSet`, std's map with foldhash's seeded hasher, for the per-window
//!   hot paths; a leaf.
//! - [`schema`]: the tables every stage names things by: each metric, device and GPM field,
//!   attribute key and value, the health metrics, the Weaver registry. Depends on nothing.
//! - [`cli`]: the command line (clap), checked for syntax only.
//! - [`config`]: flags > environment > file > defaults → one validated `Config` or
//!   `InspectConfig`, and each stage's own settings.
//! - [`sampling`]: NVML → `Snapshot` per sample interval; snapshots → `Window` per export
//!   interval.
//! - [`attribution`]: host PID → `Workload` (container, pod, PID-namespace PID, service, rank);
//!   `Window` → `AttributedWindow`; the ledger of held time and energy by cause.
//! - [`diagnosis`]: rules over the attributed window and its history → `Finding`s, their
//!   tracker and OTLP log records, the framework evidence the rules read, `gpulse check`.
//! - [`pipeline`]: the sampler thread and the `WindowLoop` (window → attribution → diagnosis →
//!   `View`) that `run`, `record` and `top` share, the watch channel, the `/status` report.
//! - [`export`]: OTLP requests (one resource per process), the delivery queue, transports, the
//!   `Exporter`, Prometheus `/metrics`, gpulse's own health metrics.
//! - [`top`]: the live terminal view's state and drawing.
//! - [`enrich`]: the local OTLP receivers: the framework's telemetry for diagnosis, spans
//!   enriched from the sample history and forwarded.
//! - [`record`]: `gpulse record` and `gpulse report`: the `Recording`, its summary, the HTML
//!   report.
//! - [`commands`]: one per subcommand: its select loop and sinks around the `WindowLoop`.
//! - `otel` (feature `otel-sdk`): gpulse's GPU instruments on a program's own OpenTelemetry
//!   `Meter`, from the same sampling code.
//! - `fuzzing` (hidden): the entry points of the fuzz targets in `fuzz/`.

// Module docs name the private parts they own, for contributors, who read them with
// `cargo doc --document-private-items`; in the public docs those names stay plain text.
#![allow(rustdoc::private_intra_doc_links)]

pub mod attribution;
pub mod cli;
pub mod commands;
pub mod config;
pub mod diagnosis;
pub mod enrich;
pub mod export;
pub(crate) mod fast_map;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "otel-sdk")]
pub mod otel;
pub mod pipeline;
pub mod record;
pub mod sampling;
pub mod schema;
pub mod top;
pub mod values;
