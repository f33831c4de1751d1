//! The framework layer of diagnosis: what the training framework itself says about a GPU
//! process, received through gpulse's OTLP receiver and tied to the process's host PID the way
//! spans are for enrichment (`enrich::framework_intake` does the receiving). Two parts:
//!
//! - [`FrameworkHistory`]: bounded per-process memory of the PyTorch caching allocator's gauges
//!   (`pytorch.cuda.memory.allocated`, `.reserved`, `.max_allocated`, by `hw.id`), of the `step`
//!   and `data_wait` span durations, and of the DataLoader settings the companion reports on its
//!   run/epoch spans. Written by the receiver, read once per export window.
//! - [`FrameworkEvidence`]: what the rules read, taken from the history for the window's
//!   processes (`FrameworkHistory::evidence`): plain values, so the rules stay pure and their
//!   tests need no history.
//!
//! ## Bounds
//! At most [`FrameworkLimits::max_processes`] processes (the least recently heard from go
//! first), per process and device at most `max_points` allocator points and `max_points` step
//! timings, none older than `max_age`. A process NVML no longer lists is forgotten at the next
//! window (`FrameworkHistory::retain`), so a reused PID never inherits a trend.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::schema::attributes::AttributeId as A;
use serde::Serialize;

pub use crate::attribution::DistributedIdentity;
use crate::attribution::SentIdentity;

/// The companion's metric names (examples/pytorch, `cuda_memory.py`).
pub(crate) const ALLOCATED: &str = "pytorch.cuda.memory.allocated";
pub(crate) const RESERVED: &str = "pytorch.cuda.memory.reserved";
pub(crate) const MAX_ALLOCATED: &str = "pytorch.cuda.memory.max_allocated";
/// The companion's span names (`telemetry.py`).
pub(crate) const STEP_SPAN: &str = "step";
pub(crate) const DATA_WAIT_SPAN: &str = "data_wait";
/// The seconds of a step with a torch.distributed collective in flight, on the companion's step
/// span (`distributed.py`).
pub(crate) const COLLECTIVE_WAIT_ATTRIBUTE: &str = A::PytorchCollectiveWait.key();
/// The collectives a step completed, beside its wait (the companion sends both, or neither).
pub(crate) const COLLECTIVE_COUNT_ATTRIBUTE: &str = "pytorch.distributed.collective.count";
pub(crate) use super::live::{DepartedRank, LiveReport};
use super::live::{DEPARTED_KEPT, DEPARTED_MAX};
/// The companion's resource attributes naming the process's place in a distributed job.
pub(crate) use crate::attribution::sent_identity::{BACKEND, JOB_ID, LOCAL_RANK, RANK, WORLD_SIZE};
/// DataLoader settings on the companion's run and epoch spans.
pub(crate) const LOADER_ATTRIBUTES: [&str; 5] = [
    A::PytorchDataloaderWorkers.key(),
    A::PytorchDataloaderPinMemory.key(),
    "pytorch.dataloader.prefetch_factor",
    "pytorch.dataloader.persistent_workers",
    "pytorch.dataloader.batch_size",
];

/// Which layers of the stack a finding's evidence came from (`gpulse.diagnosis.evidence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The driver (NVML): device and per-process GPU figures.
    Nvml,
    /// The kernel: `/proc` and cgroups (CPU use, parents, identity, CPU quota).
    Procfs,
    /// Metrics the framework sent through gpulse's receiver (allocator gauges).
    Metrics,
    /// Spans the framework sent through gpulse's receiver (step and data_wait timings).
    Spans,
    /// Log records the framework sent through gpulse's receiver (the live states of its loop).
    Logs,
}

impl Layer {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Layer::Nvml => "nvml",
            Layer::Procfs => "procfs",
            Layer::Metrics => "metrics",
            Layer::Spans => "spans",
            Layer::Logs => "logs",
        }
    }

    /// The comma-joined names, in a fixed order: `nvml,procfs,spans`.
    pub(crate) fn join(layers: &[Layer]) -> String {
        let mut sorted = layers.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        sorted
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// One reading of the allocator gauges of one device (any may be missing from a request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocatorPoint {
    pub at: SystemTime,
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    /// Peak of `allocated` since the current epoch began (the companion resets it per epoch).
    pub max_allocated_bytes: Option<u64>,
}

/// A finished span of the training loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SpanTiming {
    pub end: SystemTime,
    pub duration: Duration,
}

/// DataLoader settings as the companion reported them (the text of each attribute's value).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoaderSettings {
    /// `(attribute name, value)`, in [`LOADER_ATTRIBUTES`] order.
    pub settings: Vec<(String, String)>,
}

impl LoaderSettings {
    pub(crate) fn is_empty(&self) -> bool {
        self.settings.is_empty()
    }

    /// `num_workers=2, pin_memory=false, ...` for an advice line.
    pub(crate) fn describe(&self) -> String {
        self.settings
            .iter()
            .map(|(k, v)| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Sets what `other` reports, keeping the rest.
    pub(crate) fn merge(&mut self, other: LoaderSettings) {
        for (k, v) in other.settings {
            match self.settings.iter_mut().find(|(name, _)| *name == k) {
                Some(slot) => slot.1 = v,
                None => self.settings.push((k, v)),
            }
        }
        self.settings.sort_by_key(|(k, _)| {
            LOADER_ATTRIBUTES
                .iter()
                .position(|a| a == k)
                .unwrap_or(usize::MAX)
        });
    }
}

/// Bounds of the [`FrameworkHistory`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FrameworkLimits {
    pub max_processes: usize,
    /// Allocator points per (process, device), and step/data_wait timings per process, each.
    pub max_points: usize,
    pub max_age: Duration,
}

impl Default for FrameworkLimits {
    fn default() -> Self {
        Self {
            max_processes: 256,
            max_points: 2048,
            max_age: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct ProcessRecord {
    /// By `hw.id` (`""` when the sender gave none).
    allocator: HashMap<String, VecDeque<AllocatorPoint>>,
    steps: VecDeque<SpanTiming>,
    data_waits: VecDeque<SpanTiming>,
    /// `pytorch.distributed.collective.wait` of each step: `end` is the step's end.
    collective_waits: VecDeque<SpanTiming>,
    loader: LoaderSettings,
    /// What the process said about itself on its resources (its service, rank and job).
    sent: SentIdentity,
    /// The end of the first step heard from this process (how long it has been observed, beyond
    /// what the bounded rings still hold).
    first_step_end: Option<SystemTime>,
    last_heard: Option<SystemTime>,
    /// The newest live state it sent (`pytorch.training.live`).
    live: Option<LiveReport>,
    /// Its newest steps in a row that carried no collective (none timed, or no figure at all).
    steps_without_collectives: u64,
    /// Whether its newest step carried the collective figures (the companion times them).
    collectives_timed: bool,
}

/// Bounded per-process framework history. See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrameworkHistory {
    limits: FrameworkLimits,
    processes: HashMap<u32, ProcessRecord>,
    /// Ranks of a job whose process left, newest last (`retain`).
    departed: VecDeque<DepartedRank>,
}

fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, max: usize) {
    ring.push_back(item);
    while ring.len() > max {
        ring.pop_front();
    }
}

impl FrameworkHistory {
    pub(crate) fn new(limits: FrameworkLimits) -> Self {
        Self {
            limits,
            processes: HashMap::new(),
            departed: VecDeque::new(),
        }
    }

    fn process(&mut self, pid: u32, now: SystemTime) -> &mut ProcessRecord {
        if !self.processes.contains_key(&pid) && self.processes.len() >= self.limits.max_processes {
            // Make room: the process heard from least recently goes.
            if let Some(oldest) = self
                .processes
                .iter()
                .min_by_key(|(p, r)| (r.last_heard, **p))
                .map(|(p, _)| *p)
            {
                self.processes.remove(&oldest);
            }
        }
        let record = self.processes.entry(pid).or_default();
        record.last_heard = Some(now);
        record
    }

    /// Records one allocator reading of process `pid` on device `hw_id`. Readings of the same
    /// time (the three gauges of one export) are merged into one point.
    pub(crate) fn record_allocator(&mut self, pid: u32, hw_id: &str, point: AllocatorPoint) {
        let max = self.limits.max_points;
        let ring = self
            .process(pid, point.at)
            .allocator
            .entry(hw_id.to_string())
            .or_default();
        match ring.iter_mut().rev().find(|p| p.at == point.at) {
            Some(same) => {
                same.allocated_bytes = point.allocated_bytes.or(same.allocated_bytes);
                same.reserved_bytes = point.reserved_bytes.or(same.reserved_bytes);
                same.max_allocated_bytes = point.max_allocated_bytes.or(same.max_allocated_bytes);
            }
            None => {
                // Requests can arrive out of order (retries): keep the ring sorted by time.
                let at = ring.partition_point(|p| p.at <= point.at);
                ring.insert(at, point);
                while ring.len() > max {
                    ring.pop_front();
                }
            }
        }
    }

    /// Records a finished `step` span of `pid`.
    pub(crate) fn record_step(&mut self, pid: u32, timing: SpanTiming) {
        let max = self.limits.max_points;
        let record = self.process(pid, timing.end);
        record.first_step_end = Some(
            record
                .first_step_end
                .map_or(timing.end, |t| t.min(timing.end)),
        );
        push_bounded(&mut record.steps, timing, max);
    }

    /// Records the collective wait of a step of `pid` that ended at `step_end`.
    pub(crate) fn record_collective_wait(
        &mut self,
        pid: u32,
        step_end: SystemTime,
        wait: Duration,
    ) {
        let max = self.limits.max_points;
        let timing = SpanTiming {
            end: step_end,
            duration: wait,
        };
        push_bounded(
            &mut self.process(pid, step_end).collective_waits,
            timing,
            max,
        );
    }

    /// Records what a resource `pid` sent says about the process (its service, rank and job),
    /// merged with what it said before: the first value of each stays (`SentIdentity::merge`).
    pub(crate) fn record_sent_identity(&mut self, pid: u32, sent: SentIdentity, at: SystemTime) {
        if !sent.is_empty() {
            self.process(pid, at).sent.merge(sent);
        }
    }

    /// Records what a step of `pid` said of its collectives: whether it carried the figures at
    /// all, and whether it saw any.
    pub(crate) fn record_step_collectives(
        &mut self,
        pid: u32,
        at: SystemTime,
        timed: bool,
        seen: bool,
    ) {
        let record = self.process(pid, at);
        record.collectives_timed = timed;
        record.steps_without_collectives = if seen {
            0
        } else {
            record.steps_without_collectives.saturating_add(1)
        };
    }

    /// Records a finished `data_wait` span of `pid`.
    pub(crate) fn record_data_wait(&mut self, pid: u32, timing: SpanTiming) {
        let max = self.limits.max_points;
        push_bounded(&mut self.process(pid, timing.end).data_waits, timing, max);
    }

    /// Records a live state `pid` sent; an older one than what is kept is ignored (retries), and
    /// a stack sent earlier for the same state stays.
    pub(crate) fn record_live(&mut self, pid: u32, mut report: LiveReport) {
        let record = self.process(pid, report.at);
        if let Some(kept) = &record.live {
            if kept.at > report.at {
                return;
            }
            if report.stack.is_none() && kept.same_state(&report) {
                report.stack.clone_from(&kept.stack);
            }
        }
        record.live = Some(report);
    }

    /// Records the DataLoader settings a run or epoch span of `pid` carried.
    pub(crate) fn record_loader(&mut self, pid: u32, settings: LoaderSettings, at: SystemTime) {
        if !settings.is_empty() {
            self.process(pid, at).loader.merge(settings);
        }
    }

    /// Keeps only `pids` (the processes NVML lists now) and drops what is older than `max_age`
    /// before `now`.
    pub(crate) fn retain(&mut self, pids: &[u32], now: SystemTime) {
        let departed = &mut self.departed;
        self.processes.retain(|pid, record| {
            let listed = pids.contains(pid);
            if let (false, Some(identity)) = (listed, &record.sent.distributed) {
                if identity.job_id.is_some() {
                    departed.push_back(DepartedRank {
                        pid: *pid,
                        identity: identity.clone(),
                        left_at: now,
                        last_live: record.live.clone(),
                    });
                }
            }
            listed
        });
        let kept_from = now.checked_sub(DEPARTED_KEPT);
        self.departed
            .retain(|d| kept_from.is_none_or(|from| d.left_at >= from) && !pids.contains(&d.pid));
        while self.departed.len() > DEPARTED_MAX {
            self.departed.pop_front();
        }
        let Some(oldest) = now.checked_sub(self.limits.max_age) else {
            return;
        };
        for record in self.processes.values_mut() {
            for ring in record.allocator.values_mut() {
                while ring.front().is_some_and(|p| p.at < oldest) {
                    ring.pop_front();
                }
            }
            record.allocator.retain(|_, ring| !ring.is_empty());
            for ring in [
                &mut record.steps,
                &mut record.data_waits,
                &mut record.collective_waits,
            ] {
                while ring.front().is_some_and(|s| s.end < oldest) {
                    ring.pop_front();
                }
            }
        }
    }

    /// Number of processes with framework data (for the unit tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.processes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// What each process said about itself through the receiver, by PID: what attribution
    /// adopts over the process's environment (`Workload::adopt_sent_identity`).
    pub(crate) fn sent_identities(&self) -> HashMap<u32, SentIdentity> {
        self.processes
            .iter()
            .filter(|(_, record)| !record.sent.is_empty())
            .map(|(pid, record)| (*pid, record.sent.clone()))
            .collect()
    }

    /// The evidence of `pids` for the rules. Step timings count when they ended within
    /// `step_lookback` before the newest step of the process, and only when that newest step
    /// ended within `step_lookback` before `now` (a loop that stopped sending is no evidence).
    pub(crate) fn evidence(
        &self,
        pids: &[u32],
        now: SystemTime,
        step_lookback: Duration,
    ) -> FrameworkEvidence {
        let mut evidence = FrameworkEvidence::default();
        for &pid in pids {
            let Some(record) = self.processes.get(&pid) else {
                continue;
            };
            let steps = step_evidence(record, now, step_lookback);
            let allocator: HashMap<String, Vec<AllocatorPoint>> = record
                .allocator
                .iter()
                .map(|(id, ring)| (id.clone(), ring.iter().copied().collect()))
                .collect();
            let mut durations: Vec<f64> = record
                .steps
                .iter()
                .map(|s| s.duration.as_secs_f64())
                .collect();
            durations.sort_by(f64::total_cmp);
            evidence.processes.insert(
                pid,
                ProcessEvidence {
                    allocator,
                    steps,
                    loader: record.loader.clone(),
                    cpu_quota_cores: None,
                    distributed: record.sent.distributed.clone(),
                    live: record.live.clone(),
                    steps_without_collectives: record.steps_without_collectives,
                    collectives_timed: record.collectives_timed,
                    last_step_end: record.steps.iter().map(|s| s.end).max(),
                    step_seconds_median: durations.get(durations.len() / 2).copied(),
                },
            );
        }
        evidence.departed = self.departed.iter().cloned().collect();
        evidence
    }
}

fn step_evidence(
    record: &ProcessRecord,
    now: SystemTime,
    lookback: Duration,
) -> Option<StepEvidence> {
    let newest = record.steps.iter().map(|s| s.end).max()?;
    if now.duration_since(newest).unwrap_or_default() > lookback {
        return None;
    }
    let from = newest.checked_sub(lookback)?;
    let in_range = |s: &&SpanTiming| s.end >= from && s.end <= newest;
    let steps: Vec<&SpanTiming> = record.steps.iter().filter(in_range).collect();
    let step_total: f64 = steps.iter().map(|s| s.duration.as_secs_f64()).sum();
    if step_total <= 0.0 {
        return None;
    }
    let wait_total: f64 = record
        .data_waits
        .iter()
        .filter(in_range)
        .map(|s| s.duration.as_secs_f64())
        .sum();
    let first = steps
        .iter()
        .map(|s| s.end.checked_sub(s.duration).unwrap_or(s.end))
        .min()
        .unwrap_or(newest);
    let collective: Vec<f64> = record
        .collective_waits
        .iter()
        .filter(in_range)
        .map(|s| s.duration.as_secs_f64())
        .collect();
    let count = steps.len() as f64;
    let collective_total: f64 = collective.iter().sum();
    Some(StepEvidence {
        // A data_wait that began before the first counted step's own data_wait can push the sum
        // just past the steps' at the edge; the ratio is a share, so it is capped at 1.
        data_wait_ratio: (wait_total / step_total).min(1.0),
        steps: steps.len(),
        observed_seconds: newest
            .duration_since(first)
            .unwrap_or_default()
            .as_secs_f64(),
        step_seconds_mean: step_total / count,
        data_wait_seconds_mean: wait_total / count,
        newest_end: Some(newest),
        // Only when every counted step said how long it waited: a mix would understate it.
        collective_wait_seconds_mean: (collective.len() == steps.len())
            .then(|| collective_total / count),
        heard_seconds: record
            .first_step_end
            .and_then(|f| newest.duration_since(f).ok())
            .map_or(0.0, |d| d.as_secs_f64()),
    })
}

/// Step timings over the recent steps: the share spent waiting on the DataLoader, and the means
/// the distributed rules compare across ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepEvidence {
    pub data_wait_ratio: f64,
    /// Step spans it is computed from.
    pub steps: usize,
    /// From the start of the first counted step to the end of the last.
    pub observed_seconds: f64,
    pub step_seconds_mean: f64,
    pub data_wait_seconds_mean: f64,
    /// Mean `pytorch.distributed.collective.wait` per step, when every counted step carried it.
    pub collective_wait_seconds_mean: Option<f64>,
    /// From the end of the first step ever heard from the process to the newest (not bounded by
    /// the lookback): how long the process has been observed training.
    pub heard_seconds: f64,
    /// When its newest step ended (`None` only in tests' hand-made evidence).
    pub newest_end: Option<SystemTime>,
}

impl StepEvidence {
    /// Mean seconds of a step outside collectives (data wait, compute, the rest of the loop).
    pub(crate) fn busy_seconds_mean(&self) -> Option<f64> {
        self.collective_wait_seconds_mean
            .map(|w| (self.step_seconds_mean - w).max(0.0))
    }

    /// Share of step time spent with a collective in flight.
    pub(crate) fn collective_wait_ratio(&self) -> Option<f64> {
        let wait = self.collective_wait_seconds_mean?;
        (self.step_seconds_mean > 0.0).then(|| (wait / self.step_seconds_mean).min(1.0))
    }
}

/// What the framework said about one process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessEvidence {
    /// Allocator readings by `hw.id` (`""`: the sender named no device), oldest first.
    pub allocator: HashMap<String, Vec<AllocatorPoint>>,
    pub steps: Option<StepEvidence>,
    pub loader: LoaderSettings,
    /// CPUs the process's cgroup may use (`cpu.max` / `cpu.cfs_quota_us`), when limited.
    pub cpu_quota_cores: Option<f64>,
    /// Its rank and job, when the companion reported them.
    pub distributed: Option<DistributedIdentity>,
    /// Where its loop was, the last time it said (only while a state lasts: see `live`).
    pub live: Option<LiveReport>,
    /// The end of its newest step, however long ago (unlike `steps`, which only counts recent
    /// ones).
    pub last_step_end: Option<SystemTime>,
    /// The median duration of the steps it sent (those still kept).
    pub step_seconds_median: Option<f64>,
    /// Its newest steps in a row with no collective seen.
    pub steps_without_collectives: u64,
    /// Whether its steps carry the collective figures at all.
    pub collectives_timed: bool,
}

impl ProcessEvidence {
    /// The allocator readings of the process on `device_uuid`; readings without a device count
    /// when the process uses exactly one GPU (`only_device`).
    pub(crate) fn allocator_on(
        &self,
        device_uuid: &str,
        only_device: bool,
    ) -> Option<&[AllocatorPoint]> {
        self.allocator
            .get(device_uuid)
            .or_else(|| only_device.then(|| self.allocator.get("")).flatten())
            .map(Vec::as_slice)
            .filter(|points| !points.is_empty())
    }
}

/// The framework evidence of one window, by host PID: the value the rules read
/// (`rules::Inputs::framework`). Empty without a receiver or without framework telemetry, and
/// the rules then reason on NVML and procfs alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameworkEvidence {
    pub processes: HashMap<u32, ProcessEvidence>,
    /// Ranks of a job whose process left within the last hour, oldest first.
    pub departed: Vec<DepartedRank>,
}

impl FrameworkEvidence {
    pub(crate) fn process(&self, pid: u32) -> Option<&ProcessEvidence> {
        self.processes.get(&pid)
    }
}

/// The history shared between the receiver (writer) and the analyzer (reader); the lock is held
/// for the few microseconds of a record or of taking the evidence.
#[derive(Debug, Clone, Default)]
pub struct FrameworkHandle(Arc<Mutex<FrameworkHistory>>);

impl FrameworkHandle {
    pub(crate) fn new(limits: FrameworkLimits) -> Self {
        Self(Arc::new(Mutex::new(FrameworkHistory::new(limits))))
    }

    /// The history; a panic in another holder does not make it unusable (the data is plain).
    pub(crate) fn lock(&self) -> MutexGuard<'_, FrameworkHistory> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn t(s: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_secs_f64(s)
    }

    #[test]
    fn gauges_of_one_export_merge_into_one_point_and_stay_sorted() {
        let mut h = FrameworkHistory::default();
        let point = |at, a, r, m| AllocatorPoint {
            at: t(at),
            allocated_bytes: a,
            reserved_bytes: r,
            max_allocated_bytes: m,
        };
        h.record_allocator(7, "GPU-a", point(2.0, Some(10), None, None));
        h.record_allocator(7, "GPU-a", point(2.0, None, Some(20), None));
        h.record_allocator(7, "GPU-a", point(1.0, Some(5), Some(8), Some(6)));
        let e = h.evidence(&[7], t(3.0), Duration::from_secs(60));
        let points = e.process(7).unwrap().allocator_on("GPU-a", false).unwrap();
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].at, t(1.0));
        assert_eq!(
            (points[1].allocated_bytes, points[1].reserved_bytes),
            (Some(10), Some(20))
        );
        assert!(e.process(8).is_none());
    }

    #[test]
    fn data_wait_ratio_is_the_share_of_recent_step_time() {
        let mut h = FrameworkHistory::default();
        for i in 0..10 {
            let end = t(f64::from(i) + 1.0);
            h.record_step(
                1,
                SpanTiming {
                    end,
                    duration: Duration::from_secs(1),
                },
            );
            h.record_data_wait(
                1,
                SpanTiming {
                    end: end - Duration::from_millis(300),
                    duration: Duration::from_millis(700),
                },
            );
        }
        let e = h.evidence(&[1], t(11.0), Duration::from_secs(60));
        let steps = e.process(1).unwrap().steps.unwrap();
        assert!((steps.data_wait_ratio - 0.7).abs() < 1e-9, "{steps:?}");
        assert_eq!(steps.steps, 10);
        assert!((steps.observed_seconds - 10.0).abs() < 1e-9);
        // A loop that stopped sending a while ago is no evidence any more.
        let stale = h.evidence(&[1], t(200.0), Duration::from_secs(60));
        assert_eq!(stale.process(1).unwrap().steps, None);
    }

    #[test]
    fn bounds_hold_and_absent_processes_are_forgotten() {
        let mut h = FrameworkHistory::new(FrameworkLimits {
            max_processes: 2,
            max_points: 3,
            max_age: Duration::from_secs(100),
        });
        for i in 0..10 {
            h.record_step(
                1,
                SpanTiming {
                    end: t(f64::from(i)),
                    duration: Duration::from_secs(1),
                },
            );
        }
        h.record_step(
            2,
            SpanTiming {
                end: t(20.0),
                duration: Duration::from_secs(1),
            },
        );
        h.record_step(
            3,
            SpanTiming {
                end: t(21.0),
                duration: Duration::from_secs(1),
            },
        );
        assert_eq!(h.len(), 2, "the least recently heard from (1) made room");
        assert_eq!(h.processes[&2].steps.len(), 1);
        h.retain(&[3], t(21.0));
        assert_eq!(h.len(), 1);
        h.retain(&[3], t(500.0));
        assert!(h.processes[&3].steps.is_empty(), "older than max_age");
        let mut ring = VecDeque::new();
        for i in 0..5 {
            push_bounded(&mut ring, i, 3);
        }
        assert_eq!(ring, [2, 3, 4]);
    }

    #[test]
    fn a_rank_whose_process_left_is_kept_as_departed_with_its_job() {
        let mut h = FrameworkHistory::new(FrameworkLimits::default());
        let rank = |rank: u32, job: Option<&str>| SentIdentity {
            distributed: Some(DistributedIdentity {
                rank,
                local_rank: None,
                world_size: Some(4),
                backend: None,
                job_id: job.map(str::to_string),
            }),
            ..Default::default()
        };
        for (pid, job) in [(10, Some("j")), (11, Some("j")), (12, None)] {
            h.record_sent_identity(pid, rank(pid - 10, job), t(1.0));
            h.record_step(
                pid,
                SpanTiming {
                    end: t(5.0),
                    duration: Duration::from_secs(1),
                },
            );
        }
        // 11 (rank 1 of job j) and 12 (a rank without a job) leave.
        h.retain(&[10], t(10.0));
        let evidence = h.evidence(&[10], t(10.0), Duration::from_secs(60));
        assert_eq!(evidence.departed.len(), 1, "{:?}", evidence.departed);
        let gone = &evidence.departed[0];
        assert_eq!(
            (gone.pid, gone.identity.rank, gone.left_at),
            (11, 1, t(10.0))
        );
        // Kept an hour, and forgotten when its PID is listed again (reused).
        h.retain(&[10, 11], t(11.0));
        assert!(h
            .evidence(&[10], t(11.0), Duration::from_secs(60))
            .departed
            .is_empty());
    }

    #[test]
    fn loader_settings_merge_in_a_fixed_order_and_layers_join_sorted() {
        let mut l = LoaderSettings::default();
        l.merge(LoaderSettings {
            settings: vec![("pytorch.dataloader.pin_memory".into(), "false".into())],
        });
        l.merge(LoaderSettings {
            settings: vec![
                ("pytorch.dataloader.num_workers".into(), "2".into()),
                ("pytorch.dataloader.pin_memory".into(), "true".into()),
            ],
        });
        assert_eq!(l.describe(), "num_workers=2, pin_memory=true");
        assert_eq!(
            Layer::join(&[Layer::Spans, Layer::Nvml, Layer::Procfs, Layer::Nvml]),
            "nvml,procfs,spans"
        );
    }
}
