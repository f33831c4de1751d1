//! Builds a [`Recording`] live, one snapshot at a time: each device's figures become a point of
//! its timeline, each GPU process a point of its memory track (marked as the command's or
//! another's by [`CommandTree`]), and the findings the diagnosis reports open and close marked
//! intervals.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use super::recording::{
    DevicePoint, DeviceTrack, FindingMark, MemoryPoint, ProcessTrack, Recording, IDLE_BELOW,
};
use super::tree::CommandTree;
use crate::attribution::procfs::ProcDir;
use crate::attribution::AttributedWindow;
use crate::diagnosis::tracker::FindingState;
use crate::diagnosis::{Finding, FindingEvent};
use crate::sampling::Snapshot;
use crate::schema::{DeviceField, GpmField};

/// Gaps longer than this many sample intervals are not counted as held or integrated (a
/// stalled sampler must not make a GPU look busy or idle for the whole gap).
const MAX_GAP_INTERVALS: f64 = 5.0;

/// Every this many samples the names of the GPU processes are read again.
const NAME_REFRESH_SAMPLES: u64 = 20;

/// Feeds a [`Recording`] from snapshots and finding events.
pub(crate) struct Recorder {
    recording: Recording,
    tree: Option<CommandTree>,
    proc_root: PathBuf,
    interval_seconds: f64,
    last_at: Option<f64>,
    /// Position of each device's track, by UUID.
    devices: HashMap<String, usize>,
    /// Position of each process track, by (pid, device UUID).
    processes: HashMap<(u32, String), usize>,
    /// Whether a PID is the command's, decided once per PID.
    in_command: HashMap<u32, bool>,
    /// Open finding marks by finding key.
    open: HashMap<String, usize>,
    last_energy: HashMap<String, f64>,
    /// The end of the last analysed window (where the next one's GPU time starts).
    last_window_end: Option<SystemTime>,
}

impl Recorder {
    /// A recorder for the command whose process is `root_pid` (none when it did not start).
    pub(crate) fn new(
        command: Vec<String>,
        root_pid: Option<u32>,
        proc_root: PathBuf,
        sample_interval: std::time::Duration,
    ) -> Self {
        let mut recording = Recording::empty(command, SystemTime::now());
        recording.sample_interval_seconds = Some(sample_interval.as_secs_f64());
        Self {
            recording,
            tree: root_pid.map(|pid| CommandTree::new(proc_root.clone(), pid)),
            proc_root,
            interval_seconds: sample_interval.as_secs_f64(),
            last_at: None,
            devices: HashMap::new(),
            processes: HashMap::new(),
            in_command: HashMap::new(),
            open: HashMap::new(),
            last_energy: HashMap::new(),
            last_window_end: None,
        }
    }

    /// Adds one sample of every device and process.
    pub(crate) fn add(&mut self, snapshot: &Snapshot) {
        let t = self.recording.offset(snapshot.at);
        // Time this sample stands for: since the previous one, capped so a gap is not filled.
        let dt = match self.last_at {
            Some(last) => (t - last).clamp(0.0, self.interval_seconds * MAX_GAP_INTERVALS),
            None => self.interval_seconds,
        };
        self.last_at = Some(t);
        self.recording.samples += 1;

        let mut held: HashMap<&str, bool> = HashMap::new();
        for p in &snapshot.processes {
            let mine = self.is_command(p.pid);
            let key = (p.pid, p.device_uuid.clone());
            let position = match self.processes.get(&key) {
                Some(&i) => i,
                None => {
                    self.recording.processes.push(ProcessTrack {
                        pid: p.pid,
                        device_index: p.device_index,
                        device_uuid: p.device_uuid.clone(),
                        name: process_name(&self.proc_root, p.pid),
                        in_command: mine,
                        first_seen: t,
                        ..ProcessTrack::default()
                    });
                    self.processes
                        .insert(key, self.recording.processes.len() - 1);
                    self.recording.processes.len() - 1
                }
            };
            // The name as first seen may be a launcher's (a pyenv shim, a shell) that exec'd
            // the real program since: refreshed now and then, not every sample.
            if self.recording.samples % NAME_REFRESH_SAMPLES == 0 {
                if let Some(name) = process_name(&self.proc_root, p.pid) {
                    self.recording.processes[position].name = Some(name);
                }
            }
            let track = &mut self.recording.processes[position];
            let bytes = p.gpu_memory_bytes.map(|b| b as f64);
            track.series.push(MemoryPoint { t, bytes });
            track.last_seen = t;
            if let Some(b) = bytes {
                track.memory_peak_bytes = Some(track.memory_peak_bytes.map_or(b, |p| p.max(b)));
            }
            if mine {
                held.insert(p.device_uuid.as_str(), true);
            }
        }

        for d in &snapshot.devices {
            let position = match self.devices.get(&d.info.uuid) {
                Some(&i) => i,
                None => {
                    self.recording.devices.push(DeviceTrack {
                        index: d.info.index,
                        uuid: d.info.uuid.clone(),
                        name: d.info.name.clone(),
                        pci_bus_id: Some(d.info.pci_bus_id.clone()).filter(|id| !id.is_empty()),
                        memory_total_bytes: d
                            .get(DeviceField::MemoryTotal)
                            .or(d.info.memory_total_bytes.map(|b| b as f64)),
                        ..DeviceTrack::default()
                    });
                    self.devices
                        .insert(d.info.uuid.clone(), self.recording.devices.len() - 1);
                    self.recording.devices.len() - 1
                }
            };
            let utilization = d.get(DeviceField::UtilizationGpu);
            let sm = d.gpm.get(GpmField::SmActivity);
            let is_held = held.contains_key(d.info.uuid.as_str());
            // Idle: no kernel ran (NVML utilisation; GPM's SM activity where that is missing).
            // Low SM activity under running kernels is a different problem (low_sm_efficiency).
            let busy = utilization.or(sm);
            let idle = is_held && busy.is_some_and(|b| b < IDLE_BELOW);
            let point = DevicePoint {
                t,
                dt,
                n: 1,
                utilization: utilization.map(|v| v as f32),
                sm_activity: sm.map(|v| v as f32),
                tensor_activity: d.gpm.get(GpmField::TensorActivity).map(|v| v as f32),
                dram_activity: d.gpm.get(GpmField::DramActivity).map(|v| v as f32),
                memory_used: d.get(DeviceField::MemoryUsed),
                power_watts: d.get(DeviceField::Power).map(|v| v as f32),
                sm_clock_mhz: d.get(DeviceField::SmClock).map(|v| v as f32),
                memory_clock_mhz: d.get(DeviceField::MemoryClock).map(|v| v as f32),
                throttle: d.throttle_reasons,
                held_seconds: if is_held { dt } else { 0.0 },
                idle_seconds: if idle { dt } else { 0.0 },
            };
            let energy = d.get(DeviceField::Energy);
            let previous_energy =
                energy.and_then(|e| self.last_energy.insert(d.info.uuid.clone(), e));
            let track = &mut self.recording.devices[position];
            let totals = &mut track.totals;
            totals.utilization.add(utilization, dt);
            totals.sm_activity.add(sm, dt);
            totals
                .tensor_activity
                .add(d.gpm.get(GpmField::TensorActivity), dt);
            totals.power_watts.add(d.get(DeviceField::Power), dt);
            if let Some(used) = point.memory_used {
                totals.memory_used_peak =
                    Some(totals.memory_used_peak.map_or(used, |p| p.max(used)));
            }
            if let Some(power) = point.power_watts {
                *totals.power_integral_joules.get_or_insert(0.0) += f64::from(power) * dt;
            }
            if let Some(e) = energy {
                let step = previous_energy.map_or(0.0, |p| (e - p).max(0.0));
                *totals.energy_counter_joules.get_or_insert(0.0) += step;
            }
            totals.held_seconds += point.held_seconds;
            totals.idle_seconds += point.idle_seconds;
            totals.throttle_seen |= point.throttle.unwrap_or(0);
            track.series.push(point);
        }
        self.recording.ended = snapshot.at.max(self.recording.ended);
    }

    /// Opens a mark for each finding that started, closes one for each that cleared.
    pub(crate) fn observe_findings(&mut self, events: &[FindingEvent]) {
        for event in events {
            let key = format!(
                "{}|{}",
                event.finding.rule.as_str(),
                event.finding.subject.key()
            );
            match event.state {
                FindingState::Started => {
                    let mark = self.mark(&event.finding);
                    self.recording.findings.push(mark);
                    self.open.insert(key, self.recording.findings.len() - 1);
                }
                FindingState::Escalated => {
                    let mark = self.mark(&event.finding);
                    match self.open.get(&key) {
                        Some(&i) => {
                            let start = self.recording.findings[i].start_seconds;
                            self.recording.findings[i] = FindingMark {
                                start_seconds: start,
                                ..mark
                            };
                        }
                        None => {
                            self.recording.findings.push(mark);
                            self.open.insert(key, self.recording.findings.len() - 1);
                        }
                    }
                }
                FindingState::Cleared => {
                    if let Some(i) = self.open.remove(&key) {
                        self.recording.findings[i].end_seconds =
                            Some(self.recording.offset(event.at));
                    }
                }
            }
        }
    }

    fn mark(&self, finding: &Finding) -> FindingMark {
        FindingMark {
            rule: finding.rule.as_str().to_string(),
            severity: finding.severity.as_str().to_string(),
            subject: finding.subject.to_string(),
            device_index: finding.subject.device().map(|d| d.index),
            summary: finding.summary.clone(),
            advice: finding.advice.clone(),
            evidence: finding
                .evidence
                .iter()
                .map(|l| l.as_str().to_string())
                .collect(),
            values: finding
                .values
                .iter()
                .map(|(name, value)| (name.clone(), value.to_string()))
                .collect(),
            start_seconds: self.recording.offset(finding.since),
            end_seconds: None,
        }
    }

    fn is_command(&mut self, pid: u32) -> bool {
        let Some(tree) = self.tree.as_mut() else {
            return false;
        };
        *self
            .in_command
            .entry(pid)
            .or_insert_with(|| tree.contains(pid))
    }

    /// Takes each process's identity from an attributed window (the latest one wins: a
    /// process's container or pod does not change, but its name may have been unknown before).
    pub(crate) fn observe_workloads(&mut self, attributed: &AttributedWindow) {
        for track in &mut self.recording.processes {
            if let Some(workload) = attributed.workloads.get(&track.pid) {
                track.workload = Some(workload.clone());
            }
        }
    }

    /// Costs the recording's causes with `prices`.
    pub(crate) fn with_prices(mut self, prices: crate::attribution::Prices) -> Self {
        self.recording.prices = prices;
        self
    }

    /// Adds the ledger's split of an analysed window: the command's processes' GPU time and
    /// energy by cause.
    pub(crate) fn observe_causes(&mut self, attributed: &AttributedWindow) {
        // The accountant's window runs from the previous window's end, without gaps.
        let window = &attributed.window;
        let from = self
            .last_window_end
            .filter(|end| *end <= window.end)
            .unwrap_or(window.start);
        self.last_window_end = Some(window.end);
        let t = self.recording.offset(from);
        let dt = self.recording.offset(window.end) - t;
        let point =
            super::recording::CausePoint::of_window(attributed, t, dt, |pid| self.is_command(pid));
        if let Some(point) = point {
            self.recording.causes.push(point);
        }
    }

    /// Adds a span of the training loop (received from the companion).
    pub(crate) fn add_span(&mut self, span: super::training_spans::ReceivedSpan) {
        let start = self.recording.offset(span.start);
        let end = self.recording.offset(span.end);
        self.recording.spans.push(super::recording::SpanMark {
            kind: span.kind,
            name: span.name,
            start_seconds: start,
            end_seconds: end.max(start),
        });
    }

    /// Says why the recording has no GPU figures.
    pub(crate) fn no_gpu(&mut self, reason: String) {
        self.recording.no_gpu = Some(reason);
    }

    /// The finished recording, ended at `ended` with the command's exit.
    pub(crate) fn finish(
        mut self,
        ended: SystemTime,
        exit: Option<super::child::CommandExit>,
    ) -> Recording {
        self.recording.ended = ended.max(self.recording.ended);
        self.recording.exit = exit;
        self.recording
    }
}

/// The process's executable name from `comm` (what `ps` shows), if it is still there.
fn process_name(proc_root: &std::path::Path, pid: u32) -> Option<String> {
    ProcDir::new(proc_root, pid)
        .stat()
        .ok()
        .flatten()
        .map(|s| s.comm)
}
