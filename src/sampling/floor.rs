//! The benchmark floor: every NVML call [`Sampler::sample`](super::Sampler::sample) makes on a
//! device each tick, and nothing else. gpulse's cost is reported as a multiple of this one's
//! (examples/bench_floor.rs runs it as a process, benches/hotpath times one tick of it).
//!
//! The scalar fields' calls are not listed here: they come from the schema
//! ([`field_calls`]), made through the sampler's own `read_call`, and the field-id rows
//! ([`field_id_reads`]) in one `nvmlDeviceGetFieldValues` call through its `read_field_values`,
//! leaving out ids the device said it lacks, so a field added to the schema is in the floor
//! with no change here. Then, as the sampler makes them: throttle reasons, the row remapper and
//! violation times; GPM, NVLink and MIG through the sampler's own
//! readers (their bookkeeping, pairing GPM samples and learning link counts and MIG devices,
//! decides which calls are made); the compute and graphics process lists and, when a process
//! runs, the per-process utilisation. A call that once said the device does not give it is not
//! made again, as in the sampler. Left out is all that is not a call: classifying errors,
//! building the `DeviceSample` and the `Snapshot`, merging process lists, placing processes on
//! MIG instances. `tests/floor.rs` counts the calls of both per C function in nvml-sim and fails
//! when they differ.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::calls::{applies, field_id_batch, is_absent, read_call, read_field_values, DeviceCall};
use super::device::read_device_info;
use super::gpm::GpmReader;
use super::health::{remapped_rows, violation_times};
use super::mig::MigReader;
use super::model::DeviceInfo;
use super::nvlink::NvLinkReader;
use crate::schema::{field_calls, field_id_reads, NvmlCall, NvmlFieldId};

/// The floor's state between ticks: what each device does not give, and the family readers'.
pub struct Floor {
    nvml: Arc<Nvml>,
    field_calls: Vec<NvmlCall>,
    field_ids: Vec<NvmlFieldId>,
    absent: HashSet<(u32, DeviceCall)>,
    /// Static facts per device (its fan count, and its identity for MIG), read on its first
    /// tick as the sampler reads them.
    infos: HashMap<u32, DeviceInfo>,
    process_util_seen: HashMap<u32, u64>,
    gpm: GpmReader,
    nvlink: NvLinkReader,
    mig: MigReader,
    pids: Vec<u32>,
}

impl std::fmt::Debug for Floor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Floor")
            .field("devices", &self.infos.len())
            .finish()
    }
}

impl Floor {
    pub fn new(nvml: Arc<Nvml>) -> Self {
        Self {
            gpm: GpmReader::new(Arc::clone(&nvml)),
            nvml,
            field_calls: field_calls().into_iter().map(|(call, _)| call).collect(),
            field_ids: field_id_reads().into_iter().map(|(id, _)| id).collect(),
            absent: HashSet::new(),
            infos: HashMap::new(),
            process_util_seen: HashMap::new(),
            nvlink: NvLinkReader::default(),
            mig: MigReader::new(),
            pids: Vec::new(),
        }
    }

    /// One tick: every device's calls. Returns a checksum of the answers, for the caller to
    /// keep (so nothing is optimised away).
    pub fn tick(&mut self) -> u64 {
        self.pids.clear();
        let nvml = Arc::clone(&self.nvml);
        let count = nvml.device_count().unwrap_or(0);
        let mut sum = 0u64;
        for index in 0..count {
            if let Ok(device) = nvml.device_by_index(index) {
                sum = sum.wrapping_add(self.device(index, &device));
            }
        }
        sum
    }

    /// The GPU PIDs the last tick's process lists named (with repeats).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    fn device(&mut self, index: u32, device: &Device) -> u64 {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.infos.entry(index) {
            match read_device_info(index, device) {
                Ok(info) => slot.insert(info),
                Err(_) => return 0,
            };
        }
        let fans = self.infos[&index].fan_count.unwrap_or(0);
        let mut sum = 0f64;
        let nvml = Arc::clone(&self.nvml);
        for i in 0..self.field_calls.len() {
            let call = self.field_calls[i];
            if applies(call, fans) {
                let answer = self.call(index, DeviceCall::Field(call), || {
                    read_call(&nvml, device, call, fans)
                });
                sum += answer.into_iter().flatten().flatten().sum::<f64>();
            }
        }
        let absent = &self.absent;
        let batch = field_id_batch(self.field_ids.iter().copied(), |id| {
            absent.contains(&(index, DeviceCall::FieldId(id)))
        });
        if !batch.is_empty() {
            let values = self.call(index, DeviceCall::FieldValues, || {
                read_field_values(device, &batch)
            });
            for (id, value) in batch.into_iter().zip(values.into_iter().flatten()) {
                match value {
                    Ok(v) => sum += v,
                    Err(e) if is_absent(&e) => {
                        self.absent.insert((index, DeviceCall::FieldId(id)));
                    }
                    Err(_) => {}
                }
            }
        }
        let throttle = self.call(index, DeviceCall::Throttle, || {
            device.current_throttle_reasons()
        });
        sum += throttle.map_or(0.0, |r| r.bits() as f64);
        let remap = self.call(index, DeviceCall::RemappedRows, || {
            remapped_rows(&nvml, device)
        });
        sum += remap.map_or(0.0, |r| f64::from(r.correctable));
        let violation = self.call(index, DeviceCall::Violation, || violation_times(device));
        sum += violation.map_or(0.0, |v| v.nanoseconds.iter().flatten().count() as f64);
        sum += self.families(index, device);
        sum += self.processes(index, device);
        sum as u64
    }

    /// GPM, NVLink and MIG, through the sampler's readers.
    fn families(&mut self, index: u32, device: &Device) -> f64 {
        let gpm = self.gpm.read(index, device, Instant::now());
        let nvlink = self.nvlink.read(&self.nvml, index, device);
        let info = &self.infos[&index];
        let mig = self
            .mig
            .read(&self.nvml, &mut self.gpm, info, device, Instant::now());
        if mig.mode_changed {
            for call in [
                DeviceCall::Field(NvmlCall::UtilizationRates),
                DeviceCall::ProcessUtilization,
            ] {
                self.absent.remove(&(index, call));
            }
        }
        let active = f64::from(u8::from(!gpm.activity.is_empty()));
        active + nvlink.links.len() as f64 + mig.instances.len() as f64
    }

    /// The process lists and, when a process runs, the utilisation samples newer than the last
    /// seen.
    fn processes(&mut self, index: u32, device: &Device) -> f64 {
        let compute = self
            .call(index, DeviceCall::ComputeProcesses, || {
                device.running_compute_processes()
            })
            .unwrap_or_default();
        let graphics = self
            .call(index, DeviceCall::GraphicsProcesses, || {
                device.running_graphics_processes()
            })
            .unwrap_or_default();
        self.pids
            .extend(compute.iter().chain(&graphics).map(|p| p.pid));
        if compute.is_empty() && graphics.is_empty() {
            return 0.0;
        }
        let seen = self.process_util_seen.get(&index).copied();
        let samples = self
            .call(index, DeviceCall::ProcessUtilization, || {
                match device.process_utilization_stats(seen) {
                    Err(NvmlError::NotFound) => Ok(Vec::new()),
                    other => other,
                }
            })
            .unwrap_or_default();
        if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
            self.process_util_seen.insert(index, newest);
        }
        (compute.len() + graphics.len() + samples.len()) as f64
    }

    /// Makes a call unless the device said it does not give it; remembers when it says so.
    fn call<T>(
        &mut self,
        index: u32,
        call: DeviceCall,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.absent.contains(&(index, call)) {
            return None;
        }
        match f() {
            Ok(value) => Some(value),
            Err(e) => {
                if is_absent(&e) {
                    self.absent.insert((index, call));
                }
                None
            }
        }
    }
}
