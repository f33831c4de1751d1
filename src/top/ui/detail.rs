//! The detail pane drawn over the view for the selected row: a GPU's every field, or a process's
//! identity, usage and history, and the findings that concern it.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Color;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Sparkline, Wrap};
use ratatui::Frame;

use super::{mib, Palette};
use crate::attribution::AttributedProcess;
use crate::schema::attributes::AttributeId as A;
use crate::top::app::{App, ProcessHistory};

/// The selected process: its workload attributes, usage, devices, findings and history.
pub(super) fn draw_detail(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
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

    let lines = detail_text(app, pid, palette);
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
        draw_history(frame, history, [sm_area, mem_area], palette);
    }
}

/// The pane's text: the process (`process_lines`), its children, the findings that concern it.
fn detail_text(app: &App, pid: u32, palette: &Palette) -> Vec<Line<'static>> {
    let title = palette.title();
    let field = |name: &str, value: String| {
        Line::from(vec![
            Span::styled(format!("{name:<20}"), title),
            Span::raw(value),
        ])
    };
    let mut lines = match app.view.as_ref().and_then(|v| v.attributed.process(pid)) {
        Some(process) => process_lines(app, pid, process, &field),
        None => vec![field("process", "not listed by NVML (a descendant)".into())],
    };
    let children = app.process_trees.children(pid);
    if !children.is_empty() {
        let names: Vec<String> = children
            .iter()
            .filter_map(|c| app.process_trees.member(*c))
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
    lines
}

/// A process NVML lists: its workload's identity, its CPU and memory, each of its GPUs.
fn process_lines(
    app: &App,
    pid: u32,
    p: AttributedProcess,
    field: &dyn Fn(&str, String) -> Line<'static>,
) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let attributed = app.view.as_ref().map(|v| &v.attributed);
    let opt = |v: Option<&String>| v.cloned().unwrap_or_else(|| "-".into());
    let w = p.workload;
    lines.push(field(A::ServiceName.key(), w.effective_service_name()));
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
        A::ContainerId.key(),
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
    if let Some(view) = app.view.as_deref() {
        lines.extend(super::ranks::detail_lines(view, pid, &field));
    }
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
    lines
}

/// The selected process's SM and memory history as two sparklines.
fn draw_history(
    frame: &mut Frame,
    history: &ProcessHistory,
    [sm_area, mem_area]: [Rect; 2],
    palette: &Palette,
) {
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
