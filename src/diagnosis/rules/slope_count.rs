//! How many of a point set's pairwise slopes reach a rate: the count `memory_growth` takes
//! before a Theil–Sen median (the median reaches the rate only if half the slopes do), in
//! O(n log n) rather than one division per pair, and with the same answer as the pairwise loop
//! ([`pairwise`]) for every input.
//!
//! ## Why it is exact
//! For points in time order the slope of `a → b` reaches `rate` when `b.y − rate·b.t ≥ a.y −
//! rate·a.t`, so counting slopes is counting ordered pairs of `z = y − rate·t`, which a merge
//! sort does. Floating point makes the two tests disagree only for pairs whose `z` differ by
//! less than their rounding errors: the pairwise loop rounds `Δy`, `Δt` and their quotient
//! (relative error under 3.01 u, u = 2⁻⁵³), so its answer follows the exact sign of `Δz` once
//! `|Δz| > 6.02 u·max|y|`, and each computed `z` is within `u·(|y| + 2.01 |rate·t|)` of the exact
//! one. Pairs whose computed `z` are more than [`margin`] (32 u of the largest `|y| + |rate·t|`,
//! more than twice the sum of those bounds) apart are therefore decided by `z` as the loop
//! decides them; the pairs within it, none on noisy data and every pair on an exact line at the
//! rate, are decided by the loop's own division. Points out of time order, or figures outside
//! the range where that error model holds, take the pairwise loop itself.

/// `(slopes, reaching)`: the number of pairs `i < j` with `points[j].0 > points[i].0` (distinct,
/// increasing times), and how many of those have `(yj − yi) / (tj − ti) >= rate`.
pub(crate) fn count(points: &[(f64, f64)], rate: f64) -> (usize, usize) {
    let in_time_order = points.windows(2).all(|w| w[0].0 <= w[1].0);
    let Some(margin) = margin(points, rate).filter(|_| in_time_order) else {
        return pairwise(points, rate);
    };
    let reaches = |i: usize, j: usize| {
        let (a, b) = (points[i], points[j]);
        (b.1 - a.1) / (b.0 - a.0) >= rate
    };
    let mut by_z: Vec<(f64, usize)> = points
        .iter()
        .enumerate()
        .map(|(i, &(t, y))| (y - rate * t, i))
        .collect();
    let mut scratch = by_z.clone();
    // Pairs i < j with z_j clearly above z_i, whatever their times.
    let mut reaching = clearly_rising(&mut by_z, &mut scratch, margin);
    // `by_z` is now sorted by z: the pairs within the margin of each other are neighbours there.
    for (k, &(low, a)) in by_z.iter().enumerate() {
        for &(high, b) in &by_z[k + 1..] {
            if high > low + margin {
                break;
            }
            let (i, j) = (a.min(b), a.max(b));
            if points[j].0 > points[i].0 && reaches(i, j) {
                reaching += 1;
            }
        }
    }
    // Pairs at the same time are no slope: take back those counted as clearly rising.
    let z = |i: usize| points[i].1 - rate * points[i].0;
    let mut slopes = points.len() * points.len().saturating_sub(1) / 2;
    let mut run_start = 0;
    for end in 1..=points.len() {
        if end < points.len() && points[end].0 == points[run_start].0 {
            continue;
        }
        for i in run_start..end {
            for j in i + 1..end {
                slopes -= 1;
                reaching -= usize::from(z(j) > z(i) + margin);
            }
        }
        run_start = end;
    }
    (slopes, reaching)
}

/// The band within which two computed `z` may disagree with the pairwise loop: 2⁻⁴⁸ of the
/// largest `|y| + |rate·t|`. `None` where the error model does not hold (a figure not finite,
/// or so large or small that a product or quotient could overflow or fall subnormal).
fn margin(points: &[(f64, f64)], rate: f64) -> Option<f64> {
    const LARGEST: f64 = 1e100;
    const SMALLEST: f64 = 1e-100;
    let usable = |x: f64| x.is_finite() && (x == 0.0 || (SMALLEST..=LARGEST).contains(&x.abs()));
    if !usable(rate) || !points.iter().all(|&(t, y)| usable(t) && usable(y)) {
        return None;
    }
    let scale = points
        .iter()
        .map(|&(t, y)| y.abs() + (rate * t).abs())
        .fold(0.0, f64::max);
    // Time differences so small that the quotient leaves the model: take the loop.
    let smallest_step = points
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .filter(|dt| *dt > 0.0)
        .fold(f64::INFINITY, f64::min);
    if smallest_step < SMALLEST {
        return None;
    }
    Some(scale * 2f64.powi(-48) + f64::MIN_POSITIVE)
}

/// Sorts `items` by z (stably, as a merge sort) and returns the number of index-ordered pairs
/// whose later z exceeds the earlier by more than `margin`: in each merge, for each element of
/// the right half, how many of the left half lie more than `margin` below it.
fn clearly_rising(items: &mut [(f64, usize)], scratch: &mut [(f64, usize)], margin: f64) -> usize {
    let n = items.len();
    if n < 2 {
        return 0;
    }
    let mid = n / 2;
    let mut pairs = {
        let (left, right) = items.split_at_mut(mid);
        let (left_scratch, right_scratch) = scratch.split_at_mut(mid);
        clearly_rising(left, left_scratch, margin) + clearly_rising(right, right_scratch, margin)
    };
    let (left, right) = items.split_at(mid);
    let mut below = 0;
    for &(z, _) in right {
        while below < left.len() && left[below].0 + margin < z {
            below += 1;
        }
        pairs += below;
    }
    let (mut l, mut r) = (0, 0);
    for slot in scratch.iter_mut().take(n) {
        let take_left = r == right.len() || (l < left.len() && left[l].0 <= right[r].0);
        if take_left {
            *slot = left[l];
            l += 1;
        } else {
            *slot = right[r];
            r += 1;
        }
    }
    items.copy_from_slice(&scratch[..n]);
    pairs
}

/// The definition: every pair, one division each.
pub(crate) fn pairwise(points: &[(f64, f64)], rate: f64) -> (usize, usize) {
    let (mut slopes, mut reaching) = (0_usize, 0_usize);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            let dt = b.0 - a.0;
            if dt > 0.0 {
                slopes += 1;
                reaching += usize::from((b.1 - a.1) / dt >= rate);
            }
        }
    }
    (slopes, reaching)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small xorshift generator: a random test is the same on every run.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn counts_as_the_pairwise_loop_on_noisy_exact_tied_and_unordered_points() {
        let mut next = xorshift(0x853c_49e6_748f_ea9b);
        let mut fast_paths = 0;
        for case in 0..4000 {
            let n = (next() % 120) as usize;
            let shape = next() % 6;
            let rate = match next() % 4 {
                0 => 0.0,
                1 => (1 << 20) as f64 / 60.0,
                2 => (next() % 1000) as f64 * 1e3,
                _ => 1.0 / 3.0,
            };
            let mut t = 1.0e3 + (next() % 1000) as f64 * 0.37;
            let points: Vec<(f64, f64)> = (0..n)
                .map(|i| {
                    // Steps of a second with jitter; sometimes the same time twice, or (shape 5)
                    // a step back.
                    match next() % 10 {
                        0 => {}
                        1 if shape == 5 => t -= 2.5,
                        _ => t += 1.0 + (next() % 1000) as f64 * 1e-4,
                    }
                    let y = match shape {
                        // Exactly on a line at the rate: every slope within rounding of it.
                        0 => 8.0e9 + rate * t,
                        1 => (8.0e9 + rate * t).round(),
                        // Flat with noise, as a training job's memory.
                        2 => 9.0e9 + (next() % (64 << 20)) as f64,
                        // Growth above the rate with noise.
                        3 => 2.0e9 + 2.0 * rate * t + (next() % (4 << 20)) as f64,
                        // Few distinct values: many equal z.
                        4 => ((next() % 3) as f64) * (1 << 20) as f64,
                        _ => (i as f64 * 1e6) + (next() % 1000) as f64,
                    };
                    (t, y)
                })
                .collect();
            fast_paths += usize::from(
                margin(&points, rate).is_some() && points.windows(2).all(|w| w[0].0 <= w[1].0),
            );
            assert_eq!(
                count(&points, rate),
                pairwise(&points, rate),
                "case {case}: shape {shape}, rate {rate}, {n} points"
            );
        }
        assert!(fast_paths > 3000, "{fast_paths} cases on the sorted path");
    }

    #[test]
    fn pairs_at_the_same_time_are_no_slope() {
        let points = [(1.0, 0.0), (1.0, 5.0), (2.0, 10.0), (2.0, 0.0)];
        // Slopes: 10, 0, 5, -5 from the four cross pairs.
        assert_eq!(count(&points, 0.0), (4, 3));
        assert_eq!(count(&points, 6.0), (4, 1));
        assert_eq!(count(&[(3.0, 1.0); 5], 0.0), (0, 0));
        assert_eq!(count(&[], 1.0), (0, 0));
    }

    #[test]
    fn figures_outside_the_error_model_take_the_pairwise_loop() {
        assert_eq!(margin(&[(0.0, f64::NAN)], 1.0), None);
        assert_eq!(margin(&[(0.0, 1.0)], 1e300), None);
        assert_eq!(margin(&[(1.0e-100, 1.0), (1.5e-100, 2.0)], 1.0), None);
        let points = [(0.0, 1.0), (1.0, f64::INFINITY), (2.0, 3.0)];
        assert_eq!(count(&points, 1.0), pairwise(&points, 1.0));
    }
}
