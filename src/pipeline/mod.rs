//! The pipeline every long-running consumer shares: the sampler thread that turns NVML into
//! `Snapshot`s on its own thread, the [`WindowLoop`] that is fed them and closes a window when
//! asked (its [`Analyzer`] turns each closed window into a [`View`]: attribution, then
//! diagnosis, with what the applications sent through the local OTLP receivers), the watch
//! channel that
//! publishes the view, and the JSON report (`/status`, `gpulse snapshot --format json`) built
//! from one. `gpulse run`, `gpulse record` and `gpulse top` each run their own select loop around
//! a `WindowLoop`; none of them re-groups processes or calls NVML itself.

pub mod analyzer;
mod reads;
pub mod report;
pub mod sampler_thread;
pub mod view;
pub mod window_loop;

pub use analyzer::{Analysis, Analyzer};
pub use reads::{unread_fields, UnreadFields, ANALYSIS_GPM_READS, ANALYSIS_READS};
pub use report::SnapshotReport;
pub use sampler_thread::{snapshot_channel, SamplerHealth, SamplerSettings, SamplerThread};
pub use view::{View, ViewReceiver};
pub use window_loop::{WindowLoop, WindowObserver};
