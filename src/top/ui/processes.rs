//! The process table of the live view: its columns, which of them fit the width at hand (the
//! least needed go first), and the text of each cell.

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, Cell, Paragraph, Row as TableRow, Table, TableState};
use ratatui::Frame;

use super::{mib, Palette};
use crate::top::app::{App, Row, RowKind};

/// A column of the process table: header, width, and from which table width it is shown.
pub(super) struct Column {
    title: &'static str,
    width: u16,
    /// Lower is more needed.
    priority: u8,
}

pub(super) const COLUMNS: [Column; 14] = [
    Column {
        title: "GPU",
        width: 3,
        priority: 0,
    },
    // Drawn only while some process runs on a MIG instance.
    Column {
        title: "MIG",
        width: 12,
        priority: 1,
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
    // `job/rank` of a distributed rank, marked ` SLOW` (rank_straggler names it), ` HUNG` (its
    // job is stuck on it: distributed_hang) or ` WAIT` (its job is stuck and it waits).
    Column {
        title: "JOB/RANK",
        width: 14,
        priority: 7,
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

/// Which columns fit in `width` (the command takes what is left); the MIG column only when
/// `mig` (some process runs on a MIG instance).
pub(super) fn visible_columns(width: u16, mig: bool) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut priorities: Vec<u8> = COLUMNS.iter().map(|c| c.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    for priority in priorities {
        let candidate: Vec<usize> = (0..COLUMNS.len())
            .filter(|&i| COLUMNS[i].priority <= priority)
            .filter(|&i| mig || COLUMNS[i].title != "MIG")
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

pub(super) fn draw_processes(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
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
    let columns = visible_columns(inner_width, app.rows.iter().any(|r| r.mig.is_some()));
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

pub(super) fn cell_text(row: &Row, column: usize) -> String {
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
        "MIG" => row.mig.clone().unwrap_or_else(dash),
        "PID" => row.pid.to_string(),
        "VPID" => row.vpid.map_or_else(dash, |v| v.to_string()),
        "USER" => row.user.clone().unwrap_or_else(dash),
        "CONTAINER" => row.container.clone().unwrap_or_else(dash),
        "POD/NAMESPACE" => row.pod.clone().unwrap_or_else(dash),
        "SERVICE" => row.service.clone().unwrap_or_default(),
        "JOB/RANK" => match (&row.rank, row.mark) {
            (Some(rank), Some(mark)) => format!("{rank} {}", mark.label()),
            (Some(rank), None) => rank.clone(),
            (None, Some(mark)) => mark.label().into(),
            (None, None) => String::new(),
        },
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
