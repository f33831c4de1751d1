//! Draws an [`App`] on a ratatui frame: header, one line or two per GPU, the process table,
//! the findings panel and the footer of keys; the detail pane over them when open. Pure: it reads
//! the state and writes the frame, so layouts are tested on ratatui's `TestBackend`.
//!
//! The layout gives each part what it needs at the size it has: at 80×24 a GPU takes one line and
//! the table drops its least needed columns (pod, user, RSS); from 40 rows a GPU takes two lines
//! (clocks, throttle reasons and sparklines of utilisation and memory). Colours only mark levels
//! (green, yellow, red) and severities; with `NO_COLOR` the same screen is drawn without them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, TableState, Wrap,
};
use ratatui::Frame;

use super::app::{App, Row, RowKind, Series};
use super::input::Mode;
use crate::diagnosis::{Finding, Severity};
use crate::export::metrics::catalogue;
use crate::sampling::{DeviceField, DeviceWindow, GpmField, MigInstanceWindow};

/// From this height on, each GPU gets a second line (clocks, throttling, history).
const TALL: u16 = 40;
const SPARK_LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, app: &App) {
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
    let [header, gpus, processes, findings, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpu_height),
        Constraint::Min(4),
        Constraint::Length(findings_height),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_header(frame, header, app, &palette);
    draw_gpus(frame, gpus, app, lines_per_gpu, &palette);
    draw_processes(frame, processes, app, &palette);
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

fn draw_gpus(frame: &mut Frame, area: Rect, app: &App, lines_per_gpu: u16, palette: &Palette) {
    let block = Block::bordered().title(Span::styled(" GPUs ", palette.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(view) = &app.view else {
        return;
    };
    let devices = &view.attributed.window.devices;
    let height = inner.height as usize;
    let mut lines = Vec::new();
    let mut shown = 0;
    for (i, device) in devices.iter().enumerate() {
        let needed = lines_per_gpu.max(1) as usize + device.mig_instances.len();
        // Keep a line for the "more" note unless this is the last GPU.
        let note = usize::from(i + 1 < devices.len());
        if lines.len() + needed + note > height {
            break;
        }
        let history = app.devices.get(&device.info.uuid);
        lines.push(gpu_line(device, inner.width, palette));
        if lines_per_gpu > 1 {
            lines.push(gpu_second_line(device, history, inner.width, palette));
        }
        for m in &device.mig_instances {
            lines.push(mig_line(m, inner.width, palette));
        }
        shown += 1;
    }
    if shown < devices.len() {
        lines.push(Line::styled(
            format!(
                "… {} more GPU(s): enlarge the terminal to see them",
                devices.len() - shown
            ),
            palette.dim(),
        ));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `0 NVIDIA H100  UTIL [████    ] 75%  MEM [██      ] 20.1/79.6G  62°C  450/700W`
fn gpu_line<'a>(device: &DeviceWindow, width: u16, palette: &Palette) -> Line<'a> {
    let name_width = if width >= 110 { 28 } else { 14 };
    let bar_width = if width >= 120 {
        20
    } else if width >= 96 {
        10
    } else {
        6
    };
    let mut spans = vec![Span::styled(
        format!(
            "{:>2} {:<name_width$} ",
            device.info.index,
            truncate(&device.info.name, name_width)
        ),
        palette.title(),
    )];
    let util = device
        .gauge(DeviceField::UtilizationGpu)
        .as_ref()
        .map(|g| g.last * 100.0);
    spans.push(Span::raw("UTIL "));
    spans.extend(bar(util, bar_width, palette));
    spans.push(Span::raw(match util {
        Some(u) => format!(" {u:>3.0}% "),
        None => "  n/a ".into(),
    }));
    // SM and tensor activity (GPM, Hopper and newer) tell busy from efficient: GPU-Util counts
    // any kernel running, these count the SMs and tensor pipes actually working.
    if let Some(sm) = device.gpm.gauge(GpmField::SmActivity) {
        spans.push(Span::raw(format!(" SM {:>3.0}%", sm.last * 100.0)));
        if let Some(tensor) = device.gpm.gauge(GpmField::TensorActivity) {
            spans.push(Span::raw(format!(" TC {:>3.0}%", tensor.last * 100.0)));
        }
    }
    let mem = match (
        device.last_u64(DeviceField::MemoryUsed),
        device.last_u64(DeviceField::MemoryTotal),
    ) {
        (Some(used), Some(total)) if total > 0 => Some((used, total)),
        _ => None,
    };
    spans.push(Span::raw(" MEM "));
    spans.extend(bar(
        mem.map(|(u, t)| u as f64 / t as f64 * 100.0),
        bar_width,
        palette,
    ));
    spans.push(Span::raw(match mem {
        Some((used, total)) => format!(" {}/{} ", gib(used), gib(total)),
        None => " n/a ".into(),
    }));
    if let Some(t) = &device.gauge(DeviceField::Temperature) {
        spans.push(Span::raw(format!(" {:.0}°C", t.last)));
    }
    match (
        &device.gauge(DeviceField::Power),
        device.last(DeviceField::PowerLimit),
    ) {
        (Some(p), Some(limit)) => spans.push(Span::raw(format!(" {:.0}/{:.0}W", p.last, limit))),
        (Some(p), None) => spans.push(Span::raw(format!(" {:.0}W", p.last))),
        _ => {}
    }
    Line::from(spans)
}

/// `   └ MIG 3g.40gb GI 1 CI 0  SM  85% TC  40%  MEM [██  ] 30.0/39.3G`: a MIG device under its
/// GPU, with what NVML gives it of its own (GPM of its GPU instance, its memory slice).
fn mig_line<'a>(m: &MigInstanceWindow, width: u16, palette: &Palette) -> Line<'a> {
    let bar_width = if width >= 120 { 20 } else { 6 };
    // NVML names a MIG device "<GPU name> MIG <profile>".
    let profile = m
        .info
        .name
        .rsplit_once("MIG ")
        .map_or(m.info.name.as_str(), |(_, p)| p);
    let mut spans = vec![Span::styled(
        format!(
            "   └ MIG {:<9} GI {} CI {} ",
            truncate(profile, 9),
            m.info.gpu_instance_id,
            m.info.compute_instance_id
        ),
        palette.dim(),
    )];
    let pct = |g: Option<crate::sampling::Gauge>| {
        g.map_or("n/a".to_string(), |g| format!("{:>3.0}%", g.last * 100.0))
    };
    spans.push(Span::raw(format!(
        " SM {} TC {}",
        pct(m.gpm.gauge(GpmField::SmActivity)),
        pct(m.gpm.gauge(GpmField::TensorActivity))
    )));
    let mem = match (m.memory_used_bytes, m.memory_total_bytes) {
        (Some(used), Some(total)) if total > 0 => Some((used, total)),
        _ => None,
    };
    spans.push(Span::raw("  MEM "));
    spans.extend(bar(
        mem.map(|(u, t)| u as f64 / t as f64 * 100.0),
        bar_width,
        palette,
    ));
    spans.push(Span::raw(match mem {
        Some((used, total)) => format!(" {}/{}", gib(used), gib(total)),
        None => " n/a".into(),
    }));
    Line::from(spans)
}

/// Clocks, throttle reasons and the history sparklines.
fn gpu_second_line<'a>(
    device: &DeviceWindow,
    history: Option<&super::app::DeviceHistory>,
    width: u16,
    palette: &Palette,
) -> Line<'a> {
    let mut spans = vec![Span::raw("   ")];
    let clock = |g: &Option<crate::sampling::Gauge>| {
        g.as_ref()
            .map_or("n/a".to_string(), |g| format!("{:.0}", g.last))
    };
    spans.push(Span::raw(format!(
        "clocks SM {} mem {} MHz  ",
        clock(&device.gauge(DeviceField::SmClock)),
        clock(&device.gauge(DeviceField::MemoryClock))
    )));
    let reasons = throttle_reasons(device);
    spans.push(Span::raw("throttle "));
    spans.push(Span::styled(
        if reasons.is_empty() {
            "none".to_string()
        } else {
            reasons.join(",")
        },
        if reasons.iter().any(|r| *r != "gpu_idle") {
            palette.fg(Color::Yellow)
        } else {
            Style::new()
        },
    ));
    if let Some(history) = history {
        let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
        let room = (width as usize).saturating_sub(used + 16) / 2;
        let points = room.min(60);
        if points >= 4 {
            spans.push(Span::raw("  util "));
            spans.push(Span::styled(
                spark(&history.utilization, points),
                palette.fg(Color::Green),
            ));
            spans.push(Span::raw(" mem "));
            spans.push(Span::styled(
                spark(&history.memory, points),
                palette.fg(Color::Magenta),
            ));
        }
    }
    Line::from(spans)
}

/// The reasons active at any time during the last window, by NVML name.
fn throttle_reasons(device: &DeviceWindow) -> Vec<&'static str> {
    let Some(ratios) = &device.throttle_active_ratio else {
        return Vec::new();
    };
    catalogue::throttle_reasons()
        .iter()
        .filter(|(bit, _)| ratios.get(bit).is_some_and(|r| *r > 0.0))
        .map(|(_, name)| *name)
        .collect()
}

/// A column of the process table: header, width, and from which table width it is shown.
struct Column {
    title: &'static str,
    width: u16,
    /// Lower is more needed.
    priority: u8,
}

const COLUMNS: [Column; 12] = [
    Column {
        title: "GPU",
        width: 3,
        priority: 0,
    },
    Column {
        title: "PID",
        width: 7,
        priority: 0,
    },
    Column {
        title: "VPID",
        width: 7,
        priority: 3,
    },
    Column {
        title: "USER",
        width: 8,
        priority: 5,
    },
    Column {
        title: "CONTAINER",
        width: 12,
        priority: 1,
    },
    Column {
        title: "POD/NAMESPACE",
        width: 22,
        priority: 6,
    },
    Column {
        title: "SERVICE",
        width: 16,
        priority: 2,
    },
    Column {
        title: "GPU MEM",
        width: 8,
        priority: 0,
    },
    Column {
        title: "SM%",
        width: 4,
        priority: 0,
    },
    Column {
        title: "CPU%",
        width: 5,
        priority: 1,
    },
    Column {
        title: "RSS",
        width: 7,
        priority: 4,
    },
    Column {
        title: "COMMAND",
        width: 10,
        priority: 0,
    },
];

/// Which columns fit in `width` (the command takes what is left).
fn visible_columns(width: u16) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut priorities: Vec<u8> = COLUMNS.iter().map(|c| c.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    for priority in priorities {
        let candidate: Vec<usize> = (0..COLUMNS.len())
            .filter(|&i| COLUMNS[i].priority <= priority)
            .collect();
        let needed: u16 = candidate.iter().map(|&i| COLUMNS[i].width + 1).sum();
        if needed <= width {
            chosen = candidate;
        } else {
            break;
        }
    }
    chosen
}

fn draw_processes(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
    let mut title = format!(
        " Processes ({}) sort: {} ",
        app.rows.len(),
        app.sort.label()
    );
    if app.tree {
        title.push_str("· tree ");
    }
    if !app.filter.is_empty() {
        title.push_str(&format!("· filter: {} ", app.filter));
    }
    let block = Block::bordered().title(Span::styled(title, palette.title()));
    let inner_width = area.width.saturating_sub(2);
    let columns = visible_columns(inner_width);
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|&i| {
            if COLUMNS[i].title == "COMMAND" {
                Constraint::Min(COLUMNS[i].width)
            } else {
                Constraint::Length(COLUMNS[i].width)
            }
        })
        .collect();
    let header = TableRow::new(columns.iter().map(|&i| Cell::from(COLUMNS[i].title)))
        .style(palette.title().add_modifier(Modifier::UNDERLINED));
    let rows: Vec<TableRow> = app
        .rows
        .iter()
        .map(|row| {
            let cells = columns.iter().map(|&i| Cell::from(cell_text(row, i)));
            let style = match row.kind {
                RowKind::Descendant => palette.dim(),
                RowKind::Gpu { .. } => Style::new(),
            };
            TableRow::new(cells).style(style)
        })
        .collect();
    let empty = rows.is_empty();
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected(app.selected_index());
    frame.render_stateful_widget(table, area, &mut state);
    if empty && app.view.is_some() {
        let message = if app.filter.is_empty() {
            "no GPU processes"
        } else {
            "no process matches the filter (Esc after / clears it)"
        };
        let inner = Block::bordered().inner(area);
        if inner.height > 1 {
            let line = Rect {
                y: inner.y + 1,
                height: 1,
                ..inner
            };
            frame.render_widget(Paragraph::new(Span::styled(message, palette.dim())), line);
        }
    }
}

fn cell_text(row: &Row, column: usize) -> String {
    // A descendant has no identity of its own here: blank, not "-" (unknown).
    let dash = || {
        if row.kind == RowKind::Descendant {
            String::new()
        } else {
            "-".to_string()
        }
    };
    match COLUMNS[column].title {
        "GPU" => match row.kind {
            RowKind::Gpu { device_index } => device_index.to_string(),
            RowKind::Descendant => String::new(),
        },
        "PID" => row.pid.to_string(),
        "VPID" => row.vpid.map_or_else(dash, |v| v.to_string()),
        "USER" => row.user.clone().unwrap_or_else(dash),
        "CONTAINER" => row.container.clone().unwrap_or_else(dash),
        "POD/NAMESPACE" => row.pod.clone().unwrap_or_else(dash),
        "SERVICE" => row.service.clone().unwrap_or_default(),
        "GPU MEM" => row.gpu_memory_bytes.map_or_else(dash, mib),
        "SM%" => row.sm.map_or_else(dash, |s| format!("{s:.0}")),
        "CPU%" => row.cpu.map_or_else(dash, |c| format!("{c:.0}")),
        "RSS" => row.rss_bytes.map_or_else(dash, mib),
        "COMMAND" => {
            let indent = if row.depth == 0 {
                String::new()
            } else {
                format!("{}└ ", "  ".repeat(row.depth - 1))
            };
            format!("{indent}{}", row.command)
        }
        _ => String::new(),
    }
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
            for (key, what) in [
                ("q", "quit"),
                ("m/s/c/p", "sort mem/SM/CPU/PID"),
                ("/", "filter"),
                ("t", "tree"),
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

/// The selected process: its workload attributes, usage, devices, findings and history.
fn draw_detail(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
    let Some((pid, _)) = app.selected else {
        return;
    };
    let [_, middle, _] = Layout::vertical([
        Constraint::Percentage(10),
        Constraint::Percentage(80),
        Constraint::Percentage(10),
    ])
    .flex(Flex::Center)
    .areas(area);
    let [_, popup, _] = Layout::horizontal([
        Constraint::Percentage(5),
        Constraint::Percentage(90),
        Constraint::Percentage(5),
    ])
    .areas(middle);
    frame.render_widget(Clear, popup);
    let block = Block::bordered().title(Span::styled(
        format!(" pid {pid} (Enter or Esc closes) "),
        palette.title(),
    ));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);

    let mut lines = Vec::new();
    let attributed = app.view.as_ref().map(|v| &v.attributed);
    let process = attributed.and_then(|a| a.process(pid));
    let field = |name: &str, value: String| {
        Line::from(vec![
            Span::styled(format!("{name:<20}"), palette.title()),
            Span::raw(value),
        ])
    };
    let opt = |v: Option<&String>| v.cloned().unwrap_or_else(|| "-".into());
    match process {
        Some(p) => {
            let w = p.workload;
            lines.push(field("service.name", w.effective_service_name()));
            lines.push(field(
                "process.pid / vpid",
                format!(
                    "{} / {}",
                    w.pid,
                    w.vpid.map_or("-".into(), |v| v.to_string())
                ),
            ));
            lines.push(field("executable", opt(w.executable_name.as_ref())));
            lines.push(field("command line", opt(w.command_line.as_ref())));
            lines.push(field("owner", opt(w.owner.as_ref())));
            lines.push(field(
                "container.id",
                format!(
                    "{} {}",
                    opt(w.container_id.as_ref()),
                    w.container_runtime.as_deref().unwrap_or("")
                ),
            ));
            lines.push(field(
                "k8s pod",
                format!(
                    "{} {}/{} container {}",
                    opt(w.pod_uid.as_ref()),
                    opt(w.namespace_name.as_ref()),
                    opt(w.pod_name.as_ref()),
                    opt(w.container_name.as_ref())
                ),
            ));
            if !w.resource_attributes.is_empty() {
                let attrs: Vec<String> = w
                    .resource_attributes
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                lines.push(field("resource attributes", attrs.join(", ")));
            }
            lines.push(field("attributed by", format!("{:?}", w.attributed_by)));
            if let Some(u) = p.usage {
                let pct = |c: Option<f64>| c.map_or("-".into(), |c| format!("{:.0}%", c * 100.0));
                lines.push(field(
                    "CPU own / with tree",
                    format!(
                        "{} / {}",
                        pct(u.cpu_utilization),
                        pct(u.tree_cpu_utilization)
                    ),
                ));
                lines.push(field("RSS", u.memory_rss_bytes.map_or("-".into(), mib)));
            }
            lines.push(field(
                "parent alive",
                p.parent_alive.map_or("unknown".into(), |a| a.to_string()),
            ));
            for d in attributed.into_iter().flat_map(|a| a.devices_of(pid)) {
                lines.push(field(
                    &format!("GPU {}", d.device_index),
                    format!(
                        "memory {}  SM {}",
                        d.gpu_memory_bytes
                            .as_ref()
                            .map_or("-".into(), |g| mib(g.last as u64)),
                        d.sm_utilization
                            .as_ref()
                            .map_or("-".into(), |g| format!("{:.0}%", g.last * 100.0)),
                    ),
                ));
            }
        }
        None => lines.push(field("process", "not listed by NVML (a descendant)".into())),
    }
    let children = app.family.children(pid);
    if !children.is_empty() {
        let names: Vec<String> = children
            .iter()
            .filter_map(|c| app.family.member(*c))
            .map(|m| format!("{} {}", m.pid, m.comm))
            .collect();
        lines.push(field("children", names.join(", ")));
    }
    let findings = app.findings_of(pid);
    if findings.is_empty() {
        lines.push(field("findings", "none".into()));
    }
    for f in findings {
        lines.push(Line::from(vec![
            Span::styled(
                format!("{:<20}", f.rule.as_str()),
                palette.severity(f.severity),
            ),
            Span::raw(format!("{} → {}", f.summary, f.advice)),
        ]));
    }

    let history = app.processes.get(&pid);
    let spark_height = if history.is_some() && inner.height >= 14 {
        3
    } else {
        0
    };
    let [text, sm_area, mem_area] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(spark_height),
        Constraint::Length(spark_height),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), text);
    if let Some(history) = history.filter(|_| spark_height > 0) {
        let width = sm_area.width.saturating_sub(2) as usize;
        let sm = history.sm.last(width);
        let mem = history.memory_mib.last(width);
        frame.render_widget(
            Sparkline::default()
                .block(Block::new().borders(Borders::TOP).title("SM % (history)"))
                .data(&sm)
                .max(100)
                .style(palette.fg(Color::Green)),
            sm_area,
        );
        frame.render_widget(
            Sparkline::default()
                .block(Block::new().borders(Borders::TOP).title(format!(
                    "GPU memory MiB (history, now {})",
                    mem.last().copied().unwrap_or(0)
                )))
                .data(&mem)
                .style(palette.fg(Color::Magenta)),
            mem_area,
        );
    }
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
