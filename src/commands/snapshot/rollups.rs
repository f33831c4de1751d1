//! The roll-ups section of the snapshot table: each job, pod and container the window's processes
//! belong to, with its GPU-hours, energy, idle share and cost (docs/shared-gpus.md). The JSON
//! carries the same under `accounting.rollups`.

use std::fmt::Write as _;

use crate::attribution::accounting::GroupKind;
use crate::attribution::Rollup;

fn kind(kind: GroupKind) -> &'static str {
    match kind {
        GroupKind::Job => "job",
        GroupKind::Pod => "pod",
        GroupKind::Container => "container",
    }
}

/// `id` shortened for a column: a 64-hex container id to its 12-character short form, as
/// `docker ps` prints it; anything else cut with an ellipsis.
fn short_id(id: &str, max: usize) -> String {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return id[..12].to_string();
    }
    if id.chars().count() <= max {
        return id.to_string();
    }
    let cut: String = id.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// Appends the section; nothing when there is no roll-up (no process has a job, pod or
/// container, or a single sample, which has no duration to account).
pub fn render_rollups(out: &mut String, rollups: &[Rollup], window_seconds: f64) {
    if rollups.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Roll-ups over the {window_seconds:.1}s window (GPU-hours count a MIG instance as its slice; cost only with a price):"
    );
    let _ = writeln!(
        out,
        "{:<9} {:<24} {:<20} {:>5} {:>11} {:>11} {:>5} {:>10}",
        "KIND", "ID", "NAME", "PROCS", "GPU-HOURS", "KWH", "IDLE", "COST"
    );
    for r in rollups {
        let idle = r
            .idle_share
            .map_or("-".to_string(), |s| format!("{:.0}%", s * 100.0));
        let cost = r.cost.map_or("-".to_string(), |c| format!("{c:.4}"));
        let _ = writeln!(
            out,
            "{:<9} {:<24} {:<20} {:>5} {:>11.6} {:>11.6} {:>5} {:>10}",
            kind(r.kind),
            short_id(&r.id, 24),
            short_id(r.name.as_deref().unwrap_or("-"), 20),
            r.processes,
            r.gpu_hours,
            r.energy_kwh,
            idle,
            cost
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_shortened_as_docker_prints_them_and_long_ids_are_cut() {
        let container = "d0c4e2f1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2";
        assert_eq!(short_id(container, 24), "d0c4e2f1a9b8");
        assert_eq!(short_id("7001", 24), "7001");
        assert_eq!(short_id("abcdefghij", 5), "abcd…");
    }
}
