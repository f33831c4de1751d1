//! The pipeline every long-running consumer shares: the sampler thread that turns NVML into
//! `Snapshot`s on its own thread, the [`Analyzer`] that turns each closed window into a
//! [`View`] (attribution, then diagnosis), the watch channel that publishes it, and the JSON
//! report (`/status`, `gpulse snapshot --format json`) built from one. `gpulse run`, `gpulse top`
//! and `/status` wire these pieces; none of them re-groups processes or calls NVML itself.

pub mod analyzer;
pub mod report;
pub mod sampler_thread;
pub mod view;
pub mod window_loop;

pub use analyzer::{Analysis, Analyzer};
pub use report::SnapshotReport;
pub use sampler_thread::{SamplerHealth, SamplerSettings, SamplerThread};
pub use view::{View, ViewReceiver};
pub use window_loop::{IntakePlan, Upstream, WindowLoop};
