//! One device's tick: its scalar fields (as the schema's device field table lists them), its
//! families (throttle reasons, row remapper, violation times, GPM, NVLink, MIG) and its processes,
//! read through a [`FieldReader`] that tells a field the device does not give from a lost GPU
//! from an unexpected error, as the session module's documentation says.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample};
use nvml_wrapper::{Device, Nvml};

use super::calls::{error_kind, memory_info, milli, percent};
use super::gpm::GpmReader;
use super::mig::{MigReader, MigReading};
use super::model::{DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample};
use super::nvlink::NvLinkReader;
use crate::schema::DeviceField;

use DeviceField as F;

/// One NVML call gpulse makes per device per tick, for remembering which ones a device does not
/// give (and warning once per call). A call that gives one scalar field is named by the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Call {
    Field(DeviceField),
    /// GPU and memory utilisation come from one call.
    Utilization,
    /// Used, free, reserved and total memory come from one call.
    Memory,
    /// BAR1 total, used and free come from one call.
    Bar1Memory,
    Throttle,
    ComputeProcesses,
    GraphicsProcesses,
    ProcessUtilization,
    RemappedRows,
    Violation,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Call::Field(field) => write!(f, "{field:?}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// What the session has learnt about its devices, and the readers of their families.
pub(super) struct DeviceReader {
    nvml: Arc<Nvml>,
    /// Static facts per NVML index, read the first time the device answered.
    devices: Vec<Option<Arc<DeviceInfo>>>,
    /// Fields a device said it does not give; not asked again in this session.
    unsupported: HashSet<(u32, Call)>,
    /// Newest per-process utilisation timestamp seen per device (µs), so each call returns only
    /// newer samples.
    process_util_seen: HashMap<u32, u64>,
    /// NVML errors by kind since the session opened, for gpulse's own health metrics.
    error_counts: BTreeMap<&'static str, u64>,
    /// Fields already warned about for unexpected errors, so the log says it once.
    warned: HashSet<(u32, Call)>,
    /// GPM support, the previous GPM sample and the permission state of each device.
    gpm: GpmReader,
    /// Each device's NVLink link count, learnt once.
    nvlink: NvLinkReader,
    /// MIG mode and the MIG devices of each GPU.
    mig: MigReader,
}

impl DeviceReader {
    pub(super) fn new(nvml: Arc<Nvml>) -> Self {
        Self {
            gpm: GpmReader::new(Arc::clone(&nvml)),
            mig: MigReader::new(),
            nvlink: NvLinkReader::default(),
            nvml,
            devices: Vec::new(),
            unsupported: HashSet::new(),
            process_util_seen: HashMap::new(),
            error_counts: BTreeMap::new(),
            warned: HashSet::new(),
        }
    }

    /// NVML errors by kind since the session opened.
    pub(super) fn error_counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.error_counts
    }

    /// Static facts of every device seen so far, by index.
    pub(super) fn device_infos(&self) -> impl Iterator<Item = &Arc<DeviceInfo>> {
        self.devices.iter().flatten()
    }

    pub(super) fn count_error(&mut self, kind: &'static str) {
        *self.error_counts.entry(kind).or_insert(0) += 1;
    }

    fn warn_once(&mut self, index: u32, field: Call, action: &str, error: &NvmlError) {
        if self.warned.insert((index, field)) {
            tracing::warn!(
                gpu.index = index,
                "NVML failed to {action} ({field}) on GPU {index}: {error}; \
                 gpulse keeps sampling and will not repeat this warning"
            );
        }
    }

    /// Takes a first GPM sample of the device and, in MIG mode, of its instances (listing them
    /// takes it); whether any was taken.
    pub(super) fn prime_gpm(&mut self, index: u32, device: &Device) -> bool {
        let mut any = self.gpm.prime(index, device);
        if let Ok(info) = self.device_info(index, device) {
            let Self { nvml, gpm, mig, .. } = self;
            let reading = mig.read(nvml, gpm, &info, device, Instant::now());
            any |= reading
                .instances
                .iter()
                .any(|s| gpm.has_instance_sample(index, s.info.gpu_instance_id));
        }
        any
    }

    /// The sample of a device NVML gave no handle for: lost, under the facts last seen.
    pub(super) fn no_handle(&mut self, index: u32, error: &NvmlError) -> DeviceSample {
        self.count_error(error_kind(error));
        if !matches!(error, NvmlError::GpuLost) {
            self.warn_once(index, Call::Utilization, "get a handle", error);
        }
        DeviceSample::empty(self.cached_info(index), DeviceStatus::Lost)
    }

    /// The cached facts of a device, or a placeholder naming only its index when it has never
    /// answered (it was lost before gpulse first saw it).
    fn cached_info(&self, index: u32) -> Arc<DeviceInfo> {
        if let Some(Some(info)) = self.devices.get(index as usize) {
            return Arc::clone(info);
        }
        Arc::new(DeviceInfo {
            index,
            uuid: format!("unknown-nvml-index-{index}"),
            name: "unknown".into(),
            pci_bus_id: String::new(),
            serial: None,
            minor_number: None,
            memory_total_bytes: None,
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        })
    }

    /// Static facts, read once per device; read again if the UUID at this index changed
    /// (a different board after a reset or hot-plug).
    fn device_info(&mut self, index: u32, device: &Device) -> Result<Arc<DeviceInfo>, NvmlError> {
        let slot = index as usize;
        if self.devices.len() <= slot {
            self.devices.resize(slot + 1, None);
        }
        if let Some(info) = &self.devices[slot] {
            return Ok(Arc::clone(info));
        }
        let uuid = device.uuid()?;
        let memory_total_bytes = device.memory_info().ok().map(|m| m.total);
        let info = Arc::new(DeviceInfo {
            index,
            uuid,
            name: device.name().unwrap_or_else(|_| "unknown".into()),
            pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            serial: device.serial().ok(),
            minor_number: device.minor_number().ok(),
            memory_total_bytes,
            max_sm_clock_mhz: device.max_clock_info(Clock::SM).ok(),
            max_memory_clock_mhz: device.max_clock_info(Clock::Memory).ok(),
            compute_capability: device
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            fan_count: device.num_fans().ok(),
        });
        self.devices[slot] = Some(Arc::clone(&info));
        Ok(info)
    }

    /// Reads one device: its fields, its families and its processes (appended to `processes`).
    pub(super) fn sample(
        &mut self,
        index: u32,
        device: &Device,
        processes: &mut Vec<ProcessSample>,
    ) -> DeviceSample {
        let info = match self.device_info(index, device) {
            Ok(info) => info,
            Err(e) => {
                self.count_error(error_kind(&e));
                if !matches!(e, NvmlError::GpuLost) {
                    self.warn_once(index, Call::Utilization, "read the identity", &e);
                }
                return DeviceSample::empty(self.cached_info(index), DeviceStatus::Lost);
            }
        };
        let mut s = DeviceSample::empty(Arc::clone(&info), DeviceStatus::Ok);
        let mut reader = FieldReader {
            devices: self,
            index,
            lost: false,
        };
        reader.fields(device, &info, &mut s);
        reader.health(device, &mut s);
        let mig = reader.families(device, &info, &mut s);
        let lists = reader.process_lists(device);
        if reader.lost {
            s.status = DeviceStatus::Lost;
            return s;
        }
        let start = processes.len();
        merge_processes(&info, &lists, processes);
        let instance_ids = lists
            .compute
            .iter()
            .chain(&lists.graphics)
            .map(|p| (p.pid, (p.gpu_instance_id, p.compute_instance_id)))
            .collect();
        super::mig::attribute_processes(&info, &mig, &instance_ids, processes, start);
        s.mig_instances = mig.instances;
        s
    }
}

/// A device's process lists and the per-process utilisation samples newer than the last seen.
#[derive(Default)]
struct ProcessLists {
    compute: Vec<ProcessInfo>,
    graphics: Vec<ProcessInfo>,
    utilization: Vec<ProcessUtilizationSample>,
}

/// Reads one field after another on one device, classifying each failure.
struct FieldReader<'s> {
    devices: &'s mut DeviceReader,
    index: u32,
    /// Set when a call said the GPU is lost: the remaining fields are not asked this tick.
    lost: bool,
}

impl FieldReader<'_> {
    /// The scalar fields of the schema's device field table, each from its NVML call.
    fn fields(&mut self, device: &Device, info: &DeviceInfo, s: &mut DeviceSample) {
        let nvml = Arc::clone(&self.devices.nvml);
        if let Some(u) = self.read(Call::Utilization, || device.utilization_rates()) {
            s.set(F::UtilizationGpu, Some(percent(u.gpu)));
            s.set(F::UtilizationMemory, Some(percent(u.memory)));
        }
        if let Some(m) = self.read(Call::Memory, || memory_info(&nvml, device)) {
            s.set(F::MemoryUsed, Some(m.used as f64));
            s.set(F::MemoryFree, Some(m.free as f64));
            s.set(F::MemoryReserved, m.reserved.map(|b| b as f64));
            s.set(F::MemoryTotal, Some(m.total as f64));
        }
        if let Some(m) = self.read(Call::Bar1Memory, || device.bar1_memory_info()) {
            s.set(F::Bar1Total, Some(m.total as f64));
            s.set(F::Bar1Used, Some(m.used as f64));
            s.set(F::Bar1Free, Some(m.free as f64));
        }
        self.field(s, F::UtilizationEncoder, || {
            device.encoder_utilization().map(|u| percent(u.utilization))
        });
        self.field(s, F::UtilizationDecoder, || {
            device.decoder_utilization().map(|u| percent(u.utilization))
        });
        self.field(s, F::Temperature, || {
            device.temperature(TemperatureSensor::Gpu).map(f64::from)
        });
        self.field(s, F::Power, || device.power_usage().map(milli));
        self.field(s, F::PowerLimit, || {
            device.enforced_power_limit().map(milli)
        });
        self.field(s, F::Energy, || {
            device
                .total_energy_consumption()
                .map(|mj| mj as f64 / 1000.0)
        });
        for (field, clock) in [
            (F::SmClock, Clock::SM),
            (F::MemoryClock, Clock::Memory),
            (F::GraphicsClock, Clock::Graphics),
        ] {
            self.field(s, field, || device.clock_info(clock).map(f64::from));
        }
        if let Some(fans) = info.fan_count.filter(|&fans| fans > 0) {
            self.field(s, F::FanSpeed, || {
                let mut total = 0u32;
                for fan in 0..fans {
                    total += device.fan_speed(fan)?;
                }
                Ok(percent(total) / f64::from(fans))
            });
        }
        // NVML reports PCIe throughput in KB/s.
        for (field, counter) in [
            (F::PcieTx, PcieUtilCounter::Send),
            (F::PcieRx, PcieUtilCounter::Receive),
        ] {
            self.field(s, field, || {
                device
                    .pcie_throughput(counter)
                    .map(|kb| f64::from(kb) * 1024.0)
            });
        }
        for (field, error) in [
            (F::EccCorrected, MemoryError::Corrected),
            (F::EccUncorrected, MemoryError::Uncorrected),
        ] {
            self.field(s, field, || {
                device
                    .total_ecc_errors(error, EccCounter::Aggregate)
                    .map(|n| n as f64)
            });
        }
        if let Some(pstate) = self
            .read(Call::Field(F::PerformanceState), || {
                device.performance_state()
            })
            .and_then(|p| pstate_number(p.as_c()))
        {
            s.set(F::PerformanceState, Some(f64::from(pstate)));
        }
        self.field(s, F::PcieReplays, || {
            device.pcie_replay_counter().map(f64::from)
        });
        self.field(s, F::PcieLinkGeneration, || {
            device.current_pcie_link_gen().map(f64::from)
        });
        self.field(s, F::PcieLinkWidth, || {
            device.current_pcie_link_width().map(f64::from)
        });
    }

    /// Throttle reasons, the row remapper and violation times.
    fn health(&mut self, device: &Device, s: &mut DeviceSample) {
        let nvml = Arc::clone(&self.devices.nvml);
        s.throttle_reasons = self
            .read(Call::Throttle, || device.current_throttle_reasons())
            .map(|r| r.bits());
        s.remapped_rows = self.read(Call::RemappedRows, || {
            super::health::remapped_rows(&nvml, device)
        });
        s.violation = self.read(Call::Violation, || super::health::violation_times(device));
    }

    /// GPM activity and NVLink links into the sample; the MIG reading, for placing processes.
    /// Nothing is asked of a GPU already lost this tick.
    fn families(&mut self, device: &Device, info: &DeviceInfo, s: &mut DeviceSample) -> MigReading {
        let index = self.index;
        if !self.lost {
            let gpm = self.devices.gpm.read(index, device, Instant::now());
            if let Some(kind) = gpm.error {
                self.devices.count_error(kind);
            }
            self.lost |= gpm.lost;
            s.gpm = gpm.activity;
        }
        if !self.lost {
            let nvlink = self.devices.nvlink.read(&self.devices.nvml, index, device);
            if let Some(kind) = nvlink.error {
                self.devices.count_error(kind);
            }
            self.lost |= nvlink.lost;
            s.nvlink = nvlink.links;
        }
        if self.lost {
            return MigReading::default();
        }
        let DeviceReader { nvml, gpm, mig, .. } = &mut *self.devices;
        let reading = mig.read(nvml, gpm, info, device, Instant::now());
        for kind in &reading.errors {
            self.devices.count_error(kind);
        }
        self.lost |= reading.lost;
        if reading.mode_changed {
            // NVML answers utilisation "not supported" only while in MIG mode.
            for call in [Call::Utilization, Call::ProcessUtilization] {
                self.devices.unsupported.remove(&(index, call));
            }
        }
        reading
    }

    /// The compute and graphics process lists and, when any process runs, their utilisation
    /// samples newer than the last seen.
    fn process_lists(&mut self, device: &Device) -> ProcessLists {
        let compute = self
            .read(Call::ComputeProcesses, || {
                device.running_compute_processes()
            })
            .unwrap_or_default();
        let graphics = self
            .read(Call::GraphicsProcesses, || {
                device.running_graphics_processes()
            })
            .unwrap_or_default();
        let seen = self.devices.process_util_seen.get(&self.index).copied();
        let utilization = if compute.is_empty() && graphics.is_empty() {
            Vec::new()
        } else {
            self.read(Call::ProcessUtilization, || {
                match device.process_utilization_stats(seen) {
                    // No sample newer than `seen`: nothing ran, not a failure.
                    Err(NvmlError::NotFound) => Ok(Vec::new()),
                    other => other,
                }
            })
            .unwrap_or_default()
        };
        if let Some(newest) = utilization.iter().map(|u| u.timestamp).max() {
            self.devices.process_util_seen.insert(self.index, newest);
        }
        ProcessLists {
            compute,
            graphics,
            utilization,
        }
    }

    /// Reads one scalar field into the sample; a failed read leaves it unknown.
    fn field(
        &mut self,
        sample: &mut DeviceSample,
        field: DeviceField,
        call: impl FnOnce() -> Result<f64, NvmlError>,
    ) {
        let value = self.read(Call::Field(field), call);
        sample.set(field, value);
    }

    fn read<T>(&mut self, field: Call, call: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.lost || self.devices.unsupported.contains(&(self.index, field)) {
            return None;
        }
        match call() {
            Ok(value) => Some(value),
            // A library without the function (an older driver, another implementation of
            // the header) will never have it: the same as a field the device does not give.
            Err(
                e @ (NvmlError::NotSupported
                | NvmlError::NoPermission
                | NvmlError::FailedToLoadSymbol(_)
                | NvmlError::FunctionNotFound),
            ) => {
                self.devices.count_error(error_kind(&e));
                self.devices.unsupported.insert((self.index, field));
                tracing::info!(
                    gpu.index = self.index,
                    "GPU {} does not give {field} ({e}); it is left out of the metrics",
                    self.index
                );
                None
            }
            Err(NvmlError::GpuLost) => {
                self.devices.count_error("gpu_lost");
                self.lost = true;
                None
            }
            Err(e) => {
                self.devices.count_error(error_kind(&e));
                self.devices
                    .warn_once(self.index, field, "read a field", &e);
                None
            }
        }
    }
}

/// Compute and graphics lists merged per PID, with the newest utilisation sample of each PID.
fn merge_processes(info: &DeviceInfo, lists: &ProcessLists, out: &mut Vec<ProcessSample>) {
    let start = out.len();
    let mut push = |p: &ProcessInfo, kind: ProcessKind| {
        let memory = match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        if let Some(existing) = out[start..].iter_mut().find(|e| e.pid == p.pid) {
            if existing.kind != kind {
                existing.kind = ProcessKind::ComputeAndGraphics;
            }
            existing.gpu_memory_bytes = existing.gpu_memory_bytes.max(memory);
            return;
        }
        out.push(ProcessSample {
            pid: p.pid,
            device_index: info.index,
            device_uuid: info.uuid.clone(),
            kind,
            gpu_memory_bytes: memory,
            sm_utilization: None,
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
            mig: None,
        });
    };
    for p in &lists.compute {
        push(p, ProcessKind::Compute);
    }
    for p in &lists.graphics {
        push(p, ProcessKind::Graphics);
    }
    for process in &mut out[start..] {
        let newest = lists
            .utilization
            .iter()
            .filter(|u| u.pid == process.pid)
            .max_by_key(|u| u.timestamp);
        if let Some(u) = newest {
            process.sm_utilization = Some(percent(u.sm_util));
            process.memory_utilization = Some(percent(u.mem_util));
            process.encoder_utilization = Some(percent(u.enc_util));
            process.decoder_utilization = Some(percent(u.dec_util));
        }
    }
}

/// NVML's `NVML_PSTATE_UNKNOWN` is 32; anything above 15 is not a P-state.
fn pstate_number(raw: u32) -> Option<u32> {
    (raw <= 15).then_some(raw)
}
