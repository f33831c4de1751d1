//! The request builder's contract, checked on hand-made windows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Metric, NumberDataPoint, ResourceMetrics,
};

use super::*;
use crate::attribution::{AttributionMethod, ProcessUsage};
use crate::export::json::to_otlp_json_line;
use crate::export::metrics::data_point_count;
use crate::sampling::{DeviceInfo, DeviceStatus, DeviceWindow, ProcessKind, ProcessWindow, Window};
use crate::schema::{throttle_reasons, DeviceField, Instrument};

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn g(mean: f64, min: f64, max: f64, last: f64) -> Gauge {
    Gauge {
        mean,
        min,
        max,
        last,
        count: 10,
    }
}

fn info(index: u32) -> Arc<DeviceInfo> {
    Arc::new(DeviceInfo {
        index,
        uuid: format!("GPU-{index:04}"),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", index + 0x10),
        serial: None,
        minor_number: Some(index),
        memory_total_bytes: Some(80 << 30),
        max_sm_clock_mhz: Some(1980),
        max_memory_clock_mhz: Some(2619),
        compute_capability: Some("9.0".into()),
        fan_count: Some(0),
    })
}

fn bare_device(index: u32) -> DeviceWindow {
    DeviceWindow::empty(info(index), t(100))
}

fn window(devices: Vec<DeviceWindow>, processes: Vec<ProcessWindow>) -> Window {
    Window {
        start: t(1000),
        end: t(1010),
        sample_count: 10,
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some("12.4".into()),
        devices,
        processes,
        xid_events: Vec::new(),
    }
}

fn process(pid: u32, device: u32) -> ProcessWindow {
    ProcessWindow {
        pid,
        device_index: device,
        device_uuid: format!("GPU-{device:04}"),
        kind: ProcessKind::Compute,
        first_seen: t(900 + u64::from(device)),
        samples: 1,
        gpu_memory_bytes: Some(g(1e9, 5e8, 2e9, 1.5e9)),
        sm_utilization: Some(g(0.5, 0.1, 0.9, 0.4)),
        memory_utilization: None,
        encoder_utilization: None,
        decoder_utilization: None,
    }
}

fn node() -> NodeIdentity {
    NodeIdentity {
        host_name: "node-a".into(),
        service_name: "gpulse".into(),
        service_instance_id: "i-1".into(),
        service_version: "0.1.0".into(),
        extra_attributes: Vec::new(),
    }
}

fn build(w: &Window) -> ExportMetricsServiceRequest {
    metrics_request(&AttributedWindow::unattributed(w.clone()), &node())
}

fn metric<'a>(rm: &'a ResourceMetrics, name: &str) -> Option<&'a Metric> {
    rm.scope_metrics[0].metrics.iter().find(|m| m.name == name)
}

fn points<'a>(rm: &'a ResourceMetrics, name: &str) -> &'a [NumberDataPoint] {
    match metric(rm, name).and_then(|m| m.data.as_ref()) {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

fn attr<'a>(p: &'a NumberDataPoint, key: &str) -> Option<&'a any_value::Value> {
    p.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.into())
}

fn value(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsDouble(v)) => v,
        Some(number_data_point::Value::AsInt(v)) => v as f64,
        None => f64::NAN,
    }
}

/// The point of `name` whose attribute `key` is `val`.
fn point_with<'a>(
    rm: &'a ResourceMetrics,
    name: &str,
    key: &str,
    val: &str,
) -> &'a NumberDataPoint {
    points(rm, name)
        .iter()
        .find(|p| attr(p, key) == Some(&s(val)))
        .unwrap_or_else(|| panic!("no {name} point with {key}={val}"))
}

#[test]
fn device_values_attributes_and_instruments() {
    let mut d = bare_device(0);
    d.fields
        .set_gauge(DeviceField::UtilizationGpu, Some(g(0.6, 0.2, 0.95, 0.5)));
    d.fields
        .set_gauge(DeviceField::UtilizationEncoder, Some(g(0.1, 0.0, 0.3, 0.1)));
    d.fields.set_gauge(
        DeviceField::MemoryUsed,
        Some(Gauge::single((40u64 << 30) as f64)),
    );
    d.fields
        .set_gauge(DeviceField::Temperature, Some(g(61.5, 60.0, 66.0, 62.0)));
    d.fields
        .set_gauge(DeviceField::Power, Some(g(350.0, 100.0, 700.0, 300.0)));
    d.fields
        .set_gauge(DeviceField::PowerLimit, Some(Gauge::single(700.0)));
    d.fields.set_total(DeviceField::Energy, Some(12345.5));
    d.fields.set_gauge(
        DeviceField::SmClock,
        Some(g(1800.0, 1500.0, 1980.0, 1800.0)),
    );
    d.fields.set_total(DeviceField::PcieRx, Some(777.0));
    d.fields.set_total(DeviceField::EccUncorrected, Some(2.0));
    d.xid_total = 3;
    d.fields
        .set_gauge(DeviceField::PerformanceState, Some(Gauge::single(2.0)));
    let req = build(&window(vec![d], Vec::new()));
    let rm = &req.resource_metrics[0];

    // (metric, attribute key, attribute value, expected value)
    let cases: &[(&str, &str, &str, f64)] = &[
        ("hw.gpu.utilization", "hw.gpu.task", "general", 0.6),
        ("hw.gpu.utilization.max", "hw.gpu.task", "general", 0.95),
        ("hw.gpu.utilization.min", "hw.gpu.task", "general", 0.2),
        ("hw.gpu.utilization", "hw.gpu.task", "encoder", 0.1),
        (
            "hw.gpu.memory.usage",
            "hw.type",
            "gpu",
            (40u64 << 30) as f64,
        ),
        (
            "hw.gpu.memory.limit",
            "hw.type",
            "gpu",
            (80u64 << 30) as f64,
        ),
        ("hw.temperature", "hw.type", "gpu", 61.5),
        ("hw.temperature.max", "hw.type", "gpu", 66.0),
        ("hw.power", "hw.type", "gpu", 350.0),
        ("hw.power.max", "hw.type", "gpu", 700.0),
        ("nvidia.gpu.power.limit", "hw.type", "gpu", 700.0),
        ("hw.energy", "hw.type", "gpu", 12345.5),
        ("nvidia.gpu.clock", "nvidia.gpu.clock.type", "sm", 1800.0),
        ("hw.gpu.io", "network.io.direction", "receive", 777.0),
        ("hw.errors", "error.type", "uncorrected", 2.0),
        ("hw.errors", "error.type", "xid", 3.0),
        ("hw.status", "hw.state", "ok", 1.0),
        ("hw.status", "hw.state", "failed", 0.0),
        ("nvidia.gpu.performance_state", "hw.type", "gpu", 2.0),
    ];
    for (name, key, val, want) in cases {
        let p = point_with(rm, name, key, val);
        assert_eq!(value(p), *want, "{name} {key}={val}");
        assert_eq!(attr(p, "hw.id"), Some(&s("GPU-0000")), "{name}");
        assert_eq!(attr(p, "hw.vendor"), Some(&s("NVIDIA")), "{name}");
        assert_eq!(
            attr(p, "hw.model"),
            Some(&s("NVIDIA H100 80GB HBM3")),
            "{name}"
        );
        assert_eq!(
            attr(p, "hw.driver_version"),
            Some(&s("550.54.15")),
            "{name}"
        );
        assert_eq!(
            attr(p, "gpu.pci_address"),
            Some(&s("00000000:10:00.0")),
            "{name}"
        );
        assert_eq!(
            attr(p, "gpu.index"),
            Some(&any_value::Value::IntValue(0)),
            "{name}"
        );
    }
    // Unknown fields: no point, and no metric at all when no device has them.
    for name in [
        "hw.gpu.memory.free",
        "nvidia.gpu.fan.speed",
        "hw.gpu.memory.utilization",
    ] {
        assert!(metric(rm, name).is_none(), "{name} must be omitted");
    }
    assert_eq!(
        points(rm, "hw.gpu.io").len(),
        1,
        "transmit unknown: omitted"
    );
    assert_eq!(
        points(rm, "hw.errors").len(),
        2,
        "corrected unknown: omitted {:?}",
        points(rm, "hw.errors")
    );
    assert!(
        metric(rm, "nvidia.gpu.throttle").is_none(),
        "unknown throttle state: nothing"
    );

    for (name, instrument) in [
        ("hw.gpu.utilization", Instrument::Gauge),
        ("hw.energy", Instrument::Counter),
        ("hw.gpu.memory.usage", Instrument::UpDownCounter),
        ("hw.status", Instrument::UpDownCounter),
    ] {
        let m = metric(rm, name).expect(name);
        match (&m.data, instrument) {
            (Some(Data::Gauge(_)), Instrument::Gauge) => {}
            (Some(Data::Sum(s)), Instrument::Counter) => {
                assert!(s.is_monotonic);
                assert_eq!(
                    s.aggregation_temporality,
                    AggregationTemporality::Cumulative as i32
                );
            }
            (Some(Data::Sum(s)), Instrument::UpDownCounter) => assert!(!s.is_monotonic),
            (data, _) => panic!("{name}: unexpected {data:?}"),
        }
    }
}

#[test]
fn throttle_reasons_known_inactive_are_zero() {
    let mut d = bare_device(0);
    d.throttle_active_ratio = Some(BTreeMap::from([(0x4, 0.25), (0x40, 1.0), (0x1000, 0.5)]));
    let req = build(&window(vec![d], Vec::new()));
    let rm = &req.resource_metrics[0];
    let cases = [
        ("sw_power_cap", 0.25),
        ("hw_thermal_slowdown", 1.0),
        ("gpu_idle", 0.0),
        ("display_clock_setting", 0.0),
        ("other_0x1000", 0.5),
    ];
    for (reason, want) in cases {
        let p = point_with(
            rm,
            "nvidia.gpu.throttle",
            "nvidia.gpu.throttle.reason",
            reason,
        );
        assert_eq!(value(p), want, "{reason}");
    }
    assert_eq!(
        points(rm, "nvidia.gpu.throttle").len(),
        throttle_reasons().len() + 1
    );

    let mut none_active = bare_device(0);
    none_active.throttle_active_ratio = Some(BTreeMap::new());
    let req = build(&window(vec![none_active], Vec::new()));
    let pts = points(&req.resource_metrics[0], "nvidia.gpu.throttle");
    assert_eq!(pts.len(), throttle_reasons().len());
    assert!(pts.iter().all(|p| value(p) == 0.0));
}

#[test]
fn lost_device_reports_failed_status() {
    let mut d = bare_device(3);
    d.status = DeviceStatus::Lost;
    let req = build(&window(vec![d], Vec::new()));
    let rm = &req.resource_metrics[0];
    assert_eq!(
        value(point_with(rm, "hw.status", "hw.state", "failed")),
        1.0
    );
    assert_eq!(value(point_with(rm, "hw.status", "hw.state", "ok")), 0.0);
}

#[test]
fn xid_errors_are_one_series_per_code_and_a_zero_before_the_first() {
    let int = |p: &NumberDataPoint, k: &str| match attr(p, k) {
        Some(any_value::Value::IntValue(v)) => Some(*v),
        _ => None,
    };
    let xid_points = |d: DeviceWindow| -> Vec<(Option<i64>, f64)> {
        let req = build(&window(vec![d], Vec::new()));
        points(&req.resource_metrics[0], "hw.errors")
            .iter()
            .filter(|p| attr(p, "error.type") == Some(&s("xid")))
            .map(|p| (int(p, "nvidia.gpu.xid"), value(p)))
            .collect()
    };
    assert_eq!(xid_points(bare_device(0)), [(None, 0.0)]);
    let mut d = bare_device(0);
    d.xid_total = 4;
    d.xid_by_code = [(13, 1), (79, 3)].into_iter().collect();
    assert_eq!(xid_points(d), [(Some(13), 1.0), (Some(79), 3.0)]);
}

#[test]
fn nvlink_points_per_link_with_state_traffic_and_errors() {
    use crate::sampling::{NvLinkSample, NvLinkWindow};
    let mut d = bare_device(0);
    d.nvlink = vec![
        NvLinkWindow {
            last: NvLinkSample {
                link: 0,
                active: Some(true),
                tx_bytes_total: Some(2048),
                rx_bytes_total: Some(1024),
                crc_flit_errors: Some(2),
                crc_data_errors: Some(1),
                replay_errors: Some(5),
                recovery_errors: None,
            },
            tx_bytes_per_second: None,
            rx_bytes_per_second: None,
        },
        NvLinkWindow {
            last: NvLinkSample {
                link: 1,
                active: Some(false),
                ..Default::default()
            },
            tx_bytes_per_second: None,
            rx_bytes_per_second: None,
        },
    ];
    let req = build(&window(vec![d], Vec::new()));
    let rm = &req.resource_metrics[0];
    let link = |p: &NumberDataPoint| match attr(p, "nvidia.gpu.nvlink.link") {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("no link attribute: {other:?}"),
    };
    let io: Vec<(i64, f64)> = points(rm, "nvidia.gpu.nvlink.io")
        .iter()
        .map(|p| (link(p), value(p)))
        .collect();
    assert_eq!(io, [(0, 2048.0), (0, 1024.0)], "link 1 gives no traffic");
    assert_eq!(
        value(point_with(
            rm,
            "nvidia.gpu.nvlink.io",
            "network.io.direction",
            "receive"
        )),
        1024.0
    );
    let state: Vec<(i64, f64)> = points(rm, "nvidia.gpu.nvlink.state")
        .iter()
        .map(|p| (link(p), value(p)))
        .collect();
    assert_eq!(state, [(0, 1.0), (1, 0.0)]);
    assert_eq!(
        value(point_with(rm, "hw.errors", "error.type", "nvlink_crc")),
        3.0,
        "flit + data CRC"
    );
    assert_eq!(
        value(point_with(rm, "hw.errors", "error.type", "nvlink_replay")),
        5.0
    );
    assert!(
        !points(rm, "hw.errors")
            .iter()
            .any(|p| attr(p, "error.type") == Some(&s("nvlink_recovery"))),
        "a counter the link does not give has no point"
    );
    assert_eq!(
        metric(rm, "nvidia.gpu.nvlink.io").map(|m| m.unit.as_str()),
        Some("By")
    );
}

#[test]
fn timestamps_gauges_window_sums_counters_start() {
    let mut d = bare_device(0);
    d.fields
        .set_gauge(DeviceField::UtilizationGpu, Some(g(0.5, 0.5, 0.5, 0.5)));
    d.fields.set_total(DeviceField::Energy, Some(1.0));
    let req = build(&window(vec![d], vec![process(42, 0)]));
    let node_rm = &req.resource_metrics[0];
    let gauge = &points(node_rm, "hw.gpu.utilization")[0];
    assert_eq!(gauge.start_time_unix_nano, 1000 * 1_000_000_000);
    assert_eq!(gauge.time_unix_nano, 1010 * 1_000_000_000);
    let sum = &points(node_rm, "hw.energy")[0];
    assert_eq!(sum.start_time_unix_nano, 100 * 1_000_000_000);
    assert_eq!(sum.time_unix_nano, 1010 * 1_000_000_000);
    let proc_rm = &req.resource_metrics[1];
    let mem = &points(proc_rm, "process.gpu.memory.usage")[0];
    assert_eq!(mem.start_time_unix_nano, 900 * 1_000_000_000, "first_seen");
    assert_eq!(mem.time_unix_nano, 1010 * 1_000_000_000);
    assert_eq!(value(mem), 1.5e9, "last value");
}

#[test]
fn mig_instances_are_devices_under_their_gpu_and_carry_their_processes() {
    use crate::sampling::{GpmWindow, MigInstanceInfo, MigInstanceWindow};
    use crate::schema::GpmField;
    let mut gpu = bare_device(0);
    let instance = |gi: u32, uuid: &str, pids: Vec<u32>, sm: f64| MigInstanceWindow {
        info: Arc::new(MigInstanceInfo {
            uuid: uuid.into(),
            name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
            parent_uuid: "GPU-0000".into(),
            parent_index: 0,
            mig_index: gi - 1,
            gpu_instance_id: gi,
            compute_instance_id: 0,
        }),
        memory_used_bytes: Some(u64::from(gi) << 30),
        memory_free_bytes: Some(40 << 30),
        memory_total_bytes: Some(42_144_366_592),
        gpm: GpmWindow::of([(GpmField::SmActivity, g(sm, sm, sm, sm))]),
        pids,
    };
    gpu.mig_instances = vec![
        instance(1, "MIG-a", vec![42], 0.85),
        instance(2, "MIG-b", vec![], 0.05),
    ];
    let w = window(
        vec![gpu, bare_device(1)],
        vec![process(42, 0), process(7, 1)],
    );
    let req = build(&w);
    let node = &req.resource_metrics[0];
    let usage = points(node, "hw.gpu.memory.usage");
    let of = |id: &str| {
        usage
            .iter()
            .find(|p| attr(p, "hw.id") == Some(&s(id)))
            .unwrap_or_else(|| panic!("no memory point of {id}"))
    };
    let a = of("MIG-a");
    assert_eq!(value(a), f64::from(1u32 << 30));
    assert_eq!(attr(a, "hw.parent"), Some(&s("GPU-0000")));
    assert_eq!(
        attr(a, "hw.name"),
        Some(&s("NVIDIA H100 80GB HBM3 MIG 3g.40gb"))
    );
    assert_eq!(
        attr(a, "nvidia.gpu.mig.gpu_instance_id"),
        Some(&any_value::Value::IntValue(1))
    );
    assert_eq!(
        attr(a, "nvidia.gpu.mig.compute_instance_id"),
        Some(&any_value::Value::IntValue(0))
    );
    assert_eq!(value(of("MIG-b")), f64::from(2u32 << 30));
    let limit = points(node, "hw.gpu.memory.limit");
    let gpu_limit = limit
        .iter()
        .find(|p| attr(p, "hw.id") == Some(&s("GPU-0000")))
        .expect("the GPU's own limit point");
    assert_eq!(attr(gpu_limit, "hw.parent"), None, "a GPU has no parent");
    assert!(limit
        .iter()
        .any(|p| attr(p, "hw.id") == Some(&s("MIG-b")) && value(p) == 42_144_366_592.0));
    let sm = points(node, "nvidia.gpu.sm.activity");
    let sm_of = |id: &str| {
        sm.iter()
            .find(|p| attr(p, "hw.id") == Some(&s(id)))
            .map(value)
    };
    assert_eq!(sm_of("MIG-a"), Some(0.85));
    assert_eq!(sm_of("MIG-b"), Some(0.05));
    // Only memory and GPM: no utilisation or status point is invented for an instance.
    for name in ["hw.gpu.utilization", "hw.status", "hw.power"] {
        assert!(
            points(node, name)
                .iter()
                .all(|p| attr(p, "hw.parent").is_none()),
            "{name} has a MIG point"
        );
    }

    // PID 42 ran in MIG-a: its points carry the instance; PID 7 (GPU 1, no MIG) the GPU.
    let pid_points = |pid: i64| {
        req.resource_metrics
            .iter()
            .find(|rm| {
                rm.resource.as_ref().is_some_and(|r| {
                    r.attributes.iter().any(|kv| {
                        kv.key == "process.pid"
                            && kv.value.as_ref().and_then(|v| v.value.clone())
                                == Some(any_value::Value::IntValue(pid))
                    })
                })
            })
            .map(|rm| points(rm, "process.gpu.memory.usage").to_vec())
            .expect("process resource")
    };
    let p42 = pid_points(42);
    assert_eq!(attr(&p42[0], "hw.id"), Some(&s("MIG-a")));
    assert_eq!(attr(&p42[0], "hw.parent"), Some(&s("GPU-0000")));
    assert_eq!(
        attr(&p42[0], "nvidia.gpu.mig.gpu_instance_id"),
        Some(&any_value::Value::IntValue(1))
    );
    let p7 = pid_points(7);
    assert_eq!(attr(&p7[0], "hw.id"), Some(&s("GPU-0001")));
    assert_eq!(attr(&p7[0], "hw.parent"), None);
}

/// The resource of process `pid` in a request.
fn process_resource_of(req: &ExportMetricsServiceRequest, pid: i64) -> &ResourceMetrics {
    req.resource_metrics
        .iter()
        .find(|rm| {
            rm.resource.as_ref().is_some_and(|r| {
                r.attributes.iter().any(|kv| {
                    kv.key == "process.pid"
                        && kv.value.as_ref().and_then(|v| v.value.clone())
                            == Some(any_value::Value::IntValue(pid))
                })
            })
        })
        .unwrap_or_else(|| panic!("no resource of process {pid}"))
}

#[test]
fn a_process_alone_on_its_mig_instance_takes_its_gpm_and_shared_instances_are_not_split() {
    use crate::sampling::{GpmWindow, MigInstanceInfo, MigInstanceWindow};
    use crate::schema::GpmField as F;
    let activity = |graphics: f64, sm: f64, dram: f64, tensor: f64| {
        GpmWindow::of([
            (
                F::GraphicsActivity,
                g(graphics, graphics - 0.1, graphics + 0.1, graphics),
            ),
            (F::SmActivity, g(sm, sm, sm, sm)),
            (F::DramActivity, g(dram, dram, dram, dram)),
            (F::TensorActivity, g(tensor, tensor, tensor, tensor)),
            (F::Fp32Activity, g(0.7, 0.7, 0.7, 0.7)),
        ])
    };
    let instance = |uuid: &str, gi: u32, ci: u32, pids: Vec<u32>| MigInstanceWindow {
        info: Arc::new(MigInstanceInfo {
            uuid: uuid.into(),
            name: "NVIDIA H100 80GB HBM3 MIG 2g.20gb".into(),
            parent_uuid: "GPU-0000".into(),
            parent_index: 0,
            mig_index: gi,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        }),
        memory_used_bytes: Some(4 << 30),
        memory_free_bytes: Some(16 << 30),
        memory_total_bytes: Some(20 << 30),
        gpm: activity(0.6, 0.5, 0.2, 0.25),
        pids,
    };
    let mut gpu = bare_device(0);
    gpu.mig_instances = vec![
        // 42 alone; 43 and 44 share one; 45 and 46 each alone on a compute instance of one GPU
        // instance, whose GPM they share.
        instance("MIG-alone", 1, 0, vec![42]),
        instance("MIG-pair", 2, 0, vec![43, 44]),
        instance("MIG-ci0", 3, 0, vec![45]),
        instance("MIG-ci1", 3, 1, vec![46]),
    ];
    let on_mig = |pid: u32| ProcessWindow {
        sm_utilization: None,
        ..process(pid, 0)
    };
    let w = window(vec![gpu], (42..=46).map(on_mig).collect());
    let req = build(&w);

    let alone = process_resource_of(&req, 42);
    let only = |name: &str| {
        let p = points(alone, name);
        assert_eq!(p.len(), 1, "{name}: {p:?}");
        assert_eq!(attr(&p[0], "hw.id"), Some(&s("MIG-alone")), "{name}");
        assert_eq!(attr(&p[0], "hw.parent"), Some(&s("GPU-0000")), "{name}");
        assert_eq!(
            attr(&p[0], "nvidia.gpu.mig.gpu_instance_id"),
            Some(&any_value::Value::IntValue(1)),
            "{name}"
        );
        p[0].clone()
    };
    let general = only("process.gpu.utilization");
    assert_eq!(attr(&general, "hw.gpu.task"), Some(&s("general")));
    assert!((value(&general) - 0.6).abs() < 1e-12, "graphics activity");
    assert!((value(&only("process.gpu.utilization.max")) - 0.7).abs() < 1e-12);
    assert!((value(&only("process.gpu.utilization.min")) - 0.5).abs() < 1e-12);
    assert_eq!(value(&only("process.gpu.sm.activity")), 0.5);
    assert_eq!(value(&only("process.gpu.sm.activity.max")), 0.5);
    assert_eq!(value(&only("process.gpu.dram.activity")), 0.2);
    let tensor = only("process.gpu.pipe.activity");
    assert_eq!(attr(&tensor, "nvidia.gpu.pipe"), Some(&s("tensor")));
    assert_eq!(value(&tensor), 0.25);

    // Shared instances (one compute instance, or two of one GPU instance): memory only.
    for pid in 43..=46 {
        let rm = process_resource_of(&req, pid);
        assert_eq!(points(rm, "process.gpu.memory.usage").len(), 1, "{pid}");
        for name in [
            "process.gpu.utilization",
            "process.gpu.utilization.max",
            "process.gpu.sm.activity",
            "process.gpu.dram.activity",
            "process.gpu.pipe.activity",
        ] {
            assert!(points(rm, name).is_empty(), "{pid} has {name}: no split");
        }
    }
}

#[test]
fn process_on_two_gpus_is_one_resource_with_a_point_per_device() {
    let w = window(
        vec![bare_device(0), bare_device(1)],
        vec![process(42, 0), process(7, 1), process(42, 1)],
    );
    let mut workloads = HashMap::new();
    let mut wl = Workload::unresolved(42);
    wl.container_id = Some("abc".into());
    wl.vpid = Some(1);
    wl.attributed_by = AttributionMethod::HostPid;
    workloads.insert(42, wl);
    let usage = HashMap::from([(
        42,
        ProcessUsage {
            cpu_utilization: Some(1.5),
            tree_cpu_utilization: Some(3.0),
            memory_rss_bytes: Some(1 << 30),
        },
    )]);
    let attributed = AttributedWindow {
        window: w,
        workloads,
        usage,
        parent_alive: HashMap::new(),
        accounts: Default::default(),
        departed: Default::default(),
        ledger: Default::default(),
    };
    let req = metrics_request(&attributed, &node());
    assert_eq!(req.resource_metrics.len(), 3, "node + two processes");
    let pid_of = |rm: &ResourceMetrics| {
        rm.resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "process.pid"))
            .and_then(|kv| kv.value.as_ref()?.value.clone())
    };
    assert_eq!(
        pid_of(&req.resource_metrics[1]),
        Some(any_value::Value::IntValue(7))
    );
    assert_eq!(
        pid_of(&req.resource_metrics[2]),
        Some(any_value::Value::IntValue(42))
    );

    let rm = &req.resource_metrics[2];
    let mem = points(rm, "process.gpu.memory.usage");
    let ids: Vec<_> = mem.iter().map(|p| attr(p, "hw.id").cloned()).collect();
    assert_eq!(ids, vec![Some(s("GPU-0000")), Some(s("GPU-0001"))]);
    assert_eq!(points(rm, "process.gpu.utilization").len(), 2);
    assert_eq!(value(&points(rm, "process.gpu.utilization.max")[0]), 0.9);
    assert_eq!(value(&points(rm, "gpulse.process.cpu.utilization")[0]), 1.5);
    assert_eq!(
        value(&points(rm, "gpulse.process.tree.cpu.utilization")[0]),
        3.0
    );
    let rss = &points(rm, "process.memory.usage")[0];
    assert_eq!(value(rss), (1u64 << 30) as f64);
    assert_eq!(
        rss.start_time_unix_nano,
        900 * 1_000_000_000,
        "earliest first_seen"
    );
    // pid 7 has no usage: no CPU/RSS points.
    assert!(metric(&req.resource_metrics[1], "gpulse.process.cpu.utilization").is_none());
}

#[test]
fn non_finite_values_yield_no_point() {
    let mut d = bare_device(0);
    d.fields.set_gauge(
        DeviceField::Power,
        Some(g(f64::NAN, 1.0, f64::INFINITY, 1.0)),
    );
    d.fields
        .set_gauge(DeviceField::PowerLimit, Some(Gauge::single(f64::NAN)));
    let req = build(&window(vec![d], Vec::new()));
    let rm = &req.resource_metrics[0];
    assert!(metric(rm, "hw.power").is_none());
    assert!(metric(rm, "hw.power.max").is_none());
    assert!(metric(rm, "nvidia.gpu.power.limit").is_none());
}

#[test]
fn empty_window_still_has_the_node_resource() {
    let req = build(&window(Vec::new(), Vec::new()));
    assert_eq!(req.resource_metrics.len(), 1);
    assert!(req.resource_metrics[0].scope_metrics[0].metrics.is_empty());
}

#[test]
fn data_point_count_counts_every_point() {
    let mut d = bare_device(0);
    d.fields
        .set_gauge(DeviceField::UtilizationGpu, Some(g(0.5, 0.1, 0.9, 0.5)));
    let req = build(&window(vec![d], vec![process(1, 0)]));
    // Node: 3 utilisation + memory limit (from DeviceInfo) + 2 status + 1 xid;
    // process: 1 memory + 3 utilisation.
    assert_eq!(data_point_count(&req), 11);
}

#[test]
fn json_keeps_oneof_defaults_and_drops_field_defaults() {
    let mut d = bare_device(0);
    d.status = DeviceStatus::Lost;
    let req = build(&window(vec![d], Vec::new()));
    let line = to_otlp_json_line(&req);
    assert!(!line.contains('\n'));
    assert!(
        line.contains(r#""asInt":"0""#),
        "a zero value stays: {line}"
    );
    assert!(!line.contains(r#""description":"""#));
    assert!(!line.contains(r#""flags":0"#));
    assert!(!line.contains(r#""exemplars""#));
    assert!(line.contains(r#""aggregationTemporality":2"#));
    assert!(line.contains(r#""startTimeUnixNano":"100000000000""#));
    let back: ExportMetricsServiceRequest =
        serde_json::from_str(&line).expect("our JSON must parse back");
    assert_eq!(back, req);
}

/// A rank's step figures ride on its process resource with its job id and rank as point
/// attributes; a process that sent steps without collective timings gets no collective_wait
/// point (unknown is not 0), and one with no figures gets no training points.
#[test]
fn training_figures_are_points_of_the_process_with_its_rank() {
    use crate::diagnosis::framework::DistributedIdentity;
    use crate::diagnosis::training::{ProcessTraining, TrainingWindow};
    let w = window(
        vec![bare_device(0)],
        vec![process(42, 0), process(7, 0), process(9, 0)],
    );
    let mut training = TrainingWindow::default();
    training.processes.insert(
        42,
        ProcessTraining {
            step_seconds: 0.5,
            collective_wait_seconds: Some(0.125),
            data_wait_seconds: 0.25,
            steps: 30,
            distributed: Some(DistributedIdentity {
                rank: 3,
                job_id: Some("job-7".into()),
                ..DistributedIdentity::default()
            }),
        },
    );
    training.processes.insert(
        7,
        ProcessTraining {
            step_seconds: 0.2,
            collective_wait_seconds: None,
            data_wait_seconds: 0.0,
            steps: 5,
            distributed: None,
        },
    );
    let req = metrics_request_with_training(&AttributedWindow::unattributed(w), &training, &node());
    let [_, p7, p9, p42] = &req.resource_metrics[..] else {
        panic!("node + three processes: {}", req.resource_metrics.len());
    };
    let step = &points(p42, "gpulse.training.step.duration")[0];
    assert_eq!(value(step), 0.5);
    assert_eq!(attr(step, "pytorch.distributed.job.id"), Some(&s("job-7")));
    assert_eq!(
        attr(step, "pytorch.distributed.rank"),
        Some(&any_value::Value::IntValue(3))
    );
    assert_eq!(
        (step.start_time_unix_nano, step.time_unix_nano),
        (1000 * 1_000_000_000, 1010 * 1_000_000_000)
    );
    let wait = &points(p42, "gpulse.training.step.collective_wait")[0];
    assert_eq!(value(wait), 0.125);
    assert_eq!(
        attr(wait, "pytorch.distributed.rank"),
        attr(step, "pytorch.distributed.rank")
    );
    assert_eq!(
        value(&points(p42, "gpulse.training.step.data_wait")[0]),
        0.25
    );
    let m = metric(p42, "gpulse.training.step.duration").unwrap();
    assert_eq!(m.unit, "s");
    assert!(matches!(m.data, Some(Data::Gauge(_))));

    let step7 = &points(p7, "gpulse.training.step.duration")[0];
    assert_eq!(value(step7), 0.2);
    assert!(step7.attributes.is_empty(), "no rank, no rank attributes");
    assert!(metric(p7, "gpulse.training.step.collective_wait").is_none());
    assert!(metric(p9, "gpulse.training.step.duration").is_none());
    // Without training figures, the same window has no training points at all.
    let plain = build(&window(vec![bare_device(0)], vec![process(42, 0)]));
    assert!(metric(&plain.resource_metrics[1], "gpulse.training.step.duration").is_none());
}

/// The cached build of `attributed` (through `kept`) against a fresh build: the same bytes, and
/// the same request.
fn assert_cached_equals_fresh(attributed: &AttributedWindow, kept: &mut ProcessResources) {
    let training = TrainingWindow::default();
    let cached = metrics_batch_cached(
        attributed,
        &training,
        &node(),
        kept,
        Extremes::Sent,
        &MetricSwitches::default(),
    );
    let fresh = metrics_batch_with_training(attributed, &training, &node());
    assert_eq!(cached.encode(), fresh.encode());
    assert_eq!(cached.into_request(), fresh.into_request());
}

fn named(pid: u32, service: Option<&str>) -> Workload {
    Workload {
        executable_name: Some("python3".into()),
        service_name: service.map(str::to_string),
        attributed_by: AttributionMethod::HostPid,
        ..Workload::unresolved(pid)
    }
}

fn attributed_of(devices: u32, workloads: &[Workload]) -> AttributedWindow {
    let processes = workloads
        .iter()
        .enumerate()
        .map(|(i, w)| process(w.pid, i as u32 % devices))
        .collect();
    AttributedWindow {
        window: window((0..devices).map(bare_device).collect(), processes),
        workloads: workloads.iter().map(|w| (w.pid, w.clone())).collect(),
        usage: HashMap::new(),
        parent_alive: HashMap::new(),
        accounts: Default::default(),
        departed: Default::default(),
        ledger: Default::default(),
    }
}

#[test]
fn kept_process_resources_give_the_bytes_of_a_fresh_build_window_after_window() {
    let mut kept = ProcessResources::new();
    let a = named(10, Some("trainer"));
    let b = named(20, None);
    let c = named(30, Some("eval"));

    // Two windows with the same processes: the second reuses both resources.
    let first = attributed_of(2, &[a.clone(), b.clone()]);
    assert_cached_equals_fresh(&first, &mut kept);
    assert_eq!(kept.len(), 2);
    assert_cached_equals_fresh(&first, &mut kept);
    assert_eq!(kept.len(), 2);

    // A process whose service.name is learned later: its resource says the new name.
    let b_named = named(20, Some("learned"));
    let learned = attributed_of(2, &[a.clone(), b_named.clone()]);
    assert_cached_equals_fresh(&learned, &mut kept);
    let request = metrics_batch_cached(
        &learned,
        &TrainingWindow::default(),
        &node(),
        &mut kept,
        Extremes::Sent,
        &MetricSwitches::default(),
    )
    .into_request();
    let resource = process_resource_of(&request, 20).resource.as_ref().unwrap();
    let service = resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(service, Some(s("learned")));

    // A process that leaves is forgotten; a new one (on a new GPU) is added.
    let changed = attributed_of(3, &[b_named.clone(), c.clone(), named(40, None)]);
    assert_cached_equals_fresh(&changed, &mut kept);
    assert_eq!(kept.len(), 3, "pid 10 left, 30 and 40 came");

    // A PID reused by another process (another executable) is a new resource.
    let reused = Workload {
        executable_name: Some("other".into()),
        ..c
    };
    assert_cached_equals_fresh(&attributed_of(3, &[reused, named(40, None)]), &mut kept);
    assert_eq!(kept.len(), 2);

    // A process nobody attributed (no workload) is known by its PID, kept like the others.
    let mut unattributed = attributed_of(1, &[a, b_named]);
    unattributed.workloads.remove(&20);
    assert_cached_equals_fresh(&unattributed, &mut kept);
    assert_cached_equals_fresh(&unattributed, &mut kept);
}

#[test]
fn kept_process_resources_are_dropped_when_the_node_identity_changes() {
    let mut kept = ProcessResources::new();
    let attributed = attributed_of(1, &[named(10, Some("trainer"))]);
    assert_cached_equals_fresh(&attributed, &mut kept);
    let renamed = NodeIdentity {
        host_name: "node-b".into(),
        ..node()
    };
    let training = TrainingWindow::default();
    let cached = metrics_batch_cached(
        &attributed,
        &training,
        &renamed,
        &mut kept,
        Extremes::Sent,
        &MetricSwitches::default(),
    );
    let fresh = metrics_batch_with_training(&attributed, &training, &renamed);
    assert_eq!(cached.encode(), fresh.encode());
    let request = cached.into_request();
    let host = process_resource_of(&request, 10)
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|kv| kv.key == "host.name")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(host, Some(s("node-b")));
}

/// A GPU's utilisation and power and a process's SM utilisation, each with a spread of samples:
/// gauges that have `.max`/`.min` companions.
fn gauges_with_extremes() -> AttributedWindow {
    let mut d = bare_device(0);
    d.fields
        .set_gauge(DeviceField::UtilizationGpu, Some(g(0.6, 0.2, 0.95, 0.5)));
    d.fields
        .set_gauge(DeviceField::Power, Some(g(350.0, 100.0, 700.0, 300.0)));
    let mut p = process(42, 0);
    p.sm_utilization = Some(g(0.5, 0.4, 0.6, 0.5));
    AttributedWindow {
        window: window(vec![d], vec![p]),
        ..attributed_of(1, &[named(42, Some("trainer"))])
    }
}

/// A window built with `Extremes::Omitted` is the same request less every `.max`/`.min`
/// companion, and the intervals decide which one a run gets.
#[test]
fn companions_are_left_out_when_windows_hold_one_sample() {
    let attributed = gauges_with_extremes();
    let build_with = |extremes| {
        let mut kept = ProcessResources::new();
        metrics_batch_cached(
            &attributed,
            &TrainingWindow::default(),
            &node(),
            &mut kept,
            extremes,
            &MetricSwitches::default(),
        )
        .into_request()
    };
    let names = |req: &ExportMetricsServiceRequest| -> Vec<String> {
        req.resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .map(|m| m.name.clone())
            .collect()
    };
    let is_companion = |name: &str| name.ends_with(".max") || name.ends_with(".min");
    let (sent, omitted) = (build_with(Extremes::Sent), build_with(Extremes::Omitted));
    let sent_names = names(&sent);
    for companion in [
        "hw.gpu.utilization.max",
        "hw.gpu.utilization.min",
        "hw.power.max",
        "process.gpu.utilization.max",
    ] {
        assert!(sent_names.iter().any(|n| n == companion), "{companion}");
    }
    let without: Vec<String> = sent_names
        .into_iter()
        .filter(|n| !is_companion(n))
        .collect();
    assert_eq!(names(&omitted), without);
    let mut trimmed = sent.clone();
    for rm in &mut trimmed.resource_metrics {
        for sm in &mut rm.scope_metrics {
            sm.metrics.retain(|m| !is_companion(&m.name));
        }
    }
    assert_eq!(omitted, trimmed, "the same request less the companions");

    let ms = Duration::from_millis;
    for (sample, export, expected) in [
        (1000, 1000, Extremes::Omitted),
        (1000, 1500, Extremes::Omitted),
        (1000, 2000, Extremes::Sent),
        (100, 1000, Extremes::Sent),
        (1000, 10_000, Extremes::Sent),
    ] {
        assert_eq!(
            Extremes::for_intervals(ms(sample), ms(export)),
            expected,
            "{sample} ms / {export} ms"
        );
    }
}

/// A metric switched off (with its companions), or the companions switched off as a group, is
/// left out of the request, and nothing else changes.
#[test]
fn switched_off_metrics_are_left_out_and_nothing_else() {
    let attributed = gauges_with_extremes();
    let build_with = |switches: &MetricSwitches| {
        metrics_batch_cached(
            &attributed,
            &TrainingWindow::default(),
            &node(),
            &mut ProcessResources::new(),
            Extremes::Sent,
            switches,
        )
        .into_request()
    };
    let without = |req: &ExportMetricsServiceRequest, gone: &dyn Fn(&str) -> bool| {
        let mut req = req.clone();
        for rm in &mut req.resource_metrics {
            for sm in &mut rm.scope_metrics {
                sm.metrics.retain(|m| !gone(&m.name));
            }
        }
        req
    };
    let all = build_with(&MetricSwitches::default());

    let mut power_off = MetricSwitches::default();
    power_off.set(MetricId::Power, false);
    let got = build_with(&power_off);
    assert_ne!(got, all, "hw.power was in the request");
    assert_eq!(got, without(&all, &|n| n.starts_with("hw.power")));

    let mut no_companions = MetricSwitches::default();
    no_companions.set_companions(false);
    let got = build_with(&no_companions);
    assert_eq!(
        got,
        without(&all, &|n| n.ends_with(".max") || n.ends_with(".min"))
    );
    assert_eq!(
        metrics_request_switched(&attributed, &TrainingWindow::default(), &node(), &power_off),
        without(
            &metrics_request_with_training(&attributed, &TrainingWindow::default(), &node()),
            &|n| n.starts_with("hw.power")
        ),
        "/metrics' request leaves out the same"
    );
}
