//! GPM (GPU Performance Monitoring, Hopper and newer): SM, tensor-pipe and DRAM activity read
//! from NVML's GPM API, which answers "how much of the GPU is working" where `GPU-Util` only says
//! "some kernel ran".
//!
//! GPM metrics are rates between two samples, so this module owns the per-device state that
//! needs: whether the device supports GPM (asked once), the sample kept from the previous tick
//! (pairs closer than [`MIN_PAIR_INTERVAL`] are not used: the driver's counters are too coarse),
//! and the `NO_PERMISSION` state, which the driver's `RmProfilingAdminOnly` setting can raise at
//! any time: it is warned about once per session, GPM is left out while it lasts, and asked
//! again every [`PERMISSION_RETRY`] so it comes back on its own once an admin lifts it.
//!
//! The same state is kept per GPU instance of a GPU in MIG mode ([`GpmReader::read_instance`],
//! `nvmlGpmMigSampleGet` on the parent), where GPM is the only activity source NVML has.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::{Device, Nvml};

use super::model::GpmActivity;
use crate::schema::{GpmField, GPM_FIELDS, GPM_FIELD_COUNT};

/// Two GPM samples closer than this give no metrics: NVIDIA documents GPM rates over intervals
/// of at least 100 ms.
pub(crate) const MIN_PAIR_INTERVAL: Duration = Duration::from_millis(100);

/// How long GPM stays off after the driver refused it, before it is asked again.
pub(crate) const PERMISSION_RETRY: Duration = Duration::from_secs(180);

/// The NVML GPM metrics gpulse asks for, in [`GPM_FIELDS`] order.
fn metrics() -> [GpmMetricId; GPM_FIELD_COUNT] {
    std::array::from_fn(|i| GPM_FIELDS[i].nvml)
}

/// The field an NVML GPM metric fills.
fn field_of(metric: GpmMetricId) -> Option<GpmField> {
    GPM_FIELDS
        .iter()
        .find(|spec| spec.nvml == metric)
        .map(|spec| spec.field)
}

/// A GPM sample's raw handle, kept between ticks. `GpmSample` borrows the `Nvml` it came from,
/// which the sampler owns through an `Arc`; the handle is turned back into a `GpmSample` only
/// for the duration of one call, and freed by [`GpmReader`]'s `Drop` while its `Arc` keeps the
/// library loaded.
struct HeldSample {
    handle: nvml_wrapper_sys::bindings::nvmlGpmSample_t,
    at: Instant,
}

// SAFETY: a GPM sample is an opaque driver allocation with no thread affinity; gpulse uses each
// one from one thread at a time (the sampler is `&mut` while it reads GPM).
unsafe impl Send for HeldSample {}

/// Whether a device gives GPM, as far as gpulse has learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support {
    Supported,
    Unsupported,
}

/// What a GPM sample is taken of: a whole GPU, or one GPU instance of a GPU in MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Source {
    gpu: u32,
    gpu_instance: Option<u32>,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gpu_instance {
            None => write!(f, "GPU {}", self.gpu),
            Some(gi) => write!(f, "GPU {} GPU instance {gi}", self.gpu),
        }
    }
}

#[derive(Default)]
struct DeviceGpm {
    support: Option<Support>,
    previous: Option<HeldSample>,
    /// While set, the driver refused GPM and it is not asked before this instant.
    denied_until: Option<Instant>,
}

/// GPM state of every device of one NVML session.
pub(crate) struct GpmReader {
    nvml: Arc<Nvml>,
    devices: HashMap<Source, DeviceGpm>,
    /// The one permission warning of the session has been given.
    warned_permission: bool,
    /// Unexpected errors already warned about, per device or GPU instance.
    warned_error: std::collections::HashSet<Source>,
    /// The GPM metrics asked of `nvmlGpmMetricsGet`: every field's, less those left out.
    metrics: Vec<GpmMetricId>,
}

impl std::fmt::Debug for GpmReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmReader")
            .field("devices", &self.devices.len())
            .finish()
    }
}

/// What one GPM read did, for the sampler's error counts.
pub(crate) struct GpmOutcome {
    pub activity: GpmActivity,
    /// The NVML error kind of a failed call, if one failed.
    pub error: Option<&'static str>,
    /// The device answered `GPU_IS_LOST`.
    pub lost: bool,
}

impl Source {
    fn gpu(index: u32) -> Self {
        Self {
            gpu: index,
            gpu_instance: None,
        }
    }
}

impl GpmOutcome {
    fn empty() -> Self {
        Self {
            activity: GpmActivity::default(),
            error: None,
            lost: false,
        }
    }
}

impl GpmReader {
    pub(crate) fn new(nvml: Arc<Nvml>) -> Self {
        Self {
            nvml,
            devices: HashMap::new(),
            warned_permission: false,
            warned_error: std::collections::HashSet::new(),
            metrics: metrics().to_vec(),
        }
    }

    /// Stops asking for the GPM metrics of `fields`; their activity stays `None`. The samples
    /// are still taken for the fields left (every rule-bearing one, see `pipeline::reads`).
    pub(crate) fn leave_out(&mut self, fields: &[GpmField]) {
        self.metrics
            .retain(|metric| field_of(*metric).is_some_and(|f| !fields.contains(&f)));
    }

    /// Takes a first GPM sample of a device that supports GPM, so that a one-shot reader
    /// (`gpulse snapshot`) has one to pair with. Returns whether the device took one.
    pub(crate) fn prime(&mut self, index: u32, device: &Device) -> bool {
        self.read(index, device, Instant::now());
        self.devices
            .get(&Source::gpu(index))
            .is_some_and(|s| s.previous.is_some())
    }

    /// Whether a GPM sample of GPU instance `gpu_instance_id` of GPU `index` is kept for the
    /// next pair (after [`read_instance`](Self::read_instance) primed it).
    pub(crate) fn has_instance_sample(&self, index: u32, gpu_instance_id: u32) -> bool {
        let source = Source {
            gpu: index,
            gpu_instance: Some(gpu_instance_id),
        };
        self.devices
            .get(&source)
            .is_some_and(|s| s.previous.is_some())
    }

    /// As [`read`](Self::read), for the GPU instance `gpu_instance_id` of the GPU `parent` (in
    /// MIG mode): `nvmlGpmMigSampleGet` on the parent. Nothing is asked when the parent is known
    /// to have no GPM.
    pub(crate) fn read_instance(
        &mut self,
        index: u32,
        gpu_instance_id: u32,
        parent: &Device,
        now: Instant,
    ) -> GpmOutcome {
        let parent_unsupported = self
            .devices
            .get(&Source::gpu(index))
            .is_some_and(|s| s.support == Some(Support::Unsupported));
        if parent_unsupported {
            return GpmOutcome::empty();
        }
        let source = Source {
            gpu: index,
            gpu_instance: Some(gpu_instance_id),
        };
        self.read_source(source, parent, now)
    }

    /// Frees the kept samples of the GPU instances of GPU `index` not in `live` (destroyed
    /// instances), so a re-created instance with the same id starts a fresh pair.
    pub(crate) fn retain_instances(&mut self, index: u32, live: &[u32]) {
        let gone: Vec<Source> = self
            .devices
            .keys()
            .filter(|s| s.gpu == index && s.gpu_instance.is_some_and(|gi| !live.contains(&gi)))
            .copied()
            .collect();
        for source in gone {
            if let Some(mut state) = self.devices.remove(&source) {
                let previous = state.previous.take();
                self.free(previous);
            }
            self.warned_error.remove(&source);
        }
    }

    /// Reads the GPM activity of one device since its previous sample, keeping the new sample
    /// for the next call. Empty when the device has no GPM, the driver refuses it, or no
    /// earlier sample at least [`MIN_PAIR_INTERVAL`] old exists yet.
    pub(crate) fn read(&mut self, index: u32, device: &Device, now: Instant) -> GpmOutcome {
        self.read_source(Source::gpu(index), device, now)
    }

    fn read_source(&mut self, source: Source, device: &Device, now: Instant) -> GpmOutcome {
        let mut outcome = GpmOutcome::empty();
        let state = self.devices.entry(source).or_default();
        if state.support == Some(Support::Unsupported) {
            return outcome;
        }
        if state.denied_until.is_some_and(|until| now < until) {
            return outcome;
        }
        if state.support.is_none() {
            match device.gpm_support() {
                Ok(true) => state.support = Some(Support::Supported),
                Ok(false) => {
                    self.mark_unsupported(source, "the GPU does not support GPM".into());
                    return outcome;
                }
                Err(e) => return self.fail(source, e, outcome),
            }
        }
        let sampled = match source.gpu_instance {
            None => device.gpm_sample(),
            Some(gi) => device.gpm_mig_sample(gi),
        };
        let sample = match sampled {
            Ok(sample) => sample,
            Err(e) => return self.fail(source, e, outcome),
        };
        let state = self.devices.entry(source).or_default();
        if state.denied_until.take().is_some() {
            tracing::info!(
                gpu.index = source.gpu,
                "GPM is readable again on {source}: SM, tensor and DRAM activity are back"
            );
        }
        let Some(previous) = state.previous.take() else {
            state.previous = Some(HeldSample {
                handle: sample.into_handle(),
                at: now,
            });
            return outcome;
        };
        if now.duration_since(previous.at) < MIN_PAIR_INTERVAL {
            // Too close to give a rate: keep the older sample so the next pair spans enough.
            state.previous = Some(previous);
            return outcome;
        }
        // SAFETY: `previous.handle` came from `into_handle` on a sample of this `Nvml` and was
        // not freed; ManuallyDrop keeps ownership with the handle, which is freed below.
        let first =
            ManuallyDrop::new(unsafe { GpmSample::from_handle(&self.nvml, previous.handle) });
        let result = gpm_metrics_get(&self.nvml, &first, &sample, &self.metrics);
        self.free(Some(previous));
        let state = self.devices.entry(source).or_default();
        state.previous = Some(HeldSample {
            handle: sample.into_handle(),
            at: now,
        });
        match result {
            Ok(values) => {
                for value in values.into_iter().flatten() {
                    if let Some(field) = field_of(value.metric_id) {
                        if value.value.is_finite() {
                            let ratio = (value.value / 100.0).clamp(0.0, 1.0);
                            outcome.activity.set(field, Some(ratio));
                        }
                    }
                }
                outcome
            }
            Err(e) => self.fail(source, e, outcome),
        }
    }

    fn fail(&mut self, source: Source, error: NvmlError, mut outcome: GpmOutcome) -> GpmOutcome {
        let index = source.gpu;
        outcome.error = Some(super::calls::error_kind(&error));
        match error {
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound => {
                self.mark_unsupported(source, error.to_string());
            }
            NvmlError::NoPermission => {
                let state = self.devices.entry(source).or_default();
                state.denied_until = Some(Instant::now() + PERMISSION_RETRY);
                let previous = state.previous.take();
                self.free(previous);
                if !std::mem::replace(&mut self.warned_permission, true) {
                    tracing::warn!(
                        gpu.index = index,
                        "NVML refused GPM profiling on {source} (no permission): SM, tensor \
                         and DRAM activity are left out, every other metric keeps flowing. The \
                         driver restricts profiling to administrators: set the NVIDIA kernel \
                         module option NVreg_RestrictProfilingToAdminUsers=0 \
                         (RmProfilingAdminOnly=0) on the host, or run gpulse privileged \
                         (CAP_SYS_ADMIN). gpulse asks again every {} s and will not repeat \
                         this warning",
                        PERMISSION_RETRY.as_secs()
                    );
                } else {
                    tracing::debug!(gpu.index = index, "GPM still refused on {source}");
                }
            }
            NvmlError::GpuLost => outcome.lost = true,
            e => {
                if self.warned_error.insert(source) {
                    tracing::warn!(
                        gpu.index = index,
                        "NVML failed to read GPM on {source}: {e}; SM, tensor and DRAM \
                         activity are missing while it fails, gpulse keeps sampling and will \
                         not repeat this warning"
                    );
                }
            }
        }
        outcome
    }

    fn mark_unsupported(&mut self, source: Source, why: String) {
        let state = self.devices.entry(source).or_default();
        state.support = Some(Support::Unsupported);
        let previous = state.previous.take();
        self.free(previous);
        tracing::info!(
            gpu.index = source.gpu,
            "{source} gives no GPM metrics ({why}; GPM needs Hopper or newer): SM, tensor and \
             DRAM activity are left out"
        );
    }

    fn free(&self, held: Option<HeldSample>) {
        if let Some(held) = held {
            // SAFETY: see `read`; dropping the rebuilt sample frees the handle exactly once.
            drop(unsafe { GpmSample::from_handle(&self.nvml, held.handle) });
        }
    }
}

impl Drop for GpmReader {
    fn drop(&mut self) {
        let held: Vec<_> = self
            .devices
            .values_mut()
            .filter_map(|s| s.previous.take())
            .collect();
        for h in held {
            self.free(Some(h));
        }
    }
}
