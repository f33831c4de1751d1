//! One device's tick: its scalar fields (as the schema's device field table lists them), its
//! families (throttle reasons, row remapper, violation times, GPM, NVLink, MIG) and its processes,
//! read through a [`FieldReader`] that tells a field the device does not give from a lost GPU
//! from an unexpected error, as the session module's documentation says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample};
use nvml_wrapper::{Device, Nvml};

use super::calls::{
    applies, error_kind, field_id_batch, is_absent, percent, read_call, read_field_values,
    DeviceCall,
};
use super::gpm::GpmReader;
use super::mig::{MigReader, MigReading};
use super::model::{DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample};
use super::nvlink::NvLinkReader;
use crate::fast_map::{FastMap, FastSet};
use crate::schema::{
    field_calls, field_id_reads, DeviceField, FieldRead, GpmField, NvmlCall, NvmlFieldId,
};

/// What the session has learnt about its devices, and the readers of their families.
pub(super) struct DeviceReader {
    nvml: Arc<Nvml>,
    /// Static facts per NVML index, read the first time the device answered.
    devices: Vec<Option<Arc<DeviceInfo>>>,
    /// Fields a device said it does not give; not asked again in this session.
    unsupported: FastSet<(u32, DeviceCall)>,
    /// Newest per-process utilisation timestamp seen per device (µs), so each call returns only
    /// newer samples.
    process_util_seen: FastMap<u32, u64>,
    /// NVML errors by kind since the session opened, for gpulse's own health metrics.
    error_counts: BTreeMap<&'static str, u64>,
    /// Fields already warned about for unexpected errors, so the log says it once.
    warned: FastSet<(u32, DeviceCall)>,
    /// GPM support, the previous GPM sample and the permission state of each device.
    gpm: GpmReader,
    /// Each device's NVLink link count, learnt once.
    nvlink: NvLinkReader,
    /// MIG mode and the MIG devices of each GPU.
    mig: MigReader,
    /// The schema's device field calls, each with the fields it fills.
    field_calls: Vec<(NvmlCall, Vec<FieldRead>)>,
    /// The schema's field-id rows, read in one `nvmlDeviceGetFieldValues` call per device.
    field_ids: Vec<(NvmlFieldId, FieldRead)>,
}

impl DeviceReader {
    pub(super) fn new(nvml: Arc<Nvml>) -> Self {
        Self {
            gpm: GpmReader::new(Arc::clone(&nvml)),
            mig: MigReader::new(),
            nvlink: NvLinkReader::default(),
            nvml,
            devices: Vec::new(),
            unsupported: FastSet::default(),
            process_util_seen: FastMap::default(),
            error_counts: BTreeMap::new(),
            warned: FastSet::default(),
            field_calls: field_calls(),
            field_ids: field_id_reads(),
        }
    }

    /// Stops reading `fields` and asking GPM for the `gpm` metrics: each call of the field table is made only for the fields it still
    /// fills (not at all when none is left), and the field-id batch asks only for the ids left.
    /// Their values stay `None`, as for a field the device does not give.
    pub(super) fn leave_out(&mut self, fields: &[DeviceField], gpm: &[GpmField]) {
        self.gpm.leave_out(gpm);
        for (_, reads) in &mut self.field_calls {
            reads.retain(|read| !fields.contains(&read.field));
        }
        self.field_calls.retain(|(_, reads)| !reads.is_empty());
        self.field_ids
            .retain(|(_, read)| !fields.contains(&read.field));
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

    fn warn_once(&mut self, index: u32, field: DeviceCall, action: &str, error: &NvmlError) {
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
            self.warn_once(
                index,
                DeviceCall::Field(NvmlCall::UtilizationRates),
                "get a handle",
                error,
            );
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
        let info = Arc::new(read_device_info(index, device)?);
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
                    self.warn_once(
                        index,
                        DeviceCall::Field(NvmlCall::UtilizationRates),
                        "read the identity",
                        &e,
                    );
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

/// A device's static facts, as NVML gives them (the calls made once per device).
pub(super) fn read_device_info(index: u32, device: &Device) -> Result<DeviceInfo, NvmlError> {
    let uuid = device.uuid()?;
    let memory_total_bytes = device.memory_info().ok().map(|m| m.total);
    Ok(DeviceInfo {
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
    })
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
    /// The scalar fields of the schema's device field table, each call made once for the fields
    /// it fills, scaled to their units as the schema says.
    fn fields(&mut self, device: &Device, info: &DeviceInfo, s: &mut DeviceSample) {
        let nvml = Arc::clone(&self.devices.nvml);
        let fans = info.fan_count.unwrap_or(0);
        let calls = std::mem::take(&mut self.devices.field_calls);
        for (call, reads) in &calls {
            if !applies(*call, fans) {
                continue;
            }
            if let Some(answer) = self.read(DeviceCall::Field(*call), || {
                read_call(&nvml, device, *call, fans)
            }) {
                for read in reads {
                    s.set(read.field, answer[read.member].map(|v| v * read.factor));
                }
            }
        }
        self.devices.field_calls = calls;
        self.field_ids(device, s);
    }

    /// The field-id rows: the ids this device has not said it lacks, in one
    /// `nvmlDeviceGetFieldValues` call. A field the device does not give is absent, whether the
    /// call answers so as a whole (a board or driver that gives no field ids, a library without
    /// the function) or one value's own `nvmlReturn` does (no HBM temperature on a GDDR board):
    /// it is left out of this and later calls and said once, and, like NVLink on a PCIe board,
    /// not counted in gpulse.nvml.errors, which counts failures. Any other error of the call or
    /// of a value counts, and a lost GPU stops the tick's remaining reads.
    fn field_ids(&mut self, device: &Device, s: &mut DeviceSample) {
        let index = self.index;
        let unsupported = &self.devices.unsupported;
        let ids = self.devices.field_ids.iter().map(|(id, _)| *id);
        let batch = field_id_batch(ids, |id| {
            unsupported.contains(&(index, DeviceCall::FieldId(id)))
        });
        if batch.is_empty() || self.skips(DeviceCall::FieldValues) {
            return;
        }
        let values = match read_field_values(device, &batch) {
            Ok(values) => values,
            Err(e) if is_absent(&e) => return self.absent(DeviceCall::FieldValues, &e),
            Err(e) => return self.failed(DeviceCall::FieldValues, e),
        };
        for (id, value) in batch.into_iter().zip(values) {
            let Some(read) = self
                .devices
                .field_ids
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, r)| *r)
            else {
                continue;
            };
            match value {
                Ok(v) => s.set(read.field, Some(v * read.factor)),
                Err(e) if is_absent(&e) => self.absent(DeviceCall::FieldId(id), &e),
                Err(e) => self.failed(DeviceCall::FieldId(id), e),
            }
        }
    }

    /// Throttle reasons, the row remapper and violation times.
    fn health(&mut self, device: &Device, s: &mut DeviceSample) {
        let nvml = Arc::clone(&self.devices.nvml);
        s.throttle_reasons = self
            .read(DeviceCall::Throttle, || device.current_throttle_reasons())
            .map(|r| r.bits());
        s.remapped_rows = self.read(DeviceCall::RemappedRows, || {
            super::health::remapped_rows(&nvml, device)
        });
        s.violation = self.read(DeviceCall::Violation, || {
            super::health::violation_times(device)
        });
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
            for call in [
                DeviceCall::Field(NvmlCall::UtilizationRates),
                DeviceCall::ProcessUtilization,
            ] {
                self.devices.unsupported.remove(&(index, call));
            }
        }
        reading
    }

    /// The compute and graphics process lists and, when any process runs, their utilisation
    /// samples newer than the last seen.
    fn process_lists(&mut self, device: &Device) -> ProcessLists {
        let compute = self
            .read(DeviceCall::ComputeProcesses, || {
                device.running_compute_processes()
            })
            .unwrap_or_default();
        let graphics = self
            .read(DeviceCall::GraphicsProcesses, || {
                device.running_graphics_processes()
            })
            .unwrap_or_default();
        let seen = self.devices.process_util_seen.get(&self.index).copied();
        let utilization = if compute.is_empty() && graphics.is_empty() {
            Vec::new()
        } else {
            self.read(DeviceCall::ProcessUtilization, || {
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

    /// Makes `call` unless the GPU was lost this tick or said it does not give `field`. A
    /// field it does not give is left out from then on and counted once in
    /// gpulse.nvml.errors (the field-id rows, read in [`field_ids`](Self::field_ids), are not
    /// counted).
    fn read<T>(
        &mut self,
        field: DeviceCall,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.skips(field) {
            return None;
        }
        match call() {
            Ok(value) => Some(value),
            Err(e) if is_absent(&e) => {
                self.devices.count_error(error_kind(&e));
                self.absent(field, &e);
                None
            }
            Err(e) => {
                self.failed(field, e);
                None
            }
        }
    }

    /// Whether `field` is not asked this tick: the GPU was lost, or it said it does not give it.
    fn skips(&self, field: DeviceCall) -> bool {
        self.lost || self.devices.unsupported.contains(&(self.index, field))
    }

    /// `field` answered an error saying the device does not give it ([`is_absent`]): left out
    /// of the metrics and of later ticks, and said once.
    fn absent(&mut self, field: DeviceCall, error: &NvmlError) {
        let index = self.index;
        self.devices.unsupported.insert((index, field));
        tracing::info!(
            gpu.index = index,
            "GPU {index} does not give {field} ({error}); it is left out of the metrics"
        );
    }

    /// `field` failed otherwise: counted; a lost GPU ends the tick's reads, any other error is
    /// warned about once and asked again next tick.
    fn failed(&mut self, field: DeviceCall, error: NvmlError) {
        self.devices.count_error(error_kind(&error));
        match error {
            NvmlError::GpuLost => self.lost = true,
            e => self
                .devices
                .warn_once(self.index, field, "read a field", &e),
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
