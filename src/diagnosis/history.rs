//! The bounded memory the trend rules read: per (host PID, device) a ring of recent window
//! summaries, and per device what the previous window's cumulative error counters were.
//!
//! ## Contract
//! Call `History::record` once per window, before running the rules on that window: the rules
//! then see the current window as the newest summary. Series of processes absent from the
//! recorded window are dropped at once (a PID NVML stopped listing is gone, and a reused PID
//! must not inherit its trend). Size is bounded by `HistoryLimits`: at most `max_series` series
//! of at most `max_windows` summaries each, none older than `max_age`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::SystemTime;

use crate::diagnosis::max_queue::{MaxQueue, SlidingMax};
use crate::fast_map::{FastMap, FastSet};
use crate::sampling::{DeviceWindow, Window};
use crate::schema::{DeviceField, GpmField};

use crate::config::thresholds::HistoryLimits;

/// The most one full series holds on the heap at the default `max_windows` (720): its 720
/// summaries of 40 bytes (`StoredSummary`), a `MaxQueue` of 1024 slots (16 bytes each), the
/// interconnect peak's candidates (16 bytes each, at most one a summary, where the rate falls
/// every window; a deque of up to 1024 slots; none for a steady rate), its row in the PID map
/// (one slot of 336 bytes: a row of the PID map is reserved exactly, where a `Vec` left to
/// grow itself starts at 4) and its device UUID and its share of the maps' spare buckets
/// (measured: 410 B at 256 series; 1024 allowed). [`History::approx_bytes`] measures it; the budget test holds the two together.
pub const HISTORY_BYTES_PER_SERIES: usize = 720 * 40 + 1024 * 16 + 1024 * 16 + 1024;

/// The most one recorded window's [`Frame`] holds beside the series, at the default
/// `max_windows` (720 frames in a ring of up to 1024 slots of 48 bytes) and with each place
/// (a device, or a MIG instance) the window listed: 48 bytes a place (`StoredFigures`), and the
/// allocation's rounding.
pub const HISTORY_BYTES_PER_FRAME: usize = 1024 * 48 / 720 + 1 + 32;
/// See [`HISTORY_BYTES_PER_FRAME`].
pub const HISTORY_BYTES_PER_PLACE: usize = 48;

/// What one window said about one process on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSummary {
    pub start: SystemTime,
    pub end: SystemTime,
    pub gpu_memory_last_bytes: Option<u64>,
    pub gpu_memory_max_bytes: Option<u64>,
    /// The process's own SM utilisation, window mean.
    pub sm_utilization_mean: Option<f64>,
    /// Its device's utilisation, window mean; on MIG, its instance's graphics-engine activity
    /// (NVML gives no utilisation there; DCGM's advice: GR_ENGINE_ACTIVE in place of GPU-Util).
    pub device_utilization_mean: Option<f64>,
    /// Its device's (on MIG: its instance's) GPM SM activity, window mean (Hopper and newer).
    pub device_sm_activity_mean: Option<f64>,
    /// Its device's (on MIG: its instance's) GPM tensor activity (any tensor pipe), window mean.
    pub device_tensor_activity_mean: Option<f64>,
    /// Its device's power draw over its enforced limit, window means; `None` on a MIG instance
    /// (power is the whole GPU's) or when the device gives either figure not.
    pub device_power_ratio_mean: Option<f64>,
    /// The `device_*` figures are the process's MIG instance's, not the whole GPU's.
    pub on_mig_instance: bool,
    /// Its device's interconnect traffic, window mean: NVLink where the device has it, else PCIe.
    pub device_interconnect: Option<InterconnectTraffic>,
}

/// Which interconnect a device's traffic was measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interconnect {
    NvLink,
    Pcie,
}

impl Interconnect {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Interconnect::NvLink => "NVLink",
            Interconnect::Pcie => "PCIe",
        }
    }
}

/// A device's interconnect traffic over one window, both directions summed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InterconnectTraffic {
    pub interconnect: Interconnect,
    pub bytes_per_second: f64,
}

impl InterconnectTraffic {
    /// NVLink traffic (every link, both directions) where the device gives NVLink rates, else
    /// PCIe throughput; `None` when it gives neither.
    pub(crate) fn of(d: &crate::sampling::DeviceWindow) -> Option<Self> {
        if let Some(bytes_per_second) = d.nvlink_bytes_per_second() {
            return Some(Self {
                interconnect: Interconnect::NvLink,
                bytes_per_second,
            });
        }
        d.pcie_bytes_per_second().map(|bytes_per_second| Self {
            interconnect: Interconnect::Pcie,
            bytes_per_second,
        })
    }
}

/// A device's figures over one window that each summary of its processes carries.
#[derive(Debug, Clone, Copy, Default)]
struct DeviceFigures {
    utilization: Option<f64>,
    sm_activity: Option<f64>,
    tensor_activity: Option<f64>,
    /// Mean power over the power limit.
    power_ratio: Option<f64>,
    interconnect: Option<InterconnectTraffic>,
}

impl DeviceFigures {
    fn of(d: &DeviceWindow) -> Self {
        let mean = |field| d.gauge(field).map(|g| g.mean);
        let gpm_mean = |field| d.gpm.gauge(field).map(|g| g.mean);
        DeviceFigures {
            utilization: mean(DeviceField::UtilizationGpu),
            sm_activity: gpm_mean(GpmField::SmActivity),
            tensor_activity: gpm_mean(GpmField::TensorActivity),
            power_ratio: match (mean(DeviceField::Power), mean(DeviceField::PowerLimit)) {
                (Some(power), Some(limit)) if limit > 0.0 => Some(power / limit),
                _ => None,
            },
            interconnect: InterconnectTraffic::of(d),
        }
    }
}

/// What a series stores of one window: the process's own figures, losslessly, in 40 bytes
/// (168 as a `WindowSummary`). Its device's (or MIG instance's) figures and the window's times
/// are the same for every process of the window on that place, so they are stored once, in
/// the window's [`Frame`], and the summary names its frame (`recording`) and its place there.
/// A full history is most of what gpulse holds once it has run a while (docs/resources.md), so
/// its width is its memory.
#[derive(Debug, Clone, Copy)]
struct StoredSummary {
    recording: u64,
    gpu_memory_last_bytes: u64,
    gpu_memory_max_bytes: u64,
    sm_utilization_mean: f64,
    /// Index of its device's or MIG instance's figures in the frame's `places`.
    place: u32,
    /// One bit per optional figure (`PRESENT_MEMORY_LAST`, `PRESENT_MEMORY_MAX`, `PRESENT_SM`).
    present: u16,
}

/// One place's (a device's, or on MIG an instance's) figures over one window, as
/// `WindowSummary`'s `device_*` fields say them, each `Option` a bit of `present`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct StoredFigures {
    utilization_mean: f64,
    sm_activity_mean: f64,
    tensor_activity_mean: f64,
    power_ratio_mean: f64,
    interconnect_bytes_per_second: f64,
    /// `PRESENT_DEVICE_*`, the interconnect's kind and `ON_MIG_INSTANCE`.
    present: u16,
}

/// One recorded window as the series' summaries of it share it: its times and the figures of
/// each place its processes ran on.
#[derive(Debug, Clone)]
struct Frame {
    start_ns: i64,
    end_ns: i64,
    places: Vec<StoredFigures>,
}

/// The frames of the last recordings, oldest first: frame `k` is recording `first + k`
/// (every recording adds one), and the oldest still named by a summary is kept.
#[derive(Debug, Clone, Default)]
struct Frames {
    first: u64,
    ring: VecDeque<Frame>,
}

impl Frames {
    fn get(&self, recording: u64) -> &Frame {
        recording
            .checked_sub(self.first)
            .and_then(|k| self.ring.get(usize::try_from(k).ok()?))
            .expect("a summary's frame is kept while the summary is")
    }

    fn end_ns(&self, s: &StoredSummary) -> i64 {
        self.get(s.recording).end_ns
    }

    /// Adds the frame of `recording`, the one after the newest held.
    fn push(&mut self, recording: u64, frame: Frame) {
        if self.ring.is_empty() {
            self.first = recording;
        }
        debug_assert_eq!(self.first + self.ring.len() as u64, recording);
        self.ring.push_back(frame);
    }

    /// Drops the frames before `recording`.
    fn drop_before(&mut self, recording: u64) {
        while self.first < recording && !self.ring.is_empty() {
            self.ring.pop_front();
            self.first += 1;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<Frame>()
            + self
                .ring
                .iter()
                .map(|f| f.places.capacity() * std::mem::size_of::<StoredFigures>())
                .sum::<usize>()
    }
}

const PRESENT_MEMORY_LAST: u16 = 1;
const PRESENT_MEMORY_MAX: u16 = 1 << 1;
const PRESENT_SM: u16 = 1 << 2;
const PRESENT_DEVICE_UTILIZATION: u16 = 1 << 3;
const PRESENT_DEVICE_SM: u16 = 1 << 4;
const PRESENT_DEVICE_TENSOR: u16 = 1 << 5;
const PRESENT_POWER_RATIO: u16 = 1 << 6;
const PRESENT_INTERCONNECT: u16 = 1 << 7;
/// With [`PRESENT_INTERCONNECT`]: the traffic is NVLink's, else PCIe's.
const INTERCONNECT_NVLINK: u16 = 1 << 8;
const ON_MIG_INSTANCE: u16 = 1 << 9;

/// Nanoseconds from the epoch (negative before it); saturates past ±292 years.
fn to_epoch_nanos(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

fn from_epoch_nanos(nanos: i64) -> SystemTime {
    let magnitude = std::time::Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// Sets `bit` in `present` when `value` holds.
fn flag(present: &mut u16, value: bool, bit: u16) {
    if value {
        *present |= bit;
    }
}

impl StoredFigures {
    /// Its bits, for finding the same figures among a window's places.
    fn key(&self) -> [u64; 6] {
        [
            self.utilization_mean.to_bits(),
            self.sm_activity_mean.to_bits(),
            self.tensor_activity_mean.to_bits(),
            self.power_ratio_mean.to_bits(),
            self.interconnect_bytes_per_second.to_bits(),
            u64::from(self.present),
        ]
    }

    fn store(s: &WindowSummary) -> Self {
        let mut present = 0;
        flag(
            &mut present,
            s.device_utilization_mean.is_some(),
            PRESENT_DEVICE_UTILIZATION,
        );
        flag(
            &mut present,
            s.device_sm_activity_mean.is_some(),
            PRESENT_DEVICE_SM,
        );
        flag(
            &mut present,
            s.device_tensor_activity_mean.is_some(),
            PRESENT_DEVICE_TENSOR,
        );
        flag(
            &mut present,
            s.device_power_ratio_mean.is_some(),
            PRESENT_POWER_RATIO,
        );
        flag(
            &mut present,
            s.device_interconnect.is_some(),
            PRESENT_INTERCONNECT,
        );
        flag(
            &mut present,
            s.device_interconnect
                .is_some_and(|c| c.interconnect == Interconnect::NvLink),
            INTERCONNECT_NVLINK,
        );
        flag(&mut present, s.on_mig_instance, ON_MIG_INSTANCE);
        StoredFigures {
            utilization_mean: s.device_utilization_mean.unwrap_or(0.0),
            sm_activity_mean: s.device_sm_activity_mean.unwrap_or(0.0),
            tensor_activity_mean: s.device_tensor_activity_mean.unwrap_or(0.0),
            power_ratio_mean: s.device_power_ratio_mean.unwrap_or(0.0),
            interconnect_bytes_per_second: s
                .device_interconnect
                .map_or(0.0, |c| c.bytes_per_second),
            present,
        }
    }
}

impl StoredSummary {
    /// The process's part of `s`, in frame `recording` at `place`.
    fn store(s: &WindowSummary, recording: u64, place: u32) -> Self {
        let mut present = 0;
        flag(
            &mut present,
            s.gpu_memory_last_bytes.is_some(),
            PRESENT_MEMORY_LAST,
        );
        flag(
            &mut present,
            s.gpu_memory_max_bytes.is_some(),
            PRESENT_MEMORY_MAX,
        );
        flag(&mut present, s.sm_utilization_mean.is_some(), PRESENT_SM);
        StoredSummary {
            recording,
            gpu_memory_last_bytes: s.gpu_memory_last_bytes.unwrap_or(0),
            gpu_memory_max_bytes: s.gpu_memory_max_bytes.unwrap_or(0),
            sm_utilization_mean: s.sm_utilization_mean.unwrap_or(0.0),
            place,
            present,
        }
    }

    /// The whole summary again, with its frame's times and its place's figures.
    fn summary(&self, frames: &Frames) -> WindowSummary {
        let frame = frames.get(self.recording);
        let place = frame.places[self.place as usize];
        let has = |bit: u16| self.present & bit != 0;
        let place_has = |bit: u16| place.present & bit != 0;
        let some = |bit: u16, value: f64| place_has(bit).then_some(value);
        WindowSummary {
            start: from_epoch_nanos(frame.start_ns),
            end: from_epoch_nanos(frame.end_ns),
            gpu_memory_last_bytes: has(PRESENT_MEMORY_LAST).then_some(self.gpu_memory_last_bytes),
            gpu_memory_max_bytes: has(PRESENT_MEMORY_MAX).then_some(self.gpu_memory_max_bytes),
            sm_utilization_mean: has(PRESENT_SM).then_some(self.sm_utilization_mean),
            device_utilization_mean: some(PRESENT_DEVICE_UTILIZATION, place.utilization_mean),
            device_sm_activity_mean: some(PRESENT_DEVICE_SM, place.sm_activity_mean),
            device_tensor_activity_mean: some(PRESENT_DEVICE_TENSOR, place.tensor_activity_mean),
            device_power_ratio_mean: some(PRESENT_POWER_RATIO, place.power_ratio_mean),
            on_mig_instance: place_has(ON_MIG_INSTANCE),
            device_interconnect: place_has(PRESENT_INTERCONNECT).then(|| InterconnectTraffic {
                interconnect: if place_has(INTERCONNECT_NVLINK) {
                    Interconnect::NvLink
                } else {
                    Interconnect::Pcie
                },
                bytes_per_second: place.interconnect_bytes_per_second,
            }),
        }
    }
}

/// The summaries of one (pid, device), oldest first, as the history keeps them.
#[derive(Debug, Clone)]
struct StoredSeries {
    device_index: u32,
    summaries: VecDeque<StoredSummary>,
    /// Each summary's `gpu_memory_last_bytes`, by position: `memory_growth` takes the maximum
    /// of a stretch of a long history from it without walking the stretch.
    memory_last: MaxQueue,
    /// The largest interconnect rate of the series' summaries on NVLink and on PCIe
    /// (`Interconnect` order), for `interconnect_bound`'s peak without walking the history.
    interconnect_peak: [SlidingMax; 2],
    /// Summaries with a `gpu_memory_last_bytes`.
    memory_points: usize,
    /// Neighbouring summaries of which the newer ends before the older (the wall clock stepped
    /// back): while there is one, positions are not in time order.
    ends_out_of_order: usize,
    /// The last recording (`History::recordings`) whose window listed this process on this
    /// device.
    listed_in: u64,
    /// Summaries pushed since the series began: the summary at position `p` is the series'
    /// number `pushed - len + p`, which stays its own while older ones leave.
    pushed: u64,
    /// `memory_growth`'s last slope over this series' sampled summaries: those are named by
    /// number, and a summary never changes once stored, so the slope holds until the sample
    /// does, which at a full history is once every few windows. The rules read the history
    /// through shared references (`Inputs`), hence a `Cell`.
    sampled_slope: Cell<Option<SampledSlope>>,
    /// `idle_holder`'s trailing idle run as of the newest summary it saw: a series idle for
    /// its whole history would otherwise be walked whole each window (see [`KeptRun`]).
    idle_run: Cell<Option<KeptRun>>,
}

/// A trailing run of summaries a rule found in a series, kept so that the next window extends
/// it by the one new summary instead of walking the run again. `key` is the rule's
/// description of what belongs to a run (its thresholds); summaries are named by number
/// ([`Series::first_number`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct KeptRun {
    pub key: [u64; 2],
    /// The number of the newest summary the run was found at.
    pub through: u64,
    /// `None` when that summary did not belong to a run.
    pub run: Option<RunSoFar>,
}

/// A trailing run: its oldest summary and the highest figure in it, with the newest summary
/// holding that figure (while that one is held, summaries leaving the run's old end cannot
/// lower the peak).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RunSoFar {
    pub start: u64,
    pub peak: f64,
    pub peak_at: u64,
}

/// A slope a rule computed over some of a series' summaries, and which ones (`key`, the
/// rule's own description of them, e.g. their numbers and its threshold), so that the rule
/// recomputes it only when the key changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SampledSlope {
    pub key: [u64; 4],
    pub slope: Option<f64>,
}

/// The summaries of one (pid, device), oldest first: a series of the history, read with the
/// frames its summaries name.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    stored: &'a StoredSeries,
    frames: &'a Frames,
}

impl<'a> Series<'a> {
    pub fn device_index(&self) -> u32 {
        self.stored.device_index
    }

    pub(crate) fn summaries(
        &self,
    ) -> impl DoubleEndedIterator<Item = WindowSummary> + ExactSizeIterator + Clone + 'a {
        let frames = self.frames;
        self.stored.summaries.iter().map(|s| s.summary(frames))
    }

    pub fn len(&self) -> usize {
        self.stored.summaries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stored.summaries.is_empty()
    }

    pub(crate) fn latest(&self) -> Option<WindowSummary> {
        self.stored.summaries.back().map(|s| s.summary(self.frames))
    }

    /// The end and `gpu_memory_last_bytes` of the summary at `position` (0 the oldest), without
    /// decoding the rest of it: `memory_growth` reads these alone, from about a hundred positions
    /// of each series it fits, every window.
    pub(crate) fn memory_point(&self, position: usize) -> Option<(SystemTime, Option<u64>)> {
        let stored = self.stored.summaries.get(position)?;
        let end = from_epoch_nanos(self.frames.end_ns(stored));
        let last =
            (stored.present & PRESENT_MEMORY_LAST != 0).then_some(stored.gpu_memory_last_bytes);
        Some((end, last))
    }

    /// The first position whose end `before` says no to, by binary search without decoding
    /// the summaries: `before` must say yes to a prefix of the ends and no to the rest.
    pub(crate) fn partition_point_by_end(
        &self,
        mut before: impl FnMut(SystemTime) -> bool,
    ) -> usize {
        let frames = self.frames;
        self.stored
            .summaries
            .partition_point(|stored| before(from_epoch_nanos(frames.end_ns(stored))))
    }

    /// The largest `gpu_memory_last_bytes` among the summaries at `positions`, in O(log n).
    pub(crate) fn memory_last_max(&self, positions: std::ops::Range<usize>) -> Option<u64> {
        self.stored.memory_last.max(positions)
    }

    /// The largest `device_interconnect` rate among the summaries measured on `interconnect`,
    /// 0.0 when none is positive: the fold over the summaries, in amortised O(1).
    pub(crate) fn interconnect_peak(&self, interconnect: Interconnect) -> f64 {
        self.stored.interconnect_peak[interconnect as usize].max()
    }

    /// The number of the summary at position 0: summaries are numbered from 0 as they are
    /// pushed onto the series, and keep their number while older ones leave.
    pub(crate) fn first_number(&self) -> u64 {
        self.stored.pushed - self.stored.summaries.len() as u64
    }

    /// The summary numbered `number`, when the series still holds it.
    pub(crate) fn numbered(&self, number: u64) -> Option<WindowSummary> {
        let position = usize::try_from(number.checked_sub(self.first_number())?).ok()?;
        let stored = self.stored.summaries.get(position)?;
        Some(stored.summary(self.frames))
    }

    /// The trailing run `idle_holder` last kept for this series (see [`KeptRun`]).
    pub(crate) fn idle_run(&self) -> &'a Cell<Option<KeptRun>> {
        &self.stored.idle_run
    }

    /// The slope `memory_growth` last kept for this series (see [`SampledSlope`]).
    pub(crate) fn sampled_slope(&self) -> &'a Cell<Option<SampledSlope>> {
        &self.stored.sampled_slope
    }

    /// How many summaries carry `gpu_memory_last_bytes`.
    pub(crate) fn memory_points(&self) -> usize {
        self.stored.memory_points
    }

    /// Whether each summary ends no earlier than the one before it, so that a run of times is a
    /// run of positions.
    pub(crate) fn ends_in_order(&self) -> bool {
        self.stored.ends_out_of_order == 0
    }
}

impl StoredSeries {
    fn new(device_index: u32, recording: u64) -> Self {
        StoredSeries {
            device_index,
            summaries: VecDeque::new(),
            memory_last: MaxQueue::default(),
            interconnect_peak: Default::default(),
            memory_points: 0,
            ends_out_of_order: 0,
            listed_in: recording,
            pushed: 0,
            sampled_slope: Cell::new(None),
            idle_run: Cell::new(None),
        }
    }

    /// Appends `summary`, stored as `stored` (its frame already in `frames`), first dropping
    /// the oldest when the series already holds `max_windows`, and grows the ring to no more
    /// than `max_windows` slots: a `VecDeque` left to grow itself doubles, so 720 summaries
    /// would sit in 1024 slots.
    fn push_back(
        &mut self,
        summary: &WindowSummary,
        stored: StoredSummary,
        frames: &Frames,
        max_windows: usize,
    ) {
        while self.summaries.len() >= max_windows.max(1) {
            self.pop_front(frames);
        }
        let len = self.summaries.len();
        if len == self.summaries.capacity() {
            // Doubling (from 4) up to the bound: amortised O(1) per push as before.
            self.summaries
                .reserve_exact(len.max(4).min(max_windows.max(1) - len));
        }
        if self
            .summaries
            .back()
            .is_some_and(|last| to_epoch_nanos(summary.end) < frames.end_ns(last))
        {
            self.ends_out_of_order += 1;
        }
        self.memory_points += usize::from(summary.gpu_memory_last_bytes.is_some());
        self.memory_last.push_back(summary.gpu_memory_last_bytes);
        for (kind, peak) in [Interconnect::NvLink, Interconnect::Pcie]
            .into_iter()
            .zip(&mut self.interconnect_peak)
        {
            peak.push_back(
                summary
                    .device_interconnect
                    .filter(|c| c.interconnect == kind)
                    .map(|c| c.bytes_per_second),
            );
        }
        self.summaries.push_back(stored);
        self.pushed += 1;
    }

    fn pop_front(&mut self, frames: &Frames) {
        let Some(oldest) = self.summaries.pop_front() else {
            return;
        };
        if self
            .summaries
            .front()
            .is_some_and(|next| frames.end_ns(next) < frames.end_ns(&oldest))
        {
            self.ends_out_of_order -= 1;
        }
        self.memory_points -= usize::from(oldest.present & PRESENT_MEMORY_LAST != 0);
        self.memory_last.pop_front();
        self.interconnect_peak
            .iter_mut()
            .for_each(SlidingMax::pop_front);
    }
}

/// Per device: cumulative counters of the previous window, for "new since last window".
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct DeviceCounters {
    /// `ecc_uncorrected_total` of the window before the newest recorded one.
    pub previous_ecc_uncorrected: Option<u64>,
    /// The same of the newest recorded window.
    pub last_ecc_uncorrected: Option<u64>,
    counters_start: Option<SystemTime>,
}

/// Bounded per-workload history. See the module documentation for the contract.
#[derive(Debug, Clone)]
pub struct History {
    limits: HistoryLimits,
    /// By PID, then device UUID: a process nearly always holds one device, so a series is found
    /// by hashing the PID and comparing one UUID, with no `(pid, uuid)` key to build.
    series: FastMap<u32, Vec<(String, StoredSeries)>>,
    /// The recorded windows' times and places, which the series' summaries name.
    frames: Frames,
    devices: FastMap<String, DeviceCounters>,
    last_recorded_end: Option<SystemTime>,
    /// Windows recorded so far.
    recordings: u64,
}

impl History {
    pub fn new(limits: HistoryLimits) -> Self {
        Self {
            limits,
            series: FastMap::default(),
            frames: Frames::default(),
            devices: FastMap::default(),
            last_recorded_end: None,
            recordings: 0,
        }
    }

    /// Adds the window's summaries and prunes. Recording the same window twice (same end time)
    /// is ignored, so a retried pipeline step cannot double a point or shift the ECC baseline.
    pub fn record(&mut self, window: &Window) {
        if self.last_recorded_end == Some(window.end) {
            return;
        }
        self.last_recorded_end = Some(window.end);
        self.recordings += 1;
        let recording = self.recordings;
        self.append(window, recording);
        // Series of processes the window did not list are dropped.
        self.retain_series(|series| series.listed_in == recording);
        self.trim(window.end);
        self.evict_beyond_max_series(window.end);
        self.drop_unnamed_frames(recording);
        self.record_device_counters(window);
    }

    /// Appends each listed process's summary of `window` to its series on its device, marking
    /// the series as listed in `recording`, and the window's frame: its times and each distinct
    /// place figures its summaries carry, stored once.
    fn append(&mut self, window: &Window, recording: u64) {
        let figures: FastMap<&str, DeviceFigures> = window
            .devices
            .iter()
            .map(|d| (d.info.uuid.as_str(), DeviceFigures::of(d)))
            .collect();
        let mut places: Vec<StoredFigures> = Vec::new();
        let mut place_of: FastMap<[u64; 6], u32> = FastMap::default();
        let mut summaries = Vec::with_capacity(window.processes.len());
        for p in &window.processes {
            let device = figures
                .get(p.device_uuid.as_str())
                .copied()
                .unwrap_or_default();
            let mut summary = WindowSummary {
                start: window.start,
                end: window.end,
                gpu_memory_last_bytes: p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64),
                gpu_memory_max_bytes: p.gpu_memory_bytes.map(|g| g.max.max(0.0) as u64),
                sm_utilization_mean: p.sm_utilization.map(|g| g.mean),
                device_utilization_mean: device.utilization,
                device_sm_activity_mean: device.sm_activity,
                device_tensor_activity_mean: device.tensor_activity,
                device_power_ratio_mean: device.power_ratio,
                device_interconnect: device.interconnect,
                on_mig_instance: false,
            };
            // On MIG the process's load is its instance's, not the whole GPU's: a rule on its
            // "device" figures then judges the instance it runs in.
            if let Some(m) = window.mig_instance_of(p.pid, &p.device_uuid) {
                summary.device_utilization_mean = m.gpm.mean(GpmField::GraphicsActivity);
                summary.device_sm_activity_mean = m.gpm.mean(GpmField::SmActivity);
                summary.device_tensor_activity_mean = m.gpm.mean(GpmField::TensorActivity);
                summary.device_power_ratio_mean = None;
                summary.on_mig_instance = true;
            }
            // Places with the same figures (bit for bit) share one entry: nothing is lost, and
            // the processes of one device or instance find theirs by its figures alone.
            let place = StoredFigures::store(&summary);
            let key = place.key();
            let at = *place_of.entry(key).or_insert_with(|| {
                places.push(place);
                u32::try_from(places.len() - 1).expect("fewer places than processes")
            });
            summaries.push((StoredSummary::store(&summary, recording, at), summary));
        }
        self.frames.push(
            recording,
            Frame {
                start_ns: to_epoch_nanos(window.start),
                end_ns: to_epoch_nanos(window.end),
                places: places.as_slice().to_vec(),
            },
        );
        let max_windows = self.limits.max_windows;
        for (p, (stored, summary)) in window.processes.iter().zip(summaries) {
            let rows = self.series.entry(p.pid).or_default();
            let at = match rows.iter().position(|(uuid, _)| *uuid == p.device_uuid) {
                Some(at) => at,
                None => {
                    // Most processes use one device: a row left to grow itself starts at 4
                    // slots of a few hundred bytes each.
                    rows.reserve_exact(1);
                    rows.push((
                        p.device_uuid.clone(),
                        StoredSeries::new(p.device_index, recording),
                    ));
                    rows.len() - 1
                }
            };
            let series = &mut rows[at].1;
            series.device_index = p.device_index;
            series.listed_in = recording;
            series.push_back(&summary, stored, &self.frames, max_windows);
        }
    }

    /// Forgets the frames older than every series' oldest summary (all of them, with no series
    /// left): the frames held are at most the last `max_windows` recordings.
    fn drop_unnamed_frames(&mut self, recording: u64) {
        let oldest_named = self
            .series
            .values()
            .flatten()
            .filter_map(|(_, series)| series.summaries.front())
            .map(|s| s.recording)
            .min()
            .unwrap_or(recording + 1);
        self.frames.drop_before(oldest_named);
    }

    /// Drops the summaries past `max_windows` or older than `max_age` before `end`, then the
    /// series left empty.
    fn trim(&mut self, end: SystemTime) {
        let oldest_kept = end.checked_sub(self.limits.max_age);
        let frames = &self.frames;
        for series in self.series.values_mut().flatten().map(|(_, series)| series) {
            while series.summaries.len() > self.limits.max_windows {
                series.pop_front(frames);
            }
            if let Some(oldest) = oldest_kept {
                let oldest = to_epoch_nanos(oldest);
                while series
                    .summaries
                    .front()
                    .is_some_and(|s| frames.end_ns(s) < oldest)
                {
                    series.pop_front(frames);
                }
            }
        }
        self.retain_series(|series| !series.summaries.is_empty());
    }

    /// Past `max_series` series, keeps the longest-running ones.
    fn evict_beyond_max_series(&mut self, end: SystemTime) {
        if self.series_count() > self.limits.max_series {
            // Keep the longest-running series: they carry the trends; a burst of short-lived
            // processes should not evict a training job's history.
            let frames = &self.frames;
            let mut keys: Vec<((u32, String), SystemTime)> = self
                .series
                .iter()
                .flat_map(|(&pid, rows)| {
                    rows.iter().map(move |(uuid, s)| {
                        (
                            (pid, uuid.clone()),
                            s.summaries.front().map_or(end, |f| {
                                from_epoch_nanos(frames.get(f.recording).start_ns)
                            }),
                        )
                    })
                })
                .collect();
            keys.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
            for ((pid, uuid), _) in keys.into_iter().skip(self.limits.max_series) {
                if let Some(rows) = self.series.get_mut(&pid) {
                    rows.retain(|(u, _)| *u != uuid);
                    if rows.is_empty() {
                        self.series.remove(&pid);
                    }
                }
            }
        }
    }

    /// Moves each device's cumulative error counters on by one window, and forgets devices the
    /// window did not list.
    fn record_device_counters(&mut self, window: &Window) {
        let mut seen_devices: FastSet<&str> = FastSet::default();
        for d in &window.devices {
            seen_devices.insert(d.info.uuid.as_str());
            let entry = self.devices.entry(d.info.uuid.clone()).or_default();
            if entry.counters_start != Some(d.counters_start) {
                // The sampler restarted this device's counters (re-attached): old totals are
                // from another baseline.
                *entry = DeviceCounters {
                    previous_ecc_uncorrected: None,
                    last_ecc_uncorrected: None,
                    counters_start: Some(d.counters_start),
                };
            }
            entry.previous_ecc_uncorrected = entry.last_ecc_uncorrected;
            entry.last_ecc_uncorrected = d.total_u64(DeviceField::EccUncorrected);
        }
        self.devices
            .retain(|uuid, _| seen_devices.contains(uuid.as_str()));
    }

    /// The series of one process on one device.
    pub fn series(&self, pid: u32, device_uuid: &str) -> Option<Series<'_>> {
        self.series
            .get(&pid)?
            .iter()
            .find(|(uuid, _)| uuid == device_uuid)
            .map(|(_, stored)| Series {
                stored,
                frames: &self.frames,
            })
    }

    /// Keeps the series `keep` says yes to, and the PIDs that still have one.
    fn retain_series(&mut self, mut keep: impl FnMut(&StoredSeries) -> bool) {
        self.series.retain(|_, rows| {
            rows.retain(|(_, series)| keep(series));
            !rows.is_empty()
        });
    }

    /// The counters of one device.
    pub(crate) fn device(&self, uuid: &str) -> Option<&DeviceCounters> {
        self.devices.get(uuid)
    }

    /// Number of (pid, device) series held.
    pub fn series_count(&self) -> usize {
        self.series.values().map(Vec::len).sum()
    }

    /// Bytes the history holds on the heap, from its structures' own capacities: each series'
    /// ring of summaries and its `MaxQueue`, the device UUID it is keyed by, the per-PID rows
    /// and the two maps' buckets (hashbrown: one control byte per bucket beside the entry).
    /// [`HISTORY_BYTES_PER_SERIES`] bounds a full series; docs/resources.md states the total.
    pub fn approx_bytes(&self) -> usize {
        use std::mem::size_of;
        let mut bytes =
            self.series.capacity() * (size_of::<(u32, Vec<(String, StoredSeries)>)>() + 1);
        bytes += self.frames.heap_bytes();
        for rows in self.series.values() {
            bytes += rows.capacity() * size_of::<(String, StoredSeries)>();
            for (uuid, series) in rows {
                bytes += uuid.capacity()
                    + series.summaries.capacity() * size_of::<StoredSummary>()
                    + series.memory_last.heap_bytes()
                    + series
                        .interconnect_peak
                        .iter()
                        .map(SlidingMax::heap_bytes)
                        .sum::<usize>();
            }
        }
        bytes += self.devices.capacity() * (size_of::<(String, DeviceCounters)>() + 1);
        bytes += self.devices.keys().map(String::capacity).sum::<usize>();
        bytes
    }

    /// Number of summaries held over all series.
    pub fn summary_count(&self) -> usize {
        self.series
            .values()
            .flatten()
            .map(|(_, s)| s.summaries.len())
            .sum()
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new(HistoryLimits::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::{device, process, window, GIB};
    use std::time::Duration;

    fn summary(seed: u64) -> WindowSummary {
        // Every optional figure present or absent by a bit of the seed, values with all their
        // bits in use (no round numbers that a lossy encoding would keep by luck).
        let bit = |k: u64| seed >> k & 1 == 1;
        let value = |k: u64| (seed as f64 + k as f64 / 7.0).sqrt() / 3.0;
        WindowSummary {
            start: SystemTime::UNIX_EPOCH + Duration::new(1_796_000_000 + seed, 123_456_789),
            end: SystemTime::UNIX_EPOCH + Duration::new(1_796_000_001 + seed, 987_654_321),
            gpu_memory_last_bytes: bit(0).then_some(u64::MAX - seed),
            gpu_memory_max_bytes: bit(1).then_some(seed * 1_048_577),
            sm_utilization_mean: bit(2).then(|| value(2)),
            device_utilization_mean: bit(3).then(|| value(3)),
            device_sm_activity_mean: bit(4).then(|| value(4)),
            device_tensor_activity_mean: bit(5).then(|| value(5)),
            device_power_ratio_mean: bit(6).then(|| value(6)),
            on_mig_instance: bit(7),
            device_interconnect: bit(8).then(|| InterconnectTraffic {
                interconnect: if bit(9) {
                    Interconnect::NvLink
                } else {
                    Interconnect::Pcie
                },
                bytes_per_second: value(9) * 1e9,
            }),
        }
    }

    /// `s` stored as a series stores it: its place's figures in a frame of their own.
    fn round_trip(s: &WindowSummary) -> WindowSummary {
        let mut frames = Frames::default();
        frames.push(
            7,
            Frame {
                start_ns: to_epoch_nanos(s.start),
                end_ns: to_epoch_nanos(s.end),
                places: vec![StoredFigures::default(), StoredFigures::store(s)],
            },
        );
        StoredSummary::store(s, 7, 1).summary(&frames)
    }

    #[test]
    fn a_stored_summary_reads_back_as_it_was_given() {
        for seed in 0..1024 {
            let s = summary(seed);
            assert_eq!(round_trip(&s), s, "seed {seed}");
        }
        // Times before the epoch (a clock set back far) and at it.
        let mut s = summary(3);
        s.start = SystemTime::UNIX_EPOCH - Duration::new(5, 1);
        s.end = SystemTime::UNIX_EPOCH;
        assert_eq!(round_trip(&s), s);
    }

    /// Each process reads its own device's figures from the frame its devices share, window
    /// after window, and a frame holds one place per distinct figures, not one per process.
    #[test]
    fn processes_read_their_own_devices_figures_from_the_shared_frames() {
        let mut history = History::default();
        for at in 1..=50_u64 {
            // Device d's utilisation changes every window; devices 2 and 3 read alike.
            let util = |d: u32| (f64::from(d.min(2)) + at as f64) / 100.0;
            let devices = (0..4).map(|d| device(d, util(d), 60 * GIB)).collect();
            let processes = (0..16)
                .map(|i| process(100 + i, i % 4, (at + u64::from(i)) * GIB, Some(0.5)))
                .collect();
            let mut w = window(at * 10, devices, processes);
            if at == 30 {
                // The wall clock stepped back: order is kept per series all the same.
                w.end -= Duration::from_secs(25);
            }
            history.record(&w);
            let newest = history.frames.get(history.recordings);
            assert_eq!(newest.places.len(), 3, "window {at}");
            for i in 0..16 {
                let series = history
                    .series(100 + i, &format!("GPU-0000000{}", i % 4))
                    .unwrap();
                let latest = series.latest().unwrap();
                assert_eq!(
                    latest.device_utilization_mean,
                    Some(util(i % 4)),
                    "pid {} at {at}",
                    100 + i
                );
                assert_eq!(
                    latest.gpu_memory_last_bytes,
                    Some((at + u64::from(i)) * GIB)
                );
                assert_eq!(latest.end, w.end);
                assert_eq!(series.ends_in_order(), at < 30, "window {at}");
            }
        }
        assert_eq!(history.frames.ring.len(), 50, "every frame still named");
    }

    /// What docs/resources.md's history figure is computed from.
    #[test]
    fn a_stored_summary_is_40_bytes_and_a_full_series_holds_room_for_max_windows_only() {
        assert_eq!(std::mem::size_of::<StoredSummary>(), 40);
        assert_eq!(
            std::mem::size_of::<StoredFigures>(),
            HISTORY_BYTES_PER_PLACE
        );
        let mut history = History::new(HistoryLimits {
            max_windows: 720,
            ..HistoryLimits::default()
        });
        for at in 0..2000 {
            history.record(&window(
                1000 + at,
                vec![device(0, 0.5, GIB)],
                vec![process(9, 0, GIB, None)],
            ));
            let series = history.series(9, "GPU-00000000").unwrap();
            assert!(series.stored.summaries.capacity() >= series.len());
        }
        let series = history.series(9, "GPU-00000000").unwrap();
        assert_eq!(series.len(), 720);
        assert_eq!(series.stored.summaries.capacity(), 720);
        assert_eq!(
            history.frames.ring.len(),
            720,
            "the frames of the summaries only"
        );
    }

    /// 8 devices and `procs` processes spread over them, one window ending at `at` seconds.
    fn node_window(at: u64, procs: u32) -> Window {
        // PCIe traffic falling window after window: the interconnect peak's worst case, one
        // candidate per summary.
        let pcie = 1e12 - at as f64;
        let devices = (0..8)
            .map(|d| {
                // Each device its own figures: one place each in every frame.
                let mut d = device(d, 0.75 + f64::from(d) / 100.0, 60 * GIB);
                d.fields.set_gauge(
                    DeviceField::PcieTx,
                    Some(crate::diagnosis::rules::testkit::gauge(pcie)),
                );
                d
            })
            .collect();
        let processes = (0..procs)
            .map(|i| process(1000 + i, i % 8, 8 * GIB, Some(0.12)))
            .collect();
        window(at, devices, processes)
    }

    /// The budget (docs/resources.md): the history filled to both its bounds, `max_series`
    /// series of `max_windows` summaries, holds no more than `HISTORY_BYTES_PER_SERIES` per
    /// series, measured from the structures' capacities; a ring never grows past its bound.
    #[test]
    fn full_history_stays_within_its_stated_budget() {
        assert_eq!(
            std::mem::size_of::<StoredSummary>(),
            40,
            "update the budget"
        );
        let limits = HistoryLimits::default();
        let mut history = History::new(limits.clone());
        // More processes than max_series, for longer than max_windows (1 s windows, so that
        // max_age, 1 h, does not trim first).
        let procs = limits.max_series as u32 + 16;
        for i in 1..=limits.max_windows as u64 + 5 {
            let mut w = node_window(1000 + i, procs);
            w.start = crate::diagnosis::rules::testkit::t(999 + i);
            history.record(&w);
        }
        assert_eq!(history.series_count(), limits.max_series);
        assert_eq!(
            history.summary_count(),
            limits.max_series * limits.max_windows
        );
        for series in history.series.values().flatten().map(|(_, s)| s) {
            assert_eq!(series.summaries.capacity(), limits.max_windows);
        }
        // One place a device: every process of a device reads alike.
        assert_eq!(history.frames.ring.len(), limits.max_windows);
        assert!(history.frames.ring.iter().all(|f| f.places.len() == 8));
        let bytes = history.approx_bytes();
        let budget = limits.max_series * HISTORY_BYTES_PER_SERIES
            + limits.max_windows * (HISTORY_BYTES_PER_FRAME + 8 * HISTORY_BYTES_PER_PLACE);
        assert!(bytes <= budget, "{bytes} B held, budget {budget} B");
        // And the accounting counts what is there: at least the summaries themselves.
        assert!(
            bytes >= history.summary_count() * std::mem::size_of::<StoredSummary>(),
            "{bytes} B"
        );
    }
}
