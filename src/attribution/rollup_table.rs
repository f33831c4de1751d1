//! A roll-up as a table shows it: its columns and the text of each cell, shared by `snapshot`'s
//! roll-up section and the roll-up panel of `gpulse top`, so that both read the same figures the
//! same way (docs/shared-gpus.md). The JSON carries the same under `accounting.rollups`, and
//! the ledger's split of each group's GPU-hours by cause (the [`CAUSE_COLUMNS`]) under
//! `accounting.cause_rollups`.

use std::fmt::Write as _;

use super::accounting::{GroupKind, Rollup};
use super::ledger::{Cause, CauseRollup};

/// A column of the roll-up table: its title, its width in characters, and whether its figures
/// are right-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollupColumn {
    pub title: &'static str,
    pub width: usize,
    pub right: bool,
}

const fn column(title: &'static str, width: usize, right: bool) -> RollupColumn {
    RollupColumn {
        title,
        width,
        right,
    }
}

/// The columns, in order. `ID` and `NAME` are the ones a narrow view shortens or drops.
pub const ROLLUP_COLUMNS: [RollupColumn; 8] = [
    column("KIND", 9, false),
    column("ID", 24, false),
    column("NAME", 20, false),
    column("PROCS", 5, true),
    column("GPU-HOURS", 11, true),
    column("KWH", 11, true),
    column("IDLE", 5, true),
    column("COST", 10, true),
];

/// A column per cause of the ledger, in [`Cause::ALL`]'s order: the cause's share of the
/// group's GPU-hours.
pub const CAUSE_COLUMNS: [RollupColumn; 7] = [
    column("COMPUTE", 7, true),
    column("INPUT", 6, true),
    column("COLL", 5, true),
    column("STRAG", 5, true),
    column("HOST", 5, true),
    column("UNUSED", 6, true),
    column("UNKN", 5, true),
];

/// The text of each of [`CAUSE_COLUMNS`] for a group: each cause's share of its GPU-hours,
/// `-` where the ledger has none for the group.
pub fn cause_cells(causes: Option<&CauseRollup>) -> [String; 7] {
    Cause::ALL.map(|cause| {
        causes
            .filter(|c| c.gpu_hours > 0.0)
            .map_or("-".to_string(), |c| {
                let share = c.cause(cause).map_or(0.0, |c| c.share);
                format!("{:.0}%", share * 100.0)
            })
    })
}

/// Index of `ID` in [`ROLLUP_COLUMNS`].
pub(crate) const ID_COLUMN: usize = 1;
/// Index of `NAME` in [`ROLLUP_COLUMNS`].
pub(crate) const NAME_COLUMN: usize = 2;

pub(crate) fn kind_label(kind: GroupKind) -> &'static str {
    match kind {
        GroupKind::Job => "job",
        GroupKind::Pod => "pod",
        GroupKind::Container => "container",
    }
}

/// `id` shortened for a column of `max` characters: a 64-hex container id to its 12-character
/// short form, as `docker ps` prints it; anything else cut with an ellipsis.
pub(crate) fn short_id(id: &str, max: usize) -> String {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) && max >= 12 {
        return id[..12].to_string();
    }
    if id.chars().count() <= max {
        return id.to_string();
    }
    let cut: String = id.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// The text of each of [`ROLLUP_COLUMNS`] for `rollup`, the ID cut to `id_width` and the name
/// to `name_width` characters. An unknown figure is `-`; a cost only with a price given.
pub fn rollup_cells(rollup: &Rollup, id_width: usize, name_width: usize) -> [String; 8] {
    [
        kind_label(rollup.kind).to_string(),
        short_id(&rollup.id, id_width),
        short_id(rollup.name.as_deref().unwrap_or("-"), name_width),
        rollup.processes.to_string(),
        format!("{:.6}", rollup.gpu_hours),
        format!("{:.6}", rollup.energy_kwh),
        rollup
            .idle_share
            .map_or("-".to_string(), |s| format!("{:.0}%", s * 100.0)),
        rollup.cost.map_or("-".to_string(), |c| format!("{c:.4}")),
    ]
}

/// Appends the section `snapshot` prints; nothing when there is no roll-up (no process has a
/// job, pod or container, or a single sample, which has no duration to account). Each group's
/// GPU-hours by cause follow, from `causes` (the ledger's roll-ups).
pub(crate) fn render_rollups(
    out: &mut String,
    rollups: &[Rollup],
    causes: &[CauseRollup],
    window_seconds: f64,
) {
    if rollups.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Roll-ups over the {window_seconds:.1}s window (GPU-hours count a MIG instance as its slice; cost only with a price):"
    );
    let titles = ROLLUP_COLUMNS.map(|c| c.title.to_string());
    let _ = writeln!(out, "{}", padded_line(&titles));
    for rollup in rollups {
        let cells = rollup_cells(
            rollup,
            ROLLUP_COLUMNS[ID_COLUMN].width,
            ROLLUP_COLUMNS[NAME_COLUMN].width,
        );
        let _ = writeln!(out, "{}", padded_line(&cells));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Where the GPU-hours went (each cause's share of the group's GPU-hours; docs/shared-gpus.md):"
    );
    let mut titles = vec![
        format!("{:<w$}", "KIND", w = ROLLUP_COLUMNS[0].width),
        format!("{:<w$}", "ID", w = ROLLUP_COLUMNS[ID_COLUMN].width),
    ];
    titles.extend(CAUSE_COLUMNS.map(|c| format!("{:>w$}", c.title, w = c.width)));
    let _ = writeln!(out, "{}", titles.join(" "));
    for rollup in rollups {
        let group = causes
            .iter()
            .find(|c| c.kind == rollup.kind && c.id == rollup.id);
        let mut cells = vec![
            format!(
                "{:<w$}",
                kind_label(rollup.kind),
                w = ROLLUP_COLUMNS[0].width
            ),
            format!(
                "{:<w$}",
                short_id(&rollup.id, ROLLUP_COLUMNS[ID_COLUMN].width),
                w = ROLLUP_COLUMNS[ID_COLUMN].width
            ),
        ];
        cells.extend(
            cause_cells(group)
                .iter()
                .zip(CAUSE_COLUMNS)
                .map(|(text, c)| format!("{text:>w$}", w = c.width)),
        );
        let _ = writeln!(out, "{}", cells.join(" "));
    }
}

/// The cells at their columns' widths, one space apart.
fn padded_line(cells: &[String; 8]) -> String {
    let padded: Vec<String> = cells
        .iter()
        .zip(ROLLUP_COLUMNS)
        .map(|(text, c)| {
            if c.right {
                format!("{text:>width$}", width = c.width)
            } else {
                format!("{text:<width$}", width = c.width)
            }
        })
        .collect();
    padded.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_shortened_as_docker_prints_them_and_long_ids_are_cut() {
        let container = "d0c4e2f1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2";
        assert_eq!(short_id(container, 24), "d0c4e2f1a9b8");
        assert_eq!(short_id(container, 8), "d0c4e2f…");
        assert_eq!(short_id("7001", 24), "7001");
        assert_eq!(short_id("abcdefghij", 5), "abcd…");
    }
}
