//! The GPU lines of the live view: one line per GPU and per MIG instance, and from 40
//! rows a second line with clocks, throttle reasons and sparklines of utilisation and memory.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::{bar, gib, spark, truncate, Palette};
use crate::sampling::{DeviceWindow, MigInstanceWindow};
use crate::schema;
use crate::schema::{DeviceField, GpmField};
use crate::top::app::App;

pub(super) fn draw_gpus(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    lines_per_gpu: u16,
    palette: &Palette,
) {
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
pub(super) fn gpu_line<'a>(device: &DeviceWindow, width: u16, palette: &Palette) -> Line<'a> {
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
pub(super) fn mig_line<'a>(m: &MigInstanceWindow, width: u16, palette: &Palette) -> Line<'a> {
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
pub(super) fn gpu_second_line<'a>(
    device: &DeviceWindow,
    history: Option<&crate::top::app::DeviceHistory>,
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
pub(super) fn throttle_reasons(device: &DeviceWindow) -> Vec<&'static str> {
    let Some(ratios) = &device.throttle_active_ratio else {
        return Vec::new();
    };
    schema::throttle_reasons()
        .iter()
        .filter(|(bit, _)| ratios.get(bit).is_some_and(|r| *r > 0.0))
        .map(|(_, name)| *name)
        .collect()
}
