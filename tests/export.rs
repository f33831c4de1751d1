//! Integration tests: export.

/// The request builders (`gpulse::export::{metrics, resource, logs}`) against the reference in
/// docs/metrics.md.
mod request {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use gpulse::attribution::{
        AttributedWindow, AttributionMethod, GpuAccountant, ProcessUsage, Workload,
    };
    use gpulse::diagnosis::framework::DistributedIdentity;
    use gpulse::diagnosis::training::{ProcessTraining, TrainingWindow};
    use gpulse::export::json::to_otlp_json_line;
    use gpulse::export::metrics::{
        metrics_batch, metrics_batch_with_training, metrics_request, MetricsBatch,
    };
    use gpulse::export::resource::{NodeIdentity, GPULSE_VERSION};
    use gpulse::sampling::{
        DeviceInfo, DeviceStatus, DeviceWindow, Gauge, GpmWindow, MigInstanceInfo,
        MigInstanceWindow, ProcessKind, ProcessWindow, RemappedRows, ViolationTimes, Window,
    };
    use gpulse::schema::{DeviceField, GpmField, Instrument, METRICS};
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric};

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn g(mean: f64) -> Gauge {
        Gauge {
            mean,
            min: mean / 2.0,
            max: (mean * 2.0).min(1.0),
            last: mean,
            count: 10,
        }
    }

    fn info(index: u32, memory_total_bytes: Option<u64>) -> Arc<DeviceInfo> {
        Arc::new(DeviceInfo {
            index,
            uuid: format!("GPU-{index:08x}-0000-0000-0000-000000000000"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            serial: Some("1650123456789".into()),
            minor_number: Some(index),
            memory_total_bytes,
            max_sm_clock_mhz: Some(1980),
            max_memory_clock_mhz: Some(2619),
            compute_capability: Some("9.0".into()),
            fan_count: Some(1),
        })
    }

    fn full_device(index: u32) -> DeviceWindow {
        let mut d = DeviceWindow {
            info: info(index, Some(80 << 30)),
            status: DeviceStatus::Ok,
            lost_samples: 0,
            throttle_active_ratio: Some(BTreeMap::from([(0x4, 0.3)])),
            counters_start: t(1_000),
            xid_total: 1,
            gpm: GpmWindow::of([
                (GpmField::SmActivity, g(0.8)),
                (GpmField::SmOccupancy, g(0.5)),
                (GpmField::TensorActivity, g(0.4)),
                (GpmField::TensorHmmaActivity, g(0.35)),
                (GpmField::TensorImmaActivity, g(0.05)),
                (GpmField::TensorDfmaActivity, g(0.0)),
                (GpmField::DramActivity, g(0.3)),
                (GpmField::Fp16Activity, g(0.1)),
                (GpmField::Fp32Activity, g(0.6)),
                (GpmField::Fp64Activity, g(0.0)),
                (GpmField::IntegerActivity, g(0.1)),
                (GpmField::GraphicsActivity, g(0.9)),
            ]),
            remapped_rows: Some(RemappedRows {
                correctable: 3,
                uncorrectable: 1,
                pending: true,
                failure: false,
            }),
            violation: Some(ViolationTimes {
                nanoseconds: [
                    Some(1_500_000_000),
                    Some(0),
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                ],
            }),
            xid_by_code: [(79, 1)].into_iter().collect(),
            nvlink: vec![gpulse::sampling::NvLinkWindow {
                last: gpulse::sampling::NvLinkSample {
                    link: 0,
                    active: Some(true),
                    tx_bytes_total: Some(1 << 30),
                    rx_bytes_total: Some(1 << 29),
                    crc_flit_errors: Some(1),
                    crc_data_errors: None,
                    replay_errors: Some(0),
                    recovery_errors: Some(0),
                },
                tx_bytes_per_second: None,
                rx_bytes_per_second: None,
            }],
            mig_instances: Vec::new(),
            fields: Default::default(),
        };
        use DeviceField as F;
        // Averaged fields as gauges with a spread, levels as their last value, counters as
        // totals.
        for (field, value) in [
            (F::UtilizationGpu, 0.7),
            (F::UtilizationMemory, 0.4),
            (F::UtilizationEncoder, 0.1),
            (F::UtilizationDecoder, 0.05),
            (F::Temperature, 65.0),
            (F::Power, 420.0),
            (F::SmClock, 1755.0),
            (F::MemoryClock, 2619.0),
            (F::GraphicsClock, 1755.0),
            (F::FanSpeed, 0.45),
            (F::MemoryTemperature, 71.0),
        ] {
            d.fields.set_gauge(field, Some(g(value)));
        }
        for (field, value) in [
            (F::MemoryUsed, (60u64 << 30) as f64),
            (F::MemoryFree, (19u64 << 30) as f64),
            (F::MemoryReserved, (1u64 << 30) as f64),
            (F::MemoryTotal, (80u64 << 30) as f64),
            (F::Bar1Total, (128u64 << 30) as f64),
            (F::Bar1Used, (2u64 << 30) as f64),
            (F::Bar1Free, (126u64 << 30) as f64),
            (F::PowerLimit, 700.0),
            (F::PerformanceState, 0.0),
            (F::PcieReplays, 7.0),
            (F::PcieLinkGeneration, 5.0),
            (F::PcieLinkWidth, 16.0),
        ] {
            d.fields.set_gauge(field, Some(Gauge::single(value)));
        }
        for (field, total) in [
            (F::Energy, 98_765.4),
            (F::PcieTx, (1u64 << 40) as f64),
            (F::PcieRx, (1u64 << 41) as f64),
            (F::EccCorrected, 3.0),
            (F::EccUncorrected, 0.0),
        ] {
            d.fields.set_total(field, Some(total));
        }
        d
    }

    fn empty_device(index: u32) -> DeviceWindow {
        DeviceWindow::empty(info(index, None), t(1_000))
    }

    fn full_process(pid: u32, device: u32) -> ProcessWindow {
        ProcessWindow {
            pid,
            device_index: device,
            device_uuid: format!("GPU-{device:08x}-0000-0000-0000-000000000000"),
            kind: ProcessKind::Compute,
            first_seen: t(1_500),
            samples: 1,
            gpu_memory_bytes: Some(Gauge {
                mean: 1e9,
                min: 1e9,
                max: 1e9,
                last: 1e9,
                count: 10,
            }),
            sm_utilization: Some(g(0.6)),
            memory_utilization: Some(g(0.3)),
            encoder_utilization: Some(g(0.02)),
            decoder_utilization: Some(g(0.01)),
        }
    }

    fn window(devices: Vec<DeviceWindow>, processes: Vec<ProcessWindow>) -> Window {
        Window {
            start: t(2_000),
            end: t(2_010),
            sample_count: 10,
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            devices,
            processes,
            xid_events: Vec::new(),
        }
    }

    fn node() -> NodeIdentity {
        NodeIdentity {
            host_name: "gpu-node-1".into(),
            service_name: "gpulse".into(),
            service_instance_id: "6f1c1c3e-0000-4000-8000-000000000001".into(),
            service_version: GPULSE_VERSION.into(),
            extra_attributes: vec![("k8s.node.name".into(), "gpu-node-1".into())],
        }
    }

    /// The window with the processes attribution resolved (`workloads`; one missing is known by
    /// its PID) and the usage it measured.
    fn attributed(
        window: Window,
        workloads: HashMap<u32, Workload>,
        usage: HashMap<u32, ProcessUsage>,
    ) -> AttributedWindow {
        AttributedWindow {
            window,
            workloads,
            usage,
            parent_alive: HashMap::new(),
            accounts: Default::default(),
            departed: Default::default(),
            ledger: Default::default(),
        }
    }

    /// GPU 2 in MIG mode with one instance, which process 4343 holds alone: the instance's
    /// GPM is its own (the per-process MIG metrics).
    fn mig_gpu_with_a_lone_process() -> (DeviceWindow, ProcessWindow) {
        let mut gpu = empty_device(2);
        let gpm = full_device(2).gpm;
        gpu.mig_instances = vec![MigInstanceWindow {
            info: Arc::new(MigInstanceInfo {
                uuid: "MIG-00000002-0001-0000-0000-000000000000".into(),
                name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
                parent_uuid: gpu.info.uuid.clone(),
                parent_index: 2,
                mig_index: 0,
                gpu_instance_id: 1,
                compute_instance_id: 0,
            }),
            memory_used_bytes: Some(1 << 30),
            memory_free_bytes: Some(39 << 30),
            memory_total_bytes: Some(40 << 30),
            gpm,
            pids: vec![4343],
        }];
        let process = ProcessWindow {
            sm_utilization: None,
            memory_utilization: None,
            encoder_utilization: None,
            decoder_utilization: None,
            ..full_process(4343, 2)
        };
        (gpu, process)
    }

    /// A batch with every field of every input set.
    fn full_batch() -> MetricsBatch {
        let (mig_gpu, on_mig) = mig_gpu_with_a_lone_process();
        let w = window(
            vec![full_device(0), full_device(1), mig_gpu],
            vec![full_process(4242, 0), full_process(4242, 1), on_mig],
        );
        let mut wl = Workload::unresolved(4242);
        wl.vpid = Some(1);
        wl.container_id = Some("c".repeat(64));
        wl.attributed_by = AttributionMethod::HostPid;
        let workloads = HashMap::from([(4242, wl)]);
        let usage = HashMap::from([(
            4242,
            ProcessUsage {
                cpu_utilization: Some(1.2),
                tree_cpu_utilization: Some(4.8),
                memory_rss_bytes: Some(3 << 30),
            },
        )]);
        // 4242 is rank 1 of a torch.distributed job whose step spans reached the receiver.
        let mut training = TrainingWindow::default();
        training.processes.insert(
            4242,
            ProcessTraining {
                step_seconds: 0.4,
                collective_wait_seconds: Some(0.1),
                data_wait_seconds: 0.05,
                steps: 25,
                distributed: Some(DistributedIdentity {
                    rank: 1,
                    job_id: Some("job-7".into()),
                    ..DistributedIdentity::default()
                }),
            },
        );
        let mut full = attributed(w, workloads, usage);
        // The GPU time and energy charged to the process, as the attribution stage figures them.
        full.accounts = GpuAccountant::default().account(&full.window, &full.workloads);
        metrics_batch_with_training(&full, &training, &node())
    }

    fn full_request() -> ExportMetricsServiceRequest {
        full_batch().into_request()
    }

    fn all_metrics(req: &ExportMetricsServiceRequest) -> impl Iterator<Item = &Metric> {
        req.resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
    }

    fn instrument_of(m: &Metric) -> &'static str {
        match &m.data {
            Some(Data::Gauge(_)) => "gauge",
            Some(Data::Sum(s)) if s.is_monotonic => "counter",
            Some(Data::Sum(_)) => "updowncounter",
            other => panic!("{}: unexpected data {other:?}", m.name),
        }
    }

    /// (name, instrument, unit) of each row of docs/metrics.md's metric tables (the rows whose
    /// second cell names an instrument) but those of its "Health metrics" section: gpulse's own
    /// health is the OpenTelemetry SDK's (src/export/telemetry, which checks that section itself).
    fn documented_metrics() -> BTreeMap<String, (String, String)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
        let doc = std::fs::read_to_string(path).expect("docs/metrics.md must exist");
        let mut rows = BTreeMap::new();
        let mut in_health = false;
        for line in doc.lines() {
            if line.starts_with('#') {
                in_health = line.trim_start_matches('#').trim() == "Health metrics (node resource)";
                continue;
            }
            if in_health || !line.trim_start().starts_with('|') {
                continue;
            }
            let line = line.replace("\\|", "/");
            let cells: Vec<&str> = line
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if cells.len() < 3 || !["gauge", "counter", "updowncounter"].contains(&cells[1]) {
                continue;
            }
            let name = cells[0].trim_matches('`').to_string();
            let unit = cells[2].trim_matches('`').to_string();
            let previous = rows.insert(name.clone(), (cells[1].to_string(), unit));
            assert!(previous.is_none(), "{name} is documented twice");
        }
        rows
    }

    #[test]
    fn emitted_metric_names_instruments_and_units_match_docs_metrics_md() {
        let documented = documented_metrics();
        assert!(
            documented.len() > 30,
            "parsed only {} rows",
            documented.len()
        );
        let req = full_request();
        let mut emitted = BTreeMap::new();
        for m in all_metrics(&req) {
            let row = (instrument_of(m).to_string(), m.unit.clone());
            if let Some(prev) = emitted.insert(m.name.clone(), row.clone()) {
                assert_eq!(prev, row, "{} is emitted with two shapes", m.name);
            }
        }
        let emitted_names: BTreeSet<&String> = emitted.keys().collect();
        let documented_names: BTreeSet<&String> = documented.keys().collect();
        assert_eq!(
            emitted_names, documented_names,
            "docs/metrics.md and the request builder disagree on the metric names"
        );
        for (name, shape) in &emitted {
            assert_eq!(
                Some(shape),
                documented.get(name),
                "{name}: instrument/unit differ from docs"
            );
        }
        // The code-side table too: every entry is documented the same way.
        for spec in &METRICS {
            let want = (spec.instrument.as_str().to_string(), spec.unit.to_string());
            assert_eq!(
                documented.get(spec.name),
                Some(&want),
                "METRICS entry {}",
                spec.name
            );
        }
    }

    #[test]
    fn none_fields_yield_no_point() {
        let mut process = full_process(7, 0);
        process.gpu_memory_bytes = None;
        process.sm_utilization = None;
        process.memory_utilization = None;
        process.encoder_utilization = None;
        process.decoder_utilization = None;
        let w = window(vec![empty_device(0)], vec![process]);
        let usage = HashMap::from([(7, ProcessUsage::default())]);
        let req = metrics_request(&attributed(w, HashMap::new(), usage), &node());

        let node_names: BTreeSet<&str> = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        // What is always known: whether the device answers, and the XID count gpulse keeps.
        assert_eq!(node_names, BTreeSet::from(["hw.status", "hw.errors"]));
        let errors = all_metrics(&req)
            .find(|m| m.name == "hw.errors")
            .expect("hw.errors");
        match &errors.data {
            Some(Data::Sum(s)) => assert_eq!(s.data_points.len(), 1, "xid only, no ECC points"),
            other => panic!("hw.errors: {other:?}"),
        }
        assert_eq!(
            req.resource_metrics.len(),
            2,
            "the process keeps its resource"
        );
        assert!(
            req.resource_metrics[1].scope_metrics[0].metrics.is_empty(),
            "a process with nothing known has no metric"
        );
        let line = to_otlp_json_line(&req);
        assert!(!line.contains("hw.gpu.utilization"));
    }

    #[test]
    fn batch_encoding_is_prosts_encoding_of_the_full_request() {
        use prost::Message;
        let batch = full_batch();
        let bytes = batch.encode();
        assert_eq!(
            batch.point_count(),
            gpulse::export::metrics::data_point_count(&full_request())
        );
        assert_eq!(bytes, full_request().encode_to_vec());
        let decoded = ExportMetricsServiceRequest::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded, full_request());
    }

    #[test]
    fn every_data_point_has_timestamps_and_a_value() {
        let req = full_request();
        for m in all_metrics(&req) {
            let points = match &m.data {
                Some(Data::Gauge(g)) => &g.data_points,
                Some(Data::Sum(s)) => &s.data_points,
                other => panic!("{other:?}"),
            };
            assert!(!points.is_empty(), "{} has no point", m.name);
            for p in points {
                assert!(p.value.is_some(), "{}", m.name);
                assert!(p.start_time_unix_nano > 0 && p.start_time_unix_nano <= p.time_unix_nano);
                assert_eq!(p.time_unix_nano, 2_010 * 1_000_000_000, "{}", m.name);
            }
        }
    }

    #[test]
    fn json_line_matches_golden() {
        let mut d = empty_device(0);
        d.fields.set_gauge(
            DeviceField::UtilizationGpu,
            Some(Gauge {
                mean: 0.5,
                min: 0.25,
                max: 1.0,
                last: 0.5,
                count: 2,
            }),
        );
        let mut w = window(vec![d], Vec::new());
        w.driver_version = None;
        let node = NodeIdentity {
            host_name: "h".into(),
            service_name: "gpulse".into(),
            service_instance_id: "i".into(),
            service_version: "v".into(),
            extra_attributes: Vec::new(),
        };
        let req = metrics_request(&attributed(w, HashMap::new(), HashMap::new()), &node);
        let line = to_otlp_json_line(&req);

        let s = |k: &str, v: &str| format!(r#"{{"key":"{k}","value":{{"stringValue":"{v}"}}}}"#);
        let dev = [
            s("hw.id", "GPU-00000000-0000-0000-0000-000000000000"),
            s("hw.name", "gpu0"),
            s("hw.type", "gpu"),
            s("hw.vendor", "NVIDIA"),
            s("hw.model", "NVIDIA H100 80GB HBM3"),
            s("hw.serial_number", "1650123456789"),
            r#"{"key":"gpu.index","value":{"intValue":"0"}}"#.to_string(),
            s("gpu.pci_address", "00000000:18:00.0"),
        ]
        .join(",");
        let res = [
            s("service.name", "gpulse"),
            s("service.instance.id", "i"),
            s("service.version", "v"),
            s("host.name", "h"),
            s("telemetry.sdk.name", "gpulse"),
            s("telemetry.sdk.language", "rust"),
            s("telemetry.sdk.version", GPULSE_VERSION),
        ]
        .join(",");
        let pt = |extra: &str, start: &str, v: &str| {
            format!(
                r#"{{"asDouble":{v},"attributes":[{dev},{extra}],"startTimeUnixNano":"{start}","timeUnixNano":"2010000000000"}}"#
            )
        };
        let ipt = |extra: &str, v: &str| {
            format!(
                r#"{{"asInt":"{v}","attributes":[{dev},{extra}],"startTimeUnixNano":"1000000000000","timeUnixNano":"2010000000000"}}"#
            )
        };
        let golden = format!(
            concat!(
                r#"{{"resourceMetrics":[{{"resource":{{"attributes":[{res}]}},"scopeMetrics":[{{"metrics":["#,
                r#"{{"description":"Mean ratio of the window the GPU task was busy.","gauge":{{"dataPoints":[{util}]}},"name":"hw.gpu.utilization","unit":"1"}},"#,
                r#"{{"description":"Highest sampled hw.gpu.utilization in the window.","gauge":{{"dataPoints":[{util_max}]}},"name":"hw.gpu.utilization.max","unit":"1"}},"#,
                r#"{{"description":"Lowest sampled hw.gpu.utilization in the window.","gauge":{{"dataPoints":[{util_min}]}},"name":"hw.gpu.utilization.min","unit":"1"}},"#,
                r#"{{"description":"Errors since the start time.","name":"hw.errors","sum":{{"aggregationTemporality":2,"dataPoints":[{xid}],"isMonotonic":true}},"unit":"{{error}}"}},"#,
                r#"{{"description":"1 for the device's current state, 0 for the other.","name":"hw.status","sum":{{"aggregationTemporality":2,"dataPoints":[{ok},{failed}]}},"unit":"1"}}"#,
                r#"],"scope":{{"name":"gpulse","version":"{ver}"}}}}]}}]}}"#
            ),
            res = res,
            util = pt(&s("hw.gpu.task", "general"), "2000000000000", "0.5"),
            util_max = pt(&s("hw.gpu.task", "general"), "2000000000000", "1.0"),
            util_min = pt(&s("hw.gpu.task", "general"), "2000000000000", "0.25"),
            xid = ipt(&s("error.type", "xid"), "0"),
            ok = ipt(&s("hw.state", "ok"), "1"),
            failed = ipt(&s("hw.state", "failed"), "0"),
            ver = GPULSE_VERSION,
        );
        // Compared as JSON values: key order depends on serde_json's features, the content
        // (names, string-encoded 64-bit ints, omitted defaults) does not.
        let parsed: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        let want: serde_json::Value = serde_json::from_str(&golden).expect("golden is JSON");
        assert_eq!(parsed, want, "\n got: {line}\nwant: {golden}");
        assert!(!line.contains('\n'));
        let back: ExportMetricsServiceRequest = serde_json::from_str(&line).expect("parses back");
        assert_eq!(back, req);
    }

    /// At full scale (length prefixes of three bytes, a thousand shared attribute lists) the
    /// batch still encodes to exactly prost's bytes. Timing is Criterion's job
    /// (`cargo bench --bench hotpath_64x1024 -- export`).
    #[test]
    fn batch_encoding_matches_prost_at_64_gpus_1024_processes() {
        use prost::Message;

        let devices: Vec<DeviceWindow> = (0..64).map(full_device).collect();
        let processes: Vec<ProcessWindow> = (0..1024u32)
            .map(|i| full_process(10_000 + i, i % 64))
            .collect();
        let w = window(devices, processes);
        let workloads: HashMap<u32, Workload> = (0..1024u32)
            .map(|i| {
                let pid = 10_000 + i;
                let mut wl = Workload::unresolved(pid);
                wl.vpid = Some(1);
                wl.executable_name = Some("python3".into());
                wl.owner = Some("trainer".into());
                wl.container_id = Some(format!("{i:064x}"));
                wl.container_runtime = Some("containerd".into());
                wl.pod_uid = Some(format!("{i:08x}-0000-4000-8000-000000000000"));
                wl.pod_name = Some(format!("trainer-{i}"));
                wl.namespace_name = Some("ml".into());
                wl.container_name = Some("trainer".into());
                wl.service_name = Some("trainer".into());
                wl.resource_attributes = vec![("service.namespace".into(), "research".into())];
                wl.attributed_by = AttributionMethod::HostPid;
                (pid, wl)
            })
            .collect();
        let usage: HashMap<u32, ProcessUsage> = (0..1024u32)
            .map(|i| {
                let u = ProcessUsage {
                    cpu_utilization: Some(1.0),
                    tree_cpu_utilization: Some(4.0),
                    memory_rss_bytes: Some(1 << 32),
                };
                (10_000 + i, u)
            })
            .collect();
        let node = node();
        let batch = metrics_batch(&attributed(w, workloads, usage), &node);
        let bytes = batch.encode();
        let points = batch.point_count();
        let request = batch.into_request();
        assert_eq!(points, gpulse::export::metrics::data_point_count(&request));
        assert!(points > 1024 * 8, "{points} points");
        assert!(bytes.len() > 1 << 21, "{} bytes", bytes.len());
        assert!(
            bytes == request.encode_to_vec(),
            "batch and prost encodings differ"
        );
    }

    /// A reference implementation (Python `protobuf`'s `json_format.Parse`, under
    /// `$GPULSE_TEST_PYTHON`) decodes our OTLP/JSON lines of a full metrics request and a logs
    /// request to the same messages as their protobuf encodings. The files are written to a
    /// temporary directory, or kept in `$GPULSE_OTLP_DUMP_DIR` when set.
    #[test]
    fn json_lines_decode_to_the_same_message_in_a_reference_implementation() {
        use gpulse::export::logs::{logs_request, logs_to_otlp_json_line};
        use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
        use opentelemetry_proto::tonic::logs::v1::LogRecord;
        use prost::Message;

        let temp = tempfile::tempdir().expect("temporary directory");
        let dir = std::env::var_os("GPULSE_OTLP_DUMP_DIR")
            .map_or_else(|| temp.path().to_path_buf(), std::path::PathBuf::from);
        let metrics = full_request();
        let record = LogRecord {
            time_unix_nano: 1_700_000_000_000_000_000,
            severity_number: 13,
            severity_text: "WARN".into(),
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue("throttled".into())),
            }),
            attributes: vec![KeyValue {
                key: "gpulse.finding.share".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::DoubleValue(0.0)),
                }),
                key_strindex: 0,
            }],
            trace_id: vec![0x5b; 16],
            span_id: vec![0x8e; 8],
            event_name: "gpulse.finding.started".into(),
            ..Default::default()
        };
        let wl = Workload::unresolved(1);
        let logs = logs_request(&node(), vec![record.clone()], vec![(&wl, vec![record])]);
        let files = [
            ("metrics.pb", metrics.encode_to_vec()),
            ("metrics.json", to_otlp_json_line(&metrics).into_bytes()),
            ("logs.pb", logs.encode_to_vec()),
            ("logs.json", logs_to_otlp_json_line(&logs).into_bytes()),
        ];
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).expect("dump dir must be writable");
        }
        let out = std::process::Command::new(crate::common::python())
            .arg("-c")
            .arg(REFERENCE_JSON_CHECK)
            .arg(&dir)
            .output()
            .expect("run the test Python (GPULSE_TEST_PYTHON)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "reference check failed: {text}");
        assert!(
            text.contains("metrics: equal") && text.contains("logs: equal"),
            "{text}"
        );
    }

    /// Parses each `.json` with protobuf's own JSON parser and compares it with the `.pb`. OTLP/JSON
    /// differs from protobuf's JSON mapping in one documented way: trace and span ids are hex,
    /// not base64; they are converted first.
    const REFERENCE_JSON_CHECK: &str = r#"
import base64, json, sys
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

def ids_to_base64(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            ids_to_base64(item)

directory = sys.argv[1]
for name, message in (("metrics", ExportMetricsServiceRequest), ("logs", ExportLogsServiceRequest)):
    with open(f"{directory}/{name}.pb", "rb") as f:
        want = message.FromString(f.read())
    with open(f"{directory}/{name}.json") as f:
        line = json.load(f)
    ids_to_base64(line)
    got = json_format.ParseDict(line, message())
    if got != want:
        sys.exit(f"{name}: the JSON decodes to a different message")
    print(f"{name}: equal ({want.ByteSize()} bytes)")
"#;

    #[test]
    fn instrument_names_are_the_documented_ones() {
        let names: Vec<&str> = [
            Instrument::Gauge,
            Instrument::Counter,
            Instrument::UpDownCounter,
        ]
        .iter()
        .map(|i| i.as_str())
        .collect();
        assert_eq!(names, ["gauge", "counter", "updowncounter"]);
    }
}

/// The OTLP transports and the delivery queue against a real OTLP receiver process
/// (`tests/receiver/otlp_receiver.py`): what arrives, in which order, and what is dropped.
mod transport {
    use std::sync::Arc;
    use std::time::Duration;

    use gpulse::config::otlp::{Compression, Protocol, SignalEndpoint, TlsFiles};
    use gpulse::export::queue::{BackoffPolicy, Count, DeliveryQueue, QueueLimits};
    use gpulse::export::transport::{
        AnyTransport, EncodedRequest, FailureReason, GrpcTransport, HttpTransport, Retryability,
        SendError, Signal, Transport,
    };
    use gpulse::values::SecretString;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use serde_json::Value;

    use crate::common::{Receiver, ReceiverOptions, TestCa};

    const WAIT: Duration = Duration::from_secs(20);

    fn attr(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    /// A one-point metrics request whose resource carries `seq`, so order can be checked.
    fn metrics(seq: i64) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![
                        attr(
                            "service.name",
                            any_value::Value::StringValue("gpulse-test".into()),
                        ),
                        attr("test.seq", any_value::Value::IntValue(seq)),
                    ],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "hw.gpu.utilization".into(),
                        unit: "1".into(),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                attributes: vec![attr(
                                    "hw.id",
                                    any_value::Value::StringValue("GPU-0".into()),
                                )],
                                time_unix_nano: 1_700_000_000_000_000_000 + seq as u64,
                                value: Some(number_data_point::Value::AsDouble(0.625)),
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn encoded(seq: i64) -> EncodedRequest {
        EncodedRequest::from_message(&metrics(seq), 1)
    }

    fn endpoint(protocol: Protocol, url: String) -> SignalEndpoint {
        SignalEndpoint {
            protocol,
            url,
            headers: vec![
                ("x-api-key".into(), SecretString::new("k-123")),
                ("x-tenant".into(), SecretString::new("team-a")),
            ],
            timeout: Duration::from_secs(5),
            compression: Compression::Gzip,
            tls: TlsFiles::default(),
            insecure: false,
        }
    }

    fn grpc(receiver: &Receiver) -> SignalEndpoint {
        endpoint(Protocol::Grpc, receiver.grpc_url())
    }

    fn http(receiver: &Receiver, path: &str) -> SignalEndpoint {
        endpoint(
            Protocol::HttpProtobuf,
            format!("{}{path}", receiver.http_base()),
        )
    }

    fn fast_backoff() -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
            ..BackoffPolicy::default()
        }
    }

    /// The `test.seq` of a recorded metrics request.
    fn seq(recorded: &Value) -> i64 {
        let attrs = recorded["request"]["resourceMetrics"][0]["resource"]["attributes"]
            .as_array()
            .unwrap_or_else(|| panic!("no resource attributes in {recorded}"));
        let seq = attrs
            .iter()
            .find(|a| a["key"] == "test.seq")
            .unwrap_or_else(|| panic!("no test.seq in {recorded}"));
        // protobuf's JSON mapping writes 64-bit integers as strings.
        seq["value"]["intValue"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("test.seq is not an int in {recorded}"))
    }

    fn accepted(requests: &[Value]) -> Vec<&Value> {
        requests.iter().filter(|r| r["answer"] == "ok").collect()
    }

    fn assert_intact(recorded: &Value, seq_want: i64) {
        assert_eq!(seq(recorded), seq_want);
        let metric = &recorded["request"]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0];
        assert_eq!(metric["name"], "hw.gpu.utilization");
        assert_eq!(metric["unit"], "1");
        let point = &metric["gauge"]["dataPoints"][0];
        assert_eq!(point["asDouble"], 0.625);
        assert_eq!(
            point["timeUnixNano"],
            (1_700_000_000_000_000_000u64 + seq_want as u64).to_string()
        );
        assert_eq!(point["attributes"][0]["value"]["stringValue"], "GPU-0");
    }

    /// A loopback TCP relay to `target` that keeps what the client sent, so a test can look
    /// at the HTTP/2 frames: Python's gRPC server hides the `grpc-encoding` it received.
    async fn recording_relay(target: u16) -> (u16, Arc<std::sync::Mutex<Vec<u8>>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        tokio::spawn(async move {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
            });
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = client_rx.read(&mut buf).await {
                if n == 0 || server_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                record.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        (port, seen)
    }

    /// The compressed-flag byte of the first gRPC message in a client's HTTP/2 byte stream.
    fn first_grpc_message_flag(stream: &[u8]) -> Option<u8> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut rest = stream.strip_prefix(PREFACE)?;
        while rest.len() >= 9 {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let payload = rest.get(9..9 + len)?;
            // DATA frames (type 0); a PADDED one (0x8) starts with its pad length.
            if kind == 0 {
                let data = if flags & 0x8 != 0 {
                    payload.get(1..)?
                } else {
                    payload
                };
                if let Some(&flag) = data.first() {
                    return Some(flag);
                }
            }
            rest = &rest[9 + len..];
        }
        None
    }

    #[tokio::test]
    async fn grpc_export_arrives_intact_with_headers_and_gzip() {
        let receiver = Receiver::start(ReceiverOptions::default());
        let (relay, sent) = recording_relay(receiver.grpc_port).await;
        let settings = endpoint(Protocol::Grpc, format!("http://127.0.0.1:{relay}"));
        let transport = GrpcTransport::new(Signal::Metrics, &settings).unwrap();
        let outcome = transport.send(Signal::Metrics, &encoded(7)).await.unwrap();
        assert_eq!(outcome.partial_success, None);
        let got = receiver.wait_for_async(|r| !r.is_empty(), WAIT).await;
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!(r["transport"], "grpc");
        assert_eq!(r["signal"], "metrics");
        assert_eq!(r["headers"]["x-api-key"], "k-123");
        assert_eq!(r["headers"]["x-tenant"], "team-a");
        assert_intact(r, 7);
        let flag = first_grpc_message_flag(&sent.lock().unwrap());
        assert_eq!(flag, Some(1), "the gRPC message went uncompressed");

        // And with compression off, the flag says so.
        let (relay, sent) = recording_relay(receiver.grpc_port).await;
        let mut settings = endpoint(Protocol::Grpc, format!("http://127.0.0.1:{relay}"));
        settings.compression = Compression::None;
        let transport = GrpcTransport::new(Signal::Metrics, &settings).unwrap();
        transport.send(Signal::Metrics, &encoded(8)).await.unwrap();
        let got = receiver.wait_for_async(|r| r.len() >= 2, WAIT).await;
        assert_intact(&got[1], 8);
        assert_eq!(first_grpc_message_flag(&sent.lock().unwrap()), Some(0));
    }

    #[tokio::test]
    async fn http_export_arrives_intact_with_headers_and_gzip() {
        let receiver = Receiver::start(ReceiverOptions::default());
        let transport =
            HttpTransport::new(Signal::Metrics, &http(&receiver, "/v1/metrics")).unwrap();
        transport.send(Signal::Metrics, &encoded(8)).await.unwrap();
        let mut plain = http(&receiver, "/v1/metrics");
        plain.compression = Compression::None;
        let plain = HttpTransport::new(Signal::Metrics, &plain).unwrap();
        plain.send(Signal::Metrics, &encoded(9)).await.unwrap();

        let got = receiver.wait_for_async(|r| r.len() >= 2, WAIT).await;
        let (gz, raw) = (&got[0], &got[1]);
        assert_eq!(gz["transport"], "http");
        assert_eq!(gz["headers"]["content-type"], "application/x-protobuf");
        assert_eq!(gz["headers"]["x-api-key"], "k-123");
        assert_eq!(gz["headers"]["x-tenant"], "team-a");
        assert_eq!(gz["content_encoding"], "gzip");
        assert_intact(gz, 8);
        assert_eq!(raw["content_encoding"], Value::Null);
        assert_intact(raw, 9);
    }

    #[tokio::test]
    async fn logs_go_to_the_logs_service_on_both_transports() {
        let receiver = Receiver::start(ReceiverOptions::default());
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        severity_text: "WARN".into(),
                        body: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("GPU 0 throttled".into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let body = EncodedRequest::from_message(&request, 1);
        let over_grpc = AnyTransport::for_endpoint(Signal::Logs, &grpc(&receiver)).unwrap();
        let over_http =
            AnyTransport::for_endpoint(Signal::Logs, &http(&receiver, "/v1/logs")).unwrap();
        over_grpc.send(Signal::Logs, &body).await.unwrap();
        over_http.send(Signal::Logs, &body).await.unwrap();
        let got = receiver.wait_for_async(|r| r.len() >= 2, WAIT).await;
        for (r, transport) in got.iter().zip(["grpc", "http"]) {
            assert_eq!(r["signal"], "logs");
            assert_eq!(r["transport"], transport);
            let record = &r["request"]["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0];
            assert_eq!(record["body"]["stringValue"], "GPU 0 throttled");
        }
    }

    #[tokio::test]
    async fn partial_success_is_reported_on_both_transports() {
        let receiver = Receiver::start(ReceiverOptions {
            partial_success: Some(2),
            ..Default::default()
        });
        for settings in [grpc(&receiver), http(&receiver, "/v1/metrics")] {
            let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
            let outcome = transport.send(Signal::Metrics, &encoded(1)).await.unwrap();
            let partial = outcome.partial_success.expect("a partial success");
            assert_eq!(partial.rejected, 2, "{:?}", settings.protocol);
            assert!(partial.error_message.contains("rejected 2"), "{partial:?}");
        }
    }

    /// The outage scenario, over one protocol: the receiver fails until a file is removed;
    /// everything queued meanwhile then arrives, oldest first.
    async fn outage_then_all_in_order(protocol: Protocol) {
        let outage = tempfile::NamedTempFile::new().unwrap();
        let receiver = Receiver::start(ReceiverOptions {
            fail_until_file: Some(outage.path().to_path_buf()),
            ..Default::default()
        });
        let settings = match protocol {
            Protocol::Grpc => grpc(&receiver),
            Protocol::HttpProtobuf => http(&receiver, "/v1/metrics"),
        };
        let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
        let (queue, sender) = DeliveryQueue::new(QueueLimits::default(), fast_backoff(), transport);
        let sender = tokio::spawn(sender.run());
        const N: i64 = 6;
        for i in 0..N {
            assert!(queue.push(Signal::Metrics, encoded(i)).queued);
        }
        // The outage is real: attempts are made and refused, nothing is lost or skipped.
        receiver
            .wait_for_async(|r| r.len() >= 3 && accepted(r).is_empty(), WAIT)
            .await;
        let during = queue.stats();
        assert_eq!(during.depth, N as usize);
        // The receiver records an attempt before it answers, so the last one may still be
        // in flight here.
        let failures: u64 = during.failures.values().sum();
        assert!(failures >= 2, "{during:?}");
        assert!(
            receiver.requests().iter().all(|r| seq(r) == 0),
            "only the head is retried"
        );

        std::fs::remove_file(outage.path()).unwrap();
        let got = receiver
            .wait_for_async(|r| accepted(r).len() >= N as usize, WAIT)
            .await;
        let order: Vec<i64> = accepted(&got).into_iter().map(seq).collect();
        assert_eq!(order, (0..N).collect::<Vec<_>>());

        let report = queue
            .flush(tokio::time::Instant::now() + Duration::from_secs(5))
            .await;
        assert_eq!(report.undelivered, Count::default());
        sender.await.unwrap();
        let stats = queue.stats();
        assert_eq!(
            stats.delivered,
            Count {
                requests: N as u64,
                points: N as u64
            }
        );
        assert_eq!(stats.depth, 0);
        assert!(stats.last_export_latency.is_some());
        let reason = match protocol {
            Protocol::Grpc => FailureReason::Grpc(tonic::Code::Unavailable as i32),
            Protocol::HttpProtobuf => FailureReason::Http(503),
        };
        assert!(
            stats.failures.get(&reason).copied().unwrap_or(0) >= 3,
            "{stats:?}"
        );
    }

    #[tokio::test]
    async fn grpc_outage_then_everything_arrives_in_order() {
        outage_then_all_in_order(Protocol::Grpc).await;
    }

    #[tokio::test]
    async fn http_outage_then_everything_arrives_in_order() {
        outage_then_all_in_order(Protocol::HttpProtobuf).await;
    }

    #[tokio::test]
    async fn permanent_rejections_are_dropped_counted_and_not_retried() {
        let receiver = Receiver::start(ReceiverOptions {
            fail_status: Some("invalid_argument"),
            ..Default::default()
        });
        for (settings, reason) in [
            (http(&receiver, "/v1/metrics"), FailureReason::Http(400)),
            (
                grpc(&receiver),
                FailureReason::Grpc(tonic::Code::InvalidArgument as i32),
            ),
        ] {
            let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
            // The server's own message makes it into the error, for the log.
            let err = transport
                .send(Signal::Metrics, &encoded(0))
                .await
                .unwrap_err();
            assert_eq!(err.retryability(), Retryability::Permanent, "{err}");
            assert!(
                err.to_string()
                    .contains("test receiver answers invalid_argument"),
                "{err}"
            );

            let (queue, sender) =
                DeliveryQueue::new(QueueLimits::default(), fast_backoff(), transport);
            let sender = tokio::spawn(sender.run());
            queue.push(
                Signal::Metrics,
                EncodedRequest::from_message(&metrics(1), 5),
            );
            queue.push(
                Signal::Metrics,
                EncodedRequest::from_message(&metrics(2), 5),
            );
            let report = queue
                .flush(tokio::time::Instant::now() + Duration::from_secs(10))
                .await;
            sender.await.unwrap();
            assert_eq!(report.undelivered, Count::default());
            let stats = queue.stats();
            assert_eq!(
                stats.dropped_rejected,
                Count {
                    requests: 2,
                    points: 10
                }
            );
            assert_eq!(stats.delivered, Count::default());
            assert_eq!(stats.failures.get(&reason), Some(&2), "{stats:?}");
        }
        // One attempt each (2 direct sends, 4 queued), no retry of a permanent failure.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(receiver.requests().len(), 6);
    }

    #[tokio::test]
    async fn the_byte_bound_drops_the_oldest_and_counts_them() {
        let outage = tempfile::NamedTempFile::new().unwrap();
        let receiver = Receiver::start(ReceiverOptions {
            fail_until_file: Some(outage.path().to_path_buf()),
            ..Default::default()
        });
        let size = encoded(0).len();
        let limits = QueueLimits {
            max_bytes: 3 * size + size / 2,
            ..QueueLimits::default()
        };
        let transport =
            HttpTransport::new(Signal::Metrics, &http(&receiver, "/v1/metrics")).unwrap();
        let (queue, sender) = DeliveryQueue::new(limits, fast_backoff(), transport);
        // Pushed before the sender starts, so no request is in flight and the bound is exact.
        let mut overflow = Count::default();
        for i in 0..5 {
            let report = queue.push(Signal::Metrics, encoded(i));
            assert!(report.queued);
            overflow.requests += report.overflow.requests;
            overflow.points += report.overflow.points;
        }
        assert_eq!(
            overflow,
            Count {
                requests: 2,
                points: 2
            }
        );
        let stats = queue.stats();
        assert_eq!(stats.dropped_overflow, overflow);
        assert_eq!(stats.depth, 3);
        assert!(stats.bytes <= limits.max_bytes);

        let sender = tokio::spawn(sender.run());
        std::fs::remove_file(outage.path()).unwrap();
        let got = receiver
            .wait_for_async(|r| accepted(r).len() >= 3, WAIT)
            .await;
        let order: Vec<i64> = accepted(&got).into_iter().map(seq).collect();
        assert_eq!(order, [2, 3, 4], "the two oldest were dropped");
        queue
            .flush(tokio::time::Instant::now() + Duration::from_secs(5))
            .await;
        sender.await.unwrap();
    }

    /// The server's retry hint is a floor under the (here much shorter) backoff.
    async fn retry_hint_is_honoured(settings: SignalEndpoint, receiver: &Receiver) {
        let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
        let (queue, sender) = DeliveryQueue::new(QueueLimits::default(), fast_backoff(), transport);
        let sender = tokio::spawn(sender.run());
        queue.push(Signal::Metrics, encoded(1));
        let got = receiver
            .wait_for_async(|r| !accepted(r).is_empty(), WAIT)
            .await;
        assert_eq!(
            got.len(),
            2,
            "one refusal, then the accepted retry: {got:?}"
        );
        let waited =
            got[1]["received_at"].as_f64().unwrap() - got[0]["received_at"].as_f64().unwrap();
        assert!(
            waited >= 1.9,
            "retried after {waited:.3} s, before the 2 s hint"
        );
        queue
            .flush(tokio::time::Instant::now() + Duration::from_secs(5))
            .await;
        sender.await.unwrap();
        assert_eq!(queue.stats().delivered.requests, 1);
    }

    #[tokio::test]
    async fn http_retry_after_is_honoured() {
        let receiver = Receiver::start(ReceiverOptions {
            fail_status: Some("http_429_retry_after"),
            fail_count: Some(1),
            retry_after: Some(2),
            ..Default::default()
        });
        retry_hint_is_honoured(http(&receiver, "/v1/metrics"), &receiver).await;
    }

    #[tokio::test]
    async fn grpc_resource_exhausted_with_retry_info_is_retried_after_the_hint() {
        let receiver = Receiver::start(ReceiverOptions {
            fail_status: Some("resource_exhausted_retry_info"),
            fail_count: Some(1),
            retry_after: Some(2),
            ..Default::default()
        });
        let transport = GrpcTransport::new(Signal::Metrics, &grpc(&receiver)).unwrap();
        let err = transport
            .send(Signal::Metrics, &encoded(0))
            .await
            .unwrap_err();
        match &err {
            SendError::GrpcStatus {
                code, retry_after, ..
            } => {
                assert_eq!(*code, tonic::Code::ResourceExhausted);
                assert_eq!(*retry_after, Some(Duration::from_secs(2)));
            }
            other => panic!("{other}"),
        }
        // The direct send used up the one failure; restart for the queued scenario.
        drop(receiver);
        let receiver = Receiver::start(ReceiverOptions {
            fail_status: Some("resource_exhausted_retry_info"),
            fail_count: Some(1),
            retry_after: Some(2),
            ..Default::default()
        });
        retry_hint_is_honoured(grpc(&receiver), &receiver).await;
    }

    #[tokio::test]
    async fn flush_reports_what_an_outage_kept_back() {
        let outage = tempfile::NamedTempFile::new().unwrap();
        let receiver = Receiver::start(ReceiverOptions {
            fail_until_file: Some(outage.path().to_path_buf()),
            ..Default::default()
        });
        let transport = GrpcTransport::new(Signal::Metrics, &grpc(&receiver)).unwrap();
        let (queue, sender) = DeliveryQueue::new(QueueLimits::default(), fast_backoff(), transport);
        let sender = tokio::spawn(sender.run());
        for i in 0..3 {
            queue.push(Signal::Metrics, encoded(i));
        }
        let started = tokio::time::Instant::now();
        let report = queue.flush(started + Duration::from_millis(800)).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            report.undelivered,
            Count {
                requests: 3,
                points: 3
            }
        );
        assert_eq!(sender.await.unwrap(), report);
        assert!(
            !receiver.requests().is_empty(),
            "it did try during the flush"
        );
    }

    #[tokio::test]
    async fn tls_and_mutual_tls_round_trips() {
        let ca = TestCa::new();
        let receiver = Receiver::start(ReceiverOptions {
            tls: Some(ca.server.clone()),
            ..Default::default()
        });
        let trusting = TlsFiles {
            ca_certificate: Some(ca.ca_cert.clone()),
            ..TlsFiles::default()
        };
        for (mut settings, seq_no) in [(grpc(&receiver), 1), (http(&receiver, "/v1/metrics"), 2)] {
            assert!(settings.url.starts_with("https://"), "{}", settings.url);
            settings.tls = trusting.clone();
            let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
            transport
                .send(Signal::Metrics, &encoded(seq_no))
                .await
                .unwrap();
        }
        let got = receiver.wait_for_async(|r| r.len() >= 2, WAIT).await;
        assert_intact(&got[0], 1);
        assert_intact(&got[1], 2);

        // Without the private CA the server is not trusted: a retryable connect failure (a
        // certificate rotation may fix it), and nothing arrives.
        for settings in [grpc(&receiver), http(&receiver, "/v1/metrics")] {
            let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
            let err = transport
                .send(Signal::Metrics, &encoded(3))
                .await
                .unwrap_err();
            assert!(
                matches!(err.retryability(), Retryability::Retryable { .. }),
                "{err}"
            );
        }
        assert_eq!(receiver.requests().len(), 2);
        drop(receiver);

        // Mutual TLS: the receiver demands a client certificate from the same CA.
        let mut server = ca.server.clone();
        server.client_ca = Some(ca.ca_cert.clone());
        let receiver = Receiver::start(ReceiverOptions {
            tls: Some(server),
            ..Default::default()
        });
        let with_identity = TlsFiles {
            ca_certificate: Some(ca.ca_cert.clone()),
            client_certificate: Some(ca.client_cert.clone()),
            client_key: Some(ca.client_key.clone()),
        };
        for (mut settings, seq_no) in [(grpc(&receiver), 4), (http(&receiver, "/v1/metrics"), 5)] {
            settings.tls = with_identity.clone();
            let transport = AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap();
            transport
                .send(Signal::Metrics, &encoded(seq_no))
                .await
                .unwrap();
        }
        let got = receiver.wait_for_async(|r| r.len() >= 2, WAIT).await;
        assert_intact(&got[0], 4);
        assert_intact(&got[1], 5);
    }

    #[test]
    fn the_receiver_exits_cleanly_on_sigterm() {
        let receiver = Receiver::start(ReceiverOptions::default());
        let status = receiver.stop();
        assert!(status.success(), "{status:?}");
    }

    #[tokio::test]
    async fn a_stopped_collector_is_a_retryable_failure_on_both_transports() {
        let receiver = Receiver::start(ReceiverOptions::default());
        let settings = [grpc(&receiver), http(&receiver, "/v1/metrics")];
        assert!(receiver.stop().success());
        for settings in settings {
            let transport =
                Arc::new(AnyTransport::for_endpoint(Signal::Metrics, &settings).unwrap());
            let err = transport
                .send(Signal::Metrics, &encoded(0))
                .await
                .unwrap_err();
            assert!(
                matches!(err.retryability(), Retryability::Retryable { .. }),
                "{err}"
            );
            // Secrets stay out of the message.
            assert!(!err.to_string().contains("k-123"), "{err}");
        }
    }
}
