//! GPU time and energy per process, and their roll-ups by container, pod and job: what a team
//! sharing GPUs is charged for.
//!
//! Per export window and device:
//! - **Held time**: the window's length times the share of its samples that listed the process
//!   on the device (`process.gpu.time`, `state=held`).
//! - **Activity**: the share of the window the device was busy with the process's work. On a
//!   whole GPU that is NVML's per-process SM utilisation, a sample without the process counting
//!   as idle (NVML lists only processes that ran); a process alone on a GPU that gives no
//!   per-process figures takes the GPU's utilisation. On MIG, NVML has no per-process
//!   utilisation: a process alone on its MIG instance takes the instance's graphics-engine
//!   activity (GPM, DCGM's GR_ENGINE_ACTIVE); several processes on one instance have no
//!   knowable activity each, and none is invented.
//! - **Active, idle and unknown time**: held time of a window whose activity reaches
//!   [`ACTIVE_THRESHOLD`] is active, of one whose activity is below it idle, of one whose activity
//!   is not knowable unknown; the three add up to the held time (`process.gpu.time` by
//!   `gpulse.gpu.time.state`).
//! - **Energy**: the device's energy in the window (the delta of its energy counter, else its
//!   mean power times the window's length) apportioned by busy time: each process gets the
//!   energy times its activity weight, where a MIG instance's weight is its activity times its
//!   share of the GPU (its memory slice over the GPU's memory, the one size NVML gives every
//!   instance). Weights above 1 in total (overlapping samples) are scaled down to 1, so the
//!   processes' sum never exceeds the device's. The rest — idle power, busy time of no known
//!   process, shared MIG instances — is the device's **unattributed** energy. The activity rule
//!   of a whole GPU and the weights are [`super::energy_share`]'s, which span enrichment uses too.
//!
//! Roll-ups keep their totals when a process exits, so a job's hours do not shrink as its ranks
//! finish.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use serde::Serialize;

use super::by_process::ByProcess;
pub use super::energy_share::ActivitySource;
use super::energy_share::{energy_weights, mig_gpu_share, whole_gpu_activity, EnergyClaim};
use super::workload::Workload;
use crate::fast_map::FastMap;
use crate::sampling::{DeviceWindow, ProcessWindow, Window};
use crate::schema::{DeviceField, GpmField};
pub use crate::values::Prices;

/// A window in which a process's activity reaches this share of the time counts as active.
pub const ACTIVE_THRESHOLD: f64 = 0.05;

/// At most this many roll-up groups are kept; the longest unseen go first.
const MAX_GROUPS: usize = 4096;

/// One process on one device: its window and its totals since gpulse first saw it there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessAccount {
    pub pid: u32,
    pub device_uuid: String,
    /// The MIG device it runs in, when its GPU is in MIG mode.
    pub mig_uuid: Option<String>,
    /// Activity (0–1) over this window, and how it was known; `None` where it is not knowable.
    pub activity: Option<f64>,
    pub activity_source: Option<ActivitySource>,
    /// The share of the device's energy this window charged to the process.
    pub energy_weight: Option<f64>,
    /// What this window added.
    pub window_held_seconds: f64,
    pub window_energy_joules: Option<f64>,
    /// Totals since `since`.
    pub held_seconds: f64,
    /// `None` while its activity has never been knowable.
    pub active_seconds: Option<f64>,
    /// Held time in windows whose activity was below [`ACTIVE_THRESHOLD`]; `None` as above.
    pub idle_seconds: Option<f64>,
    /// Held time in windows whose activity was not knowable (a shared MIG instance, several
    /// processes on a GPU without per-process figures).
    pub unknown_seconds: f64,
    pub energy_joules: Option<f64>,
    /// The share of a whole GPU it holds: 1, or its MIG instance's slice; `None` where the
    /// instance's size is unknown (then it has no energy and counts no GPU-hours).
    pub gpu_share: Option<f64>,
    #[serde(with = "crate::sampling::model::unix_nanos")]
    pub since: SystemTime,
}

/// One device's energy: what its processes were charged and the rest, since `since`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceAccount {
    pub device_uuid: String,
    pub energy_joules: f64,
    pub attributed_joules: f64,
    pub unattributed_joules: f64,
    #[serde(with = "crate::sampling::model::unix_nanos")]
    pub since: SystemTime,
}

/// What a roll-up groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    Job,
    Pod,
    Container,
}

/// The processes of one container, pod or job, summed since gpulse first saw one of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rollup {
    pub kind: GroupKind,
    /// Job id, pod UID or container id.
    pub id: String,
    /// A readable name where one is known (`namespace/pod`, the container's name).
    pub name: Option<String>,
    /// Processes in the group this window.
    pub processes: usize,
    /// Held time in whole-GPU hours (a MIG instance counts as its slice).
    pub gpu_hours: f64,
    /// Hours, weighted as `gpu_hours`, in windows whose activity was below the threshold,
    /// over those whose activity was known.
    pub idle_share: Option<f64>,
    pub energy_kwh: f64,
    /// `gpu_hours` × the price per GPU-hour plus `energy_kwh` × the price per kWh, for the prices
    /// given.
    pub cost: Option<f64>,
    #[serde(skip)]
    last_seen: u64,
    #[serde(skip)]
    known_hours: f64,
    #[serde(skip)]
    idle_hours: f64,
}

impl Rollup {
    /// A group with nothing summed yet.
    pub(crate) fn empty(kind: GroupKind, id: String) -> Self {
        Self {
            kind,
            id,
            name: None,
            processes: 0,
            gpu_hours: 0.0,
            idle_share: None,
            energy_kwh: 0.0,
            cost: None,
            last_seen: 0,
            known_hours: 0.0,
            idle_hours: 0.0,
        }
    }
}

/// `gpu_hours` × the price per GPU-hour plus `kwh` × the price per kWh, for the prices given.
pub(crate) fn cost(prices: &Prices, gpu_hours: f64, kwh: f64) -> Option<f64> {
    match (prices.per_gpu_hour, prices.per_kwh) {
        (None, None) => None,
        (hour, kwh_price) => {
            Some(hour.map_or(0.0, |p| p * gpu_hours) + kwh_price.map_or(0.0, |p| p * kwh))
        }
    }
}

/// The accounts after one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Accounts {
    /// The window's processes, by host PID and device UUID.
    pub processes: Vec<ProcessAccount>,
    pub devices: Vec<DeviceAccount>,
    /// Every group seen so far, jobs first, then pods, then containers, by id.
    pub rollups: Vec<Rollup>,
}

impl Accounts {
    pub fn process(&self, pid: u32, device_uuid: &str) -> Option<&ProcessAccount> {
        self.processes
            .iter()
            .find(|p| p.pid == pid && p.device_uuid == device_uuid)
    }

    pub fn device(&self, device_uuid: &str) -> Option<&DeviceAccount> {
        self.devices.iter().find(|d| d.device_uuid == device_uuid)
    }
}

/// The device's energy counter as last seen, to take the next window's delta from.
#[derive(Debug, Clone, Copy)]
struct EnergyMark {
    counters_start: SystemTime,
    total_joules: f64,
}

/// Keeps the totals from one window to the next.
#[derive(Debug, Default)]
pub struct GpuAccountant {
    prices: Prices,
    last_end: Option<SystemTime>,
    energy_marks: FastMap<String, EnergyMark>,
    devices: BTreeMap<String, DeviceAccount>,
    /// By (pid, device UUID); a process is forgotten with its first window without it.
    processes: ByProcess<ProcessAccount>,
    groups: FastMap<(GroupKind, String), Rollup>,
    windows: u64,
}

impl GpuAccountant {
    pub fn new(prices: Prices) -> Self {
        Self {
            prices,
            ..Self::default()
        }
    }

    /// Adds one window to the totals and returns the accounts after it.
    pub fn account(&mut self, window: &Window, workloads: &HashMap<u32, Workload>) -> Accounts {
        self.windows += 1;
        self.processes.begin_window();
        let seconds = self.window_seconds(window);
        let mut processes = Vec::with_capacity(window.processes.len());
        let mut devices = Vec::with_capacity(window.devices.len());
        for device in &window.devices {
            let on_device: Vec<&ProcessWindow> = window
                .processes
                .iter()
                .filter(|p| p.device_uuid == device.info.uuid)
                .collect();
            let activities = activities(window, device, &on_device);
            let claims: Vec<EnergyClaim> = activities.iter().map(Activity::claim).collect();
            let weights = energy_weights(&claims);
            let energy = self.window_energy(device, seconds);
            let mut attributed = 0.0;
            for ((p, activity), weight) in on_device.iter().zip(&activities).zip(&weights) {
                let charged = match (energy, weight) {
                    (Some(e), Some(w)) => Some(e * w),
                    _ => None,
                };
                attributed += charged.unwrap_or(0.0);
                let held = seconds * f64::from(p.samples) / f64::from(window.sample_count.max(1));
                let account = self.add_process(p, activity, *weight, held, charged);
                processes.push(account);
            }
            if let Some(energy) = energy {
                let account = self
                    .devices
                    .entry(device.info.uuid.clone())
                    .or_insert_with(|| DeviceAccount {
                        device_uuid: device.info.uuid.clone(),
                        energy_joules: 0.0,
                        attributed_joules: 0.0,
                        unattributed_joules: 0.0,
                        since: window.start,
                    });
                account.energy_joules += energy;
                account.attributed_joules += attributed;
                account.unattributed_joules += (energy - attributed).max(0.0);
                devices.push(account.clone());
            }
        }
        self.processes.end_window();
        self.roll_up(&processes, workloads);
        Accounts {
            processes,
            devices,
            rollups: self.rollups(),
        }
    }

    /// The window's length: from the previous window's end (so consecutive windows cover the
    /// time without gaps), the first from its first sample.
    fn window_seconds(&mut self, window: &Window) -> f64 {
        let from = self
            .last_end
            .filter(|end| *end <= window.end)
            .unwrap_or(window.start);
        self.last_end = Some(window.end);
        window
            .end
            .duration_since(from)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }

    /// The device's energy in the window: its counter's delta, else mean power × length.
    fn window_energy(&mut self, device: &DeviceWindow, seconds: f64) -> Option<f64> {
        if let Some(total) = device.total(DeviceField::Energy) {
            let mark = EnergyMark {
                counters_start: device.counters_start,
                total_joules: total,
            };
            let previous = self.energy_marks.insert(device.info.uuid.clone(), mark);
            return Some(match previous {
                Some(p) if p.counters_start == mark.counters_start && p.total_joules <= total => {
                    total - p.total_joules
                }
                // The first window: the counter started with it.
                _ => total,
            });
        }
        self.energy_marks.remove(&device.info.uuid);
        device.mean(DeviceField::Power).map(|watts| watts * seconds)
    }

    fn add_process(
        &mut self,
        p: &ProcessWindow,
        activity: &Activity,
        weight: Option<f64>,
        held: f64,
        charged: Option<f64>,
    ) -> ProcessAccount {
        let account = self
            .processes
            .touch(p.pid, &p.device_uuid, || ProcessAccount {
                pid: p.pid,
                device_uuid: p.device_uuid.clone(),
                mig_uuid: None,
                activity: None,
                activity_source: None,
                energy_weight: None,
                window_held_seconds: 0.0,
                window_energy_joules: None,
                held_seconds: 0.0,
                active_seconds: None,
                idle_seconds: None,
                unknown_seconds: 0.0,
                energy_joules: None,
                gpu_share: Some(1.0),
                since: p.first_seen,
            });
        account.mig_uuid.clone_from(&activity.mig_uuid);
        account.gpu_share = activity.gpu_share;
        account.activity = activity.value;
        account.activity_source = activity.source;
        account.energy_weight = weight;
        account.window_held_seconds = held;
        account.window_energy_joules = charged;
        account.held_seconds += held;
        match activity.value {
            Some(value) => {
                let (active, idle) = if value >= ACTIVE_THRESHOLD {
                    (held, 0.0)
                } else {
                    (0.0, held)
                };
                *account.active_seconds.get_or_insert(0.0) += active;
                *account.idle_seconds.get_or_insert(0.0) += idle;
            }
            None => account.unknown_seconds += held,
        }
        if let Some(joules) = charged {
            *account.energy_joules.get_or_insert(0.0) += joules;
        }
        account.clone()
    }

    fn roll_up(&mut self, processes: &[ProcessAccount], workloads: &HashMap<u32, Workload>) {
        // A group's members are counted afresh each window: those it had in the last one and
        // none in this one have none now.
        for group in self.groups.values_mut() {
            group.processes = 0;
        }
        for account in processes {
            let Some(workload) = workloads.get(&account.pid) else {
                continue;
            };
            let share_hours =
                account.window_held_seconds * account.gpu_share.unwrap_or(0.0) / 3600.0;
            let kwh = account.window_energy_joules.unwrap_or(0.0) / 3.6e6;
            for of in groups_of(workload) {
                let group = self
                    .groups
                    .entry((of.kind, of.id.to_owned()))
                    .or_insert_with(|| Rollup::empty(of.kind, of.id.to_owned()));
                if let Some(name) = of.name() {
                    group.name = Some(name.into_owned());
                }
                group.processes += 1;
                group.last_seen = self.windows;
                group.gpu_hours += share_hours;
                group.energy_kwh += kwh;
                if let Some(activity) = account.activity {
                    group.known_hours += share_hours;
                    if activity < ACTIVE_THRESHOLD {
                        group.idle_hours += share_hours;
                    }
                }
            }
        }
        for group in self.groups.values_mut() {
            group.idle_share =
                (group.known_hours > 0.0).then(|| group.idle_hours / group.known_hours);
            group.cost = cost(&self.prices, group.gpu_hours, group.energy_kwh);
        }
        if self.groups.len() > MAX_GROUPS {
            let mut by_age: Vec<(u64, (GroupKind, String))> = self
                .groups
                .iter()
                .map(|(key, g)| (g.last_seen, key.clone()))
                .collect();
            by_age.sort();
            for (_, key) in by_age.into_iter().take(self.groups.len() - MAX_GROUPS) {
                self.groups.remove(&key);
            }
        }
    }

    fn rollups(&self) -> Vec<Rollup> {
        let mut rollups: Vec<Rollup> = self.groups.values().cloned().collect();
        rollups.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        rollups
    }
}

/// A process's activity on a device over one window.
#[derive(Debug, Clone, Default, PartialEq)]
struct Activity {
    value: Option<f64>,
    source: Option<ActivitySource>,
    /// The share of the GPU its activity is relative to: 1, or its MIG instance's slice;
    /// `None` for an instance whose size or whose GPU's memory NVML did not give.
    gpu_share: Option<f64>,
    /// The share of the window's samples that listed it.
    presence: f64,
    mig_uuid: Option<String>,
}

impl Activity {
    fn claim(&self) -> EnergyClaim {
        EnergyClaim {
            activity: self.value,
            gpu_share: self.gpu_share,
            presence: self.presence,
        }
    }
}

/// The activity of each of `on_device` (the processes of `device`, in order), as the module's
/// documentation says.
fn activities(
    window: &Window,
    device: &DeviceWindow,
    on_device: &[&ProcessWindow],
) -> Vec<Activity> {
    // Per-process utilisation is given on this device when any process had a sample of it;
    // then a sample without a process means the process did not run.
    let per_process = on_device.iter().any(|p| p.sm_utilization.is_some());
    // The total NVML gave at discovery, else the window's reading (a driver without
    // `nvmlDeviceGetMemoryInfo_v2` answers only the v1 call the sampler falls back to).
    let device_memory = device
        .info
        .memory_total_bytes
        .map(|b| b as f64)
        .or_else(|| device.last(DeviceField::MemoryTotal));
    let presence =
        |p: &ProcessWindow| (f64::from(p.samples) / f64::from(window.sample_count.max(1))).min(1.0);
    on_device
        .iter()
        .map(|p| {
            if let Some(instance) = window.mig_instance_of(p.pid, &p.device_uuid) {
                // Its size unknown: neither its energy nor its GPU-hours can be weighed.
                let gpu_share = mig_gpu_share(instance.memory_total_bytes, device_memory);
                let value = window
                    .mig_instance_held_alone(p.pid, &p.device_uuid)
                    .and_then(|alone| alone.gpm.mean(GpmField::GraphicsActivity));
                return Activity {
                    value,
                    source: value.map(|_| ActivitySource::MigInstance),
                    gpu_share,
                    presence: presence(p),
                    mig_uuid: Some(instance.info.uuid.clone()),
                };
            }
            let sm_sum = p.sm_utilization.map(|g| g.mean * f64::from(g.count));
            let (value, source) = whole_gpu_activity(
                sm_sum,
                p.samples,
                per_process,
                on_device.len(),
                device.mean(DeviceField::UtilizationGpu),
            );
            Activity {
                value,
                source,
                gpu_share: Some(1.0),
                presence: presence(p),
                mig_uuid: None,
            }
        })
        .collect()
}

/// One group a process counts in (see [`groups_of`]), borrowed from its workload.
pub(crate) struct GroupOf<'w> {
    pub(crate) kind: GroupKind,
    pub(crate) id: &'w str,
    workload: &'w Workload,
}

impl<'w> GroupOf<'w> {
    /// The group's readable name: the container's, or the pod's as `namespace/pod` (its name
    /// alone without a namespace); none for a job. Made only when asked for: the ledger never
    /// needs it.
    pub(crate) fn name(&self) -> Option<Cow<'w, str>> {
        let workload = self.workload;
        match self.kind {
            GroupKind::Job => None,
            GroupKind::Pod => match (&workload.namespace_name, &workload.pod_name) {
                (Some(ns), Some(pod)) => Some(Cow::Owned(format!("{ns}/{pod}"))),
                (None, Some(pod)) => Some(Cow::Borrowed(pod.as_str())),
                _ => None,
            },
            GroupKind::Container => workload.container_name.as_deref().map(Cow::Borrowed),
        }
    }
}

/// The groups a process counts in: its job, pod and container, where known, in that order.
/// Borrowed, not collected: it runs for every process every window.
pub(crate) fn groups_of(workload: &Workload) -> impl Iterator<Item = GroupOf<'_>> {
    [
        (GroupKind::Job, &workload.job_id),
        (GroupKind::Pod, &workload.pod_uid),
        (GroupKind::Container, &workload.container_id),
    ]
    .into_iter()
    .filter_map(move |(kind, id)| id.as_deref().map(|id| GroupOf { kind, id, workload }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::sampling::{
        DeviceInfo, Gauge, GpmWindow, MigInstanceInfo, MigInstanceWindow, ProcessKind,
    };

    const GIB: u64 = 1 << 30;
    const GPU: &str = "GPU-00000000";

    fn t(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn gauge(value: f64, count: u32) -> Gauge {
        Gauge {
            count,
            ..Gauge::single(value)
        }
    }

    /// An 80 GiB GPU whose energy counter reads `energy` joules and whose utilisation is `util`.
    fn device(energy: Option<f64>, util: f64) -> DeviceWindow {
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: GPU.into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:01:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: Some(80 * GIB),
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: Some("9.0".into()),
            fan_count: None,
        });
        let mut d = DeviceWindow::empty(info, t(0));
        d.fields
            .set_gauge(DeviceField::UtilizationGpu, Some(gauge(util, 10)));
        d.fields
            .set_gauge(DeviceField::Power, Some(gauge(200.0, 10)));
        d.fields.set_total(DeviceField::Energy, energy);
        d
    }

    fn process(pid: u32, samples: u32, sm: Option<(f64, u32)>) -> ProcessWindow {
        ProcessWindow {
            pid,
            device_index: 0,
            device_uuid: GPU.into(),
            kind: ProcessKind::Compute,
            first_seen: t(0),
            samples,
            gpu_memory_bytes: Some(gauge(GIB as f64, samples)),
            sm_utilization: sm.map(|(mean, count)| gauge(mean, count)),
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
        }
    }

    fn instance(index: u32, memory: u64, graphics: f64, pids: Vec<u32>) -> MigInstanceWindow {
        MigInstanceWindow {
            info: Arc::new(MigInstanceInfo {
                uuid: format!("MIG-{index}"),
                name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
                parent_uuid: GPU.into(),
                parent_index: 0,
                mig_index: index,
                gpu_instance_id: index + 1,
                compute_instance_id: 0,
            }),
            memory_used_bytes: None,
            memory_free_bytes: None,
            memory_total_bytes: Some(memory),
            gpm: GpmWindow::of([(GpmField::GraphicsActivity, gauge(graphics, 10))]),
            pids,
        }
    }

    /// A 10-sample window `[end - 10 s, end]`.
    fn window(end: u64, devices: Vec<DeviceWindow>, processes: Vec<ProcessWindow>) -> Window {
        Window {
            start: t(end - 10),
            end: t(end),
            sample_count: 10,
            driver_version: None,
            cuda_driver_version: None,
            devices,
            processes,
            xid_events: Vec::new(),
        }
    }

    fn energy(accounts: &Accounts, pid: u32) -> Option<f64> {
        accounts.process(pid, GPU).and_then(|p| p.energy_joules)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn time_sliced_gpu_splits_energy_by_busy_time_and_keeps_the_idle_rest() {
        let mut accountant = GpuAccountant::default();
        let w = window(
            10,
            vec![device(Some(1000.0), 0.6)],
            vec![
                process(1, 10, Some((0.4, 10))),
                process(2, 10, Some((0.2, 10))),
            ],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        assert!(close(energy(&accounts, 1).unwrap(), 400.0));
        assert!(close(energy(&accounts, 2).unwrap(), 200.0));
        let gpu = accounts.device(GPU).expect("device account");
        assert!(close(gpu.unattributed_joules, 400.0));
        for pid in [1, 2] {
            let p = accounts.process(pid, GPU).unwrap();
            assert!(close(p.held_seconds, 10.0));
            assert_eq!(p.active_seconds, Some(10.0));
            assert_eq!(p.activity_source, Some(ActivitySource::ProcessUtilization));
        }

        // The next window charges the counter's delta only; an idle process is held, not active.
        let w = window(
            20,
            vec![device(Some(1500.0), 0.3)],
            vec![process(1, 10, Some((0.3, 10))), process(2, 10, None)],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        assert!(close(energy(&accounts, 1).unwrap(), 400.0 + 150.0));
        assert!(close(energy(&accounts, 2).unwrap(), 200.0));
        let p2 = accounts.process(2, GPU).unwrap();
        assert!(close(p2.held_seconds, 20.0));
        assert_eq!(p2.active_seconds, Some(10.0));
        assert_eq!(p2.idle_seconds, Some(10.0));
        assert_eq!(p2.unknown_seconds, 0.0);
        assert!(close(accounts.device(GPU).unwrap().energy_joules, 1500.0));
    }

    #[test]
    fn overlapping_utilisation_never_charges_more_than_the_device_used() {
        let mut accountant = GpuAccountant::default();
        let w = window(
            10,
            vec![device(Some(700.0), 1.0)],
            vec![
                process(1, 10, Some((0.9, 10))),
                process(2, 10, Some((0.6, 10))),
            ],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        let sum = energy(&accounts, 1).unwrap() + energy(&accounts, 2).unwrap();
        assert!(close(sum, 700.0), "{sum}");
        assert!(energy(&accounts, 1).unwrap() > energy(&accounts, 2).unwrap());
    }

    #[test]
    fn a_process_listed_in_part_of_the_window_is_charged_for_that_part() {
        let mut accountant = GpuAccountant::default();
        // Ran in 5 of 10 samples, busy in all 5: half the window's energy, 5 s held.
        let w = window(
            10,
            vec![device(Some(1000.0), 0.5)],
            vec![process(1, 5, Some((1.0, 5)))],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        assert!(close(energy(&accounts, 1).unwrap(), 500.0));
        assert!(close(accounts.process(1, GPU).unwrap().held_seconds, 5.0));
    }

    #[test]
    fn without_per_process_figures_a_lone_process_takes_the_gpu_and_two_get_nothing() {
        let mut accountant = GpuAccountant::default();
        let w = window(
            10,
            vec![device(Some(1000.0), 0.8)],
            vec![process(1, 10, None)],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        assert!(close(energy(&accounts, 1).unwrap(), 800.0));
        assert_eq!(
            accounts.process(1, GPU).unwrap().activity_source,
            Some(ActivitySource::DeviceUtilization)
        );

        let mut accountant = GpuAccountant::default();
        let w = window(
            10,
            vec![device(Some(1000.0), 0.8)],
            vec![process(1, 10, None), process(2, 10, None)],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        assert_eq!(energy(&accounts, 1), None);
        assert_eq!(accounts.process(2, GPU).unwrap().active_seconds, None);
        assert!(close(
            accounts.device(GPU).unwrap().unattributed_joules,
            1000.0
        ));
    }

    #[test]
    fn mig_alone_takes_its_instance_activity_and_shared_instances_are_not_split() {
        let mut accountant = GpuAccountant::default();
        let mut gpu = device(Some(1000.0), 0.0);
        gpu.fields.set_gauge(DeviceField::UtilizationGpu, None);
        // Instance 0 (40 of 80 GiB) holds process 1 alone at 50 % graphics activity; instance 1
        // (20 GiB) holds processes 2 and 3.
        gpu.mig_instances = vec![
            instance(0, 40 * GIB, 0.5, vec![1]),
            instance(1, 20 * GIB, 0.9, vec![2, 3]),
        ];
        let w = window(
            10,
            vec![gpu],
            vec![
                process(1, 10, None),
                process(2, 10, None),
                process(3, 10, None),
            ],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        let alone = accounts.process(1, GPU).unwrap();
        assert_eq!(alone.activity, Some(0.5));
        assert_eq!(alone.activity_source, Some(ActivitySource::MigInstance));
        assert_eq!(alone.mig_uuid.as_deref(), Some("MIG-0"));
        assert!(close(alone.gpu_share.unwrap(), 0.5));
        assert!(close(alone.energy_joules.unwrap(), 1000.0 * 0.5 * 0.5));
        for pid in [2, 3] {
            let shared = accounts.process(pid, GPU).unwrap();
            assert_eq!(shared.activity, None);
            assert_eq!(shared.energy_joules, None);
            assert_eq!(shared.active_seconds, None);
            assert_eq!(shared.idle_seconds, None);
            assert!(close(shared.held_seconds, 10.0));
            assert!(close(shared.unknown_seconds, 10.0));
            assert!(close(shared.gpu_share.unwrap(), 0.25));
        }
        assert!(close(
            accounts.device(GPU).unwrap().unattributed_joules,
            750.0
        ));
    }

    #[test]
    fn an_instance_of_unknown_size_is_not_charged_and_the_windows_memory_total_is_its_gpus() {
        // No memory total at discovery (a v1-only driver), but the window read one: 80 GiB.
        let mut gpu = device(Some(1000.0), 0.0);
        let mut info = (*gpu.info).clone();
        info.memory_total_bytes = None;
        gpu.info = Arc::new(info);
        gpu.fields
            .set_gauge(DeviceField::MemoryTotal, Some(gauge((80 * GIB) as f64, 10)));
        let mut unsized_instance = instance(1, 20 * GIB, 0.5, vec![2]);
        unsized_instance.memory_total_bytes = None;
        gpu.mig_instances = vec![instance(0, 40 * GIB, 0.5, vec![1]), unsized_instance];
        let w = window(
            10,
            vec![gpu],
            vec![process(1, 10, None), process(2, 10, None)],
        );
        let accounts = GpuAccountant::default().account(&w, &HashMap::new());
        let sized = accounts.process(1, GPU).unwrap();
        assert_eq!(sized.gpu_share, Some(0.5));
        assert!(close(sized.energy_joules.unwrap(), 250.0));
        let unsized_process = accounts.process(2, GPU).unwrap();
        assert_eq!(unsized_process.gpu_share, None);
        assert_eq!(
            unsized_process.activity,
            Some(0.5),
            "its activity is still known"
        );
        assert_eq!(
            unsized_process.energy_joules, None,
            "but not its share of the energy"
        );
        assert!(close(
            accounts.device(GPU).unwrap().unattributed_joules,
            750.0
        ));
    }

    #[test]
    fn without_an_energy_counter_mean_power_times_the_window_is_used() {
        let mut accountant = GpuAccountant::default();
        let w = window(
            10,
            vec![device(None, 0.5)],
            vec![process(1, 10, Some((0.5, 10)))],
        );
        let accounts = accountant.account(&w, &HashMap::new());
        // 200 W over 10 s, half of it busy with process 1.
        assert!(close(accounts.device(GPU).unwrap().energy_joules, 2000.0));
        assert!(close(energy(&accounts, 1).unwrap(), 1000.0));
    }

    fn workload(pid: u32, job: Option<&str>, pod: Option<&str>, container: &str) -> Workload {
        Workload {
            job_id: job.map(str::to_string),
            pod_uid: pod.map(str::to_string),
            pod_name: pod.map(|_| "trainer-0".to_string()),
            namespace_name: pod.map(|_| "ml".to_string()),
            container_id: Some(container.to_string()),
            ..Workload::unresolved(pid)
        }
    }

    #[test]
    fn rollups_sum_hours_energy_idle_and_cost_and_outlive_their_processes() {
        let mut accountant = GpuAccountant::new(Prices {
            per_gpu_hour: Some(2.0),
            per_kwh: Some(0.5),
        });
        let workloads: HashMap<u32, Workload> = [
            (1, workload(1, Some("job-a"), Some("pod-1"), "c1")),
            (2, workload(2, Some("job-a"), None, "c2")),
        ]
        .into_iter()
        .collect();
        // 3600 J, 1 h windows: process 1 busy 50 %, process 2 idle.
        let hour = |end: u64, energy: f64, processes| Window {
            start: t(end - 3600),
            ..window(end, vec![device(Some(energy), 0.5)], processes)
        };
        accountant.account(
            &hour(
                3600,
                3.6e6,
                vec![process(1, 10, Some((0.5, 10))), process(2, 10, None)],
            ),
            &workloads,
        );
        // Process 2 exits; the job keeps its hour.
        let accounts = accountant.account(
            &hour(7200, 7.2e6, vec![process(1, 10, Some((0.5, 10)))]),
            &workloads,
        );
        let job = accounts
            .rollups
            .iter()
            .find(|r| r.kind == GroupKind::Job)
            .expect("the job's roll-up");
        assert_eq!(job.id, "job-a");
        assert_eq!(job.processes, 1);
        assert!(close(job.gpu_hours, 3.0));
        assert!(close(job.energy_kwh, 1.0));
        assert!(close(job.idle_share.unwrap(), 1.0 / 3.0));
        assert!(close(job.cost.unwrap(), 3.0 * 2.0 + 0.5));
        let pod = accounts
            .rollups
            .iter()
            .find(|r| r.kind == GroupKind::Pod)
            .expect("the pod's roll-up");
        assert_eq!(pod.name.as_deref(), Some("ml/trainer-0"));
        assert!(close(pod.gpu_hours, 2.0));
        let c2 = accounts.rollups.iter().find(|r| r.id == "c2").unwrap();
        assert_eq!(c2.processes, 0);
        assert!(close(c2.gpu_hours, 1.0));
        // Per-process figures were given on the GPU: no sample means it did not run.
        assert_eq!(c2.idle_share, Some(1.0));
    }

    proptest::proptest! {
        /// Whatever the processes' figures, what they are charged adds up to at most what the
        /// device used, and each charge is non-negative.
        #[test]
        fn processes_never_sum_above_the_device(
            figures in proptest::collection::vec(
                (1u32..=10, proptest::option::of((0.0f64..=1.0, 1u32..=10))), 0..8),
            energy in 0.0f64..1e6,
        ) {
            let processes: Vec<ProcessWindow> = figures
                .iter()
                .enumerate()
                .map(|(i, (samples, sm))| {
                    process(i as u32 + 1, *samples, sm.map(|(m, c)| (m, c.min(*samples))))
                })
                .collect();
            let w = window(10, vec![device(Some(energy), 0.7)], processes);
            let accounts = GpuAccountant::default().account(&w, &HashMap::new());
            let sum: f64 = accounts.processes.iter().filter_map(|p| p.energy_joules).sum();
            proptest::prop_assert!(accounts.processes.iter().filter_map(|p| p.energy_joules).all(|e| e >= 0.0));
            proptest::prop_assert!(sum <= energy * (1.0 + 1e-12) + 1e-9, "{} > {}", sum, energy);
        }
    }
}
