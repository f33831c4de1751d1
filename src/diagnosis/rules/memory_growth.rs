//! `memory_growth`: a process's GPU memory rises steadily across many windows — a leak (tensors
//! kept alive in a list, a growing cache) rather than the caching allocator settling.
//!
//! The slope is Theil–Sen (median of pairwise slopes) over the history's last-value points,
//! which one outlier cannot move. A single allocator step is not growth either: the history is
//! cut into four equal time quarters and the maximum must reach a new high in at least two of
//! the three quarter transitions, with the newest quarter holding the overall maximum.
//!
//! NVML's per-process memory includes the caching allocator's reserve, so on NVML alone a leak
//! and a cache that grows look the same. When the framework sent its allocator gauges for the
//! process (`pytorch.cuda.memory.*` through gpulse's receiver), those decide instead: live
//! tensors (`allocated`) growing, or each epoch's peak (`max_allocated`, reset per epoch) rising
//! epoch after epoch, is a leak (warning, error when the device fills within
//! `urgent_time_to_full`; on a GPU in MIG mode, when its MIG instance fills: a process cannot
//! grow beyond its slice); only the reserve (or NVML's figure) growing while `allocated` stays
//! flat is the caching allocator at work, reported as info and never as a warning.

use std::time::SystemTime;

use crate::config::thresholds::MemoryGrowth;
use crate::diagnosis::findings::{
    human_bytes, human_duration, Finding, Layer, RuleId, Severity, Value,
};
use crate::diagnosis::framework::AllocatorPoint;
use crate::diagnosis::history::{SampledSlope, Series, WindowSummary};
use crate::sampling::ProcessWindow;

use super::{memory_room, process_device_ref_in, slope_count, Inputs};

const ADVICE: &str = "GPU memory keeps growing: look for tensors kept alive across steps \
(appending loss instead of loss.item() to a list, caches keyed by input shape, autograd graphs \
held by stored outputs), and compare torch.cuda.memory_allocated() with memory_reserved() per \
step; torch.cuda.memory._record_memory_history() shows who allocates.";

const TENSOR_LEAK_ADVICE: &str = "Live tensors keep growing (PyTorch's allocated memory, not \
just its cache): look for tensors kept alive across steps (appending loss instead of \
loss.item() to a list, caches keyed by input shape, autograd graphs held by stored outputs). \
torch.cuda.memory._record_memory_history() and torch.cuda.memory._dump_snapshot() show who \
allocates.";

const CACHING_ADVICE: &str = "Only PyTorch's caching allocator grows, not the live tensors: \
this is the caching allocator, not a leak. It keeps freed blocks reserved for reuse; the reserve \
is returned to other processes only by torch.cuda.empty_cache(). Nothing to fix unless another \
process on this GPU needs the memory.";

/// Per-epoch peaks of `max_allocated` must rise this many times in a row to count as growth.
const RISING_EPOCHS: usize = 3;

/// Theil–Sen is O(n²) in the points; beyond this many, a subset is used: every `stride`-th
/// summary of a series ([`sampled_slope`]), evenly spaced points of the allocator's readings.
const MAX_FIT_POINTS: usize = 96;

/// A fitted trend over one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trend {
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
pub(crate) fn evaluate(inputs: &Inputs<'_>, t: &MemoryGrowth) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &inputs.window.processes {
        // The allocator's view decides only once it covers as long as a trend needs; before
        // that (the job just started sending) NVML's history is all there is.
        let allocator = inputs
            .framework
            .process(p.pid)
            .and_then(|f| f.allocator_on(&p.device_uuid, inputs.on_one_device(p.pid)))
            .filter(|points| long_enough(points, t));
        if let Some(points) = allocator {
            out.extend(with_allocator(inputs, p, points, t));
            continue;
        }
        let Some(series) = inputs.history.series(p.pid, &p.device_uuid) else {
            continue;
        };
        let Some(trend) = fit(&series, t) else {
            continue;
        };
        if trend.slope < t.min_rate_bytes_per_second {
            continue;
        }
        // On MIG, its instance's free memory: the only memory it can grow into.
        let room = memory_room(inputs, p);
        let free = room.and_then(|r| r.free);
        let place = room.map_or("device", |r| r.place());
        let time_to_full = free.map(|f| f as f64 / trend.slope);
        let severity = match time_to_full {
            Some(s) if s < t.urgent_time_to_full.as_secs_f64() => Severity::Error,
            _ => Severity::Warning,
        };
        let held = series
            .latest()
            .and_then(|s| s.gpu_memory_last_bytes)
            .unwrap_or(0);
        let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
        let full = match time_to_full {
            Some(s) => format!("{place} full in about {}", human_duration(s)),
            None => format!("{place} free memory unknown"),
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
            related: Vec::new(),
            severity,
            subject,
            summary,
            advice: ADVICE.to_string(),
            values,
            since: trend.first_start,
            evidence: vec![Layer::Nvml],
        });
    }
    out
}

/// The trend of a series' last-value memory points, or `None` when it is not growth: fewer
/// than three (or `min_windows`) points, shorter than `min_duration`, fewer than two rising
/// quarter transitions, not ending at its maximum, or slower than
/// `min_rate_bytes_per_second` (which every caller would drop). Every process is checked
/// every export window, over up to `history.max_windows` summaries, so this is on the window's
/// hot path: while the series is in time order (the wall clock never stepped back within it),
/// [`gate_in_order`] rules it out in O(log n) instead of walking it, and the slope of a series
/// that passes is [`sampled_slope`]'s, recomputed only when its sample changes.
pub(crate) fn fit(series: &Series, t: &MemoryGrowth) -> Option<Trend> {
    let first = series.summaries().next()?;
    let gate = if series.ends_in_order() {
        gate_in_order(series, &first, t)
    } else {
        // A quarter of the time is no longer a run of positions.
        gate(memory_points(series, first.end), t)
    }?;
    let slope = sampled_slope(series, t.min_rate_bytes_per_second)?;
    Some(gate.trend(slope, first.start))
}

/// What a series' points must show before a slope is fitted: span, count and quarters.
#[derive(Debug, Clone, Copy)]
struct Gate {
    span_seconds: f64,
    count: usize,
    rising_quarters: u32,
    ends_at_max: bool,
}

impl Gate {
    fn trend(self, slope: f64, first_start: SystemTime) -> Trend {
        Trend {
            slope,
            span_seconds: self.span_seconds,
            points: self.count,
            rising_quarters: self.rising_quarters,
            ends_at_max: self.ends_at_max,
            first_start,
        }
    }
}

/// A series' last-value memory points as `(seconds since origin, bytes)`, oldest first; a
/// point ending before `origin` is left out.
fn memory_points<'a>(
    series: &Series<'a>,
    origin: SystemTime,
) -> impl DoubleEndedIterator<Item = (f64, f64)> + Clone + 'a {
    series.summaries().filter_map(move |s| {
        let m = s.gpu_memory_last_bytes?;
        let t = s.end.duration_since(origin).ok()?.as_secs_f64();
        Some((t, m as f64))
    })
}

/// [`gate`] of a series in time order, `first` its oldest summary: the span is read from the
/// ends, the count kept by the series, and each quarter's highest point taken from the
/// series' [`MaxQueue`](crate::diagnosis::max_queue::MaxQueue) between positions found by
/// binary search.
fn gate_in_order(series: &Series, first: &WindowSummary, t: &MemoryGrowth) -> Option<Gate> {
    // In order, no summary ends before the first, so `duration_since` cannot fail. Ends and
    // points are read alone ([`Series::memory_point`]): this runs for every series that
    // passes the span and count tests, each window.
    let seconds = |end: SystemTime| {
        end.duration_since(first.end)
            .map_or(0.0, |since| since.as_secs_f64())
    };
    let point = |position: usize| series.memory_point(position);
    let has_point = |position: &usize| point(*position).is_some_and(|(_, m)| m.is_some());
    let first_point = (0..series.len()).find(has_point)?;
    let last_point = (0..series.len()).rev().find(has_point)?;
    let t0 = seconds(point(first_point)?.0);
    let span = seconds(point(last_point)?.0) - t0;
    if span <= 0.0 || span < t.min_duration.as_secs_f64() {
        return None;
    }
    let count = series.memory_points();
    if count < t.min_windows.max(3) {
        return None;
    }
    // Quarter `k` is the positions from the first in it to the first in the next: the quarter
    // of a time never falls as time goes on, so each boundary is a binary search.
    let mut bounds = [first_point, 0, 0, 0, last_point + 1];
    for (k, bound) in bounds.iter_mut().enumerate().take(4).skip(1) {
        *bound = series.partition_point_by_end(|end| quarter_of(seconds(end), t0, span) < k);
    }
    let highest = std::array::from_fn(|k| {
        series
            .memory_last_max(bounds[k]..bounds[k + 1])
            .map_or(f64::NEG_INFINITY, |m| m as f64)
    });
    let (rising_quarters, ends_at_max) = rising_quarters(highest);
    (rising_quarters >= 2 && ends_at_max).then_some(Gate {
        span_seconds: span,
        count,
        rising_quarters,
        ends_at_max,
    })
}

/// The gate over `(seconds, bytes)` points, oldest first, walking them: the span is judged
/// from the ends, so a series too young for a trend is not walked; the others are walked once
/// for the count and the quarters.
fn gate(
    points: impl DoubleEndedIterator<Item = (f64, f64)> + Clone,
    t: &MemoryGrowth,
) -> Option<Gate> {
    let (first, _) = points.clone().next()?;
    let (last, _) = points.clone().next_back()?;
    let span = last - first;
    if span <= 0.0 || span < t.min_duration.as_secs_f64() {
        return None;
    }
    let (count, rising_quarters, ends_at_max) = quarters(points, first, span);
    (count >= t.min_windows.max(3) && rising_quarters >= 2 && ends_at_max).then_some(Gate {
        span_seconds: span,
        count,
        rising_quarters,
        ends_at_max,
    })
}

/// The Theil–Sen slope of a series' sample when it reaches `rate`, else `None`. The sample is
/// every `stride`-th summary by number ([`Series::first_number`]), `stride` the fewest that
/// keeps it to [`MAX_FIT_POINTS`], those with a memory reading. Taken by number rather than
/// by position, the sample stays the same while the history slides, until the next numbered
/// summary joins or the oldest leaves: at a full history of 720 summaries, once every 8
/// windows. A summary never changes once stored, so the slope is kept with the series under
/// the sample's description and the rate ([`SampledSlope`]) and recomputed only when those
/// change. Fitting every process's sample each window was the largest cost of a full history
/// (docs/resources.md).
fn sampled_slope(series: &Series, rate: f64) -> Option<f64> {
    let len = series.len();
    let stride = len.div_ceil(MAX_FIT_POINTS).max(1);
    let first_number = series.first_number();
    let step = stride as u64;
    let first = usize::try_from((step - first_number % step) % step).ok()?;
    if first >= len {
        return None;
    }
    let last = first + (len - 1 - first) / stride * stride;
    let key = [
        step,
        first_number + first as u64,
        first_number + last as u64,
        rate.to_bits(),
    ];
    let kept = series.sampled_slope();
    if let Some(slope) = kept.get().filter(|k| k.key == key) {
        return slope.slope;
    }
    let slope = sample_at(series, first, stride).and_then(|sample| slope_reaching(&sample, rate));
    kept.set(Some(SampledSlope { key, slope }));
    slope
}

/// The points at positions `first`, `first + stride`, … as `(seconds since the end of the
/// summary at `first`, bytes)`, those with a memory reading; times before that end (the wall
/// clock stepped back) are negative.
fn sample_at(series: &Series, first: usize, stride: usize) -> Option<Vec<(f64, f64)>> {
    let (origin, _) = series.memory_point(first)?;
    let seconds = |end: SystemTime| match end.duration_since(origin) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    };
    Some(
        (first..series.len())
            .step_by(stride)
            .filter_map(|position| {
                let (end, memory) = series.memory_point(position)?;
                Some((seconds(end), memory? as f64))
            })
            .collect(),
    )
}

/// [`fit`] over `(seconds since the first point, bytes)` points, oldest first, that are not a
/// series of the history (the allocator's readings): [`gate`], then the slope over an evenly
/// spaced subset.
pub(crate) fn fit_points(
    points: impl DoubleEndedIterator<Item = (f64, f64)> + Clone,
    first_start: SystemTime,
    t: &MemoryGrowth,
) -> Option<Trend> {
    let gate = gate(points.clone(), t)?;
    let points: Vec<(f64, f64)> = points.collect();
    let slope = slope_reaching(
        &subsample(&points, MAX_FIT_POINTS),
        t.min_rate_bytes_per_second,
    )?;
    Some(gate.trend(slope, first_start))
}

/// The Theil–Sen slope of `sample`, `None` when it is below `rate`. The median of the pairwise
/// slopes reaches the rate only if their upper middle one does (with an even count the median
/// is its mean with a lower one), so the slopes are first counted against the rate, which
/// needs no storing nor selecting; a flat series stops there.
fn slope_reaching(sample: &[(f64, f64)], rate: f64) -> Option<f64> {
    if !upper_middle_slope_reaches(sample, rate) {
        return None;
    }
    theil_sen(sample).filter(|slope| *slope >= rate)
}

/// Whether at least half of the slopes [`theil_sen`] takes the median of (the pairs with
/// distinct times) reach `rate`, that is the upper middle one of them when sorted; counted in
/// O(n log n) by [`slope_count::count`], which answers as the pairwise loop does.
fn upper_middle_slope_reaches(points: &[(f64, f64)], rate: f64) -> bool {
    let (slopes, reaching) = slope_count::count(points, rate);
    slopes > 0 && reaching >= slopes - slopes / 2
}

/// Whether allocator readings cover `min_duration` with `min_windows` readings of `allocated`.
fn long_enough(points: &[AllocatorPoint], t: &MemoryGrowth) -> bool {
    let times: Vec<SystemTime> = points
        .iter()
        .filter(|p| p.allocated_bytes.is_some())
        .map(|p| p.at)
        .collect();
    let (Some(first), Some(last)) = (times.first(), times.last()) else {
        return false;
    };
    times.len() >= t.min_windows.max(3)
        && last
            .duration_since(*first)
            .is_ok_and(|span| span >= t.min_duration)
}

/// The trend of one allocator gauge, `None` when too short, flat or missing.
fn allocator_trend(
    points: &[AllocatorPoint],
    value: impl Fn(&AllocatorPoint) -> Option<u64>,
    t: &MemoryGrowth,
) -> Option<Trend> {
    let origin = points.first()?.at;
    let xy: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| {
            let v = value(p)?;
            Some((p.at.duration_since(origin).ok()?.as_secs_f64(), v as f64))
        })
        .collect();
    fit_points(xy.iter().copied(), origin, t)
        .filter(|trend| trend.slope >= t.min_rate_bytes_per_second)
}

/// Growth of the per-epoch peaks of `max_allocated` (the companion resets it at each epoch
/// start, so a drop starts a new epoch): the last [`RISING_EPOCHS`] peaks each higher than the
/// one before, spanning at least `min_duration`. Returns the rate and the span.
pub(crate) fn epoch_peak_growth(points: &[AllocatorPoint], t: &MemoryGrowth) -> Option<Trend> {
    let mut peaks: Vec<(SystemTime, u64)> = Vec::new();
    let mut previous: Option<u64> = None;
    for p in points {
        let Some(m) = p.max_allocated_bytes else {
            continue;
        };
        match (previous, peaks.last_mut()) {
            (Some(prev), Some(last)) if m >= prev => {
                if m >= last.1 {
                    *last = (p.at, m);
                }
            }
            _ => peaks.push((p.at, m)),
        }
        previous = Some(m);
    }
    let rising = peaks
        .windows(2)
        .rev()
        .take_while(|w| w[1].1 > w[0].1)
        .count();
    if rising < RISING_EPOCHS {
        return None;
    }
    let run = &peaks[peaks.len() - 1 - rising..];
    let (first, last) = (run[0], run[run.len() - 1]);
    let span = last.0.duration_since(first.0).ok()?.as_secs_f64();
    if span <= 0.0 || span < t.min_duration.as_secs_f64() {
        return None;
    }
    let slope = (last.1 - first.1) as f64 / span;
    (slope >= t.min_rate_bytes_per_second).then_some(Trend {
        slope,
        span_seconds: span,
        points: run.len(),
        rising_quarters: rising as u32,
        ends_at_max: true,
        first_start: first.0,
    })
}

/// The finding for a process whose allocator gauges gpulse received; see the module docs.
fn with_allocator(
    inputs: &Inputs<'_>,
    p: &ProcessWindow,
    points: &[AllocatorPoint],
    t: &MemoryGrowth,
) -> Option<Finding> {
    let latest = points.last()?;
    let subject = inputs.workload_subject(p.pid, Some(process_device_ref_in(inputs.window, p)));
    // On MIG, its instance's free memory: the only memory it can grow into.
    let room = memory_room(inputs, p);
    let free = room.and_then(|r| r.free);
    let place = room.map_or("device", |r| r.place());
    let mut values: Vec<(String, Value)> = Vec::new();
    if let Some(a) = latest.allocated_bytes {
        values.push(("allocated_bytes".into(), Value::from(a)));
    }
    if let Some(r) = latest.reserved_bytes {
        values.push(("reserved_bytes".into(), Value::from(r)));
    }
    let leak = allocator_trend(points, |p| p.allocated_bytes, t)
        .map(|trend| (trend, "allocated"))
        .or_else(|| epoch_peak_growth(points, t).map(|trend| (trend, "max_allocated_per_epoch")));
    if let Some((trend, signal)) = leak {
        let time_to_full = free.map(|f| f as f64 / trend.slope);
        let severity = match time_to_full {
            Some(s) if s < t.urgent_time_to_full.as_secs_f64() => Severity::Error,
            _ => Severity::Warning,
        };
        let full = match time_to_full {
            Some(s) => format!("{place} full in about {}", human_duration(s)),
            None => format!("{place} free memory unknown"),
        };
        let what = match signal {
            "allocated" => "live tensors (PyTorch allocated memory) grow",
            _ => "each epoch's peak of live tensors (max_allocated) rises",
        };
        let summary = format!(
            "{subject}: {what} {}/min over the last {} (allocated now {}): {full}",
            human_bytes(trend.slope * 60.0),
            human_duration(trend.span_seconds),
            human_bytes(latest.allocated_bytes.unwrap_or(0) as f64),
        );
        values.push((
            "allocated_growth_bytes_per_second".into(),
            Value::from(trend.slope),
        ));
        values.push(("growth_signal".into(), Value::from(signal)));
        values.push(("observed_seconds".into(), Value::from(trend.span_seconds)));
        if let Some(s) = time_to_full {
            values.push(("time_to_full_seconds".into(), Value::from(s)));
        }
        return Some(Finding {
            rule: RuleId::MemoryGrowth,
            related: Vec::new(),
            severity,
            subject,
            summary,
            advice: TENSOR_LEAK_ADVICE.to_string(),
            values,
            since: trend.first_start,
            evidence: vec![Layer::Nvml, Layer::Metrics],
        });
    }
    // Tensors are flat: growth of the reserve, or of NVML's figure (which includes it), is
    // caching.
    let caching = allocator_trend(points, |p| p.reserved_bytes, t).or_else(|| {
        inputs
            .history
            .series(p.pid, &p.device_uuid)
            .and_then(|series| fit(&series, t))
            .filter(|trend| trend.slope >= t.min_rate_bytes_per_second)
    })?;
    let summary = format!(
        "{subject}: PyTorch's reserved memory grows {}/min over the last {} while its live tensors stay at {}: the caching allocator, not a leak",
        human_bytes(caching.slope * 60.0),
        human_duration(caching.span_seconds),
        human_bytes(latest.allocated_bytes.unwrap_or(0) as f64),
    );
    values.push((
        "reserved_growth_bytes_per_second".into(),
        Value::from(caching.slope),
    ));
    values.push(("observed_seconds".into(), Value::from(caching.span_seconds)));
    Some(Finding {
        rule: RuleId::MemoryGrowth,
        related: Vec::new(),
        severity: Severity::Info,
        subject,
        summary,
        advice: CACHING_ADVICE.to_string(),
        values,
        since: caching.first_start,
        evidence: vec![Layer::Nvml, Layer::Metrics],
    })
}

/// Median of the slopes of all pairs with distinct times.
pub(crate) fn theil_sen(points: &[(f64, f64)]) -> Option<f64> {
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

/// Which of the four quarters of `span` from `t0` the time `t` falls in (0–3; the end of the
/// span is in the last).
fn quarter_of(t: f64, t0: f64, span: f64) -> usize {
    (((t - t0) / span) * 4.0).floor().clamp(0.0, 3.0) as usize
}

/// Over the four quarters of `span` from `t0`, each one's highest point: the number of points,
/// how many times a quarter with points is higher than the one before, and whether the last
/// is the highest.
fn quarters(points: impl Iterator<Item = (f64, f64)>, t0: f64, span: f64) -> (usize, u32, bool) {
    let mut highest = [f64::NEG_INFINITY; 4];
    let mut count = 0;
    for (t, m) in points {
        let q = quarter_of(t, t0, span);
        highest[q] = highest[q].max(m);
        count += 1;
    }
    let (rising, ends_at_max) = rising_quarters(highest);
    (count, rising, ends_at_max)
}

/// From each quarter's highest point (`-inf` for a quarter without points): how many times a
/// quarter with points is higher than the one before, and whether the last is the highest.
fn rising_quarters(highest: [f64; 4]) -> (u32, bool) {
    let (mut rising, mut overall, mut previous) = (0, f64::NEG_INFINITY, None);
    for m in highest.into_iter().filter(|m| m.is_finite()) {
        if previous.is_some_and(|p| m > p) {
            rising += 1;
        }
        overall = overall.max(m);
        previous = Some(m);
    }
    let ends_at_max = previous.is_some_and(|last| last >= overall);
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

    /// Allocator readings every 60 s for `n` minutes.
    fn allocator(
        n: u64,
        f: impl Fn(u64) -> (u64, u64, u64),
    ) -> Vec<crate::diagnosis::framework::AllocatorPoint> {
        (1..=n)
            .map(|i| {
                let (a, r, m) = f(i);
                crate::diagnosis::framework::AllocatorPoint {
                    at: t(i * 60),
                    allocated_bytes: Some(a),
                    reserved_bytes: Some(r),
                    max_allocated_bytes: Some(m),
                }
            })
            .collect()
    }

    fn with_allocator_points(
        mut f: Fixture,
        points: Vec<crate::diagnosis::framework::AllocatorPoint>,
    ) -> Fixture {
        let mut evidence = crate::diagnosis::framework::ProcessEvidence::default();
        evidence.allocator.insert("GPU-00000000".into(), points);
        f.framework.processes.insert(9, evidence);
        f
    }

    #[test]
    fn growing_tensors_are_a_leak_at_the_rate_of_allocated() {
        // NVML flat at 30 GiB (the reserve covers it); allocated +2 MiB/s.
        let f = history(20, |_| 30 * GIB);
        let f = with_allocator_points(
            f,
            allocator(20, |i| (10 * GIB + i * 120 * 1024 * 1024, 30 * GIB, 0)),
        );
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        let Some(Value::Float(rate)) = found[0].value("allocated_growth_bytes_per_second") else {
            panic!("no allocated growth in {:?}", found[0].values);
        };
        assert!((rate - 2.0 * MIB).abs() < 1.0, "rate {rate}");
        assert!(found[0].value("time_to_full_seconds").is_some());
        assert_eq!(found[0].severity, Severity::Warning);
        assert_eq!(found[0].evidence, vec![Layer::Nvml, Layer::Metrics]);
    }

    #[test]
    fn growing_reserve_with_flat_tensors_is_caching_not_a_leak() {
        // NVML grows 1 MiB/s, as does the reserve; the tensors stay at 10 GiB.
        let f = history(20, |i| 20 * GIB + i * 60 * 1024 * 1024);
        let f = with_allocator_points(
            f,
            allocator(20, |i| {
                (10 * GIB, 20 * GIB + i * 60 * 1024 * 1024, 11 * GIB)
            }),
        );
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].severity, Severity::Info);
        assert!(found[0].advice.contains("caching allocator, not a leak"));
        assert!(found[0].value("reserved_growth_bytes_per_second").is_some());
        assert!(found[0]
            .value("allocated_growth_bytes_per_second")
            .is_none());
    }

    #[test]
    fn flat_tensors_and_flat_reserve_say_nothing_even_when_nvml_steps() {
        let f = history(20, |i| if i < 10 { 20 * GIB } else { 30 * GIB });
        let f = with_allocator_points(f, allocator(20, |_| (10 * GIB, 20 * GIB, 12 * GIB)));
        assert!(evaluate(&f.inputs(), &MemoryGrowth::default()).is_empty());
    }

    #[test]
    fn rising_epoch_peaks_count_as_growth() {
        // Epochs of 4 minutes; allocated sampled between steps stays at 10 GiB, but each epoch's
        // peak is 1 GiB higher than the last. A flat peak would not count (see the next test).
        let f = history(20, |_| 30 * GIB);
        let f = with_allocator_points(
            f,
            allocator(20, |i| {
                let epoch = (i - 1) / 4;
                let within = (i - 1) % 4;
                // The companion resets the peak at each epoch start.
                let peak = if within == 0 {
                    10 * GIB
                } else {
                    12 * GIB + epoch * GIB + within * 1024
                };
                (10 * GIB, 30 * GIB, peak)
            }),
        );
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(
            found[0].value("growth_signal"),
            Some(&Value::from("max_allocated_per_epoch"))
        );
        // Peaks at minutes 4, 8, …, 20: 1 GiB per 4 minutes.
        let Some(Value::Float(rate)) = found[0].value("allocated_growth_bytes_per_second") else {
            panic!("no rate");
        };
        assert!((rate - GIB as f64 / 240.0).abs() < 1.0, "rate {rate}");
    }

    #[test]
    fn allocator_readings_too_short_to_judge_leave_the_nvml_verdict() {
        // 20 minutes of NVML growth; the job started sending its gauges 2 minutes ago.
        let f = history(20, |i| 20 * GIB + i * 60 * 1024 * 1024);
        let points = allocator(20, |_| (10 * GIB, 20 * GIB, 11 * GIB))
            .into_iter()
            .skip(18)
            .collect();
        let f = with_allocator_points(f, points);
        let found = evaluate(&f.inputs(), &MemoryGrowth::default());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].severity, Severity::Warning);
        assert_eq!(found[0].evidence, vec![Layer::Nvml]);
        assert!(found[0].value("growth_rate_bytes_per_second").is_some());
    }

    #[test]
    fn equal_epoch_peaks_are_not_growth() {
        let f = history(20, |_| 30 * GIB);
        let f = with_allocator_points(
            f,
            allocator(20, |i| {
                let peak = if (i - 1) % 4 == 0 { 10 * GIB } else { 12 * GIB };
                (10 * GIB, 30 * GIB, peak)
            }),
        );
        assert!(evaluate(&f.inputs(), &MemoryGrowth::default()).is_empty());
    }

    /// A small xorshift generator: a random test is the same on every run.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// The fit as it was before the series kept its maxima and its slope and the slopes were
    /// counted against the rate: a walk over every point for the gate, then the median of all
    /// the sample's slopes, the sample collected afresh (every `stride`-th summary by number,
    /// with `stride` the fewest that keeps it to `MAX_FIT_POINTS`), then the rate.
    fn walked_fit(series: &Series, t: &MemoryGrowth) -> Option<Trend> {
        let first = series.summaries().next()?;
        let points: Vec<(f64, f64)> = memory_points(series, first.end).collect();
        let (t0, last) = (points.first()?.0, points.last()?.0);
        let span = last - t0;
        if span <= 0.0 || span < t.min_duration.as_secs_f64() {
            return None;
        }
        let (count, rising_quarters, ends_at_max) = quarters(points.iter().copied(), t0, span);
        if count < t.min_windows.max(3) || rising_quarters < 2 || !ends_at_max {
            return None;
        }
        let stride = series.len().div_ceil(MAX_FIT_POINTS) as u64;
        let numbered: Vec<WindowSummary> = series
            .summaries()
            .zip(series.first_number()..)
            .filter(|(_, number)| number % stride == 0)
            .map(|(s, _)| s)
            .collect();
        let origin = numbered.first()?.end;
        let signed = |end: SystemTime| match end.duration_since(origin) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        };
        let sample: Vec<(f64, f64)> = numbered
            .iter()
            .filter_map(|s| Some((signed(s.end), s.gpu_memory_last_bytes? as f64)))
            .collect();
        assert!(sample.len() <= MAX_FIT_POINTS, "{} points", sample.len());
        let slope = theil_sen(&sample)?;
        (slope >= t.min_rate_bytes_per_second).then_some(Trend {
            slope,
            span_seconds: span,
            points: count,
            rising_quarters,
            ends_at_max,
            first_start: first.start,
        })
    }

    #[test]
    fn a_full_series_fits_its_slope_once_per_stride_not_each_window() {
        use crate::config::thresholds::HistoryLimits;
        use crate::diagnosis::history::History;

        // 720 windows a second apart of a steady 1 MiB/s leak, then 720 more: with the history
        // full (720 summaries, a stride of 8), the kept slope's sample changes every 8 windows.
        let mut history = History::new(HistoryLimits::default());
        let thresholds = MemoryGrowth::default();
        let (mut fits, mut found) = (0, 0);
        let mut previous = None;
        for i in 0..1440_u64 {
            let memory = 20 * GIB + i * (1 << 20);
            let p = process(9, 0, memory, Some(0.5));
            history.record(&window(1_000 + i, vec![device(0, 0.9, GIB)], vec![p]));
            let series = history.series(9, "GPU-00000000").expect("the series");
            let trend = fit(&series, &thresholds);
            assert_eq!(trend, walked_fit(&series, &thresholds), "window {i}");
            let kept = series.sampled_slope().get();
            if i >= 720 {
                let trend = trend.expect("a steady leak over a full history");
                assert!((trend.slope - MIB).abs() < 1.0, "window {i}: {trend:?}");
                found += 1;
                fits += usize::from(kept != previous);
            }
            previous = kept;
        }
        assert_eq!(found, 720);
        assert_eq!(
            fits,
            720 / 8,
            "the slope was fitted {fits} times in 720 windows"
        );
    }

    #[test]
    fn fit_from_kept_maxima_equals_a_walk_over_a_long_random_series() {
        use crate::config::thresholds::HistoryLimits;
        use crate::diagnosis::history::History;
        use std::time::Duration;

        // 3000 windows 1–20 s apart through a history of at most 150 summaries and 1 h, so
        // summaries leave it by count and by age; memory grows, stays flat (with steps) and
        // shrinks in turns of 400 windows, with noise, some windows without a memory reading
        // and a few wall-clock steps back. The reference is the whole walk without the counting
        // of slopes against the rate.
        let mut history = History::new(HistoryLimits {
            max_windows: 150,
            ..HistoryLimits::default()
        });
        let thresholds = MemoryGrowth {
            min_duration: Duration::from_secs(120),
            ..MemoryGrowth::default()
        };
        let mut next = xorshift(0x2545_f491_4f6c_dd1d_u64);
        let (mut at, mut memory) = (1_000_u64, 20 * GIB);
        let (mut trends, mut ruled_out, mut out_of_order) = (0, 0, 0);
        for i in 0..3000_u64 {
            let seconds = 1 + next() % 20;
            at = if next() % 200 == 0 {
                at - 30
            } else {
                at + seconds
            };
            let noise = next() % (4 << 20);
            memory = match (i / 400) % 3 {
                0 => memory + seconds * (1 << 20),
                1 if next() % 50 == 0 => memory + (next() % 4) * GIB,
                1 => memory,
                _ => memory.saturating_sub(seconds * (1 << 20)).max(GIB),
            };
            let mut p = process(9, 0, memory + noise, Some(0.5));
            // Every other 700 windows, so a full history with a point in every summary (the
            // subset taken by position) is tried too.
            if (i / 700) % 2 == 1 && next() % 13 == 0 {
                p.gpu_memory_bytes = None;
            }
            history.record(&window(at, vec![device(0, 0.9, GIB)], vec![p]));
            let series = history
                .series(9, "GPU-00000000")
                .expect("the process's series");
            let kept = fit(&series, &thresholds);
            assert_eq!(kept, walked_fit(&series, &thresholds), "window {i}");
            match kept {
                Some(_) => trends += 1,
                None if series.len() >= 150 => ruled_out += 1,
                None => {}
            }
            out_of_order += usize::from(!series.ends_in_order());
        }
        // Both answers, the fallback for times out of order, and a history that was full.
        assert!(trends > 300, "{trends} trends");
        assert!(ruled_out > 300, "{ruled_out} ruled out with a full history");
        assert!(
            out_of_order > 100,
            "{out_of_order} windows with times out of order"
        );
    }

    #[test]
    fn the_median_slope_reaches_a_rate_only_where_the_upper_middle_slope_does() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
        let (mut reached, mut not_reached) = (0, 0);
        for case in 0..2000 {
            // 2 to 40 points, some at the same time, around a slope near the rate.
            let n = 2 + (next() % 39) as usize;
            let slope = (next() % 3) as f64;
            let points: Vec<(f64, f64)> = (0..n)
                .map(|i| {
                    let t = (i as u64 - i as u64 % (1 + next() % 2)) as f64;
                    (t, slope * t + (next() % 1000) as f64 / 100.0)
                })
                .collect();
            let rate = 1.0 + (next() % 3) as f64 * 0.25;
            let gate = upper_middle_slope_reaches(&points, rate);
            let Some(median) = theil_sen(&points) else {
                assert!(!gate, "case {case}: no slopes, yet the gate passed");
                continue;
            };
            if median >= rate {
                assert!(
                    gate,
                    "case {case}: median {median} ≥ {rate} but the gate said no"
                );
                reached += 1;
            } else {
                not_reached += 1;
            }
        }
        assert!(
            reached > 300 && not_reached > 300,
            "{reached} / {not_reached}"
        );
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
