//! The recording: what one run of a command looked like on its GPUs, as time series per device
//! and per process, the findings as intervals, and the companion's spans. Built live by
//! [`super::recorder::Recorder`] from snapshots, or after the fact from OTLP/JSON lines by
//! [`super::otlp_json_reader`]; read by the summary and the HTML report, which never see NVML types.
//!
//! Times are seconds since the recording started. Series are bounded: past
//! [`MAX_POINTS`] points, neighbours are merged pairwise (means weighted by sample count,
//! memory by its maximum), so a day-long run costs the memory of a couple of hours while the
//! per-track peaks and totals stay exact.

use std::time::SystemTime;

use serde::Serialize;

use super::child::CommandExit;
use crate::attribution::{AttributedWindow, Cause};

/// Points a series keeps before halving its resolution: 1.8 h at 100 ms, 18 h at 1 s.
pub(crate) const MAX_POINTS: usize = 65_536;

/// Utilisation under which a GPU the command holds counts as idle.
pub(crate) const IDLE_BELOW: f64 = 0.05;

/// Throttle reason bits that are not a slowdown: the GPU idling (`GpuIdle`) and the clocks an
/// administrator set (`ApplicationsClocksSetting`).
pub(crate) const NOT_A_SLOWDOWN: u64 = 0x1 | 0x2;

/// A value that can be merged with its neighbour when a series halves its resolution.
pub(crate) trait Merge {
    fn merge(&mut self, later: &Self);
}

/// A time series that halves its resolution instead of growing past [`MAX_POINTS`].
#[derive(Debug, Clone)]
pub(crate) struct Series<T> {
    points: Vec<T>,
    /// Raw samples per stored point (1, 2, 4, ...).
    stride: u32,
    /// Samples folded into the point being built, when `stride` > 1.
    pending: Option<(T, u32)>,
    cap: usize,
}

impl<T: Merge + Clone> Default for Series<T> {
    fn default() -> Self {
        Self::with_cap(MAX_POINTS)
    }
}

impl<T: Merge + Clone> Series<T> {
    pub(crate) fn with_cap(cap: usize) -> Self {
        Self {
            points: Vec::new(),
            stride: 1,
            pending: None,
            cap: cap.max(2),
        }
    }

    pub(crate) fn push(&mut self, point: T) {
        let point = match self.pending.take() {
            None if self.stride == 1 => point,
            None => {
                self.pending = Some((point, 1));
                return;
            }
            Some((mut acc, n)) => {
                acc.merge(&point);
                if n + 1 < self.stride {
                    self.pending = Some((acc, n + 1));
                    return;
                }
                acc
            }
        };
        self.points.push(point);
        if self.points.len() >= self.cap {
            self.halve();
        }
    }

    fn halve(&mut self) {
        let merged: Vec<T> = self
            .points
            .chunks(2)
            .map(|pair| {
                let mut first = pair[0].clone();
                if let Some(second) = pair.get(1) {
                    first.merge(second);
                }
                first
            })
            .collect();
        self.points = merged;
        self.stride *= 2;
    }

    /// Every point, the one still being filled included.
    pub(crate) fn points(&self) -> Vec<T> {
        let mut all = self.points.clone();
        if let Some((pending, _)) = &self.pending {
            all.push(pending.clone());
        }
        all
    }
}

/// A mean of `Option`s merged by weight; `None` when neither side knew the value.
fn merge_mean(a: Option<f32>, wa: f64, b: Option<f32>, wb: f64) -> Option<f32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(((f64::from(a) * wa + f64::from(b) * wb) / (wa + wb)) as f32),
        (a, b) => a.or(b),
    }
}

/// One device at one point of the timeline (one sample, or the merge of several).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DevicePoint {
    /// Seconds since the recording started, of the first sample in the point.
    pub t: f64,
    /// Seconds the point covers.
    pub dt: f64,
    /// Samples merged into it.
    pub n: u32,
    /// Ratios 0–1: GPU utilisation (NVML's "a kernel was running"), and the GPM activities.
    pub utilization: Option<f32>,
    pub sm_activity: Option<f32>,
    pub tensor_activity: Option<f32>,
    pub dram_activity: Option<f32>,
    /// Bytes used; the maximum over the merged samples.
    pub memory_used: Option<f64>,
    pub power_watts: Option<f32>,
    pub sm_clock_mhz: Option<f32>,
    pub memory_clock_mhz: Option<f32>,
    /// Throttle reason bits seen in any merged sample (`None`: never known).
    pub throttle: Option<u64>,
    /// Seconds in which one of the command's processes held the GPU, and of those the seconds
    /// the GPU was idle.
    pub held_seconds: f64,
    pub idle_seconds: f64,
}

impl Merge for DevicePoint {
    fn merge(&mut self, later: &Self) {
        let (wa, wb) = (f64::from(self.n.max(1)), f64::from(later.n.max(1)));
        self.utilization = merge_mean(self.utilization, wa, later.utilization, wb);
        self.sm_activity = merge_mean(self.sm_activity, wa, later.sm_activity, wb);
        self.tensor_activity = merge_mean(self.tensor_activity, wa, later.tensor_activity, wb);
        self.dram_activity = merge_mean(self.dram_activity, wa, later.dram_activity, wb);
        self.power_watts = merge_mean(self.power_watts, wa, later.power_watts, wb);
        self.sm_clock_mhz = merge_mean(self.sm_clock_mhz, wa, later.sm_clock_mhz, wb);
        self.memory_clock_mhz = merge_mean(self.memory_clock_mhz, wa, later.memory_clock_mhz, wb);
        self.memory_used = match (self.memory_used, later.memory_used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.throttle = match (self.throttle, later.throttle) {
            (Some(a), Some(b)) => Some(a | b),
            (a, b) => a.or(b),
        };
        self.dt = (later.t + later.dt - self.t).max(self.dt);
        self.n += later.n;
        self.held_seconds += later.held_seconds;
        self.idle_seconds += later.idle_seconds;
    }
}

/// One process's GPU memory at one point of the timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MemoryPoint {
    pub t: f64,
    /// Bytes; the maximum over the merged samples.
    pub bytes: Option<f64>,
}

impl Merge for MemoryPoint {
    fn merge(&mut self, later: &Self) {
        self.bytes = match (self.bytes, later.bytes) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Exact figures of a device over the whole run, kept beside its (possibly merged) series.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DeviceTotals {
    pub utilization: Accumulator,
    pub sm_activity: Accumulator,
    pub tensor_activity: Accumulator,
    pub power_watts: Accumulator,
    pub memory_used_peak: Option<f64>,
    /// First and last reading of the driver's energy counter (J), positive steps summed.
    pub energy_counter_joules: Option<f64>,
    /// Power integrated over time (J): the energy when the GPU has no energy counter.
    pub power_integral_joules: Option<f64>,
    pub held_seconds: f64,
    pub idle_seconds: f64,
    /// Every throttle reason bit seen.
    pub throttle_seen: u64,
}

/// Mean and peak of a value, time-weighted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Accumulator {
    weighted_sum: f64,
    weight: f64,
    peak: Option<f64>,
}

impl Accumulator {
    pub(crate) fn add(&mut self, value: Option<f64>, weight: f64) {
        let Some(value) = value.filter(|v| v.is_finite()) else {
            return;
        };
        self.weighted_sum += value * weight;
        self.weight += weight;
        self.peak = Some(self.peak.map_or(value, |p| p.max(value)));
    }

    /// Raises the peak to `peak` (a maximum known from elsewhere, such as a window's `.max`).
    pub(crate) fn add_peak(&mut self, peak: f64) {
        if peak.is_finite() {
            self.peak = Some(self.peak.map_or(peak, |p| p.max(peak)));
        }
    }

    pub(crate) fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.weighted_sum / self.weight)
    }

    pub(crate) fn peak(&self) -> Option<f64> {
        self.peak
    }
}

/// One GPU over the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceTrack {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `00000000:18:00.0`, as `snapshot` shows it; `None` when the source did not say.
    pub pci_bus_id: Option<String>,
    pub memory_total_bytes: Option<f64>,
    pub series: Series<DevicePoint>,
    pub totals: DeviceTotals,
}

/// One process on one GPU over the run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessTrack {
    pub pid: u32,
    pub device_index: u32,
    pub device_uuid: String,
    /// The executable's name, when procfs showed it.
    pub name: Option<String>,
    /// Whether it is the recorded command or one of its descendants.
    pub in_command: bool,
    /// Who the process is (namespaced PID, container, pod), as attribution last saw it.
    pub workload: Option<crate::attribution::Workload>,
    pub series: Series<MemoryPoint>,
    pub memory_peak_bytes: Option<f64>,
    pub first_seen: f64,
    pub last_seen: f64,
}

/// A finding over the interval it was active.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FindingMark {
    pub rule: String,
    pub severity: String,
    /// What it is about, as a person reads it ("GPU 0 (GPU-…)", "pid 4242 (trainer) on GPU 1").
    pub subject: String,
    /// The GPU it concerns, when one.
    pub device_index: Option<u32>,
    pub summary: String,
    pub advice: String,
    pub evidence: Vec<String>,
    /// The figures the rule used, as `name = value` text.
    pub values: Vec<(String, String)>,
    /// Seconds since the start of the recording.
    pub start_seconds: f64,
    /// `None` while still active when the recording ended.
    pub end_seconds: Option<f64>,
}

/// What a companion span was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SpanKind {
    Epoch,
    Step,
    DataWait,
}

/// One span of the training framework (epoch, step or data wait).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SpanMark {
    pub kind: SpanKind,
    pub name: String,
    pub start_seconds: f64,
    pub end_seconds: f64,
}

/// The command's GPU time and energy by cause over one analysed window (or the merge of
/// several), indexed as [`Cause::ALL`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CausePoint {
    /// Seconds since the recording started, of the window's start.
    pub t: f64,
    /// Seconds the point covers.
    pub dt: f64,
    pub gpu_seconds: [f64; 7],
    pub joules: [f64; 7],
}

impl Merge for CausePoint {
    fn merge(&mut self, later: &Self) {
        self.dt = (later.t + later.dt - self.t).max(self.dt + later.dt);
        for i in 0..Cause::ALL.len() {
            self.gpu_seconds[i] += later.gpu_seconds[i];
            self.joules[i] += later.joules[i];
        }
    }
}

impl CausePoint {
    /// The window of `attributed`, covering `dt` seconds from `t` seconds into the recording (as
    /// the accountant counts it: from the previous window's end), summed over the processes
    /// `is_command` accepts; `None` when none of them held a GPU in it.
    pub(crate) fn of_window(
        attributed: &AttributedWindow,
        t: f64,
        dt: f64,
        mut is_command: impl FnMut(u32) -> bool,
    ) -> Option<Self> {
        let mut point = CausePoint {
            t,
            dt,
            ..CausePoint::default()
        };
        let mut any = false;
        for process in &attributed.ledger.processes {
            if !is_command(process.pid) {
                continue;
            }
            let share = attributed
                .accounts
                .process(process.pid, &process.device_uuid)
                .and_then(|a| a.gpu_share)
                .unwrap_or(0.0);
            for c in &process.window {
                let i = cause_index(c.cause);
                point.gpu_seconds[i] += c.seconds * share;
                point.joules[i] += c.joules.unwrap_or(0.0);
                any = true;
            }
        }
        any.then_some(point)
    }
}

pub(crate) fn cause_index(cause: Cause) -> usize {
    Cause::ALL.iter().position(|c| *c == cause).unwrap_or(0)
}

#[cfg(test)]
impl CausePoint {
    /// A second from `t` with `compute` and `input` GPU-seconds, `joules` charged to compute.
    pub(crate) fn of_compute_and_input(t: f64, compute: f64, input: f64, joules: f64) -> Self {
        let mut p = CausePoint {
            t,
            dt: 1.0,
            ..CausePoint::default()
        };
        p.gpu_seconds[0] = compute;
        p.gpu_seconds[1] = input;
        p.joules[0] = joules;
        p
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub(crate) struct Recording {
    /// The command and its arguments, as given.
    pub command: Vec<String>,
    pub started: SystemTime,
    pub ended: SystemTime,
    pub exit: Option<CommandExit>,
    /// Seconds between samples, as configured.
    pub sample_interval_seconds: Option<f64>,
    pub samples: u64,
    /// Why there are no GPU figures (no NVML, no GPU), when there are none.
    pub no_gpu: Option<String>,
    pub devices: Vec<DeviceTrack>,
    pub processes: Vec<ProcessTrack>,
    pub findings: Vec<FindingMark>,
    pub spans: Vec<SpanMark>,
    /// The command's GPU time and energy by cause, window by window (the ledger).
    pub causes: Series<CausePoint>,
    /// The prices its cost is figured with (`--cost-per-gpu-hour`, `--cost-per-kwh`).
    pub prices: crate::attribution::Prices,
}

impl Recording {
    pub(crate) fn empty(command: Vec<String>, started: SystemTime) -> Self {
        Self {
            command,
            started,
            ended: started,
            exit: None,
            sample_interval_seconds: None,
            samples: 0,
            no_gpu: None,
            devices: Vec::new(),
            processes: Vec::new(),
            findings: Vec::new(),
            spans: Vec::new(),
            causes: Series::default(),
            prices: Default::default(),
        }
    }

    pub(crate) fn duration_seconds(&self) -> f64 {
        self.ended
            .duration_since(self.started)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }

    /// Seconds since the start of the recording at `at` (0 before it).
    pub(crate) fn offset(&self, at: SystemTime) -> f64 {
        at.duration_since(self.started)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, utilization: f32, memory: f64) -> DevicePoint {
        DevicePoint {
            t,
            dt: 1.0,
            n: 1,
            utilization: Some(utilization),
            memory_used: Some(memory),
            ..DevicePoint::default()
        }
    }

    #[test]
    fn a_full_series_halves_its_resolution_keeping_means_and_maxima() {
        let mut series = Series::with_cap(8);
        for i in 0..64 {
            series.push(point(
                f64::from(i),
                if i % 2 == 0 { 0.0 } else { 1.0 },
                f64::from(i),
            ));
        }
        let points = series.points();
        assert!(points.len() < 8, "{} points", points.len());
        let samples: u32 = points.iter().map(|p| p.n).sum();
        assert_eq!(samples, 64, "no sample is lost by merging");
        for p in &points {
            assert_eq!(p.utilization, Some(0.5), "the mean of alternating 0 and 1");
        }
        let last = points.last().unwrap();
        assert_eq!(last.memory_used, Some(63.0), "memory keeps the maximum");
        assert!(points.windows(2).all(|w| w[0].t < w[1].t));
    }

    #[test]
    fn a_mean_ignores_unknown_values() {
        assert_eq!(merge_mean(None, 1.0, Some(0.5), 1.0), Some(0.5));
        assert_eq!(merge_mean(None, 1.0, None, 1.0), None);
        let mut acc = Accumulator::default();
        acc.add(Some(1.0), 1.0);
        acc.add(None, 5.0);
        acc.add(Some(0.0), 3.0);
        assert_eq!(acc.mean(), Some(0.25));
        assert_eq!(acc.peak(), Some(1.0));
    }
}
