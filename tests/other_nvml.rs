//! gpulse against a second, independent `libnvidia-ml.so.1` (tests/fixtures/other-nvml), written
//! from NVIDIA's header with fixed values and deliberately missing functions: what gpulse reports
//! must be exactly what that library returns, and nothing the simulator would have added.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{points_where, run_against};
use crate::run::{attr_str, metrics_of, points, process_resource, value, window_requests};
use crate::sampling::gpulse_bin;

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/other-nvml/other_nvml.c"
);
const UUID_A: &str = "GPU-0ther000-1111-2222-3333-444444444444";
const UUID_B: &str = "GPU-0ther999-8888-7777-6666-555555555555";

/// GPU 0's GPM metrics as the library's header comment documents them (percent / 100).
const GPM_A: [(&str, f64); 12] = [
    ("sm_activity", 0.62),
    ("sm_occupancy", 0.315),
    ("tensor_activity", 0.125),
    ("tensor_hmma_activity", 0.11),
    ("tensor_imma_activity", 0.015),
    ("tensor_dfma_activity", 0.0),
    ("dram_activity", 0.4425),
    ("fp16_activity", 0.0975),
    ("fp32_activity", 0.27),
    ("fp64_activity", 0.005),
    ("integer_activity", 0.0625),
    ("graphics_activity", 0.71),
];

/// Builds the library with the C compiler Rust links with (`$CC`, else `cc`).
pub fn build_library(dir: &Path) -> PathBuf {
    let out = dir.join("libnvidia-ml.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(SOURCE)
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}` ({e}); set CC"));
    assert!(status.success(), "`{cc}` failed to build {SOURCE}");
    out
}

fn snapshot(lib: &Path, pids: &str) -> Value {
    let output = Command::new(gpulse_bin())
        .args(["snapshot", "--format", "json", "--nvml-lib"])
        .arg(lib)
        .env("OTHER_NVML_PIDS", pids)
        .output()
        .expect("run gpulse snapshot");
    assert!(
        output.status.success(),
        "gpulse snapshot failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("snapshot JSON")
}

#[test]
fn snapshot_reports_exactly_what_another_nvml_returns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = build_library(dir.path());
    let me = std::process::id();
    let s = snapshot(&lib, &format!("{me}:1048576"));

    assert_eq!(s["driver_version"], "999.12.34");
    assert_eq!(s["cuda_driver_version"], Value::Null, "not exported");
    let devices = s["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2);
    let a = &devices[0];
    let expected_a = serde_json::json!({
        "index": 0, "uuid": UUID_A, "name": "Other Board A", "pci_bus_id": "00000000:3B:00.0",
        "status": "ok",
        // v1 memory call only: no reserved share.
        "memory_total_bytes": 25769803776u64, "memory_used_bytes": 1073741824u64,
        "memory_free_bytes": 24696061952u64, "memory_reserved_bytes": null,
        "utilization_gpu": 0.37, "utilization_memory": 0.11,
        "temperature_celsius": 52.0, "power_watts": 123.456, "power_limit_watts": 300.0,
        "graphics_clock_mhz": 1410, "sm_clock_mhz": 1395, "memory_clock_mhz": 1593,
        "bar1_total_bytes": 268435456u64, "bar1_used_bytes": 12582912u64,
        "bar1_free_bytes": 255852544u64,
        // By field id (NVML_FI_DEV_MEMORY_TEMP), in the one nvmlDeviceGetFieldValues call.
        "memory_temperature_celsius": 68.0,
    });
    for (key, want) in expected_a.as_object().expect("object") {
        assert_eq!(&a[key], want, "GPU 0 {key}: {a}");
    }
    // Functions the library does not export are absent, not zero.
    for key in [
        "utilization_encoder",
        "utilization_decoder",
        "energy_joules",
        "fan_speed",
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
        "throttle_reasons",
        "ecc_corrected_total",
        "ecc_uncorrected_total",
        "performance_state",
        "pcie_link_generation",
        "pcie_link_width",
    ] {
        assert_eq!(a[key], Value::Null, "GPU 0 {key} should be absent: {a}");
    }
    // GPM (GPU 0 only), the library's percent as ratios.
    for (key, want) in GPM_A {
        assert_eq!(a[key], Value::from(want), "GPU 0 {key}: {a}");
    }
    // NVLink (GPU 0 only): every link as the library's header comment gives it, read with
    // scopeId = link (through nvml-wrapper's own field call every link would read link 0).
    let links: Vec<Value> = (0..4u64)
        .map(|n| {
            serde_json::json!({
                "link": n, "active": true,
                "tx_bytes_total": 1_000_000 * (n + 1) * 1024,
                "rx_bytes_total": 500_000 * (n + 1) * 1024,
                "crc_flit_errors": n, "crc_data_errors": 0,
                "replay_errors": if n == 1 { 2 } else { 0 },
                "recovery_errors": if n == 3 { 1 } else { 0 },
            })
        })
        .collect();
    assert_eq!(a["nvlink"], Value::from(links), "GPU 0 links: {a}");
    let b = &devices[1];
    assert_eq!(b["uuid"], UUID_B);
    assert!(b.get("nvlink").is_none(), "GPU 1 has no NVLink: {b}");
    for (key, _) in GPM_A {
        assert_eq!(b[key], Value::Null, "GPU 1 has no GPM: {key} {b}");
    }
    assert_eq!(b["utilization_gpu"], 0.0, "a real zero stays zero");
    assert_eq!(b["memory_used_bytes"], 0);
    assert_eq!(b["power_watts"], 61.0);
    assert_eq!(
        b["memory_temperature_celsius"],
        Value::Null,
        "GPU 1 answers its memory temperature's own nvmlReturn NOT_SUPPORTED: {b}"
    );
    for key in ["bar1_total_bytes", "bar1_used_bytes", "bar1_free_bytes"] {
        assert_eq!(
            b[key],
            Value::Null,
            "GPU 1 answers BAR1 NOT_SUPPORTED: {key} {b}"
        );
    }
    // Row remapper and PCIe replays, as the library documents them.
    assert_eq!(
        a["remapped_rows"],
        json!({"correctable": 3, "uncorrectable": 0, "pending": false, "failure": false})
    );
    assert_eq!(
        b["remapped_rows"],
        json!({"correctable": 0, "uncorrectable": 2, "pending": true, "failure": false})
    );
    assert_eq!(a["pcie_replays_total"], 4);
    assert_eq!(b["pcie_replays_total"], 0);

    let processes = s["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{processes:?}");
    let p = &processes[0];
    assert_eq!(p["pid"], me);
    assert_eq!(p["device_uuid"], UUID_A);
    assert_eq!(p["kind"], "compute");
    assert_eq!(p["gpu_memory_bytes"], 1048576);
    assert_eq!(
        p["sm_utilization"],
        Value::Null,
        "no per-process utilisation call"
    );
    assert_eq!(
        p["workload"]["pid"], me,
        "attributed from this host's /proc"
    );
    assert_eq!(p["workload"]["attributed_by"], "host_pid");
}

#[test]
fn run_exports_another_nvmls_values_under_real_process_resources() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = build_library(dir.path());
    let mut child = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("start a child process");
    let pid = child.id();
    let (requests, stderr) = run_against(
        &lib,
        &format!("{pid}:2147483648"),
        2,
        Duration::from_secs(30),
    );
    let _ = child.kill();
    let _ = child.wait();

    let metrics = window_requests(&requests);
    assert!(metrics.len() >= 2, "{} requests: {stderr}", metrics.len());
    let request = metrics[1];
    let node = &request["request"]["resourceMetrics"][0];
    let node_metrics = metrics_of(node);
    let device_value = |name: &str, uuid: &str| -> Option<f64> {
        points_where(node, name, "hw.id", uuid)
            .first()
            .map(|p| value(p))
    };
    assert_eq!(device_value("hw.power", UUID_A), Some(123.456));
    assert_eq!(device_value("hw.temperature", UUID_B), Some(33.0));
    assert_eq!(
        device_value("hw.gpu.memory.limit", UUID_B),
        Some(85899345920.0)
    );
    assert_eq!(
        device_value("hw.gpu.memory.reserved", UUID_A),
        None,
        "v1 call only"
    );
    assert_eq!(device_value("hw.energy", UUID_A), None, "not exported");
    // BAR1: one NVML call, three metrics; absent where the library says NOT_SUPPORTED.
    assert_eq!(
        device_value("nvidia.gpu.bar1.memory.usage", UUID_A),
        Some(12582912.0)
    );
    assert_eq!(
        device_value("nvidia.gpu.bar1.memory.limit", UUID_A),
        Some(268435456.0)
    );
    assert_eq!(
        device_value("nvidia.gpu.bar1.memory.free", UUID_A),
        Some(255852544.0)
    );
    assert_eq!(device_value("nvidia.gpu.bar1.memory.usage", UUID_B), None);

    // GPM: exactly the library's values on GPU 0, nothing on GPU 1 (not supported).
    let gpm_value = |name: &str, pipe: Option<&str>, uuid: &str| -> Option<f64> {
        let metric = node_metrics.iter().find(|m| m["name"] == name)?;
        points(metric)
            .into_iter()
            .find(|p| {
                attr_str(&p["attributes"], "hw.id").as_deref() == Some(uuid)
                    && attr_str(&p["attributes"], "nvidia.gpu.pipe").as_deref() == pipe
            })
            .map(value)
    };
    for (name, pipe, want) in [
        ("nvidia.gpu.sm.activity", None, 0.62),
        ("nvidia.gpu.sm.activity.max", None, 0.62),
        ("nvidia.gpu.sm.activity.min", None, 0.62),
        ("nvidia.gpu.sm.occupancy", None, 0.315),
        ("nvidia.gpu.dram.activity", None, 0.4425),
        ("nvidia.gpu.graphics.activity", None, 0.71),
        ("nvidia.gpu.pipe.activity", Some("tensor"), 0.125),
        ("nvidia.gpu.pipe.activity", Some("tensor.hmma"), 0.11),
        ("nvidia.gpu.pipe.activity", Some("tensor.imma"), 0.015),
        ("nvidia.gpu.pipe.activity", Some("tensor.dfma"), 0.0),
        ("nvidia.gpu.pipe.activity", Some("fp16"), 0.0975),
        ("nvidia.gpu.pipe.activity", Some("fp32"), 0.27),
        ("nvidia.gpu.pipe.activity", Some("fp64"), 0.005),
        ("nvidia.gpu.pipe.activity", Some("integer"), 0.0625),
    ] {
        let got = gpm_value(name, pipe, UUID_A)
            .unwrap_or_else(|| panic!("no {name} {pipe:?} point for GPU 0: {node_metrics:?}"));
        assert!(
            (got - want).abs() < 1e-9,
            "{name} {pipe:?}: {got} != {want}"
        );
        assert_eq!(gpm_value(name, pipe, UUID_B), None, "GPU 1 has no GPM");
    }
    // Health: the library's remapped rows, PCIe replays and violation time, exactly.
    let with_attr = |name: &str, key: &str, val: &str, uuid: &str| -> Option<f64> {
        let metric = node_metrics.iter().find(|m| m["name"] == name)?;
        points(metric)
            .into_iter()
            .find(|p| {
                attr_str(&p["attributes"], "hw.id").as_deref() == Some(uuid)
                    && attr_str(&p["attributes"], key).as_deref() == Some(val)
            })
            .map(value)
    };
    let remap = "nvidia.gpu.memory.remapped_rows";
    let kind = "nvidia.gpu.memory.remap.type";
    assert_eq!(with_attr(remap, kind, "correctable", UUID_A), Some(3.0));
    assert_eq!(with_attr(remap, kind, "uncorrectable", UUID_A), Some(0.0));
    assert_eq!(with_attr(remap, kind, "uncorrectable", UUID_B), Some(2.0));
    assert_eq!(
        device_value("nvidia.gpu.memory.remap.pending", UUID_A),
        Some(0.0)
    );
    assert_eq!(
        device_value("nvidia.gpu.memory.remap.pending", UUID_B),
        Some(1.0)
    );
    assert_eq!(
        device_value("nvidia.gpu.memory.remap.failed", UUID_B),
        Some(0.0)
    );
    let errors = |uuid| with_attr("hw.errors", "error.type", "pcie_replay", uuid);
    assert_eq!(errors(UUID_A), Some(4.0));
    assert_eq!(errors(UUID_B), Some(0.0));
    let throttle = |reason, uuid| {
        with_attr(
            "nvidia.gpu.throttle.time",
            "nvidia.gpu.throttle.reason",
            reason,
            uuid,
        )
    };
    assert_eq!(throttle("power", UUID_A), Some(1.5));
    assert_eq!(throttle("thermal", UUID_A), Some(0.25));
    assert_eq!(throttle("thermal", UUID_B), Some(7.0));
    assert_eq!(throttle("sync_boost", UUID_B), Some(0.0));

    // NVLink: per link of GPU 0 exactly the library's counters; nothing for GPU 1.
    let link_value = |name: &str, link: i64, key: &str, val: Option<&str>, uuid: &str| {
        let metric = node_metrics.iter().find(|m| m["name"] == name)?;
        points(metric)
            .into_iter()
            .find(|p| {
                let a = &p["attributes"];
                attr_str(a, "hw.id").as_deref() == Some(uuid)
                    && attr_str(a, "nvidia.gpu.nvlink.link") == Some(link.to_string())
                    && val.is_none_or(|v| attr_str(a, key).as_deref() == Some(v))
            })
            .map(value)
    };
    for n in 0..4i64 {
        let io = |dir| {
            link_value(
                "nvidia.gpu.nvlink.io",
                n,
                "network.io.direction",
                Some(dir),
                UUID_A,
            )
        };
        assert_eq!(
            io("transmit"),
            Some((1_000_000 * (n + 1) * 1024) as f64),
            "link {n}"
        );
        assert_eq!(
            io("receive"),
            Some((500_000 * (n + 1) * 1024) as f64),
            "link {n}"
        );
        assert_eq!(
            link_value("nvidia.gpu.nvlink.state", n, "", None, UUID_A),
            Some(1.0),
            "link {n} active"
        );
        let errors = |t| link_value("hw.errors", n, "error.type", Some(t), UUID_A);
        assert_eq!(errors("nvlink_crc"), Some(n as f64), "link {n}");
        assert_eq!(
            errors("nvlink_replay"),
            Some(if n == 1 { 2.0 } else { 0.0 })
        );
        assert_eq!(
            errors("nvlink_recovery"),
            Some(if n == 3 { 1.0 } else { 0.0 })
        );
    }
    assert_eq!(
        link_value("nvidia.gpu.nvlink.io", 4, "", None, UUID_A),
        None,
        "GPU 0 has links 0-3 only"
    );
    for name in ["nvidia.gpu.nvlink.io", "nvidia.gpu.nvlink.state"] {
        assert_eq!(
            device_value(name, UUID_B),
            None,
            "GPU 1 has no NVLink: {name}"
        );
    }
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("GPM") && l.contains("WARN")),
        "GPM not supported on GPU 1 is no warning: {stderr}"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("NVLink") && l.contains("WARN")),
        "no NVLink on GPU 1 is no warning: {stderr}"
    );

    let resource = process_resource(request, pid)
        .unwrap_or_else(|| panic!("no resource for {pid}: {request}"));
    let attributes = &resource["resource"]["attributes"];
    assert_eq!(
        attr_str(attributes, "process.executable.name").as_deref(),
        Some("sleep")
    );
    let memory = metrics_of(resource)
        .into_iter()
        .find(|m| m["name"] == "process.gpu.memory.usage")
        .expect("process.gpu.memory.usage");
    let point = points(memory)[0];
    assert_eq!(value(point), 2147483648.0);
    // GPU 0 is in MIG mode and the library runs its first process in GI 3: the point is on that
    // MIG device, under GPU 0.
    assert_eq!(
        attr_str(&point["attributes"], "hw.id").as_deref(),
        Some("MIG-0ther000-aaaa-5bbb-8ccc-dddddddddd01")
    );
    assert_eq!(
        attr_str(&point["attributes"], "hw.parent").as_deref(),
        Some(UUID_A)
    );
}
