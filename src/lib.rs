//! gpulse: NVIDIA GPU metrics as OpenTelemetry (OTLP), each GPU process under its own resource.
//!
//! The pipeline is `sampling` (NVML → `Snapshot`, and the export `Window`), `attribution`
//! (host PID → `Workload`), `diagnosis` (rules → findings), and `export` (OTLP requests and
//! their transports). `config` turns flags, environment and file into one validated `Config`;
//! `cli` holds the command-line definitions. Each stage is a pure function of its input where it
//! can be; the tasks in `run` only move values between them.

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
