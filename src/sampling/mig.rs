//! MIG (Multi-Instance GPU): finding the MIG devices of a GPU in MIG mode and reading what NVML
//! gives each of them: identity (`MIG-…` UUID, profile name, GPU and compute instance ids), its
//! memory slice, GPM activity of its GPU instance, and the processes running in it.
//!
//! This module owns the per-GPU MIG state: the MIG mode, asked once and again every
//! [`MODE_RECHECK`] (changing it needs a GPU reset, so it is rare; instances, which can be
//! created and destroyed while the mode is on, are listed every tick), the cached identity of each
//! instance, and which failures were already said. On a GPU in MIG mode NVML answers device and
//! per-process utilisation with "not supported": GPM per GPU instance is the only activity source
//! there, so each instance is sampled through [`GpmReader::read_instance`].
//!
//! Processes are attributed to their instance two ways, because NVML's aggregate process list on
//! the parent GPU needs privileges in MIG mode: the parent's list gives each process's
//! `gpuInstanceId`/`computeInstanceId`, and each MIG handle's own list names the processes in it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};

use super::gpm::GpmReader;
use super::model::{
    DeviceInfo, MigInstanceInfo, MigInstanceSample, ProcessKind, ProcessMig, ProcessSample,
};

/// How often the MIG mode of a GPU is asked again.
pub(crate) const MODE_RECHECK: Duration = Duration::from_secs(60);

/// `nvmlDeviceGetMigMode`'s `currentMode` for MIG on (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLE: u32 = nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE;

/// What gpulse knows about a GPU's MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The GPU (or the library) has no MIG: never asked again.
    Unsupported,
    Off,
    /// MIG on, with room for `max_devices` MIG devices.
    On {
        max_devices: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct ModeState {
    mode: Mode,
    checked: Instant,
}

/// PIDs with their GPU memory (`None`: NVML gave it as not available).
type ListedProcesses = Vec<(u32, Option<u64>)>;

/// What one pass over a GPU's MIG devices found.
#[derive(Debug, Default)]
pub(crate) struct MigReading {
    pub instances: Vec<MigInstanceSample>,
    /// What each MIG device's own compute process list named (for [`attribute_processes`]).
    listed: Vec<(Arc<MigInstanceInfo>, ListedProcesses)>,
    /// NVML error kinds of failed calls, for the sampler's error counts.
    pub errors: Vec<&'static str>,
    /// A call said the GPU is lost.
    pub lost: bool,
    /// The GPU entered or left MIG mode since the previous check: what it said it does not give
    /// (utilisation, in MIG mode) is worth asking again.
    pub mode_changed: bool,
}

/// The MIG state of every GPU of one NVML session.
#[derive(Debug, Default)]
pub(crate) struct MigReader {
    modes: HashMap<u32, ModeState>,
    /// Identity of each MIG device seen, by parent index and MIG UUID.
    infos: HashMap<(u32, String), Arc<MigInstanceInfo>>,
    /// (GPU index, what failed) already warned about.
    warned: HashSet<(u32, &'static str)>,
}

impl MigReader {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The GPU instance ids of the MIG devices of GPU `index` seen in its last pass.
    pub(crate) fn gpu_instance_ids(&self, index: u32) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .infos
            .iter()
            .filter(|((gpu, _), _)| *gpu == index)
            .map(|(_, info)| info.gpu_instance_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Reads the MIG devices of the GPU `parent` (NVML index `info.index`): empty for a GPU not
    /// in MIG mode. GPM per GPU instance comes from `gpm`.
    pub(crate) fn read(
        &mut self,
        nvml: &Nvml,
        gpm: &mut GpmReader,
        info: &DeviceInfo,
        parent: &Device,
        now: Instant,
    ) -> MigReading {
        let index = info.index;
        let mut reading = MigReading::default();
        let Some(max_devices) = self.mode(index, parent, now, &mut reading) else {
            self.forget(gpm, index, &HashSet::new());
            return reading;
        };
        let mut live = HashSet::new();
        for mig_index in 0..max_devices {
            let handle = match parent.mig_device_by_index(mig_index) {
                Ok(handle) => handle,
                // A free slot below the maximum.
                Err(NvmlError::NotFound) => continue,
                // Past the last slot the driver has.
                Err(NvmlError::InvalidArg) => break,
                Err(e) => {
                    if self.failed(index, "list MIG devices", e, &mut reading) {
                        break;
                    }
                    continue;
                }
            };
            let Some(instance_info) = self.instance_info(info, mig_index, &handle, &mut reading)
            else {
                if reading.lost {
                    break;
                }
                continue;
            };
            live.insert(instance_info.uuid.clone());
            let mut sample = MigInstanceSample {
                info: Arc::clone(&instance_info),
                memory_used_bytes: None,
                memory_free_bytes: None,
                memory_total_bytes: None,
                gpm: Default::default(),
            };
            match super::calls::memory_info(nvml, &handle) {
                Ok(m) => {
                    sample.memory_used_bytes = Some(m.used);
                    sample.memory_free_bytes = Some(m.free);
                    sample.memory_total_bytes = Some(m.total);
                }
                Err(e) => {
                    self.failed(index, "read MIG device memory", e, &mut reading);
                }
            }
            match handle.running_compute_processes() {
                Ok(list) => reading.listed.push((
                    Arc::clone(&instance_info),
                    list.iter()
                        .map(|p| (p.pid, used_memory(&p.used_gpu_memory)))
                        .collect(),
                )),
                Err(e) => {
                    self.failed(index, "list MIG device processes", e, &mut reading);
                }
            }
            reading.instances.push(sample);
            if reading.lost {
                break;
            }
        }
        if !reading.lost {
            // GPM is per GPU instance: sampled once per id, shared by its compute instances.
            let mut gis: Vec<u32> = reading
                .instances
                .iter()
                .map(|s| s.info.gpu_instance_id)
                .collect();
            gis.sort_unstable();
            gis.dedup();
            for gi in gis {
                let outcome = gpm.read_instance(index, gi, parent, now);
                reading.errors.extend(outcome.error);
                reading.lost |= outcome.lost;
                for s in reading
                    .instances
                    .iter_mut()
                    .filter(|s| s.info.gpu_instance_id == gi)
                {
                    s.gpm = outcome.activity;
                }
            }
        }
        self.forget(gpm, index, &live);
        reading
    }

    /// The MIG mode of GPU `index` (asked again after [`MODE_RECHECK`]): `Some(max devices)`
    /// when it is on.
    fn mode(
        &mut self,
        index: u32,
        parent: &Device,
        now: Instant,
        reading: &mut MigReading,
    ) -> Option<u32> {
        let known = self.modes.get(&index).copied();
        let fresh = known.is_some_and(|s| now.duration_since(s.checked) < MODE_RECHECK);
        let mode = match known {
            Some(ModeState {
                mode: Mode::Unsupported,
                ..
            }) => Mode::Unsupported,
            Some(state) if fresh => state.mode,
            _ => {
                // A failed check keeps what was known (a transient error is no mode change).
                let mode = self
                    .ask_mode(index, parent, reading)
                    .or(known.map(|s| s.mode))
                    .unwrap_or(Mode::Off);
                let was = known.map(|s| s.mode);
                if mode != was.unwrap_or(Mode::Off) || was.is_none() {
                    say_mode(index, was, mode);
                }
                reading.mode_changed = was.is_some_and(|was| was != mode);
                self.modes.insert(index, ModeState { mode, checked: now });
                mode
            }
        };
        match mode {
            Mode::On { max_devices } => Some(max_devices),
            Mode::Off | Mode::Unsupported => None,
        }
    }

    /// The GPU's MIG mode, `None` when NVML failed to say.
    fn ask_mode(&mut self, index: u32, parent: &Device, reading: &mut MigReading) -> Option<Mode> {
        let current = match parent.mig_mode() {
            Ok(mode) => mode.current,
            Err(e) if no_such_feature(&e) => return Some(Mode::Unsupported),
            Err(e) => {
                self.failed(index, "read the MIG mode", e, reading);
                return None;
            }
        };
        if current != MIG_ENABLE {
            return Some(Mode::Off);
        }
        match parent.mig_device_count() {
            Ok(max_devices) => Some(Mode::On { max_devices }),
            Err(e) => {
                self.failed(index, "read the maximum MIG device count", e, reading);
                None
            }
        }
    }

    /// The cached identity of a MIG device, read the first time its UUID is seen.
    fn instance_info(
        &mut self,
        parent: &DeviceInfo,
        mig_index: u32,
        handle: &Device,
        reading: &mut MigReading,
    ) -> Option<Arc<MigInstanceInfo>> {
        let index = parent.index;
        let uuid = match handle.uuid() {
            Ok(uuid) => uuid,
            Err(e) => {
                self.failed(index, "read a MIG device UUID", e, reading);
                return None;
            }
        };
        let key = (index, uuid);
        if let Some(info) = self.infos.get(&key) {
            if info.mig_index == mig_index && info.parent_uuid == parent.uuid {
                return Some(Arc::clone(info));
            }
        }
        let ids = instance_id(handle, Id::GpuInstance)
            .and_then(|gi| Ok((gi, instance_id(handle, Id::ComputeInstance)?)));
        let (gpu_instance_id, compute_instance_id) = match ids {
            Ok(ids) => ids,
            Err(e) => {
                self.failed(index, "read a MIG device's instance ids", e, reading);
                return None;
            }
        };
        let name = handle.name().unwrap_or_else(|_| "unknown".into());
        let info = Arc::new(MigInstanceInfo {
            uuid: key.1.clone(),
            name,
            parent_uuid: parent.uuid.clone(),
            parent_index: index,
            mig_index,
            gpu_instance_id,
            compute_instance_id,
        });
        self.infos.insert(key, Arc::clone(&info));
        Some(info)
    }

    /// Drops what is kept about MIG devices of GPU `index` that are not in `live` any more.
    fn forget(&mut self, gpm: &mut GpmReader, index: u32, live: &HashSet<String>) {
        self.infos
            .retain(|(gpu, uuid), _| *gpu != index || live.contains(uuid));
        gpm.retain_instances(index, &self.gpu_instance_ids(index));
    }

    /// Records a failed call: counted, warned about once per GPU and kind of call (a feature
    /// the device does not give only at info). Returns whether the GPU is lost.
    fn failed(
        &mut self,
        index: u32,
        action: &'static str,
        error: NvmlError,
        reading: &mut MigReading,
    ) -> bool {
        reading.errors.push(super::calls::error_kind(&error));
        if matches!(error, NvmlError::GpuLost) {
            reading.lost = true;
            return true;
        }
        if self.warned.insert((index, action)) {
            if no_such_feature(&error) {
                tracing::info!(
                    gpu.index = index,
                    "GPU {index} is in MIG mode but NVML could not {action} ({error}); that \
                     part of its MIG devices is left out"
                );
            } else {
                tracing::warn!(
                    gpu.index = index,
                    "NVML failed to {action} on GPU {index} (MIG mode): {error}; gpulse keeps \
                     sampling and will not repeat this warning"
                );
            }
        }
        false
    }
}

/// Logs a change of a GPU's MIG mode (and the first answer), so the log says why a GPU's
/// utilisation is absent and instances appear.
fn say_mode(index: u32, was: Option<Mode>, now: Mode) {
    match now {
        Mode::On { .. } => tracing::info!(
            gpu.index = index,
            "GPU {index} is in MIG mode: each MIG device is reported as a device of its own \
             (hw.id = its MIG UUID, hw.parent = the GPU's UUID); NVML gives no device or \
             per-process utilisation in MIG mode, so those are absent and GPM per instance is \
             the activity signal"
        ),
        Mode::Off if matches!(was, Some(Mode::On { .. })) => tracing::info!(
            gpu.index = index,
            "GPU {index} left MIG mode: its MIG devices are no longer reported"
        ),
        Mode::Off | Mode::Unsupported => {}
    }
}

/// A failure that means the library or the device does not have the feature at all.
fn no_such_feature(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

fn used_memory(used: &UsedGpuMemory) -> Option<u64> {
    match used {
        UsedGpuMemory::Used(bytes) => Some(*bytes),
        UsedGpuMemory::Unavailable => None,
    }
}

#[derive(Clone, Copy)]
enum Id {
    GpuInstance,
    ComputeInstance,
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG handle, which
/// nvml-wrapper 0.13 does not wrap.
fn instance_id(handle: &Device, which: Id) -> Result<u32, NvmlError> {
    let lib = handle.nvml().lib();
    let sym = match which {
        Id::GpuInstance => lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        Id::ComputeInstance => lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    }
    .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id: std::os::raw::c_uint = 0;
    // SAFETY: the handle is live for the borrow of `handle` (it came from this `Nvml`), and `id`
    // is a valid, aligned `unsigned int` the call fills in.
    nvml_try(unsafe { sym(handle.handle(), &mut id) })?;
    Ok(id)
}

/// Points each process of GPU `info` at its MIG device: by the instance ids the parent's list
/// gave, else by which MIG device's own list named it. A process that only a MIG device listed
/// (the parent's aggregate list needs privileges in MIG mode) is added.
pub(crate) fn attribute_processes(
    info: &DeviceInfo,
    reading: &MigReading,
    ids: &HashMap<u32, (Option<u32>, Option<u32>)>,
    processes: &mut Vec<ProcessSample>,
    start: usize,
) {
    if reading.instances.is_empty() {
        return;
    }
    let by_ids = |gi: u32, ci: u32| {
        reading
            .instances
            .iter()
            .map(|s| &s.info)
            .find(|i| i.gpu_instance_id == gi && i.compute_instance_id == ci)
    };
    let by_list = |pid: u32| {
        reading
            .listed
            .iter()
            .find(|(_, pids)| pids.iter().any(|(p, _)| *p == pid))
            .map(|(i, _)| i)
    };
    for process in &mut processes[start..] {
        let instance = match ids.get(&process.pid) {
            Some((Some(gi), Some(ci))) => by_ids(*gi, *ci),
            _ => None,
        }
        .or_else(|| by_list(process.pid));
        process.mig = instance.map(|i| process_mig(i));
    }
    for (instance, pids) in &reading.listed {
        for (pid, memory) in pids {
            if processes[start..].iter().any(|p| p.pid == *pid) {
                continue;
            }
            processes.push(ProcessSample {
                pid: *pid,
                device_index: info.index,
                device_uuid: info.uuid.clone(),
                kind: ProcessKind::Compute,
                gpu_memory_bytes: *memory,
                sm_utilization: None,
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
                mig: Some(process_mig(instance)),
            });
        }
    }
}

fn process_mig(info: &MigInstanceInfo) -> ProcessMig {
    ProcessMig {
        uuid: info.uuid.clone(),
        gpu_instance_id: info.gpu_instance_id,
        compute_instance_id: info.compute_instance_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::GpmActivity;

    fn gpu() -> DeviceInfo {
        DeviceInfo {
            index: 0,
            uuid: "GPU-a".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:10:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: None,
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: Some("9.0".into()),
            fan_count: None,
        }
    }

    fn instance(gi: u32, ci: u32, uuid: &str) -> Arc<MigInstanceInfo> {
        Arc::new(MigInstanceInfo {
            uuid: uuid.into(),
            name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".into(),
            parent_uuid: "GPU-a".into(),
            parent_index: 0,
            mig_index: gi,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        })
    }

    fn reading(instances: &[Arc<MigInstanceInfo>], listed: &[(usize, u32, u64)]) -> MigReading {
        MigReading {
            instances: instances
                .iter()
                .map(|info| MigInstanceSample {
                    info: Arc::clone(info),
                    memory_used_bytes: None,
                    memory_free_bytes: None,
                    memory_total_bytes: None,
                    gpm: GpmActivity::default(),
                })
                .collect(),
            listed: instances
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    let pids = listed
                        .iter()
                        .filter(|(at, _, _)| *at == i)
                        .map(|(_, pid, bytes)| (*pid, Some(*bytes)))
                        .collect();
                    (Arc::clone(info), pids)
                })
                .collect(),
            errors: Vec::new(),
            lost: false,
            mode_changed: false,
        }
    }

    fn listed_by_parent(pid: u32) -> ProcessSample {
        ProcessSample {
            pid,
            device_index: 0,
            device_uuid: "GPU-a".into(),
            kind: ProcessKind::Compute,
            gpu_memory_bytes: Some(1),
            sm_utilization: None,
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
            mig: None,
        }
    }

    #[test]
    fn a_process_goes_to_the_instance_its_ids_name_before_any_handle_list() {
        // Two compute instances in GPU instance 1: only the compute instance id tells them apart.
        let a = instance(1, 0, "MIG-a");
        let b = instance(1, 1, "MIG-b");
        // The MIG handles' lists disagree with the ids (a race between calls): the ids win.
        let r = reading(&[a, b], &[(0, 20, 5)]);
        let ids = HashMap::from([(10, (Some(1), Some(1))), (20, (Some(1), Some(1)))]);
        let mut processes = vec![listed_by_parent(10), listed_by_parent(20)];
        attribute_processes(&gpu(), &r, &ids, &mut processes, 0);
        assert_eq!(processes.len(), 2);
        for p in &processes {
            let mig = p.mig.as_ref().expect("attributed");
            assert_eq!(
                (
                    mig.uuid.as_str(),
                    mig.gpu_instance_id,
                    mig.compute_instance_id
                ),
                ("MIG-b", 1, 1),
                "PID {}",
                p.pid
            );
        }
    }

    #[test]
    fn without_ids_the_mig_handles_own_lists_place_and_add_processes() {
        let a = instance(1, 0, "MIG-a");
        let b = instance(2, 0, "MIG-b");
        // The parent listed PID 10 without ids; PID 30 only a MIG handle listed (the parent's
        // aggregate list needs privileges in MIG mode).
        let r = reading(&[a, b], &[(0, 10, 7), (1, 30, 4096)]);
        let ids = HashMap::from([(10, (None, None))]);
        let mut processes = vec![listed_by_parent(99), listed_by_parent(10)];
        // PID 99 belongs to another GPU listed earlier: untouched.
        processes[0].device_uuid = "GPU-other".into();
        attribute_processes(&gpu(), &r, &ids, &mut processes, 1);
        assert_eq!(processes.len(), 3);
        assert!(processes[0].mig.is_none(), "another GPU's process");
        assert_eq!(
            processes[1].mig.as_ref().map(|m| m.uuid.as_str()),
            Some("MIG-a")
        );
        assert_eq!(
            processes[1].gpu_memory_bytes,
            Some(1),
            "the parent's figure stays"
        );
        let added = &processes[2];
        assert_eq!(added.pid, 30);
        assert_eq!(added.device_uuid, "GPU-a");
        assert_eq!(added.gpu_memory_bytes, Some(4096));
        assert_eq!(added.mig.as_ref().map(|m| m.gpu_instance_id), Some(2));
    }

    #[test]
    fn a_gpu_without_instances_leaves_its_processes_alone() {
        let r = MigReading::default();
        let mut processes = vec![listed_by_parent(10)];
        attribute_processes(&gpu(), &r, &HashMap::new(), &mut processes, 0);
        assert!(processes[0].mig.is_none());
    }
}
