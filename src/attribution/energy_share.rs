//! How a device's energy is charged to its processes, over any stretch of time: an export
//! window (the accountant, [`super::accounting`]) or one sample of the span history
//! (`crate::enrich::sample_history`). Both call these functions, so a span's `gpulse.gpu.energy` and
//! the `process.gpu.energy` exported over the same time agree (docs/shared-gpus.md).
//!
//! A process is charged the device's energy × its **weight**: its activity (the share of the
//! time the device was busy with its work) × its share of the GPU (1, or its MIG instance's
//! slice) × the share of the time it was listed. Weights above 1 in total are scaled down to 1.
//! Idle power and busy time no process accounts for stay unattributed: nothing is charged by
//! relative share.

/// How a process's activity on a device was known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivitySource {
    /// NVML's per-process SM utilisation.
    ProcessUtilization,
    /// The only process on a GPU without per-process figures: the GPU's utilisation.
    DeviceUtilization,
    /// Alone on its MIG instance: the instance's graphics-engine activity (GPM).
    MigInstance,
}

/// What one process's charge rests on, over the stretch of time being charged.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct EnergyClaim {
    /// Activity, 0–1; `None` where it is not knowable (then nothing is charged).
    pub activity: Option<f64>,
    /// 1 on a whole GPU, the instance's slice on MIG; `None` where unknown.
    pub gpu_share: Option<f64>,
    /// The share of the time's samples that listed the process, 0–1.
    pub presence: f64,
}

/// The activity of a process on a whole GPU (not a MIG instance) over `samples` (≥ 1) samples
/// that listed it, `sm_sum` being the sum of the per-process SM figures NVML gave it in them.
///
/// - When the device gives per-process figures (`per_process`: some process on it had one),
///   the mean over its samples, a sample without a figure counting as idle: NVML lists only
///   processes that ran.
/// - Else a process alone on the device takes the device's utilisation.
/// - Else (several processes, no figures) it is not knowable.
pub(crate) fn whole_gpu_activity(
    sm_sum: Option<f64>,
    samples: u32,
    per_process: bool,
    processes_on_device: usize,
    device_utilization: Option<f64>,
) -> (Option<f64>, Option<ActivitySource>) {
    if per_process {
        let busy = sm_sum.unwrap_or(0.0) / f64::from(samples.max(1));
        (
            Some(busy.clamp(0.0, 1.0)),
            Some(ActivitySource::ProcessUtilization),
        )
    } else if processes_on_device == 1 {
        let value = device_utilization.map(|u| u.clamp(0.0, 1.0));
        (value, value.map(|_| ActivitySource::DeviceUtilization))
    } else {
        (None, None)
    }
}

/// A MIG instance's share of its GPU: its memory slice over the GPU's memory, the one size NVML
/// gives every instance; `None` when either is unknown.
pub(crate) fn mig_gpu_share(slice_bytes: Option<u64>, gpu_bytes: Option<f64>) -> Option<f64> {
    match (slice_bytes, gpu_bytes) {
        (Some(slice), Some(all)) if all > 0.0 => Some((slice as f64 / all).min(1.0)),
        _ => None,
    }
}

/// The share of the device's energy charged to each claim, in order: activity × GPU share ×
/// presence, scaled down so that the shares add up to at most 1. `None` where the activity or
/// the GPU share is unknown.
pub(crate) fn energy_weights(claims: &[EnergyClaim]) -> Vec<Option<f64>> {
    let raw: Vec<Option<f64>> = claims
        .iter()
        .map(|c| Some(c.activity? * c.gpu_share? * c.presence))
        .collect();
    let total: f64 = raw.iter().flatten().sum();
    let scale = if total > 1.0 { 1.0 / total } else { 1.0 };
    raw.into_iter().map(|w| w.map(|w| w * scale)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_time_stays_unattributed_and_overlaps_are_scaled_to_the_whole() {
        let claim = |a| EnergyClaim {
            activity: Some(a),
            gpu_share: Some(1.0),
            presence: 1.0,
        };
        // 40 % and 20 % busy: 60 % charged, not 2/3 and 1/3 of the whole.
        assert_eq!(
            energy_weights(&[claim(0.4), claim(0.2)]),
            [Some(0.4), Some(0.2)]
        );
        let over = energy_weights(&[claim(0.9), claim(0.6)]);
        assert!((over[0].unwrap() - 0.6).abs() < 1e-12 && (over[1].unwrap() - 0.4).abs() < 1e-12);
        let unknown = EnergyClaim {
            activity: None,
            ..claim(0.0)
        };
        assert_eq!(energy_weights(&[unknown, claim(0.5)]), [None, Some(0.5)]);
    }

    #[test]
    fn a_sample_without_a_figure_counts_as_idle_where_the_device_gives_figures() {
        assert_eq!(
            whole_gpu_activity(Some(1.2), 4, true, 2, Some(0.9)),
            (Some(0.3), Some(ActivitySource::ProcessUtilization))
        );
        assert_eq!(whole_gpu_activity(None, 1, true, 2, Some(0.9)).0, Some(0.0));
        assert_eq!(
            whole_gpu_activity(None, 1, false, 1, Some(0.9)),
            (Some(0.9), Some(ActivitySource::DeviceUtilization))
        );
        assert_eq!(
            whole_gpu_activity(None, 1, false, 2, Some(0.9)),
            (None, None)
        );
        assert_eq!(
            mig_gpu_share(Some(40 << 30), Some((80u64 << 30) as f64)),
            Some(0.5)
        );
        assert_eq!(mig_gpu_share(Some(1), None), None);
    }
}
