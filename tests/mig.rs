//! MIG instances through the real nvml-wrapper path, against both NVML implementations: nvml-sim
//! (scenario `mig-2-instances.toml`) and the independent C library (tests/fixtures/other-nvml),
//! each with values of its own. `gpulse snapshot --format json` must list exactly the instances
//! each library gives under their GPU, and `gpulse run` must export them as devices of their own
//! (`hw.id` = MIG UUID, `hw.parent`, instance ids, memory slice, per-instance GPM), with each
//! process's `process.gpu.*` points on its instance.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::{run_against, Receiver, ReceiverOptions};
use crate::run::{attr_str, metrics_of, points, process_resource, value, window_requests, Gpulse};
use crate::sampling::gpulse_bin;

const MIB: u64 = 1024 * 1024;

/// nvml-sim's scenario: GPU 0 in MIG mode with two 3g.40gb instances, GPU 1 whole.
mod sim {
    pub const GPU0: &str = "GPU-5b6c7d8e-9f01-4a2b-8c3d-4e5f6a7b8c90";
    pub const GPU1: &str = "GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
    pub const MIG1: &str = "MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d";
    pub const MIG2: &str = "MIG-6f7e8d9c-0b1a-5c2d-9e3f-4a5b6c7d8e9f";
    pub const NAME: &str = "NVIDIA H100 80GB HBM3 MIG 3g.40gb";
}

/// The independent library: GPU 0 in MIG mode with GI 3 (2g.12gb) and GI 5 (1g.6gb).
mod other {
    pub const GPU0: &str = "GPU-0ther000-1111-2222-3333-444444444444";
    pub const MIG3: &str = "MIG-0ther000-aaaa-5bbb-8ccc-dddddddddd01";
    pub const MIG5: &str = "MIG-0ther000-aaaa-5bbb-8ccc-dddddddddd02";
}

/// GPM of one instance as snapshot keys and exported (metric, pipe) names.
struct Activity(&'static [(&'static str, f64)]);

/// nvml-sim GI 1 and GI 2 (the scenario's `[device.mig_instance.gpm]`; unset metrics are 0).
const SIM_GI1: Activity = Activity(&[
    ("sm_activity", 0.85),
    ("sm_occupancy", 0.55),
    ("tensor_activity", 0.4),
    ("dram_activity", 0.45),
    ("fp16_activity", 0.3),
    ("fp32_activity", 0.0),
]);
const SIM_GI2: Activity = Activity(&[
    ("sm_activity", 0.05),
    ("sm_occupancy", 0.02),
    ("tensor_activity", 0.0),
    ("dram_activity", 0.01),
]);

/// The other library's GI 3 and GI 5 (its header comment's table, percent / 100).
const OTHER_GI3: Activity = Activity(&[
    ("graphics_activity", 0.83),
    ("sm_activity", 0.805),
    ("sm_occupancy", 0.45),
    ("integer_activity", 0.08),
    ("tensor_activity", 0.4025),
    ("tensor_dfma_activity", 0.0),
    ("tensor_hmma_activity", 0.38),
    ("tensor_imma_activity", 0.0225),
    ("dram_activity", 0.555),
    ("fp64_activity", 0.0),
    ("fp32_activity", 0.12),
    ("fp16_activity", 0.30),
]);
const OTHER_GI5: Activity = Activity(&[
    ("graphics_activity", 0.09),
    ("sm_activity", 0.075),
    ("sm_occupancy", 0.025),
    ("integer_activity", 0.005),
    ("tensor_activity", 0.0),
    ("dram_activity", 0.03),
    ("fp32_activity", 0.04),
    ("fp16_activity", 0.0),
]);

/// The exported metric and `nvidia.gpu.pipe` of a snapshot GPM key.
fn metric_of(key: &str) -> (&'static str, Option<&'static str>) {
    match key {
        "sm_activity" => ("nvidia.gpu.sm.activity", None),
        "sm_occupancy" => ("nvidia.gpu.sm.occupancy", None),
        "dram_activity" => ("nvidia.gpu.dram.activity", None),
        "graphics_activity" => ("nvidia.gpu.graphics.activity", None),
        "tensor_activity" => ("nvidia.gpu.pipe.activity", Some("tensor")),
        "tensor_hmma_activity" => ("nvidia.gpu.pipe.activity", Some("tensor.hmma")),
        "tensor_imma_activity" => ("nvidia.gpu.pipe.activity", Some("tensor.imma")),
        "tensor_dfma_activity" => ("nvidia.gpu.pipe.activity", Some("tensor.dfma")),
        "fp16_activity" => ("nvidia.gpu.pipe.activity", Some("fp16")),
        "fp32_activity" => ("nvidia.gpu.pipe.activity", Some("fp32")),
        "fp64_activity" => ("nvidia.gpu.pipe.activity", Some("fp64")),
        "integer_activity" => ("nvidia.gpu.pipe.activity", Some("integer")),
        other => panic!("unknown GPM key {other}"),
    }
}

fn close(got: &Value, want: f64, what: &str) {
    let got = got
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {got} is not a number"));
    assert!((got - want).abs() < 1e-9, "{what}: {got} != {want}");
}

/// Checks one snapshot instance against what the library gives.
fn check_snapshot_instance(
    instance: &Value,
    uuid: &str,
    name: &str,
    ids: (u32, u32),
    memory: (u64, u64),
    activity: &Activity,
) {
    assert_eq!(instance["uuid"], uuid, "{instance}");
    assert_eq!(instance["name"], name, "{instance}");
    assert_eq!(instance["gpu_instance_id"], ids.0, "{instance}");
    assert_eq!(instance["compute_instance_id"], ids.1, "{instance}");
    assert_eq!(instance["memory_total_bytes"], memory.1, "{instance}");
    assert_eq!(instance["memory_used_bytes"], memory.0, "{instance}");
    assert_eq!(
        instance["memory_free_bytes"],
        memory.1 - memory.0,
        "{instance}"
    );
    for (key, want) in activity.0 {
        close(&instance[*key], *want, &format!("{uuid} {key}"));
    }
}

fn snapshot_of(command: &mut Command) -> Value {
    let output = command.output().expect("run gpulse snapshot");
    assert!(
        output.status.success(),
        "gpulse snapshot failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("snapshot JSON")
}

fn scenario_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios/mig-2-instances.toml")
}

fn process(snapshot: &Value, pid: u32) -> &Value {
    snapshot["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no process {pid}: {snapshot}"))
}

#[test]
fn snapshot_lists_nvml_sims_instances_under_their_gpu() {
    let s = snapshot_of(
        Command::new(gpulse_bin())
            .args(["snapshot", "--format", "json", "--nvml-lib"])
            .arg(crate::sampling::sim_lib())
            .env("NVML_SIM_SCENARIO", scenario_path())
            .env("GPULSE_KUBELET_SOCKET", "none"),
    );
    let devices = s["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2, "instances are not GPUs of their own here");
    let gpu0 = &devices[0];
    assert_eq!(gpu0["uuid"], sim::GPU0);
    assert_eq!(
        gpu0["utilization_gpu"],
        Value::Null,
        "NVML gives no utilisation in MIG mode"
    );
    let instances = gpu0["mig_instances"].as_array().expect("mig_instances");
    assert_eq!(instances.len(), 2, "{instances:?}");
    let total = 40192 * MIB;
    check_snapshot_instance(
        &instances[0],
        sim::MIG1,
        sim::NAME,
        (1, 0),
        (30720 * MIB, total),
        &SIM_GI1,
    );
    check_snapshot_instance(
        &instances[1],
        sim::MIG2,
        sim::NAME,
        (2, 0),
        (4096 * MIB, total),
        &SIM_GI2,
    );
    assert_eq!(devices[1]["uuid"], sim::GPU1);
    assert_eq!(devices[1]["mig_instances"], serde_json::json!([]));

    for (pid, instance, gi) in [(6101, sim::MIG1, 1), (6102, sim::MIG2, 2)] {
        let p = process(&s, pid);
        assert_eq!(p["device_uuid"], sim::GPU0, "the GPU stays the device: {p}");
        assert_eq!(p["mig_instance"]["uuid"], instance, "{p}");
        assert_eq!(p["mig_instance"]["gpu_instance_id"], gi, "{p}");
        assert_eq!(p["mig_instance"]["compute_instance_id"], 0, "{p}");
    }
    assert_eq!(process(&s, 6201)["mig_instance"], Value::Null);
}

#[test]
fn snapshot_lists_another_nvmls_instances_under_their_gpu() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = crate::other_nvml::build_library(dir.path());
    // The library's own processes: 4242 (512 MiB) in GI 3, 4343 (256 MiB) in GI 5.
    let s = snapshot_of(
        Command::new(gpulse_bin())
            .args(["snapshot", "--format", "json", "--nvml-lib"])
            .arg(&lib)
            .env_remove("OTHER_NVML_PIDS")
            .env("GPULSE_KUBELET_SOCKET", "none"),
    );
    let devices = s["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2);
    let instances = devices[0]["mig_instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2, "{instances:?}");
    check_snapshot_instance(
        &instances[0],
        other::MIG3,
        "Other Board A MIG 2g.12gb",
        (3, 0),
        (536870912, 12884901888),
        &OTHER_GI3,
    );
    check_snapshot_instance(
        &instances[1],
        other::MIG5,
        "Other Board A MIG 1g.6gb",
        (5, 0),
        (268435456, 6442450944),
        &OTHER_GI5,
    );
    assert_eq!(
        devices[1]["mig_instances"],
        serde_json::json!([]),
        "GPU 1 answers NOT_SUPPORTED to MIG calls"
    );
    for (pid, instance, gi) in [(4242, other::MIG3, 3), (4343, other::MIG5, 5)] {
        let p = process(&s, pid);
        assert_eq!(p["device_uuid"], other::GPU0, "{p}");
        assert_eq!(p["mig_instance"]["uuid"], instance, "{p}");
        assert_eq!(p["mig_instance"]["gpu_instance_id"], gi, "{p}");
    }
}

/// The second export window's node metrics (the first may predate a GPM pair).
fn node_metrics(requests: &[Value]) -> Vec<Value> {
    let windows = window_requests(requests);
    assert!(windows.len() >= 2, "{} windows", windows.len());
    metrics_of(&windows[1]["request"]["resourceMetrics"][0])
        .into_iter()
        .cloned()
        .collect()
}

/// The point of `name` whose `hw.id` is `id` (and `nvidia.gpu.pipe` is `pipe`).
fn point_of<'a>(
    metrics: &'a [Value],
    name: &str,
    id: &str,
    pipe: Option<&str>,
) -> Option<&'a Value> {
    let metric = metrics.iter().find(|m| m["name"] == name)?;
    points(metric).into_iter().find(|p| {
        attr_str(&p["attributes"], "hw.id").as_deref() == Some(id)
            && attr_str(&p["attributes"], "nvidia.gpu.pipe").as_deref() == pipe
    })
}

/// Checks an instance's exported points: attributes, memory slice, GPM.
fn check_exported_instance(
    metrics: &[Value],
    uuid: &str,
    parent: &str,
    name: &str,
    ids: (u32, u32),
    memory: (u64, u64),
    activity: &Activity,
) {
    let usage = point_of(metrics, "hw.gpu.memory.usage", uuid, None)
        .unwrap_or_else(|| panic!("no memory point of {uuid}: {metrics:?}"));
    let attrs = &usage["attributes"];
    assert_eq!(attr_str(attrs, "hw.parent").as_deref(), Some(parent));
    assert_eq!(attr_str(attrs, "hw.name").as_deref(), Some(name));
    assert_eq!(attr_str(attrs, "hw.type").as_deref(), Some("gpu"));
    assert_eq!(
        attr_str(attrs, "nvidia.gpu.mig.gpu_instance_id"),
        Some(ids.0.to_string())
    );
    assert_eq!(
        attr_str(attrs, "nvidia.gpu.mig.compute_instance_id"),
        Some(ids.1.to_string())
    );
    assert_eq!(value(usage), memory.0 as f64, "{uuid} memory usage");
    let limit = point_of(metrics, "hw.gpu.memory.limit", uuid, None).expect("limit");
    assert_eq!(value(limit), memory.1 as f64, "{uuid} memory limit");
    for (key, want) in activity.0 {
        let (metric, pipe) = metric_of(key);
        let point = point_of(metrics, metric, uuid, pipe)
            .unwrap_or_else(|| panic!("no {metric} {pipe:?} point of {uuid}"));
        let got = value(point);
        assert!(
            (got - want).abs() < 1e-9,
            "{uuid} {metric} {pipe:?}: {got} != {want}"
        );
        assert_eq!(
            attr_str(&point["attributes"], "hw.parent").as_deref(),
            Some(parent)
        );
    }
    assert!(
        point_of(metrics, "hw.gpu.utilization", uuid, None).is_none(),
        "NVML gives a MIG device no utilisation"
    );
}

/// `process.gpu.memory.usage` of `pid`: its value, `hw.id` and `hw.parent`.
fn process_memory(request: &Value, pid: u32) -> (f64, Option<String>, Option<String>) {
    let resource =
        process_resource(request, pid).unwrap_or_else(|| panic!("no resource for {pid}"));
    let memory = metrics_of(resource)
        .into_iter()
        .find(|m| m["name"] == "process.gpu.memory.usage")
        .expect("process.gpu.memory.usage");
    let point = points(memory)[0];
    (
        value(point),
        attr_str(&point["attributes"], "hw.id"),
        attr_str(&point["attributes"], "hw.parent"),
    )
}

#[test]
fn run_exports_nvml_sims_instances_as_devices_of_their_own() {
    let receiver = Receiver::start(ReceiverOptions::default());
    let scenario = std::fs::read_to_string(scenario_path()).expect("scenario");
    let gpulse = Gpulse::start(
        &scenario,
        &[],
        &["--sample-interval", "200ms", "--export-interval", "1s"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
        ],
    );
    let requests = receiver.wait_for(|r| window_requests(r).len() >= 2, Duration::from_secs(60));
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    let metrics = node_metrics(&requests);
    let total = 40192 * MIB;
    check_exported_instance(
        &metrics,
        sim::MIG1,
        sim::GPU0,
        sim::NAME,
        (1, 0),
        (30720 * MIB, total),
        &SIM_GI1,
    );
    check_exported_instance(
        &metrics,
        sim::MIG2,
        sim::GPU0,
        sim::NAME,
        (2, 0),
        (4096 * MIB, total),
        &SIM_GI2,
    );
    // The GPU itself: GPM of the whole GPU, no utilisation (MIG), no parent.
    let sm = point_of(&metrics, "nvidia.gpu.sm.activity", sim::GPU0, None).expect("GPU 0 SM");
    assert!((value(sm) - 0.45).abs() < 1e-9);
    assert_eq!(attr_str(&sm["attributes"], "hw.parent"), None);
    let general_utilization = |id: &str| {
        let metric = metrics.iter().find(|m| m["name"] == "hw.gpu.utilization")?;
        points(metric).into_iter().find(|p| {
            attr_str(&p["attributes"], "hw.id").as_deref() == Some(id)
                && attr_str(&p["attributes"], "hw.gpu.task").as_deref() == Some("general")
        })
    };
    assert!(general_utilization(sim::GPU0).is_none(), "MIG mode");
    assert!(general_utilization(sim::GPU1).is_some());

    let windows = window_requests(&requests);
    let request = windows[1];
    for (pid, bytes, instance) in [
        (6101, 30720 * MIB, sim::MIG1),
        (6102, 4096 * MIB, sim::MIG2),
    ] {
        let (got, id, parent) = process_memory(request, pid);
        assert_eq!(got, bytes as f64, "{pid}");
        assert_eq!(id.as_deref(), Some(instance), "{pid} on its instance");
        assert_eq!(parent.as_deref(), Some(sim::GPU0), "{pid}");
    }
    let (_, id, parent) = process_memory(request, 6201);
    assert_eq!(id.as_deref(), Some(sim::GPU1));
    assert_eq!(parent, None);

    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("WARN") || l.contains("ERROR")),
        "MIG mode's unsupported utilisation is no warning: {stderr}"
    );
}

/// `gpulse run` against the independent library until two windows arrived.
fn run_other(lib: &Path, pids: &str) -> (Vec<Value>, String) {
    run_against(lib, pids, 2, Duration::from_secs(60))
}

#[test]
fn run_exports_another_nvmls_instances_as_devices_of_their_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = crate::other_nvml::build_library(dir.path());
    // Process 0 runs in GI 3, process 1 in GI 5 (the library's rule: instance i % 2).
    let (requests, stderr) = run_other(&lib, "4242:1073741824,4343:2147483648");
    let metrics = node_metrics(&requests);
    check_exported_instance(
        &metrics,
        other::MIG3,
        other::GPU0,
        "Other Board A MIG 2g.12gb",
        (3, 0),
        (1073741824, 12884901888),
        &OTHER_GI3,
    );
    check_exported_instance(
        &metrics,
        other::MIG5,
        other::GPU0,
        "Other Board A MIG 1g.6gb",
        (5, 0),
        (2147483648, 6442450944),
        &OTHER_GI5,
    );
    let windows = window_requests(&requests);
    for (pid, bytes, instance) in [
        (4242, 1073741824.0, other::MIG3),
        (4343, 2147483648.0, other::MIG5),
    ] {
        let (got, id, parent) = process_memory(windows[1], pid);
        assert_eq!(got, bytes, "{pid}");
        assert_eq!(id.as_deref(), Some(instance), "{pid} on its instance");
        assert_eq!(parent.as_deref(), Some(other::GPU0), "{pid}");
    }
    assert!(
        !stderr.lines().any(|l| l.contains("WARN")),
        "no warning: {stderr}"
    );
}

/// A real process standing in for a GPU process: the simulators list it by PID.
fn sleeper() -> crate::kernel::ChildGuard {
    crate::kernel::ChildGuard::spawn(Command::new("sleep").arg("300")).expect("spawn sleep")
}

/// The one point of `name` on process `pid`'s resource whose `hw.gpu.task` / `nvidia.gpu.pipe`
/// is `task` (`None`: the metric has no point for the process).
fn process_point<'a>(
    request: &'a Value,
    pid: u32,
    name: &str,
    task: Option<(&str, &str)>,
) -> Option<&'a Value> {
    let resource =
        process_resource(request, pid).unwrap_or_else(|| panic!("no resource for {pid}"));
    let metric = metrics_of(resource)
        .into_iter()
        .find(|m| m["name"] == name)?;
    let matching: Vec<&Value> = points(metric)
        .into_iter()
        .filter(|p| match task {
            Some((key, want)) => attr_str(&p["attributes"], key).as_deref() == Some(want),
            None => true,
        })
        .collect();
    assert!(matching.len() <= 1, "{pid} {name}: {matching:?}");
    matching.first().copied()
}

/// The per-process activity of a process alone on its MIG instance: each metric's value, and
/// the instance on every point.
fn check_alone(request: &Value, pid: u32, instance: &str, parent: &str, want: [(&str, f64); 4]) {
    let rows = [
        ("process.gpu.utilization", Some(("hw.gpu.task", "general"))),
        ("process.gpu.sm.activity", None),
        ("process.gpu.dram.activity", None),
        (
            "process.gpu.pipe.activity",
            Some(("nvidia.gpu.pipe", "tensor")),
        ),
    ];
    for ((name, task), (key, value_want)) in rows.into_iter().zip(want) {
        let point = process_point(request, pid, name, task)
            .unwrap_or_else(|| panic!("{pid} alone on {instance} has no {name}"));
        let got = value(point);
        assert!(
            (got - value_want).abs() < 1e-9,
            "{pid} {name} ({key}): {got} != {value_want}"
        );
        assert_eq!(
            attr_str(&point["attributes"], "hw.id").as_deref(),
            Some(instance),
            "{pid} {name}"
        );
        assert_eq!(
            attr_str(&point["attributes"], "hw.parent").as_deref(),
            Some(parent),
            "{pid} {name}"
        );
    }
}

/// Processes sharing a MIG instance: their memory, and no activity split between them.
fn check_shared(request: &Value, pid: u32, instance: &str, bytes: f64) {
    let (got, id, _) = process_memory(request, pid);
    assert_eq!(got, bytes, "{pid}'s memory");
    assert_eq!(id.as_deref(), Some(instance), "{pid}");
    for name in [
        "process.gpu.utilization",
        "process.gpu.sm.activity",
        "process.gpu.dram.activity",
        "process.gpu.pipe.activity",
    ] {
        assert!(
            process_point(request, pid, name, None).is_none(),
            "{pid} shares {instance}, yet has {name}: a split NVML cannot give"
        );
    }
}

#[test]
fn run_gives_a_process_alone_on_its_instance_its_gpm_and_splits_no_shared_instance_sim() {
    // shared-gpus.toml: GI 1 holds one process, GI 2 two; the time-sliced GPU's are irrelevant.
    let alone = sleeper();
    let pair = [sleeper(), sleeper()];
    let slices = [sleeper(), sleeper()];
    let receiver = Receiver::start(ReceiverOptions::default());
    let scenario = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios/shared-gpus.toml"),
    )
    .expect("scenario");
    let gpulse = Gpulse::start(
        &scenario,
        &[],
        &["--sample-interval", "100ms", "--export-interval", "1s"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
            ("SHARED_MIG_ALONE_PID", alone.pid().to_string()),
            (
                "SHARED_MIG_PAIR_PIDS",
                format!("{},{}", pair[0].pid(), pair[1].pid()),
            ),
            ("SHARED_SLICE_A_PID", slices[0].pid().to_string()),
            ("SHARED_SLICE_B_PID", slices[1].pid().to_string()),
        ],
    );
    let requests = receiver.wait_for(|r| window_requests(r).len() >= 2, Duration::from_secs(60));
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );
    let request = window_requests(&requests)[1];
    const GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000000";
    check_alone(
        request,
        alone.pid(),
        "MIG-5a4ed000-0001-5000-8000-000000000001",
        GPU,
        [
            ("graphics", 0.6),
            ("sm", 0.5),
            ("dram", 0.2),
            ("tensor", 0.25),
        ],
    );
    for child in &pair {
        check_shared(
            request,
            child.pid(),
            "MIG-5a4ed000-0002-5000-8000-000000000002",
            (8192 * MIB) as f64,
        );
    }
    // The shared instance's own activity is still there, on the node resource.
    let metrics = node_metrics(&requests);
    let gr = point_of(
        &metrics,
        "nvidia.gpu.graphics.activity",
        "MIG-5a4ed000-0002-5000-8000-000000000002",
        None,
    )
    .expect("GI 2's graphics activity");
    assert!((value(gr) - 0.9).abs() < 1e-9);
}

#[test]
fn run_gives_a_process_alone_on_its_instance_its_gpm_and_splits_no_shared_instance_other() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = crate::other_nvml::build_library(dir.path());
    // The library puts process i in GI 3 or GI 5 by i % 2: a and c share GI 3, b is alone on 5.
    let (a, b, c) = (sleeper(), sleeper(), sleeper());
    let pids = format!(
        "{}:1073741824,{}:2147483648,{}:536870912",
        a.pid(),
        b.pid(),
        c.pid()
    );
    let (requests, stderr) = run_other(&lib, &pids);
    let request = window_requests(&requests)[1];
    check_alone(
        request,
        b.pid(),
        other::MIG5,
        other::GPU0,
        [
            ("graphics", 0.09),
            ("sm", 0.075),
            ("dram", 0.03),
            ("tensor", 0.0),
        ],
    );
    check_shared(request, a.pid(), other::MIG3, 1073741824.0);
    check_shared(request, c.pid(), other::MIG3, 536870912.0);
    // GI 3 counts both processes' memory as used.
    let metrics = node_metrics(&requests);
    let used = point_of(&metrics, "hw.gpu.memory.usage", other::MIG3, None).expect("GI 3 memory");
    assert_eq!(value(used), 1073741824.0 + 536870912.0);
    assert!(
        !stderr.lines().any(|l| l.contains("WARN")),
        "no warning: {stderr}"
    );
}

/// `gpulse snapshot`'s table for a scenario (stdout).
fn snapshot_table(scenario: &Path) -> String {
    let output = Command::new(gpulse_bin())
        .args(["snapshot", "--nvml-lib"])
        .arg(crate::sampling::sim_lib())
        .env("NVML_SIM_SCENARIO", scenario)
        .env("GPULSE_KUBELET_SOCKET", "none")
        .output()
        .expect("run gpulse snapshot");
    assert!(
        output.status.success(),
        "gpulse snapshot failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 table")
}

#[test]
fn snapshot_table_shows_each_processs_instance_only_when_one_runs_on_mig() {
    let table = snapshot_table(&scenario_path());
    let header = table
        .lines()
        .find(|l| l.starts_with("GPU") && l.contains("PID"))
        .unwrap_or_else(|| panic!("no process header:\n{table}"));
    assert!(header.contains("MIG instance"), "{header}");
    let row = |pid: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == pid))
            .unwrap_or_else(|| panic!("no row for {pid}:\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row("6101")[..4], ["0", "GI1", "CI0", "3g.40gb"]);
    assert_eq!(row("6102")[..4], ["0", "GI2", "CI0", "3g.40gb"]);
    assert_eq!(row("6201")[..3], ["1", "-", "6201"], "GPU 1 is whole");

    let whole = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios/default.toml");
    let table = snapshot_table(&whole);
    assert!(table.contains("PID"), "{table}");
    assert!(
        !table.contains("MIG instance"),
        "no MIG, no column:\n{table}"
    );
}

/// `labels` (a sample's label text) as (name, value) pairs, in order.
fn label_pairs(labels: &str) -> Vec<(&str, &str)> {
    labels
        .split("\",")
        .filter_map(|pair| pair.split_once("=\""))
        .map(|(k, v)| (k, v.trim_end_matches('"')))
        .collect()
}

#[test]
fn metrics_with_dcgm_names_give_each_mig_instance_its_series_sim() {
    // shared-gpus.toml: GPU 0 in MIG mode, GI 1 (3g.40gb) holding one process of 20480 MiB at
    // graphics 0.6, GI 2 (3g.40gb) two of 8192 MiB at graphics 0.9; GPU 1 whole.
    let alone = sleeper();
    let pair = [sleeper(), sleeper()];
    let slices = [sleeper(), sleeper()];
    let receiver = Receiver::start(ReceiverOptions::default());
    let scenario = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios/shared-gpus.toml"),
    )
    .expect("scenario");
    let gpulse = Gpulse::start(
        &scenario,
        &[],
        &[
            "--sample-interval",
            "100ms",
            "--export-interval",
            "1s",
            "--prometheus-addr",
            "127.0.0.1:0",
            "--prometheus-names",
            "dcgm",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_base()),
            ("SHARED_MIG_ALONE_PID", alone.pid().to_string()),
            (
                "SHARED_MIG_PAIR_PIDS",
                format!("{},{}", pair[0].pid(), pair[1].pid()),
            ),
            ("SHARED_SLICE_A_PID", slices[0].pid().to_string()),
            ("SHARED_SLICE_B_PID", slices[1].pid().to_string()),
        ],
    );
    let port = crate::energy::metrics_port(&gpulse);
    // Two windows: GPM needs a pair of samples, which the first window may lack.
    let text = crate::prometheus::scrape_until(port, |t| {
        crate::prometheus::series(t, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            .iter()
            .filter(|(l, _)| l.contains("GPU_I_ID="))
            .count()
            == 2
    });
    let (status, stderr) = gpulse.terminate();
    assert!(
        status.success(),
        "gpulse run exited with {status}: {stderr}"
    );

    const GPU: &str = "GPU-5a4ed000-0000-4000-8000-000000000000";
    // (GI, FB_USED, FB_FREE in MiB, GR_ENGINE, SM_ACTIVE, PIPE_TENSOR, DRAM)
    let expected = [
        ("1", 20480.0, 20480.0, 0.6, 0.5, 0.25, 0.2),
        ("2", 16384.0, 24576.0, 0.9, 0.8, 0.5, 0.4),
    ];
    for (gi, used, free, graphics, sm, tensor, dram) in expected {
        for (name, want) in [
            ("DCGM_FI_DEV_FB_USED", used),
            ("DCGM_FI_DEV_FB_FREE", free),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", graphics),
            ("DCGM_FI_PROF_SM_ACTIVE", sm),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", tensor),
            ("DCGM_FI_PROF_DRAM_ACTIVE", dram),
        ] {
            let all = crate::prometheus::series(&text, name);
            let of_instance: Vec<_> = all
                .iter()
                .filter(|(l, _)| {
                    let labels = label_pairs(l);
                    labels.contains(&("UUID", GPU)) && labels.contains(&("GPU_I_ID", gi))
                })
                .collect();
            assert_eq!(of_instance.len(), 1, "{name} of GI {gi}: {all:?}");
            let (labels, value) = of_instance[0];
            assert!(
                (value - want).abs() < 1e-9,
                "{name} of GI {gi}: {value}, want {want}"
            );
            // dcgm-exporter's labels, in its order: the GPU's, then the instance's after
            // modelName.
            let names: Vec<&str> = label_pairs(labels).iter().map(|(k, _)| *k).collect();
            let at = |n: &str| {
                names
                    .iter()
                    .position(|k| *k == n)
                    .unwrap_or_else(|| panic!("{name} of GI {gi} lacks {n}: {labels}"))
            };
            assert_eq!(
                &names[..4],
                ["gpu", "UUID", "pci_bus_id", "device"],
                "{labels}"
            );
            assert_eq!(
                (at("GPU_I_PROFILE"), at("GPU_I_ID")),
                (at("modelName") + 1, at("modelName") + 2),
                "{labels}"
            );
            assert!(labels.contains("GPU_I_PROFILE=\"3g.40gb\""), "{labels}");
            assert!(labels.contains("gpu=\"0\"") && labels.contains("device=\"nvidia0\""));
            assert!(at("Hostname") > at("GPU_I_ID"), "{labels}");
        }
    }
    // The whole GPUs keep their own series, without instance labels.
    let fb_used = crate::prometheus::series(&text, "DCGM_FI_DEV_FB_USED");
    for gpu in ["0", "1"] {
        let whole: Vec<_> = fb_used
            .iter()
            .filter(|(l, _)| l.starts_with(&format!("gpu=\"{gpu}\"")) && !l.contains("GPU_I_"))
            .collect();
        assert_eq!(whole.len(), 1, "GPU {gpu}: {fb_used:?}");
    }
    assert!(
        !fb_used
            .iter()
            .any(|(l, _)| l.starts_with("gpu=\"1\"") && l.contains("GPU_I_")),
        "GPU 1 is not in MIG mode: {fb_used:?}"
    );
}
