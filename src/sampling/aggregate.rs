//! The window aggregator: folds the snapshots of one export interval into a `Window`, and keeps
//! the cumulative counters (energy, PCIe bytes, ECC errors, XIDs) alive across windows.
//!
//! Counters only ever grow: a driver reload that resets NVML's own totals is absorbed by adding
//! only positive differences, so the exported cumulative sums stay monotonic from `counters_start`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::model::{
    DeviceInfo, DeviceSample, DeviceStatus, GpmActivity, MigInstanceInfo, MigInstanceSample,
    NvLinkSample, ProcessKind, RemappedRows, Snapshot, ViolationTimes, XidEvent,
};
use super::window::{
    DeviceWindow, FieldWindows, Gauge, GpmWindow, MigInstanceWindow, NvLinkWindow, ProcessWindow,
    Window,
};
use crate::schema::{WindowKind, DEVICE_FIELDS, FIELD_COUNT, GPM_FIELDS, GPM_FIELD_COUNT};

/// Integrating PCIe throughput over a longer gap (a stalled or lost device) would invent traffic:
/// such gaps count for at most this long.
const MAX_INTEGRATION_GAP: Duration = Duration::from_secs(10);

/// Running summary of one gauge.
#[derive(Debug, Clone, Copy)]
struct GaugeAcc {
    sum: f64,
    min: f64,
    max: f64,
    last: f64,
    count: u32,
}

impl GaugeAcc {
    fn new(value: f64) -> Self {
        Self {
            sum: value,
            min: value,
            max: value,
            last: value,
            count: 1,
        }
    }

    fn add(slot: &mut Option<Self>, value: Option<f64>) {
        let Some(value) = value else { return };
        match slot {
            None => *slot = Some(Self::new(value)),
            Some(acc) => {
                acc.sum += value;
                acc.min = acc.min.min(value);
                acc.max = acc.max.max(value);
                acc.last = value;
                acc.count += 1;
            }
        }
    }

    fn finish(slot: Option<Self>) -> Option<Gauge> {
        slot.map(|acc| Gauge {
            mean: acc.sum / f64::from(acc.count),
            min: acc.min,
            max: acc.max,
            last: acc.last,
            count: acc.count,
        })
    }
}

/// What survives from window to window for one device (keyed by UUID).
#[derive(Debug, Clone)]
struct DeviceCounters {
    start: SystemTime,
    /// Per field: the total since `start` (lifetime counters and integrated rates only).
    totals: [Option<f64>; FIELD_COUNT],
    /// Per lifetime counter: the driver's previous reading.
    counter_prev: [Option<f64>; FIELD_COUNT],
    /// Per integrated rate: the previous tick and its reading (unknown readings included, so
    /// a gap integrates at the newer rate).
    rate_prev: [Option<(SystemTime, Option<f64>)>; FIELD_COUNT],
    xid_total: u64,
    xid_by_code: BTreeMap<u64, u64>,
    /// Each link's previous traffic counters and when they were read, for the rates.
    nvlink_prev: HashMap<u32, (SystemTime, Option<u64>, Option<u64>)>,
}

/// One link's traffic rates between the previous sample and this one, bytes/s.
#[derive(Debug, Clone, Copy)]
struct LinkRates {
    tx: Option<f64>,
    rx: Option<f64>,
}

/// The rate of a driver counter between two readings; `None` for the first reading, no time
/// between them, or a counter that went back (reset).
fn counter_rate(prev: Option<u64>, now: Option<u64>, dt: f64) -> Option<f64> {
    let (prev, now) = (prev?, now?);
    (dt > 0.0 && now >= prev).then(|| (now - prev) as f64 / dt)
}

impl DeviceCounters {
    fn new(start: SystemTime) -> Self {
        Self {
            start,
            totals: [None; FIELD_COUNT],
            counter_prev: [None; FIELD_COUNT],
            rate_prev: [None; FIELD_COUNT],
            xid_total: 0,
            xid_by_code: BTreeMap::new(),
            nvlink_prev: HashMap::new(),
        }
    }

    /// Each link's rates since its previous sample, in the order of `links`.
    fn nvlink_rates(&mut self, at: SystemTime, links: &[NvLinkSample]) -> Vec<LinkRates> {
        links
            .iter()
            .map(|l| {
                let now = (at, l.tx_bytes_total, l.rx_bytes_total);
                match self.nvlink_prev.insert(l.link, now) {
                    Some((prev_at, tx, rx)) => {
                        let dt = at.duration_since(prev_at).unwrap_or_default().as_secs_f64();
                        LinkRates {
                            tx: counter_rate(tx, l.tx_bytes_total, dt),
                            rx: counter_rate(rx, l.rx_bytes_total, dt),
                        }
                    }
                    None => LinkRates { tx: None, rx: None },
                }
            })
            .collect()
    }

    fn add(&mut self, at: SystemTime, s: &DeviceSample) {
        for (spec, value) in s.fields.iter() {
            let i = spec.field as usize;
            match spec.window {
                WindowKind::LifetimeCounter => {
                    accumulate(&mut self.totals[i], &mut self.counter_prev[i], value);
                }
                WindowKind::IntegratedRate => {
                    if let Some((prev_at, prev)) = self.rate_prev[i] {
                        let dt = at
                            .duration_since(prev_at)
                            .unwrap_or_default()
                            .min(MAX_INTEGRATION_GAP)
                            .as_secs_f64();
                        integrate(&mut self.totals[i], prev, value, dt);
                    } else {
                        // The first reading starts the total at zero, so it exists from the start.
                        self.totals[i] = self.totals[i].or(value.map(|_| 0.0));
                    }
                    self.rate_prev[i] = Some((at, value));
                }
                WindowKind::Gauge | WindowKind::Last => {}
            }
        }
    }
}

/// Adds the positive change since the previous reading; the first reading starts at zero.
fn accumulate(total: &mut Option<f64>, prev: &mut Option<f64>, value: Option<f64>) {
    let Some(value) = value else { return };
    let delta = prev.map_or(0.0, |p| (value - p).max(0.0));
    *total = Some(total.unwrap_or(0.0) + delta);
    *prev = Some(value);
}

/// Trapezoid rule over the interval between two throughput readings (bytes/s).
fn integrate(total: &mut Option<f64>, prev: Option<f64>, now: Option<f64>, dt: f64) {
    let Some(now) = now else { return };
    let rate = prev.map_or(now, |p| (p + now) / 2.0);
    *total = Some(total.unwrap_or(0.0) + rate * dt);
}

/// The accumulating state of one device in the open window.
#[derive(Debug)]
struct DeviceAcc {
    info: Arc<DeviceInfo>,
    status: DeviceStatus,
    lost_samples: u32,
    /// Per field, the summary of its sampled values.
    fields: [Option<GaugeAcc>; FIELD_COUNT],
    throttle_known: u32,
    throttle_active: BTreeMap<u64, u32>,
    gpm: GpmAcc,
    remapped_rows: Option<RemappedRows>,
    violation: Option<ViolationTimes>,
    /// Per link: the last sample and the running rate summaries.
    nvlink: Vec<(NvLinkSample, Option<GaugeAcc>, Option<GaugeAcc>)>,
    /// MIG devices seen in the window, by MIG UUID, in the order first seen.
    mig: Vec<MigAcc>,
}

/// The accumulating state of one MIG device in the open window.
#[derive(Debug)]
struct MigAcc {
    info: Arc<MigInstanceInfo>,
    memory_used_bytes: Option<u64>,
    memory_free_bytes: Option<u64>,
    memory_total_bytes: Option<u64>,
    gpm: GpmAcc,
    pids: std::collections::BTreeSet<u32>,
}

impl MigAcc {
    fn add(&mut self, s: &MigInstanceSample) {
        self.info = Arc::clone(&s.info);
        self.memory_used_bytes = s.memory_used_bytes.or(self.memory_used_bytes);
        self.memory_free_bytes = s.memory_free_bytes.or(self.memory_free_bytes);
        self.memory_total_bytes = s.memory_total_bytes.or(self.memory_total_bytes);
        self.gpm.add(&s.gpm);
    }

    fn finish(self) -> MigInstanceWindow {
        MigInstanceWindow {
            info: self.info,
            memory_used_bytes: self.memory_used_bytes,
            memory_free_bytes: self.memory_free_bytes,
            memory_total_bytes: self.memory_total_bytes,
            gpm: self.gpm.finish(),
            pids: self.pids.into_iter().collect(),
        }
    }
}

/// Running summaries of the GPM activity gauges.
#[derive(Debug, Default)]
struct GpmAcc([Option<GaugeAcc>; GPM_FIELD_COUNT]);

impl GpmAcc {
    fn add(&mut self, a: &GpmActivity) {
        for (acc, spec) in self.0.iter_mut().zip(&GPM_FIELDS) {
            GaugeAcc::add(acc, a.get(spec.field));
        }
    }

    fn finish(self) -> GpmWindow {
        let mut window = GpmWindow::default();
        for (acc, spec) in self.0.into_iter().zip(&GPM_FIELDS) {
            window.set(spec.field, GaugeAcc::finish(acc));
        }
        window
    }
}

impl DeviceAcc {
    fn new(info: Arc<DeviceInfo>) -> Self {
        Self {
            info,
            status: DeviceStatus::Ok,
            lost_samples: 0,
            fields: [None; FIELD_COUNT],
            throttle_known: 0,
            throttle_active: BTreeMap::new(),
            gpm: GpmAcc::default(),
            remapped_rows: None,
            violation: None,
            nvlink: Vec::new(),
            mig: Vec::new(),
        }
    }

    /// Adds the links of one sample with their rates (see `DeviceCounters::nvlink_rates`).
    fn add_nvlink(&mut self, links: &[NvLinkSample], rates: &[LinkRates]) {
        for (l, r) in links.iter().zip(rates) {
            let slot = match self.nvlink.iter_mut().find(|(s, ..)| s.link == l.link) {
                Some(slot) => slot,
                None => {
                    self.nvlink.push((*l, None, None));
                    self.nvlink.sort_by_key(|(s, ..)| s.link);
                    self.nvlink
                        .iter_mut()
                        .find(|(s, ..)| s.link == l.link)
                        .expect("just inserted")
                }
            };
            slot.0 = *l;
            GaugeAcc::add(&mut slot.1, r.tx);
            GaugeAcc::add(&mut slot.2, r.rx);
        }
    }

    fn add(&mut self, s: &DeviceSample) {
        for instance in &s.mig_instances {
            match self
                .mig
                .iter_mut()
                .find(|m| m.info.uuid == instance.info.uuid)
            {
                Some(acc) => acc.add(instance),
                None => {
                    let mut acc = MigAcc {
                        info: Arc::clone(&instance.info),
                        memory_used_bytes: None,
                        memory_free_bytes: None,
                        memory_total_bytes: None,
                        gpm: GpmAcc::default(),
                        pids: Default::default(),
                    };
                    acc.add(instance);
                    self.mig.push(acc);
                }
            }
        }
        self.info = Arc::clone(&s.info);
        self.status = s.status;
        if s.status == DeviceStatus::Lost {
            self.lost_samples += 1;
        }
        for (acc, (_, value)) in self.fields.iter_mut().zip(s.fields.iter()) {
            GaugeAcc::add(acc, value);
        }
        self.gpm.add(&s.gpm);
        self.remapped_rows = s.remapped_rows.or(self.remapped_rows);
        self.violation = s.violation.or(self.violation);
        if let Some(bits) = s.throttle_reasons {
            self.throttle_known += 1;
            let mut remaining = bits;
            while remaining != 0 {
                let bit = remaining & remaining.wrapping_neg();
                *self.throttle_active.entry(bit).or_insert(0) += 1;
                remaining &= remaining - 1;
            }
        }
    }

    fn finish(self, counters: &DeviceCounters) -> DeviceWindow {
        let mut fields = FieldWindows::default();
        for (spec, acc) in DEVICE_FIELDS.iter().zip(self.fields) {
            fields.set_gauge(spec.field, GaugeAcc::finish(acc));
            fields.set_total(spec.field, counters.totals[spec.field as usize]);
        }
        let throttle_active_ratio = (self.throttle_known > 0).then(|| {
            let known = f64::from(self.throttle_known);
            self.throttle_active
                .iter()
                .map(|(&bit, &count)| (bit, f64::from(count) / known))
                .collect()
        });
        DeviceWindow {
            info: self.info,
            status: self.status,
            lost_samples: self.lost_samples,
            fields,
            throttle_active_ratio,
            counters_start: counters.start,
            xid_total: counters.xid_total,
            gpm: self.gpm.finish(),
            remapped_rows: self.remapped_rows,
            violation: self.violation,
            xid_by_code: counters.xid_by_code.clone(),
            nvlink: self
                .nvlink
                .into_iter()
                .map(|(last, tx, rx)| NvLinkWindow {
                    last,
                    tx_bytes_per_second: GaugeAcc::finish(tx),
                    rx_bytes_per_second: GaugeAcc::finish(rx),
                })
                .collect(),
            mig_instances: self.mig.into_iter().map(MigAcc::finish).collect(),
        }
    }
}

#[derive(Debug)]
struct ProcessAcc {
    device_index: u32,
    kind: ProcessKind,
    samples: u32,
    gpu_memory_bytes: Option<GaugeAcc>,
    sm_utilization: Option<GaugeAcc>,
    memory_utilization: Option<GaugeAcc>,
    encoder_utilization: Option<GaugeAcc>,
    decoder_utilization: Option<GaugeAcc>,
}

/// Folds snapshots into windows. One per `gpulse run`; not shared between threads.
#[derive(Debug, Default)]
pub struct WindowAggregator {
    start: Option<SystemTime>,
    end: Option<SystemTime>,
    samples: u32,
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
    /// Open window, by device UUID, in the order devices were first seen in it.
    devices: Vec<(String, DeviceAcc)>,
    /// Every (PID, device) row of the open window and of the window before, by PID: a process
    /// nearly always holds one device, so a row is found by hashing the PID and comparing one
    /// UUID, with no key to build (a `(pid, uuid)` key cost two UUID copies and two hashes of
    /// the UUID per process per sample).
    processes: HashMap<u32, Vec<ProcessRow>>,
    xid_events: Vec<XidEvent>,
    counters: HashMap<String, DeviceCounters>,
}

/// One process on one device: when it was first seen (kept while it stays in consecutive
/// windows) and what the open window holds of it (`None`: not seen in it yet).
#[derive(Debug)]
struct ProcessRow {
    device_uuid: String,
    first_seen: SystemTime,
    acc: Option<ProcessAcc>,
}

impl WindowAggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of snapshots in the open window.
    pub fn sample_count(&self) -> u32 {
        self.samples
    }

    /// Adds one snapshot to the open window.
    pub fn add(&mut self, snapshot: &Snapshot) {
        let at = snapshot.at;
        self.start.get_or_insert(at);
        self.end = Some(at);
        self.samples += 1;
        if snapshot.driver_version.is_some() {
            self.driver_version.clone_from(&snapshot.driver_version);
        }
        if snapshot.cuda_driver_version.is_some() {
            self.cuda_driver_version
                .clone_from(&snapshot.cuda_driver_version);
        }
        for device in &snapshot.devices {
            let uuid = &device.info.uuid;
            let counters = self
                .counters
                .entry(uuid.clone())
                .or_insert_with(|| DeviceCounters::new(at));
            counters.add(at, device);
            let rates = counters.nvlink_rates(at, &device.nvlink);
            let acc = match self.devices.iter_mut().position(|(u, _)| u == uuid) {
                Some(i) => &mut self.devices[i].1,
                None => {
                    self.devices
                        .push((uuid.clone(), DeviceAcc::new(Arc::clone(&device.info))));
                    &mut self.devices.last_mut().expect("just pushed").1
                }
            };
            acc.add(device);
            acc.add_nvlink(&device.nvlink, &rates);
        }
        for p in &snapshot.processes {
            if let Some(mig) = &p.mig {
                let instance = self
                    .devices
                    .iter_mut()
                    .filter(|(uuid, _)| *uuid == p.device_uuid)
                    .flat_map(|(_, acc)| acc.mig.iter_mut())
                    .find(|m| m.info.uuid == mig.uuid);
                if let Some(instance) = instance {
                    instance.pids.insert(p.pid);
                }
            }
            let rows = self.processes.entry(p.pid).or_default();
            let row = match rows.iter().position(|r| r.device_uuid == p.device_uuid) {
                Some(i) => &mut rows[i],
                None => {
                    rows.push(ProcessRow {
                        device_uuid: p.device_uuid.clone(),
                        first_seen: at,
                        acc: None,
                    });
                    rows.last_mut().expect("just pushed")
                }
            };
            let acc = row.acc.get_or_insert(ProcessAcc {
                device_index: p.device_index,
                kind: p.kind,
                samples: 0,
                gpu_memory_bytes: None,
                sm_utilization: None,
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
            });
            acc.samples += 1;
            if acc.kind != p.kind {
                acc.kind = ProcessKind::ComputeAndGraphics;
            }
            GaugeAcc::add(
                &mut acc.gpu_memory_bytes,
                p.gpu_memory_bytes.map(|b| b as f64),
            );
            GaugeAcc::add(&mut acc.sm_utilization, p.sm_utilization);
            GaugeAcc::add(&mut acc.memory_utilization, p.memory_utilization);
            GaugeAcc::add(&mut acc.encoder_utilization, p.encoder_utilization);
            GaugeAcc::add(&mut acc.decoder_utilization, p.decoder_utilization);
        }
        for event in &snapshot.events {
            if let Some(counters) = self.counters.get_mut(&event.device_uuid) {
                counters.xid_total += 1;
                *counters.xid_by_code.entry(event.xid).or_insert(0) += 1;
            }
            self.xid_events.push(event.clone());
        }
    }

    /// Closes the open window and starts the next; `None` when no snapshot arrived since the last
    /// call. Processes not seen in the closed window are forgotten, so a PID that comes back later
    /// gets a new `first_seen`.
    pub fn take(&mut self) -> Option<Window> {
        let (start, end) = (self.start.take()?, self.end.take()?);
        let samples = std::mem::take(&mut self.samples);
        let devices = std::mem::take(&mut self.devices)
            .into_iter()
            .map(|(uuid, acc)| {
                let counters = &self.counters[&uuid];
                acc.finish(counters)
            })
            .collect();
        // Rows not seen in the closed window are forgotten, with their first_seen.
        // At least one row per PID: sized once instead of grown push by push.
        let mut processes: Vec<ProcessWindow> = Vec::with_capacity(self.processes.len());
        self.processes.retain(|&pid, rows| {
            rows.retain_mut(|row| {
                let Some(acc) = row.acc.take() else {
                    return false;
                };
                processes.push(ProcessWindow {
                    first_seen: row.first_seen,
                    pid,
                    device_index: acc.device_index,
                    device_uuid: row.device_uuid.clone(),
                    kind: acc.kind,
                    samples: acc.samples,
                    gpu_memory_bytes: GaugeAcc::finish(acc.gpu_memory_bytes),
                    sm_utilization: GaugeAcc::finish(acc.sm_utilization),
                    memory_utilization: GaugeAcc::finish(acc.memory_utilization),
                    encoder_utilization: GaugeAcc::finish(acc.encoder_utilization),
                    decoder_utilization: GaugeAcc::finish(acc.decoder_utilization),
                });
                true
            });
            !rows.is_empty()
        });
        // A PID has one row per device (by UUID) and an index names one device, so no two rows
        // tie (and the rows come out of a hash map, in no order to keep): an unstable sort gives
        // the same order without the stable sort's scratch buffer.
        processes.sort_unstable_by_key(|p| (p.device_index, p.pid));
        Some(Window {
            start,
            end,
            sample_count: samples,
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            devices,
            processes,
            xid_events: std::mem::take(&mut self.xid_events),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::model::ProcessSample;
    use crate::schema::DeviceField;

    fn info(uuid: &str) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index: 0,
            uuid: uuid.into(),
            name: "Test GPU".into(),
            pci_bus_id: "00000000:01:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: Some(80),
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        })
    }

    fn snapshot(
        at_s: u64,
        util: Option<f64>,
        energy: Option<f64>,
        pcie_tx: Option<f64>,
    ) -> Snapshot {
        let mut d = DeviceSample::empty(info("GPU-a"), DeviceStatus::Ok);
        d.set(DeviceField::UtilizationGpu, util);
        d.set(DeviceField::Energy, energy);
        d.set(DeviceField::PcieTx, pcie_tx);
        d.set(DeviceField::MemoryUsed, Some((at_s * 10) as f64));
        Snapshot {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at_s),
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            nvml_version: None,
            devices: vec![d],
            processes: vec![],
            events: vec![],
        }
    }

    #[test]
    fn gauges_keep_mean_min_max_last_and_skip_missing_samples() {
        let mut agg = WindowAggregator::new();
        agg.add(&snapshot(1, Some(0.2), None, None));
        agg.add(&snapshot(2, None, None, None));
        agg.add(&snapshot(3, Some(0.9), None, None));
        agg.add(&snapshot(4, Some(0.4), None, None));
        let w = agg.take().expect("a window");
        let g = w.devices[0]
            .gauge(DeviceField::UtilizationGpu)
            .expect("utilisation present");
        assert_eq!(g.count, 3);
        assert!((g.mean - 0.5).abs() < 1e-9);
        assert_eq!((g.min, g.max, g.last), (0.2, 0.9, 0.4));
        assert_eq!(w.sample_count, 4);
        assert_eq!(w.devices[0].last_u64(DeviceField::MemoryUsed), Some(40));
        assert!(agg.take().is_none(), "an empty window is not exported");
    }

    #[test]
    fn a_field_never_given_stays_absent_not_zero() {
        let mut agg = WindowAggregator::new();
        agg.add(&snapshot(1, None, None, None));
        let w = agg.take().expect("a window");
        assert!(w.devices[0].gauge(DeviceField::UtilizationGpu).is_none());
        assert!(w.devices[0].total(DeviceField::Energy).is_none());
        assert!(w.devices[0].total_u64(DeviceField::PcieTx).is_none());
    }

    #[test]
    fn counters_are_cumulative_across_windows_and_survive_a_driver_reset() {
        let mut agg = WindowAggregator::new();
        agg.add(&snapshot(10, None, Some(1000.0), Some(100.0)));
        agg.add(&snapshot(12, None, Some(1300.0), Some(300.0)));
        let w1 = agg.take().expect("window 1");
        assert_eq!(w1.devices[0].total(DeviceField::Energy), Some(300.0));
        // Trapezoid over 2 s at (100 + 300) / 2 B/s.
        assert_eq!(w1.devices[0].total_u64(DeviceField::PcieTx), Some(400));
        // The driver reloaded: its energy total restarted near zero.
        agg.add(&snapshot(14, None, Some(50.0), Some(300.0)));
        agg.add(&snapshot(16, None, Some(250.0), Some(300.0)));
        let w2 = agg.take().expect("window 2");
        assert_eq!(w2.devices[0].total(DeviceField::Energy), Some(500.0));
        assert_eq!(
            w2.devices[0].total_u64(DeviceField::PcieTx),
            Some(400 + 600 + 600)
        );
        assert_eq!(w2.devices[0].counters_start, w1.devices[0].counters_start);
        assert_eq!(
            w2.devices[0].counters_start,
            SystemTime::UNIX_EPOCH + Duration::from_secs(10)
        );
    }

    #[test]
    fn throttle_ratio_counts_each_reason_over_known_samples() {
        let mut agg = WindowAggregator::new();
        for (i, bits) in [Some(0x4), Some(0x4 | 0x20), Some(0), None]
            .into_iter()
            .enumerate()
        {
            let mut s = snapshot(i as u64, None, None, None);
            s.devices[0].throttle_reasons = bits;
            agg.add(&s);
        }
        let w = agg.take().expect("a window");
        let ratios = w.devices[0].throttle_active_ratio.clone().expect("known");
        assert!((ratios[&0x4] - 2.0 / 3.0).abs() < 1e-9);
        assert!((ratios[&0x20] - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(ratios.len(), 2);
    }

    #[test]
    fn processes_are_summarised_and_forgotten_once_gone() {
        let process = |pid, mem| ProcessSample {
            pid,
            device_index: 0,
            device_uuid: "GPU-a".into(),
            kind: ProcessKind::Compute,
            gpu_memory_bytes: Some(mem),
            sm_utilization: Some(0.5),
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
            mig: None,
        };
        let mut agg = WindowAggregator::new();
        let mut s = snapshot(1, None, None, None);
        s.processes = vec![process(7, 100)];
        agg.add(&s);
        let mut s = snapshot(2, None, None, None);
        s.processes = vec![process(7, 300)];
        agg.add(&s);
        let w = agg.take().expect("window 1");
        let p = &w.processes[0];
        assert_eq!(p.pid, 7);
        let mem = p.gpu_memory_bytes.expect("memory");
        assert_eq!((mem.max, mem.last, mem.mean), (300.0, 300.0, 200.0));
        assert_eq!(
            p.first_seen,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1)
        );
        // Gone for a window, then back: a new first_seen.
        agg.add(&snapshot(3, None, None, None));
        assert!(agg.take().expect("window 2").processes.is_empty());
        let mut s = snapshot(4, None, None, None);
        s.processes = vec![process(7, 100)];
        agg.add(&s);
        let w3 = agg.take().expect("window 3");
        assert_eq!(
            w3.processes[0].first_seen,
            SystemTime::UNIX_EPOCH + Duration::from_secs(4)
        );
    }

    #[test]
    fn xid_events_are_listed_and_counted_per_device() {
        let mut agg = WindowAggregator::new();
        let mut s = snapshot(1, None, None, None);
        s.events = vec![XidEvent {
            at: s.at,
            device_uuid: "GPU-a".into(),
            device_index: 0,
            xid: 79,
        }];
        agg.add(&s);
        let w = agg.take().expect("window");
        assert_eq!(w.xid_events.len(), 1);
        assert_eq!(w.devices[0].xid_total, 1);
        agg.add(&snapshot(2, None, None, None));
        let w2 = agg.take().expect("window 2");
        assert!(w2.xid_events.is_empty());
        assert_eq!(w2.devices[0].xid_total, 1, "the counter is cumulative");
        assert_eq!(w2.devices[0].xid_by_code, BTreeMap::from([(79, 1)]));
    }

    #[test]
    fn xid_counts_by_code_add_up_to_the_total() {
        let mut agg = WindowAggregator::new();
        let mut s = snapshot(1, None, None, None);
        let event = |xid| XidEvent {
            at: s.at,
            device_uuid: "GPU-a".into(),
            device_index: 0,
            xid,
        };
        s.events = vec![event(79), event(13), event(79)];
        agg.add(&s);
        let w = agg.take().expect("window");
        assert_eq!(w.devices[0].xid_by_code, BTreeMap::from([(13, 1), (79, 2)]));
        assert_eq!(w.devices[0].xid_total, 3);
    }

    /// A snapshot at `at_ms` whose link 0 has sent `tx` bytes and link 1 is down.
    fn nvlink_snapshot(at_ms: u64, tx: Option<u64>) -> Snapshot {
        let mut s = snapshot(0, None, None, None);
        s.at = SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms);
        s.devices[0].nvlink = vec![
            NvLinkSample {
                link: 0,
                active: Some(true),
                tx_bytes_total: tx,
                rx_bytes_total: tx.map(|b| b / 2),
                ..Default::default()
            },
            NvLinkSample {
                link: 1,
                active: Some(false),
                tx_bytes_total: Some(0),
                rx_bytes_total: Some(0),
                ..Default::default()
            },
        ];
        s
    }

    #[test]
    fn nvlink_rates_come_from_consecutive_samples_across_windows() {
        let mut agg = WindowAggregator::new();
        agg.add(&nvlink_snapshot(1000, Some(1_000)));
        let w = agg.take().expect("window");
        let l0 = &w.devices[0].nvlink[0];
        assert_eq!(l0.last.tx_bytes_total, Some(1_000));
        assert!(l0.tx_bytes_per_second.is_none(), "one sample gives no rate");
        // 500 ms later 1000 more bytes: 2000 B/s; then a reset (counter back to 0): no rate.
        agg.add(&nvlink_snapshot(1500, Some(2_000)));
        agg.add(&nvlink_snapshot(2500, Some(5_000)));
        agg.add(&nvlink_snapshot(3000, Some(0)));
        let w = agg.take().expect("window 2");
        let d = &w.devices[0];
        let tx = d.nvlink[0].tx_bytes_per_second.expect("rates");
        assert_eq!((tx.count, tx.min, tx.max), (2, 2000.0, 3000.0));
        assert_eq!(d.nvlink[0].last.tx_bytes_total, Some(0), "the last value");
        assert_eq!(d.nvlink[1].last.active, Some(false));
        assert_eq!(d.nvlink[1].tx_bytes_per_second.map(|g| g.mean), Some(0.0));
        // Both directions of both links: 2500 + 1250 mean on link 0, 0 on link 1.
        assert_eq!(d.nvlink_bytes_per_second(), Some(2500.0 + 1250.0));
    }
}
