//! The value every consumer of a running pipeline reads: one [`View`] per analysed window,
//! published on a `tokio::sync::watch` channel. Observers (`/status`, `/metrics`, the live
//! view, self-telemetry) never call NVML or `/proc` themselves: they read the latest `View`,
//! which the channel always holds and which never makes the pipeline wait on a slow reader.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::attribution::AttributedWindow;
use crate::diagnosis::training::TrainingWindow;
use crate::diagnosis::Finding;

/// The state of a running pipeline as of its last closed window.
#[derive(Debug, Clone)]
pub struct View {
    pub attributed: Arc<AttributedWindow>,
    /// Findings active after this window, as the tracker holds them.
    pub findings: Vec<Finding>,
    /// What the processes' step spans said (per-rank step time and collective wait), as exported.
    pub training: Arc<TrainingWindow>,
    /// When the window was analysed.
    pub at: SystemTime,
}

/// Where observers subscribe: `None` until the first window has been analysed.
pub type ViewReceiver = watch::Receiver<Option<Arc<View>>>;
