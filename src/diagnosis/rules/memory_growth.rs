//! `memory_growth`: a process's GPU memory rises steadily across many windows — a leak (tensors
//! kept alive in a list, a growing cache) rather than the caching allocator settling.
//!
//! The slope is Theil–Sen (median of pairwise slopes) over the history's last-value points,
//! which one outlier cannot move. A single allocator step is not growth either: the history is
//! cut into four equal time quarters and the maximum must reach a new high in at least two of
//! the three quarter transitions, with the newest quarter holding the overall maximum.

use std::time::SystemTime;

use crate::diagnosis::findings::{human_bytes, human_duration, Finding, RuleId, Severity, Value};
use crate::diagnosis::history::Series;
use crate::diagnosis::thresholds::MemoryGrowth;

use super::{process_device_ref, Inputs};

const ADVICE: &str = "GPU memory keeps growing: look for tensors kept alive across steps \
(appending loss instead of loss.item() to a list, caches keyed by input shape, autograd graphs \
held by stored outputs), and compare torch.cuda.memory_allocated() with memory_reserved() per \
step; torch.cuda.memory._record_memory_history() shows who allocates.";

/// Theil–Sen is O(n²) in the points; beyond this many, an evenly spaced subset is used.
const MAX_FIT_POINTS: usize = 96;

/// A fitted trend over one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trend {
    /// Bytes per second.
    pub slope: f64,
    /// Time covered, seconds.
    pub span_seconds: f64,
    pub points: usize,
    /// New highs in the quarter transitions (0–3), and whether the last quarter holds the max.
    pub rising_quarters: u32,
    pub ends_at_max: bool,
    pub first_start: SystemTime,
}

/// One finding per (process, device) whose memory grows at `min_rate_bytes_per_second` or more.
pub fn evaluate(inputs: &Inputs<'_>, t: &MemoryGrowth) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &inputs.window.processes {
        let Some(series) = inputs.history.series(p.pid, &p.device_uuid) else {
            continue;
        };
        let Some(trend) = fit(series, t) else {
            continue;
        };
        if trend.slope < t.min_rate_bytes_per_second {
            continue;
        }
        let free = inputs
            .device(&p.device_uuid)
            .and_then(|d| d.memory_free_bytes);
        let time_to_full = free.map(|f| f as f64 / trend.slope);
        let severity = match time_to_full {
            Some(s) if s < t.urgent_time_to_full.as_secs_f64() => Severity::Error,
            _ => Severity::Warning,
        };
        let held = series
            .latest()
            .and_then(|s| s.gpu_memory_last_bytes)
            .unwrap_or(0);
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref(p)));
        let full = match time_to_full {
            Some(s) => format!("device full in about {}", human_duration(s)),
            None => "device free memory unknown".to_string(),
        };
        let summary = format!(
            "{subject} GPU memory grows {}/min over the last {} (now {}): {full}",
            human_bytes(trend.slope * 60.0),
            human_duration(trend.span_seconds),
            human_bytes(held as f64),
        );
        let mut values = vec![
            (
                "growth_rate_bytes_per_second".into(),
                Value::from(trend.slope),
            ),
            ("observed_seconds".into(), Value::from(trend.span_seconds)),
            ("gpu_memory_bytes".into(), Value::from(held)),
        ];
        if let Some(s) = time_to_full {
            values.push(("time_to_full_seconds".into(), Value::from(s)));
        }
        out.push(Finding {
            rule: RuleId::MemoryGrowth,
            severity,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since: trend.first_start,
        });
    }
    out
}

/// The trend of a series' last-value memory points, or `None` when its shape already rules
/// growth out: fewer than three (or `min_windows`) points, shorter than `min_duration`, fewer
/// than two rising quarter transitions, or not ending at its maximum. Those checks are linear;
/// the slope, quadratic in the points, is fitted only for the series that pass, which on a
/// node of long, flat training jobs is almost none.
pub fn fit(series: &Series, t: &MemoryGrowth) -> Option<Trend> {
    let first = series.summaries().next()?;
    let origin = first.end;
    let points: Vec<(f64, f64)> = series
        .summaries()
        .filter_map(|s| {
            let m = s.gpu_memory_last_bytes?;
            let t = s.end.duration_since(origin).ok()?.as_secs_f64();
            Some((t, m as f64))
        })
        .collect();
    if points.len() < t.min_windows.max(3) {
        return None;
    }
    let span = points[points.len() - 1].0 - points[0].0;
    if span <= 0.0 || span < t.min_duration.as_secs_f64() {
        return None;
    }
    let (rising_quarters, ends_at_max) = quarters(&points, span);
    if rising_quarters < 2 || !ends_at_max {
        return None;
    }
    let slope = theil_sen(&subsample(&points, MAX_FIT_POINTS))?;
    Some(Trend {
        slope,
        span_seconds: span,
        points: points.len(),
        rising_quarters,
        ends_at_max,
        first_start: first.start,
    })
}

/// Median of the slopes of all pairs with distinct times.
pub fn theil_sen(points: &[(f64, f64)]) -> Option<f64> {
    let mut slopes = Vec::with_capacity(points.len() * points.len().saturating_sub(1) / 2);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            let dt = b.0 - a.0;
            if dt > 0.0 {
                slopes.push((b.1 - a.1) / dt);
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    // The median by selection, linear where a sort is n log n.
    let n = slopes.len();
    let mid = n / 2;
    let (lower, upper, _) = slopes.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *upper;
    Some(if n % 2 == 0 {
        // The lower middle is the largest of the left part.
        let lower = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    } else {
        upper
    })
}

fn subsample(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    // Evenly spaced indices, always keeping the first and the last point.
    (0..max)
        .map(|i| points[i * (points.len() - 1) / (max - 1)])
        .collect()
}

fn quarters(points: &[(f64, f64)], span: f64) -> (u32, bool) {
    let t0 = points[0].0;
    let mut max = [f64::NEG_INFINITY; 4];
    for &(t, m) in points {
        let q = (((t - t0) / span) * 4.0).floor().clamp(0.0, 3.0) as usize;
        max[q] = max[q].max(m);
    }
    let filled: Vec<f64> = max.into_iter().filter(|m| m.is_finite()).collect();
    let rising = filled.windows(2).filter(|w| w[1] > w[0]).count() as u32;
    let overall = filled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ends_at_max = filled.last().is_some_and(|&l| l >= overall);
    (rising, ends_at_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::rules::testkit::*;

    const MIB: f64 = 1024.0 * 1024.0;

    /// Windows every 60 s for `n` minutes with the process's memory from `mem(minute)`.
    fn history(n: u64, mem: impl Fn(u64) -> u64) -> Fixture {
        let windows = (1..=n)
            .map(|i| {
                let m = mem(i);
                window(
                    i * 60,
                    vec![device(0, 0.9, m + GIB)],
                    vec![process(9, 0, m, Some(0.8))],
                )
            })
            .collect();
        Fixture::new(windows)
    }

    #[test]
    fn steady_leak_is_reported_with_rate_and_time_to_full() {
        // 20 GiB + 60 MiB/min for 20 minutes: 1 MiB/s.
        let f = history(20, |i| 20 * GIB + i * 60 * 1024 * 1024);
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let Some(Value::Float(rate)) = found[0].value("growth_rate_bytes_per_second") else {
            panic!("no rate in {:?}", found[0].values);
        };
        assert!((rate - MIB).abs() < 1.0, "rate {rate}");
        let Some(Value::Float(ttf)) = found[0].value("time_to_full_seconds") else {
            panic!("no time to full");
        };
        // Free = 80 − (20 GiB + 1200 MiB + 1 GiB) ≈ 57.8 GiB at 1 MiB/s ≈ 16 h.
        assert!((ttf / 3600.0 - 16.4).abs() < 0.5, "ttf {ttf}");
        assert_eq!(found[0].severity, Severity::Warning);
        assert_eq!(found[0].since, t(0));
    }

    #[test]
    fn fast_leak_close_to_full_is_an_error() {
        // 74 GiB + 100 MiB/min: at minute 15 about 3.5 GiB free at 1.7 MiB/s, ~36 min to full.
        let f = history(15, |i| 74 * GIB + i * 100 * 1024 * 1024);
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].severity, Severity::Error);
    }

    #[test]
    fn one_allocator_step_is_not_growth() {
        // Flat at 20 GiB, one jump to 30 GiB at minute 10, flat again.
        let f = history(20, |i| if i < 10 { 20 * GIB } else { 30 * GIB });
        assert!(evaluate(&f.inputs(), &MemoryGrowth::default()).is_empty());
    }

    #[test]
    fn flat_memory_with_noise_is_not_growth() {
        let f = history(30, |i| 20 * GIB + (i % 3) * 8 * 1024 * 1024);
        assert!(evaluate(&f.inputs(), &MemoryGrowth::default()).is_empty());
    }

    #[test]
    fn short_history_is_not_believed() {
        // Fast growth but only 5 minutes of history.
        let f = history(5, |i| 20 * GIB + i * GIB);
        assert!(evaluate(&f.inputs(), &MemoryGrowth::default()).is_empty());
    }

    #[test]
    fn theil_sen_takes_the_mean_of_the_two_middle_slopes_of_an_even_count() {
        // Pair slopes 1, 1, 1, 2, 2.5, 4: the middle two are 1 and 2.
        let pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (3.0, 6.0)];
        assert_eq!(theil_sen(&pts), Some(1.5));
        assert_eq!(theil_sen(&pts[..3]), Some(1.0), "odd count: the middle one");
        assert_eq!(
            theil_sen(&[(1.0, 5.0), (1.0, 9.0)]),
            None,
            "no distinct times"
        );
    }

    #[test]
    fn theil_sen_ignores_an_outlier() {
        let mut pts: Vec<(f64, f64)> = (0..20).map(|i| (i as f64, 2.0 * i as f64)).collect();
        pts[10].1 = 1e12;
        assert_eq!(theil_sen(&pts), Some(2.0));
    }
}
