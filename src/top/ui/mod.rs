//! Draws an [`App`] on a ratatui frame: header, one line or two per GPU, the process table,
//! the roll-ups panel when asked for (`r`), the findings panel and the footer of keys; the detail
//! pane over them when open. Pure: it reads
//! the state and writes the frame, so layouts are tested on ratatui's `TestBackend`.
//!
//! The layout gives each part what it needs at the size it has: at 80×24 a GPU takes one line and
//! the table drops its least needed columns (pod, user, RSS); from 40 rows a GPU takes two lines
//! (clocks, throttle reasons and sparklines of utilisation and memory). Colours only mark levels
//! (green, yellow, red) and severities; with `NO_COLOR` the same screen is drawn without them.
//!
//! This file lays the screen out and draws the header, findings and footer, with the palette and
//! the small text helpers every part uses; `gpus`, `processes`, `rollups` and `detail` draw their
//! parts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

mod detail;
mod gpus;
mod processes;
mod ranks;
mod rollups;

use super::app::{App, Series};
use super::input::Mode;
use crate::diagnosis::{Finding, Severity};
use detail::draw_detail;
use gpus::draw_gpus;
use processes::draw_processes;
use rollups::draw_rollups;

/// From this height on, each GPU gets a second line (clocks, throttling, history).
const TALL: u16 = 40;
const SPARK_LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Draws the whole screen.
pub(crate) fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let palette = Palette { color: app.color };
    let gpu_count = app
        .view
        .as_ref()
        .map_or(0, |v| v.attributed.window.devices.len());
    // One line per MIG device, under its GPU.
    let mig_count = app.view.as_ref().map_or(0, |v| {
        v.attributed
            .window
            .devices
            .iter()
            .map(|d| d.mig_instances.len())
            .sum::<usize>()
    }) as u16;
    // Two lines per GPU only when all of them fit so; seeing every GPU matters more.
    let gpu_budget = area.height * 2 / 5;
    let lines_per_gpu: u16 =
        if area.height >= TALL && gpu_count as u16 * 2 + mig_count + 2 <= gpu_budget {
            2
        } else {
            1
        };
    let gpu_height = (gpu_count.max(1) as u16 * lines_per_gpu + mig_count + 2)
        .min(gpu_budget)
        .max(3);
    // Findings get two lines each (subject and since when, then summary and advice) when the
    // process table keeps all its rows (or at least 8) beside them.
    let finding_count = app.view.as_ref().map_or(0, |v| v.findings.len()) as u16;
    let room = area.height.saturating_sub(gpu_height + 2);
    let table_wants = (app.rows.len() as u16).min(8) + 3;
    let per_finding: u16 = if finding_count * 2 + 2 + table_wants <= room {
        2
    } else {
        1
    };
    let findings_height = (finding_count.max(1) * per_finding + 2)
        .min((area.height / 3).max(room.saturating_sub(table_wants)))
        .max(3);
    // The roll-ups panel, when shown, takes what it needs up to a third of the screen.
    let rollups_height = if app.rollups {
        rollups::wanted_height(app).min((area.height / 3).max(4))
    } else {
        0
    };
    let [header, gpus, processes, rollups, findings, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpu_height),
        Constraint::Min(4),
        Constraint::Length(rollups_height),
        Constraint::Length(findings_height),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_header(frame, header, app, &palette);
    draw_gpus(frame, gpus, app, lines_per_gpu, &palette);
    draw_processes(frame, processes, app, &palette);
    if app.rollups {
        draw_rollups(frame, rollups, app, &palette);
    }
    draw_findings(frame, findings, app, per_finding, &palette);
    draw_footer(frame, footer, app, &palette);
    if app.detail {
        draw_detail(frame, area, app, &palette);
    }
}

/// Styles, or none of them under `NO_COLOR`.
struct Palette {
    color: bool,
}

impl Palette {
    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    fn level(&self, percent: f64) -> Style {
        self.fg(if percent >= 90.0 {
            Color::Red
        } else if percent >= 60.0 {
            Color::Yellow
        } else {
            Color::Green
        })
    }

    fn severity(&self, severity: Severity) -> Style {
        let style = self.fg(match severity {
            Severity::Info => Color::Cyan,
            Severity::Warning => Color::Yellow,
            Severity::Error | Severity::Critical => Color::Red,
        });
        if severity >= Severity::Error {
            style.add_modifier(Modifier::BOLD)
        } else {
            style
        }
    }

    fn title(&self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    fn dim(&self) -> Style {
        self.fg(Color::DarkGray)
    }
}

/// `gpulse top  host H  driver D  CUDA C  gpulse CPU x%`, then (when wide) counts and the time.
fn draw_header(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
    let mut spans = vec![Span::styled("gpulse top", palette.title())];
    spans.push(Span::raw(format!("  host {}", app.host)));
    if let Some(view) = &app.view {
        let w = &view.attributed.window;
        spans.push(Span::raw(format!(
            "  driver {}  CUDA {}",
            w.driver_version.as_deref().unwrap_or("?"),
            w.cuda_driver_version.as_deref().unwrap_or("?"),
        )));
    }
    spans.push(Span::raw(format!(
        "  gpulse CPU {}",
        app.own_cpu
            .map_or("–".to_string(), |c| format!("{:.1}%", c * 100.0))
    )));
    match &app.view {
        Some(view) if area.width >= 110 => {
            spans.push(Span::raw(format!(
                "  {} GPU(s), {} process(es)  every {}  {}",
                view.attributed.window.devices.len(),
                view.attributed.workloads.len(),
                crate::values::format_duration(app.interval),
                clock_utc(view.at)
            )));
        }
        Some(_) => {}
        None => spans.push(Span::raw("  waiting for the first sample…")),
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_findings(frame: &mut Frame, area: Rect, app: &App, per_finding: u16, palette: &Palette) {
    let findings: &[Finding] = app.view.as_ref().map_or(&[], |v| &v.findings);
    let block = Block::bordered().title(Span::styled(
        format!(" Findings ({}) ", findings.len()),
        palette.title(),
    ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut lines = Vec::new();
    if findings.is_empty() && app.view.is_some() {
        lines.push(Line::styled("none active", palette.dim()));
    }
    let now = app.view.as_ref().map_or_else(SystemTime::now, |v| v.at);
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.since.cmp(&b.since)));
    for finding in sorted {
        let since = clock_utc(finding.since);
        let age = age(now.duration_since(finding.since).unwrap_or_default());
        let head = vec![
            Span::styled(
                format!("{:<8} ", finding.severity.as_str()),
                palette.severity(finding.severity),
            ),
            Span::styled(format!("{:<16} ", finding.rule.as_str()), palette.title()),
        ];
        if per_finding > 1 {
            // Two lines: since when and what is wrong (the summary names the subject), then
            // what to do.
            let mut first = head;
            first.push(Span::styled(
                format!("since {since} ({age})  "),
                palette.dim(),
            ));
            first.push(Span::raw(finding.summary.clone()));
            lines.push(Line::from(first));
            lines.push(Line::from(vec![
                Span::raw(format!("{:25}", "")),
                Span::styled(format!("→ {}", finding.advice), palette.fg(Color::Cyan)),
            ]));
        } else {
            // One line: the summary names the subject; the age says since when.
            let mut line = head;
            line.push(Span::styled(format!("{age:>6} "), palette.dim()));
            line.push(Span::raw(format!(
                "{} → {}",
                finding.summary, finding.advice
            )));
            lines.push(Line::from(line));
        }
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn draw_footer(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
    let line = match app.mode {
        Mode::Filtering => Line::from(vec![
            Span::styled(" filter: ", palette.title()),
            Span::raw(format!("{}▏", app.filter)),
            Span::styled("  Enter keep  Esc clear", palette.dim()),
        ]),
        Mode::Normal => {
            let mut spans = Vec::new();
            // At 80 columns every key fits only with the sort keys unexplained (the table's
            // title names the sort in use).
            let sort = if area.width >= 92 {
                "sort mem/SM/CPU/PID"
            } else {
                "sort"
            };
            for (key, what) in [
                ("q", "quit"),
                ("m/s/c/p", sort),
                ("/", "filter"),
                ("t", "tree"),
                ("r", "roll-ups"),
                ("↑↓", "select"),
                ("Enter", "detail"),
            ] {
                spans.push(Span::styled(
                    format!(" {key}"),
                    palette.title().add_modifier(Modifier::REVERSED),
                ));
                spans.push(Span::raw(format!(" {what} ")));
            }
            if let Some(log) = &app.last_log {
                spans.push(Span::styled(format!(" │ {log}"), palette.fg(Color::Yellow)));
            }
            Line::from(spans)
        }
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// `[████▌   ]`, or `[  n/a  ]` when unknown.
fn bar(percent: Option<f64>, width: usize, palette: &Palette) -> Vec<Span<'static>> {
    let Some(p) = percent else {
        return vec![Span::raw(format!("[{:^width$}]", "n/a"))];
    };
    let p = p.clamp(0.0, 100.0);
    let filled = ((p / 100.0) * width as f64).round() as usize;
    vec![
        Span::raw("["),
        Span::styled("█".repeat(filled), palette.level(p)),
        Span::raw(" ".repeat(width - filled)),
        Span::raw("]"),
    ]
}

/// The newest `points` values of a 0..100 series as block characters.
fn spark(series: &Series, points: usize) -> String {
    let mut text = String::with_capacity(points * 3);
    for v in series.last(points) {
        let level = (v.min(100) as usize * (SPARK_LEVELS.len() - 1) + 50) / 100;
        text.push(SPARK_LEVELS[level]);
    }
    text
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut t: String = text.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn mib(bytes: u64) -> String {
    format!("{}M", bytes >> 20)
}

fn gib(bytes: u64) -> String {
    format!("{:.1}G", bytes as f64 / f64::from(1u32 << 30))
}

/// `HH:MM:SS UTC`: the view has no time-zone database, and UTC matches the logs.
fn clock_utc(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    }
}
