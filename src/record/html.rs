//! The HTML report: one self-contained page (inline CSS and SVG, no script, no font, no network
//! at view time) with the run's summary, its findings, the companion's spans, and per GPU the
//! timelines of activity, memory (device and per process), power, and clocks with the throttled
//! intervals shaded.
//!
//! The page's styles are scoped under `.gpulse-report`, so the same file reads in a browser,
//! inside a notebook cell (`IPython.display.HTML(open(path).read())`) without restyling the
//! notebook, and printed (a GPU's charts are kept on one page).

use std::fmt::Write as _;

use super::charts::{self, colours, Band, Chart, Line, MAX_CHART_POINTS};
use super::recording::{
    DevicePoint, DeviceTrack, ProcessTrack, Recording, SpanKind, NOT_A_SLOWDOWN,
};
use super::summary::{duration, Summary};
use crate::diagnosis::findings::human_bytes;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

pub(crate) const STYLE: &str = r#"
.gpulse-report { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; max-width: 1000px; margin: 0 auto; padding: 12px; line-height: 1.4; background: #fff; }
.gpulse-report h1 { font-size: 1.4em; margin: 0 0 4px; word-break: break-all; }
.gpulse-report h2 { font-size: 1.15em; margin: 24px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.gpulse-report h3 { font-size: 1em; margin: 14px 0 2px; }
.gpulse-report .meta { color: #555; font-size: 0.9em; }
.gpulse-report table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
.gpulse-report th, .gpulse-report td { border-bottom: 1px solid #eee; padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
.gpulse-report td.n { text-align: right; font-variant-numeric: tabular-nums; }
.gpulse-report .chart svg { width: 100%; height: auto; display: block; }
.gpulse-report .legend { font-size: 0.85em; color: #444; margin: 2px 0 0 56px; }
.gpulse-report .legend span { margin-right: 14px; white-space: nowrap; }
.gpulse-report .swatch { display: inline-block; width: 14px; height: 4px; vertical-align: middle; margin-right: 4px; }
.gpulse-report .swatch.band { height: 10px; opacity: 0.35; }
.gpulse-report .finding { border-left: 4px solid #d62728; padding: 4px 10px; margin: 8px 0; background: #fdf3f3; }
.gpulse-report .finding.warning { border-color: #ff9f00; background: #fff8ec; }
.gpulse-report .finding.info { border-color: #1f77b4; background: #f1f7fc; }
.gpulse-report .finding .advice { color: #333; }
.gpulse-report .note { color: #555; font-style: italic; }
.gpulse-report .gpu { break-inside: avoid; page-break-inside: avoid; }
@media print {
  .gpulse-report { max-width: none; padding: 0; font-size: 10pt; }
  .gpulse-report .gpu { break-before: page; }
  .gpulse-report .finding { background: none; }
}
"#;

/// `&`, `<`, `>`, `"` and `'` as entities: every text of the recording goes through here.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page.
pub(crate) fn render(recording: &Recording) -> String {
    let summary = Summary::of(recording);
    let mut page = String::with_capacity(256 * 1024);
    let title = format!("gpulse record: {}", recording.command.join(" "));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<div class=\"gpulse-report\">\n",
        escape(&title)
    );
    header(&mut page, recording, &summary);
    overview(&mut page, &summary);
    super::causes::render_section(&mut page, recording, &summary.causes);
    findings(&mut page, recording);
    spans(&mut page, recording);
    for device in &recording.devices {
        device_section(&mut page, recording, device);
    }
    processes(&mut page, &summary);
    let _ = write!(
        page,
        "<p class=\"meta\">Written by gpulse {}. Charts draw at most {MAX_CHART_POINTS} points \
         per line (bucket means; memory by its maximum); the figures above are exact over every \
         sample.</p>\n</div></body></html>\n",
        env!("CARGO_PKG_VERSION")
    );
    page
}

fn header(page: &mut String, recording: &Recording, summary: &Summary<'_>) {
    let exit = match (summary.exit_code, &summary.exit_signal) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by {signal}"),
        (None, None) => "exit unknown".into(),
    };
    let _ = write!(
        page,
        "<h1>{}</h1>\n<p class=\"meta\">Started {} · ran {} · {} · {} samples{}</p>\n",
        escape(&recording.command.join(" ")),
        humantime::format_rfc3339_seconds(recording.started),
        duration(summary.duration_seconds),
        escape(&exit),
        summary.samples,
        summary
            .sample_interval_seconds
            .map(|s| format!(" every {}", duration(s)))
            .unwrap_or_default(),
    );
    if let Some(reason) = summary.no_gpu_reason {
        let _ = writeln!(
            page,
            "<p class=\"note\">No GPU figures: {}</p>",
            escape(reason)
        );
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{:.0}%", v * 100.0))
}

fn bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "–".into(), |b| human_bytes(b as f64))
}

fn overview(page: &mut String, summary: &Summary<'_>) {
    if summary.devices.is_empty() {
        return;
    }
    page.push_str(
        "<h2>Summary</h2>\n<table><tr><th>GPU</th><th>util mean</th><th>util peak</th>\
         <th>SM act. mean</th><th>tensor mean</th><th>memory peak</th><th>power mean</th>\
         <th>energy</th><th>idle while held (utilisation under 5 %)</th><th>throttled</th></tr>\n",
    );
    for d in &summary.devices {
        let _ = writeln!(
            page,
            "<tr><td>{} {}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{} / {}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            d.index,
            escape(d.name),
            pct(d.utilization_gpu_mean),
            pct(d.utilization_gpu_peak),
            pct(d.sm_activity_mean),
            pct(d.tensor_activity_mean),
            bytes(d.memory_used_peak_bytes),
            bytes(d.memory_total_bytes),
            d.power_mean_watts
                .map_or_else(|| "–".into(), |w| format!("{w:.0} W")),
            d.energy_joules
                .map_or_else(|| "–".into(), |j| format!("{:.2} Wh", j / 3600.0)),
            if d.held_by_command_seconds > 0.0 {
                pct(d.idle_ratio)
            } else {
                "not held".into()
            },
            escape(&d.throttle_reasons_seen.join(", ")),
        );
    }
    page.push_str("</table>\n");
}

fn findings(page: &mut String, recording: &Recording) {
    page.push_str("<h2>Findings</h2>\n");
    if recording.findings.is_empty() {
        page.push_str(if recording.devices.is_empty() {
            "<p class=\"note\">None: there were no GPU figures to diagnose.</p>\n"
        } else {
            "<p class=\"note\">None: no diagnosis rule fired during the run.</p>\n"
        });
        return;
    }
    for f in &recording.findings {
        let values: Vec<String> = f
            .values
            .iter()
            .map(|(n, v)| format!("{} = {}", escape(n), escape(v)))
            .collect();
        let _ = writeln!(
            page,
            "<div class=\"finding {sev}\"><strong>[{sev}] {rule}</strong> · {subject} · {from}–{to}\
             <div>{summary}</div><div class=\"meta\">evidence: {evidence}{values}</div>\
             <div class=\"advice\">Advice: {advice}</div></div>",
            sev = escape(&f.severity),
            rule = escape(&f.rule),
            subject = escape(&f.subject),
            from = duration(f.start_seconds),
            to = f
                .end_seconds
                .map_or_else(|| "end".into(), duration),
            summary = escape(&f.summary),
            evidence = escape(&f.evidence.join(", ")),
            values = if values.is_empty() {
                String::new()
            } else {
                format!(" · {}", values.join(", "))
            },
            advice = escape(&f.advice),
        );
    }
}

fn spans(page: &mut String, recording: &Recording) {
    page.push_str("<h2>Training steps</h2>\n");
    if recording.spans.is_empty() {
        page.push_str(
            "<p class=\"note\">No companion spans: instrument the training loop with the \
             gpulse PyTorch companion and send its OTLP to gpulse (see docs/record.md) to see \
             epochs, steps and data-loader waits here.</p>\n",
        );
        return;
    }
    let duration_s = recording.duration_seconds();
    let band = |kind: SpanKind, colour| -> Vec<Band> {
        recording
            .spans
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| Band {
                start: s.start_seconds,
                end: s.end_seconds,
                colour,
            })
            .collect()
    };
    let mut bands = band(SpanKind::Epoch, colours::EPOCH);
    bands.extend(band(SpanKind::Step, colours::STEP));
    bands.extend(band(SpanKind::DataWait, colours::DATA_WAIT));
    let count = |kind| recording.spans.iter().filter(|s| s.kind == kind).count();
    chart(
        page,
        &Chart {
            y_max: 1.0,
            y_format: |_| String::new(),
            duration: duration_s,
            lines: Vec::new(),
            bands,
        },
        &[],
        &[
            (
                format!("epochs ({})", count(SpanKind::Epoch)),
                colours::EPOCH,
            ),
            (format!("steps ({})", count(SpanKind::Step)), colours::STEP),
            (
                format!("data wait ({})", count(SpanKind::DataWait)),
                colours::DATA_WAIT,
            ),
        ],
    );
}

fn device_section(page: &mut String, recording: &Recording, device: &DeviceTrack) {
    let points = charts::downsample(&device.series.points(), MAX_CHART_POINTS);
    let duration_s = recording.duration_seconds();
    let _ = writeln!(
        page,
        "<div class=\"gpu\"><h2>GPU {} · {} <span class=\"meta\">{}</span></h2>",
        device.index,
        escape(&device.name),
        escape(&device.uuid)
    );
    let finding_bands: Vec<Band> = recording
        .findings
        .iter()
        .filter(|f| f.device_index.is_none_or(|i| i == device.index))
        .map(|f| Band {
            start: f.start_seconds,
            end: f.end_seconds.unwrap_or(duration_s),
            colour: colours::FINDING,
        })
        .collect();
    let mut activity_bands = finding_bands.clone();
    activity_bands.extend(
        recording
            .spans
            .iter()
            .filter(|s| s.kind == SpanKind::DataWait)
            .map(|s| Band {
                start: s.start_seconds,
                end: s.end_seconds,
                colour: colours::DATA_WAIT,
            }),
    );
    let line = |label: &str, colour, value: fn(&DevicePoint) -> Option<f64>| Line {
        label: label.into(),
        colour,
        points: points.iter().map(|p| (p.t, value(p))).collect(),
        dashed: false,
    };
    let activity = vec![
        line("utilisation", colours::UTILIZATION, |p| {
            p.utilization.map(|v| f64::from(v) * 100.0)
        }),
        line("SM activity", colours::SM_ACTIVITY, |p| {
            p.sm_activity.map(|v| f64::from(v) * 100.0)
        }),
        line("tensor activity", colours::TENSOR_ACTIVITY, |p| {
            p.tensor_activity.map(|v| f64::from(v) * 100.0)
        }),
        line("DRAM activity", colours::DRAM_ACTIVITY, |p| {
            p.dram_activity.map(|v| f64::from(v) * 100.0)
        }),
    ];
    panel(
        page,
        "Activity",
        "no activity figures from this GPU",
        Chart {
            y_max: 100.0,
            y_format: charts::percent,
            duration: duration_s,
            lines: activity,
            bands: activity_bands,
        },
        &[
            ("finding".into(), colours::FINDING),
            ("data wait".into(), colours::DATA_WAIT),
        ],
    );

    let used = line("device memory used", colours::MEMORY_USED, |p| {
        p.memory_used.map(|b| b / GIB)
    });
    panel(
        page,
        "Memory",
        "no memory figures from this GPU",
        Chart {
            y_max: 1.0,
            y_format: charts::gib,
            duration: duration_s,
            lines: memory_lines(recording, device, used),
            bands: finding_bands.clone(),
        },
        &[],
    );

    let power = line("power", colours::POWER, |p| p.power_watts.map(f64::from));
    panel(
        page,
        "Power",
        "no power figures from this GPU",
        Chart {
            y_max: 10.0,
            y_format: charts::watts,
            duration: duration_s,
            lines: vec![power],
            bands: finding_bands,
        },
        &[],
    );

    let clocks = vec![
        line("SM clock", colours::SM_CLOCK, |p| {
            p.sm_clock_mhz.map(f64::from)
        }),
        line("memory clock", colours::MEMORY_CLOCK, |p| {
            p.memory_clock_mhz.map(f64::from)
        }),
    ];
    let throttled: Vec<Band> = points
        .iter()
        .filter(|p| p.throttle.is_some_and(|bits| bits & !NOT_A_SLOWDOWN != 0))
        .map(|p| Band {
            start: p.t,
            end: p.t + p.dt.max(recording.sample_interval_seconds.unwrap_or(0.0)),
            colour: colours::THROTTLE,
        })
        .collect();
    panel(
        page,
        "Clocks and throttling",
        "no clock figures from this GPU",
        Chart {
            y_max: 100.0,
            y_format: charts::mhz,
            duration: duration_s,
            lines: clocks,
            bands: throttled,
        },
        &[("throttled".into(), colours::THROTTLE)],
    );
    page.push_str("</div>\n");
}

/// One panel of a GPU's section: its heading, then its chart with a legend of its lines and
/// `bands`, or a note saying `missing` when none of its lines has a figure (a line without any
/// is left out of the chart and the legend).
fn panel(
    page: &mut String,
    title: &str,
    missing: &str,
    mut figure: Chart,
    bands: &[(String, (u8, u8, u8))],
) {
    figure
        .lines
        .retain(|l| l.points.iter().any(|(_, v)| v.is_some()));
    section(page, title, &figure.lines, missing);
    if !figure.lines.is_empty() {
        let lines = figure.lines.clone();
        chart(page, &figure, &lines, bands);
    }
}

/// The memory panel's lines: the device's `used` and total, the other processes summed, and the
/// command's processes.
fn memory_lines(recording: &Recording, device: &DeviceTrack, used: Line) -> Vec<Line> {
    let duration_s = recording.duration_seconds();
    let mut memory = vec![used];
    if let Some(total) = device.memory_total_bytes {
        memory.push(Line {
            label: "device memory total".into(),
            colour: (0x99, 0x99, 0x99),
            points: vec![(0.0, Some(total / GIB)), (duration_s, Some(total / GIB))],
            dashed: true,
        });
    }
    // The command's processes take the palette in the order they appeared (its root first) and
    // are drawn after the others, the root last: on top where lines meet. Other processes are
    // one summed line, and so are the command's beyond the palette: a node with 64 processes
    // per GPU must not make 64 lines per chart (nor a report over 2 MB).
    let on_device = || {
        recording
            .processes
            .iter()
            .filter(move |p| p.device_index == device.index)
    };
    let others: Vec<&ProcessTrack> = on_device().filter(|p| !p.in_command).collect();
    let mine: Vec<&ProcessTrack> = on_device().filter(|p| p.in_command).collect();
    let shown = mine.len().min(colours::PROCESSES.len());
    if !others.is_empty() {
        memory.push(Line {
            label: format!("other processes ({}), summed", others.len()),
            colour: colours::OTHER_PROCESSES,
            points: summed_memory(&others, duration_s),
            dashed: true,
        });
    }
    if mine.len() > shown {
        memory.push(Line {
            label: format!(
                "{} more of the command's processes, summed",
                mine.len() - shown
            ),
            colour: colours::OTHER_PROCESSES,
            points: summed_memory(&mine[shown..], duration_s),
            dashed: false,
        });
    }
    for (p, colour) in mine[..shown].iter().zip(colours::PROCESSES).rev() {
        let series = charts::downsample(&p.series.points(), MAX_CHART_POINTS);
        memory.push(Line {
            label: format!("pid {} ({})", p.pid, p.name.as_deref().unwrap_or("?")),
            colour,
            points: series
                .iter()
                .map(|m| (m.t, m.bytes.map(|b| b / GIB)))
                .collect(),
            dashed: false,
        });
    }
    memory
}

/// The memory of several processes added up, in GiB, over [`MAX_CHART_POINTS`] time buckets
/// (each process counted by its largest value in a bucket); `None` where none was listed.
fn summed_memory(tracks: &[&ProcessTrack], duration: f64) -> Vec<(f64, Option<f64>)> {
    let buckets = MAX_CHART_POINTS;
    let width = duration.max(f64::MIN_POSITIVE) / buckets as f64;
    let mut sums: Vec<Option<f64>> = vec![None; buckets];
    for track in tracks {
        let mut peaks: Vec<Option<f64>> = vec![None; buckets];
        for point in track.series.points() {
            let Some(bytes) = point.bytes else { continue };
            let i = ((point.t / width) as usize).min(buckets - 1);
            peaks[i] = Some(peaks[i].map_or(bytes, |p: f64| p.max(bytes)));
        }
        for (sum, peak) in sums.iter_mut().zip(peaks) {
            if let Some(peak) = peak {
                *sum = Some(sum.unwrap_or(0.0) + peak);
            }
        }
    }
    sums.into_iter()
        .enumerate()
        .map(|(i, sum)| (i as f64 * width, sum.map(|b| b / GIB)))
        .collect()
}

fn section(page: &mut String, title: &str, lines: &[Line], missing: &str) {
    let _ = writeln!(page, "<h3>{title}</h3>");
    if lines.is_empty() {
        let _ = writeln!(page, "<p class=\"note\">{}</p>", escape(missing));
    }
}

fn chart(page: &mut String, chart: &Chart, lines: &[Line], bands: &[(String, (u8, u8, u8))]) {
    let _ = write!(
        page,
        "<div class=\"chart\">{}</div>\n<div class=\"legend\">",
        charts::draw(chart)
    );
    for l in lines {
        let _ = write!(
            page,
            "<span><i class=\"swatch\" style=\"background:{}\"></i>{}</span>",
            colours::hex(l.colour),
            escape(&l.label)
        );
    }
    for (label, colour) in bands {
        let _ = write!(
            page,
            "<span><i class=\"swatch band\" style=\"background:{}\"></i>{}</span>",
            colours::hex(*colour),
            escape(label)
        );
    }
    page.push_str("</div>\n");
}

fn processes(page: &mut String, summary: &Summary<'_>) {
    if summary.processes.is_empty() && summary.other_processes.is_empty() {
        return;
    }
    page.push_str(
        "<h2>GPU processes</h2>\n<table><tr><th>pid</th><th>name</th><th>GPU</th>\
         <th>memory peak</th><th>seen</th><th></th></tr>\n",
    );
    for (p, whose) in summary
        .processes
        .iter()
        .map(|p| (p, "the command"))
        .chain(summary.other_processes.iter().map(|p| (p, "other process")))
    {
        let _ = writeln!(
            page,
            "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td>{}–{}</td><td>{}</td></tr>",
            p.pid,
            escape(p.name.unwrap_or("?")),
            p.device_index,
            bytes(p.gpu_memory_peak_bytes),
            duration(p.first_seen_seconds),
            duration(p.last_seen_seconds),
            whose
        );
    }
    page.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::record::recording::{DeviceTrack, FindingMark, MemoryPoint, ProcessTrack, SpanMark};
    use std::time::{Duration, SystemTime};

    /// A synthetic one-hour run at 100 ms on 8 GPUs, each with two processes of the command and
    /// 16 others, noisy signals, throttling bursts, 7 200 steps with data waits and findings.
    fn long_recording() -> Recording {
        let mut rng = fastrand::Rng::with_seed(25);
        let mut recording = Recording::empty(
            vec!["python".into(), "train.py".into()],
            SystemTime::UNIX_EPOCH,
        );
        recording.ended = SystemTime::UNIX_EPOCH + Duration::from_secs(3600);
        recording.sample_interval_seconds = Some(0.1);
        recording.samples = 36_000;
        for index in 0..8 {
            let mut track = DeviceTrack {
                index,
                uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: Some(80.0 * GIB),
                ..DeviceTrack::default()
            };
            for i in 0..36_000u32 {
                let t = f64::from(i) * 0.1;
                track.series.push(DevicePoint {
                    t,
                    dt: 0.1,
                    n: 1,
                    utilization: Some(rng.f32()),
                    sm_activity: Some(rng.f32()),
                    tensor_activity: Some(rng.f32() * 0.5),
                    dram_activity: Some(rng.f32() * 0.3),
                    memory_used: Some(40.0 * GIB + rng.f64() * GIB),
                    power_watts: Some(300.0 + rng.f32() * 400.0),
                    sm_clock_mhz: Some(1400.0 + rng.f32() * 580.0),
                    memory_clock_mhz: Some(2619.0),
                    throttle: Some(if rng.u8(..) < 20 { 0x4 } else { 0 }),
                    held_seconds: 0.1,
                    idle_seconds: 0.0,
                });
            }
            recording.devices.push(track);
            let processes = [(1000 + index, true), (2000 + index, true)]
                .into_iter()
                .chain((0..16).map(|i| (3000 + 100 * index + i, false)));
            for (pid, in_command) in processes {
                let mut p = ProcessTrack {
                    pid,
                    device_index: index,
                    in_command,
                    name: Some("python".into()),
                    ..ProcessTrack::default()
                };
                for i in 0..36_000u32 {
                    p.series.push(MemoryPoint {
                        t: f64::from(i) * 0.1,
                        bytes: Some(10.0 * GIB + rng.f64() * GIB),
                    });
                }
                recording.processes.push(p);
            }
        }
        for step in 0..7200u32 {
            let start = f64::from(step) * 0.5;
            recording.spans.push(SpanMark {
                kind: SpanKind::Step,
                name: "step".into(),
                start_seconds: start,
                end_seconds: start + 0.4,
            });
            recording.spans.push(SpanMark {
                kind: SpanKind::DataWait,
                name: "data_wait".into(),
                start_seconds: start,
                end_seconds: start + 0.1,
            });
        }
        for i in 0..20u32 {
            recording.findings.push(FindingMark {
                rule: "input_bound".into(),
                severity: "warning".into(),
                subject: "pid 1000 (python) on GPU 0".into(),
                device_index: Some(i % 8),
                summary: "the GPU waits for data".into(),
                advice: "raise num_workers".into(),
                evidence: vec!["nvml".into(), "spans".into()],
                values: vec![("data_wait_ratio".into(), "0.4".into())],
                start_seconds: f64::from(i) * 170.0,
                end_seconds: Some(f64::from(i) * 170.0 + 60.0),
            });
        }
        recording
    }

    /// The issue's bound: a one-hour run at 100 ms makes a report under 2 MB.
    #[test]
    fn a_one_hour_run_at_100ms_on_8_gpus_stays_under_2_mb() {
        let page = render(&long_recording());
        let mb = page.len() as f64 / 1e6;
        println!("report of 1 h at 100 ms on 8 GPUs: {mb:.2} MB");
        assert!(page.len() < 2_000_000, "{mb:.2} MB");
        assert_eq!(
            page.matches("<svg").count(),
            8 * 4 + 1,
            "4 charts per GPU + the steps"
        );
        assert!(!page.contains("<script"));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }
}
