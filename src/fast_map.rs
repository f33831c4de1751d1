//! The hash map and set of the per-window hot paths (attribution, accounting, diagnosis's
//! history, the sampler's per-device bookkeeping): std's `HashMap` with foldhash's hasher in
//! place of SipHash. A leaf: it imports nothing of gpulse, so every stage may use it.
//!
//! SipHash was 13 % of gpulse's instructions at a 1 s sample with a 1 s export on 8 GPUs × 64
//! processes (callgrind, in the git history of BENCHMARKS.md), spent on PIDs, GPU UUIDs and workload names hashed a
//! few thousand times a window. foldhash's `fast::RandomState` is seeded once per process
//! (address-space layout, time, an allocation's address), so a set of colliding keys cannot
//! be computed ahead for every gpulse; it is weaker against a caller who can probe one
//! process's hashing than SipHash, which is why maps keyed by what applications send to the
//! OTLP receivers stay on std's `HashMap` unless a profile shows them hot.

use std::collections::{HashMap, HashSet};

/// The hasher of [`FastMap`] and [`FastSet`]: randomly seeded per process.
pub(crate) type FastState = foldhash::fast::RandomState;

/// A `HashMap` hashed with foldhash (see the module doc). Build one with `FastMap::default()`
/// or `FastMap::with_capacity_and_hasher(n, FastState::default())`.
pub(crate) type FastMap<K, V> = HashMap<K, V, FastState>;

/// A `HashSet` hashed with foldhash (see the module doc).
pub(crate) type FastSet<T> = HashSet<T, FastState>;
