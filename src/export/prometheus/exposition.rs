//! What one scrape of `/metrics` shows, built once per analysed window: the window's OTLP
//! metrics (the very request the OTLP exporter sends, from the same builder) under the names
//! Prometheus's OTLP translation gives them, resource attributes promoted to labels, then
//! dcgm-exporter's families when asked for, with a bound on the number of series.
//!
//! Built from the latest window only, so the series of a process that exited vanish with the
//! first window that no longer lists it. The bound keeps device series first (the node
//! resource, then dcgm-exporter's device families, then the findings gauge), then processes by
//! ascending PID; what does not fit is counted, never silently lost.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point, Metric};

use super::dcgm;
use super::families::{Builder, Exposition, FamilyKind, SampleValue};
use super::names::{label_name, metric_name, OtlpKind, PromName};
use crate::attribution::AttributedWindow;
use crate::config::PrometheusNames;
use crate::diagnosis::tracker::{ACTIVE_GAUGE_DESCRIPTION, ACTIVE_GAUGE_NAME, ACTIVE_GAUGE_UNIT};
use crate::diagnosis::training::TrainingWindow;
use crate::diagnosis::{Finding, RuleId};
use crate::export::metrics::metrics_request_with_training;
use crate::export::resource::NodeIdentity;
use crate::schema::attributes::AttributeId as A;
use crate::schema::MetricSet;

/// Resource attributes that do not become labels: `service.instance.id` is what Prometheus's
/// translation turns into `instance`, which the scrape sets itself (and it changes with every
/// restart); the SDK attributes only say "gpulse" on every series; a command line can carry
/// secrets and would make a label of unbounded size.
const NOT_PROMOTED: [&str; 5] = [
    A::ServiceInstanceId.key(),
    A::TelemetrySdkName.key(),
    A::TelemetrySdkLanguage.key(),
    A::TelemetrySdkVersion.key(),
    A::ProcessCommandLine.key(),
];

/// The label form of an OTLP attribute value.
fn attribute_text(value: Option<&any_value::Value>) -> Option<String> {
    match value? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// `attributes` as labels, on top of `base` (a later key replaces an earlier one).
fn labels_of(base: &[(String, String)], attributes: &[KeyValue]) -> Vec<(String, String)> {
    let mut labels = base.to_vec();
    for kv in attributes {
        let (Some(name), Some(value)) = (
            label_name(&kv.key),
            attribute_text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
        ) else {
            continue;
        };
        match labels.iter_mut().find(|(n, _)| *n == name) {
            Some(existing) => existing.1 = value,
            None => labels.push((name, value)),
        }
    }
    labels
}

fn resource_labels(attributes: &[KeyValue]) -> Vec<(String, String)> {
    let promoted: Vec<KeyValue> = attributes
        .iter()
        .filter(|kv| !NOT_PROMOTED.contains(&kv.key.as_str()))
        .cloned()
        .collect();
    labels_of(&[], &promoted)
}

/// The name, help and type of an OTLP metric as Prometheus sees it.
fn family_of(metric: &Metric) -> Option<(PromName, FamilyKind)> {
    let kind = match metric.data.as_ref()? {
        Data::Gauge(_) => OtlpKind::Gauge,
        Data::Sum(s) if s.is_monotonic => OtlpKind::Counter,
        Data::Sum(_) => OtlpKind::UpDownCounter,
        _ => return None,
    };
    let name = metric_name(&metric.name, &metric.unit, kind)?;
    let family = if kind == OtlpKind::Counter {
        FamilyKind::Counter
    } else {
        FamilyKind::Gauge
    };
    Some((name, family))
}

fn push_otlp_metric(b: &mut Builder, metric: &Metric, resource: &[(String, String)]) {
    let Some((name, kind)) = family_of(metric) else {
        return;
    };
    let points = match metric.data.as_ref() {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => return,
    };
    for point in points {
        let value = match point.value {
            Some(number_data_point::Value::AsInt(v)) => SampleValue::Int(v),
            Some(number_data_point::Value::AsDouble(v)) => SampleValue::Float(v),
            None => continue,
        };
        let labels = labels_of(resource, &point.attributes);
        b.push(&name, &metric.description, kind, labels, value);
    }
}

/// The exposition of one analysed window (with its processes' training figures) and the
/// findings active after it.
///
/// `last_xid` is the last XID code seen per device UUID since gpulse started (dcgm-exporter's
/// `DCGM_FI_DEV_XID_ERRORS` keeps it past the window that saw it).
pub fn build(
    attributed: &AttributedWindow,
    training: &TrainingWindow,
    findings: &[Finding],
    node: &NodeIdentity,
    names: PrometheusNames,
    max_series: usize,
    last_xid: &HashMap<String, u64>,
) -> Exposition {
    let request = metrics_request_with_training(attributed, training, node);
    build_from(
        &request,
        attributed,
        findings,
        node,
        (names, max_series),
        last_xid,
        dcgm::Selection {
            counters: None,
            off: MetricSet::default(),
        },
    )
}

/// [`build`] from the window's request as built already, with the `DCGM_FI_*` series `dcgm`
/// selects (less the metrics switched off: their OTLP-named families are not in `request`,
/// their `DCGM_FI_*` twins are left out here).
pub(super) fn build_from(
    request: &ExportMetricsServiceRequest,
    attributed: &AttributedWindow,
    findings: &[Finding],
    node: &NodeIdentity,
    (names, max_series): (PrometheusNames, usize),
    last_xid: &HashMap<String, u64>,
    dcgm: dcgm::Selection<'_>,
) -> Exposition {
    let mut b = Builder::new(max_series);
    let mut resources = request.resource_metrics.iter().map(|rm| {
        let labels = rm
            .resource
            .as_ref()
            .map(|r| resource_labels(&r.attributes))
            .unwrap_or_default();
        let metrics: Vec<&Metric> = rm
            .scope_metrics
            .iter()
            .flat_map(|s| s.metrics.iter())
            .collect();
        (labels, metrics)
    });
    // The node resource comes first in the request: devices before processes.
    let node_labels = match resources.next() {
        Some((labels, metrics)) => {
            for metric in metrics {
                push_otlp_metric(&mut b, metric, &labels);
            }
            labels
        }
        None => Vec::new(),
    };
    if names == PrometheusNames::Dcgm {
        dcgm::push_devices(&mut b, attributed, node, last_xid, dcgm);
    }
    push_findings(&mut b, findings, &node_labels);
    for (labels, metrics) in resources {
        for metric in metrics {
            push_otlp_metric(&mut b, metric, &labels);
        }
    }
    let mut exposition = b.finish();
    exposition.window_end = Some(attributed.window.end);
    exposition
}

/// `gpulse.diagnosis.active` by rule, as the OTLP health metrics carry it: every rule, 0 when
/// none of its findings is active (an alert can then tell "fine" from "not scraped").
fn push_findings(b: &mut Builder, findings: &[Finding], node_labels: &[(String, String)]) {
    let Some(name) = metric_name(
        ACTIVE_GAUGE_NAME,
        ACTIVE_GAUGE_UNIT,
        OtlpKind::UpDownCounter,
    ) else {
        return;
    };
    for rule in RuleId::ALL {
        let count = findings.iter().filter(|f| f.rule == rule).count();
        let mut labels = node_labels.to_vec();
        labels.push(("gpulse_diagnosis_rule".into(), rule.as_str().into()));
        b.push(
            &name,
            ACTIVE_GAUGE_DESCRIPTION,
            FamilyKind::Gauge,
            labels,
            SampleValue::Int(count as i64),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::attribution::Workload;
    use crate::diagnosis::{DeviceRef, Severity, Subject};
    use crate::export::prometheus::encode::{encode, Format, SelfMetrics};
    use crate::export::prometheus::families::Sample;
    use crate::sampling::{DeviceInfo, DeviceWindow, Gauge, ProcessKind, ProcessWindow, Window};
    use crate::schema::DeviceField;

    const UUID: &str = "GPU-0a0a0a0a-1111-2222-3333-444444444444";
    const CONTAINER: &str = "d0c4e2f1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2";

    fn gauge(v: f64) -> Option<Gauge> {
        Some(Gauge {
            mean: v,
            min: v,
            max: v,
            last: v,
            count: 1,
        })
    }

    fn node() -> NodeIdentity {
        NodeIdentity {
            host_name: "node-a".into(),
            service_name: "gpulse".into(),
            service_instance_id: "inst-1".into(),
            service_version: "0.1.0".into(),
            extra_attributes: vec![],
        }
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    /// One H100 at 62 % with the given GPU processes (PID → pod name), each in a container.
    fn window(pids: &[(u32, Option<&str>)]) -> AttributedWindow {
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: UUID.into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: Some(81559 << 20),
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        });
        let mut device = DeviceWindow::empty(info, at(1000));
        device
            .fields
            .set_gauge(DeviceField::UtilizationGpu, gauge(0.62));
        device.fields.set_gauge(
            DeviceField::MemoryUsed,
            Some(Gauge::single((30000u64 << 20) as f64)),
        );
        device.fields.set_gauge(
            DeviceField::MemoryFree,
            Some(Gauge::single((51017u64 << 20) as f64)),
        );
        device
            .fields
            .set_gauge(DeviceField::Temperature, gauge(58.0));
        device.fields.set_gauge(DeviceField::Power, gauge(420.5));
        device.fields.set_gauge(DeviceField::SmClock, gauge(1980.0));
        device
            .fields
            .set_gauge(DeviceField::MemoryClock, gauge(2619.0));
        device.fields.set_total(DeviceField::Energy, Some(1.5));
        let processes = pids
            .iter()
            .map(|(pid, _)| ProcessWindow {
                pid: *pid,
                device_index: 0,
                device_uuid: UUID.into(),
                kind: ProcessKind::Compute,
                first_seen: at(1000),
                samples: 1,
                gpu_memory_bytes: gauge(1024.0),
                sm_utilization: gauge(0.4),
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
            })
            .collect();
        let workloads = pids
            .iter()
            .map(|(pid, pod)| {
                let mut w = Workload::unresolved(*pid);
                w.container_id = Some(CONTAINER.into());
                w.pod_name = pod.map(str::to_string);
                w.namespace_name = pod.map(|_| "ml".to_string());
                w.container_name = pod.map(|_| "trainer".to_string());
                (*pid, w)
            })
            .collect();
        AttributedWindow {
            window: Window {
                start: at(1990),
                end: at(2000),
                sample_count: 10,
                driver_version: Some("550.54.15".into()),
                cuda_driver_version: None,
                devices: vec![device],
                processes,
                xid_events: vec![],
            },
            workloads,
            usage: HashMap::new(),
            parent_alive: HashMap::new(),
            accounts: Default::default(),
            departed: Default::default(),
            ledger: Default::default(),
        }
    }

    fn build_with(w: &AttributedWindow, names: PrometheusNames, max: usize) -> Exposition {
        build(
            w,
            &TrainingWindow::default(),
            &[],
            &node(),
            names,
            max,
            &HashMap::new(),
        )
    }

    fn samples<'a>(e: &'a Exposition, full_name: &str) -> &'a [Sample] {
        e.families
            .get(full_name)
            .map_or(&[], |f| f.samples.as_slice())
    }

    fn label<'a>(s: &'a Sample, name: &str) -> Option<&'a str> {
        s.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn device_series_carry_the_window_under_otlp_names() {
        let e = build_with(&window(&[]), PrometheusNames::Otel, 1000);
        let util = samples(&e, "hw_gpu_utilization_ratio");
        let general = util
            .iter()
            .find(|s| label(s, "hw_gpu_task") == Some("general"))
            .expect("general utilisation");
        assert_eq!(general.value, SampleValue::Float(0.62));
        assert_eq!(label(general, "hw_id"), Some(UUID));
        assert_eq!(label(general, "service_name"), Some("gpulse"));
        assert_eq!(
            label(general, "service_instance_id"),
            None,
            "instance is the scrape's"
        );
        let energy = &e.families["hw_energy_joules_total"];
        assert_eq!(energy.kind, FamilyKind::Counter);
        assert!(e.families.keys().all(|k| !k.starts_with("DCGM_")));
    }

    #[test]
    fn dcgm_names_have_dcgm_units_and_labels() {
        let e = build_with(
            &window(&[(41, Some("train-0"))]),
            PrometheusNames::Dcgm,
            1000,
        );
        let value = |name: &str| {
            let s = samples(&e, name);
            assert_eq!(s.len(), 1, "{name}");
            s[0].value
        };
        assert_eq!(value("DCGM_FI_DEV_GPU_UTIL"), SampleValue::Int(62));
        assert_eq!(value("DCGM_FI_DEV_FB_USED"), SampleValue::Int(30000));
        assert_eq!(value("DCGM_FI_DEV_FB_FREE"), SampleValue::Int(51017));
        assert_eq!(value("DCGM_FI_DEV_GPU_TEMP"), SampleValue::Int(58));
        assert_eq!(value("DCGM_FI_DEV_POWER_USAGE"), SampleValue::Float(420.5));
        assert_eq!(value("DCGM_FI_DEV_SM_CLOCK"), SampleValue::Int(1980));
        assert_eq!(value("DCGM_FI_DEV_MEM_CLOCK"), SampleValue::Int(2619));
        assert_eq!(
            value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
            SampleValue::Int(1500)
        );
        assert_eq!(value("DCGM_FI_DEV_XID_ERRORS"), SampleValue::Int(0));
        let s = &samples(&e, "DCGM_FI_DEV_GPU_UTIL")[0];
        for (name, want) in [
            ("gpu", "0"),
            ("UUID", UUID),
            ("device", "nvidia0"),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("Hostname", "node-a"),
            ("pod", "train-0"),
            ("namespace", "ml"),
            ("container", "trainer"),
        ] {
            assert_eq!(label(s, name), Some(want), "{name}");
        }
        // No GPM in the model: the profiling families are absent, not zero.
        assert!(e.families.keys().all(|k| !k.starts_with("DCGM_FI_PROF_")));
    }

    #[test]
    fn dcgm_names_give_each_mig_instance_its_series_with_gpu_i_labels() {
        use crate::sampling::{GpmWindow, MigInstanceInfo, MigInstanceWindow};
        use crate::schema::GpmField;
        // Pods train-0 (PID 41) alone on GI 1, train-1 and train-2 (42, 43) on GI 2.
        let mut w = window(&[
            (41, Some("train-0")),
            (42, Some("train-1")),
            (43, Some("train-2")),
        ]);
        let instance =
            |gi: u32, profile: &str, used_mib: u64, graphics: f64, pids| MigInstanceWindow {
                info: Arc::new(MigInstanceInfo {
                    uuid: format!("MIG-{gi}"),
                    name: format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
                    parent_uuid: UUID.into(),
                    parent_index: 0,
                    mig_index: gi - 1,
                    gpu_instance_id: gi,
                    compute_instance_id: 0,
                }),
                memory_used_bytes: Some(used_mib << 20),
                memory_free_bytes: Some((40192 - used_mib) << 20),
                memory_total_bytes: Some(40192 << 20),
                gpm: GpmWindow::of([(GpmField::GraphicsActivity, Gauge::single(graphics))]),
                pids,
            };
        w.window.devices[0].mig_instances = vec![
            instance(1, "3g.40gb", 30720, 0.85, vec![41]),
            instance(9, "2g.20gb", 4096, 0.05, vec![42, 43]),
        ];
        let e = build_with(&w, PrometheusNames::Dcgm, 1000);
        let gract = samples(&e, "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
        assert_eq!(gract.len(), 2, "one per instance: {gract:?}");
        let of = |name: &str, gi: &str| {
            samples(&e, name)
                .iter()
                .find(|s| label(s, "GPU_I_ID") == Some(gi))
                .unwrap_or_else(|| panic!("no {name} of GI {gi}"))
        };
        let gi1 = of("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "1");
        assert_eq!(gi1.value, SampleValue::Float(0.85));
        let names: Vec<&str> = gi1.labels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names[..8],
            [
                "gpu",
                "UUID",
                "pci_bus_id",
                "device",
                "modelName",
                "GPU_I_PROFILE",
                "GPU_I_ID",
                "Hostname"
            ],
            "dcgm-exporter's label order"
        );
        assert_eq!(label(gi1, "UUID"), Some(UUID), "the GPU's UUID");
        assert_eq!(label(gi1, "GPU_I_PROFILE"), Some("3g.40gb"));
        assert_eq!(label(gi1, "pod"), Some("train-0"), "its one pod");
        assert_eq!(
            of("DCGM_FI_DEV_FB_USED", "1").value,
            SampleValue::Int(30720)
        );
        assert_eq!(
            of("DCGM_FI_DEV_FB_FREE", "9").value,
            SampleValue::Int(40192 - 4096)
        );
        let gi9 = of("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "9");
        assert_eq!(label(gi9, "GPU_I_PROFILE"), Some("2g.20gb"));
        assert_eq!(label(gi9, "pod"), None, "two pods share it");
        // The GPU's own series stay, without instance labels.
        let gpu = samples(&e, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(gpu.len(), 1);
        assert_eq!(label(&gpu[0], "GPU_I_ID"), None);
        assert_eq!(
            samples(&e, "DCGM_FI_DEV_FB_USED")
                .iter()
                .filter(|s| label(s, "GPU_I_ID").is_none())
                .count(),
            1
        );
    }

    #[test]
    fn two_pods_on_one_gpu_leave_the_pod_labels_off() {
        let w = window(&[(41, Some("train-0")), (42, Some("train-1"))]);
        let e = build_with(&w, PrometheusNames::Dcgm, 1000);
        let s = &samples(&e, "DCGM_FI_DEV_GPU_UTIL")[0];
        assert_eq!(label(s, "pod"), None);
    }

    #[test]
    fn the_last_xid_outlives_its_window() {
        let xids = HashMap::from([(UUID.to_string(), 79u64)]);
        let e = build(
            &window(&[]),
            &TrainingWindow::default(),
            &[],
            &node(),
            PrometheusNames::Dcgm,
            1000,
            &xids,
        );
        let xid = &samples(&e, "DCGM_FI_DEV_XID_ERRORS")[0];
        assert_eq!(xid.value, SampleValue::Int(79));
        // dcgm-exporter's err_code / err_msg, the message from the Xid catalog.
        assert_eq!(label(xid, "err_code"), Some("79"));
        assert_eq!(label(xid, "err_msg"), Some("GPU has fallen off the bus"));
        assert_eq!(label(xid, "UUID"), Some(UUID));
        // Only that series carries them.
        let util = &samples(&e, "DCGM_FI_DEV_GPU_UTIL")[0];
        assert_eq!(label(util, "err_code"), None);
    }

    #[test]
    fn no_xid_and_an_xid_the_catalog_lacks_read_as_dcgm_exporter_writes_them() {
        let message = |xids: HashMap<String, u64>| {
            let e = build(
                &window(&[]),
                &TrainingWindow::default(),
                &[],
                &node(),
                PrometheusNames::Dcgm,
                1000,
                &xids,
            );
            let s = &samples(&e, "DCGM_FI_DEV_XID_ERRORS")[0];
            (
                label(s, "err_code").map(str::to_string),
                label(s, "err_msg").map(str::to_string),
            )
        };
        assert_eq!(
            message(HashMap::new()),
            (Some("0".into()), Some("No Error".into()))
        );
        assert_eq!(
            message(HashMap::from([(UUID.to_string(), 999u64)])),
            (Some("999".into()), Some("Unknown Error".into()))
        );
    }

    /// The series a cross-node straggler rule reads: one per rank, labelled with the job id and
    /// rank (point attributes) beside the process's own resource labels.
    #[test]
    fn training_figures_are_series_per_rank() {
        use crate::diagnosis::framework::DistributedIdentity;
        use crate::diagnosis::training::ProcessTraining;
        let mut training = TrainingWindow::default();
        for (pid, rank, step) in [(41, 0, 0.5), (42, 1, 0.75)] {
            training.processes.insert(
                pid,
                ProcessTraining {
                    step_seconds: step,
                    collective_wait_seconds: Some(0.25),
                    data_wait_seconds: 0.0,
                    steps: 10,
                    distributed: Some(DistributedIdentity {
                        rank,
                        job_id: Some("job-7".into()),
                        ..DistributedIdentity::default()
                    }),
                },
            );
        }
        let e = build(
            &window(&[(41, None), (42, None)]),
            &training,
            &[],
            &node(),
            PrometheusNames::Otel,
            1000,
            &HashMap::new(),
        );
        let steps = samples(&e, "gpulse_training_step_duration_seconds");
        let by_rank: Vec<(&str, &str, &str, SampleValue)> = steps
            .iter()
            .map(|s| {
                (
                    label(s, "pytorch_distributed_job_id").unwrap(),
                    label(s, "pytorch_distributed_rank").unwrap(),
                    label(s, "process_pid").unwrap(),
                    s.value,
                )
            })
            .collect();
        assert_eq!(
            by_rank,
            [
                ("job-7", "0", "41", SampleValue::Float(0.5)),
                ("job-7", "1", "42", SampleValue::Float(0.75))
            ]
        );
        assert_eq!(
            samples(&e, "gpulse_training_step_collective_wait_seconds").len(),
            2
        );
    }

    #[test]
    fn process_series_carry_the_container_and_vanish_with_the_process() {
        let published =
            super::super::Published::new(crate::config::PrometheusSettings::default(), node());
        published.update(
            &window(&[(41, None), (42, None)]),
            &TrainingWindow::default(),
            &[],
        );
        let (e, _) = published.latest();
        let pids: Vec<&str> = samples(&e, "process_gpu_memory_usage_bytes")
            .iter()
            .map(|s| {
                assert_eq!(label(s, "container_id"), Some(CONTAINER));
                label(s, "process_pid").unwrap()
            })
            .collect();
        assert_eq!(pids, ["41", "42"]);
        published.update(&window(&[(42, None)]), &TrainingWindow::default(), &[]);
        let (e, _) = published.latest();
        let text = encode(e, SelfMetrics::default(), Format::PrometheusText, at(2001)).unwrap();
        assert!(
            !text.contains("process_pid=\"41\""),
            "stale series left:\n{text}"
        );
        assert!(text.contains("process_pid=\"42\""));
    }

    #[test]
    fn the_series_bound_keeps_devices_and_counts_the_rest() {
        let w = window(&[(41, None), (42, None), (43, None)]);
        let full = build_with(&w, PrometheusNames::Dcgm, usize::MAX);
        // Room for everything but the last process's series and one more.
        let per_process = samples(&full, "process_gpu_memory_usage_bytes").len();
        assert_eq!(per_process, 3);
        let bound = full.series - 5;
        let e = build_with(&w, PrometheusNames::Dcgm, bound);
        assert_eq!(e.series, bound);
        assert_eq!(e.dropped as usize, full.series - bound);
        assert_eq!(
            samples(&e, "DCGM_FI_DEV_GPU_UTIL").len(),
            1,
            "devices come first"
        );
        assert!(samples(&e, "process_gpu_memory_usage_bytes").len() < 3);

        let published = super::super::Published::new(
            crate::config::PrometheusSettings {
                max_series: bound,
                names: PrometheusNames::Dcgm,
                ..Default::default()
            },
            node(),
        );
        published.update(&w, &TrainingWindow::default(), &[]);
        published.update(&w, &TrainingWindow::default(), &[]);
        let (e, own) = published.latest();
        assert_eq!(own.dropped_total, 2 * e.dropped);
        let text = encode(e, own, Format::PrometheusText, at(2001)).unwrap();
        let want = format!(
            "gpulse_prometheus_series_dropped_total {}\n",
            own.dropped_total
        );
        assert!(text.contains(&want), "{text}");
    }

    /// A metric switched off is gone from `/metrics` under both names, and nothing else is.
    #[test]
    fn a_switched_off_metric_is_gone_under_both_names() {
        let switched = |switches: crate::schema::MetricSwitches| {
            let published = super::super::Published::new(
                crate::config::PrometheusSettings {
                    names: PrometheusNames::Dcgm,
                    ..Default::default()
                },
                node(),
            )
            .with_switches(switches);
            published.update(&window(&[(42, None)]), &TrainingWindow::default(), &[]);
            let (e, _) = published.latest();
            e.families.keys().cloned().collect::<Vec<String>>()
        };
        let all = switched(Default::default());
        let mut power_off = crate::schema::MetricSwitches::default();
        power_off.set(crate::schema::MetricId::Power, false);
        let without_power = switched(power_off);
        let gone: Vec<&String> = all.iter().filter(|f| !without_power.contains(f)).collect();
        assert!(
            gone.iter().any(|f| f.starts_with("hw_power")),
            "hw.power under its OTLP name: {gone:?}"
        );
        assert!(
            gone.iter()
                .all(|f| f.starts_with("hw_power") || f.as_str() == "DCGM_FI_DEV_POWER_USAGE"),
            "{gone:?}"
        );
        assert!(
            gone.iter().any(|f| f.as_str() == "DCGM_FI_DEV_POWER_USAGE"),
            "{gone:?}"
        );
        assert!(without_power.iter().all(|f| all.contains(f)));
    }

    #[test]
    fn findings_are_counted_by_rule_with_zeros() {
        let finding = Finding {
            rule: RuleId::Throttling,
            related: Vec::new(),
            severity: Severity::Warning,
            subject: Subject::Device(DeviceRef {
                uuid: UUID.into(),
                index: 0,
                mig: None,
            }),
            summary: "throttled".into(),
            advice: "cool it".into(),
            values: vec![],
            since: at(1990),
            evidence: vec![crate::diagnosis::findings::Layer::Nvml],
        };
        let e = build(
            &window(&[]),
            &TrainingWindow::default(),
            &[finding],
            &node(),
            PrometheusNames::Otel,
            1000,
            &HashMap::new(),
        );
        let active = samples(&e, "gpulse_diagnosis_active");
        assert_eq!(active.len(), RuleId::ALL.len());
        for s in active {
            let rule = label(s, "gpulse_diagnosis_rule").unwrap();
            let want = i64::from(rule == "throttling");
            assert_eq!(s.value, SampleValue::Int(want), "{rule}");
        }
    }

    #[test]
    fn both_formats_encode_counters_units_and_eof() {
        let e = Arc::new(build_with(
            &window(&[(41, None)]),
            PrometheusNames::Dcgm,
            1000,
        ));
        let text = encode(
            Arc::clone(&e),
            SelfMetrics::default(),
            Format::PrometheusText,
            at(2003),
        )
        .unwrap();
        assert!(
            text.contains("# TYPE hw_energy_joules_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\""),
            "{text}"
        );
        assert!(
            text.contains("gpulse_prometheus_window_age_seconds 3"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
        let om = encode(e, SelfMetrics::default(), Format::OpenMetrics, at(2003)).unwrap();
        assert!(om.contains("# TYPE hw_energy_joules counter\n"), "{om}");
        assert!(om.contains("# UNIT hw_energy_joules joules\n"), "{om}");
        assert!(om.contains("\nhw_energy_joules_total{"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
    }

    #[test]
    fn accept_headers_choose_the_format() {
        for (accept, want) in [
            (None, Format::PrometheusText),
            (Some("text/plain"), Format::PrometheusText),
            (
                Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
                Format::OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=0"), Format::PrometheusText),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }
}
