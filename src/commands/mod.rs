//! The commands a user runs: `snapshot` (one sample or a short window, printed), `run` (the sidecar pipeline),
//! `check` (the health checklist) and `top` (the live terminal view). They wire the pipeline
//! stages together; the stages themselves live in `sampling`, `attribution`, `diagnosis` and
//! `export` (and the view's drawing in `top`).

pub mod analysis;
pub mod check;
pub mod report;
pub mod run;
pub mod snapshot;
pub mod snapshot_window;
pub mod top;
