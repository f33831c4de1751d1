//! All integration tests, one binary (link time), a module per area.

mod attribution;
mod common;
mod config;
mod dcgm_exporter;
mod diagnosis;
mod energy;
mod enrich;
mod export;
mod exporters;
mod findings;
mod floor;
mod framework;
mod gpm;
mod kernel;
mod mig;
#[cfg(feature = "otel-sdk")]
mod otel_sdk;
mod other_nvml;
mod prometheus;
mod record;
mod record_export;
mod reliability;
mod run;
mod sampling;
mod shared;
mod snapshot_window;
mod status_fixture;
mod terminal;
mod top;
mod weaver;
