//! The summary of a recording: what `gpulse record` prints on standard error when the command
//! ends, and writes with `--json`. The JSON follows `snapshot --format json`: snake_case keys
//! with the unit as suffix, ratios 0–1, and `null` (never 0) for what was not measured.

use std::fmt::Write as _;

use serde::Serialize;

use super::recording::{CausePoint, FindingMark, Recording};
use crate::attribution::accounting::cost;
use crate::attribution::Workload;
use crate::attribution::{Cause, Prices};
use crate::diagnosis::findings::human_bytes;
use crate::schema::throttle_reason_names;

/// The machine-readable summary (`--json`). Field names are a stable contract.
#[derive(Debug, Serialize)]
pub(crate) struct Summary<'a> {
    pub command: &'a [String],
    /// Unix times, in seconds.
    pub started: f64,
    pub ended: f64,
    pub duration_seconds: f64,
    /// The command's exit status; `null` when it was killed by a signal or never started.
    pub exit_code: Option<i32>,
    /// The signal that killed the command (`SIGTERM`), else `null`.
    pub exit_signal: Option<String>,
    pub sample_interval_seconds: Option<f64>,
    pub samples: u64,
    /// Why there are no GPU figures (NVML could not be opened, no GPU); `null` when there are.
    pub no_gpu_reason: Option<&'a str>,
    pub devices: Vec<DeviceSummary<'a>>,
    /// GPU processes of the command's process tree.
    pub processes: Vec<ProcessSummary<'a>>,
    /// Other processes seen on the GPUs the command used.
    pub other_processes: Vec<ProcessSummary<'a>>,
    /// Share of the time the GPUs held by the command were idle (utilisation under 5 %);
    /// `null` when the command held no GPU.
    pub idle_ratio: Option<f64>,
    pub energy_joules: Option<f64>,
    pub energy_wh: Option<f64>,
    /// The command's GPU time by cause (the ledger), each with its GPU-hours, share, energy,
    /// cost and, for the waits a fix removes, the saving; empty when no window was analysed.
    pub causes: Vec<CauseLine>,
    pub findings: &'a [FindingMark],
    /// Where the HTML report was written, as an absolute path (to copy it off an SSH box);
    /// `null` with `--report none` or when it could not be written.
    pub report: Option<String>,
    /// What became of the OTLP export while recording; `null` when nothing was exported (no
    /// endpoint set, or `gpulse report`).
    pub export: Option<ExportSummary>,
}

/// The export's outcome (`--otlp-endpoint` or `OTEL_EXPORTER_OTLP_*ENDPOINT` set).
#[derive(Debug, Serialize)]
pub(crate) struct ExportSummary {
    /// The endpoints the signals were sent to.
    pub destinations: Vec<String>,
    /// Requests accepted by the backend, and the data points, log records and spans in them.
    pub delivered_requests: u64,
    pub delivered_items: u64,
    /// Requests that never reached it (dropped, or still queued when the flush bound ran out).
    pub lost_requests: u64,
    pub lost_items: u64,
    /// Failed attempts by reason (`connect`, `timeout`, `http_503`, ...), retries included.
    pub failures: std::collections::BTreeMap<String, u64>,
}

impl ExportSummary {
    pub(crate) fn of(outcome: &crate::export::ExportOutcome) -> Self {
        let lost = outcome.lost();
        Self {
            destinations: outcome.destinations.clone(),
            delivered_requests: outcome.stats.delivered.requests,
            delivered_items: outcome.stats.delivered.points,
            lost_requests: lost.requests,
            lost_items: lost.points,
            failures: outcome
                .stats
                .failures
                .iter()
                .map(|(reason, n)| (reason.to_string(), *n))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct DeviceSummary<'a> {
    pub index: u32,
    pub uuid: &'a str,
    pub name: &'a str,
    pub pci_bus_id: Option<&'a str>,
    pub utilization_gpu_mean: Option<f64>,
    pub utilization_gpu_peak: Option<f64>,
    pub sm_activity_mean: Option<f64>,
    pub sm_activity_peak: Option<f64>,
    pub tensor_activity_mean: Option<f64>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_peak_bytes: Option<u64>,
    pub power_mean_watts: Option<f64>,
    pub power_peak_watts: Option<f64>,
    pub energy_joules: Option<f64>,
    /// `counter` (the driver's energy counter) or `power_integral` (power over time).
    pub energy_source: Option<&'static str>,
    /// Seconds one of the command's processes held this GPU, and its idle share in them.
    pub held_by_command_seconds: f64,
    pub idle_ratio: Option<f64>,
    /// Clock throttle reasons seen during the run (idling and administrator clocks left out:
    /// they slow nothing down).
    pub throttle_reasons_seen: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProcessSummary<'a> {
    pub pid: u32,
    pub name: Option<&'a str>,
    pub device_index: u32,
    pub device_uuid: &'a str,
    pub gpu_memory_peak_bytes: Option<u64>,
    /// Seconds since the start of the recording.
    pub first_seen_seconds: f64,
    pub last_seen_seconds: f64,
    /// Who the process is (namespaced PID, container, pod, service name), as `run` exports it
    /// and as `snapshot --format json` shows it (the same object); `null` when unknown.
    pub workload: Option<&'a Workload>,
}

fn unix(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl<'a> Summary<'a> {
    pub(crate) fn of(recording: &'a Recording) -> Self {
        let devices: Vec<DeviceSummary> = recording
            .devices
            .iter()
            .map(|d| {
                let t = &d.totals;
                let (energy, source) = match (t.energy_counter_joules, t.power_integral_joules) {
                    (Some(e), _) => (Some(e), Some("counter")),
                    (None, Some(e)) => (Some(e), Some("power_integral")),
                    (None, None) => (None, None),
                };
                DeviceSummary {
                    index: d.index,
                    uuid: &d.uuid,
                    name: &d.name,
                    pci_bus_id: d.pci_bus_id.as_deref(),
                    utilization_gpu_mean: t.utilization.mean(),
                    utilization_gpu_peak: t.utilization.peak(),
                    sm_activity_mean: t.sm_activity.mean(),
                    sm_activity_peak: t.sm_activity.peak(),
                    tensor_activity_mean: t.tensor_activity.mean(),
                    memory_total_bytes: d.memory_total_bytes.map(|b| b as u64),
                    memory_used_peak_bytes: t.memory_used_peak.map(|b| b as u64),
                    power_mean_watts: t.power_watts.mean(),
                    power_peak_watts: t.power_watts.peak(),
                    energy_joules: energy,
                    energy_source: source,
                    held_by_command_seconds: t.held_seconds,
                    idle_ratio: (t.held_seconds > 0.0).then(|| t.idle_seconds / t.held_seconds),
                    throttle_reasons_seen: throttle_reason_names(
                        t.throttle_seen & !super::recording::NOT_A_SLOWDOWN,
                    ),
                }
            })
            .collect();
        let held: f64 = recording
            .devices
            .iter()
            .map(|d| d.totals.held_seconds)
            .sum();
        let idle: f64 = recording
            .devices
            .iter()
            .map(|d| d.totals.idle_seconds)
            .sum();
        let energy: Option<f64> = devices
            .iter()
            .filter_map(|d| d.energy_joules)
            .fold(None, |sum, e| Some(sum.unwrap_or(0.0) + e));
        // Others on the GPUs the command used; on every GPU when it used none (then which GPU
        // it waited for, or who held it, is the question).
        let used: Vec<u32> = recording
            .processes
            .iter()
            .filter(|p| p.in_command)
            .map(|p| p.device_index)
            .collect();
        let relevant = |index: u32| used.is_empty() || used.contains(&index);
        let process = |p: &'a super::recording::ProcessTrack| ProcessSummary {
            pid: p.pid,
            name: p.name.as_deref(),
            device_index: p.device_index,
            device_uuid: &p.device_uuid,
            gpu_memory_peak_bytes: p.memory_peak_bytes.map(|b| b as u64),
            first_seen_seconds: p.first_seen,
            last_seen_seconds: p.last_seen,
            workload: p.workload.as_ref(),
        };
        let (exit_code, exit_signal) = match recording.exit {
            Some(super::child::CommandExit::Code(c)) => (Some(c), None),
            Some(super::child::CommandExit::Signal(s)) => {
                (None, Some(super::child::signal_name(s)))
            }
            None => (None, None),
        };
        Summary {
            command: &recording.command,
            started: unix(recording.started),
            ended: unix(recording.ended),
            duration_seconds: recording.duration_seconds(),
            exit_code,
            exit_signal,
            sample_interval_seconds: recording.sample_interval_seconds,
            samples: recording.samples,
            no_gpu_reason: recording.no_gpu.as_deref(),
            devices,
            processes: recording
                .processes
                .iter()
                .filter(|p| p.in_command)
                .map(process)
                .collect(),
            other_processes: recording
                .processes
                .iter()
                .filter(|p| !p.in_command && relevant(p.device_index))
                .map(process)
                .collect(),
            idle_ratio: (held > 0.0).then(|| idle / held),
            energy_joules: energy,
            energy_wh: energy.map(|j| j / 3600.0),
            causes: cause_lines(&recording.causes.points(), &recording.prices),
            findings: &recording.findings,
            report: None,
            export: None,
        }
    }

    /// The text printed on standard error when the command ends.
    pub(crate) fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "gpulse record: {} ran {} ({})",
            self.command.join(" "),
            duration(self.duration_seconds),
            match (self.exit_code, &self.exit_signal) {
                (Some(code), _) => format!("exit status {code}"),
                (None, Some(signal)) => format!("killed by {signal}"),
                (None, None) => "did not start".into(),
            }
        );
        if let Some(reason) = self.no_gpu_reason {
            let _ = writeln!(out, "  no GPU figures: {reason}");
        }
        for d in &self.devices {
            let _ = writeln!(out, "  GPU {} {}", d.index, d.name);
            let _ = writeln!(
                out,
                "    utilisation mean {} peak {}   SM activity mean {} peak {}",
                pct(d.utilization_gpu_mean),
                pct(d.utilization_gpu_peak),
                pct(d.sm_activity_mean),
                pct(d.sm_activity_peak)
            );
            let _ = writeln!(
                out,
                "    memory peak {} of {}   power mean {} peak {}   energy {}",
                bytes(d.memory_used_peak_bytes),
                bytes(d.memory_total_bytes),
                watts(d.power_mean_watts),
                watts(d.power_peak_watts),
                wh(d.energy_joules)
            );
            if d.held_by_command_seconds > 0.0 {
                let _ = writeln!(
                    out,
                    "    held by the command {}, idle (utilisation under 5 %) {} of that time",
                    duration(d.held_by_command_seconds),
                    pct(d.idle_ratio)
                );
            }
            if !d.throttle_reasons_seen.is_empty() {
                let _ = writeln!(out, "    throttled: {}", d.throttle_reasons_seen.join(", "));
            }
        }
        if !self.devices.is_empty() && self.processes.is_empty() {
            let _ = writeln!(
                out,
                "  the command's processes never appeared on a GPU (NVML listed none of them)"
            );
        }
        for p in &self.processes {
            let _ = writeln!(
                out,
                "  pid {} {} on GPU {}: memory peak {}",
                p.pid,
                p.name.unwrap_or("?"),
                p.device_index,
                bytes(p.gpu_memory_peak_bytes)
            );
        }
        for p in &self.other_processes {
            let _ = writeln!(
                out,
                "  other process pid {} {} on GPU {}: memory peak {}",
                p.pid,
                p.name.unwrap_or("?"),
                p.device_index,
                bytes(p.gpu_memory_peak_bytes)
            );
        }
        if let Some(idle) = self.idle_ratio {
            let _ = writeln!(
                out,
                "  the command's GPUs were idle (utilisation under 5 %) {} of the time it held them; energy {}",
                pct(Some(idle)),
                wh(self.energy_joules)
            );
        }
        render_lines(&mut out, &self.causes);
        if self.findings.is_empty() && !self.devices.is_empty() {
            let _ = writeln!(out, "  findings: none");
        }
        for f in self.findings {
            let _ = writeln!(
                out,
                "  [{}] {} at {}{}: {}",
                f.severity,
                f.rule,
                duration(f.start_seconds),
                match f.end_seconds {
                    Some(end) => format!("–{}", duration(end)),
                    None => " until the end".into(),
                },
                f.summary
            );
            if !f.evidence.is_empty() {
                let _ = writeln!(out, "      evidence: {}", f.evidence.join(", "));
            }
            let _ = writeln!(out, "      advice: {}", f.advice);
        }
        out
    }
}

fn pct(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "n/a".into(), |r| format!("{:.0}%", r * 100.0))
}

fn bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "n/a".into(), |b| human_bytes(b as f64))
}

fn watts(w: Option<f64>) -> String {
    w.map_or_else(|| "n/a".into(), |w| format!("{w:.0} W"))
}

fn wh(joules: Option<f64>) -> String {
    joules.map_or_else(|| "n/a".into(), |j| format!("{:.2} Wh", j / 3600.0))
}

/// "42.0s", "12m05s", "3h02m".
pub(crate) fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

/// A cause is a line of the summary's text from this share of the GPU time on.
pub(crate) const LINE_FROM_SHARE: f64 = 0.03;

/// One cause of the run: its GPU-hours, share, energy and cost (`--json`'s `causes`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CauseLine {
    pub cause: Cause,
    pub gpu_hours: f64,
    /// Of the GPU-hours the command held.
    pub share: f64,
    pub energy_kwh: f64,
    /// With a price given (`--cost-per-gpu-hour`, `--cost-per-kwh`).
    pub cost: Option<f64>,
    /// For `input_wait` and `straggler_wait`: what fixing that cause alone would have saved
    /// over the run, at most (its GPU-hours, at the GPU-hour price; the energy is the GPU's
    /// busy time, which the work still needs). `null` for the other causes.
    pub saving_gpu_hours: Option<f64>,
    pub saving_cost: Option<f64>,
}

/// The run's causes that have time, in [`Cause::ALL`]'s order.
pub(crate) fn cause_lines(points: &[CausePoint], prices: &Prices) -> Vec<CauseLine> {
    let mut seconds = [0.0; 7];
    let mut joules = [0.0; 7];
    for p in points {
        for i in 0..Cause::ALL.len() {
            seconds[i] += p.gpu_seconds[i];
            joules[i] += p.joules[i];
        }
    }
    let total: f64 = seconds.iter().sum();
    Cause::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| seconds[*i] > 0.0)
        .map(|(i, cause)| {
            let hours = seconds[i] / 3600.0;
            let kwh = joules[i] / 3.6e6;
            let avoidable = cause.is_avoidable_wait();
            CauseLine {
                cause: *cause,
                gpu_hours: hours,
                share: seconds[i] / total,
                energy_kwh: kwh,
                cost: cost(prices, hours, kwh),
                saving_gpu_hours: avoidable.then_some(hours),
                saving_cost: if avoidable {
                    prices.per_gpu_hour.map(|p| p * hours)
                } else {
                    None
                },
            }
        })
        .collect()
}

/// The summary's text for `lines`: one line per cause from [`LINE_FROM_SHARE`] of the time.
pub(crate) fn render_lines(out: &mut String, lines: &[CauseLine]) {
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  where the command's GPU time went (docs/shared-gpus.md#the-ledger-where-the-gpu-hours-went):"
    );
    for line in lines.iter().filter(|l| l.share >= LINE_FROM_SHARE) {
        let cost = line
            .cost
            .map_or(String::new(), |c| format!(", cost {c:.2}"));
        let _ = write!(
            out,
            "    {}: {} GPU-h, {:.0}%{cost}",
            line.cause.as_str(),
            gpu_hours(line.gpu_hours),
            line.share * 100.0
        );
        if let Some(hours) = line.saving_gpu_hours {
            let cost = line
                .saving_cost
                .map_or(String::new(), |c| format!(" (cost {c:.2})"));
            let _ = write!(
                out,
                "; fixing it alone would have saved up to {} GPU-h{cost} so far",
                gpu_hours(hours)
            );
        }
        let _ = writeln!(out);
    }
}

/// GPU-hours with three significant decimals for short runs ("0.0042").
pub(crate) fn gpu_hours(hours: f64) -> String {
    if hours >= 10.0 {
        format!("{hours:.1}")
    } else if hours >= 0.1 {
        format!("{hours:.2}")
    } else {
        format!("{hours:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::recording::{CausePoint, Merge as _};

    fn point(t: f64, compute: f64, input: f64, joules: f64) -> CausePoint {
        CausePoint::of_compute_and_input(t, compute, input, joules)
    }

    #[test]
    fn lines_sum_the_run_and_price_the_waits_a_fix_would_save() {
        let points: Vec<CausePoint> = (0..3600)
            .map(|i| point(f64::from(i), 0.6, 0.4, 360.0))
            .collect();
        let prices = Prices {
            per_gpu_hour: Some(2.0),
            per_kwh: Some(0.5),
        };
        let lines = cause_lines(&points, &prices);
        assert_eq!(lines.len(), 2);
        let compute = &lines[0];
        assert!((compute.gpu_hours - 0.6).abs() < 1e-9);
        assert!((compute.share - 0.6).abs() < 1e-9);
        assert!((compute.energy_kwh - 0.36).abs() < 1e-9);
        assert!((compute.cost.unwrap() - (1.2 + 0.18)).abs() < 1e-9);
        assert_eq!(compute.saving_gpu_hours, None);
        let input = &lines[1];
        assert!((input.saving_gpu_hours.unwrap() - 0.4).abs() < 1e-9);
        assert!((input.saving_cost.unwrap() - 0.8).abs() < 1e-9);

        let mut text = String::new();
        render_lines(&mut text, &lines);
        assert!(
            text.contains("    compute: 0.60 GPU-h, 60%, cost 1.38\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "    input_wait: 0.40 GPU-h, 40%, cost 0.80; fixing it alone would have saved \
                 up to 0.40 GPU-h (cost 0.80) so far\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn small_causes_stay_out_of_the_text_and_merged_points_keep_their_sums() {
        let mut a = point(0.0, 0.99, 0.01, 10.0);
        a.merge(&point(1.0, 0.99, 0.01, 10.0));
        assert_eq!(a.dt, 2.0);
        assert!((a.gpu_seconds[0] - 1.98).abs() < 1e-9);
        let lines = cause_lines(&[a], &Prices::default());
        assert_eq!(lines.len(), 2, "both are in the JSON");
        let mut text = String::new();
        render_lines(&mut text, &lines);
        assert!(!text.contains("input_wait"), "1 % is not a line: {text}");
        assert_eq!(lines[0].cost, None, "no price, no cost");
    }
}
