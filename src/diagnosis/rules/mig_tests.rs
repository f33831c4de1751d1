//! The rules on a GPU in MIG mode: `tensor_cores_idle`, `low_sm_efficiency` and `idle_holder`
//! judge each process by its MIG instance's figures (NVML gives MIG no utilisation; the
//! instance's GPM is its load), `memory_pressure`, `memory_growth` and `memory_fragmentation` by
//! its instance's memory slice (all it can allocate from), and their findings name the instance.
//! Each test's GPU as a whole is far from the condition, so judging the device would fail it.

use std::sync::Arc;

use super::testkit::*;
use super::{
    idle_holder, low_sm_efficiency, memory_fragmentation, memory_growth, memory_pressure,
    tensor_cores_idle,
};
use crate::config::thresholds::{
    IdleHolder, LowSmEfficiency, MemoryFragmentation, MemoryGrowth, MemoryPressure, TensorCoresIdle,
};
use crate::diagnosis::findings::Severity;
use crate::diagnosis::findings::{Finding, MigRef, Subject, Value};
use crate::diagnosis::framework::{AllocatorPoint, ProcessEvidence};
use crate::sampling::{DeviceWindow, GpmWindow, MigInstanceInfo, MigInstanceWindow};
use crate::schema::{DeviceField, GpmField as F};

/// GPU 0 in MIG mode: no GPU-Util, the whole GPU's GPM from `whole`, and instances GI 1
/// (`3g.40gb`, PID 42) and GI 2 (`2g.20gb`, PID 43) with their own GPM.
fn mig_gpu(whole: [(F, f64); 3], gi1: [(F, f64); 3], gi2: [(F, f64); 3]) -> DeviceWindow {
    let mut d = device(0, 0.0, 20 * GIB);
    d.fields.set_gauge(DeviceField::UtilizationGpu, None);
    for (field, v) in whole {
        d.gpm.set(field, Some(gauge(v)));
    }
    let instance = |gi: u32, profile: &str, pid: u32, values: [(F, f64); 3]| {
        let mut gpm = GpmWindow::default();
        for (field, v) in values {
            gpm.set(field, Some(gauge(v)));
        }
        MigInstanceWindow {
            info: Arc::new(MigInstanceInfo {
                uuid: format!("MIG-{gi}"),
                name: format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
                parent_uuid: d.info.uuid.clone(),
                parent_index: 0,
                mig_index: gi - 1,
                gpu_instance_id: gi,
                compute_instance_id: 0,
            }),
            memory_used_bytes: Some(8 * GIB),
            memory_free_bytes: Some(12 * GIB),
            memory_total_bytes: Some(20 * GIB),
            gpm,
            pids: vec![pid],
        }
    };
    d.mig_instances = vec![
        instance(1, "3g.40gb", 42, gi1),
        instance(2, "2g.20gb", 43, gi2),
    ];
    d
}

/// `n` one-minute windows of [`mig_gpu`], PID 42 holding 8 GiB and PID 43 4 GiB.
fn minutes(n: u64, gpu: impl Fn() -> DeviceWindow) -> Fixture {
    let windows = (1..=n)
        .map(|i| {
            let mut p42 = process(42, 0, 8 * GIB, None);
            let mut p43 = process(43, 0, 4 * GIB, None);
            p42.sm_utilization = None;
            p43.sm_utilization = None;
            window(i * 60, vec![gpu()], vec![p42, p43])
        })
        .collect();
    Fixture::new(windows)
}

/// The instance a finding names, checking it is a workload finding on GPU 0.
fn instance_of(f: &Finding) -> &MigRef {
    let Subject::Workload {
        device: Some(d), ..
    } = &f.subject
    else {
        panic!("not a workload on a device: {f:?}");
    };
    assert_eq!(d.index, 0);
    d.mig.as_ref().expect("the finding names its MIG instance")
}

#[test]
fn tensor_cores_idle_is_judged_per_instance_and_names_it() {
    // The whole GPU looks fine (tensor cores busy on GI 2); GI 1's SMs work with idle tensor
    // cores. Each instance has a main holder of its own.
    let f = minutes(6, || {
        mig_gpu(
            [
                (F::SmActivity, 0.8),
                (F::TensorActivity, 0.3),
                (F::GraphicsActivity, 0.9),
            ],
            [
                (F::SmActivity, 0.85),
                (F::TensorActivity, 0.0),
                (F::GraphicsActivity, 0.9),
            ],
            [
                (F::SmActivity, 0.75),
                (F::TensorActivity, 0.6),
                (F::GraphicsActivity, 0.9),
            ],
        )
    });
    let found = tensor_cores_idle::evaluate(&f.inputs(), &TensorCoresIdle::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].subject.pid(), Some(42));
    let m = instance_of(&found[0]);
    assert_eq!(
        (m.uuid.as_str(), m.gpu_instance_id, m.profile.as_str()),
        ("MIG-1", 1, "3g.40gb")
    );
    assert_eq!(
        found[0].value("sm_activity_ratio"),
        Some(&Value::from(0.85))
    );
    assert_eq!(
        found[0].value("tensor_activity_ratio"),
        Some(&Value::from(0.0))
    );
    assert!(
        found[0].summary.contains("MIG 3g.40gb (GI 1)"),
        "{}",
        found[0].summary
    );
}

#[test]
fn low_sm_efficiency_takes_the_instances_graphics_activity_for_gpu_util() {
    let f = minutes(6, || {
        mig_gpu(
            [
                (F::SmActivity, 0.5),
                (F::TensorActivity, 0.3),
                (F::GraphicsActivity, 0.6),
            ],
            [
                (F::SmActivity, 0.7),
                (F::TensorActivity, 0.3),
                (F::GraphicsActivity, 0.95),
            ],
            [
                (F::SmActivity, 0.12),
                (F::TensorActivity, 0.0),
                (F::GraphicsActivity, 0.97),
            ],
        )
    });
    let found = low_sm_efficiency::evaluate(&f.inputs(), &LowSmEfficiency::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].subject.pid(), Some(43));
    assert_eq!(instance_of(&found[0]).profile, "2g.20gb");
    assert_eq!(
        found[0].value("gpu_utilization_ratio"),
        Some(&Value::from(0.97))
    );
    assert_eq!(
        found[0].value("sm_activity_ratio"),
        Some(&Value::from(0.12))
    );
}

#[test]
fn idle_holder_sees_an_idle_instance_on_a_busy_gpu() {
    // GI 2 keeps the GPU busy; PID 42's instance does nothing for ten minutes.
    let f = minutes(10, || {
        mig_gpu(
            [
                (F::SmActivity, 0.5),
                (F::TensorActivity, 0.3),
                (F::GraphicsActivity, 0.6),
            ],
            [
                (F::SmActivity, 0.0),
                (F::TensorActivity, 0.0),
                (F::GraphicsActivity, 0.0),
            ],
            [
                (F::SmActivity, 0.9),
                (F::TensorActivity, 0.5),
                (F::GraphicsActivity, 0.95),
            ],
        )
    });
    let found = idle_holder::evaluate(&f.inputs(), &IdleHolder::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].subject.pid(), Some(42));
    assert_eq!(instance_of(&found[0]).uuid, "MIG-1");
    assert_eq!(
        found[0].value("utilization_source"),
        Some(&Value::from("mig_instance_sm_activity"))
    );
}

/// [`mig_gpu`] (20 of the GPU's 80 GiB used: 60 GiB free) whose GI 1 slice of 20 GiB has
/// `gi1_used` used.
fn nearly_full_slice(gi1_used: u64) -> DeviceWindow {
    let busy = [
        (F::SmActivity, 0.5),
        (F::TensorActivity, 0.5),
        (F::GraphicsActivity, 0.5),
    ];
    let mut d = mig_gpu(busy, busy, busy);
    let gi1 = &mut d.mig_instances[0];
    gi1.memory_used_bytes = Some(gi1_used);
    gi1.memory_free_bytes = Some(20 * GIB - gi1_used);
    gi1.memory_total_bytes = Some(20 * GIB);
    d
}

const MIB: u64 = 1 << 20;

#[test]
fn memory_pressure_judges_the_instance_and_the_process_on_its_slice() {
    // GI 1 is 97.5 % full (19.5 of 20 GiB), PID 42 holds 19 of the 19.5 GiB it could have;
    // the GPU is 25 % full, with 60 GiB free that PID 42 cannot reach.
    let mut p42 = process(42, 0, 19 * GIB, None);
    p42.sm_utilization = None;
    let mut p43 = process(43, 0, 4 * GIB, None);
    p43.sm_utilization = None;
    let f = Fixture::new(vec![window(
        60,
        vec![nearly_full_slice(19 * GIB + 512 * MIB)],
        vec![p42, p43],
    )]);
    let found = memory_pressure::evaluate(&f.inputs(), &MemoryPressure::default());
    assert_eq!(found.len(), 2, "{found:#?}");
    let Subject::Device(slice) = &found[0].subject else {
        panic!("an instance finding first: {found:#?}");
    };
    let mig = slice.mig.as_ref().expect("names the instance, not the GPU");
    assert_eq!((mig.gpu_instance_id, mig.profile.as_str()), (1, "3g.40gb"));
    assert!(
        found[0].summary.contains("98% full"),
        "{}",
        found[0].summary
    );
    assert_eq!(found[1].subject.pid(), Some(42));
    assert_eq!(instance_of(&found[1]).gpu_instance_id, 1);
    assert!(
        found[1].summary.contains("512 MiB left"),
        "the slice's free memory, not the GPU's: {}",
        found[1].summary
    );
}

#[test]
fn memory_growth_counts_the_time_until_the_instance_is_full() {
    // PID 42 grows 1 MiB/s for 20 minutes with 1 GiB left in its slice: full in about 17
    // minutes (urgent: an error). The GPU's 60 GiB free would say 17 hours, a warning.
    let windows = (1..=20u64)
        .map(|i| {
            let held = 10 * GIB + i * 60 * MIB;
            let mut p42 = process(42, 0, held, None);
            p42.sm_utilization = None;
            window(i * 60, vec![nearly_full_slice(19 * GIB)], vec![p42])
        })
        .collect();
    let f = Fixture::new(windows);
    let found = memory_growth::evaluate(&f.inputs(), &MemoryGrowth::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].severity, Severity::Error, "{}", found[0].summary);
    assert!(
        found[0].summary.contains("MIG instance full in about 17m"),
        "{}",
        found[0].summary
    );
    assert_eq!(instance_of(&found[0]).gpu_instance_id, 1);
}

#[test]
fn memory_fragmentation_needs_pressure_on_the_instance_not_the_gpu() {
    // GI 1 is 95 % used (the threshold is 85 %), the GPU 25 %; PyTorch in PID 42 keeps 6 of
    // its 16 GiB reserve unused for 5 minutes.
    let fixture = |gi1_used: u64| {
        let mut p42 = process(42, 0, 17 * GIB, None);
        p42.sm_utilization = None;
        let mut f = Fixture::new(vec![window(
            300,
            vec![nearly_full_slice(gi1_used)],
            vec![p42],
        )]);
        let points = (0..=10)
            .map(|i| AllocatorPoint {
                at: t(i * 30),
                allocated_bytes: Some(10 * GIB),
                reserved_bytes: Some(16 * GIB),
                max_allocated_bytes: None,
            })
            .collect();
        let mut evidence = ProcessEvidence::default();
        evidence.allocator.insert("GPU-00000000".into(), points);
        f.framework.processes.insert(42, evidence);
        f
    };
    let f = fixture(19 * GIB);
    let found = memory_fragmentation::evaluate(&f.inputs(), &MemoryFragmentation::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0]
            .summary
            .contains("while the MIG instance is 95% full"),
        "{}",
        found[0].summary
    );
    assert_eq!(instance_of(&found[0]).gpu_instance_id, 1);
    // The same reserve in a slice with room to spare: no finding.
    let f = fixture(8 * GIB);
    assert!(
        memory_fragmentation::evaluate(&f.inputs(), &MemoryFragmentation::default()).is_empty()
    );
}
