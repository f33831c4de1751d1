//! The job report's HTML: one self-contained page (the single-node report's styles, inline SVG,
//! no script) with the job's answers first (straggler, what-if, hang), then every rank on its
//! own lane, node by node (steps, the DataLoader wait at their start and the collective wait at
//! their end), the ranks' table, the ledger by cause and by node, every node's findings, and
//! what could not be read.

use std::fmt::Write as _;

use super::JobReport;
use crate::record::html::{escape, STYLE};
use crate::record::summary::{duration, gpu_hours};

const LANE_HEIGHT: f64 = 22.0;
const LABEL_WIDTH: f64 = 170.0;
const PLOT_WIDTH: f64 = 800.0;
/// Steps drawn per lane at most: a long job's lanes show every n-th step.
const MAX_STEPS_DRAWN: usize = 2000;

const STEP_COLOUR: &str = "#4c9be8";
const DATA_WAIT_COLOUR: &str = "#ff9f00";
const COLLECTIVE_COLOUR: &str = "#b0b0b0";

/// The whole page.
pub(crate) fn render(report: &JobReport) -> String {
    let mut page = String::with_capacity(128 * 1024);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>gpulse job report: {}</title><style>{STYLE}</style></head><body>\n\
         <div class=\"gpulse-report\">\n",
        escape(&report.job_id)
    );
    let span = report
        .steps_seconds()
        .map_or(String::new(), |s| format!(", steps over {}", duration(s)));
    let _ = writeln!(
        page,
        "<h1>Job {}</h1>\n<p class=\"meta\">{} rank(s) on {} node(s): {}{span}. From {}.</p>",
        escape(&report.job_id),
        report.ranks.len(),
        report.nodes.len(),
        escape(&report.nodes.join(", ")),
        escape(
            &report
                .files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    answers(&mut page, report);
    lanes(&mut page, report);
    ranks_table(&mut page, report);
    ledger(&mut page, report);
    findings(&mut page, report);
    if !report.problems.is_empty() {
        page.push_str("<h2>What could not be read</h2>\n<ul>\n");
        for p in &report.problems {
            let _ = writeln!(page, "<li>{}</li>", escape(&p.to_string()));
        }
        page.push_str("</ul>\n");
    }
    let _ = write!(
        page,
        "<p class=\"meta\">Written by gpulse {}; how the figures are made: docs/job-report.md.</p>\n</div></body></html>\n",
        env!("CARGO_PKG_VERSION")
    );
    page
}

fn answers(page: &mut String, report: &JobReport) {
    page.push_str("<h2>What held the job back</h2>\n");
    match &report.straggler {
        Some(s) => {
            let _ = writeln!(
                page,
                "<div class=\"finding warning\"><b>Straggler: rank {} on {}</b>, cause <code>{}</code>: \
                 {:.3} s per step outside collectives against the other ranks' median {:.3} s; \
                 they spent {:.0} % of their steps waiting for it in collectives.<ul>",
                s.rank,
                escape(&s.node),
                escape(&s.cause),
                s.busy_seconds,
                s.others_busy_seconds,
                s.others_wait_ratio * 100.0
            );
            for e in &s.evidence {
                let _ = writeln!(page, "<li>{}</li>", escape(e));
            }
            page.push_str("</ul></div>\n");
        }
        None => page.push_str("<p>No straggler: the ranks kept pace with each other.</p>\n"),
    }
    if let Some(w) = &report.what_if {
        let cost = w
            .saved_cost
            .map_or(String::new(), |c| format!(" (cost {c:.2})"));
        let _ = writeln!(
            page,
            "<div class=\"finding info\"><b>What if</b> rank {} had run at the median rank's pace: \
             a step would take {:.3} s instead of {:.3} s, saving <b>{} GPU-h</b>{cost} over {} steps × {} ranks, \
             {:.0} % of the GPU time the job held.</div>",
            report.straggler.as_ref().map_or(0, |s| s.rank),
            w.step_seconds_at_median_pace,
            w.step_seconds,
            gpu_hours(w.saved_gpu_hours),
            w.steps,
            w.ranks,
            w.saved_share * 100.0
        );
    }
    if let Some(h) = &report.hang {
        let who = match (h.culprit_rank, &h.culprit_node) {
            (Some(rank), Some(node)) => format!("rank {rank} on {}", escape(node)),
            _ => "not on the nodes given".into(),
        };
        let _ = writeln!(
            page,
            "<div class=\"finding\"><b>Hang: the culprit is {who}</b> (cause <code>{}</code>). {}",
            escape(&h.cause),
            escape(&h.summary)
        );
        for (node, ranks) in &h.waiting {
            let _ = writeln!(
                page,
                "<br>Waiting on {}: ranks {}.",
                escape(node),
                escape(ranks)
            );
        }
        if let Some(stack) = &h.stack {
            let _ = writeln!(page, "<pre>{}</pre>", escape(stack));
        }
        page.push_str("</div>\n");
    }
}

/// Every rank on its own lane, node by node: its steps over the job's time, the DataLoader
/// wait drawn at each step's start and the collective wait at its end.
fn lanes(page: &mut String, report: &JobReport) {
    let (Some(t0), Some(t1)) = (report.started, report.ended) else {
        return;
    };
    let span = (t1 - t0).max(1e-9);
    let x = |t: f64| LABEL_WIDTH + (t - t0) / span * PLOT_WIDTH;
    let mut rows: Vec<(String, u32)> = report
        .ranks
        .iter()
        .map(|r| (r.node.clone(), r.rank))
        .collect();
    rows.sort();
    let height = LANE_HEIGHT * rows.len() as f64 + 30.0;
    page.push_str("<h2>Ranks, node by node</h2>\n");
    let _ = write!(
        page,
        "<div class=\"chart\"><svg viewBox=\"0 0 {} {height}\" role=\"img\" aria-label=\"each rank's steps\">",
        LABEL_WIDTH + PLOT_WIDTH + 10.0
    );
    let straggler = report.straggler.as_ref().map(|s| s.rank);
    for (i, (node, rank)) in rows.iter().enumerate() {
        let y = i as f64 * LANE_HEIGHT;
        let weight = if Some(*rank) == straggler {
            "bold"
        } else {
            "normal"
        };
        let _ = write!(
            page,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"12\" font-weight=\"{weight}\">{} · rank {rank}</text>",
            y + 15.0,
            escape(node)
        );
        let steps = report.steps.get(rank).map(Vec::as_slice).unwrap_or(&[]);
        let every = steps.len().div_ceil(MAX_STEPS_DRAWN).max(1);
        for s in steps.iter().step_by(every) {
            let (a, b) = (x(s.start), x(s.end));
            let w = (b - a).max(0.5);
            let _ = write!(
                page,
                "<rect x=\"{a:.2}\" y=\"{:.1}\" width=\"{w:.2}\" height=\"{:.1}\" fill=\"{STEP_COLOUR}\" stroke=\"#fff\" stroke-width=\"0.3\"/>",
                y + 3.0,
                LANE_HEIGHT - 6.0
            );
            if s.data_wait > 0.0 {
                let dw = (s.data_wait / span * PLOT_WIDTH).min(w);
                let _ = write!(
                    page,
                    "<rect x=\"{a:.2}\" y=\"{:.1}\" width=\"{dw:.2}\" height=\"{:.1}\" fill=\"{DATA_WAIT_COLOUR}\"/>",
                    y + 3.0,
                    LANE_HEIGHT - 6.0
                );
            }
            if let Some(wait) = s.collective_wait.filter(|w| *w > 0.0) {
                let cw = (wait / span * PLOT_WIDTH).min(w);
                let _ = write!(
                    page,
                    "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{cw:.2}\" height=\"{:.1}\" fill=\"{COLLECTIVE_COLOUR}\"/>",
                    b - cw,
                    y + 3.0,
                    LANE_HEIGHT - 6.0
                );
            }
        }
    }
    let axis_y = LANE_HEIGHT * rows.len() as f64 + 14.0;
    let _ = write!(
        page,
        "<text x=\"{LABEL_WIDTH}\" y=\"{axis_y}\" font-size=\"11\">0 s</text>\
         <text x=\"{}\" y=\"{axis_y}\" font-size=\"11\" text-anchor=\"end\">{}</text></svg></div>",
        LABEL_WIDTH + PLOT_WIDTH,
        duration(span)
    );
    let _ = writeln!(
        page,
        "<p class=\"legend\"><span><span class=\"swatch\" style=\"height:10px;background:{STEP_COLOUR}\"></span>step</span>\
         <span><span class=\"swatch\" style=\"height:10px;background:{DATA_WAIT_COLOUR}\"></span>waiting on the DataLoader</span>\
         <span><span class=\"swatch\" style=\"height:10px;background:{COLLECTIVE_COLOUR}\"></span>in collectives (waiting for the others)</span></p>"
    );
}

fn ranks_table(page: &mut String, report: &JobReport) {
    page.push_str(
        "<table><tr><th>rank</th><th>node</th><th>GPU</th><th>steps</th><th>step (s)</th>\
         <th>outside collectives (s)</th><th>in collectives (s)</th><th>DataLoader (s)</th>\
         <th>SM clock</th><th>GPU-h</th></tr>\n",
    );
    for r in &report.ranks {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.3}</td>\
             <td class=\"n\">{:.3}</td><td class=\"n\">{:.3}</td><td class=\"n\">{:.3}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            r.rank,
            escape(&r.node),
            r.device_index.map_or("?".into(), |i| i.to_string()),
            r.steps,
            r.step_seconds,
            r.busy_seconds,
            r.collective_wait_seconds,
            r.data_wait_seconds,
            r.sm_clock_mhz
                .map_or("n/a".into(), |c| format!("{c:.0} MHz")),
            gpu_hours(r.gpu_hours)
        );
    }
    page.push_str("</table>\n");
}

fn ledger(page: &mut String, report: &JobReport) {
    let l = &report.ledger;
    let money = |c: Option<f64>| c.map_or("n/a".into(), |c| format!("{c:.2}"));
    let _ = writeln!(
        page,
        "<h2>Where the job's GPU time went</h2>\n<p>{} GPU-h, {:.3} kWh charged, cost {} \
         (prices from --cost-per-gpu-hour and --cost-per-kwh).{}</p>",
        gpu_hours(l.gpu_hours),
        l.kwh,
        money(l.cost),
        if l.rebooked_gpu_hours > 0.0 {
            format!(
                " {} GPU-h that the nodes booked as <code>collective_wait</code> are booked here as \
                 <code>straggler_wait</code>: those ranks waited for the straggler on another node.",
                gpu_hours(l.rebooked_gpu_hours)
            )
        } else {
            String::new()
        }
    );
    page.push_str(
        "<table><tr><th>cause</th><th>GPU-h</th><th>share</th><th>kWh</th><th>cost</th></tr>\n",
    );
    for c in &l.by_cause {
        let share = if l.gpu_hours > 0.0 {
            c.gpu_hours / l.gpu_hours * 100.0
        } else {
            0.0
        };
        let _ = writeln!(
            page,
            "<tr><td>{}{}</td><td class=\"n\">{}</td><td class=\"n\">{share:.0} %</td><td class=\"n\">{:.4}</td><td class=\"n\">{}</td></tr>",
            c.cause,
            c.straggler_rank
                .map_or(String::new(), |r| format!(" (waiting for rank {r})")),
            gpu_hours(c.gpu_hours),
            c.kwh,
            money(c.cost)
        );
    }
    page.push_str("</table>\n<table><tr><th>node</th><th>ranks</th><th>GPU-h</th><th>kWh</th><th>cost</th></tr>\n");
    for n in &l.by_node {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.4}</td><td class=\"n\">{}</td></tr>",
            escape(&n.node),
            n.ranks
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            gpu_hours(n.gpu_hours),
            n.kwh,
            money(n.cost)
        );
    }
    page.push_str("</table>\n");
}

fn findings(page: &mut String, report: &JobReport) {
    page.push_str("<h2>Findings, node by node</h2>\n");
    if report.findings.is_empty() {
        page.push_str("<p>None.</p>\n");
    }
    for f in &report.findings {
        let _ = writeln!(
            page,
            "<div class=\"finding {}\"><b>{}</b> on {}: {}<div class=\"advice\">{}</div></div>",
            escape(&f.finding.severity),
            escape(&f.finding.rule),
            escape(&f.node),
            escape(&f.finding.summary),
            escape(&f.finding.advice)
        );
    }
}
