//! `gpulse top`: the live terminal view. It shows what `gpulse run` would export, from the same
//! sampler thread, window aggregator and [`crate::pipeline::Analyzer`]; this module
//! only keeps the view's own state and draws it.
//!
//! - `app`: the state (latest `View`, sparkline history, sort, filter, tree, selection, detail);
//!   updated by new windows and key actions, read by drawing.
//! - `ui`: draws an `App` on any ratatui backend (the terminal, or `TestBackend` in tests).
//! - `input`: key events to actions, and the sort keys and modes they choose between.
//! - `procinfo`: what the view reads from `/proc` itself: the descendants of GPU processes (the
//!   tree view) and gpulse's own CPU.
//! - `terminal`: raw mode and the alternate screen, restored on every exit path, panics included.
//! - `logs`: log lines kept in memory and shown in the footer instead of scribbling on the screen.

pub(crate) mod app;
pub(crate) mod input;
pub mod logs;
pub(crate) mod procinfo;
pub(crate) mod terminal;
pub(crate) mod ui;

#[cfg(test)]
mod tests;

pub(crate) use app::App;
