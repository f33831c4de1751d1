//! The ledger's rule, case by case, and the property that makes it a ledger: whatever the
//! figures, the causes add up to the held time and the charged energy.

use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::attribution::accounting::Rollup;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn total(split: &WindowSplit) -> f64 {
    split.seconds.values().sum()
}

/// The loop: 0.20 s data wait, 0.30 s GPU work, 0.05 s host per 0.55 s step.
fn known_phases() -> StepPhases {
    StepPhases {
        in_step: 1.0,
        input_wait: 0.20 / 0.55,
        collective_wait: 0.0,
        waited_for_rank: None,
    }
}

#[test]
fn a_training_loop_splits_into_its_phases() {
    let split = split(11.0, Some(0.30 / 0.55), Some(600.0), Some(&known_phases()));
    assert!(close(split.seconds_of(Cause::InputWait), 4.0));
    assert!(close(split.seconds_of(Cause::Compute), 6.0));
    assert!(close(split.seconds_of(Cause::Host), 1.0));
    assert!(close(split.seconds_of(Cause::Unused), 0.0));
    assert!(close(total(&split), 11.0));
    // Energy is the busy time's: all of it compute.
    let joules = split.joules.unwrap();
    assert!(close(joules[&Cause::Compute], 600.0));
    assert_eq!(joules.len(), 1);
}

#[test]
fn without_steps_only_compute_unused_and_unknown() {
    let split_known = split(10.0, Some(0.3), Some(100.0), None);
    assert!(close(split_known.seconds_of(Cause::Compute), 3.0));
    assert!(close(split_known.seconds_of(Cause::Unused), 7.0));
    assert_eq!(split_known.seconds.len(), 2);
    let unknown = split(10.0, None, None, None);
    assert!(close(unknown.seconds_of(Cause::Unknown), 10.0));
    assert_eq!(unknown.seconds.len(), 1);
    assert_eq!(unknown.joules, None);
}

#[test]
fn waits_outrank_busy_time_and_take_its_energy() {
    // A rank waiting 40 % of its steps for a slow rank, whose spinning collective kernels keep
    // the GPU "busy" 90 % of the time: the wait is the wait, and its busy seconds' energy with it.
    let phases = StepPhases {
        in_step: 1.0,
        input_wait: 0.0,
        collective_wait: 0.4,
        waited_for_rank: Some(5),
    };
    let split = split(10.0, Some(0.9), Some(900.0), Some(&phases));
    assert!(close(split.seconds_of(Cause::StragglerWait), 4.0));
    assert!(close(split.seconds_of(Cause::Compute), 6.0));
    assert!(close(split.seconds_of(Cause::Host), 0.0));
    assert_eq!(split.seconds_of(Cause::CollectiveWait), 0.0);
    let joules = split.joules.unwrap();
    assert!(close(joules[&Cause::Compute], 600.0));
    assert!(close(joules[&Cause::StragglerWait], 300.0));
}

#[test]
fn without_a_named_rank_the_wait_is_collective_and_unknown_activity_keeps_the_waits() {
    let phases = StepPhases {
        in_step: 1.0,
        input_wait: 0.1,
        collective_wait: 0.3,
        waited_for_rank: None,
    };
    let split = split(10.0, None, None, Some(&phases));
    assert!(close(split.seconds_of(Cause::CollectiveWait), 3.0));
    assert!(close(split.seconds_of(Cause::InputWait), 1.0));
    assert!(close(split.seconds_of(Cause::Unknown), 6.0));
    assert!(close(total(&split), 10.0));
}

#[test]
fn time_outside_steps_is_unused_and_overlapping_waits_never_exceed_the_steps() {
    let phases = StepPhases {
        in_step: 0.5,
        input_wait: 0.8,
        collective_wait: 0.8,
        waited_for_rank: None,
    };
    let split = split(10.0, Some(0.0), Some(0.0), Some(&phases));
    assert!(close(split.seconds_of(Cause::InputWait), 2.5));
    assert!(close(split.seconds_of(Cause::CollectiveWait), 2.5));
    assert!(close(split.seconds_of(Cause::Unused), 5.0));
    assert!(close(total(&split), 10.0));
}

fn account(pid: u32, activity: Option<f64>, held: f64, energy: Option<f64>) -> ProcessAccount {
    ProcessAccount {
        pid,
        device_uuid: "GPU-0".into(),
        mig_uuid: None,
        activity,
        activity_source: None,
        energy_weight: None,
        window_held_seconds: held,
        window_energy_joules: energy,
        held_seconds: held,
        active_seconds: None,
        idle_seconds: None,
        unknown_seconds: 0.0,
        energy_joules: energy,
        gpu_share: Some(1.0),
        since: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    }
}

fn job_rollup(id: &str) -> Rollup {
    Rollup::empty(GroupKind::Job, id.to_string())
}

#[test]
fn the_book_keeps_totals_by_state_and_rolls_causes_up_with_their_cost() {
    let mut book = CauseBook::new(Prices {
        per_gpu_hour: Some(2.0),
        per_kwh: Some(0.5),
    });
    let workloads: HashMap<u32, Workload> = [(
        1,
        Workload {
            job_id: Some("job-a".into()),
            ..Workload::unresolved(1)
        },
    )]
    .into_iter()
    .collect();
    let phases: HashMap<u32, StepPhases> = [(1, known_phases())].into_iter().collect();
    let accounts = |activity, energy| Accounts {
        processes: vec![account(1, Some(activity), 1980.0, Some(energy))],
        rollups: vec![job_rollup("job-a")],
        ..Accounts::default()
    };
    book.charge(&accounts(0.30 / 0.55, 3.6e6), &phases, &workloads);
    // A second window with no busy time at all: its state is idle.
    let ledger = book.charge(&accounts(0.0, 0.0), &phases, &workloads);
    let p = ledger.process(1, "GPU-0").unwrap();
    let held: f64 = p.total.iter().map(|c| c.seconds).sum();
    assert!(close(held, 3960.0));
    let by_state = |state| -> f64 {
        p.time_by_state
            .iter()
            .filter(|(s, ..)| *s == state)
            .map(|(.., s)| s)
            .sum()
    };
    assert!(close(by_state(TimeState::Active), 1980.0));
    assert!(close(by_state(TimeState::Idle), 1980.0));
    let job = ledger.rollup(GroupKind::Job, "job-a").unwrap();
    assert!(close(job.gpu_hours, 1.1));
    let input = job.cause(Cause::InputWait).unwrap();
    assert!(close(input.gpu_hours, 2.0 * 0.2 / 0.55 * 0.55), "{input:?}");
    assert!(close(input.cost.unwrap(), input.gpu_hours * 2.0));
    let compute = job.cause(Cause::Compute).unwrap();
    assert!(close(compute.energy_kwh, 1.0));
    assert!(close(compute.cost.unwrap(), compute.gpu_hours * 2.0 + 0.5));
    // The process goes; so does its book, while the job's roll-up stays.
    let ledger = book.charge(
        &Accounts {
            rollups: vec![job_rollup("job-a")],
            ..Accounts::default()
        },
        &phases,
        &workloads,
    );
    assert!(ledger.processes.is_empty());
    assert!(close(ledger.rollups[0].gpu_hours, 1.1));
}

proptest::proptest! {
    /// Whatever the figures, a window's causes add up to its held time, and their energy to the
    /// charged energy, each non-negative.
    #[test]
    fn causes_add_up_to_held_time_and_charged_energy(
        held in 0.0f64..100.0,
        activity in proptest::option::of(0.0f64..=1.0),
        energy in 0.0f64..1e5,
        phases in proptest::option::of((0.0f64..=1.0, 0.0f64..=1.0, 0.0f64..=1.0, proptest::option::of(0u32..8))),
    ) {
        let phases = phases.map(|(in_step, input_wait, collective_wait, waited_for_rank)| StepPhases {
            in_step, input_wait, collective_wait, waited_for_rank,
        });
        let energy = activity.map(|a| energy * a);
        let split = split(held, activity, energy, phases.as_ref());
        proptest::prop_assert!(split.seconds.values().all(|s| *s >= 0.0));
        proptest::prop_assert!((total(&split) - held).abs() <= 1e-9 * held.max(1.0), "{:?}", split);
        if let (Some(joules), Some(energy)) = (&split.joules, energy) {
            proptest::prop_assert!(joules.values().all(|j| *j >= 0.0));
            let sum: f64 = joules.values().sum();
            proptest::prop_assert!((sum - energy).abs() <= 1e-9 * energy.max(1.0), "{} != {}", sum, energy);
        }
    }
}
