//! Cost of `/metrics` (`gpulse::export::prometheus`), for a window of 8 GPUs × 64 processes and
//! one of 64 GPUs × 1024 processes, with `--prometheus-names dcgm`:
//!
//! - `prometheus/update_<n>`: building the exposition from an analysed window (done once per
//!   export window, off the scrape path);
//! - `prometheus/scrape_<n>`: formatting the latest exposition as the Prometheus text format
//!   (what one scrape costs; it never calls NVML or reads `/proc`).
//!
//! Series and body size are printed once per size. Run: `cargo bench --bench prometheus`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use gpulse::attribution::{AttributedWindow, Workload};
use gpulse::config::{PrometheusNames, PrometheusSettings};
use gpulse::export::prometheus::encode::{encode, Format};
use gpulse::export::prometheus::Published;
use gpulse::export::resource::NodeIdentity;
use gpulse::sampling::{DeviceInfo, DeviceWindow, Gauge, ProcessKind, ProcessWindow, Window};
use gpulse::schema::DeviceField;

const T0: u64 = 1_700_000_000;

fn gauge(v: f64) -> Option<Gauge> {
    Some(Gauge {
        mean: v,
        min: v,
        max: v,
        last: v,
        count: 10,
    })
}

fn window(gpus: u32, procs: u32) -> AttributedWindow {
    let at = |s: u64| UNIX_EPOCH + Duration::from_secs(T0 + s);
    let devices: Vec<DeviceWindow> = (0..gpus)
        .map(|i| {
            let info = Arc::new(DeviceInfo {
                index: i,
                uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
                serial: None,
                minor_number: Some(i),
                memory_total_bytes: Some(80 << 30),
                max_sm_clock_mhz: None,
                max_memory_clock_mhz: None,
                compute_capability: None,
                fan_count: None,
            });
            let mut d = DeviceWindow::empty(info, at(0));
            d.fields.set_gauge(DeviceField::UtilizationGpu, gauge(0.62));
            d.fields
                .set_gauge(DeviceField::UtilizationMemory, gauge(0.31));
            d.fields
                .set_gauge(DeviceField::UtilizationEncoder, gauge(0.0));
            d.fields
                .set_gauge(DeviceField::UtilizationDecoder, gauge(0.0));
            d.fields.set_gauge(DeviceField::Temperature, gauge(58.0));
            d.fields.set_gauge(DeviceField::Power, gauge(420.0));
            d.fields.set_gauge(DeviceField::SmClock, gauge(1980.0));
            d.fields.set_gauge(DeviceField::MemoryClock, gauge(2619.0));
            d.fields.set_gauge(
                DeviceField::MemoryUsed,
                Some(Gauge::single((30u64 << 30) as f64)),
            );
            d.fields.set_gauge(
                DeviceField::MemoryFree,
                Some(Gauge::single((50u64 << 30) as f64)),
            );
            d.fields.set_total(DeviceField::Energy, Some(1e6));
            d
        })
        .collect();
    let processes: Vec<ProcessWindow> = (0..procs)
        .map(|p| ProcessWindow {
            pid: 10_000 + p,
            device_index: p % gpus,
            device_uuid: devices[(p % gpus) as usize].info.uuid.clone(),
            kind: ProcessKind::Compute,
            first_seen: at(0),
            samples: 10,
            gpu_memory_bytes: gauge(f64::from(p + 1) * 1e8),
            sm_utilization: gauge(0.1),
            memory_utilization: gauge(0.05),
            encoder_utilization: None,
            decoder_utilization: None,
        })
        .collect();
    let mut attributed = AttributedWindow::unattributed(Window {
        start: at(590),
        end: at(600),
        sample_count: 10,
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: None,
        devices,
        processes,
        xid_events: vec![],
    });
    for w in attributed.workloads.values_mut() {
        *w = Workload {
            container_id: Some(format!("{:064x}", w.pid)),
            pod_name: Some(format!("train-{}", w.pid)),
            namespace_name: Some("ml".into()),
            ..Workload::unresolved(w.pid)
        };
    }
    attributed
}

fn published() -> Published {
    Published::new(
        PrometheusSettings {
            addr: None,
            names: PrometheusNames::Dcgm,
            max_series: 1_000_000,
            dcgm_counters: None,
        },
        NodeIdentity {
            host_name: "gpu-node-1".into(),
            service_name: "gpulse".into(),
            service_instance_id: "bench".into(),
            service_version: "0.1.0".into(),
            extra_attributes: vec![],
        },
    )
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("prometheus");
    for (gpus, procs) in [(8, 64), (64, 1024)] {
        let w = window(gpus, procs);
        let p = published();
        p.update(&w, &Default::default(), &[]);
        let (e, own) = p.latest();
        let text = encode(
            Arc::clone(&e),
            own,
            Format::PrometheusText,
            SystemTime::now(),
        )
        .unwrap();
        println!(
            "prometheus {gpus}x{procs}: {} series, {} bytes of text ({} KiB)",
            e.series,
            text.len(),
            text.len() / 1024
        );
        group.bench_function(format!("update_{gpus}x{procs}"), |b| {
            b.iter(|| p.update(black_box(&w), &Default::default(), &[]))
        });
        group.bench_function(format!("scrape_{gpus}x{procs}"), |b| {
            b.iter(|| {
                let (e, own) = p.latest();
                black_box(encode(e, own, Format::PrometheusText, SystemTime::now()).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
