//! `idle_holder`: a process holds GPU memory but has run no kernels for a while (a notebook
//! kernel, a stopped job, a hung rank), or outlived its parent (the leftover of a crashed run).
//! Either way the memory is lost to every other job on that GPU.

use std::time::SystemTime;

use crate::config::thresholds::IdleHolder;
use crate::diagnosis::findings::{
    human_bytes, human_duration, pct, Finding, Layer, RuleId, Severity, Value,
};
use crate::diagnosis::history::{KeptRun, RunSoFar, Series, WindowSummary};

use super::{process_device_ref_in, Inputs};

const IDLE_ADVICE: &str = "The process keeps GPU memory without using the GPU: a notebook \
kernel or a stopped job holding its CUDA context. End it (or restart the notebook kernel) to \
free the memory; torch.cuda.empty_cache() only returns cached blocks, not live tensors. A hung \
distributed rank shows the same signature: check its peers.";

const ORPHAN_ADVICE: &str = "Its parent process is gone: most likely a DataLoader worker or a \
launcher child left over from a crashed run. Check it with `ps -o pid,ppid,etime,cmd -p PID` \
and kill it to give the GPU memory back.";

/// One finding per (process, device) idle past `min_duration`, or orphaned.
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &IdleHolder) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &inputs.window.processes {
        let Some(held) = p.gpu_memory_bytes.map(|g| g.last.max(0.0) as u64) else {
            continue;
        };
        if held <= t.min_gpu_memory_bytes {
            continue;
        }
        let idle = inputs
            .history
            .series(p.pid, &p.device_uuid)
            .and_then(|s| idle_run(&s, t));
        let idle_long = idle.filter(|run| run.seconds >= t.min_duration.as_secs_f64());
        let orphan = t.orphans && inputs.parent_alive.get(&p.pid) == Some(&false);
        if idle_long.is_none() && !orphan {
            continue;
        }
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let mut values = vec![
            ("gpu_memory_bytes".to_string(), Value::from(held)),
            (
                "parent_alive".to_string(),
                Value::from(match inputs.parent_alive.get(&p.pid) {
                    Some(true) => "true",
                    Some(false) => "false",
                    None => "unknown",
                }),
            ),
        ];
        let (summary, advice, since, reason) = match (idle_long, orphan) {
            (Some(run), true) => (
                format!(
                    "{subject} holds {} with {} utilisation for {} and its parent is gone",
                    human_bytes(held as f64),
                    pct(run.utilization),
                    human_duration(run.seconds)
                ),
                format!("{ORPHAN_ADVICE} {IDLE_ADVICE}"),
                run.since,
                "orphaned_idle",
            ),
            (Some(run), false) => (
                format!(
                    "{subject} holds {} with {} utilisation for {}",
                    human_bytes(held as f64),
                    pct(run.utilization),
                    human_duration(run.seconds)
                ),
                IDLE_ADVICE.to_string(),
                run.since,
                "idle",
            ),
            (None, _) => (
                format!(
                    "{subject} holds {} and its parent process is gone",
                    human_bytes(held as f64)
                ),
                ORPHAN_ADVICE.to_string(),
                inputs.window.start,
                "orphaned",
            ),
        };
        if let Some(run) = idle_long {
            values.push(("idle_seconds".into(), Value::from(run.seconds)));
            values.push(("utilization_ratio".into(), Value::from(run.utilization)));
            values.push(("utilization_source".into(), Value::from(run.source)));
        }
        values.push(("reason".into(), Value::from(reason)));
        out.push(Finding {
            rule: RuleId::IdleHolder,
            related: Vec::new(),
            severity: Severity::Warning,
            subject,
            summary,
            advice,
            values,
            since,
            evidence: vec![Layer::Nvml, Layer::Procfs],
        });
    }
    out
}

/// The trailing run of idle windows in a series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct IdleRun {
    pub since: SystemTime,
    pub seconds: f64,
    /// Highest utilisation seen in the run.
    pub utilization: f64,
    pub source: &'static str,
}

fn idle_utilization(s: &WindowSummary) -> Option<(f64, &'static str)> {
    // Per-process SM when known; else the device's, which is only ~0 when every process on it is
    // idle: a shared busy device hides an idle process (a miss) but never invents one.
    // GPM SM activity, where the GPU gives it, says how much of the GPU works; GPU-Util only
    // whether any kernel ran.
    // On MIG the "device" figures are the process's instance's (its GPM): the instance is idle
    // only when every process in it is.
    let (sm_source, util_source) = if s.on_mig_instance {
        ("mig_instance_sm_activity", "mig_instance_graphics_activity")
    } else {
        ("device_sm_activity", "device")
    };
    s.sm_utilization_mean
        .map(|u| (u, "process_sm"))
        .or(s.device_sm_activity_mean.map(|u| (u, sm_source)))
        .or(s.device_utilization_mean.map(|u| (u, util_source)))
}

/// The trailing run of windows in which the process held memory and stayed idle. Read every
/// window for every process that holds memory, and a process idle for days keeps its whole
/// history in the run, so the run is kept with the series ([`KeptRun`]) and extended by the
/// newest summary; it is walked again only when it was not kept for the previous window, or
/// when the summary holding its peak utilisation left the history.
fn idle_run(series: &Series, t: &IdleHolder) -> Option<IdleRun> {
    let latest = series.latest()?;
    let newest = series.first_number() + series.len() as u64 - 1;
    let key = [t.min_gpu_memory_bytes, t.utilization_at_most.to_bits()];
    let kept = series
        .idle_run()
        .get()
        .filter(|k| k.key == key && k.through + 1 >= newest && k.through <= newest);
    let run = match kept {
        Some(k) if k.through == newest => k.run,
        Some(k) => extend(series, k.run, &latest, newest, t),
        None => walk(series, t),
    };
    series.idle_run().set(Some(KeptRun {
        key,
        through: newest,
        run,
    }));
    let run = run?;
    let since = series.numbered(run.start.max(series.first_number()))?.start;
    let seconds = latest
        .end
        .duration_since(since)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    Some(IdleRun {
        since,
        seconds,
        utilization: run.peak,
        source: idle_utilization(&latest)?.1,
    })
}

/// The utilisation of `s` when it belongs to an idle run: it holds more than the threshold's
/// memory, and its utilisation is known and at most the threshold.
fn idle_in(s: &WindowSummary, t: &IdleHolder) -> Option<f64> {
    let holds = s
        .gpu_memory_last_bytes
        .is_some_and(|m| m > t.min_gpu_memory_bytes);
    let (u, _) = idle_utilization(s)?;
    (holds && u <= t.utilization_at_most).then_some(u)
}

/// The run as of the newest summary `latest` (numbered `newest`), from `previous`, the run as
/// of the summary before it.
fn extend(
    series: &Series,
    previous: Option<RunSoFar>,
    latest: &WindowSummary,
    newest: u64,
    t: &IdleHolder,
) -> Option<RunSoFar> {
    let u = idle_in(latest, t)?;
    let Some(run) = previous else {
        return Some(RunSoFar {
            start: newest,
            peak: u,
            peak_at: newest,
        });
    };
    if run.peak_at < series.first_number() {
        // The peak left with the oldest summaries; the rest of the run may peak lower.
        return walk(series, t);
    }
    Some(if u >= run.peak {
        RunSoFar {
            peak: u,
            peak_at: newest,
            ..run
        }
    } else {
        run
    })
}

/// The run found by walking the series newest first.
fn walk(series: &Series, t: &IdleHolder) -> Option<RunSoFar> {
    let mut run: Option<RunSoFar> = None;
    let first = series.first_number();
    for (position, s) in series.summaries().enumerate().rev() {
        let number = first + position as u64;
        let Some(u) = idle_in(&s, t) else {
            break;
        };
        run = Some(match run {
            // Ties keep the newer summary as the peak's: it leaves the history last.
            Some(r) if r.peak >= u => RunSoFar { start: number, ..r },
            _ => RunSoFar {
                start: number,
                peak: u,
                peak_at: number,
            },
        });
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    fn minutes(n: u64, sm: impl Fn(u64) -> Option<f64>, dev: f64) -> Fixture {
        let windows = (1..=n)
            .map(|i| {
                window(
                    i * 60,
                    vec![device(0, dev, 10 * GIB)],
                    vec![process(42, 0, 8 * GIB, sm(i))],
                )
            })
            .collect();
        Fixture::new(windows)
    }

    /// The run as found before it was kept with the series: a walk newest first, each window.
    fn walked_idle_run(series: &Series, t: &IdleHolder) -> Option<IdleRun> {
        let latest = series.latest()?;
        let mut run: Option<IdleRun> = None;
        for s in series.summaries().rev() {
            let holds = s
                .gpu_memory_last_bytes
                .is_some_and(|m| m > t.min_gpu_memory_bytes);
            let Some((u, source)) = idle_utilization(&s) else {
                break;
            };
            if !holds || u > t.utilization_at_most {
                break;
            }
            let seconds = latest
                .end
                .duration_since(s.start)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            run = Some(IdleRun {
                since: s.start,
                seconds,
                utilization: run.map_or(u, |r| r.utilization.max(u)),
                source: run.map_or(source, |r| r.source),
            });
        }
        run
    }

    #[test]
    fn the_kept_run_equals_a_walk_over_a_long_random_series() {
        use crate::config::thresholds::HistoryLimits;
        use crate::diagnosis::history::History;
        use std::time::Duration;

        // 4000 windows through a history of at most 150 summaries and 10 minutes (so summaries
        // leave by count and by age): idle stretches long enough to fill the history, with
        // noisy low utilisation (its peak leaving the old end), busy windows, memory released
        // and taken, per-process utilisation missing at times, and the thresholds changed
        // midway. Each window, the kept run must be the walk's.
        let mut history = History::new(HistoryLimits {
            max_windows: 150,
            max_age: Duration::from_secs(600),
            ..HistoryLimits::default()
        });
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut thresholds = IdleHolder::default();
        let (mut at, mut runs, mut full_runs) = (1_000_u64, 0, 0);
        for i in 0..4000_u64 {
            at += 1 + next() % 6;
            if i == 2000 {
                thresholds.utilization_at_most = 0.02;
            }
            let busy = (i / 300) % 2 == 1 && next() % 40 == 0;
            let sm = match next() % 100 {
                _ if busy => Some(0.9),
                0..=3 => None,
                // Idle only once the threshold is raised.
                4 => Some(0.015),
                _ => Some((next() % 3) as f64 / 200.0),
            };
            let memory = if next() % 500 == 0 { 0 } else { 8 * GIB };
            let p = process(42, 0, memory, sm);
            history.record(&window(at, vec![device(0, 0.005, 10 * GIB)], vec![p]));
            let series = history.series(42, "GPU-00000000").expect("the series");
            let kept = idle_run(&series, &thresholds);
            assert_eq!(kept, walked_idle_run(&series, &thresholds), "window {i}");
            runs += usize::from(kept.is_some());
            full_runs += usize::from(
                kept.is_some_and(|r| r.since == series.summaries().next().unwrap().start),
            );
        }
        assert!(
            runs > 1000 && full_runs > 500,
            "{runs} runs, {full_runs} of the whole history"
        );
    }

    #[test]
    fn idle_for_ten_minutes_is_reported() {
        let f = minutes(10, |_| Some(0.0), 0.0);
        let found = evaluate(&f.inputs(), &IdleHolder::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].value("reason"), Some(&Value::from("idle")));
        assert_eq!(found[0].value("idle_seconds"), Some(&Value::Float(600.0)));
        assert_eq!(found[0].since, t(0));
        assert!(found[0].summary.contains("8.0 GiB"), "{}", found[0].summary);
    }

    #[test]
    fn idle_only_recently_is_not_yet_reported() {
        // Busy for 8 minutes, idle for the last 3.
        let f = minutes(11, |i| Some(if i <= 8 { 0.9 } else { 0.0 }), 0.0);
        assert!(evaluate(&f.inputs(), &IdleHolder::default()).is_empty());
    }

    #[test]
    fn device_utilization_is_used_when_per_process_is_unknown() {
        let f = minutes(10, |_| None, 0.0);
        let found = evaluate(&f.inputs(), &IdleHolder::default());
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].value("utilization_source"),
            Some(&Value::from("device"))
        );
        // A busy shared device with unknown per-process usage: not idle.
        let f = minutes(10, |_| None, 0.7);
        assert!(evaluate(&f.inputs(), &IdleHolder::default()).is_empty());
    }

    #[test]
    fn orphan_is_reported_at_once_even_when_busy() {
        let mut f = minutes(1, |_| Some(0.6), 0.6);
        f.parent_alive.insert(42, false);
        let found = evaluate(&f.inputs(), &IdleHolder::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].value("reason"), Some(&Value::from("orphaned")));
        assert!(found[0].advice.contains("ps -o pid,ppid"));
        f.parent_alive.insert(42, true);
        assert!(evaluate(&f.inputs(), &IdleHolder::default()).is_empty());
    }

    #[test]
    fn small_holder_is_ignored() {
        let windows = (1..=10)
            .map(|i| {
                window(
                    i * 60,
                    vec![device(0, 0.0, GIB)],
                    vec![process(42, 0, 100 * 1024 * 1024, Some(0.0))],
                )
            })
            .collect();
        let f = Fixture::new(windows);
        assert!(evaluate(&f.inputs(), &IdleHolder::default()).is_empty());
    }
}
