//! The commands a user runs, one file or folder each: `snapshot` (one sample or a short window,
//! printed), `run` (the sidecar), `check` (the health checklist), `top` (the live terminal
//! view) and `record` (a command wrapped, with its summary and report; `gpulse report` too).
//! Each keeps its own select loop and its sinks around the pipeline's `WindowLoop`; the stages
//! themselves live in `sampling`, `attribution`, `diagnosis`, `pipeline` (the window loop run,
//! record, top and `/status` share) and `export` (and the view's drawing in `top`).
//! `receivers` starts the local OTLP receivers of run, record and top.
//!
//! Besides the loops, a command keeps what only it shows: `snapshot`'s table and JSON
//! (`snapshot/render.rs`) and its one-window analysis (`snapshot/window.rs`), `run`'s health
//! endpoint, `/status` and `/metrics` tasks (`run/health.rs`, `run/status.rs`,
//! `run/prometheus.rs`): more than loops, but no command imports another's parts, and what two
//! commands share lives in a stage (or, for the receivers, in `receivers`).

pub mod check;
mod receivers;
pub mod record;
pub mod run;
pub mod snapshot;
pub mod top;
