//! The commands a user runs, one thin file each: `snapshot` (one sample or a short window,
//! printed), `run` (the sidecar), `check` (the health checklist), `top` (the live terminal
//! view) and `record` (a command wrapped, with its summary and report; `gpulse report` too).
//! They wire the stages together; the stages themselves live in `sampling`, `attribution`, `diagnosis`,
//! `pipeline` (what run, top and `/status` share) and `export` (and the view's drawing in `top`).

pub mod check;
pub mod record;
pub mod run;
pub mod snapshot;
pub mod snapshot_window;
pub mod top;
