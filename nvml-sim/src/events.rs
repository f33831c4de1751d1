//! Event sets: which devices and event types a client registered, and delivery of the scenario's
//! timeline through them. A wait returns the next registered event whose time has come, or
//! sleeps (never spins) until one is due or the timeout passes.
//!
//! As with the driver, an event is only delivered to a set registered for it before it
//! happened, and each set delivers each event once. The sets a client holds open are
//! process-wide, as the driver's are; the compiled simulation (`model`) knows nothing of them.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::abi::{self, Ret};
use crate::model::Sim;

/// The sets the client has created and not yet freed. A handful at most, so a list.
static OPEN_SETS: Mutex<Vec<Arc<EventSet>>> = Mutex::new(Vec::new());

/// Creates a set and returns it; its address is the client's handle.
pub fn create() -> Arc<EventSet> {
    let set = Arc::new(EventSet::default());
    open_sets().push(Arc::clone(&set));
    set
}

/// The open set whose handle (address) is `handle`.
pub fn lookup(handle: usize) -> Option<Arc<EventSet>> {
    open_sets()
        .iter()
        .find(|set| Arc::as_ptr(set) as usize == handle)
        .cloned()
}

/// Frees the set whose handle is `handle`; `false` when no such set is open. A wait running
/// on another thread keeps its own reference and finishes normally.
pub fn free(handle: usize) -> bool {
    let mut sets = open_sets();
    let before = sets.len();
    sets.retain(|set| Arc::as_ptr(set) as usize != handle);
    sets.len() != before
}

fn open_sets() -> std::sync::MutexGuard<'static, Vec<Arc<EventSet>>> {
    OPEN_SETS.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct Registration {
    device: u32,
    mask: u64,
    since: f64,
}

#[derive(Debug, Default)]
struct SetState {
    registrations: Vec<Registration>,
    /// Index into `Sim::events` of the first event not yet delivered or skipped.
    cursor: usize,
    /// Bumped by every registration, so a waiter knows its view of the set is stale.
    generation: u64,
}

/// One `nvmlEventSet_t`.
#[derive(Debug, Default)]
pub struct EventSet {
    state: Mutex<SetState>,
    /// Wakes waiters when a registration changes what they wait for. Otherwise a wait sleeps
    /// until the next due event or its timeout, as the driver blocks in the kernel: a waiting
    /// client costs no CPU, so benchmarks of a client are not inflated by the simulator.
    registered: Condvar,
}

/// An event handed to the client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivered {
    pub device: u32,
    pub event_type: u64,
    pub data: u64,
}

impl EventSet {
    /// Registers `mask` for `device` from time `t` on.
    pub fn register(&self, device: u32, mask: u64, t: f64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.registrations.iter_mut().find(|r| r.device == device) {
            // Keep the original `since` for types already registered; new types count from now.
            Some(r) if r.mask & mask == mask => {}
            Some(r) => {
                r.mask |= mask;
                r.since = t;
            }
            None => st.registrations.push(Registration {
                device,
                mask,
                since: t,
            }),
        }
        st.generation += 1;
        drop(st);
        self.registered.notify_all();
    }

    /// The next due event at time `t`, or the time of the next one that will become due.
    fn poll(&self, sim: &Sim, t: f64) -> Result<Delivered, Option<f64>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = |st: &SetState, i: usize| {
            let e = &sim.events[i];
            st.registrations
                .iter()
                .any(|r| r.device == e.device && r.mask & e.event_type != 0 && e.at >= r.since)
        };
        while st.cursor < sim.events.len() {
            let i = st.cursor;
            if sim.events[i].at > t {
                break;
            }
            st.cursor += 1;
            if wanted(&st, i) {
                let e = sim.events[i];
                return Ok(Delivered {
                    device: e.device,
                    event_type: e.event_type,
                    data: e.data,
                });
            }
        }
        let next = (st.cursor..sim.events.len())
            .find(|&i| wanted(&st, i))
            .map(|i| sim.events[i].at);
        Err(next)
    }

    /// Waits up to `timeout_ms` (real milliseconds) for the next event.
    pub fn wait(&self, sim: &Sim, timeout_ms: u32) -> Result<Delivered, Ret> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        loop {
            let seen = self.generation();
            let t = sim.clock.now();
            let next = match self.poll(sim, t) {
                Ok(d) => return Ok(d),
                Err(next) => next,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(abi::TIMEOUT);
            }
            let until_event = next.map_or(Duration::MAX, |at| sim.clock.real_duration(at - t));
            let nap = (deadline - now)
                .min(until_event)
                .max(Duration::from_micros(200));
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let _ = self
                .registered
                .wait_timeout_while(st, nap, |st| st.generation == seen);
        }
    }

    fn generation(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }
}
