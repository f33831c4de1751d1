//! The report's charts: time series drawn by plotters' SVG backend into strings the HTML page
//! inlines. Series are first reduced to at most [`MAX_CHART_POINTS`] buckets (means, memory by
//! its maximum), so a chart's size does not grow with the run: a one-hour run at 100 ms draws
//! as many points as a ten-minute one.
//!
//! Text is left to the browser (SVG `<text>`, no font files), and colours are fixed per
//! signal so a reader learns them once; the legend is HTML next to the chart.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::recording::Merge;
use super::summary::duration;

/// Buckets a chart draws a series with: about one per pixel pair of a 960 px wide chart.
pub(crate) const MAX_CHART_POINTS: usize = 480;

/// Chart size in SVG user units; the page scales it to the column width.
pub(crate) const WIDTH: u32 = 960;
pub(crate) const HEIGHT: u32 = 200;

/// Colours of the signals, as `#rrggbb` (the legend and the tests use the same values).
pub(crate) mod colours {
    pub(crate) const UTILIZATION: (u8, u8, u8) = (0x1f, 0x77, 0xb4);
    pub(crate) const SM_ACTIVITY: (u8, u8, u8) = (0xff, 0x7f, 0x0e);
    pub(crate) const TENSOR_ACTIVITY: (u8, u8, u8) = (0x2c, 0xa0, 0x2c);
    pub(crate) const DRAM_ACTIVITY: (u8, u8, u8) = (0x94, 0x67, 0xbd);
    pub(crate) const MEMORY_USED: (u8, u8, u8) = (0x1f, 0x77, 0xb4);
    pub(crate) const OTHER_PROCESSES: (u8, u8, u8) = (0x7f, 0x7f, 0x7f);
    pub(crate) const POWER: (u8, u8, u8) = (0xd6, 0x27, 0x28);
    pub(crate) const SM_CLOCK: (u8, u8, u8) = (0x17, 0xbe, 0xcf);
    pub(crate) const MEMORY_CLOCK: (u8, u8, u8) = (0x8c, 0x56, 0x4b);
    /// Per-process memory lines of the command, in turn.
    pub(crate) const PROCESSES: [(u8, u8, u8); 4] = [
        (0xe3, 0x77, 0xc2),
        (0xbc, 0xbd, 0x22),
        (0x2c, 0xa0, 0x2c),
        (0xff, 0x7f, 0x0e),
    ];
    /// Shaded intervals.
    pub(crate) const FINDING: (u8, u8, u8) = (0xd6, 0x27, 0x28);
    pub(crate) const THROTTLE: (u8, u8, u8) = (0xff, 0xbf, 0x00);
    pub(crate) const DATA_WAIT: (u8, u8, u8) = (0x7f, 0x7f, 0x7f);
    pub(crate) const EPOCH: (u8, u8, u8) = (0x1f, 0x77, 0xb4);
    pub(crate) const STEP: (u8, u8, u8) = (0x2c, 0xa0, 0x2c);

    /// `#rrggbb`.
    pub(crate) fn hex((r, g, b): (u8, u8, u8)) -> String {
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

/// One line of a chart: `(t, value)` points, `None` where the value was not measured (the line
/// breaks there instead of pretending a zero).
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub label: String,
    pub colour: (u8, u8, u8),
    pub points: Vec<(f64, Option<f64>)>,
    pub dashed: bool,
}

/// A shaded interval of the time axis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Band {
    pub start: f64,
    pub end: f64,
    pub colour: (u8, u8, u8),
}

/// What to draw.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    /// The y axis, from 0 to at least this (the data's maximum raises it).
    pub y_max: f64,
    /// Formats a y tick, e.g. as a percentage.
    pub y_format: fn(&f64) -> String,
    pub duration: f64,
    pub lines: Vec<Line>,
    pub bands: Vec<Band>,
}

/// Reduces `points` to at most `max` by merging neighbours into equal-count buckets.
pub(crate) fn downsample<T: Merge + Clone>(points: &[T], max: usize) -> Vec<T> {
    if points.len() <= max || max == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(max);
    points
        .chunks(per)
        .map(|chunk| {
            let mut first = chunk[0].clone();
            for p in &chunk[1..] {
                first.merge(p);
            }
            first
        })
        .collect()
}

/// Draws `chart` as an SVG document (a string starting with `<svg`).
pub(crate) fn draw(chart: &Chart) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        if let Err(e) = draw_on(&root, chart) {
            tracing::warn!("a chart of the report could not be drawn: {e}");
        }
        let _ = root.present();
    }
    svg
}

fn rgb((r, g, b): (u8, u8, u8)) -> RGBColor {
    RGBColor(r, g, b)
}

fn draw_on(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    chart: &Chart,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let data_max = chart
        .lines
        .iter()
        .flat_map(|l| l.points.iter().filter_map(|(_, v)| *v))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    // Finite bounds only: a recording's values are whatever its file says, and an infinite
    // axis maps every point to nowhere.
    let y_max = [chart.y_max, data_max * 1.05, data_max]
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(f64::MIN_POSITIVE, f64::max);
    let x_max = if chart.duration.is_finite() {
        chart.duration.max(1.0)
    } else {
        1.0
    };
    // plotters turns a coordinate into pixels in i32 and overflows far outside its range
    // (a time of 1e300 s, a value of -1e300), so points are pinned to the chart's edges.
    let visible = |(t, v): (f64, f64)| (t.clamp(0.0, x_max), v.clamp(0.0, y_max));
    let mut ctx = axes(root, x_max, y_max, &chart.y_format)?;
    ctx.draw_series(
        merge_bands(&chart.bands, x_max / f64::from(WIDTH))
            .iter()
            .map(|b| {
                Rectangle::new(
                    [
                        visible((b.start, 0.0)),
                        visible((b.end.max(b.start), y_max)),
                    ],
                    rgb(b.colour).mix(0.18).filled(),
                )
            }),
    )?;
    for line in &chart.lines {
        let style = rgb(line.colour).stroke_width(2);
        for segment in segments(&line.points) {
            let segment: Vec<(f64, f64)> = segment.into_iter().map(visible).collect();
            if line.dashed {
                ctx.draw_series(DashedLineSeries::new(segment, 6, 4, style))?;
            } else if segment.len() == 1 {
                ctx.draw_series(std::iter::once(Circle::new(segment[0], 2, style.filled())))?;
            } else {
                ctx.draw_series(LineSeries::new(segment, style))?;
            }
        }
    }
    Ok(())
}

/// A white chart of the report's look on `root`: time from 0 to `x_max` seconds on x, 0 to
/// `y_max` on y with ticks as `y_format` writes them, its grid drawn.
pub(crate) fn axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    x_max: f64,
    y_max: f64,
    y_format: &dyn Fn(&f64) -> String,
) -> Result<
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    Box<dyn std::error::Error>,
> {
    let mut ctx = ChartBuilder::on(root)
        .margin(8)
        .x_label_area_size(22)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    ctx.configure_mesh()
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&|t| duration(*t))
        .y_label_formatter(&y_format)
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .axis_style(RGBColor(0x99, 0x99, 0x99))
        .label_style(
            ("sans-serif", 12)
                .into_font()
                .color(&RGBColor(0x44, 0x44, 0x44)),
        )
        .draw()?;
    Ok(ctx)
}

/// Bands of one colour closer than `gap` (about a pixel) merged into one, so thousands of
/// training steps draw as a few rectangles rather than one each.
pub(crate) fn merge_bands(bands: &[Band], gap: f64) -> Vec<Band> {
    let mut sorted = bands.to_vec();
    sorted.sort_by(|a, b| a.colour.cmp(&b.colour).then(a.start.total_cmp(&b.start)));
    let mut out: Vec<Band> = Vec::with_capacity(sorted.len());
    for band in sorted {
        match out.last_mut() {
            Some(last) if last.colour == band.colour && band.start <= last.end + gap => {
                last.end = last.end.max(band.end);
            }
            _ => out.push(band),
        }
    }
    out
}

/// The runs of known values, each drawn as its own line.
fn segments(points: &[(f64, Option<f64>)]) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for (t, v) in points {
        match v {
            Some(v) if v.is_finite() => current.push((*t, *v)),
            _ => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// "42%".
pub(crate) fn percent(v: &f64) -> String {
    format!("{v:.0}%")
}

/// "12.5 GiB" with one decimal under 10.
pub(crate) fn gib(v: &f64) -> String {
    if *v < 10.0 {
        format!("{v:.1} GiB")
    } else {
        format!("{v:.0} GiB")
    }
}

pub(crate) fn watts(v: &f64) -> String {
    format!("{v:.0} W")
}

pub(crate) fn mhz(v: &f64) -> String {
    format!("{v:.0} MHz")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::recording::MemoryPoint;

    #[test]
    fn close_bands_of_one_colour_merge() {
        let band = |start, end, colour| Band { start, end, colour };
        let merged = merge_bands(
            &[
                band(0.0, 1.0, colours::STEP),
                band(1.05, 2.0, colours::STEP),
                band(5.0, 6.0, colours::STEP),
                band(1.5, 1.6, colours::DATA_WAIT),
            ],
            0.1,
        );
        assert_eq!(merged.len(), 3, "{merged:?}");
        assert!(merged.iter().any(|b| b.start == 0.0 && b.end == 2.0));
    }

    #[test]
    fn gaps_break_the_line_instead_of_dropping_to_zero() {
        let s = segments(&[
            (0.0, Some(1.0)),
            (1.0, None),
            (2.0, Some(2.0)),
            (3.0, Some(3.0)),
        ]);
        assert_eq!(s, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
    }

    #[test]
    fn downsampling_bounds_the_points_and_keeps_the_maximum() {
        let points: Vec<MemoryPoint> = (0..36_000)
            .map(|i| MemoryPoint {
                t: f64::from(i) * 0.1,
                bytes: Some(if i == 12_345 { 1e12 } else { 1.0 }),
            })
            .collect();
        let reduced = downsample(&points, MAX_CHART_POINTS);
        assert!(reduced.len() <= MAX_CHART_POINTS);
        assert!(
            reduced.iter().any(|p| p.bytes == Some(1e12)),
            "the spike survives"
        );
    }

    /// Found by fuzzing `gpulse report` (fuzz target `otlp_json`): plotters overflowed an i32
    /// (a panic in debug builds, a garbled chart in release) on points far outside the axes.
    #[test]
    fn points_far_outside_the_axes_are_pinned_to_the_edges() {
        let svg = draw(&Chart {
            y_max: 1.0,
            y_format: percent,
            duration: 10.0,
            lines: vec![Line {
                label: "utilisation".into(),
                colour: colours::UTILIZATION,
                points: vec![
                    (-1e300, Some(0.5)),
                    (0.5, Some(-1e300)),
                    (0.7, Some(f64::MAX)),
                    (1e300, Some(1e300)),
                ],
                dashed: true,
            }],
            bands: vec![Band {
                start: 1e300,
                end: -1e300,
                colour: colours::STEP,
            }],
        });
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(
            svg.contains("path") || svg.contains("polyline"),
            "the line is drawn: {svg}"
        );
    }

    #[test]
    fn a_chart_is_an_svg_with_its_line_colour() {
        let svg = draw(&Chart {
            y_max: 100.0,
            y_format: percent,
            duration: 10.0,
            lines: vec![Line {
                label: "utilisation".into(),
                colour: colours::UTILIZATION,
                points: (0..10)
                    .map(|i| (f64::from(i), Some(f64::from(i * 10))))
                    .collect(),
                dashed: false,
            }],
            bands: vec![],
        });
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("polyline"), "a line series is a polyline");
        assert!(svg.to_ascii_lowercase().contains("#1f77b4"));
    }
}
