//! The compiled models of what a profiling-capable (Hopper and newer) datacenter GPU adds to the
//! basic device: GPM activity signals, MIG instances, NVLink links and their counters, and the
//! clock-violation timers. Like [`crate::model`], everything is precomputed at load time so a call
//! is arithmetic on simulated time.
//!
//! Cumulative counters (NVLink bytes, violation time) are integrals of their rate signals, so a
//! counter always agrees with its rate and never runs backwards for a non-negative rate; GPM
//! values are means of their signals over the interval between two samples, as the driver
//! derives them from two snapshots of hardware counters.

use crate::abi;
use crate::signal::Signal;

/// The GPM activity signals of a GPU or a MIG instance, as ratios 0–1.
#[derive(Debug, Clone)]
pub struct GpmSignals {
    pub sm_activity: Signal,
    pub sm_occupancy: Signal,
    pub tensor_activity: Signal,
    pub tensor_hmma: Signal,
    pub tensor_imma: Signal,
    pub tensor_dfma: Signal,
    pub dram_activity: Signal,
    pub fp16_activity: Signal,
    pub fp32_activity: Signal,
    pub fp64_activity: Signal,
    pub integer_activity: Signal,
    pub graphics_activity: Signal,
}

impl GpmSignals {
    /// All zero: a GPU with GPM but nothing running.
    pub fn idle() -> Self {
        let z = || Signal::constant(0.0);
        GpmSignals {
            sm_activity: z(),
            sm_occupancy: z(),
            tensor_activity: z(),
            tensor_hmma: z(),
            tensor_imma: z(),
            tensor_dfma: z(),
            dram_activity: z(),
            fp16_activity: z(),
            fp32_activity: z(),
            fp64_activity: z(),
            integer_activity: z(),
            graphics_activity: z(),
        }
    }

    /// The activity signal behind a percentage GPM metric, if this model has one.
    pub fn for_metric(&self, id: u32) -> Option<&Signal> {
        Some(match id {
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => &self.graphics_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => &self.sm_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => &self.sm_occupancy,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL => &self.integer_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => &self.tensor_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL => &self.tensor_dfma,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL => &self.tensor_hmma,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL => &self.tensor_imma,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => &self.dram_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL => &self.fp64_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL => &self.fp32_activity,
            abi::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL => &self.fp16_activity,
            _ => return None,
        })
    }
}

/// The mean of a signal over `[t1, t2]` (its value at `t1` when the interval is empty, as with
/// a frozen clock). Uses the noise-free integral, like energy does.
pub fn mean_over(s: &Signal, t1: f64, t2: f64) -> f64 {
    let (a, b) = if t1 <= t2 { (t1, t2) } else { (t2, t1) };
    if b - a < 1e-9 {
        return s.value(a);
    }
    (s.integral(b) - s.integral(a)) / (b - a)
}

/// A GPU's NVLink links: every active link carries the same traffic and error counts.
#[derive(Debug, Clone)]
pub struct NvLink {
    /// Number of links (`nvmlDeviceGetNvLinkState` answers for `0..links`).
    pub links: u32,
    /// Bit `i` set: link `i` is inactive (no traffic, no errors).
    pub down: u64,
    /// Per active link, KiB/s; the `THROUGHPUT_DATA` counters are their integrals.
    pub tx_kibps: Signal,
    pub rx_kibps: Signal,
    /// Per active link, cumulative error counts.
    pub crc_flit: Signal,
    pub crc_data: Signal,
    pub replay: Signal,
    pub recovery: Signal,
}

impl NvLink {
    #[inline]
    pub fn is_up(&self, link: u32) -> bool {
        link < self.links && self.down & (1u64 << link.min(63)) == 0
    }

    /// Number of active links.
    pub fn active(&self) -> u32 {
        (0..self.links).filter(|l| self.is_up(*l)).count() as u32
    }
}

/// One MIG device (a compute instance inside a GPU instance) of a GPU with MIG mode on.
#[derive(Debug)]
pub struct MigInstance {
    /// Index of the parent GPU.
    pub parent: u32,
    /// Position in the parent's list (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
    /// `"<parent name> MIG <profile>"`, as the driver names MIG devices.
    pub name: String,
    pub memory_total: u64,
    /// `None`: the sum of the parent's active processes in this instance.
    pub memory_used_mib: Option<Signal>,
    pub gpm: GpmSignals,
}

/// The clock-violation policies NVML keeps timers for (`nvmlPerfPolicyType_t`), in the order of
/// [`Violations::by_policy`].
pub const VIOLATION_POLICIES: [u32; 8] = [
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_POWER,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_THERMAL,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_SYNC_BOOST,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_BOARD_LIMIT,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_LOW_UTILIZATION,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_RELIABILITY,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
];

/// Per policy, the share of time (0–1) the policy held clocks down; the violation time NVML
/// reports is its integral, in nanoseconds.
#[derive(Debug, Clone)]
pub struct Violations {
    pub by_policy: [Signal; 8],
}

impl Violations {
    pub fn none() -> Self {
        Violations {
            by_policy: std::array::from_fn(|_| Signal::constant(0.0)),
        }
    }

    /// Cumulative violation time in ns at `t` for a policy, `None` for an unknown policy.
    pub fn time_ns(&self, policy: u32, t: f64) -> Option<u64> {
        let i = VIOLATION_POLICIES.iter().position(|p| *p == policy)?;
        Some((self.by_policy[i].integral(t.max(0.0)) * 1e9).max(0.0) as u64)
    }
}

/// The hardware features a device has beyond the basics.
#[derive(Debug)]
pub struct Hardware {
    /// `nvmlGpmQueryDeviceSupport` (Hopper and newer by default).
    pub gpm_supported: bool,
    pub gpm: GpmSignals,
    pub nvlink: Option<NvLink>,
    pub violations: Violations,
    /// Cumulative PCIe replays.
    pub pcie_replays: Signal,
    /// Empty unless MIG mode is on.
    pub mig: Box<[MigInstance]>,
    /// What `nvmlDeviceGetMaxMigDeviceCount` says (0 for a GPU without MIG support).
    pub max_mig_devices: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::Shape;

    #[test]
    fn means_over_an_interval_follow_the_shape() {
        let steps = Signal::new(
            Shape::steps(vec![(0.0, 0.2), (10.0, 0.8)]),
            None,
            None,
            None,
        );
        assert!((mean_over(&steps, 0.0, 10.0) - 0.2).abs() < 1e-9);
        assert!((mean_over(&steps, 5.0, 15.0) - 0.5).abs() < 1e-9);
        assert!(
            (mean_over(&steps, 15.0, 5.0) - 0.5).abs() < 1e-9,
            "order does not matter"
        );
        assert!(
            (mean_over(&steps, 12.0, 12.0) - 0.8).abs() < 1e-9,
            "empty interval"
        );
    }

    #[test]
    fn violation_time_integrates_the_share_and_rejects_unknown_policies() {
        let mut v = Violations::none();
        v.by_policy[1] = Signal::constant(0.25);
        let thermal = abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_THERMAL;
        assert_eq!(v.time_ns(thermal, 8.0), Some(2_000_000_000));
        assert_eq!(
            v.time_ns(abi::nvmlPerfPolicyType_enum_NVML_PERF_POLICY_POWER, 8.0),
            Some(0)
        );
        assert_eq!(v.time_ns(7, 8.0), None);
    }
}
