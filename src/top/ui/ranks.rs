//! The detail pane's lines about a process's place in a distributed training job: its job and
//! rank, its step figures (from its own step spans, when a receiver heard them) and whether
//! `rank_straggler` or `distributed_hang` names it. The step figures and the straggler need `top`'s receiver
//! (`--otlp-receiver-*`); the job and rank from the environment show without it.

use ratatui::text::Line;

use crate::pipeline::View;
use crate::top::app::{rank_label, rank_mark, RankMark};

pub(super) fn detail_lines<'a>(
    view: &View,
    pid: u32,
    field: &dyn Fn(&str, String) -> Line<'a>,
) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    let Some(rank) = rank_label(view, pid) else {
        return lines;
    };
    let mark = match rank_mark(view, pid) {
        Some(RankMark::Slow) => "  ← the straggler of its job (rank_straggler below)",
        Some(RankMark::Hung) => "  ← HUNG: its job is stuck on this rank (distributed_hang below)",
        Some(RankMark::Waiting) => "  ← its job is HUNG; this rank waits in a collective",
        None => "",
    };
    lines.push(field("job / rank", format!("{rank}{mark}")));
    if let Some(t) = view.training.process(pid) {
        let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
        let wait = match (t.collective_wait_seconds, t.collective_wait_ratio()) {
            (Some(w), Some(r)) => format!("{} ({:.0}% of the step)", ms(w), r * 100.0),
            _ => "-".into(),
        };
        lines.push(field(
            "step / in collectives",
            format!(
                "{} / {wait}, data wait {}, over {} steps",
                ms(t.step_seconds),
                ms(t.data_wait_seconds),
                t.steps
            ),
        ));
    }
    lines
}
