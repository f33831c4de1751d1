//! The rules, one file each: pure functions from `Inputs` (the window, the workloads, their CPU
//! usage, whether their parent is alive, the history, and what the training framework reported)
//! and the rule's thresholds to the findings of this window. No rule keeps state; the history
//! and the tracker do.

pub(crate) mod collective_bound;
pub(crate) mod collective_stall;
pub(crate) mod collectives_unseen;
pub(crate) mod distributed_hang;
pub(crate) mod hardware_errors;
pub(crate) mod idle_holder;
pub(crate) mod input_bound;
pub(crate) mod interconnect_bound;
pub(crate) mod low_sm_efficiency;
pub(crate) mod memory_fragmentation;
pub(crate) mod memory_growth;
pub(crate) mod memory_pressure;
#[cfg(test)]
mod mig_tests;
pub(crate) mod rank_straggler;
mod slope_count;
pub(crate) mod tensor_cores_idle;
pub(crate) mod throttling;
pub(crate) mod uneven_multi_gpu;

use std::collections::HashMap;

use crate::attribution::{ProcessUsage, Workload};
use crate::sampling::{DeviceWindow, GpmWindow, MigInstanceWindow, ProcessWindow, Window};
use crate::schema::DeviceField;

use super::findings::{DeviceRef, Finding, MigRef, Subject};
use super::framework::FrameworkEvidence;
use super::history::{History, Series, WindowSummary};
use crate::config::thresholds::Thresholds;

/// Everything the rules read for one window. Build it after `History::record(window)`.
#[derive(Debug, Clone)]
pub(crate) struct Inputs<'a> {
    pub window: &'a Window,
    /// Attributed identity by host PID; a PID missing here is reported as unresolved.
    pub workloads: &'a HashMap<u32, Workload>,
    /// Job processes that left within the last hour, as last attributed, by host PID.
    pub departed: &'a HashMap<u32, Workload>,
    /// CPU/memory of each GPU process (and its tree) over the window, by host PID.
    pub usage: &'a HashMap<u32, ProcessUsage>,
    /// Whether the parent of each GPU process is still alive (`false`: re-parented to init or
    /// a subreaper after its parent died). A PID missing here is unknown.
    pub parent_alive: &'a HashMap<u32, bool>,
    pub history: &'a History,
    /// The window's processes sorted by host PID, then device index ([`sorted_by_pid`]): sorted
    /// once per window for every rule that groups processes by PID.
    pub by_pid: Vec<&'a ProcessWindow>,
    /// [`main_holders`], found on first use (two rules read it); build it empty.
    pub main_holders: std::cell::OnceCell<Vec<&'a ProcessWindow>>,
    /// What the framework (PyTorch through the companion) reported about each process, by host
    /// PID; empty when nothing was received.
    pub framework: &'a FrameworkEvidence,
}

impl<'a> Inputs<'a> {
    pub(crate) fn device(&self, uuid: &str) -> Option<&'a DeviceWindow> {
        self.window.devices.iter().find(|d| d.info.uuid == uuid)
    }

    /// The subject for a process, filled from its workload when attribution knew it (also when
    /// it has left since).
    pub(crate) fn workload_subject(&self, pid: u32, device: Option<DeviceRef>) -> Subject {
        match self.workloads.get(&pid).or_else(|| self.departed.get(&pid)) {
            Some(w) => Subject::Workload {
                pid,
                vpid: w.vpid,
                device,
                container_id: w.container_id.clone(),
                pod_uid: w.pod_uid.clone(),
                service_name: w.effective_service_name(),
            },
            None => Subject::Workload {
                pid,
                vpid: None,
                device,
                container_id: None,
                pod_uid: None,
                service_name: Workload::unresolved(pid).effective_service_name(),
            },
        }
    }

    /// Whether process `pid` is listed on one GPU only in this window.
    pub(crate) fn on_one_device(&self, pid: u32) -> bool {
        let start = self.by_pid.partition_point(|p| p.pid < pid);
        self.by_pid[start..]
            .iter()
            .take_while(|p| p.pid == pid)
            .count()
            == 1
    }

    /// Processes of the window grouped by host PID, PIDs ascending, devices by index.
    pub(crate) fn processes_by_pid(&self) -> impl Iterator<Item = (u32, &[&'a ProcessWindow])> {
        self.by_pid
            .chunk_by(|a, b| a.pid == b.pid)
            .map(|same_pid| (same_pid[0].pid, same_pid))
    }
}

/// The window's processes sorted by host PID, then device index (a stable sort: the window's
/// order among equals), what [`Inputs::by_pid`] holds.
pub(crate) fn sorted_by_pid(window: &Window) -> Vec<&ProcessWindow> {
    let mut sorted: Vec<&ProcessWindow> = window.processes.iter().collect();
    sorted.sort_by_key(|p| (p.pid, p.device_index));
    sorted
}

pub(crate) fn device_ref(d: &DeviceWindow) -> DeviceRef {
    DeviceRef {
        uuid: d.info.uuid.clone(),
        index: d.info.index,
        mig: None,
    }
}

/// The device of a process, with the MIG instance it ran in on a GPU in MIG mode.
pub(crate) fn process_device_ref_in(window: &Window, p: &ProcessWindow) -> DeviceRef {
    let mut device = process_device_ref(p);
    device.mig = window
        .mig_instance_of(p.pid, &p.device_uuid)
        .map(|m| MigRef {
            uuid: m.info.uuid.clone(),
            gpu_instance_id: m.info.gpu_instance_id,
            compute_instance_id: m.info.compute_instance_id,
            profile: m.info.profile().to_string(),
        });
    device
}

pub(crate) fn process_device_ref(p: &ProcessWindow) -> DeviceRef {
    DeviceRef {
        uuid: p.device_uuid.clone(),
        index: p.device_index,
        mig: None,
    }
}

/// The memory a process can allocate from, as the window's last readings give it: on a GPU in
/// MIG mode its MIG instance's slice (a process cannot allocate outside its instance, so the
/// whole GPU's free memory says nothing about its next allocation), else its GPU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryRoom {
    pub used: Option<u64>,
    pub free: Option<u64>,
    pub total: Option<u64>,
    /// Driver-reserved memory (the whole GPU's; NVML gives a MIG instance none).
    pub reserved: Option<u64>,
    /// The room is a MIG instance's slice.
    pub instance: bool,
}

impl MemoryRoom {
    /// `MIG instance` or `device`, for summaries.
    pub(crate) fn place(&self) -> &'static str {
        if self.instance {
            "MIG instance"
        } else {
            "device"
        }
    }
}

pub(crate) fn memory_room(inputs: &Inputs<'_>, p: &ProcessWindow) -> Option<MemoryRoom> {
    if let Some(m) = inputs.window.mig_instance_of(p.pid, &p.device_uuid) {
        return Some(MemoryRoom {
            used: m.memory_used_bytes,
            free: m.memory_free_bytes,
            total: m.memory_total_bytes,
            reserved: None,
            instance: true,
        });
    }
    let d = inputs.device(&p.device_uuid)?;
    Some(MemoryRoom {
        used: d.last_u64(DeviceField::MemoryUsed),
        free: d.last_u64(DeviceField::MemoryFree),
        total: d
            .last_u64(DeviceField::MemoryTotal)
            .or(d.info.memory_total_bytes),
        reserved: d.last_u64(DeviceField::MemoryReserved),
        instance: false,
    })
}

/// For each device (each MIG instance, on a GPU in MIG mode), the process holding the most GPU
/// memory on it in this window: the one a device-wide GPM condition is reported on. Devices by
/// UUID, then MIG instances by UUID.
pub(crate) fn main_holders<'i, 'a>(inputs: &'i Inputs<'a>) -> &'i [&'a ProcessWindow] {
    inputs
        .main_holders
        .get_or_init(|| find_main_holders(inputs))
}

fn find_main_holders<'a>(inputs: &Inputs<'a>) -> Vec<&'a ProcessWindow> {
    let mut best: std::collections::BTreeMap<(&str, Option<&str>), &'a ProcessWindow> =
        Default::default();
    for p in &inputs.window.processes {
        let held = |p: &ProcessWindow| p.gpu_memory_bytes.map_or(0.0, |g| g.last);
        let instance = inputs
            .window
            .mig_instance_of(p.pid, &p.device_uuid)
            .map(|m| m.info.uuid.as_str());
        let entry = best.entry((p.device_uuid.as_str(), instance)).or_insert(p);
        if held(p) > held(entry) || (held(p) == held(entry) && p.pid < entry.pid) {
            *entry = p;
        }
    }
    best.into_values().collect()
}

/// The trailing run of a series' windows in which `holds` is true: (start of the run, seconds
/// from it to the end of the newest window). `None` when the newest window does not hold.
/// A device's main holder whose history has met `holds` in every window for at least
/// `min_duration`, with the device's current window and the run's start and length (seconds).
pub(crate) struct SustainedHolder<'a> {
    pub process: &'a ProcessWindow,
    pub device: &'a DeviceWindow,
    /// The MIG instance the process ran in, whose figures the condition was judged on.
    pub instance: Option<&'a MigInstanceWindow>,
    pub since: std::time::SystemTime,
    pub seconds: f64,
}

impl SustainedHolder<'_> {
    /// The GPM activity the condition was judged on: the MIG instance's, else the device's.
    pub(crate) fn gpm(&self) -> &GpmWindow {
        self.instance.map_or(&self.device.gpm, |m| &m.gpm)
    }

    /// How busy the device was: GPU-Util, or on MIG (where NVML gives none) the instance's
    /// graphics-engine activity.
    pub(crate) fn utilization(&self) -> Option<crate::sampling::Gauge> {
        match self.instance {
            Some(m) => m.gpm.gauge(crate::schema::GpmField::GraphicsActivity),
            None => self
                .device
                .gauge(crate::schema::DeviceField::UtilizationGpu),
        }
    }
}

/// The main holder of each device whose condition `holds` has lasted `min_duration`: what the
/// GPM rules (`tensor_cores_idle`, `low_sm_efficiency`) report on.
pub(crate) fn sustained_main_holders<'a>(
    inputs: &Inputs<'a>,
    min_duration: std::time::Duration,
    holds: impl Fn(&WindowSummary) -> bool,
) -> Vec<SustainedHolder<'a>> {
    main_holders(inputs)
        .iter()
        .copied()
        .filter_map(|process| {
            let series = inputs.history.series(process.pid, &process.device_uuid)?;
            let (since, seconds) = trailing_run(&series, &holds)?;
            if seconds < min_duration.as_secs_f64() {
                return None;
            }
            Some(SustainedHolder {
                process,
                device: inputs.device(&process.device_uuid)?,
                instance: inputs
                    .window
                    .mig_instance_of(process.pid, &process.device_uuid),
                since,
                seconds,
            })
        })
        .collect()
}

pub(crate) fn trailing_run(
    series: &Series,
    holds: impl Fn(&WindowSummary) -> bool,
) -> Option<(std::time::SystemTime, f64)> {
    let latest = series.latest()?;
    let mut since = None;
    for s in series.summaries().rev() {
        if !holds(&s) {
            break;
        }
        since = Some(s.start);
    }
    let since = since?;
    let seconds = latest
        .end
        .duration_since(since)
        .map_or(0.0, |d| d.as_secs_f64());
    Some((since, seconds))
}

/// Runs every enabled rule, in `RuleId::ALL` order.
pub(crate) fn evaluate_all(inputs: &Inputs<'_>, t: &Thresholds) -> Vec<Finding> {
    if !t.enabled {
        return Vec::new();
    }
    let mut out = Vec::new();
    if t.input_bound.enabled {
        out.extend(input_bound::evaluate(inputs, &t.input_bound));
    }
    if t.memory_pressure.enabled {
        out.extend(memory_pressure::evaluate(inputs, &t.memory_pressure));
    }
    if t.memory_growth.enabled {
        out.extend(memory_growth::evaluate(inputs, &t.memory_growth));
    }
    if t.idle_holder.enabled {
        out.extend(idle_holder::evaluate(inputs, &t.idle_holder));
    }
    if t.throttling.enabled {
        out.extend(throttling::evaluate(inputs, &t.throttling));
    }
    if t.hardware_errors.enabled {
        out.extend(hardware_errors::evaluate(inputs, &t.hardware_errors));
    }
    if t.uneven_multi_gpu.enabled {
        out.extend(uneven_multi_gpu::evaluate(inputs, &t.uneven_multi_gpu));
    }
    if t.memory_fragmentation.enabled {
        out.extend(memory_fragmentation::evaluate(
            inputs,
            &t.memory_fragmentation,
        ));
    }
    if t.tensor_cores_idle.enabled {
        out.extend(tensor_cores_idle::evaluate(inputs, &t.tensor_cores_idle));
    }
    if t.low_sm_efficiency.enabled {
        out.extend(low_sm_efficiency::evaluate(inputs, &t.low_sm_efficiency));
    }
    if t.interconnect_bound.enabled {
        out.extend(interconnect_bound::evaluate(inputs, &t.interconnect_bound));
    }
    if t.rank_straggler.enabled {
        out.extend(rank_straggler::evaluate(inputs, &t.rank_straggler));
    }
    if t.collective_bound.enabled {
        out.extend(collective_bound::evaluate(
            inputs,
            &t.collective_bound,
            &t.rank_straggler,
        ));
    }
    if t.collective_stall.enabled {
        out.extend(collective_stall::evaluate(inputs, &t.collective_stall));
    }
    if t.distributed_hang.enabled {
        out.extend(distributed_hang::evaluate(inputs, &t.distributed_hang));
    }
    if t.collectives_unseen.enabled {
        out.extend(collectives_unseen::evaluate(inputs, &t.collectives_unseen));
    }
    out
}

/// Builders of windows for the rules' unit tests.
#[cfg(test)]
pub(crate) mod testkit {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use crate::attribution::{ProcessUsage, Workload};
    use crate::config::thresholds::HistoryLimits;
    use crate::diagnosis::history::History;
    use crate::sampling::{DeviceInfo, DeviceWindow, Gauge, ProcessKind, ProcessWindow, Window};
    use crate::schema::DeviceField;

    pub(crate) const GIB: u64 = 1024 * 1024 * 1024;

    pub(crate) fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    pub(crate) fn gauge(v: f64) -> Gauge {
        Gauge {
            mean: v,
            min: v,
            max: v,
            last: v,
            count: 10,
        }
    }

    pub(crate) fn info(index: u32) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index,
            uuid: format!("GPU-{index:08}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
            serial: None,
            minor_number: Some(index),
            memory_total_bytes: Some(80 * GIB),
            max_sm_clock_mhz: Some(1980),
            max_memory_clock_mhz: Some(2619),
            compute_capability: Some("9.0".into()),
            fan_count: Some(0),
        })
    }

    pub(crate) fn device(index: u32, util: f64, used: u64) -> DeviceWindow {
        use DeviceField as F;
        let mut d = DeviceWindow::empty(info(index), t(0));
        d.throttle_active_ratio = Some(Default::default());
        for (field, value) in [
            (F::UtilizationGpu, util),
            (F::UtilizationMemory, util / 2.0),
            (F::Temperature, 60.0),
            (F::Power, 300.0),
            (F::SmClock, 1980.0),
            (F::MemoryClock, 2619.0),
            (F::GraphicsClock, 1980.0),
            (F::MemoryUsed, used as f64),
            (F::MemoryFree, (80 * GIB - used) as f64),
            (F::MemoryReserved, 0.0),
            (F::MemoryTotal, (80 * GIB) as f64),
            (F::PowerLimit, 700.0),
            (F::PerformanceState, 0.0),
        ] {
            d.fields.set_gauge(field, Some(gauge(value)));
        }
        for (field, total) in [
            (F::Energy, 1000.0),
            (F::EccCorrected, 0.0),
            (F::EccUncorrected, 0.0),
        ] {
            d.fields.set_total(field, Some(total));
        }
        d
    }

    pub(crate) fn process(pid: u32, device: u32, mem: u64, sm: Option<f64>) -> ProcessWindow {
        ProcessWindow {
            pid,
            device_index: device,
            device_uuid: format!("GPU-{device:08}"),
            kind: ProcessKind::Compute,
            first_seen: t(0),
            samples: 1,
            gpu_memory_bytes: Some(gauge(mem as f64)),
            sm_utilization: sm.map(gauge),
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
        }
    }

    /// A window `[at - 60 s, at]`.
    pub(crate) fn window(
        at: u64,
        devices: Vec<DeviceWindow>,
        processes: Vec<ProcessWindow>,
    ) -> Window {
        Window {
            start: t(at.saturating_sub(60)),
            end: t(at),
            sample_count: 60,
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            devices,
            processes,
            xid_events: Vec::new(),
        }
    }

    /// Owned inputs a test can borrow as `Inputs`.
    pub(crate) struct Fixture {
        pub window: Window,
        pub workloads: HashMap<u32, Workload>,
        pub departed: HashMap<u32, Workload>,
        pub usage: HashMap<u32, ProcessUsage>,
        pub parent_alive: HashMap<u32, bool>,
        pub history: History,
        pub framework: crate::diagnosis::framework::FrameworkEvidence,
    }

    impl Fixture {
        /// Records `windows` in order into a fresh history; the last one is the current window.
        pub(crate) fn new(windows: Vec<Window>) -> Self {
            let mut history = History::new(HistoryLimits::default());
            for w in &windows {
                history.record(w);
            }
            let window = windows
                .into_iter()
                .last()
                .unwrap_or_else(|| super::testkit::window(60, vec![], vec![]));
            Self {
                window,
                workloads: HashMap::new(),
                departed: HashMap::new(),
                usage: HashMap::new(),
                parent_alive: HashMap::new(),
                history,
                framework: Default::default(),
            }
        }

        pub(crate) fn cpu(mut self, pid: u32, own: f64, tree: f64) -> Self {
            self.usage.insert(
                pid,
                ProcessUsage {
                    cpu_utilization: Some(own),
                    tree_cpu_utilization: Some(tree),
                    memory_rss_bytes: Some(GIB),
                },
            );
            self
        }

        pub(crate) fn inputs(&self) -> super::Inputs<'_> {
            super::Inputs {
                by_pid: super::sorted_by_pid(&self.window),
                main_holders: Default::default(),
                window: &self.window,
                workloads: &self.workloads,
                departed: &self.departed,
                usage: &self.usage,
                parent_alive: &self.parent_alive,
                history: &self.history,
                framework: &self.framework,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::*;

    #[test]
    fn processes_by_pid_groups_pids_ascending_with_their_devices_by_index() {
        let processes = vec![
            process(7, 1, GIB, None),
            process(3, 2, GIB, None),
            process(7, 0, GIB, None),
            process(3, 0, GIB, None),
            process(5, 4, GIB, None),
        ];
        let f = Fixture::new(vec![window(60, vec![], processes)]);
        let inputs = f.inputs();
        let grouped: Vec<(u32, Vec<u32>)> = inputs
            .processes_by_pid()
            .map(|(pid, on)| (pid, on.iter().map(|p| p.device_index).collect()))
            .collect();
        assert_eq!(
            grouped,
            vec![(3, vec![0, 2]), (5, vec![4]), (7, vec![0, 1])]
        );
        assert!(inputs.on_one_device(5));
        assert!(!inputs.on_one_device(3), "pid 3 is on GPUs 0 and 2");
        assert!(!inputs.on_one_device(4), "pid 4 is not listed");
    }

    #[test]
    fn main_holders_are_found_once_per_window() {
        let processes = vec![process(7, 1, 2 * GIB, None), process(3, 1, GIB, None)];
        let f = Fixture::new(vec![window(60, vec![], processes)]);
        let inputs = f.inputs();
        let first = super::main_holders(&inputs);
        assert_eq!(first.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![7]);
        // The second call reads what the first found.
        assert!(std::ptr::eq(first, super::main_holders(&inputs)));
    }
}
