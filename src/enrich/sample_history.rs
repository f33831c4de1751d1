//! The per-process GPU history that received spans are enriched from: a ring of compact frames,
//! one per NVML sample (time; per device its UUID, utilisation and power; per GPU process its
//! host PID, device, memory, SM utilisation and energy weight), bounded by a duration (`--enrich-history`, default
//! 10 min) and by a frame count derived from it, plus what is known of each PID's identity
//! (container, PID-namespace PID, `service.instance.id`) to find the process a span's resource
//! names.
//!
//! ## What a span gets
//! A frame sampled at `t` stands for the period since the frame before it, `(t_prev, t]`
//! (`t - interval` for the first), since NVML's utilisation counters describe the time since the
//! previous read. The frames whose period overlaps the span's `[start, end]` are used, each
//! weighted by the length of the overlap:
//! - utilisation (device and the process's SM share): overlap-weighted mean and max over
//!   (frame, device) pairs of the process's devices;
//! - memory: the largest per-frame sum over the process's devices;
//! - power: the device's power × the process's energy weight in that sample, the weight being
//!   what the exported `process.gpu.energy` charges (`crate::attribution::energy_share`, one
//!   rule for both): its absolute busy share (its SM utilisation, a sample without a figure
//!   counting as idle where the device gives figures; the device's utilisation when it is alone
//!   on a GPU without them; on MIG, alone in its GPU instance, the instance's graphics-engine
//!   activity × the instance's slice of the GPU). Idle power is charged to no span. Energy is
//!   that power × overlap, summed; both are left out when any pair cannot be attributed (power
//!   unknown, or an activity that is not knowable: several processes without figures, or
//!   sharing a MIG instance). The weight is judged per sample, the export per window: over a
//!   window whose power is steady the two figures are equal; with power changing inside a
//!   window, the span's is the finer one.
//!
//! ## Cost
//! A frame is about 48 bytes plus ~40 per device and ~32 per process sample; 10 minutes of 1 s
//! samples of 8 GPUs and 16 processes is ~0.5 MiB, of 8 GPUs and 64 processes 1.65 MiB (the
//! budget test; docs/resources.md). [`SampleHistory::approx_bytes`] reports it.
//!
//! Readers and the one writer share it through [`SampleHistoryHandle`] (an `RwLock` held for
//! microseconds, and a `watch` channel of the newest sample's time for spans that end after it).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::attribution::energy_share::{
    energy_weights, mig_gpu_share, whole_gpu_activity, EnergyClaim,
};
use crate::attribution::{AttributedWindow, Workload};
use crate::sampling::model::unix_nanos::to_nanos;
use crate::sampling::{DeviceSample, DeviceStatus, ProcessSample, Snapshot};
use crate::schema::attributes::AttributeId as A;
use crate::schema::{DeviceField, GpmField};

/// One device in one frame.
#[derive(Debug, Clone)]
struct DeviceFrame {
    uuid: Arc<str>,
    utilization: Option<f32>,
    power_watts: Option<f32>,
}

/// One process on one device in one frame.
#[derive(Debug, Clone, Copy)]
struct ProcessFrame {
    pid: u32,
    /// Index into the frame's devices.
    device: u16,
    memory_bytes: Option<u64>,
    sm: Option<f32>,
    /// The share of the device's power charged to the process in this sample; `None` where its
    /// activity or its slice of the GPU is not knowable.
    energy_weight: Option<f32>,
}

#[derive(Debug, Clone)]
struct Frame {
    at: u64,
    devices: Box<[DeviceFrame]>,
    processes: Box<[ProcessFrame]>,
}

/// What is known of a host PID's identity, to match a span's resource against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// PID inside the process's own PID namespace: what its SDK reports as `process.pid`.
    pub vpid: Option<u32>,
    /// `container.id`, lower-case.
    pub container_id: Option<String>,
    /// `service.instance.id` from the process's own `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_instance_id: Option<String>,
}

impl ProcessIdentity {
    /// The identity attribution resolved for a workload.
    pub(crate) fn of_workload(workload: &Workload) -> Self {
        Self {
            vpid: workload.vpid,
            container_id: workload
                .container_id
                .as_ref()
                .map(|c| c.to_ascii_lowercase()),
            service_instance_id: workload
                .resource_attributes
                .iter()
                .find(|(k, _)| k == A::ServiceInstanceId.key())
                .map(|(_, v)| v.clone()),
        }
    }
}

/// A process's GPU usage over one span, ready to become span attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUsage {
    /// `hw.id` of the devices the process was seen on, sorted.
    pub devices: Vec<String>,
    /// Device utilisation (0–1) of those devices.
    pub utilization_mean: Option<f64>,
    pub utilization_max: Option<f64>,
    /// The process's own SM utilisation (0–1), per device.
    pub process_utilization_mean: Option<f64>,
    pub process_utilization_max: Option<f64>,
    /// Largest GPU memory the process held, summed over its devices.
    pub memory_peak_bytes: Option<u64>,
    /// Attributable power, mean over the span, in watts.
    pub power_mean_watts: Option<f64>,
    /// Attributable energy over the span, in joules.
    pub energy_joules: Option<f64>,
    /// Frames the figures come from.
    pub samples: u32,
}

/// The ring itself: no locks, no clocks; [`SampleHistoryHandle`] shares it.
#[derive(Debug)]
pub struct SampleHistory {
    frames: VecDeque<Frame>,
    /// Kept frames reach back this far from the newest.
    retention: Duration,
    /// Bound on the number of frames, whatever the timestamps.
    max_frames: usize,
    /// The sample interval: the period the first frame stands for.
    interval: Duration,
    identities: HashMap<u32, ProcessIdentity>,
    /// The newest frame each PID was in, to forget identities with the frames.
    last_seen: HashMap<u32, u64>,
}

impl SampleHistory {
    /// An empty history keeping `retention` of samples taken every `interval`.
    pub fn new(retention: Duration, interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        // Samples come at most every interval; twice as many frames leave room for jitter.
        let max_frames = (retention.as_nanos() / interval.as_nanos()).saturating_mul(2) + 2;
        Self {
            frames: VecDeque::new(),
            retention,
            max_frames: usize::try_from(max_frames).unwrap_or(usize::MAX),
            interval,
            identities: HashMap::new(),
            last_seen: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Newest sample time, Unix nanoseconds.
    pub(crate) fn newest(&self) -> Option<u64> {
        self.frames.back().map(|f| f.at)
    }

    /// Oldest sample time, Unix nanoseconds.
    pub(crate) fn oldest(&self) -> Option<u64> {
        self.frames.front().map(|f| f.at)
    }

    /// Adds one sample. A sample older than the newest one (the wall clock was stepped back)
    /// drops the frames "from the future", since spans are timed by the same clock.
    pub fn record(&mut self, snapshot: &Snapshot) {
        let at = to_nanos(snapshot.at);
        while self.frames.back().is_some_and(|f| f.at >= at) {
            self.frames.pop_back();
        }
        let mut index: HashMap<&str, u16> = HashMap::with_capacity(snapshot.devices.len());
        let mut devices: Vec<DeviceFrame> = Vec::with_capacity(snapshot.devices.len());
        for device in &snapshot.devices {
            if device.status != DeviceStatus::Ok {
                continue;
            }
            let Ok(i) = u16::try_from(devices.len()) else {
                break;
            };
            index.insert(device.info.uuid.as_str(), i);
            devices.push(DeviceFrame {
                // Reuse the previous frame's Arc so that the UUIDs are stored once.
                uuid: self.shared_uuid(&device.info.uuid),
                utilization: device.get(DeviceField::UtilizationGpu).map(|v| v as f32),
                power_watts: device.get(DeviceField::Power).map(|v| v as f32),
            });
        }
        let mut processes = Vec::with_capacity(snapshot.processes.len());
        for device in snapshot
            .devices
            .iter()
            .filter(|d| index.contains_key(d.info.uuid.as_str()))
        {
            let on_device: Vec<&ProcessSample> = snapshot
                .processes
                .iter()
                .filter(|p| p.device_uuid == device.info.uuid)
                .collect();
            let weights = sample_energy_weights(device, &on_device);
            for (process, weight) in on_device.into_iter().zip(weights) {
                processes.push(ProcessFrame {
                    pid: process.pid,
                    device: index[device.info.uuid.as_str()],
                    memory_bytes: process.gpu_memory_bytes,
                    sm: process.sm_utilization.map(|v| v as f32),
                    energy_weight: weight.map(|w| w as f32),
                });
                self.last_seen.insert(process.pid, at);
            }
        }
        self.frames.push_back(Frame {
            at,
            devices: devices.into_boxed_slice(),
            processes: processes.into_boxed_slice(),
        });
        let horizon = at.saturating_sub(self.retention.as_nanos() as u64);
        while self.frames.len() > self.max_frames
            || self.frames.front().is_some_and(|f| f.at < horizon)
        {
            self.frames.pop_front();
        }
        let oldest = self.oldest().unwrap_or(at);
        if self.last_seen.values().any(|&t| t < oldest) {
            self.last_seen.retain(|_, t| *t >= oldest);
            let seen = &self.last_seen;
            self.identities.retain(|pid, _| seen.contains_key(pid));
        }
    }

    fn shared_uuid(&self, uuid: &str) -> Arc<str> {
        self.frames
            .back()
            .and_then(|f| f.devices.iter().find(|d| &*d.uuid == uuid))
            .map_or_else(|| Arc::from(uuid), |d| Arc::clone(&d.uuid))
    }

    /// Remembers what attribution resolved for these PIDs.
    pub(crate) fn note_identity(&mut self, pid: u32, identity: ProcessIdentity) {
        self.identities.insert(pid, identity);
    }

    /// PIDs in the history whose identity is not known yet.
    pub(crate) fn unidentified(&self) -> Vec<u32> {
        self.last_seen
            .keys()
            .filter(|pid| !self.identities.contains_key(pid))
            .copied()
            .collect()
    }

    /// The identities of the PIDs in the history.
    pub(crate) fn identities(&self) -> impl Iterator<Item = (u32, &ProcessIdentity)> {
        self.identities
            .iter()
            .filter(|(pid, _)| self.last_seen.contains_key(pid))
            .map(|(pid, id)| (*pid, id))
    }

    /// Whether `pid` was seen on a GPU within the history.
    pub(crate) fn knows(&self, pid: u32) -> bool {
        self.last_seen.contains_key(&pid)
    }

    /// The GPU usage of `pid` over `[start, end]` (Unix nanoseconds), or `None` when the
    /// history does not reach back to `start` or the process was on no GPU then.
    pub(crate) fn usage(&self, pid: u32, start: u64, end: u64) -> Option<GpuUsage> {
        let (start, end) = (start.min(end), start.max(end));
        let first = self.frames.front()?;
        let first_period_start = first.at.saturating_sub(self.interval.as_nanos() as u64);
        if start < first_period_start {
            return None;
        }
        let from = self.frames.partition_point(|f| f.at <= start);
        let mut acc = Accumulator::default();
        let mut prev_at = if from == 0 {
            first_period_start
        } else {
            self.frames[from - 1].at
        };
        for (i, frame) in self.frames.range(from..).enumerate() {
            if i > 0 && prev_at >= end {
                break;
            }
            let overlap = frame.at.min(end).saturating_sub(prev_at.max(start));
            // A zero-length span still takes the one frame that covers it.
            let weight = overlap.max(1) as f64;
            acc.frame(frame, pid, weight, overlap);
            prev_at = frame.at;
        }
        acc.finish(end - start)
    }

    /// Rough heap bytes held, for the benchmark and the docs.
    pub fn approx_bytes(&self) -> usize {
        // The ring's slots as allocated (a VecDeque grows by doubling), then each frame's own.
        let frames: usize = self.frames.capacity() * std::mem::size_of::<Frame>()
            + self
                .frames
                .iter()
                .map(|f| {
                    f.devices.len() * std::mem::size_of::<DeviceFrame>()
                        + f.processes.len() * std::mem::size_of::<ProcessFrame>()
                })
                .sum::<usize>();
        let identities = self.identities.len() * (std::mem::size_of::<ProcessIdentity>() + 96);
        frames + identities + self.last_seen.len() * 16
    }
}

/// The energy weight of each of `on_device` (the processes of `device` in one sample, in
/// order), by the accountant's rule ([`crate::attribution::energy_share`]) applied to one sample:
/// on a whole GPU its SM utilisation (or the GPU's, alone without per-process figures); on MIG,
/// alone in its GPU instance in this sample, the instance's graphics-engine activity × its slice.
fn sample_energy_weights(device: &DeviceSample, on_device: &[&ProcessSample]) -> Vec<Option<f64>> {
    let per_process = on_device.iter().any(|p| p.sm_utilization.is_some());
    let gpu_memory = device
        .info
        .memory_total_bytes
        .map(|b| b as f64)
        .or_else(|| device.get(DeviceField::MemoryTotal));
    let claims: Vec<EnergyClaim> = on_device
        .iter()
        .map(|p| {
            let Some(mig) = &p.mig else {
                let (activity, _) = whole_gpu_activity(
                    p.sm_utilization,
                    1,
                    per_process,
                    on_device.len(),
                    device.get(DeviceField::UtilizationGpu),
                );
                return EnergyClaim {
                    activity,
                    gpu_share: Some(1.0),
                    presence: 1.0,
                };
            };
            let instance = device
                .mig_instances
                .iter()
                .find(|m| m.info.uuid == mig.uuid);
            // GPM is measured per GPU instance: alone means no other process in any of its
            // compute instances.
            let alone = on_device.iter().all(|other| {
                other.pid == p.pid
                    || other
                        .mig
                        .as_ref()
                        .is_none_or(|m| m.gpu_instance_id != mig.gpu_instance_id)
            });
            EnergyClaim {
                activity: instance
                    .filter(|_| alone)
                    .and_then(|m| m.gpm.get(GpmField::GraphicsActivity)),
                gpu_share: instance.and_then(|m| mig_gpu_share(m.memory_total_bytes, gpu_memory)),
                presence: 1.0,
            }
        })
        .collect();
    energy_weights(&claims)
}

/// Running sums of one span's query.
#[derive(Default)]
struct Accumulator {
    devices: BTreeSet<Arc<str>>,
    util: Weighted,
    process_util: Weighted,
    memory_peak: Option<u64>,
    energy_joules: f64,
    power_weighted: Weighted,
    unattributable: bool,
    samples: u32,
}

#[derive(Default)]
struct Weighted {
    sum: f64,
    weight: f64,
    max: Option<f64>,
}

impl Weighted {
    fn add(&mut self, value: f64, weight: f64) {
        self.sum += value * weight;
        self.weight += weight;
        self.max = Some(self.max.map_or(value, |m| m.max(value)));
    }

    fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

impl Accumulator {
    fn frame(&mut self, frame: &Frame, pid: u32, weight_ns: f64, overlap_ns: u64) {
        let mut memory: Option<u64> = None;
        let mut present = false;
        for p in frame.processes.iter().filter(|p| p.pid == pid) {
            present = true;
            let device = &frame.devices[usize::from(p.device)];
            self.devices.insert(Arc::clone(&device.uuid));
            if let Some(u) = device.utilization {
                self.util.add(f64::from(u), weight_ns);
            }
            if let Some(sm) = p.sm {
                self.process_util.add(f64::from(sm), weight_ns);
            }
            if let Some(m) = p.memory_bytes {
                memory = Some(memory.unwrap_or(0) + m);
            }
            match (device.power_watts, p.energy_weight) {
                (Some(power), Some(weight)) => {
                    let watts = f64::from(power) * f64::from(weight);
                    self.energy_joules += watts * overlap_ns as f64 / 1e9;
                    self.power_weighted.add(watts, weight_ns);
                }
                _ => self.unattributable = true,
            }
        }
        if present {
            self.samples += 1;
        }
        if let Some(m) = memory {
            self.memory_peak = Some(self.memory_peak.map_or(m, |p| p.max(m)));
        }
    }

    fn finish(self, span_ns: u64) -> Option<GpuUsage> {
        if self.samples == 0 {
            return None;
        }
        let attributable = !self.unattributable && self.power_weighted.weight > 0.0;
        let power_mean = if span_ns > 0 {
            Some(self.energy_joules / (span_ns as f64 / 1e9))
        } else {
            self.power_weighted.mean()
        };
        Some(GpuUsage {
            devices: self.devices.iter().map(|d| d.to_string()).collect(),
            utilization_mean: self.util.mean().map(round6),
            utilization_max: self.util.max.map(round6),
            process_utilization_mean: self.process_util.mean().map(round6),
            process_utilization_max: self.process_util.max.map(round6),
            memory_peak_bytes: self.memory_peak,
            power_mean_watts: power_mean.filter(|_| attributable).map(round6),
            energy_joules: attributable.then_some(round6(self.energy_joules)),
            samples: self.samples,
        })
    }
}

/// Six decimals: frames keep `f32`s to halve their size, and without rounding an NVML 55 %
/// would come out as 0.550000011920929. A microwatt or micro-ratio is far below what NVML
/// resolves.
fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// The history shared between the pipeline (one writer, once per sample) and the receivers.
#[derive(Debug, Clone)]
pub struct SampleHistoryHandle {
    inner: Arc<RwLock<SampleHistory>>,
    newest: Arc<watch::Sender<u64>>,
}

impl SampleHistoryHandle {
    pub fn new(retention: Duration, interval: Duration) -> Self {
        Self {
            inner: Arc::new(RwLock::new(SampleHistory::new(retention, interval))),
            newest: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Adds a sample and wakes the spans waiting for one.
    pub fn record(&self, snapshot: &Snapshot) {
        let newest = {
            let mut history = self.write();
            history.record(snapshot);
            history.newest().unwrap_or(0)
        };
        self.newest.send_replace(newest);
    }

    /// Takes the identities attribution resolved in an export window.
    pub(crate) fn note_window(&self, attributed: &AttributedWindow) {
        let mut history = self.write();
        for workload in attributed.workloads.values() {
            history.note_identity(workload.pid, ProcessIdentity::of_workload(workload));
        }
    }

    /// Waits until a sample at or after `until` (Unix nanoseconds) is in, at most `max_wait`.
    /// Returns whether one is.
    pub(crate) async fn wait_for_sample(&self, until: u64, max_wait: Duration) -> bool {
        let mut rx = self.newest.subscribe();
        let reached = tokio::time::timeout(max_wait, rx.wait_for(|&newest| newest >= until))
            .await
            .is_ok_and(|r| r.is_ok());
        reached
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, SampleHistory> {
        // Every write leaves the ring consistent; a panicked writer must not stop enrichment.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, SampleHistory> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::sampling::{DeviceInfo, DeviceSample, ProcessKind, ProcessSample};

    pub(crate) const S: u64 = 1_000_000_000;

    pub(crate) fn device(uuid: &str, util: f64, power: f64) -> DeviceSample {
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: uuid.into(),
            name: "sim".into(),
            pci_bus_id: "0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: None,
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        });
        let mut d = DeviceSample::empty(info, DeviceStatus::Ok);
        d.set(DeviceField::UtilizationGpu, Some(util));
        d.set(DeviceField::Power, Some(power));
        d
    }

    pub(crate) fn process(pid: u32, uuid: &str, mem: u64, sm: Option<f64>) -> ProcessSample {
        ProcessSample {
            pid,
            device_index: 0,
            device_uuid: uuid.into(),
            kind: ProcessKind::Compute,
            gpu_memory_bytes: Some(mem),
            sm_utilization: sm,
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
            mig: None,
        }
    }

    pub(crate) fn snapshot(
        at_s: u64,
        devices: Vec<DeviceSample>,
        processes: Vec<ProcessSample>,
    ) -> Snapshot {
        Snapshot {
            at: UNIX_EPOCH + Duration::from_secs(at_s),
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            devices,
            processes,
            events: Vec::new(),
        }
    }

    /// The budget (docs/resources.md): the benchmark node, 8 GPUs × 64 processes sampled every
    /// second, for longer than the default 10 min retention, holds 601 frames and no more than
    /// the 1.75 MiB stated there (1.65 MiB measured).
    #[test]
    fn full_history_of_the_benchmark_node_stays_within_its_stated_budget() {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        let uuids: Vec<String> = (0..8).map(|d| format!("GPU-{d:036}")).collect();
        for t in 0..900 {
            let devices = uuids.iter().map(|u| device(u, 0.75, 450.0)).collect();
            let processes = (0..64)
                .map(|i| process(1000 + i, &uuids[i as usize % 8], 8 << 30, Some(0.12)))
                .collect();
            h.record(&snapshot(1_000 + t, devices, processes));
        }
        assert_eq!(h.len(), 601);
        let bytes = h.approx_bytes();
        assert!(bytes <= 1_835_008, "{bytes} B");
        assert!(
            bytes >= 601 * 64 * std::mem::size_of::<ProcessFrame>(),
            "{bytes} B"
        );
    }

    /// One sample per second from t=100 s: utilisation 0.2 until t=105, then 0.8; the process
    /// 42 is alone on GPU-a, with 1 GiB then 3 GiB.
    fn stepped() -> SampleHistory {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=110 {
            let (util, mem) = if t <= 105 {
                (0.2, 1 << 30)
            } else {
                (0.8, 3 << 30)
            };
            h.record(&snapshot(
                t,
                vec![device("GPU-a", util, 100.0)],
                vec![process(42, "GPU-a", mem, Some(util))],
            ));
        }
        h
    }

    #[test]
    fn a_span_inside_one_step_gets_that_steps_values() {
        let h = stepped();
        let u = h.usage(42, 101 * S, 104 * S).unwrap();
        assert_eq!(u.devices, vec!["GPU-a".to_string()]);
        assert!((u.utilization_mean.unwrap() - 0.2).abs() < 1e-6, "{u:?}");
        assert!((u.utilization_max.unwrap() - 0.2).abs() < 1e-6);
        assert_eq!(u.memory_peak_bytes, Some(1 << 30));
        // Alone on the device and 20 % busy: 20 of its 100 W are charged to it, for 3 s; the
        // idle 80 W to no one.
        assert!((u.energy_joules.unwrap() - 60.0).abs() < 1e-3, "{u:?}");
        assert!((u.power_mean_watts.unwrap() - 20.0).abs() < 1e-3);
        assert_eq!(u.samples, 3);
    }

    #[test]
    fn a_span_across_the_step_is_weighted_by_time() {
        let h = stepped();
        // [104, 108]: frames 105 (0.2), 106..108 (0.8): one second at 0.2, three at 0.8.
        let u = h.usage(42, 104 * S, 108 * S).unwrap();
        assert!((u.utilization_mean.unwrap() - 0.65).abs() < 1e-6, "{u:?}");
        assert!((u.utilization_max.unwrap() - 0.8).abs() < 1e-6);
        assert_eq!(u.memory_peak_bytes, Some(3 << 30));
    }

    #[test]
    fn a_short_span_takes_the_frame_covering_it() {
        let h = stepped();
        let at = 107 * S + S / 2;
        let u = h.usage(42, at, at + 1000).unwrap();
        assert_eq!(u.samples, 1);
        assert!((u.utilization_mean.unwrap() - 0.8).abs() < 1e-6);
        assert!(
            (u.energy_joules.unwrap() - 80.0 * 1e-6).abs() < 1e-9,
            "{u:?}"
        );
    }

    #[test]
    fn unknown_processes_and_spans_older_than_the_history_get_nothing() {
        let h = stepped();
        assert_eq!(h.usage(7, 101 * S, 104 * S), None);
        assert_eq!(h.usage(42, 50 * S, 104 * S), None);
    }

    #[test]
    fn power_is_charged_by_absolute_busy_share_and_omitted_when_it_cannot_be() {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=103 {
            h.record(&snapshot(
                t,
                vec![device("GPU-a", 0.8, 200.0)],
                vec![
                    process(1, "GPU-a", 10, Some(0.6)),
                    process(2, "GPU-a", 10, Some(0.2)),
                    process(3, "GPU-a", 10, None),
                ],
            ));
        }
        let one = h.usage(1, 101 * S, 103 * S).unwrap();
        // 200 W × 0.6 = 120 W for 2 s; not 0.6/0.8 of the whole, which would charge idle power.
        assert!((one.energy_joules.unwrap() - 240.0).abs() < 1e-3, "{one:?}");
        assert!((one.process_utilization_mean.unwrap() - 0.6).abs() < 1e-6);
        // The device gives per-process figures: a process listed without one did not run.
        let three = h.usage(3, 101 * S, 103 * S).unwrap();
        assert_eq!(three.energy_joules, Some(0.0));
        assert!((three.utilization_mean.unwrap() - 0.8).abs() < 1e-6);

        // Two processes on a GPU without per-process figures: no share is knowable.
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=103 {
            h.record(&snapshot(
                t,
                vec![device("GPU-a", 0.8, 200.0)],
                vec![process(1, "GPU-a", 10, None), process(2, "GPU-a", 10, None)],
            ));
        }
        let one = h.usage(1, 101 * S, 103 * S).unwrap();
        assert_eq!((one.energy_joules, one.power_mean_watts), (None, None));
    }

    /// GPU-a at a steady 250 W (its energy counter agreeing) is time-sliced: pid 7 busy 30 %,
    /// 50 %, then absent for a sample (idle), pid 8 busy 10 %, so most of the power is idle.
    /// GPU-m (80 GiB, 400 W) is in MIG mode: pid 9 alone on GI 1 (40 GiB, graphics 60 %), pids
    /// 10 and 11 sharing GI 2. Each sample goes both into the span history and into the export
    /// path (window aggregator → accountant), in windows of five samples as `gpulse run` cuts
    /// them.
    fn both_paths() -> (SampleHistory, Vec<crate::attribution::Accounts>) {
        use crate::attribution::{GpuAccountant, Prices};
        use crate::sampling::{MigInstanceInfo, MigInstanceSample, ProcessMig, WindowAggregator};

        let gi = |id: u32| {
            Arc::new(MigInstanceInfo {
                uuid: format!("MIG-{id}"),
                name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
                parent_uuid: "GPU-m".into(),
                parent_index: 1,
                mig_index: id - 1,
                gpu_instance_id: id,
                compute_instance_id: 0,
            })
        };
        let on_gi = |pid: u32, id: u32| ProcessSample {
            mig: Some(ProcessMig {
                uuid: format!("MIG-{id}"),
                gpu_instance_id: id,
                compute_instance_id: 0,
            }),
            ..process(pid, "GPU-m", 1 << 30, None)
        };
        let mut history = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        let mut aggregator = WindowAggregator::new();
        let mut accountant = GpuAccountant::new(Prices::default());
        let mut exported = Vec::new();
        for t in 100..=110u64 {
            let mut sliced = device("GPU-a", 0.6, 250.0);
            sliced.set(DeviceField::Energy, Some(1000.0 + 250.0 * (t - 100) as f64));
            let mut mig = device("GPU-m", 0.0, 400.0);
            mig.set(DeviceField::UtilizationGpu, None);
            mig.set(DeviceField::Energy, Some(5000.0 + 400.0 * (t - 100) as f64));
            mig.set(DeviceField::MemoryTotal, Some((80u64 << 30) as f64));
            for id in [1, 2] {
                let mut gpm = crate::sampling::GpmActivity::default();
                gpm.set(
                    GpmField::GraphicsActivity,
                    Some(if id == 1 { 0.6 } else { 0.9 }),
                );
                mig.mig_instances.push(MigInstanceSample {
                    info: gi(id),
                    memory_used_bytes: Some(1 << 30),
                    memory_free_bytes: None,
                    memory_total_bytes: Some(40 << 30),
                    gpm,
                });
            }
            let mut processes = vec![process(8, "GPU-a", 1 << 30, Some(0.1))];
            match t % 3 {
                0 => processes.push(process(7, "GPU-a", 1 << 30, Some(0.3))),
                1 => processes.push(process(7, "GPU-a", 1 << 30, Some(0.5))),
                _ => {} // not listed: it did not run
            }
            processes.extend([on_gi(9, 1), on_gi(10, 2), on_gi(11, 2)]);
            let sample = snapshot(t, vec![sliced, mig], processes);
            history.record(&sample);
            aggregator.add(&sample);
            if t % 5 == 0 {
                let window = aggregator.take().expect("a window");
                exported.push(accountant.account(&window, &HashMap::new()));
            }
        }
        (history, exported)
    }

    #[test]
    fn a_spans_energy_equals_the_exported_energy_over_the_same_time() {
        let (history, exported) = both_paths();
        // Windows end at 100 (its first sample: no duration), 105 and 110.
        for (accounts, (start, end)) in exported[1..].iter().zip([(100, 105), (105, 110)]) {
            for (pid, uuid) in [(7, "GPU-a"), (8, "GPU-a"), (9, "GPU-m")] {
                let metric = accounts
                    .process(pid, uuid)
                    .and_then(|p| p.window_energy_joules)
                    .unwrap_or_else(|| panic!("pid {pid} charged nothing: {accounts:?}"));
                let span = history
                    .usage(pid, start * S, end * S)
                    .and_then(|u| u.energy_joules)
                    .unwrap_or_else(|| panic!("pid {pid}: no span energy"));
                assert!(
                    (span - metric).abs() <= 1e-4 * metric.max(1.0),
                    "pid {pid} over [{start}, {end}]: span {span} J, metric {metric} J"
                );
            }
            // A process sharing its MIG instance is charged nothing either way.
            assert_eq!(
                accounts.process(10, "GPU-m").unwrap().window_energy_joules,
                None
            );
            assert_eq!(
                history.usage(10, start * S, end * S).unwrap().energy_joules,
                None
            );
        }
        // The figures themselves over [105, 110]: pid 7 ran at 50 %, (absent), 30 %, 50 %,
        // (absent) → 1.3 busy seconds of 250 W, the idle rest charged to no one; pid 9:
        // 400 W × 0.6 × 0.5 (its slice) × 5 s.
        let seven = history.usage(7, 105 * S, 110 * S).unwrap();
        assert!(
            (seven.energy_joules.unwrap() - 325.0).abs() < 1e-3,
            "{seven:?}"
        );
        let nine = history.usage(9, 105 * S, 110 * S).unwrap();
        assert!(
            (nine.energy_joules.unwrap() - 600.0).abs() < 1e-3,
            "{nine:?}"
        );
    }

    #[test]
    fn a_process_on_two_devices_sums_memory_and_lists_both() {
        let mut h = SampleHistory::new(Duration::from_secs(600), Duration::from_secs(1));
        for t in 100..=102 {
            h.record(&snapshot(
                t,
                vec![device("GPU-b", 0.5, 100.0), device("GPU-a", 0.1, 50.0)],
                vec![
                    process(9, "GPU-a", 100, Some(0.1)),
                    process(9, "GPU-b", 200, Some(0.5)),
                ],
            ));
        }
        let u = h.usage(9, 101 * S, 102 * S).unwrap();
        assert_eq!(u.devices, vec!["GPU-a".to_string(), "GPU-b".to_string()]);
        assert_eq!(u.memory_peak_bytes, Some(300));
        assert!((u.utilization_mean.unwrap() - 0.3).abs() < 1e-6);
        assert!((u.utilization_max.unwrap() - 0.5).abs() < 1e-6);
        // 50 W × 0.1 + 100 W × 0.5, for 1 s.
        assert!((u.energy_joules.unwrap() - 55.0).abs() < 1e-3, "{u:?}");
    }

    #[test]
    fn retention_bounds_the_ring_and_forgets_identities() {
        let mut h = SampleHistory::new(Duration::from_secs(10), Duration::from_secs(1));
        h.record(&snapshot(
            0,
            vec![device("GPU-a", 0.1, 1.0)],
            vec![process(5, "GPU-a", 1, None)],
        ));
        h.note_identity(5, ProcessIdentity::default());
        for pid in 1000..1100 {
            h.record(&snapshot(
                u64::from(pid),
                vec![device("GPU-a", 0.1, 1.0)],
                vec![process(pid, "GPU-a", 1, None)],
            ));
        }
        assert_eq!(h.len(), 11);
        assert_eq!(h.oldest(), Some(1089 * S));
        assert!(!h.knows(5));
        assert_eq!(h.identities().count(), 0);
    }

    #[test]
    fn a_clock_stepped_back_drops_the_frames_after_it() {
        let mut h = stepped();
        h.record(&snapshot(103, vec![device("GPU-a", 0.5, 1.0)], vec![]));
        assert_eq!(h.newest(), Some(103 * S));
        assert_eq!(h.len(), 4);
    }

    #[tokio::test]
    async fn waiting_ends_with_the_sample_or_the_deadline() {
        let handle = SampleHistoryHandle::new(Duration::from_secs(60), Duration::from_secs(1));
        let now = SystemTime::now();
        assert!(
            !handle
                .wait_for_sample(to_nanos(now), Duration::from_millis(20))
                .await
        );
        let writer = handle.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut s = snapshot(0, vec![], vec![]);
            s.at = now + Duration::from_millis(1);
            writer.record(&s);
        });
        assert!(
            handle
                .wait_for_sample(to_nanos(now), Duration::from_secs(5))
                .await
        );
        task.await.unwrap();
    }
}
