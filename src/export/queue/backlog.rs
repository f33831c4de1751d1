//! The lanes' backlog: one FIFO per signal with its retry state, the shared byte total, and the
//! eviction policy (oldest first across lanes, never a request in flight), free of locks and
//! clocks so that it is tested as plain data.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::{lane_index, Count};
use crate::export::transport::{EncodedRequest, Signal};

/// One queued request.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// Increasing with push order across all lanes: the global age order eviction follows.
    pub(super) id: u64,
    pub(super) signal: Signal,
    pub(super) request: EncodedRequest,
    pub(super) created_at: Instant,
    /// An attempt is under way: neither evicted nor expired until it ends.
    pub(super) in_flight: bool,
}

/// One signal's FIFO and its retry state.
#[derive(Debug, Default)]
pub(super) struct Lane {
    pub(super) entries: VecDeque<Entry>,
    /// Retries since the last success, for the backoff's growth.
    pub(super) attempt: u32,
    /// Paused after a retryable failure until then.
    pub(super) resume_at: Option<Instant>,
    pub(super) delivered: Count,
    /// Encoded bytes of `entries`, and how many of them are in flight: kept as they change so
    /// that reading them (every intake request does) costs nothing.
    pub(super) bytes: usize,
    pub(super) in_flight: usize,
}

impl Lane {
    /// The first entry no attempt is under way for.
    pub(super) fn first_idle(&self) -> Option<usize> {
        self.entries.iter().position(|e| !e.in_flight)
    }
}

/// The lanes and their shared byte total: the eviction policy, free of locks and clocks.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    pub(super) lanes: [Lane; 3],
    pub(super) bytes: usize,
}

impl Backlog {
    pub(super) fn lane(&self, signal: Signal) -> &Lane {
        &self.lanes[lane_index(signal)]
    }

    pub(super) fn lane_mut(&mut self, signal: Signal) -> &mut Lane {
        &mut self.lanes[lane_index(signal)]
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.lanes.iter().flat_map(|lane| lane.entries.iter())
    }

    pub(super) fn len(&self) -> usize {
        self.lanes.iter().map(|lane| lane.entries.len()).sum()
    }

    pub(super) fn remove_at(&mut self, lane: usize, index: usize) -> Option<Entry> {
        let lane = &mut self.lanes[lane];
        let entry = lane.entries.remove(index)?;
        lane.bytes -= entry.request.len();
        lane.in_flight -= usize::from(entry.in_flight);
        self.bytes -= entry.request.len();
        Some(entry)
    }

    /// Marks the oldest idle entry of `signal` in flight and returns a copy to send.
    pub(super) fn claim(&mut self, signal: Signal) -> Option<Entry> {
        let lane = self.lane_mut(signal);
        let index = lane.first_idle()?;
        lane.in_flight += 1;
        let entry = &mut lane.entries[index];
        entry.in_flight = true;
        Some(entry.clone())
    }

    /// Ends the attempt for `id`: removes it when `done` (delivered or refused for good), else
    /// leaves it queued, in its place, for a retry.
    pub(super) fn settle(&mut self, signal: Signal, id: u64, done: bool) {
        let lane = lane_index(signal);
        let Some(index) = self.lanes[lane].entries.iter().position(|e| e.id == id) else {
            return;
        };
        if done {
            self.remove_at(lane, index);
        } else if self.lanes[lane].entries[index].in_flight {
            self.lanes[lane].entries[index].in_flight = false;
            self.lanes[lane].in_flight -= 1;
        }
    }

    /// Drops entries older than `max_age`, except those in flight. A lane is in age order, so
    /// each is read from the front until the first young idle entry.
    pub(super) fn expire(&mut self, now: Instant, max_age: Duration) -> Count {
        let mut dropped = Count::default();
        for lane in 0..self.lanes.len() {
            let mut index = 0;
            while let Some(entry) = self.lanes[lane].entries.get(index) {
                if entry.in_flight {
                    index += 1;
                    continue;
                }
                if now.saturating_duration_since(entry.created_at) <= max_age {
                    break;
                }
                let entry = self
                    .remove_at(lane, index)
                    .expect("index checked just above");
                dropped.add(Count::one(&entry.request));
            }
        }
        dropped
    }

    /// The lane and index of the oldest entry not in flight, over all lanes.
    pub(super) fn oldest_idle(&self) -> Option<(usize, usize)> {
        (0..self.lanes.len())
            .filter_map(|lane| {
                let index = self.lanes[lane].first_idle()?;
                Some((self.lanes[lane].entries[index].id, lane, index))
            })
            .min()
            .map(|(_, lane, index)| (lane, index))
    }

    /// Appends `entry` to its lane, dropping idle entries while the shared bound would be
    /// passed: the oldest of its own lane first, then the oldest of any lane. Own lane first,
    /// so that gpulse's metrics, pushed every window, push out their own old windows rather than
    /// the spans the receiver accepted (which it admits only below the bound, leaving room, see
    /// `crate::commands::receivers`). An entry alone over the bound is refused and counted.
    pub(super) fn push(&mut self, entry: Entry, max_bytes: usize) -> (bool, Count) {
        let mut dropped = Count::default();
        let len = entry.request.len();
        if len > max_bytes {
            dropped.add(Count::one(&entry.request));
            return (false, dropped);
        }
        let own = lane_index(entry.signal);
        while self.bytes + len > max_bytes {
            let own_oldest = self.lanes[own].first_idle().map(|index| (own, index));
            let Some((lane, index)) = own_oldest.or_else(|| self.oldest_idle()) else {
                break;
            };
            let old = self.remove_at(lane, index).expect("found just above");
            dropped.add(Count::one(&old.request));
        }
        self.bytes += len;
        let lane = self.lane_mut(entry.signal);
        lane.bytes += len;
        lane.entries.push_back(entry);
        (true, dropped)
    }
}
