//! The commands a user runs: `snapshot` (one sample, printed), `run` (the sidecar pipeline) and
//! `check` (the health checklist). They wire the pipeline stages together; the stages themselves
//! live in `sampling`, `attribution`, `diagnosis` and `export`.

pub mod analysis;
pub mod check;
pub mod run;
pub mod snapshot;
