//! The job's answers, computed over all its ranks on every node: each rank's step figures, the
//! straggler and why, the ledger summed over the job with the waiting ranks' time rebooked to
//! the rank they waited for, what the straggler cost (the what-if), and a hang's culprit named
//! once. Pure functions of the nodes read ([`super::node`]); no I/O.
//!
//! A node alone cannot see a straggler on another node: its ranks wait in collectives for a rank
//! it does not host, and its ledger books that time as `collective_wait`. With every node's
//! recording the comparison `rank_straggler` makes on one node can be made over the job, with
//! the same thresholds (`[diagnosis.rank_straggler]`'s defaults).

use std::collections::BTreeMap;

use serde::Serialize;

use super::node::{Node, Step};
use crate::attribution::Cause;
use crate::config::thresholds::RankStraggler;
use crate::diagnosis::findings::RuleId;
use crate::record::recording::NOT_A_SLOWDOWN;
use crate::schema::throttle_reasons;
use crate::values::Prices;

/// One rank of the job as its steps show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RankFigures {
    pub rank: u32,
    pub node: String,
    pub pid: Option<u32>,
    pub device_index: Option<u32>,
    pub device_uuid: Option<String>,
    pub steps: usize,
    /// Mean seconds per step: the whole step, outside collectives (busy), in collectives, and
    /// blocked on the DataLoader.
    pub step_seconds: f64,
    pub busy_seconds: f64,
    pub collective_wait_seconds: f64,
    pub data_wait_seconds: f64,
    /// Mean SM clock of its GPU over the run (MHz), when the node's recording has it.
    pub sm_clock_mhz: Option<f64>,
    /// Throttle reasons (slowdowns only) its GPU showed in any window.
    pub throttle_reasons: Vec<String>,
    /// GPU-hours its processes held, by the job's ledger.
    pub gpu_hours: f64,
}

/// The rank that held the job back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Straggler {
    pub rank: u32,
    pub node: String,
    /// `data_wait`, `gpu_clocks`, `xid`, `hang` (it is a hang's culprit), `compute`, or the
    /// cause its own node's
    /// `rank_straggler` finding gave (which also sees the CPU quota and GPU sharing).
    pub cause: String,
    /// Its mean step time outside collectives, the median of the others', and the excess.
    pub busy_seconds: f64,
    pub others_busy_seconds: f64,
    pub excess_seconds: f64,
    /// The other ranks' median share of their steps spent in collectives.
    pub others_wait_ratio: f64,
    pub evidence: Vec<String>,
}

/// What the job would have saved had the straggler run at the median rank's pace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct WhatIf {
    pub steps: usize,
    pub ranks: usize,
    pub step_seconds: f64,
    pub step_seconds_at_median_pace: f64,
    pub saved_gpu_hours: f64,
    /// `saved_gpu_hours` as a share of the GPU-hours the job held.
    pub saved_share: f64,
    pub saved_cost: Option<f64>,
}

/// A hang's culprit, named once for the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Hang {
    /// The rank the others wait for, where a node hosts it and said so.
    pub culprit_rank: Option<u32>,
    pub culprit_node: Option<String>,
    /// The culprit node's cause (`phase`, `earlier_collective`, `silent`), or `remote` /
    /// `all_waiting` when no node's recording names a local culprit.
    pub cause: String,
    pub summary: String,
    pub stack: Option<String>,
    /// The nodes whose ranks wait for it, with their ranks.
    pub waiting: Vec<(String, String)>,
}

/// One cause's GPU time and energy over the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CauseTotal {
    pub cause: &'static str,
    /// The rank waited for, for `straggler_wait`.
    pub straggler_rank: Option<u32>,
    pub gpu_hours: f64,
    pub kwh: f64,
    pub cost: Option<f64>,
}

/// One node's share of the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct NodeTotal {
    pub node: String,
    pub ranks: Vec<u32>,
    pub gpu_hours: f64,
    pub kwh: f64,
    pub cost: Option<f64>,
}

/// The job's ledger: by cause (waiting ranks rebooked), by node, and in total.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct JobLedger {
    pub by_cause: Vec<CauseTotal>,
    pub by_node: Vec<NodeTotal>,
    pub gpu_hours: f64,
    pub kwh: f64,
    pub cost: Option<f64>,
    /// GPU-hours the nodes booked as `collective_wait` that the job report books as
    /// `straggler_wait` on the straggler across nodes.
    pub rebooked_gpu_hours: f64,
}

/// Ranks of `job` on `nodes`, by rank: the step figures and the node that hosts it.
pub(crate) fn ranks(nodes: &[Node], job: &str) -> Vec<RankFigures> {
    let mut out: BTreeMap<u32, RankFigures> = BTreeMap::new();
    for node in nodes {
        for ((job_id, rank), steps) in &node.steps {
            if job_id != job || steps.is_empty() {
                continue;
            }
            let process = node
                .processes
                .iter()
                .find(|p| p.job_id.as_deref() == Some(job) && p.rank == Some(*rank));
            let device = process.and_then(|p| {
                node.recording
                    .as_ref()?
                    .devices
                    .iter()
                    .find(|d| d.uuid == p.device_uuid)
            });
            let n = steps.len() as f64;
            let mean = |f: fn(&Step) -> f64| steps.iter().map(f).sum::<f64>() / n;
            let step_seconds = mean(|s| s.end - s.start);
            let collective_wait_seconds = mean(|s| s.collective_wait.unwrap_or(0.0));
            let throttle = device.map_or(0, |d| d.totals.throttle_seen) & !NOT_A_SLOWDOWN;
            let clock = device.and_then(|d| {
                let points = d.series.points();
                let clocks: Vec<f64> = points
                    .iter()
                    .filter(|p| p.held_seconds > 0.0)
                    .filter_map(|p| p.sm_clock_mhz.map(f64::from))
                    .collect();
                (!clocks.is_empty()).then(|| clocks.iter().sum::<f64>() / clocks.len() as f64)
            });
            out.insert(
                *rank,
                RankFigures {
                    rank: *rank,
                    node: node.name.clone(),
                    pid: process.map(|p| p.pid),
                    device_index: process.map(|p| p.device_index),
                    device_uuid: process.map(|p| p.device_uuid.clone()),
                    steps: steps.len(),
                    step_seconds,
                    busy_seconds: step_seconds - collective_wait_seconds,
                    collective_wait_seconds,
                    data_wait_seconds: mean(|s| s.data_wait),
                    sm_clock_mhz: clock,
                    throttle_reasons: throttle_reasons()
                        .iter()
                        .filter(|(bit, _)| throttle & bit != 0)
                        .map(|(_, name)| (*name).to_string())
                        .collect(),
                    gpu_hours: process.map_or(0.0, |p| p.seconds.values().sum::<f64>() / 3600.0),
                },
            );
        }
    }
    out.into_values().collect()
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 0 {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// The straggler of the job, judged as `rank_straggler` judges the ranks of one node: the rank
/// whose mean step time outside collectives exceeds the others' median by the thresholds, while
/// the others wait in collectives. `None` for an even job or one with too few steps.
pub(crate) fn straggler(
    nodes: &[Node],
    job: &str,
    ranks: &[RankFigures],
    thresholds: &RankStraggler,
) -> Option<Straggler> {
    let compared: Vec<&RankFigures> = ranks
        .iter()
        .filter(|r| r.steps >= thresholds.min_steps)
        .collect();
    if compared.len() < 2 {
        return None;
    }
    let slow = compared
        .iter()
        .max_by(|a, b| a.busy_seconds.total_cmp(&b.busy_seconds))?;
    let others: Vec<&&RankFigures> = compared.iter().filter(|r| r.rank != slow.rank).collect();
    let others_busy = median(others.iter().map(|r| r.busy_seconds).collect())?;
    let others_wait_ratio = median(
        others
            .iter()
            .map(|r| r.collective_wait_seconds / r.step_seconds.max(f64::MIN_POSITIVE))
            .collect(),
    )?;
    let excess = slow.busy_seconds - others_busy;
    if excess < thresholds.excess_seconds_at_least
        || excess < thresholds.excess_ratio_at_least * others_busy
        || others_wait_ratio < thresholds.others_wait_ratio_at_least
    {
        return None;
    }
    let mut evidence = vec![format!(
        "rank {} on {}: {:.3} s per step outside collectives against the others' median {:.3} s; the others spend {:.0} % of their steps in collectives",
        slow.rank,
        slow.node,
        slow.busy_seconds,
        others_busy,
        others_wait_ratio * 100.0
    )];
    let cause = cause(nodes, job, slow, &others, excess, thresholds, &mut evidence);
    Some(Straggler {
        rank: slow.rank,
        node: slow.node.clone(),
        cause,
        busy_seconds: slow.busy_seconds,
        others_busy_seconds: others_busy,
        excess_seconds: excess,
        others_wait_ratio,
        evidence,
    })
}

/// Why the straggler is slow, first match wins: what its own node's `rank_straggler` said (that
/// node also saw its CPU quota and who else used its GPU), then its DataLoader, its GPU's clocks
/// or throttling, an XID on its GPU, else more work (`compute`).
fn cause(
    nodes: &[Node],
    job: &str,
    slow: &RankFigures,
    others: &[&&RankFigures],
    excess: f64,
    thresholds: &RankStraggler,
    evidence: &mut Vec<String>,
) -> String {
    let raised = nodes
        .iter()
        .find(|n| n.name == slow.node)
        .map(|n| n.raised.as_slice())
        .unwrap_or_default();
    let own = raised.iter().find(|f| {
        f.rule == RuleId::RankStraggler.as_str()
            && f.job_id.as_deref() == Some(job)
            && f.rank == Some(slow.rank)
    });
    if let Some(cause) = own.and_then(|f| f.cause.clone()) {
        evidence.push(format!(
            "{}'s own rank_straggler finding names rank {} with cause {cause}",
            slow.node, slow.rank
        ));
        return cause;
    }
    let others_data_wait = median(others.iter().map(|r| r.data_wait_seconds).collect());
    let extra_data_wait = slow.data_wait_seconds - others_data_wait.unwrap_or(0.0);
    if extra_data_wait >= thresholds.data_wait_share_of_excess * excess {
        evidence.push(format!(
            "it waits {:.3} s per step on its DataLoader against the others' {:.3} s: {:.0} % of its excess",
            slow.data_wait_seconds,
            others_data_wait.unwrap_or(0.0),
            extra_data_wait / excess * 100.0
        ));
        return "data_wait".into();
    }
    let others_clock = median(others.iter().filter_map(|r| r.sm_clock_mhz).collect());
    if let (Some(own), Some(others)) = (slow.sm_clock_mhz, others_clock) {
        if own < thresholds.sm_clock_ratio_below * others {
            evidence.push(format!(
                "its GPU's SM clock averaged {own:.0} MHz against the others' {others:.0} MHz{}",
                if slow.throttle_reasons.is_empty() {
                    String::new()
                } else {
                    format!(", throttled: {}", slow.throttle_reasons.join(", "))
                }
            ));
            return "gpu_clocks".into();
        }
    }
    if !slow.throttle_reasons.is_empty() {
        evidence.push(format!(
            "its GPU was throttled ({}) while the others' ran at their clocks",
            slow.throttle_reasons.join(", ")
        ));
        return "gpu_clocks".into();
    }
    let xid = raised.iter().find(|f| {
        f.rule == RuleId::HardwareErrors.as_str()
            && f.gpu_index.is_some()
            && f.gpu_index == slow.device_index
    });
    if let Some(f) = xid {
        evidence.push(format!("its GPU reported: {}", f.summary));
        return "xid".into();
    }
    evidence.push(
        "no wait, clock or error explains it: it has more work per step (uneven shards, longer sequences)"
            .into(),
    );
    "compute".into()
}

/// The job's ledger from every node's processes of `job`: each cause's GPU-hours, energy and
/// cost, the waiting ranks' `collective_wait` rebooked to `straggler_wait` on `straggler`, and
/// each node's share.
pub(crate) fn ledger(
    nodes: &[Node],
    job: &str,
    straggler: Option<&Straggler>,
    prices: &Prices,
) -> JobLedger {
    let mut by_cause: BTreeMap<(Cause, Option<u32>), (f64, f64)> = BTreeMap::new();
    let mut by_node = Vec::new();
    let mut rebooked = 0.0;
    for node in nodes {
        let mut node_total = NodeTotal {
            node: node.name.clone(),
            ranks: Vec::new(),
            gpu_hours: 0.0,
            kwh: 0.0,
            cost: None,
        };
        for process in node
            .processes
            .iter()
            .filter(|p| p.job_id.as_deref() == Some(job))
        {
            node_total.ranks.extend(process.rank);
            let waits_for = straggler.filter(|s| Some(s.rank) != process.rank);
            let mut keys: Vec<(Cause, Option<u32>)> = process
                .seconds
                .keys()
                .chain(process.joules.keys())
                .copied()
                .collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let seconds = process.seconds.get(&key).copied().unwrap_or(0.0);
                let joules = process.joules.get(&key).copied().unwrap_or(0.0);
                let booked = match (key, waits_for) {
                    ((Cause::CollectiveWait, None), Some(s)) => {
                        rebooked += seconds / 3600.0;
                        (Cause::StragglerWait, Some(s.rank))
                    }
                    _ => key,
                };
                let slot = by_cause.entry(booked).or_insert((0.0, 0.0));
                slot.0 += seconds;
                slot.1 += joules;
                node_total.gpu_hours += seconds / 3600.0;
                node_total.kwh += joules / 3.6e6;
            }
        }
        if node_total.gpu_hours > 0.0 || !node_total.ranks.is_empty() {
            node_total.ranks.sort_unstable();
            node_total.ranks.dedup();
            node_total.cost =
                crate::attribution::accounting::cost(prices, node_total.gpu_hours, node_total.kwh);
            by_node.push(node_total);
        }
    }
    let gpu_hours = by_node.iter().map(|n| n.gpu_hours).sum();
    let kwh = by_node.iter().map(|n| n.kwh).sum();
    JobLedger {
        by_cause: by_cause
            .into_iter()
            .map(|((cause, rank), (seconds, joules))| CauseTotal {
                cause: cause.as_str(),
                straggler_rank: rank,
                gpu_hours: seconds / 3600.0,
                kwh: joules / 3.6e6,
                cost: crate::attribution::accounting::cost(
                    prices,
                    seconds / 3600.0,
                    joules / 3.6e6,
                ),
            })
            .collect(),
        by_node,
        gpu_hours,
        kwh,
        cost: crate::attribution::accounting::cost(prices, gpu_hours, kwh),
        rebooked_gpu_hours: rebooked,
    }
}

/// What the job would have saved had `straggler` run at the median rank's pace.
///
/// In a synchronous data-parallel job every step ends in collectives that complete when the
/// last rank arrives, so every rank's step lasts the straggler's time outside collectives plus
/// the collectives' own time. At the median pace the step would be shorter by the straggler's
/// excess, but never shorter than the slowest other rank's time outside collectives plus the
/// straggler's own collective time (what a collective costs when nobody is late). Every rank
/// holds its GPU for the whole step, so the saving is that difference × steps × ranks.
pub(crate) fn what_if(
    ranks: &[RankFigures],
    straggler: &Straggler,
    ledger: &JobLedger,
    prices: &Prices,
) -> Option<WhatIf> {
    let slow = ranks.iter().find(|r| r.rank == straggler.rank)?;
    let slowest_other = ranks
        .iter()
        .filter(|r| r.rank != straggler.rank)
        .map(|r| r.busy_seconds)
        .fold(f64::NEG_INFINITY, f64::max);
    let step = median(ranks.iter().map(|r| r.step_seconds).collect())?;
    let at_median = (step - straggler.excess_seconds)
        .max(slowest_other + slow.collective_wait_seconds)
        .min(step);
    let saved_gpu_hours = (step - at_median) * slow.steps as f64 * ranks.len() as f64 / 3600.0;
    Some(WhatIf {
        steps: slow.steps,
        ranks: ranks.len(),
        step_seconds: step,
        step_seconds_at_median_pace: at_median,
        saved_gpu_hours,
        saved_share: if ledger.gpu_hours > 0.0 {
            saved_gpu_hours / ledger.gpu_hours
        } else {
            0.0
        },
        saved_cost: prices.per_gpu_hour.map(|p| p * saved_gpu_hours),
    })
}

/// The job's hang, named once: the node whose `distributed_hang` finding names a local culprit
/// gives the rank, its cause and stack; the nodes whose findings say `remote` are the ones
/// waiting for it.
pub(crate) fn hang(nodes: &[Node], job: &str) -> Option<Hang> {
    let mut culprit = None;
    let mut waiting = Vec::new();
    let mut remote_cause = None;
    for node in nodes {
        for f in node.raised.iter().filter(|f| {
            f.rule == RuleId::DistributedHang.as_str() && f.job_id.as_deref() == Some(job)
        }) {
            let cause = f.cause.clone().unwrap_or_default();
            if let Some(ranks) = f.values.get("waiting_ranks").filter(|r| !r.is_empty()) {
                waiting.push((node.name.clone(), ranks.clone()));
            }
            if matches!(cause.as_str(), "remote" | "all_waiting") {
                remote_cause.get_or_insert(cause);
            } else if culprit.is_none() {
                culprit = Some(Hang {
                    culprit_rank: f.rank,
                    culprit_node: Some(node.name.clone()),
                    cause,
                    summary: f.summary.clone(),
                    stack: f.values.get("stack").cloned(),
                    waiting: Vec::new(),
                });
            }
        }
    }
    waiting.sort();
    waiting.dedup();
    match culprit {
        Some(mut hang) => {
            hang.waiting = waiting;
            Some(hang)
        }
        None => remote_cause.map(|cause| Hang {
            culprit_rank: None,
            culprit_node: None,
            summary: "every node's ranks wait in a collective and no recording given hosts the rank they wait for: add the recordings of the job's other nodes".into(),
            cause,
            stack: None,
            waiting,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::job::node::NodeProcess;

    /// A node hosting `ranks` of job "j", each with `steps` steps of `busy` seconds outside
    /// collectives, `wait` in them and `data_wait` on its loader, holding its GPU `held` seconds
    /// of which `collective` in collective_wait.
    fn node(name: &str, ranks: &[(u32, f64, f64, f64, f64, f64)], steps: usize) -> Node {
        let mut node = Node {
            name: name.into(),
            files: Vec::new(),
            processes: Vec::new(),
            steps: BTreeMap::new(),
            raised: Vec::new(),
            recording: None,
        };
        for &(rank, busy, wait, data_wait, held, collective) in ranks {
            let list = (0..steps)
                .map(|i| {
                    let start = i as f64 * (busy + wait);
                    Step {
                        start,
                        end: start + busy + wait,
                        collective_wait: Some(wait),
                        data_wait,
                    }
                })
                .collect();
            node.steps.insert(("j".into(), rank), list);
            let mut process = NodeProcess {
                pid: 100 + rank,
                device_uuid: format!("GPU-{rank}"),
                device_index: rank,
                job_id: Some("j".into()),
                rank: Some(rank),
                ..NodeProcess::default()
            };
            process
                .seconds
                .insert((Cause::Compute, None), held - collective);
            process
                .seconds
                .insert((Cause::CollectiveWait, None), collective);
            process.joules.insert((Cause::Compute, None), 3.6e6);
            node.processes.push(process);
        }
        node
    }

    fn two_nodes(slow_data_wait: f64) -> Vec<Node> {
        vec![
            node(
                "a",
                &[
                    (0, 0.2, 0.3, 0.0, 100.0, 60.0),
                    (1, 0.2, 0.3, 0.0, 100.0, 60.0),
                ],
                20,
            ),
            node(
                "b",
                &[
                    (2, 0.2, 0.3, 0.0, 100.0, 60.0),
                    (3, 0.45, 0.05, slow_data_wait, 100.0, 10.0),
                ],
                20,
            ),
        ]
    }

    #[test]
    fn the_straggler_on_another_node_is_named_with_its_cause() {
        let nodes = two_nodes(0.25);
        let ranks = ranks(&nodes, "j");
        assert_eq!(ranks.len(), 4);
        let s = straggler(&nodes, "j", &ranks, &RankStraggler::default()).expect("a straggler");
        assert_eq!(
            (s.rank, s.node.as_str(), s.cause.as_str()),
            (3, "b", "data_wait")
        );
        assert!((s.excess_seconds - 0.25).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn without_the_loader_wait_the_cause_is_more_work() {
        let nodes = two_nodes(0.0);
        let ranks = ranks(&nodes, "j");
        let s = straggler(&nodes, "j", &ranks, &RankStraggler::default()).unwrap();
        assert_eq!(s.cause, "compute");
    }

    #[test]
    fn an_even_job_has_no_straggler() {
        let nodes = vec![
            node("a", &[(0, 0.2, 0.05, 0.0, 10.0, 2.0)], 20),
            node("b", &[(1, 0.21, 0.04, 0.0, 10.0, 2.0)], 20),
        ];
        let ranks = ranks(&nodes, "j");
        assert_eq!(
            straggler(&nodes, "j", &ranks, &RankStraggler::default()),
            None
        );
        let ledger = ledger(&nodes, "j", None, &Prices::default());
        assert!(ledger.by_cause.iter().all(|c| c.cause != "straggler_wait"));
        assert_eq!(ledger.rebooked_gpu_hours, 0.0);
    }

    #[test]
    fn the_waiting_ranks_collective_wait_is_rebooked_to_the_straggler() {
        let nodes = two_nodes(0.25);
        let ranks = ranks(&nodes, "j");
        let s = straggler(&nodes, "j", &ranks, &RankStraggler::default()).unwrap();
        let prices = Prices {
            per_gpu_hour: Some(2.0),
            per_kwh: None,
        };
        let ledger = ledger(&nodes, "j", Some(&s), &prices);
        let of = |cause: &str, rank: Option<u32>| {
            ledger
                .by_cause
                .iter()
                .find(|c| c.cause == cause && c.straggler_rank == rank)
                .map(|c| c.gpu_hours * 3600.0)
        };
        // Ranks 0–2 waited 60 s each; rank 3's own 10 s stays a collective wait.
        assert_eq!(of("straggler_wait", Some(3)), Some(180.0));
        assert_eq!(of("collective_wait", None), Some(10.0));
        assert!((ledger.gpu_hours * 3600.0 - 400.0).abs() < 1e-9);
        assert!((ledger.rebooked_gpu_hours * 3600.0 - 180.0).abs() < 1e-9);
        assert_eq!(ledger.by_node.len(), 2);
        assert_eq!(ledger.by_node[1].ranks, vec![2, 3]);
        assert!((ledger.cost.unwrap() - 2.0 * 400.0 / 3600.0).abs() < 1e-9);
        // The causes add up to the held time, rebooked or not.
        let sum: f64 = ledger.by_cause.iter().map(|c| c.gpu_hours).sum();
        assert!((sum - ledger.gpu_hours).abs() < 1e-12);
    }

    #[test]
    fn what_if_takes_off_the_excess_but_not_below_the_next_slowest_rank() {
        let nodes = two_nodes(0.25);
        let ranks = ranks(&nodes, "j");
        let s = straggler(&nodes, "j", &ranks, &RankStraggler::default()).unwrap();
        let ledger = ledger(&nodes, "j", Some(&s), &Prices::default());
        let w = what_if(&ranks, &s, &ledger, &Prices::default()).unwrap();
        // Steps of 0.5 s; at the median pace 0.2 s outside collectives + 0.05 s of collective.
        assert!((w.step_seconds_at_median_pace - 0.25).abs() < 1e-9, "{w:?}");
        assert!((w.saved_gpu_hours * 3600.0 - 0.25 * 20.0 * 4.0).abs() < 1e-9);
    }

    fn hang_finding(
        cause: &str,
        rank: u32,
        waiting: &str,
    ) -> crate::record::job::node::NodeFinding {
        crate::record::job::node::NodeFinding {
            rule: "distributed_hang".into(),
            cause: Some(cause.into()),
            job_id: Some("j".into()),
            rank: Some(rank),
            gpu_index: None,
            summary: format!("hang, cause {cause}"),
            values: [("waiting_ranks".to_string(), waiting.to_string())].into(),
        }
    }

    #[test]
    fn a_hang_is_named_once_by_the_node_that_hosts_the_culprit() {
        let mut nodes = two_nodes(0.0);
        nodes[0].raised.push(hang_finding("remote", 0, "0,1"));
        nodes[1].raised.push(hang_finding("phase", 3, "2"));
        let h = hang(&nodes, "j").expect("a hang");
        assert_eq!(
            (h.culprit_rank, h.culprit_node.as_deref(), h.cause.as_str()),
            (Some(3), Some("b"), "phase")
        );
        assert_eq!(
            h.waiting,
            vec![
                ("a".to_string(), "0,1".to_string()),
                ("b".to_string(), "2".to_string())
            ]
        );
        // Without node b's recording, no culprit is invented.
        let h = hang(&nodes[..1], "j").unwrap();
        assert_eq!((h.culprit_rank, h.cause.as_str()), (None, "remote"));
    }
}
