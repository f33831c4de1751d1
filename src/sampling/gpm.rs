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

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::{Device, Nvml};

use super::model::GpmActivity;

/// Two GPM samples closer than this give no metrics: NVIDIA documents GPM rates over intervals
/// of at least 100 ms.
pub const MIN_PAIR_INTERVAL: Duration = Duration::from_millis(100);

/// How long GPM stays off after the driver refused it, before it is asked again.
pub const PERMISSION_RETRY: Duration = Duration::from_secs(180);

/// The metrics asked for, in the order of the slots they fill.
const METRICS: [GpmMetricId; 12] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::HmmaTensorUtil,
    GpmMetricId::ImmaTensorUtil,
    GpmMetricId::DfmaTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp16Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp64Util,
    GpmMetricId::IntegerUtil,
    GpmMetricId::GraphicsUtil,
];

fn slot(activity: &mut GpmActivity, metric: GpmMetricId) -> Option<&mut Option<f64>> {
    Some(match metric {
        GpmMetricId::SmUtil => &mut activity.sm_activity,
        GpmMetricId::SmOccupancy => &mut activity.sm_occupancy,
        GpmMetricId::AnyTensorUtil => &mut activity.tensor_activity,
        GpmMetricId::HmmaTensorUtil => &mut activity.tensor_hmma_activity,
        GpmMetricId::ImmaTensorUtil => &mut activity.tensor_imma_activity,
        GpmMetricId::DfmaTensorUtil => &mut activity.tensor_dfma_activity,
        GpmMetricId::DramBwUtil => &mut activity.dram_activity,
        GpmMetricId::Fp16Util => &mut activity.fp16_activity,
        GpmMetricId::Fp32Util => &mut activity.fp32_activity,
        GpmMetricId::Fp64Util => &mut activity.fp64_activity,
        GpmMetricId::IntegerUtil => &mut activity.integer_activity,
        GpmMetricId::GraphicsUtil => &mut activity.graphics_activity,
        _ => return None,
    })
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

#[derive(Default)]
struct DeviceGpm {
    support: Option<Support>,
    previous: Option<HeldSample>,
    /// While set, the driver refused GPM and it is not asked before this instant.
    denied_until: Option<Instant>,
}

/// GPM state of every device of one NVML session.
pub struct GpmReader {
    nvml: Arc<Nvml>,
    devices: HashMap<u32, DeviceGpm>,
    /// The one permission warning of the session has been given.
    warned_permission: bool,
    /// Unexpected errors already warned about, per device.
    warned_error: std::collections::HashSet<u32>,
}

impl std::fmt::Debug for GpmReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmReader")
            .field("devices", &self.devices.len())
            .finish()
    }
}

/// What one GPM read did, for the sampler's error counts.
pub struct GpmOutcome {
    pub activity: GpmActivity,
    /// The NVML error kind of a failed call, if one failed.
    pub error: Option<&'static str>,
    /// The device answered `GPU_IS_LOST`.
    pub lost: bool,
}

impl GpmReader {
    pub fn new(nvml: Arc<Nvml>) -> Self {
        Self {
            nvml,
            devices: HashMap::new(),
            warned_permission: false,
            warned_error: std::collections::HashSet::new(),
        }
    }

    /// Takes a first GPM sample of a device that supports GPM, so that a one-shot reader
    /// (`gpulse snapshot`) has one to pair with. Returns whether the device took one.
    pub fn prime(&mut self, index: u32, device: &Device) -> bool {
        self.read(index, device, Instant::now());
        self.devices
            .get(&index)
            .is_some_and(|s| s.previous.is_some())
    }

    /// Reads the GPM activity of one device since its previous sample, keeping the new sample
    /// for the next call. Empty when the device has no GPM, the driver refuses it, or no
    /// earlier sample at least [`MIN_PAIR_INTERVAL`] old exists yet.
    pub fn read(&mut self, index: u32, device: &Device, now: Instant) -> GpmOutcome {
        let mut outcome = GpmOutcome {
            activity: GpmActivity::default(),
            error: None,
            lost: false,
        };
        let state = self.devices.entry(index).or_default();
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
                    self.mark_unsupported(index, "the GPU does not support GPM".into());
                    return outcome;
                }
                Err(e) => return self.fail(index, e, outcome),
            }
        }
        let sample = match device.gpm_sample() {
            Ok(sample) => sample,
            Err(e) => return self.fail(index, e, outcome),
        };
        let state = self.devices.entry(index).or_default();
        if state.denied_until.take().is_some() {
            tracing::info!(
                gpu.index = index,
                "GPM is readable again on GPU {index}: SM, tensor and DRAM activity are back"
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
        let result = gpm_metrics_get(&self.nvml, &first, &sample, &METRICS);
        self.free(Some(previous));
        let state = self.devices.entry(index).or_default();
        state.previous = Some(HeldSample {
            handle: sample.into_handle(),
            at: now,
        });
        match result {
            Ok(values) => {
                for value in values.into_iter().flatten() {
                    if let Some(slot) = slot(&mut outcome.activity, value.metric_id) {
                        if value.value.is_finite() {
                            *slot = Some((value.value / 100.0).clamp(0.0, 1.0));
                        }
                    }
                }
                outcome
            }
            Err(e) => self.fail(index, e, outcome),
        }
    }

    fn fail(&mut self, index: u32, error: NvmlError, mut outcome: GpmOutcome) -> GpmOutcome {
        outcome.error = Some(super::nvml::error_kind(&error));
        match error {
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound => {
                self.mark_unsupported(index, error.to_string());
            }
            NvmlError::NoPermission => {
                let state = self.devices.entry(index).or_default();
                state.denied_until = Some(Instant::now() + PERMISSION_RETRY);
                let previous = state.previous.take();
                self.free(previous);
                if !std::mem::replace(&mut self.warned_permission, true) {
                    tracing::warn!(
                        gpu.index = index,
                        "NVML refused GPM profiling on GPU {index} (no permission): SM, tensor \
                         and DRAM activity are left out, every other metric keeps flowing. The \
                         driver restricts profiling to administrators: set the NVIDIA kernel \
                         module option NVreg_RestrictProfilingToAdminUsers=0 \
                         (RmProfilingAdminOnly=0) on the host, or run gpulse privileged \
                         (CAP_SYS_ADMIN). gpulse asks again every {} s and will not repeat \
                         this warning",
                        PERMISSION_RETRY.as_secs()
                    );
                } else {
                    tracing::debug!(gpu.index = index, "GPM still refused on GPU {index}");
                }
            }
            NvmlError::GpuLost => outcome.lost = true,
            e => {
                if self.warned_error.insert(index) {
                    tracing::warn!(
                        gpu.index = index,
                        "NVML failed to read GPM on GPU {index}: {e}; SM, tensor and DRAM \
                         activity are missing while it fails, gpulse keeps sampling and will \
                         not repeat this warning"
                    );
                }
            }
        }
        outcome
    }

    fn mark_unsupported(&mut self, index: u32, why: String) {
        let state = self.devices.entry(index).or_default();
        state.support = Some(Support::Unsupported);
        let previous = state.previous.take();
        self.free(previous);
        tracing::info!(
            gpu.index = index,
            "GPU {index} gives no GPM metrics ({why}; GPM needs Hopper or newer): SM, tensor and \
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
