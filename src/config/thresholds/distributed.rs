//! The thresholds of the rules that compare the ranks of one distributed job:
//! `[diagnosis.rank_straggler]`, `[diagnosis.collective_bound]`, `[diagnosis.collective_stall]`
//! and `[diagnosis.distributed_hang]` (the rules themselves are `rules::rank_straggler`,
//! `rules::collective_bound`, `rules::collective_stall` and `rules::distributed_hang`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration_serde, ThresholdsError};

/// `[diagnosis.rank_straggler]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RankStraggler {
    pub enabled: bool,
    /// The straggler's mean step time outside collectives exceeds the median of the others' by
    /// at least this share of it. Default 0.2.
    pub excess_ratio_at_least: f64,
    /// ... and by at least this many seconds (so microsecond steps do not count). Default 0.01.
    pub excess_seconds_at_least: f64,
    /// The other ranks spend at least this share of their steps in collectives (they wait for
    /// it). Default 0.1.
    pub others_wait_ratio_at_least: f64,
    /// `data_wait` when the straggler's extra data wait is at least this share of its excess.
    /// Default 0.5.
    pub data_wait_share_of_excess: f64,
    /// `gpu_clocks` when its GPU's mean SM clock is below this share of the others' median.
    /// Default 0.9.
    pub sm_clock_ratio_below: f64,
    /// `host_cpu` when its process tree uses at least this share of its cgroup's CPU quota.
    /// Default 0.9.
    pub cpu_quota_used_at_least: f64,
    /// Step spans each compared rank must have sent in the lookback. Default 10.
    pub min_steps: usize,
    /// Every compared rank has sent steps for at least this long. Default 1 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for RankStraggler {
    fn default() -> Self {
        Self {
            enabled: true,
            excess_ratio_at_least: 0.2,
            excess_seconds_at_least: 0.01,
            others_wait_ratio_at_least: 0.1,
            data_wait_share_of_excess: 0.5,
            sm_clock_ratio_below: 0.9,
            cpu_quota_used_at_least: 0.9,
            min_steps: 10,
            min_duration: Duration::from_secs(60),
        }
    }
}

impl RankStraggler {
    pub(crate) fn validate(&self) -> Result<(), ThresholdsError> {
        for (key, value) in [
            (
                "rank_straggler.others_wait_ratio_at_least",
                self.others_wait_ratio_at_least,
            ),
            (
                "rank_straggler.data_wait_share_of_excess",
                self.data_wait_share_of_excess,
            ),
            (
                "rank_straggler.sm_clock_ratio_below",
                self.sm_clock_ratio_below,
            ),
            (
                "rank_straggler.cpu_quota_used_at_least",
                self.cpu_quota_used_at_least,
            ),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ThresholdsError::NotARatio { key, value });
            }
        }
        for (key, ok, value) in [
            (
                "rank_straggler.excess_ratio_at_least",
                self.excess_ratio_at_least > 0.0,
                self.excess_ratio_at_least.to_string(),
            ),
            (
                "rank_straggler.min_steps",
                self.min_steps > 0,
                self.min_steps.to_string(),
            ),
        ] {
            if !ok {
                return Err(ThresholdsError::NotPositive { key, value });
            }
        }
        Ok(())
    }
}

/// `[diagnosis.collective_bound]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectiveBound {
    pub enabled: bool,
    /// Every rank spends at least this share of its steps with a collective in flight.
    /// Default 0.3.
    pub wait_ratio_at_least: f64,
    /// Step spans each rank must have sent in the lookback. Default 10.
    pub min_steps: usize,
    /// Every rank has sent steps for at least this long. Default 1 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for CollectiveBound {
    fn default() -> Self {
        Self {
            enabled: true,
            wait_ratio_at_least: 0.3,
            min_steps: 10,
            min_duration: Duration::from_secs(60),
        }
    }
}

impl CollectiveBound {
    pub(crate) fn validate(&self) -> Result<(), ThresholdsError> {
        if !(0.0..=1.0).contains(&self.wait_ratio_at_least) {
            return Err(ThresholdsError::NotARatio {
                key: "collective_bound.wait_ratio_at_least",
                value: self.wait_ratio_at_least,
            });
        }
        if self.min_steps == 0 {
            return Err(ThresholdsError::NotPositive {
                key: "collective_bound.min_steps",
                value: "0".into(),
            });
        }
        Ok(())
    }
}

/// `[diagnosis.collective_stall]`: a job whose every GPU shows the signature of ranks waiting
/// in a collective that never completes, read from the devices alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectiveStall {
    pub enabled: bool,
    /// Every GPU of the job has shown the signature for at least this long. Default 1 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
    /// NCCL's spin: device utilisation at least this ratio... Default 0.9.
    pub spin_utilization_at_least: f64,
    /// ... with GPM SM activity at most this ratio (the kernel that waits does no work)...
    /// Default 0.05.
    pub spin_sm_activity_at_most: f64,
    /// ... and power at most this share of the enforced limit (near idle). Default 0.3.
    pub spin_power_ratio_at_most: f64,
    /// gloo's wait: device utilisation at most this ratio... Default 0.01.
    pub idle_utilization_at_most: f64,
    /// ... while each process holds more than this much GPU memory. Default 256 MiB.
    pub min_gpu_memory_bytes: u64,
}

impl Default for CollectiveStall {
    fn default() -> Self {
        Self {
            enabled: true,
            min_duration: Duration::from_secs(60),
            spin_utilization_at_least: 0.9,
            spin_sm_activity_at_most: 0.05,
            spin_power_ratio_at_most: 0.3,
            idle_utilization_at_most: 0.01,
            min_gpu_memory_bytes: 256 * 1024 * 1024,
        }
    }
}

impl CollectiveStall {
    pub(crate) fn validate(&self) -> Result<(), ThresholdsError> {
        for (key, value) in [
            (
                "collective_stall.spin_utilization_at_least",
                self.spin_utilization_at_least,
            ),
            (
                "collective_stall.spin_sm_activity_at_most",
                self.spin_sm_activity_at_most,
            ),
            (
                "collective_stall.spin_power_ratio_at_most",
                self.spin_power_ratio_at_most,
            ),
            (
                "collective_stall.idle_utilization_at_most",
                self.idle_utilization_at_most,
            ),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ThresholdsError::NotARatio { key, value });
            }
        }
        if self.min_duration.is_zero() {
            return Err(ThresholdsError::NotPositive {
                key: "collective_stall.min_duration",
                value: "0s".into(),
            });
        }
        Ok(())
    }
}

/// `[diagnosis.distributed_hang]`: a job none of whose ranks on this node has finished a step for
/// longer than a bound, named on the rank that holds the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedHang {
    pub enabled: bool,
    /// The bound is the larger of this... Default 1 min.
    #[serde(with = "duration_serde")]
    pub min_stall: Duration,
    /// ... and this many times the job's median step. Default 5.
    pub median_steps: f64,
    /// A rank's live state older than this is no longer where it is: it stopped reporting
    /// (frozen, or its companion's reporter is off). Default 30 s.
    #[serde(with = "duration_serde")]
    pub live_fresh_for: Duration,
    /// Phases in which a rank may keep the others waiting for long (a checkpoint written on
    /// rank 0 while the others wait in a barrier): reported as `long_phase_wait` (info) until
    /// `checkpoint_max`, and only after it as a hang. Default `["checkpoint", "save"]`.
    pub checkpoint_phases: Vec<String>,
    /// Default 30 min.
    #[serde(with = "duration_serde")]
    pub checkpoint_max: Duration,
}

impl Default for DistributedHang {
    fn default() -> Self {
        Self {
            enabled: true,
            min_stall: Duration::from_secs(60),
            median_steps: 5.0,
            live_fresh_for: Duration::from_secs(30),
            checkpoint_phases: vec!["checkpoint".into(), "save".into()],
            checkpoint_max: Duration::from_secs(30 * 60),
        }
    }
}

impl DistributedHang {
    /// How long no rank may finish a step before the job counts as stuck.
    pub(crate) fn bound(&self, median_step_seconds: Option<f64>) -> Duration {
        let steps = median_step_seconds
            .map(|s| s * self.median_steps)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or_default();
        self.min_stall.max(steps)
    }

    pub(crate) fn validate(&self) -> Result<(), ThresholdsError> {
        for (key, value) in [
            ("distributed_hang.min_stall", self.min_stall),
            ("distributed_hang.live_fresh_for", self.live_fresh_for),
            ("distributed_hang.checkpoint_max", self.checkpoint_max),
        ] {
            if value.is_zero() {
                return Err(ThresholdsError::NotPositive {
                    key,
                    value: "0s".into(),
                });
            }
        }
        if !(self.median_steps.is_finite() && self.median_steps > 0.0) {
            return Err(ThresholdsError::NotPositive {
                key: "distributed_hang.median_steps",
                value: self.median_steps.to_string(),
            });
        }
        Ok(())
    }
}

/// `[diagnosis.collectives_unseen]`: a rank whose steps show no collective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollectivesUnseen {
    pub enabled: bool,
    /// Its newest steps in a row without a collective. Default 20 (longer than any gradient
    /// accumulation, whose steps between syncs carry none).
    pub min_steps: u64,
}

impl Default for CollectivesUnseen {
    fn default() -> Self {
        Self {
            enabled: true,
            min_steps: 20,
        }
    }
}

impl CollectivesUnseen {
    pub(crate) fn validate(&self) -> Result<(), ThresholdsError> {
        if self.min_steps == 0 {
            return Err(ThresholdsError::NotPositive {
                key: "collectives_unseen.min_steps",
                value: "0".into(),
            });
        }
        Ok(())
    }
}
