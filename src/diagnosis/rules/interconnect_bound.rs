//! `interconnect_bound`: a job on several GPUs whose NVLink traffic (PCIe traffic on GPUs
//! without NVLink) stays near the highest it has reached while its SMs mostly wait (GPM SM
//! activity low), on every GPU of the job, for a while. The collectives (all-reduce,
//! all-gather), not the math, set the pace of each step: adding GPUs will not speed it up.
//!
//! "Near its peak" is measured against the highest window mean the job's own history holds on
//! that GPU, not the link's nominal bandwidth: what a job reaches depends on message sizes, the
//! topology and NCCL's algorithm (all-reduce bus bandwidth is typically well below the
//! nominal figure), so a nominal reference would rarely be reached, while a plateau at the
//! job's own best is what a link-bound job shows. `min_bytes_per_second` keeps a job whose
//! "peak" is a trickle from counting. Jobs are grouped as `uneven_multi_gpu` groups them. Needs
//! GPM (Hopper and newer): without it the rule never fires.

use std::collections::BTreeMap;

use crate::config::thresholds::InterconnectBound;
use crate::diagnosis::findings::{
    human_bytes, human_duration, pct, DeviceRef, Finding, Layer, RuleId, Severity, Subject, Value,
};
use crate::diagnosis::history::{Interconnect, WindowSummary};
use crate::sampling::ProcessWindow;

use super::uneven_multi_gpu::multi_gpu_jobs;
use super::{process_device_ref, trailing_run, Inputs};

const ADVICE: &str = "The GPUs spend the step moving data between each other while their SMs \
wait. Overlap communication with compute (DDP's bucketing, FSDP prefetch), communicate less \
often (gradient accumulation under model.no_sync(), a larger per-GPU batch so each byte carries \
more compute), and shard less where memory allows (DDP or FSDP SHARD_GRAD_OP instead of \
FULL_SHARD). Check the placement: `nvidia-smi topo -m` should show the job's GPUs joined by \
NVLink (NV#), not across PCIe or the CPU socket; NCCL_DEBUG=INFO shows which transport NCCL \
chose. On PCIe-only GPUs, fewer larger GPUs or NVLink-connected ones scale better.";

/// What one GPU of the job showed.
struct GpuState {
    device: DeviceRef,
    interconnect: Interconnect,
    bytes_per_second: f64,
    peak_bytes_per_second: f64,
    sm_activity: f64,
    since: std::time::SystemTime,
    seconds: f64,
}

/// One finding per job on two or more GPUs that is interconnect-bound on every one of them.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &InterconnectBound) -> Vec<Finding> {
    let mut out = Vec::new();
    for (key, procs) in multi_gpu_jobs(inputs) {
        // One process per GPU reads the GPU's history: the lowest PID on it.
        let mut by_device: BTreeMap<u32, &ProcessWindow> = BTreeMap::new();
        for p in &procs {
            let entry = by_device.entry(p.device_index).or_insert(p);
            if p.pid < entry.pid {
                *entry = p;
            }
        }
        if by_device.len() < 2 {
            continue;
        }
        let gpus: Option<Vec<GpuState>> = by_device
            .values()
            .map(|p| gpu_state(inputs, t, p))
            .collect();
        let Some(gpus) = gpus else { continue };
        let mut pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let interconnect = gpus[0].interconnect;
        let seconds = gpus.iter().map(|g| g.seconds).fold(f64::INFINITY, f64::min);
        let since = gpus
            .iter()
            .map(|g| g.since)
            .max()
            .unwrap_or(inputs.window.start);
        let subject = Subject::Job {
            key,
            pids,
            devices: gpus.iter().map(|g| g.device.clone()).collect(),
        };
        let per_gpu: Vec<String> = gpus
            .iter()
            .map(|g| {
                format!(
                    "GPU {} {}/s ({} of its peak), SM {}",
                    g.device.index,
                    human_bytes(g.bytes_per_second),
                    pct(g.bytes_per_second / g.peak_bytes_per_second),
                    pct(g.sm_activity)
                )
            })
            .collect();
        let summary = format!(
            "{subject} is bound by {}: traffic near its peak while the SMs idle for {} ({})",
            interconnect.as_str(),
            human_duration(seconds),
            per_gpu.join("; ")
        );
        let mut values = vec![
            (
                "interconnect".to_string(),
                Value::from(interconnect.as_str()),
            ),
            ("duration_seconds".to_string(), Value::from(seconds)),
        ];
        for g in &gpus {
            let i = g.device.index;
            values.push((
                format!("gpu_{i}_bytes_per_second"),
                Value::from(g.bytes_per_second),
            ));
            values.push((
                format!("gpu_{i}_peak_bytes_per_second"),
                Value::from(g.peak_bytes_per_second),
            ));
            values.push((
                format!("gpu_{i}_sm_activity_ratio"),
                Value::from(g.sm_activity),
            ));
        }
        out.push(Finding {
            rule: RuleId::InterconnectBound,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

/// The GPU of `p` when its traffic has stayed near its peak with low SM activity for
/// `min_duration`; `None` otherwise (or when it gives no GPM or no traffic).
fn gpu_state(inputs: &Inputs<'_>, t: &InterconnectBound, p: &ProcessWindow) -> Option<GpuState> {
    let series = inputs.history.series(p.pid, &p.device_uuid)?;
    let latest = series.latest()?;
    let now = latest.device_interconnect?;
    // The peak on the interconnect measured now (a GPU's NVLink rates may appear after PCIe
    // ones were used, on the first windows).
    // Kept by the history as summaries come and go: a fold over the series here cost
    // O(max_windows) per GPU per window once the history was full.
    let peak = series.interconnect_peak(now.interconnect);
    let holds = |s: &WindowSummary| match (s.device_interconnect, s.device_sm_activity_mean) {
        (Some(c), Some(sm)) => {
            c.interconnect == now.interconnect
                && c.bytes_per_second >= t.min_bytes_per_second
                && c.bytes_per_second >= t.near_peak_ratio * peak
                && sm < t.sm_activity_below
        }
        _ => false,
    };
    let (since, seconds) = trailing_run(&series, holds)?;
    if seconds < t.min_duration.as_secs_f64() {
        return None;
    }
    Some(GpuState {
        device: process_device_ref(p),
        interconnect: now.interconnect,
        bytes_per_second: now.bytes_per_second,
        peak_bytes_per_second: peak,
        sm_activity: latest.device_sm_activity_mean?,
        since,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;
    use crate::diagnosis::JobKey;
    use crate::sampling::{NvLinkSample, NvLinkWindow};
    use crate::schema::{DeviceField, GpmField};

    const GIB_S: f64 = GIB as f64;

    /// A GPU with `links` NVLink links, each sending and receiving `per_link` bytes/s.
    fn nvlink_device(
        index: u32,
        per_link: f64,
        sm: f64,
        links: u32,
    ) -> crate::sampling::DeviceWindow {
        let mut d = device(index, 0.95, 40 * GIB);
        d.gpm.set(GpmField::SmActivity, Some(gauge(sm)));
        d.nvlink = (0..links)
            .map(|link| NvLinkWindow {
                last: NvLinkSample {
                    link,
                    active: Some(true),
                    ..Default::default()
                },
                tx_bytes_per_second: Some(gauge(per_link)),
                rx_bytes_per_second: Some(gauge(per_link)),
            })
            .collect();
        d
    }

    /// `n` one-minute windows of PID 42 on GPUs 0 and 1; `traffic(i)` is the per-link rate of
    /// minute `i`, GPU 1's SM activity is `sm1`.
    fn job(n: u64, traffic: impl Fn(u64) -> f64, sm: f64, sm1: f64) -> Fixture {
        let windows = (1..=n)
            .map(|i| {
                window(
                    i * 60,
                    vec![
                        nvlink_device(0, traffic(i), sm, 4),
                        nvlink_device(1, traffic(i), sm1, 4),
                    ],
                    vec![
                        process(42, 0, 30 * GIB, None),
                        process(42, 1, 30 * GIB, None),
                    ],
                )
            })
            .collect();
        Fixture::new(windows)
    }

    #[test]
    fn a_two_gpu_job_at_its_nvlink_peak_with_idle_sms_fires_once_for_the_job() {
        // 10 GiB/s per link and direction, 4 links: 80 GiB/s per GPU, steady for 6 minutes.
        let found = evaluate(
            &job(6, |_| 10.0 * GIB_S, 0.12, 0.15).inputs(),
            &InterconnectBound::default(),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert_eq!(f.rule, RuleId::InterconnectBound);
        assert!(
            matches!(&f.subject, Subject::Job { key: JobKey::Pid(42), devices, .. } if devices.len() == 2)
        );
        assert!(f.summary.contains("NVLink"), "{}", f.summary);
        let value = |k: &str| {
            f.values
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            value("gpu_0_bytes_per_second"),
            Some(Value::from(80.0 * GIB_S))
        );
        assert_eq!(value("interconnect"), Some(Value::from("NVLink")));
        assert!(f.advice.contains("nvidia-smi topo -m"));
    }

    #[test]
    fn busy_sms_low_traffic_short_runs_one_gpu_or_falling_traffic_are_quiet() {
        let t = InterconnectBound::default();
        // Compute-bound: the SMs work.
        assert!(evaluate(&job(6, |_| 10.0 * GIB_S, 0.7, 0.7).inputs(), &t).is_empty());
        // One GPU of two is working: not bound on every GPU.
        assert!(evaluate(&job(6, |_| 10.0 * GIB_S, 0.1, 0.7).inputs(), &t).is_empty());
        // A trickle: 4 links × 2 × 64 MiB/s = 512 MiB/s < 1 GiB/s.
        assert!(evaluate(&job(6, |_| GIB_S / 16.0, 0.1, 0.1).inputs(), &t).is_empty());
        // Shorter than min_duration.
        assert!(evaluate(&job(4, |_| 10.0 * GIB_S, 0.1, 0.1).inputs(), &t).is_empty());
        // Traffic fell to half of the peak reached earlier: the links are not the limit now.
        let falling = |i: u64| if i <= 3 { 10.0 * GIB_S } else { 5.0 * GIB_S };
        assert!(evaluate(&job(9, falling, 0.1, 0.1).inputs(), &t).is_empty());
        // A single-GPU process is not a multi-GPU job.
        let windows = (1..=6)
            .map(|i| {
                window(
                    i * 60,
                    vec![nvlink_device(0, 10.0 * GIB_S, 0.1, 4)],
                    vec![process(42, 0, 30 * GIB, None)],
                )
            })
            .collect();
        assert!(evaluate(&Fixture::new(windows).inputs(), &t).is_empty());
    }

    #[test]
    fn without_nvlink_pcie_traffic_is_the_interconnect() {
        let windows = (1..=6)
            .map(|i| {
                let devices = (0..2)
                    .map(|index| {
                        let mut d = device(index, 0.95, 40 * GIB);
                        d.gpm.set(GpmField::SmActivity, Some(gauge(0.1)));
                        d.fields
                            .set_gauge(DeviceField::PcieTx, Some(gauge(20.0 * GIB_S)));
                        d
                    })
                    .collect();
                window(
                    i * 60,
                    devices,
                    vec![
                        process(42, 0, 30 * GIB, None),
                        process(42, 1, 30 * GIB, None),
                    ],
                )
            })
            .collect();
        let found = evaluate(
            &Fixture::new(windows).inputs(),
            &InterconnectBound::default(),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].summary.contains("PCIe"), "{}", found[0].summary);
    }
}
