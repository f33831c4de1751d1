//! The roll-ups panel (`r`): each job, pod and container the GPU processes belong to, with its
//! GPU-hours, energy, idle share and cost since the view started, as the accountant sums them
//! and `snapshot --window` prints them (the cells come from
//! [`crate::attribution::rollup_table`]), then, where the terminal is wide enough, a column per
//! cause of the ledger (each cause's share of the group's GPU-hours). A narrow terminal drops
//! the causes, then the name, and shortens the id.

use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Cell, Paragraph, Row as TableRow, Table};
use ratatui::Frame;

use super::Palette;
use crate::attribution::ledger::CauseRollup;
use crate::attribution::rollup_table::{
    cause_cells, rollup_cells, CAUSE_COLUMNS, ID_COLUMN, NAME_COLUMN, ROLLUP_COLUMNS,
};
use crate::attribution::Rollup;
use crate::top::app::App;

/// The narrowest the id column gets before the table gives up on its width.
const MIN_ID_WIDTH: usize = 8;

/// The rows the panel wants: its roll-ups (at least one line for "none yet"), a header, borders.
pub(super) fn wanted_height(app: &App) -> u16 {
    rollups(app).len().max(1) as u16 + 3
}

fn rollups(app: &App) -> &[Rollup] {
    app.view
        .as_ref()
        .map_or(&[], |v| &v.attributed.accounts.rollups)
}

fn cause_rollups(app: &App) -> &[CauseRollup] {
    app.view
        .as_ref()
        .map_or(&[], |v| &v.attributed.ledger.rollups)
}

/// The width the cause columns take, with the space before each.
fn causes_width() -> usize {
    CAUSE_COLUMNS.iter().map(|c| c.width + 1).sum()
}

/// Whether the cause columns fit beside every roll-up column at `inner_width`.
fn shows_causes(inner_width: usize) -> bool {
    let all: usize =
        ROLLUP_COLUMNS.iter().map(|c| c.width).sum::<usize>() + ROLLUP_COLUMNS.len() - 1;
    inner_width >= all + causes_width()
}

/// Which columns are shown and the widths of the id and name at `inner_width`.
fn layout(inner_width: usize) -> (Vec<usize>, usize, usize) {
    let spacing = ROLLUP_COLUMNS.len() - 1;
    let all: usize = ROLLUP_COLUMNS.iter().map(|c| c.width).sum::<usize>() + spacing;
    if inner_width >= all {
        let name = ROLLUP_COLUMNS[NAME_COLUMN].width;
        return (
            (0..ROLLUP_COLUMNS.len()).collect(),
            ROLLUP_COLUMNS[ID_COLUMN].width,
            name,
        );
    }
    let columns: Vec<usize> = (0..ROLLUP_COLUMNS.len())
        .filter(|&i| i != NAME_COLUMN)
        .collect();
    let others: usize = columns
        .iter()
        .filter(|&&i| i != ID_COLUMN)
        .map(|&i| ROLLUP_COLUMNS[i].width)
        .sum::<usize>()
        + columns.len()
        - 1;
    let id = inner_width
        .saturating_sub(others)
        .clamp(MIN_ID_WIDTH, ROLLUP_COLUMNS[ID_COLUMN].width);
    (columns, id, 0)
}

pub(super) fn draw_rollups(frame: &mut Frame, area: Rect, app: &App, palette: &Palette) {
    let rollups = rollups(app);
    let priced = rollups.iter().any(|r| r.cost.is_some());
    let mut title = format!(" Roll-ups ({}) since the view started ", rollups.len());
    if !priced {
        title.push_str("· no price: --cost-per-gpu-hour, --cost-per-kwh ");
    }
    let block = Block::bordered().title(Span::styled(title, palette.title()));
    if rollups.is_empty() {
        let inner = block.inner(area);
        frame.render_widget(block, area);
        if app.view.is_some() {
            let text =
                "none yet: processes are grouped by job (SLURM_JOB_ID, TORCHELASTIC_RUN_ID, \
                        the companion), pod and container";
            frame.render_widget(Paragraph::new(Span::styled(text, palette.dim())), inner);
        }
        return;
    }
    let inner_width = usize::from(area.width.saturating_sub(2));
    let (columns, id_width, name_width) = layout(inner_width);
    let with_causes = shows_causes(inner_width);
    let causes = cause_rollups(app);
    let width_of = |i: usize| match i {
        ID_COLUMN => id_width,
        NAME_COLUMN => name_width,
        _ => ROLLUP_COLUMNS[i].width,
    };
    let cell = |text: String, i: usize| {
        let alignment = if ROLLUP_COLUMNS[i].right {
            Alignment::Right
        } else {
            Alignment::Left
        };
        Cell::from(Text::from(Line::from(text)).alignment(alignment))
    };
    let right = |text: String| Cell::from(Text::from(Line::from(text)).alignment(Alignment::Right));
    let cause_titles: &[_] = if with_causes { &CAUSE_COLUMNS } else { &[] };
    let header = TableRow::new(
        columns
            .iter()
            .map(|&i| cell(ROLLUP_COLUMNS[i].title.to_string(), i))
            .chain(cause_titles.iter().map(|c| right(c.title.to_string()))),
    )
    .style(palette.title().add_modifier(Modifier::UNDERLINED));
    let rows: Vec<TableRow> = rollups
        .iter()
        .map(|r| {
            let mut cells = rollup_cells(r, id_width, name_width.max(1)).map(Some);
            let group = causes.iter().find(|c| c.kind == r.kind && c.id == r.id);
            let by_cause = with_causes
                .then(|| cause_cells(group))
                .into_iter()
                .flatten();
            TableRow::new(
                columns
                    .iter()
                    .map(|&i| cell(cells[i].take().unwrap_or_default(), i))
                    .chain(by_cause.map(right)),
            )
        })
        .collect();
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|&i| Constraint::Length(width_of(i) as u16))
        .chain(
            cause_titles
                .iter()
                .map(|c| Constraint::Length(c.width as u16)),
        )
        .collect();
    frame.render_widget(Table::new(rows, widths).header(header).block(block), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_narrow_panel_drops_the_name_and_shortens_the_id() {
        let (all, id, name) = layout(200);
        assert_eq!(all.len(), 8);
        assert_eq!((id, name), (24, 20));
        // 78 columns inside an 80-column border: no name, the id gets what is left.
        let (narrow, id, _) = layout(78);
        assert!(!narrow.contains(&NAME_COLUMN), "{narrow:?}");
        let used: usize = narrow
            .iter()
            .map(|&i| {
                if i == ID_COLUMN {
                    id
                } else {
                    ROLLUP_COLUMNS[i].width
                }
            })
            .sum::<usize>()
            + narrow.len()
            - 1;
        assert!(used <= 78 && id >= 12, "{used} {id}");
    }
}
