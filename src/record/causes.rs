//! The report's section on where the recorded command's GPU time went: the ledger's causes
//! (`attribution::ledger`) of the command's processes window by window ([`CausePoint`]) as a
//! stacked chart, and the summary's cause lines ([`CauseLine`]) as a table.
//!
//! GPU time is counted in whole-GPU seconds, as the roll-ups count GPU-hours: a MIG instance's
//! seconds count as its slice of the GPU.

use plotters::prelude::*;

use super::charts::{colours, HEIGHT, MAX_CHART_POINTS, WIDTH};
use super::recording::{CausePoint, Recording};
use super::summary::{gpu_hours, CauseLine};
use crate::attribution::Cause;

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
    (0xc7, 0xc7, 0xc7), // unused: light grey
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
    // Finite points only, pinned to the axes: plotters overflows an i32 converting a coordinate
    // far outside them to pixels (as `charts::draw_on` guards against too).
    let tops: Vec<_> = stacked_tops(points)
        .into_iter()
        .filter(|(start, end, t)| {
            start.is_finite() && end.is_finite() && t.iter().all(|v| v.is_finite())
        })
        .collect();
    let y_max = tops.iter().map(|(_, _, t)| t[6]).fold(1.0f64, f64::max) * 1.05;
    let x_max = if duration_seconds.is_finite() {
        duration_seconds.max(1.0)
    } else {
        1.0
    };
    let tops: Vec<_> = tops
        .into_iter()
        .map(|(start, end, t)| (start.clamp(0.0, x_max), end.clamp(0.0, x_max), t))
        .collect();
    let mut ctx = super::charts::axes(root, x_max, y_max, &|v| format!("{v:.1} GPU"))?;
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
        CausePoint::of_compute_and_input(t, compute, input, joules)
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
