//! The `[diagnosis]` table of the config file: one sub-table per rule with its thresholds, the
//! history limits and the tracker's hysteresis. Every default is documented here and in
//! `docs/rules.md`; `validate` rejects values that make a rule meaningless.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod distributed;

pub use distributed::{
    CollectiveBound, CollectiveStall, CollectivesUnseen, DistributedHang, RankStraggler,
};

/// Thresholds of every rule, the history bounds and the tracker's hysteresis.
///
/// ```toml
/// [diagnosis]
/// clear_after_windows = 2
/// [diagnosis.memory_growth]
/// min_duration = "15m"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Master switch: `false` turns every rule off.
    pub enabled: bool,
    /// A finding clears after this many consecutive windows without it (≥ 1). Two keeps a
    /// value hovering at a threshold from starting and clearing a finding every window.
    pub clear_after_windows: u32,
    pub history: HistoryLimits,
    pub input_bound: InputBound,
    pub memory_pressure: MemoryPressure,
    pub memory_growth: MemoryGrowth,
    pub idle_holder: IdleHolder,
    pub throttling: Throttling,
    pub hardware_errors: HardwareErrors,
    pub uneven_multi_gpu: UnevenMultiGpu,
    pub memory_fragmentation: MemoryFragmentation,
    pub tensor_cores_idle: TensorCoresIdle,
    pub low_sm_efficiency: LowSmEfficiency,
    pub interconnect_bound: InterconnectBound,
    pub rank_straggler: RankStraggler,
    pub collective_bound: CollectiveBound,
    pub collective_stall: CollectiveStall,
    pub distributed_hang: DistributedHang,
    pub collectives_unseen: CollectivesUnseen,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            enabled: true,
            clear_after_windows: 2,
            history: HistoryLimits::default(),
            input_bound: InputBound::default(),
            memory_pressure: MemoryPressure::default(),
            memory_growth: MemoryGrowth::default(),
            idle_holder: IdleHolder::default(),
            throttling: Throttling::default(),
            hardware_errors: HardwareErrors::default(),
            uneven_multi_gpu: UnevenMultiGpu::default(),
            memory_fragmentation: MemoryFragmentation::default(),
            tensor_cores_idle: TensorCoresIdle::default(),
            low_sm_efficiency: LowSmEfficiency::default(),
            interconnect_bound: InterconnectBound::default(),
            rank_straggler: RankStraggler::default(),
            collective_bound: CollectiveBound::default(),
            collective_stall: CollectiveStall::default(),
            distributed_hang: DistributedHang::default(),
            collectives_unseen: CollectivesUnseen::default(),
        }
    }
}

/// Bounds of the per-(process, device) history the trend rules read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryLimits {
    /// Window summaries kept per (pid, device). Default 720: 2 h at the default 10 s export
    /// interval, 12 min at 1 s. Must cover `memory_growth.min_duration` at the export interval
    /// in use, or that rule can never fire.
    pub max_windows: usize,
    /// Summaries older than this (by window end) are dropped. Default 1 h.
    #[serde(with = "duration_serde")]
    pub max_age: Duration,
    /// (pid, device) series kept at most; beyond it the most recently started go first, so a burst
    /// of short-lived processes cannot evict a long training job's history. Default 256.
    pub max_series: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self {
            max_windows: 720,
            max_age: Duration::from_secs(3600),
            max_series: 256,
        }
    }
}

/// `input_bound`: the GPU waits for data the CPU side cannot produce fast enough.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InputBound {
    pub enabled: bool,
    /// GPU utilisation below this ratio (window mean) counts as starved. Default 0.20. The
    /// process's own SM utilisation is used when NVML gives it, else its device's utilisation.
    pub gpu_utilization_below: f64,
    /// CPU of the process and its descendants (DataLoader workers), in cores, at or above
    /// which the host side counts as busy. Default 0.8: one Python thread spinning.
    pub tree_cpu_cores_at_least: f64,
    /// Processes holding less GPU memory than this are not training jobs (a monitoring tool, a
    /// CUDA context probe) and are skipped. Default 256 MiB.
    pub min_gpu_memory_bytes: u64,
    /// With the framework's `step` spans: the share of step time spent in `data_wait` at or
    /// above which the process is input-bound, whether its CPU is busy or idle. Default 0.3.
    pub data_wait_ratio_at_least: f64,
    /// With step spans, GPU utilisation below this counts as low. Default 0.5: waiting 30 % of
    /// each step already leaves the GPU idle a third of the time.
    pub spans_gpu_utilization_below: f64,
    /// Step spans that ended within this before the newest one make the ratio; a process whose
    /// newest step is older than this has no span evidence. Default 1 min.
    #[serde(with = "duration_serde")]
    pub step_lookback: Duration,
    /// At least this many step spans in the lookback. Default 5.
    pub min_steps: usize,
}

impl Default for InputBound {
    fn default() -> Self {
        Self {
            enabled: true,
            gpu_utilization_below: 0.20,
            tree_cpu_cores_at_least: 0.8,
            min_gpu_memory_bytes: 256 * MIB,
            data_wait_ratio_at_least: 0.3,
            spans_gpu_utilization_below: 0.5,
            step_lookback: Duration::from_secs(60),
            min_steps: 5,
        }
    }
}

/// `memory_fragmentation`: the caching allocator holds much more than the live tensors need
/// while the device runs short, so a large allocation can fail although enough is free in
/// total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryFragmentation {
    pub enabled: bool,
    /// Reserved minus allocated at or above this share of reserved. Default 0.25.
    pub unused_reserved_ratio_at_least: f64,
    /// And at or above this many bytes. Default 2 GiB.
    pub unused_reserved_bytes_at_least: u64,
    /// The device counts as under memory pressure when used (+ driver-reserved) is at least
    /// this share of its total. Default 0.85.
    pub device_used_at_least: f64,
    /// The gap must hold in every allocator reading over at least this long. Default 2 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for MemoryFragmentation {
    fn default() -> Self {
        Self {
            enabled: true,
            unused_reserved_ratio_at_least: 0.25,
            unused_reserved_bytes_at_least: 2 * GIB,
            device_used_at_least: 0.85,
            min_duration: Duration::from_secs(120),
        }
    }
}

/// `memory_pressure`: the next allocation is likely to fail with out-of-memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryPressure {
    pub enabled: bool,
    /// Device memory not free (used + driver-reserved) above this ratio of total: warning.
    /// Default 0.95.
    pub device_used_above: f64,
    /// The same, error. Default 0.99.
    pub device_used_error_above: f64,
    /// A process whose GPU memory is at least this ratio of what it could have (device free +
    /// what it holds): warning. Default 0.90.
    pub process_share_at_least: f64,
    /// Processes holding less than this are not reported. Default 1 GiB.
    pub min_process_bytes: u64,
}

impl Default for MemoryPressure {
    fn default() -> Self {
        Self {
            enabled: true,
            device_used_above: 0.95,
            device_used_error_above: 0.99,
            process_share_at_least: 0.90,
            min_process_bytes: GIB,
        }
    }
}

/// `memory_growth`: a process's GPU memory rises steadily (a leak, an unbounded cache).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryGrowth {
    pub enabled: bool,
    /// The history must span at least this long before a slope is believed. Default 10 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
    /// At least this many window summaries in the history. Default 6.
    pub min_windows: usize,
    /// Theil–Sen slope at or above this rate. Default 128 KiB/s (≈ 450 MiB/h).
    pub min_rate_bytes_per_second: f64,
    /// Warning becomes error when the device would be full within this. Default 1 h.
    #[serde(with = "duration_serde")]
    pub urgent_time_to_full: Duration,
}

impl Default for MemoryGrowth {
    fn default() -> Self {
        Self {
            enabled: true,
            min_duration: Duration::from_secs(600),
            min_windows: 6,
            min_rate_bytes_per_second: 128.0 * 1024.0,
            urgent_time_to_full: Duration::from_secs(3600),
        }
    }
}

/// `idle_holder`: a process keeps GPU memory but does no work, or outlived its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdleHolder {
    pub enabled: bool,
    /// Holding more than this counts. Default 256 MiB (a bare CUDA context is ~300–500 MiB on
    /// recent GPUs, so this catches any process that initialised CUDA and allocated).
    pub min_gpu_memory_bytes: u64,
    /// SM utilisation (or device utilisation when per-process is unknown) at or below this
    /// ratio counts as idle. Default 0.01.
    pub utilization_at_most: f64,
    /// Idle for at least this long. Default 5 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
    /// Report a GPU process whose parent is gone (re-parented to init) at once. Default true.
    pub orphans: bool,
}

impl Default for IdleHolder {
    fn default() -> Self {
        Self {
            enabled: true,
            min_gpu_memory_bytes: 256 * MIB,
            utilization_at_most: 0.01,
            min_duration: Duration::from_secs(300),
            orphans: true,
        }
    }
}

/// `throttling`: clocks held down by temperature, power or a hardware signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Throttling {
    pub enabled: bool,
    /// A reason active in more than this ratio of the window's samples is reported. Default 0.5.
    pub active_ratio_above: f64,
    /// Also report the software power cap (info): being at the power limit under full load is
    /// normal, so this is off by default.
    pub report_sw_power_cap: bool,
}

impl Default for Throttling {
    fn default() -> Self {
        Self {
            enabled: true,
            active_ratio_above: 0.5,
            report_sw_power_cap: false,
        }
    }
}

/// `hardware_errors`: XID events, new uncorrectable ECC errors, a device that stopped answering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HardwareErrors {
    pub enabled: bool,
    /// XIDs not reported at all (e.g. `[45]`, the teardown after a killed process).
    pub ignore_xids: Vec<u64>,
}

impl Default for HardwareErrors {
    fn default() -> Self {
        Self {
            enabled: true,
            ignore_xids: Vec::new(),
        }
    }
}

/// `uneven_multi_gpu`: one job's GPUs are not equally busy (a straggler, bad sharding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnevenMultiGpu {
    pub enabled: bool,
    /// Busiest minus least busy mean utilisation above this (ratio points). Default 0.40.
    pub spread_above: f64,
    /// Or least busy below this fraction of the busiest. Default 0.25.
    pub least_to_busiest_below: f64,
    /// The busiest GPU must be at least this busy, so a job idle everywhere is not "uneven".
    /// Default 0.30.
    pub busiest_at_least: f64,
}

impl Default for UnevenMultiGpu {
    fn default() -> Self {
        Self {
            enabled: true,
            spread_above: 0.40,
            least_to_busiest_below: 0.25,
            busiest_at_least: 0.30,
        }
    }
}

/// `tensor_cores_idle`: the SMs are busy but the tensor cores are not (GPM, Hopper and newer):
/// a training loop in FP32 that autocast or TF32 would speed up severalfold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TensorCoresIdle {
    pub enabled: bool,
    /// GPM SM activity at or above this ratio counts as busy. Default 0.5.
    pub sm_activity_at_least: f64,
    /// GPM tensor activity (any tensor pipe) below this ratio counts as idle. Default 0.05.
    pub tensor_activity_below: f64,
    /// Both hold for at least this long. Default 5 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for TensorCoresIdle {
    fn default() -> Self {
        Self {
            enabled: true,
            sm_activity_at_least: 0.5,
            tensor_activity_below: 0.05,
            min_duration: Duration::from_secs(300),
        }
    }
}

/// `low_sm_efficiency`: GPU-Util says busy, GPM SM activity says few SMs work (tiny kernels,
/// launch-bound loops, small batches).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LowSmEfficiency {
    pub enabled: bool,
    /// Device utilisation (`GPU-Util`) at or above this ratio. Default 0.9.
    pub gpu_utilization_at_least: f64,
    /// While GPM SM activity is below this ratio. Default 0.3.
    pub sm_activity_below: f64,
    /// Both hold for at least this long. Default 5 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for LowSmEfficiency {
    fn default() -> Self {
        Self {
            enabled: true,
            gpu_utilization_at_least: 0.9,
            sm_activity_below: 0.3,
            min_duration: Duration::from_secs(300),
        }
    }
}

/// `interconnect_bound`: a job on several GPUs whose NVLink (or PCIe, without NVLink) traffic
/// stays near the highest it has reached while the SMs mostly wait (GPM): communication, not
/// compute, sets its pace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InterconnectBound {
    pub enabled: bool,
    /// Traffic at or above this share of the peak window mean the job's history holds on that
    /// GPU counts as near the peak. Default 0.8.
    pub near_peak_ratio: f64,
    /// Traffic (both directions, all links) below this many bytes per second is never "bound",
    /// whatever its peak. Default 1 GiB/s.
    pub min_bytes_per_second: f64,
    /// While GPM SM activity is below this ratio. Default 0.3.
    pub sm_activity_below: f64,
    /// On every GPU of the job for at least this long. Default 5 min.
    #[serde(with = "duration_serde")]
    pub min_duration: Duration,
}

impl Default for InterconnectBound {
    fn default() -> Self {
        Self {
            enabled: true,
            near_peak_ratio: 0.8,
            min_bytes_per_second: GIB as f64,
            sm_activity_below: 0.3,
            min_duration: Duration::from_secs(300),
        }
    }
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// A `[diagnosis]` value that makes a rule meaningless.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ThresholdsError {
    /// A ratio outside 0–1.
    #[error(
        "[diagnosis] {key} = {value} is not a ratio: use a value between 0 and 1 (0.2 means 20%)"
    )]
    NotARatio { key: &'static str, value: f64 },
    /// A value that must be positive is zero or negative.
    #[error("[diagnosis] {key} must be greater than zero, got {value}")]
    NotPositive { key: &'static str, value: String },
    /// Two thresholds in the wrong order.
    #[error("[diagnosis] {low_key} ({low}) must not exceed {high_key} ({high})")]
    Order {
        low_key: &'static str,
        low: f64,
        high_key: &'static str,
        high: f64,
    },
}

impl Thresholds {
    /// Checks every value; the first problem found is returned.
    ///
    /// # Errors
    /// `ThresholdsError` naming the key, the value and the accepted range.
    pub fn validate(&self) -> Result<(), ThresholdsError> {
        let ratios = [
            (
                "input_bound.data_wait_ratio_at_least",
                self.input_bound.data_wait_ratio_at_least,
            ),
            (
                "input_bound.spans_gpu_utilization_below",
                self.input_bound.spans_gpu_utilization_below,
            ),
            (
                "memory_fragmentation.unused_reserved_ratio_at_least",
                self.memory_fragmentation.unused_reserved_ratio_at_least,
            ),
            (
                "memory_fragmentation.device_used_at_least",
                self.memory_fragmentation.device_used_at_least,
            ),
            (
                "input_bound.gpu_utilization_below",
                self.input_bound.gpu_utilization_below,
            ),
            (
                "memory_pressure.device_used_above",
                self.memory_pressure.device_used_above,
            ),
            (
                "memory_pressure.device_used_error_above",
                self.memory_pressure.device_used_error_above,
            ),
            (
                "memory_pressure.process_share_at_least",
                self.memory_pressure.process_share_at_least,
            ),
            (
                "idle_holder.utilization_at_most",
                self.idle_holder.utilization_at_most,
            ),
            (
                "throttling.active_ratio_above",
                self.throttling.active_ratio_above,
            ),
            (
                "uneven_multi_gpu.spread_above",
                self.uneven_multi_gpu.spread_above,
            ),
            (
                "uneven_multi_gpu.least_to_busiest_below",
                self.uneven_multi_gpu.least_to_busiest_below,
            ),
            (
                "uneven_multi_gpu.busiest_at_least",
                self.uneven_multi_gpu.busiest_at_least,
            ),
            (
                "tensor_cores_idle.sm_activity_at_least",
                self.tensor_cores_idle.sm_activity_at_least,
            ),
            (
                "tensor_cores_idle.tensor_activity_below",
                self.tensor_cores_idle.tensor_activity_below,
            ),
            (
                "low_sm_efficiency.gpu_utilization_at_least",
                self.low_sm_efficiency.gpu_utilization_at_least,
            ),
            (
                "low_sm_efficiency.sm_activity_below",
                self.low_sm_efficiency.sm_activity_below,
            ),
            (
                "interconnect_bound.near_peak_ratio",
                self.interconnect_bound.near_peak_ratio,
            ),
            (
                "interconnect_bound.sm_activity_below",
                self.interconnect_bound.sm_activity_below,
            ),
        ];
        for (key, value) in ratios {
            if !(0.0..=1.0).contains(&value) {
                return Err(ThresholdsError::NotARatio { key, value });
            }
        }
        let mp = &self.memory_pressure;
        if mp.device_used_above > mp.device_used_error_above {
            return Err(ThresholdsError::Order {
                low_key: "memory_pressure.device_used_above",
                low: mp.device_used_above,
                high_key: "memory_pressure.device_used_error_above",
                high: mp.device_used_error_above,
            });
        }
        let positive: [(&'static str, bool, String); 9] = [
            (
                "input_bound.step_lookback",
                !self.input_bound.step_lookback.is_zero(),
                format!("{:?}", self.input_bound.step_lookback),
            ),
            (
                "clear_after_windows",
                self.clear_after_windows > 0,
                self.clear_after_windows.to_string(),
            ),
            (
                "history.max_windows",
                self.history.max_windows > 0,
                self.history.max_windows.to_string(),
            ),
            (
                "history.max_series",
                self.history.max_series > 0,
                self.history.max_series.to_string(),
            ),
            (
                "history.max_age",
                !self.history.max_age.is_zero(),
                format!("{:?}", self.history.max_age),
            ),
            (
                "input_bound.tree_cpu_cores_at_least",
                self.input_bound.tree_cpu_cores_at_least > 0.0,
                self.input_bound.tree_cpu_cores_at_least.to_string(),
            ),
            (
                "memory_growth.min_rate_bytes_per_second",
                self.memory_growth.min_rate_bytes_per_second > 0.0,
                self.memory_growth.min_rate_bytes_per_second.to_string(),
            ),
            (
                "interconnect_bound.min_bytes_per_second",
                self.interconnect_bound.min_bytes_per_second > 0.0,
                self.interconnect_bound.min_bytes_per_second.to_string(),
            ),
            (
                "memory_growth.min_windows",
                self.memory_growth.min_windows >= 3,
                format!(
                    "{} (at least 3 are needed for a trend)",
                    self.memory_growth.min_windows
                ),
            ),
        ];
        for (key, ok, value) in positive {
            if !ok {
                return Err(ThresholdsError::NotPositive { key, value });
            }
        }
        self.rank_straggler.validate()?;
        self.collective_bound.validate()?;
        self.collective_stall.validate()?;
        self.distributed_hang.validate()?;
        self.collectives_unseen.validate()?;
        Ok(())
    }
}

/// Durations in the config file as humantime strings (`"10m"`, `"1h 30m"`) or integer seconds.
pub(crate) mod duration_serde {
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"10m\", \"90s\" or \"1h 30m\", or integer seconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                humantime::parse_duration(v)
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_secs)
                    .map_err(|_| E::custom(format!("duration {v} is negative")))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(Thresholds::default().validate(), Ok(()));
    }

    #[test]
    fn toml_partial_table_keeps_other_defaults() {
        let t: Thresholds = toml::from_str(
            "clear_after_windows = 3\n[memory_growth]\nmin_duration = \"15m\"\n[idle_holder]\nmin_duration = 120\n",
        )
        .expect("valid table");
        assert_eq!(t.clear_after_windows, 3);
        assert_eq!(t.memory_growth.min_duration, Duration::from_secs(900));
        assert_eq!(t.idle_holder.min_duration, Duration::from_secs(120));
        assert_eq!(t.input_bound, InputBound::default());
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = toml::from_str::<Thresholds>("[input_bound]\ngpu_util_below = 0.3\n")
            .expect_err("unknown key must fail");
        assert!(err.to_string().contains("gpu_util_below"), "{err}");
    }

    #[test]
    fn bad_duration_says_what_is_expected() {
        let err = toml::from_str::<Thresholds>("[memory_growth]\nmin_duration = \"ten\"\n")
            .expect_err("bad duration must fail");
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }

    #[test]
    fn validate_rejects_percent_written_as_number() {
        let mut t = Thresholds::default();
        t.input_bound.gpu_utilization_below = 20.0;
        let err = t.validate().expect_err("20 is not a ratio");
        assert!(err
            .to_string()
            .contains("input_bound.gpu_utilization_below"));
        let mut t = Thresholds::default();
        t.memory_pressure.device_used_above = 0.995;
        assert!(matches!(t.validate(), Err(ThresholdsError::Order { .. })));
        let t = Thresholds {
            clear_after_windows: 0,
            ..Thresholds::default()
        };
        assert!(matches!(
            t.validate(),
            Err(ThresholdsError::NotPositive {
                key: "clear_after_windows",
                ..
            })
        ));
    }
}
