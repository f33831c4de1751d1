//! `MaxQueue`: a first-in-first-out queue of optional `u64` readings (one per history summary)
//! that gives the largest reading of any run of consecutive positions in O(log n), so a trend
//! rule can take the maximum of a stretch of a long history without walking it.
//!
//! It is a segment tree over a ring: leaf `slot` holds the reading at that ring slot and each
//! inner node the larger of its two children. A push or a pop rewrites one leaf and its
//! ancestors; a push into a full ring first rebuilds it at twice the size (amortised O(1) per
//! push, as a `VecDeque` grows). Memory is 16 bytes per ring slot: 16 to 32 bytes per reading.
//!
//! `SlidingMax`: the largest positive `f64` reading of the whole queue only (no stretches), as a
//! monotonic deque: amortised O(1) per push and pop, and as many entries as there are readings
//! larger than every newer one (one for a steady or rising signal, the whole history only for a
//! strictly falling one).

use std::collections::VecDeque;
use std::ops::Range;

/// A leaf or node with no reading under it. A reading is stored as `value + 1`, saturating: the
/// largest two values (both over 18 EB) become one, and both are the same `f64`, 2^64, which is
/// all the trend rules compare.
const NO_READING: u64 = 0;

fn stored(reading: Option<u64>) -> u64 {
    reading.map_or(NO_READING, |value| value.saturating_add(1))
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct MaxQueue {
    /// `2 × capacity` nodes (capacity a power of two, or 0): the root at 1, node `i`'s children
    /// at `2i` and `2i + 1`, the leaf of ring slot `s` at `capacity + s`.
    nodes: Vec<u64>,
    /// Ring slot of position 0, the oldest reading.
    head: usize,
    len: usize,
}

impl MaxQueue {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Bytes of its node array on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<u64>()
    }

    fn capacity(&self) -> usize {
        self.nodes.len() / 2
    }

    /// Appends a reading (or its absence) as the newest position.
    pub(crate) fn push_back(&mut self, reading: Option<u64>) {
        if self.len == self.capacity() {
            self.grow();
        }
        let slot = (self.head + self.len) & (self.capacity() - 1);
        self.set(slot, stored(reading));
        self.len += 1;
    }

    /// Drops the oldest position; nothing when empty.
    pub(crate) fn pop_front(&mut self) {
        if self.len == 0 {
            return;
        }
        self.set(self.head, NO_READING);
        self.head = (self.head + 1) & (self.capacity() - 1);
        self.len -= 1;
    }

    /// The largest reading among the positions `range` (0 the oldest), `None` when none of them
    /// holds one. Positions past the end hold none.
    pub(crate) fn max(&self, range: Range<usize>) -> Option<u64> {
        let range = range.start..range.end.min(self.len);
        if range.is_empty() {
            return None;
        }
        let capacity = self.capacity();
        let start = (self.head + range.start) & (capacity - 1);
        let end = start + range.len();
        let best = if end <= capacity {
            self.max_of_slots(start, end)
        } else {
            // The run wraps round the ring's end.
            self.max_of_slots(start, capacity)
                .max(self.max_of_slots(0, end - capacity))
        };
        best.checked_sub(1)
    }

    /// The largest stored node over ring slots `lo..hi`, bottom-up: at each level the nodes at
    /// the run's ragged ends are taken on their own and the rest left to their parents.
    fn max_of_slots(&self, lo: usize, hi: usize) -> u64 {
        let capacity = self.capacity();
        let (mut lo, mut hi) = (lo + capacity, hi + capacity);
        let mut best = NO_READING;
        while lo < hi {
            if lo & 1 == 1 {
                best = best.max(self.nodes[lo]);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                best = best.max(self.nodes[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
        best
    }

    /// Writes a leaf and brings its ancestors up to date.
    fn set(&mut self, slot: usize, value: u64) {
        let mut node = self.capacity() + slot;
        self.nodes[node] = value;
        while node > 1 {
            node /= 2;
            self.nodes[node] = self.nodes[2 * node].max(self.nodes[2 * node + 1]);
        }
    }

    /// Doubles the ring (at least 4 slots), its readings moved to slots `0..len`.
    fn grow(&mut self) {
        let old_capacity = self.capacity();
        let capacity = (old_capacity * 2).max(4);
        let mut nodes = vec![NO_READING; 2 * capacity];
        for position in 0..self.len {
            let slot = (self.head + position) & (old_capacity - 1);
            nodes[capacity + position] = self.nodes[old_capacity + slot];
        }
        for node in (1..capacity).rev() {
            nodes[node] = nodes[2 * node].max(nodes[2 * node + 1]);
        }
        self.nodes = nodes;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// A small xorshift generator: the test is the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn naive_max(readings: &VecDeque<Option<u64>>, range: Range<usize>) -> Option<u64> {
        readings
            .iter()
            .skip(range.start)
            .take(range.len())
            .flatten()
            .copied()
            .max()
    }

    #[test]
    fn every_run_has_the_maximum_a_walk_finds_through_pushes_pops_and_growth() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut queue = MaxQueue::default();
        let mut readings: VecDeque<Option<u64>> = VecDeque::new();
        let mut checked_with_reading = 0;
        for step in 0..3000 {
            // Mostly pushes early (so the ring grows and wraps), balanced later.
            let push = readings.is_empty() || rng.next() % 100 < if step < 1500 { 70 } else { 50 };
            if push {
                let reading = match rng.next() % 10 {
                    0 => None,
                    1 => Some(u64::MAX),
                    2 => Some(0),
                    _ => Some(rng.next() % 1000),
                };
                queue.push_back(reading);
                readings.push_back(reading);
            } else {
                queue.pop_front();
                readings.pop_front();
            }
            assert_eq!(queue.len(), readings.len());
            let n = readings.len();
            for _ in 0..4 {
                let a = (rng.next() as usize) % (n + 1);
                let b = a + (rng.next() as usize) % (n + 1 - a);
                let expected = naive_max(&readings, a..b);
                assert_eq!(
                    queue.max(a..b),
                    expected.map(|v| v.min(u64::MAX - 1)),
                    "{a}..{b} at step {step}"
                );
                checked_with_reading += usize::from(expected.is_some());
            }
            assert_eq!(
                queue.max(0..n),
                naive_max(&readings, 0..n).map(|v| v.min(u64::MAX - 1))
            );
        }
        assert!(
            checked_with_reading > 5000,
            "only {checked_with_reading} runs held a reading"
        );
    }

    #[test]
    fn empty_runs_and_runs_past_the_end_are_handled() {
        let mut queue = MaxQueue::default();
        assert_eq!(queue.max(0..0), None);
        assert_eq!(queue.max(0..5), None);
        queue.pop_front();
        queue.push_back(Some(7));
        queue.push_back(None);
        queue.push_back(Some(3));
        assert_eq!(queue.max(1..2), None, "a position without a reading");
        assert_eq!(queue.max(1..9), Some(3), "clipped to the end");
        assert_eq!(queue.max(2..2), None);
        queue.pop_front();
        assert_eq!(queue.max(0..2), Some(3));
    }
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlidingMax {
    /// (position counted from the first push, reading), readings strictly falling front to back.
    candidates: VecDeque<(u64, f64)>,
    /// Position of the next push, and of the oldest position still held.
    next: u64,
    oldest: u64,
}

impl SlidingMax {
    /// Appends a reading as the newest position; `None`, zero, negative and NaN readings take a
    /// position and can never be the maximum (the rule's fold starts at 0.0 and skips NaN).
    pub(crate) fn push_back(&mut self, reading: Option<f64>) {
        if let Some(value) = reading.filter(|v| *v > 0.0) {
            while self.candidates.back().is_some_and(|&(_, v)| v <= value) {
                self.candidates.pop_back();
            }
            self.candidates.push_back((self.next, value));
        }
        self.next += 1;
    }

    /// Drops the oldest position; nothing when empty.
    pub(crate) fn pop_front(&mut self) {
        if self.oldest == self.next {
            return;
        }
        if self
            .candidates
            .front()
            .is_some_and(|&(at, _)| at == self.oldest)
        {
            self.candidates.pop_front();
        }
        self.oldest += 1;
    }

    /// The largest positive reading held, 0.0 when there is none.
    pub(crate) fn max(&self) -> f64 {
        self.candidates.front().map_or(0.0, |&(_, v)| v)
    }

    /// Bytes of its deque on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.candidates.capacity() * std::mem::size_of::<(u64, f64)>()
    }
}

#[cfg(test)]
mod sliding_max_tests {
    use super::SlidingMax;

    /// Against the fold it replaces, over random pushes and pops of a bounded window.
    #[test]
    fn matches_a_fold_over_the_window() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut queue = SlidingMax::default();
        let mut window: std::collections::VecDeque<Option<f64>> = Default::default();
        for _ in 0..20_000 {
            let r = next();
            let reading = match r % 7 {
                0 => None,
                1 => Some(-1.0),
                2 => Some(f64::NAN),
                _ => Some((r >> 8) as f64 % 1000.0),
            };
            queue.push_back(reading);
            window.push_back(reading);
            while window.len() > 1 + (r >> 40) as usize % 50 {
                queue.pop_front();
                window.pop_front();
            }
            let fold = window.iter().flatten().fold(0.0, |a: f64, &b| a.max(b));
            assert_eq!(queue.max(), fold);
        }
    }
}
