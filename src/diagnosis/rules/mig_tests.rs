//! The GPM rules on a GPU in MIG mode: `tensor_cores_idle`, `low_sm_efficiency` and
//! `idle_holder` judge each process by its MIG instance's figures (NVML gives MIG no
//! utilisation; the instance's GPM is its load), and their findings name the instance.

use std::sync::Arc;

use super::testkit::*;
use super::{idle_holder, low_sm_efficiency, tensor_cores_idle};
use crate::diagnosis::findings::{Finding, MigRef, Subject, Value};
use crate::diagnosis::thresholds::{IdleHolder, LowSmEfficiency, TensorCoresIdle};
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
