//! The NVML session: opening `libnvidia-ml.so.1` once, caching what never changes about each
//! device, and reading everything that does into a `Snapshot` each tick.
//!
//! NVML failures are told apart at three levels, as the rest of gpulse depends on it:
//! - a **field** the device does not give (`NotSupported`, `NoPermission`, or a function the
//!   library does not export) is omitted, remembered so it is not asked again, and said once in
//!   the log;
//! - a **device** that is lost (`GpuLost`) is reported with `DeviceStatus::Lost` while the others
//!   go on, and is picked up again when it answers;
//! - the **session** (library missing, driver not loaded, NVML uninitialised) fails `open` or
//!   `sample` with a `SessionError` whose message says what to do.
//!
//! Only what NVML returns is reported: nothing here assumes the simulator.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::gpm::GpmReader;
use super::mig::MigReader;
use super::model::{DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample, Snapshot};
use crate::schema::DeviceField;

use DeviceField as F;

/// The library name gpulse loads by default. nvml-wrapper's own default, `libnvidia-ml.so`, only
/// exists where the driver's development package is installed; the `.so.1` is what the driver
/// (and the NVIDIA container runtime) always provides.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// NVML could not be used at all. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error(
        "could not load the NVML library {path:?} ({detail}). Install the NVIDIA driver \
         (it provides libnvidia-ml.so.1), run the container with the NVIDIA container runtime \
         (NVIDIA_DRIVER_CAPABILITIES=utility), or point --nvml-lib / GPULSE_NVML_LIB at the \
         library; for a machine without a GPU, use the simulator: \
         --nvml-lib target/debug/libnvidia_ml.so"
    )]
    LibraryNotFound { path: PathBuf, detail: String },
    #[error(
        "NVML was loaded from {path:?} but reports that the NVIDIA kernel driver is not loaded. \
         Check `nvidia-smi` on the host and that the driver module is loaded (`lsmod | grep nvidia`)"
    )]
    DriverNotLoaded { path: PathBuf },
    #[error(
        "NVML from {path:?} refused access (no permission). Run gpulse with access to the \
         /dev/nvidia* device files (the NVIDIA container runtime provides them)"
    )]
    NoPermission { path: PathBuf },
    #[error("NVML from {path:?} failed to {action}: {source}")]
    Nvml {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: NvmlError,
    },
}

impl SessionError {
    fn classify(path: &Path, action: &'static str, error: NvmlError) -> Self {
        let path = path.to_path_buf();
        match error {
            NvmlError::LibloadingError(e) => Self::LibraryNotFound {
                path,
                detail: e.to_string(),
            },
            NvmlError::LibraryNotFound => Self::LibraryNotFound {
                path,
                detail: "library not found".into(),
            },
            NvmlError::DriverNotLoaded => Self::DriverNotLoaded { path },
            NvmlError::NoPermission => Self::NoPermission { path },
            source => Self::Nvml {
                path,
                action,
                source,
            },
        }
    }

    /// Whether re-opening NVML later may succeed, which is what `--wait-for-gpu` waits for: a
    /// driver not loaded yet, or not installed yet (its library, looked up by name through the
    /// loader's search path, is missing). A library given as a path (`--nvml-lib
    /// /opt/x/libnvidia-ml.so.1`) that cannot be loaded is a configuration mistake that waiting
    /// does not fix.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::LibraryNotFound { path, .. } => !names_a_file(path),
            Self::DriverNotLoaded { .. } | Self::NoPermission { .. } | Self::Nvml { .. } => true,
        }
    }

    /// A short, stable name for counting these errors in gpulse's own metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::LibraryNotFound { .. } => "library_not_found",
            Self::DriverNotLoaded { .. } => "driver_not_loaded",
            Self::NoPermission { .. } => "no_permission",
            Self::Nvml { .. } => "session",
        }
    }
}

/// Whether `lib` names a file (it has a directory part, as `dlopen` reads it) rather than a
/// library name the loader searches for.
fn names_a_file(lib: &Path) -> bool {
    lib.as_os_str().as_encoded_bytes().contains(&b'/')
}

/// One NVML call gpulse makes per device per tick, for remembering which ones a device does not
/// give (and warning once per call). A call that gives one scalar field is named by the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Call {
    Field(DeviceField),
    /// GPU and memory utilisation come from one call.
    Utilization,
    /// Used, free, reserved and total memory come from one call.
    Memory,
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

/// The open NVML session and what it has learnt about the devices.
pub struct Sampler {
    nvml: Arc<Nvml>,
    lib_path: PathBuf,
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
    nvml_version: Option<String>,
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
    nvlink: super::nvlink::NvLinkReader,
    /// MIG mode and the MIG devices of each GPU.
    mig: MigReader,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("lib_path", &self.lib_path)
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl Sampler {
    /// Loads NVML from `lib_path` and initialises it.
    ///
    /// # Errors
    /// A `SessionError` saying why NVML cannot be used and what to do about it.
    pub fn open(lib_path: &Path) -> Result<Self, SessionError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(lib_path))
            .init()
            .map_err(|e| SessionError::classify(lib_path, "initialise", e))?;
        let driver_version = nvml.sys_driver_version().ok();
        let nvml_version = nvml.sys_nvml_version().ok();
        let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        });
        let nvml = Arc::new(nvml);
        Ok(Self {
            gpm: GpmReader::new(Arc::clone(&nvml)),
            mig: MigReader::new(),
            nvml,
            lib_path: lib_path.to_path_buf(),
            driver_version,
            cuda_driver_version,
            nvml_version,
            devices: Vec::new(),
            unsupported: HashSet::new(),
            process_util_seen: HashMap::new(),
            error_counts: BTreeMap::new(),
            warned: HashSet::new(),
            nvlink: Default::default(),
        })
    }

    /// The NVML handle, shared with the XID event thread and `gpulse check`.
    pub fn nvml(&self) -> &Arc<Nvml> {
        &self.nvml
    }

    pub fn lib_path(&self) -> &Path {
        &self.lib_path
    }

    /// NVML errors by kind since the session opened.
    pub fn error_counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.error_counts
    }

    /// Static facts of every device seen so far, by index.
    pub fn device_infos(&self) -> impl Iterator<Item = &Arc<DeviceInfo>> {
        self.devices.iter().flatten()
    }

    /// Takes a first GPM sample on every device that gives GPM, for a caller that samples only
    /// once (`gpulse snapshot`): after waiting [`MIN_PAIR_INTERVAL`](super::gpm::MIN_PAIR_INTERVAL),
    /// `sample` then reports GPM activity. Returns whether any device took one; errors are
    /// left for `sample` to report.
    pub fn prime_gpm(&mut self) -> bool {
        let count = self.nvml.device_count().unwrap_or(0);
        let mut any = false;
        let nvml = Arc::clone(&self.nvml);
        for index in 0..count {
            if let Ok(device) = nvml.device_by_index(index) {
                any |= self.gpm.prime(index, &device);
                // A GPU in MIG mode: list its instances, which takes their first GPM samples.
                if let Ok(info) = self.device_info(index, &device) {
                    let Self { gpm, mig, .. } = &mut *self;
                    let reading = mig.read(&nvml, gpm, &info, &device, std::time::Instant::now());
                    any |= reading
                        .instances
                        .iter()
                        .any(|s| gpm.has_instance_sample(index, s.info.gpu_instance_id));
                }
            }
        }
        any
    }

    /// Reads every device and its processes once.
    ///
    /// # Errors
    /// `SessionError` when NVML as a whole stopped answering (the driver was unloaded, say):
    /// the caller re-opens the session with backoff. A single device failing is not an error:
    /// it is reported as lost in the snapshot.
    pub fn sample(&mut self) -> Result<Snapshot, SessionError> {
        let at = SystemTime::now();
        let count = match self.nvml.device_count() {
            Ok(count) => count,
            Err(e) => {
                self.count_error("session");
                return Err(SessionError::classify(&self.lib_path, "count devices", e));
            }
        };
        let mut devices = Vec::with_capacity(count as usize);
        let mut processes = Vec::new();
        let nvml = Arc::clone(&self.nvml);
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => {
                    let sample = self.sample_device(index, &device, &mut processes);
                    devices.push(sample);
                }
                Err(e) => {
                    self.count_error(error_kind(&e));
                    if !matches!(e, NvmlError::GpuLost) {
                        self.warn_once(index, Call::Utilization, "get a handle", &e);
                    }
                    let info = self.cached_info(index);
                    devices.push(DeviceSample::empty(info, DeviceStatus::Lost));
                }
            }
        }
        Ok(Snapshot {
            at,
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            nvml_version: self.nvml_version.clone(),
            devices,
            processes,
            events: Vec::new(),
        })
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

    fn sample_device(
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
        let nvml_for_memory = Arc::clone(&self.nvml);
        let mut reader = FieldReader {
            sampler: self,
            index,
            lost: false,
        };
        let mut s = DeviceSample::empty(Arc::clone(&info), DeviceStatus::Ok);
        if let Some(u) = reader.read(Call::Utilization, || device.utilization_rates()) {
            s.set(F::UtilizationGpu, Some(percent(u.gpu)));
            s.set(F::UtilizationMemory, Some(percent(u.memory)));
        }
        if let Some(m) = reader.read(Call::Memory, || memory_info(&nvml_for_memory, device)) {
            s.set(F::MemoryUsed, Some(m.used as f64));
            s.set(F::MemoryFree, Some(m.free as f64));
            s.set(F::MemoryReserved, m.reserved.map(|b| b as f64));
            s.set(F::MemoryTotal, Some(m.total as f64));
        }
        reader.field(&mut s, F::UtilizationEncoder, || {
            device.encoder_utilization().map(|u| percent(u.utilization))
        });
        reader.field(&mut s, F::UtilizationDecoder, || {
            device.decoder_utilization().map(|u| percent(u.utilization))
        });
        reader.field(&mut s, F::Temperature, || {
            device.temperature(TemperatureSensor::Gpu).map(f64::from)
        });
        reader.field(&mut s, F::Power, || device.power_usage().map(milli));
        reader.field(&mut s, F::PowerLimit, || {
            device.enforced_power_limit().map(milli)
        });
        reader.field(&mut s, F::Energy, || {
            device
                .total_energy_consumption()
                .map(|mj| mj as f64 / 1000.0)
        });
        for (field, clock) in [
            (F::SmClock, Clock::SM),
            (F::MemoryClock, Clock::Memory),
            (F::GraphicsClock, Clock::Graphics),
        ] {
            reader.field(&mut s, field, || device.clock_info(clock).map(f64::from));
        }
        if let Some(fans) = info.fan_count.filter(|&fans| fans > 0) {
            reader.field(&mut s, F::FanSpeed, || {
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
            reader.field(&mut s, field, || {
                device
                    .pcie_throughput(counter)
                    .map(|kb| f64::from(kb) * 1024.0)
            });
        }
        s.throttle_reasons = reader
            .read(Call::Throttle, || device.current_throttle_reasons())
            .map(|r| r.bits());
        for (field, error) in [
            (F::EccCorrected, MemoryError::Corrected),
            (F::EccUncorrected, MemoryError::Uncorrected),
        ] {
            reader.field(&mut s, field, || {
                device
                    .total_ecc_errors(error, EccCounter::Aggregate)
                    .map(|n| n as f64)
            });
        }
        if let Some(pstate) = reader
            .read(Call::Field(F::PerformanceState), || {
                device.performance_state()
            })
            .and_then(|p| pstate_number(p.as_c()))
        {
            s.set(F::PerformanceState, Some(f64::from(pstate)));
        }
        reader.field(&mut s, F::PcieReplays, || {
            device.pcie_replay_counter().map(f64::from)
        });
        reader.field(&mut s, F::PcieLinkGeneration, || {
            device.current_pcie_link_gen().map(f64::from)
        });
        reader.field(&mut s, F::PcieLinkWidth, || {
            device.current_pcie_link_width().map(f64::from)
        });
        s.remapped_rows = reader.read(Call::RemappedRows, || {
            super::health::remapped_rows(&nvml_for_memory, device)
        });
        s.violation = reader.read(Call::Violation, || super::health::violation_times(device));
        if !reader.lost {
            let gpm = reader
                .sampler
                .gpm
                .read(index, device, std::time::Instant::now());
            if let Some(kind) = gpm.error {
                reader.sampler.count_error(kind);
            }
            reader.lost |= gpm.lost;
            s.gpm = gpm.activity;
        }
        if !reader.lost {
            let nvlink = reader.sampler.nvlink.read(&nvml_for_memory, index, device);
            if let Some(kind) = nvlink.error {
                reader.sampler.count_error(kind);
            }
            reader.lost |= nvlink.lost;
            s.nvlink = nvlink.links;
        }
        let mig = if reader.lost {
            super::mig::MigReading::default()
        } else {
            let Sampler { nvml, gpm, mig, .. } = &mut *reader.sampler;
            let reading = mig.read(nvml, gpm, &info, device, std::time::Instant::now());
            for kind in &reading.errors {
                reader.sampler.count_error(kind);
            }
            reader.lost |= reading.lost;
            if reading.mode_changed {
                // NVML answers utilisation "not supported" only while in MIG mode.
                for field in [Call::Utilization, Call::ProcessUtilization] {
                    reader.sampler.unsupported.remove(&(index, field));
                }
            }
            reading
        };

        let compute = reader
            .read(Call::ComputeProcesses, || {
                device.running_compute_processes()
            })
            .unwrap_or_default();
        let graphics = reader
            .read(Call::GraphicsProcesses, || {
                device.running_graphics_processes()
            })
            .unwrap_or_default();
        let has_processes = !compute.is_empty() || !graphics.is_empty();
        let seen = reader.sampler.process_util_seen.get(&index).copied();
        let utilization = if has_processes {
            reader
                .read(Call::ProcessUtilization, || {
                    match device.process_utilization_stats(seen) {
                        // No sample newer than `seen`: nothing ran, not a failure.
                        Err(NvmlError::NotFound) => Ok(Vec::new()),
                        other => other,
                    }
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let lost = reader.lost;
        if let Some(newest) = utilization.iter().map(|u| u.timestamp).max() {
            self.process_util_seen.insert(index, newest);
        }
        if lost {
            s.status = DeviceStatus::Lost;
            return s;
        }
        let start = processes.len();
        merge_processes(&info, &compute, &graphics, &utilization, processes);
        let instance_ids = compute
            .iter()
            .chain(&graphics)
            .map(|p| (p.pid, (p.gpu_instance_id, p.compute_instance_id)))
            .collect();
        super::mig::attribute_processes(&info, &mig, &instance_ids, processes, start);
        s.mig_instances = mig.instances;
        s
    }

    fn count_error(&mut self, kind: &'static str) {
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
}

/// Reads one field after another on one device, classifying each failure.
struct FieldReader<'s> {
    sampler: &'s mut Sampler,
    index: u32,
    /// Set when a call said the GPU is lost: the remaining fields are not asked this tick.
    lost: bool,
}

impl FieldReader<'_> {
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
        if self.lost || self.sampler.unsupported.contains(&(self.index, field)) {
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
                self.sampler.count_error(error_kind(&e));
                self.sampler.unsupported.insert((self.index, field));
                tracing::info!(
                    gpu.index = self.index,
                    "GPU {} does not give {field} ({e}); it is left out of the metrics",
                    self.index
                );
                None
            }
            Err(NvmlError::GpuLost) => {
                self.sampler.count_error("gpu_lost");
                self.lost = true;
                None
            }
            Err(e) => {
                self.sampler.count_error(error_kind(&e));
                self.sampler
                    .warn_once(self.index, field, "read a field", &e);
                None
            }
        }
    }
}

/// Device memory, as `nvmlDeviceGetMemoryInfo_v2` gives it (with the driver's reserved share), or
/// from the v1 call on a library that predates v2 (drivers before R510), without that share.
pub(super) struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
    pub reserved: Option<u64>,
}

pub(super) fn memory_info(nvml: &Nvml, device: &Device) -> Result<Memory, NvmlError> {
    match device.memory_info() {
        Ok(m) => Ok(Memory {
            total: m.total,
            free: m.free,
            used: m.used,
            reserved: Some(m.reserved),
        }),
        Err(NvmlError::FailedToLoadSymbol(_)) => {
            let v1 = nvml
                .lib()
                .nvmlDeviceGetMemoryInfo
                .as_ref()
                .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
            let mut m = nvml_wrapper_sys::bindings::nvmlMemory_t {
                total: 0,
                free: 0,
                used: 0,
            };
            // SAFETY: the handle is live for the borrow of `device`, and `m` is a valid
            // `nvmlMemory_t` the call fills in.
            let rc = unsafe { v1(device.handle(), &mut m) };
            nvml_wrapper::error::nvml_try(rc)?;
            Ok(Memory {
                total: m.total,
                free: m.free,
                used: m.used,
                reserved: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// Compute and graphics lists merged per PID, with the newest utilisation sample of each PID.
fn merge_processes(
    info: &DeviceInfo,
    compute: &[ProcessInfo],
    graphics: &[ProcessInfo],
    utilization: &[nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample],
    out: &mut Vec<ProcessSample>,
) {
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
    for p in compute {
        push(p, ProcessKind::Compute);
    }
    for p in graphics {
        push(p, ProcessKind::Graphics);
    }
    for process in &mut out[start..] {
        let newest = utilization
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

fn percent(value: u32) -> f64 {
    f64::from(value) / 100.0
}

fn milli(value: u32) -> f64 {
    f64::from(value) / 1000.0
}

/// NVML's `NVML_PSTATE_UNKNOWN` is 32; anything above 15 is not a P-state.
fn pstate_number(raw: u32) -> Option<u32> {
    (raw <= 15).then_some(raw)
}

/// A short, stable name for an NVML error, for counting.
pub fn error_kind(error: &NvmlError) -> &'static str {
    match error {
        NvmlError::NotSupported => "not_supported",
        NvmlError::NoPermission => "no_permission",
        NvmlError::GpuLost => "gpu_lost",
        NvmlError::Timeout => "timeout",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::FailedToLoadSymbol(_) => "function_not_found",
        NvmlError::FunctionNotFound => "function_not_found",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::Unknown => "unknown",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_driver_is_worth_waiting_for() {
        let not_found = |path: &str| SessionError::LibraryNotFound {
            path: path.into(),
            detail: "cannot open shared object file".into(),
        };
        // A path names one file: waiting does not make a wrong one right.
        assert!(!not_found("/nonexistent/libnvidia-ml.so.1").is_transient());
        assert!(!not_found("target/debug/libnvidia_ml.so").is_transient());
        // The default name, searched by the loader: the driver may be installed later.
        assert!(not_found(DEFAULT_NVML_LIB).is_transient());
        let path = PathBuf::from("/usr/lib/libnvidia-ml.so.1");
        assert!(SessionError::DriverNotLoaded { path: path.clone() }.is_transient());
        assert!(SessionError::NoPermission { path }.is_transient());
    }
}
