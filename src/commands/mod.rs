//! The commands a user runs, one file each: `snapshot` (one sample or a short window,
//! printed), `run` (the sidecar), `check` (the health checklist), `top` (the live terminal
//! view) and `record` (a command wrapped, with its summary and report; `gpulse report` too).
//! Each keeps its own loop and its sinks; the stages themselves live in `sampling`,
//! `attribution`, `diagnosis`, `pipeline` (the window loop run, record, top and `/status` share)
//! and `export` (and the view's drawing in `top`). `receivers` starts the local OTLP receivers
//! of run, record and top.

pub mod check;
mod receivers;
pub mod record;
pub mod run;
pub mod snapshot;
pub mod top;
