//! The ledger: each second a process holds a GPU, and the energy it is charged, lands in exactly
//! one **cause**, so that a GPU bill can say what was lost and to what.
//!
//! Per export window, process and device, the accountant ([`super::accounting`]) gives the held
//! time `H`, the activity `a` (the share of the window the GPU was busy with the process's work,
//! `None` where not knowable) and the charged energy `E`. The training loop, through the PyTorch
//! companion's `step` spans, gives the process's **step phases** ([`StepPhases`]: whether it is
//! inside its training loop, and which share of its step time it waits on its DataLoader and in
//! collectives); `rank_straggler` names the rank a job's others wait for. The causes:
//!
//! | cause | the held time |
//! | --- | --- |
//! | `compute` | the GPU busy with the process's work (`a × H`) and not already a wait below |
//! | `input_wait` | inside steps, the loop blocked on its DataLoader (`data_wait` spans) |
//! | `collective_wait` | inside steps, a torch.distributed collective in flight, while no rank is named the cause |
//! | `straggler_wait` | the same, while `rank_straggler` names another rank of its job as the one all wait for (the rank is recorded) |
//! | `host` | inside steps, the rest: the GPU not busy while the host prepares, launches or synchronises |
//! | `unused` | held outside any step, or, with no step spans, held while the GPU is not busy with it |
//! | `unknown` | held where the activity is not knowable and no wait explains the time |
//!
//! **The one rule where they overlap**: the loop's measured waits first (collective, then input),
//! then the busy time as compute, then, inside steps, host, and unused for what is left. Waits come
//! first because NVML counts a collective's kernels spinning while they wait for a slow rank as
//! busy time, and the tail of kernels queued before a data wait too: busy time cannot tell those
//! from useful work, the loop's own timing can. So
//!
//! ```text
//! W_c = collective share × H,  W_i = input share × H   (scaled down to H together)
//! compute = min(a × H, H − W_c − W_i)
//! host    = in_step × H − W_c − W_i − compute          (not below 0)
//! unused  = H − W_c − W_i − compute − host
//! ```
//!
//! and without knowable activity, `compute`, `host` and `unused` are one `unknown`. The causes
//! therefore add up to `H` by construction. A process without step spans gets only `compute`,
//! `unused` and `unknown`.
//!
//! **Energy** follows busy time, as the accountant charges it: `E / (a × H)` per busy second.
//! `compute` gets the busy seconds it holds; busy seconds the waits took (`a × H − compute`, the
//! spinning collective, the queued tail) go to the waits in the same order (collective, then
//! input). `host` and `unused` are charged none: the GPU's idle power stays the device's
//! unattributed energy. The causes' energy adds up to `E`.
//!
//! `unused` is not the accountant's `idle` state (a window whose activity stayed below 5 %,
//! [`TimeState`]): a process busy 35 % of the time it holds a GPU has 65 % unused and no idle
//! window. The cause was called `idle` before issue 49; one word had two meanings side by side.
//!
//! Each window's time also keeps the accountant's state (`active`, `idle`, `unknown` by the
//! window's activity), so that `process.gpu.time` can carry both attributes and summing over the
//! cause gives today's series by state. The book ([`CauseBook`]) keeps totals per process and
//! device since the accountant's `since`, and per job, pod and container (in GPU-hours, kWh and
//! cost, as the accountant's roll-ups), forgetting what the accountant forgets.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use serde::Serialize;

use super::accounting::{
    cost, groups_of, Accounts, GroupKind, Prices, ProcessAccount, ACTIVE_THRESHOLD,
};
use super::by_process::ByProcess;
use super::workload::Workload;
use crate::fast_map::{FastMap, FastSet};

/// Where a held second goes. See the module documentation for each definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Compute,
    InputWait,
    CollectiveWait,
    StragglerWait,
    Host,
    Unused,
    Unknown,
}

impl Cause {
    pub const ALL: [Cause; 7] = [
        Cause::Compute,
        Cause::InputWait,
        Cause::CollectiveWait,
        Cause::StragglerWait,
        Cause::Host,
        Cause::Unused,
        Cause::Unknown,
    ];

    /// The value of `gpulse.gpu.cause`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::Compute => "compute",
            Cause::InputWait => "input_wait",
            Cause::CollectiveWait => "collective_wait",
            Cause::StragglerWait => "straggler_wait",
            Cause::Host => "host",
            Cause::Unused => "unused",
            Cause::Unknown => "unknown",
        }
    }

    /// Causes a fix could remove (what the savings figures are given for).
    pub const fn is_avoidable_wait(self) -> bool {
        matches!(self, Cause::InputWait | Cause::StragglerWait)
    }
}

/// The accountant's state of a window: its activity reached [`ACTIVE_THRESHOLD`], stayed below,
/// or was not knowable (`gpulse.gpu.time.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeState {
    Active,
    Idle,
    Unknown,
}

impl TimeState {
    pub fn of(activity: Option<f64>) -> Self {
        match activity {
            Some(a) if a >= ACTIVE_THRESHOLD => TimeState::Active,
            Some(_) => TimeState::Idle,
            None => TimeState::Unknown,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            TimeState::Active => "active",
            TimeState::Idle => "idle",
            TimeState::Unknown => "unknown",
        }
    }
}

/// What a process's training loop says about its recent steps (the diagnosis stage takes them
/// from the companion's step spans and the active `rank_straggler` findings).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepPhases {
    /// The share of the window the process was inside its training loop's steps (0–1).
    pub in_step: f64,
    /// The share of step time blocked on the DataLoader (0–1).
    pub input_wait: f64,
    /// The share of step time with a collective in flight (0–1).
    pub collective_wait: f64,
    /// The rank `rank_straggler` names as the one this process's job waits for, when it is not
    /// this process: its collective wait is then `straggler_wait`.
    pub waited_for_rank: Option<u32>,
}

/// One window of one process split by cause: seconds, and joules where its energy is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSplit {
    pub seconds: BTreeMap<Cause, f64>,
    pub joules: Option<BTreeMap<Cause, f64>>,
}

impl WindowSplit {
    pub fn seconds_of(&self, cause: Cause) -> f64 {
        self.seconds.get(&cause).copied().unwrap_or(0.0)
    }
}

/// Splits `held` seconds (busy `activity` of them, charged `energy`) by cause, by the rule of the
/// module documentation. Causes with nothing are left out.
pub fn split(
    held: f64,
    activity: Option<f64>,
    energy: Option<f64>,
    phases: Option<&StepPhases>,
) -> WindowSplit {
    let held = held.max(0.0);
    let phases = phases.copied().unwrap_or_default();
    let in_step = phases.in_step.clamp(0.0, 1.0) * held;
    let mut collective = phases.collective_wait.clamp(0.0, 1.0) * in_step;
    let mut input = phases.input_wait.clamp(0.0, 1.0) * in_step;
    if collective + input > in_step && collective + input > 0.0 {
        // The two shares come from different spans and can overlap: the waits never claim more
        // than the steps' time.
        let scale = in_step / (collective + input);
        collective *= scale;
        input *= scale;
    }
    let waits = collective + input;
    let wait_cause = if phases.waited_for_rank.is_some() {
        Cause::StragglerWait
    } else {
        Cause::CollectiveWait
    };
    let mut seconds = BTreeMap::new();
    put(&mut seconds, wait_cause, collective);
    put(&mut seconds, Cause::InputWait, input);
    let rest = (held - waits).max(0.0);
    let Some(activity) = activity else {
        put(&mut seconds, Cause::Unknown, rest);
        return WindowSplit {
            seconds,
            joules: None,
        };
    };
    let busy = activity.clamp(0.0, 1.0) * held;
    let compute = busy.min(rest);
    let host = (in_step - waits - compute).clamp(0.0, rest - compute);
    let unused = (rest - compute - host).max(0.0);
    put(&mut seconds, Cause::Compute, compute);
    put(&mut seconds, Cause::Host, host);
    put(&mut seconds, Cause::Unused, unused);
    let joules = energy.map(|energy| {
        let mut joules = BTreeMap::new();
        if busy <= 0.0 {
            // No busy time, no charge (the accountant's weight is the activity); a non-zero
            // charge without busy time cannot arise, and is kept whole under compute if it does.
            joules.insert(Cause::Compute, energy);
            return joules;
        }
        let per_busy_second = energy / busy;
        joules.insert(Cause::Compute, compute * per_busy_second);
        let mut overflow = busy - compute;
        for (cause, wait) in [(wait_cause, collective), (Cause::InputWait, input)] {
            let taken = overflow.min(wait);
            if taken > 0.0 {
                *joules.entry(cause).or_insert(0.0) += taken * per_busy_second;
                overflow -= taken;
            }
        }
        joules
    });
    WindowSplit { seconds, joules }
}

/// Adds `value` to `cause` when there is anything to add.
fn put(map: &mut BTreeMap<Cause, f64>, cause: Cause, value: f64) {
    if value > 0.0 {
        *map.entry(cause).or_insert(0.0) += value;
    }
}

/// Time and energy of one cause (and, for `straggler_wait`, one waited-for rank).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseShare {
    pub cause: Cause,
    /// For `straggler_wait`: the rank waited for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub straggler_rank: Option<u32>,
    pub seconds: f64,
    /// `None` while the process's energy was never knowable.
    pub joules: Option<f64>,
}

/// A cause and the rank it waited for (only `straggler_wait` has one).
type CauseKey = (Cause, Option<u32>);

/// One process on one device: its time and energy by cause, in the last window and since
/// `since` (the accountant's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessLedger {
    pub pid: u32,
    pub device_uuid: String,
    /// The last window, by cause.
    pub window: Vec<CauseShare>,
    /// Since `since`, by cause.
    pub total: Vec<CauseShare>,
    /// Totals by `(state, cause, straggler rank)`: what `process.gpu.time` exports.
    #[serde(skip)]
    pub time_by_state: Vec<(TimeState, Cause, Option<u32>, f64)>,
    #[serde(with = "crate::sampling::model::unix_nanos")]
    pub since: SystemTime,
}

/// One cause of a job, pod or container, since gpulse first saw one of its processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseCost {
    pub cause: Cause,
    /// In whole-GPU hours, as the roll-up's `gpu_hours` (a MIG instance counts as its slice).
    pub gpu_hours: f64,
    /// The cause's share of the group's GPU-hours.
    pub share: f64,
    pub energy_kwh: f64,
    /// As the roll-up's `cost`: the hours × the price per GPU-hour plus the kWh × the price per
    /// kWh. For `input_wait` and `straggler_wait` this is also what fixing that cause alone
    /// would have saved so far (the job's steps would not have waited).
    pub cost: Option<f64>,
}

/// A roll-up's GPU-hours, energy and cost by cause.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseRollup {
    pub kind: GroupKind,
    pub id: String,
    pub gpu_hours: f64,
    /// Every cause that has time, in [`Cause::ALL`]'s order.
    pub causes: Vec<CauseCost>,
}

impl CauseRollup {
    pub fn cause(&self, cause: Cause) -> Option<&CauseCost> {
        self.causes.iter().find(|c| c.cause == cause)
    }
}

/// The ledger after one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ledger {
    pub processes: Vec<ProcessLedger>,
    /// Jobs first, then pods, then containers, by id (the accountant's roll-ups).
    pub rollups: Vec<CauseRollup>,
}

impl Ledger {
    pub fn process(&self, pid: u32, device_uuid: &str) -> Option<&ProcessLedger> {
        self.processes
            .iter()
            .find(|p| p.pid == pid && p.device_uuid == device_uuid)
    }

    pub fn rollup(&self, kind: GroupKind, id: &str) -> Option<&CauseRollup> {
        self.rollups.iter().find(|r| r.kind == kind && r.id == id)
    }
}

#[derive(Debug, Clone, Default)]
struct ProcessBook {
    time: BTreeMap<(TimeState, Cause, Option<u32>), f64>,
    /// `None` while the energy was never knowable.
    joules: Option<BTreeMap<CauseKey, f64>>,
}

#[derive(Debug, Clone, Default)]
struct GroupBook {
    hours: BTreeMap<Cause, f64>,
    kwh: BTreeMap<Cause, f64>,
}

/// Keeps the ledger's totals from one window to the next.
#[derive(Debug, Default)]
pub struct CauseBook {
    prices: Prices,
    processes: ByProcess<ProcessBook>,
    groups: FastMap<(GroupKind, String), GroupBook>,
}

impl CauseBook {
    pub fn new(prices: Prices) -> Self {
        Self {
            prices,
            ..Self::default()
        }
    }

    /// Charges the window the accountant just closed (`accounts`) by cause, with each process's
    /// step phases (by host PID), and returns the ledger after it.
    pub fn charge(
        &mut self,
        accounts: &Accounts,
        phases: &HashMap<u32, StepPhases>,
        workloads: &HashMap<u32, Workload>,
    ) -> Ledger {
        let mut processes = Vec::with_capacity(accounts.processes.len());
        // The accountant forgets a process with its first window without it: so does the book.
        self.processes.begin_window();
        for account in &accounts.processes {
            let phases = phases.get(&account.pid);
            let split = split(
                account.window_held_seconds,
                account.activity,
                account.window_energy_joules,
                phases,
            );
            let rank = phases.and_then(|p| p.waited_for_rank);
            processes.push(self.add_process(account, &split, rank));
            if let Some(workload) = workloads.get(&account.pid) {
                self.add_groups(workload, account, &split);
            }
        }
        self.processes.end_window();
        // The accountant bounds its groups: keep the same ones.
        let groups: FastSet<(GroupKind, String)> = accounts
            .rollups
            .iter()
            .map(|r| (r.kind, r.id.clone()))
            .collect();
        self.groups.retain(|key, _| groups.contains(key));
        Ledger {
            processes,
            rollups: self.rollups(),
        }
    }

    fn add_process(
        &mut self,
        account: &ProcessAccount,
        split: &WindowSplit,
        rank: Option<u32>,
    ) -> ProcessLedger {
        let book = self
            .processes
            .touch(account.pid, &account.device_uuid, ProcessBook::default);
        let state = TimeState::of(account.activity);
        let key = |cause: Cause| {
            (
                cause,
                (cause == Cause::StragglerWait).then_some(rank).flatten(),
            )
        };
        for (cause, seconds) in &split.seconds {
            let (cause, rank) = key(*cause);
            *book.time.entry((state, cause, rank)).or_insert(0.0) += seconds;
        }
        if let Some(joules) = &split.joules {
            let total = book.joules.get_or_insert_with(BTreeMap::new);
            for (cause, j) in joules {
                *total.entry(key(*cause)).or_insert(0.0) += j;
            }
        }
        let window = split
            .seconds
            .iter()
            .map(|(cause, seconds)| {
                let (cause, straggler_rank) = key(*cause);
                CauseShare {
                    cause,
                    straggler_rank,
                    seconds: *seconds,
                    joules: split
                        .joules
                        .as_ref()
                        .map(|j| j.get(&cause).copied().unwrap_or(0.0)),
                }
            })
            .collect();
        // The totals by cause over the states, summed in the book's order (as a map would) into
        // the few shares themselves rather than a map made for every process every window.
        let mut total: Vec<CauseShare> = Vec::new();
        for ((_, cause, rank), seconds) in &book.time {
            match total
                .iter_mut()
                .find(|t| (t.cause, t.straggler_rank) == (*cause, *rank))
            {
                Some(share) => share.seconds += seconds,
                None => total.push(CauseShare {
                    cause: *cause,
                    straggler_rank: *rank,
                    // As the map's `0.0 += seconds` did: a -0.0 reads 0.0.
                    seconds: 0.0 + seconds,
                    joules: book
                        .joules
                        .as_ref()
                        .map(|j| j.get(&(*cause, *rank)).copied().unwrap_or(0.0)),
                }),
            }
        }
        total.sort_unstable_by_key(|t| (t.cause, t.straggler_rank));
        ProcessLedger {
            pid: account.pid,
            device_uuid: account.device_uuid.clone(),
            window,
            total,
            time_by_state: book
                .time
                .iter()
                .map(|((state, cause, rank), s)| (*state, *cause, *rank, *s))
                .collect(),
            since: account.since,
        }
    }

    fn add_groups(&mut self, workload: &Workload, account: &ProcessAccount, split: &WindowSplit) {
        let share = account.gpu_share.unwrap_or(0.0);
        for of in groups_of(workload) {
            let group = self.groups.entry((of.kind, of.id.to_owned())).or_default();
            for (cause, seconds) in &split.seconds {
                *group.hours.entry(*cause).or_insert(0.0) += seconds * share / 3600.0;
            }
            for (cause, joules) in split.joules.iter().flatten() {
                *group.kwh.entry(*cause).or_insert(0.0) += joules / 3.6e6;
            }
        }
    }

    fn rollups(&self) -> Vec<CauseRollup> {
        let mut rollups: Vec<CauseRollup> = self
            .groups
            .iter()
            .map(|((kind, id), book)| {
                let gpu_hours: f64 = book.hours.values().sum();
                let causes = Cause::ALL
                    .iter()
                    .filter_map(|cause| {
                        let hours = book.hours.get(cause).copied().unwrap_or(0.0);
                        let kwh = book.kwh.get(cause).copied().unwrap_or(0.0);
                        (hours > 0.0 || kwh > 0.0).then(|| CauseCost {
                            cause: *cause,
                            gpu_hours: hours,
                            share: if gpu_hours > 0.0 {
                                hours / gpu_hours
                            } else {
                                0.0
                            },
                            energy_kwh: kwh,
                            cost: cost(&self.prices, hours, kwh),
                        })
                    })
                    .collect();
                CauseRollup {
                    kind: *kind,
                    id: id.clone(),
                    gpu_hours,
                    causes,
                }
            })
            .collect();
        rollups.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        rollups
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
