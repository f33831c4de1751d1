//! Where the recorded command's GPU time went: the ledger's causes (`attribution::ledger`) of the
//! command's processes, window by window, as the summary's lines ("input_wait: 0.41 GPU-h,
//! 19 %, cost 1.48"), what fixing a wait alone would have saved, and the report's stacked chart.
//!
//! GPU time is counted in whole-GPU seconds, as the roll-ups count GPU-hours: a MIG instance's
//! seconds count as its slice of the GPU.

use plotters::prelude::*;
use serde::Serialize;

use super::charts::{colours, HEIGHT, MAX_CHART_POINTS, WIDTH};
use super::model::{Merge, Recording};
use super::summary::duration;
use crate::attribution::accounting::cost;
use crate::attribution::{AttributedWindow, Cause, Prices};

/// A cause is a line of the summary's text from this share of the GPU time on.
pub(crate) const LINE_FROM_SHARE: f64 = 0.03;

/// The command's GPU time and energy by cause over one analysed window (or the merge of
/// several), indexed as [`Cause::ALL`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CausePoint {
    /// Seconds since the recording started, of the window's start.
    pub t: f64,
    /// Seconds the point covers.
    pub dt: f64,
    pub gpu_seconds: [f64; 7],
    pub joules: [f64; 7],
}

impl Merge for CausePoint {
    fn merge(&mut self, later: &Self) {
        self.dt = (later.t + later.dt - self.t).max(self.dt + later.dt);
        for i in 0..Cause::ALL.len() {
            self.gpu_seconds[i] += later.gpu_seconds[i];
            self.joules[i] += later.joules[i];
        }
    }
}

impl CausePoint {
    /// The window of `attributed`, covering `dt` seconds from `t` seconds into the recording (as
    /// the accountant counts it: from the previous window's end), summed over the processes
    /// `is_command` accepts; `None` when none of them held a GPU in it.
    pub(crate) fn of_window(
        attributed: &AttributedWindow,
        t: f64,
        dt: f64,
        mut is_command: impl FnMut(u32) -> bool,
    ) -> Option<Self> {
        let mut point = CausePoint {
            t,
            dt,
            ..CausePoint::default()
        };
        let mut any = false;
        for process in &attributed.accounts.ledger.processes {
            if !is_command(process.pid) {
                continue;
            }
            let share = attributed
                .accounts
                .process(process.pid, &process.device_uuid)
                .and_then(|a| a.gpu_share)
                .unwrap_or(0.0);
            for c in &process.window {
                let i = index(c.cause);
                point.gpu_seconds[i] += c.seconds * share;
                point.joules[i] += c.joules.unwrap_or(0.0);
                any = true;
            }
        }
        any.then_some(point)
    }
}

fn index(cause: Cause) -> usize {
    Cause::ALL.iter().position(|c| *c == cause).unwrap_or(0)
}

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
    use std::fmt::Write as _;
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
fn gpu_hours(hours: f64) -> String {
    if hours >= 10.0 {
        format!("{hours:.1}")
    } else if hours >= 0.1 {
        format!("{hours:.2}")
    } else {
        format!("{hours:.4}")
    }
}

/// The report's section: the stacked chart of the causes over time, its legend, and a table of
/// the causes with their GPU-hours, share, energy, cost and saving. Nothing when no window of
/// the command was analysed.
pub(crate) fn render_section(page: &mut String, recording: &Recording, lines: &[CauseLine]) {
    use std::fmt::Write as _;
    if lines.is_empty() {
        return;
    }
    let points = super::charts::downsample(&recording.causes.points(), MAX_CHART_POINTS);
    let _ = write!(
        page,
        "<h2>Where the GPU time went</h2>\n<p class=\"note\">Each window's GPUs held by the \
         command, split by cause (docs/shared-gpus.md, the ledger).</p>\n\
         <div class=\"chart causes\">{}</div>\n<div class=\"legend\">",
        draw_stacked(&points, recording.duration_seconds())
    );
    for (cause, colour) in Cause::ALL.iter().zip(CAUSE_COLOURS) {
        let _ = write!(
            page,
            "<span><i class=\"swatch\" style=\"background:{}\"></i>{}</span>",
            colours::hex(colour),
            cause.as_str()
        );
    }
    page.push_str(
        "</div>\n<table><tr><th>cause</th><th>GPU-hours</th><th>share</th><th>kWh</th>\
         <th>cost</th><th>fixing it alone would have saved</th></tr>\n",
    );
    let money = |c: Option<f64>| c.map_or("-".to_string(), |c| format!("{c:.2}"));
    for line in lines {
        let saving = match (line.saving_gpu_hours, line.saving_cost) {
            (Some(hours), Some(cost)) => {
                format!("up to {} GPU-h, cost {cost:.2}", gpu_hours(hours))
            }
            (Some(hours), None) => format!("up to {} GPU-h", gpu_hours(hours)),
            _ => "-".to_string(),
        };
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{:.0}%</td><td>{:.4}</td><td>{}</td><td>{saving}</td></tr>",
            line.cause.as_str(),
            gpu_hours(line.gpu_hours),
            line.share * 100.0,
            line.energy_kwh,
            money(line.cost),
        );
    }
    page.push_str("</table>\n");
}

/// Colours of the causes in the chart, in [`Cause::ALL`]'s order (the legend uses them too).
pub(crate) const CAUSE_COLOURS: [(u8, u8, u8); 7] = [
    (0x2c, 0xa0, 0x2c), // compute: green
    (0xff, 0x7f, 0x0e), // input_wait: orange
    (0x94, 0x67, 0xbd), // collective_wait: purple
    (0xd6, 0x27, 0x28), // straggler_wait: red
    (0x17, 0xbe, 0xcf), // host: cyan
    (0xc7, 0xc7, 0xc7), // idle: light grey
    (0x7f, 0x7f, 0x7f), // unknown: grey
];

/// The causes stacked over time as an SVG document: each window's GPUs held (GPU-seconds per
/// second), split by cause from compute at the bottom to unknown at the top.
pub(crate) fn draw_stacked(points: &[CausePoint], duration_seconds: f64) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        if let Err(e) = draw_stacked_on(&root, points, duration_seconds) {
            tracing::warn!("the report's chart of causes could not be drawn: {e}");
        }
        let _ = root.present();
    }
    svg
}

/// Each point's stacked tops: `tops[k]` is the sum of the first `k + 1` causes, per GPU-second.
fn stacked_tops(points: &[CausePoint]) -> Vec<(f64, f64, [f64; 7])> {
    points
        .iter()
        .filter(|p| p.dt > 0.0)
        .map(|p| {
            let mut tops = [0.0; 7];
            let mut sum = 0.0;
            for (i, top) in tops.iter_mut().enumerate() {
                sum += p.gpu_seconds[i] / p.dt;
                *top = sum;
            }
            (p.t, p.t + p.dt, tops)
        })
        .collect()
}

fn draw_stacked_on(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    points: &[CausePoint],
    duration_seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let tops = stacked_tops(points);
    let y_max = tops.iter().map(|(_, _, t)| t[6]).fold(1.0f64, f64::max) * 1.05;
    let x_max = duration_seconds.max(1.0);
    let mut ctx = ChartBuilder::on(root)
        .margin(8)
        .x_label_area_size(22)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    ctx.configure_mesh()
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&|t| duration(*t))
        .y_label_formatter(&|v| format!("{v:.1} GPU"))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .axis_style(RGBColor(0x99, 0x99, 0x99))
        .label_style(
            ("sans-serif", 12)
                .into_font()
                .color(&RGBColor(0x44, 0x44, 0x44)),
        )
        .draw()?;
    // Each window is a column of stacked rectangles: exact, with no interpolation across a gap.
    for (k, colour) in CAUSE_COLOURS.iter().enumerate() {
        let (r, g, b) = *colour;
        ctx.draw_series(tops.iter().filter_map(|(start, end, t)| {
            let bottom = if k == 0 { 0.0 } else { t[k - 1] };
            (t[k] > bottom).then(|| {
                Rectangle::new([(*start, bottom), (*end, t[k])], RGBColor(r, g, b).filled())
            })
        }))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, compute: f64, input: f64, joules: f64) -> CausePoint {
        let mut p = CausePoint {
            t,
            dt: 1.0,
            ..CausePoint::default()
        };
        p.gpu_seconds[0] = compute;
        p.gpu_seconds[1] = input;
        p.joules[0] = joules;
        p
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

    #[test]
    fn the_chart_stacks_each_cause_in_its_colour() {
        let points = vec![point(0.0, 0.5, 0.3, 0.0), point(1.0, 0.2, 0.8, 0.0)];
        let tops = stacked_tops(&points);
        assert!((tops[0].2[1] - 0.8).abs() < 1e-9);
        assert!((tops[1].2[6] - 1.0).abs() < 1e-9);
        let svg = draw_stacked(&points, 2.0);
        assert!(svg.starts_with("<svg"));
        let lower = svg.to_ascii_lowercase();
        assert!(
            lower.contains("#2ca02c") && lower.contains("#ff7f0e"),
            "{svg}"
        );
        assert!(!lower.contains("#d62728"), "no straggler_wait drawn: {svg}");
    }
}
