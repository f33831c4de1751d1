//! Where each rank of a job is while it is there: the PyTorch companion's live-state records
//! (log records of event `pytorch.training.live`, sent while a step, phase or collective lasts
//! far longer than a step should; examples/pytorch's `live.py`), and what gpulse remembers of a
//! rank whose process has gone. `rules::distributed_hang` reads both to name the rank that holds
//! a stuck job.
//!
//! The names here are the companion's (it sends them; gpulse only reads them), declared once.

use std::time::{Duration, SystemTime};

use crate::attribution::DistributedIdentity;
use crate::schema::attributes::AttributeId as A;

/// The event name (and body) of a live-state record.
pub(crate) const LIVE_EVENT: &str = "pytorch.training.live";
/// The global step in progress.
pub(crate) const STEP: &str = "training.step";
/// `data_wait`, `step` (in a step, outside a named phase) or the phase's own name.
pub(crate) const PHASE: &str = "training.live.phase";
/// Seconds in that phase when the record was made.
pub(crate) const PHASE_ELAPSED: &str = "training.live.phase.elapsed";
/// The oldest collective in flight: its operation, number in the process, seconds since issued.
pub(crate) const COLLECTIVE_OP: &str = "pytorch.distributed.collective.op";
pub(crate) const COLLECTIVE_SEQ: &str = "pytorch.distributed.collective.seq";
pub(crate) const COLLECTIVE_ELAPSED: &str = "pytorch.distributed.collective.elapsed";
/// Every thread's Python stack (OpenTelemetry's `code.stacktrace`), once per state.
pub(crate) const STACKTRACE: &str = A::CodeStacktrace.key();

/// A collective a rank has issued and not seen complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub op: String,
    pub seq: u64,
    pub since: SystemTime,
}

/// The newest live state a process sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveReport {
    /// When the record was made (its timestamp).
    pub at: SystemTime,
    pub step: Option<u64>,
    pub phase: Option<String>,
    /// When that phase began.
    pub phase_since: Option<SystemTime>,
    pub collective: Option<InFlight>,
    /// Every thread's stack, from this record or an earlier one of the same state.
    pub stack: Option<String>,
}

impl LiveReport {
    /// Two reports say the same state: the same step, phase (begun at the same time, within a
    /// second: each record computes it from its own clock reading) and collective. A stack sent
    /// once for a state stays with the later reports of it.
    pub(crate) fn same_state(&self, other: &LiveReport) -> bool {
        let phase_began_together = match (self.phase_since, other.phase_since) {
            (Some(a), Some(b)) => {
                let gap = a.duration_since(b).or_else(|_| b.duration_since(a));
                gap.is_ok_and(|gap| gap <= Duration::from_secs(1))
            }
            (None, None) => true,
            _ => false,
        };
        self.step == other.step
            && self.phase == other.phase
            && phase_began_together
            && self.collective.as_ref().map(|c| c.seq) == other.collective.as_ref().map(|c| c.seq)
    }
}

/// What gpulse keeps of a rank whose process NVML stopped listing, for as long as its job may
/// still be waiting for it.
#[derive(Debug, Clone, PartialEq)]
pub struct DepartedRank {
    pub pid: u32,
    pub identity: DistributedIdentity,
    /// The first window it was missing from.
    pub left_at: SystemTime,
    pub last_live: Option<LiveReport>,
}

/// How long a departed rank is kept: a job stuck for longer than this with it has long since
/// been reported.
pub(crate) const DEPARTED_KEPT: Duration = Duration::from_secs(3600);
/// At most this many departed ranks are kept (the oldest go first).
pub(crate) const DEPARTED_MAX: usize = 256;
