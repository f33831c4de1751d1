//! `gpulse::otel` (cargo feature `otel-sdk`): GPU observable instruments on a Rust program's own
//! OpenTelemetry `Meter`, for programs that already run the OTel SDK and want their GPU next to
//! their other metrics, under their own `service.name`, without a sidecar.
//!
//! It owns the instruments and the cache between them: every instrument's callback reads one
//! shared reading of gpulse's own [`Sampler`] (the same NVML code the sidecar runs, no second
//! implementation), taken at most once per collection: the first callback of a collection samples,
//! the others reuse that reading while it is younger than [`GpuMetricsOptions::max_reading_age`].
//! Names, units and attributes are the sidecar's (docs/metrics.md, "Metric reference"), with one
//! difference in meaning: the sidecar's gauges are means over its export window, these are the
//! values NVML gives at collection time.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let meter = opentelemetry::global::meter("my-app");
//! let gpu = gpulse::otel::GpuMetrics::open(std::path::Path::new("libnvidia-ml.so.1"))?;
//! let _registration = gpu.register(&meter, gpulse::otel::GpuMetricsOptions::default());
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{AsyncInstrument, Meter, ObservableGauge, ObservableUpDownCounter};
use opentelemetry::KeyValue;

use crate::sampling::{DeviceSample, DeviceStatus, ProcessSample, Sampler, SessionError, Snapshot};
use crate::schema::attributes::AttributeId as A;
use crate::schema::DeviceField;
use crate::schema::MetricId;

/// An open NVML session, ready to register instruments on a `Meter`.
#[derive(Debug)]
pub struct GpuMetrics {
    sampler: Sampler,
}

/// What [`GpuMetrics::register`] reports, and for which processes.
#[derive(Debug, Clone)]
pub struct GpuMetricsOptions {
    /// The PIDs, as NVML reports them (host PIDs), whose `process.gpu.*` metrics to report.
    /// Default: this process's PID, which is the host PID unless the program runs in its own
    /// PID namespace (a container without `hostPID`); there, give the host PID here.
    pub process_ids: Vec<u32>,
    /// How long one NVML reading serves the callbacks of a collection. Shorter than the export
    /// interval, longer than one collection takes. Default: 100 ms.
    pub max_reading_age: Duration,
}

impl Default for GpuMetricsOptions {
    fn default() -> Self {
        Self {
            process_ids: vec![std::process::id()],
            max_reading_age: Duration::from_millis(100),
        }
    }
}

/// The registered instruments. Keep it alive as long as the metrics should be reported; the
/// NVML session closes when it and the `Meter`'s provider are gone.
#[derive(Debug)]
pub struct GpuRegistration {
    _gauges: Vec<ObservableGauge<f64>>,
    _levels: Vec<ObservableUpDownCounter<i64>>,
}

impl GpuMetrics {
    /// Opens NVML from `lib_path` (e.g. `libnvidia-ml.so.1`, or `$GPULSE_NVML_LIB`).
    ///
    /// # Errors
    /// A `SessionError` that says why NVML cannot be used (no driver, wrong path, no permission)
    /// and what to do about it.
    pub fn open(lib_path: &Path) -> Result<Self, SessionError> {
        Ok(Self {
            sampler: Sampler::open(lib_path)?,
        })
    }

    /// Registers the GPU instruments on `meter`:
    ///
    /// | name | instrument | unit | attributes |
    /// |---|---|---|---|
    /// | `hw.gpu.utilization` | gauge | `1` | device, `hw.gpu.task` |
    /// | `hw.gpu.memory.utilization` | gauge | `1` | device |
    /// | `hw.gpu.memory.usage`, `.limit`, `.free` | up-down counter | `By` | device |
    /// | `hw.power` | gauge | `W` | device |
    /// | `hw.temperature` | gauge | `Cel` | device |
    /// | `process.gpu.memory.usage` | up-down counter | `By` | `hw.id`, `gpu.index` |
    /// | `process.gpu.utilization` | gauge | `1` | `hw.id`, `gpu.index`, `hw.gpu.task` |
    /// | `process.gpu.memory.utilization` | gauge | `1` | `hw.id`, `gpu.index` |
    ///
    /// The device attributes are the sidecar's: `hw.id` (UUID), `hw.name`, `hw.type`,
    /// `hw.vendor`, `hw.model`, `hw.driver_version`, `hw.serial_number`, `gpu.index`,
    /// `gpu.pci_address`. A value NVML does not give is left out, never reported as 0.
    pub fn register(self, meter: &Meter, options: GpuMetricsOptions) -> GpuRegistration {
        let source = Arc::new(Reading::new(self.sampler, options.max_reading_age));
        let pids: Arc<[u32]> = options.process_ids.into();
        let gauges = GAUGES
            .iter()
            .map(|row| {
                let spec = row.metric.spec();
                meter
                    .f64_observable_gauge(spec.name)
                    .with_unit(spec.unit)
                    .with_description(row.description)
                    .with_callback(callback(&source, &pids, row.observe))
                    .build()
            })
            .collect();
        let levels = LEVELS
            .iter()
            .map(|row| {
                let spec = row.metric.spec();
                meter
                    .i64_observable_up_down_counter(spec.name)
                    .with_unit(spec.unit)
                    .with_description(row.description)
                    .with_callback(callback(&source, &pids, row.observe))
                    .build()
            })
            .collect();
        GpuRegistration {
            _gauges: gauges,
            _levels: levels,
        }
    }
}

/// One instrument of this API. Names and units are the sidecar's (its metric catalogue, by
/// `metric`); descriptions are this API's, whose values are the last sample's, not a window's
/// means. `observe` reads a snapshot for the processes asked for.
struct InstrumentRow<T: 'static> {
    metric: MetricId,
    description: &'static str,
    observe: fn(&Snapshot, &[u32], &dyn AsyncInstrument<T>),
}

/// The gauges, in the order they are registered.
const GAUGES: [InstrumentRow<f64>; 6] = [
    InstrumentRow {
        metric: MetricId::GpuUtilization,
        description: "Ratio of the last sample period the GPU task was busy.",
        observe: |s, _, out| {
            for d in ok_devices(s) {
                for (task, value) in [
                    ("general", d.get(DeviceField::UtilizationGpu)),
                    ("encoder", d.get(DeviceField::UtilizationEncoder)),
                    ("decoder", d.get(DeviceField::UtilizationDecoder)),
                ] {
                    if let Some(v) = value {
                        out.observe(v, &with(device_attributes(s, d), A::HwGpuTask.key(), task));
                    }
                }
            }
        },
    },
    InstrumentRow {
        metric: MetricId::GpuMemoryUtilization,
        description: "Ratio of the last sample period device memory was read or written.",
        observe: |s, _, out| device_f64(s, out, |d| d.get(DeviceField::UtilizationMemory)),
    },
    InstrumentRow {
        metric: MetricId::Power,
        description: "Power draw.",
        observe: |s, _, out| device_f64(s, out, |d| d.get(DeviceField::Power)),
    },
    InstrumentRow {
        metric: MetricId::Temperature,
        description: "GPU temperature.",
        observe: |s, _, out| device_f64(s, out, |d| d.get(DeviceField::Temperature)),
    },
    InstrumentRow {
        metric: MetricId::ProcessGpuUtilization,
        description: "Ratio of the last sample period this process kept the GPU task busy.",
        observe: |s, pids, out| {
            for p in own_processes(s, pids) {
                for (task, value) in [
                    ("general", p.sm_utilization),
                    ("encoder", p.encoder_utilization),
                    ("decoder", p.decoder_utilization),
                ] {
                    if let Some(v) = value {
                        out.observe(v, &with(process_attributes(p), A::HwGpuTask.key(), task));
                    }
                }
            }
        },
    },
    InstrumentRow {
        metric: MetricId::ProcessGpuMemoryUtilization,
        description: "Ratio of the last sample period this process read or wrote device memory.",
        observe: |s, pids, out| {
            for p in own_processes(s, pids) {
                if let Some(v) = p.memory_utilization {
                    out.observe(v, &process_attributes(p));
                }
            }
        },
    },
];

/// The up-down counters (levels), in the order they are registered.
const LEVELS: [InstrumentRow<i64>; 4] = [
    InstrumentRow {
        metric: MetricId::GpuMemoryUsage,
        description: "Device memory in use.",
        observe: |s, _, out| device_bytes(s, out, |d| d.get_u64(DeviceField::MemoryUsed)),
    },
    InstrumentRow {
        metric: MetricId::GpuMemoryLimit,
        description: "Total device memory.",
        observe: |s, _, out| {
            device_bytes(s, out, |d| {
                d.get_u64(DeviceField::MemoryTotal)
                    .or(d.info.memory_total_bytes)
            })
        },
    },
    InstrumentRow {
        metric: MetricId::GpuMemoryFree,
        description: "Device memory free.",
        observe: |s, _, out| device_bytes(s, out, |d| d.get_u64(DeviceField::MemoryFree)),
    },
    InstrumentRow {
        metric: MetricId::ProcessGpuMemoryUsage,
        description: "Device memory this process holds on the device.",
        observe: |s, pids, out| {
            for p in own_processes(s, pids) {
                if let Some(bytes) = p.gpu_memory_bytes.and_then(|b| i64::try_from(b).ok()) {
                    out.observe(bytes, &process_attributes(p));
                }
            }
        },
    },
];

/// An instrument's callback: `observe` on the collection's one reading, for the processes asked
/// for.
fn callback<T: 'static>(
    source: &Arc<Reading>,
    pids: &Arc<[u32]>,
    observe: fn(&Snapshot, &[u32], &dyn AsyncInstrument<T>),
) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let source = Arc::clone(source);
    let pids = Arc::clone(pids);
    move |out| {
        if let Some(snapshot) = source.current() {
            observe(&snapshot, &pids, out);
        }
    }
}

/// Observes `value` of every device that answered.
fn device_f64(
    s: &Snapshot,
    out: &dyn AsyncInstrument<f64>,
    value: fn(&DeviceSample) -> Option<f64>,
) {
    for d in ok_devices(s) {
        if let Some(v) = value(d) {
            out.observe(v, &device_attributes(s, d));
        }
    }
}

/// Observes `value`, a byte count, of every device that answered.
fn device_bytes(
    s: &Snapshot,
    out: &dyn AsyncInstrument<i64>,
    value: fn(&DeviceSample) -> Option<u64>,
) {
    for d in ok_devices(s) {
        if let Some(v) = value(d).and_then(|b| i64::try_from(b).ok()) {
            out.observe(v, &device_attributes(s, d));
        }
    }
}

fn ok_devices(s: &Snapshot) -> impl Iterator<Item = &DeviceSample> {
    s.devices.iter().filter(|d| d.status == DeviceStatus::Ok)
}

fn own_processes<'a>(s: &'a Snapshot, pids: &'a [u32]) -> impl Iterator<Item = &'a ProcessSample> {
    s.processes.iter().filter(|p| pids.contains(&p.pid))
}

/// The attributes of a device point, as the sidecar writes them (`export::metrics`).
fn device_attributes(s: &Snapshot, d: &DeviceSample) -> Vec<KeyValue> {
    let info = &d.info;
    let mut attrs = Vec::with_capacity(10);
    attrs.push(KeyValue::new(A::HwId.key(), info.uuid.clone()));
    attrs.push(KeyValue::new(A::HwName.key(), format!("gpu{}", info.index)));
    attrs.push(KeyValue::new(A::HwType.key(), "gpu"));
    attrs.push(KeyValue::new(A::HwVendor.key(), "NVIDIA"));
    attrs.push(KeyValue::new(A::HwModel.key(), info.name.clone()));
    if let Some(version) = &s.driver_version {
        attrs.push(KeyValue::new(A::HwDriverVersion.key(), version.clone()));
    }
    if let Some(serial) = &info.serial {
        attrs.push(KeyValue::new(A::HwSerialNumber.key(), serial.clone()));
    }
    attrs.push(KeyValue::new(A::GpuIndex.key(), i64::from(info.index)));
    attrs.push(KeyValue::new(
        A::GpuPciAddress.key(),
        info.pci_bus_id.clone(),
    ));
    attrs
}

/// The attributes of a per-process point, as the sidecar writes them on a process resource.
fn process_attributes(p: &ProcessSample) -> Vec<KeyValue> {
    vec![
        KeyValue::new(A::HwId.key(), p.device_uuid.clone()),
        KeyValue::new(A::GpuIndex.key(), i64::from(p.device_index)),
    ]
}

fn with(mut attrs: Vec<KeyValue>, key: &'static str, value: &'static str) -> Vec<KeyValue> {
    attrs.push(KeyValue::new(key, value));
    attrs
}

/// One NVML reading shared by every callback of a collection.
struct Reading {
    max_age: Duration,
    state: Mutex<ReadingState>,
}

struct ReadingState {
    sampler: Sampler,
    /// The last reading and when it was taken; `None` inside when that pass failed.
    last: Option<(Instant, Option<Arc<Snapshot>>)>,
    /// The last failure's text, so a driver that stays gone is logged once, not per collection.
    last_error: Option<String>,
}

impl Reading {
    fn new(sampler: Sampler, max_age: Duration) -> Self {
        Self {
            max_age,
            state: Mutex::new(ReadingState {
                sampler,
                last: None,
                last_error: None,
            }),
        }
    }

    /// The reading of this collection: the cached one while it is young, else a new pass.
    fn current(&self) -> Option<Arc<Snapshot>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, reading)) = &state.last {
            if at.elapsed() < self.max_age {
                return reading.clone();
            }
        }
        let reading = match state.sampler.sample() {
            Ok(snapshot) => {
                state.last_error = None;
                Some(Arc::new(snapshot))
            }
            Err(e) => {
                let text = e.to_string();
                if state.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!("gpulse: no GPU metrics in this collection: {text}");
                    state.last_error = Some(text);
                }
                None
            }
        };
        state.last = Some((Instant::now(), reading.clone()));
        reading
    }
}
