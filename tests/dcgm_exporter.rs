//! Integration tests: gpulse in dcgm-exporter's place. `gpulse run --dcgm-counters` with
//! dcgm-exporter's default counters file (`tests/fixtures/dcgm-exporter/default-counters.csv`)
//! on two simulated H100s, scraped by a real Prometheus that evaluates alert rules written on
//! dcgm-exporter's names: every series of the file is there with dcgm-exporter's type (the
//! metadata API) and labels, its value is what nvml-sim was told in dcgm-exporter's units, a GPU
//! without a field lacks only that series, and the alerts (remapped rows, remap failure, XID,
//! temperature, power, PCIe replays) fire on the GPU that causes them and not on the other. Then
//! a counters file with a subset and a comment, and one naming a field gpulse cannot serve.
//!
//! No GPU processes, so no cgroups: the test with Prometheus needs only the binaries of
//! `scripts/backends` (or `GPULSE_PROMETHEUS_BIN`) and is `#[ignore]`d like the other tests
//! needing them; `scripts/test` runs it. The others run in every `cargo test`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::prometheus::{backend, get, metrics_port, query, scrape_until, series};
use crate::prometheus::{start_prometheus, DEADLINE, SCRAPED_RUN};
use crate::run::Gpulse;
use crate::sampling::{gpulse_bin, sim_lib};

const GPU0: &str = "GPU-0a0a0a0a-1111-4222-8333-444444444444";
const GPU1: &str = "GPU-1b1b1b1b-1111-4222-8333-444444444444";

/// GPU 0 is unhealthy in every way an alert of dcgm-exporter's users looks at, with NVLink and
/// HBM temperature; GPU 1 is healthy, has no NVLink, no HBM sensor, and its driver answers
/// "not supported" for the row remapper and the PCIe replay counter. Constant signals, so
/// every value is known.
const SCENARIO: &str = r#"
[driver]
version = "550.54.15"
cuda_version = "12.4"

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-0a0a0a0a-1111-4222-8333-444444444444"
pci_bus_id = "00000000:18:00.0"
memory_total_mib = 81559
memory_reserved_mib = 542
power_limit_w = 700
remapped_rows = { corrected = 2, uncorrected = 1, pending = true, failure = true }

[device.signals]
gpu_util = 62
mem_util = 31
encoder_util = 7
decoder_util = 9
memory_used_mib = 30000
temperature_c = 91
memory_temperature_c = 70
power_w = 690
clock_sm_mhz = 1755
clock_mem_mhz = 2619
pcie_tx_kbps = 1000
pcie_rx_kbps = 2000
pcie_replays = 12

[device.gpm]
tensor_activity = 0.25
dram_activity = 0.4
graphics_activity = 0.5

[device.nvlink]
links = 2
tx_kibps = 1024
rx_kibps = 2048

[[device]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-1b1b1b1b-1111-4222-8333-444444444444"
pci_bus_id = "00000000:2A:00.0"
memory_total_mib = 81559
power_limit_w = 700

[device.signals]
gpu_util = 5
temperature_c = 35
power_w = 90

[[event]]
at_s = 3
device = 0
xid = 79

[[fault]]
kind = "error"
field = "remapped_rows"
device = 1

[[fault]]
kind = "error"
field = "pcie_replay"
device = 1
"#;

/// Alert rules as a dcgm-exporter user writes them, on its names only.
const RULES: &str = r#"groups:
  - name: gpu-hardware
    interval: 1s
    rules:
      - alert: GpuRowRemapFailure
        expr: DCGM_FI_DEV_ROW_REMAP_FAILURE > 0
      - alert: GpuUncorrectableRemappedRows
        expr: DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0
      - alert: GpuXid79FellOffTheBus
        expr: DCGM_FI_DEV_XID_ERRORS == 79
      - alert: GpuTooHot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
      - alert: GpuPowerNearLimit
        expr: DCGM_FI_DEV_POWER_USAGE > 650
      - alert: GpuPcieReplays
        expr: DCGM_FI_DEV_PCIE_REPLAY_COUNTER > 10
  - name: gpu-xid-class
    interval: 1s
    rules:
      # On gpulse's own series: XIDs by the Xid catalog's class and action, which
      # dcgm-exporter's last-XID gauge cannot say.
      - alert: GpuXidNeedsANodeRestart
        expr: hw_errors_total{error_type="xid", nvidia_gpu_xid_action="restart_bm", nvidia_gpu_xid_fatal="true"} > 0
      - alert: GpuXidApplicationFault
        expr: hw_errors_total{error_type="xid", nvidia_gpu_xid_class="application"} > 0
"#;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dcgm-exporter/default-counters.csv")
}

/// The fixture's rows: (field, type), comments and blank lines left out.
fn default_rows() -> Vec<(String, String)> {
    std::fs::read_to_string(fixture())
        .expect("the default counters fixture")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut cols = l.split(',').map(str::trim);
            let field = cols.next().expect("field").to_string();
            let kind = cols.next().expect("type").to_string();
            (field, kind)
        })
        .collect()
}

/// `gpulse run` on [`SCENARIO`] with `/metrics` on a port the kernel picks, and that port.
fn start(args: &[&str], env: &[(&str, String)]) -> (Gpulse, u16) {
    let mut all = SCRAPED_RUN.to_vec();
    all.extend_from_slice(args);
    let gpulse = Gpulse::start(SCENARIO, &[], &all, env);
    let port = metrics_port(&gpulse);
    (gpulse, port)
}

/// The first result's value of an instant query, once Prometheus has one.
fn value_of(web: u16, promql: &str) -> Option<f64> {
    let result = query(web, promql)?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// Waits until `promql` has a result; returns the result vector.
fn wait_for(web: u16, promql: &str, log: &std::path::Path) -> Vec<Value> {
    let begun = Instant::now();
    loop {
        if let Some(result) = query(web, promql).filter(|r| !r.is_empty()) {
            return result;
        }
        assert!(
            begun.elapsed() < DEADLINE,
            "Prometheus never answered {promql}; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
#[ignore = "needs prometheus from scripts/backends (or GPULSE_PROMETHEUS_BIN); scripts/test runs it"]
fn dcgm_exporters_default_counters_and_alerts_through_prometheus() {
    let prometheus_bin = backend("prometheus", "GPULSE_PROMETHEUS_BIN");
    let csv = fixture();
    let (gpulse, port) = start(
        &[
            "--dcgm-counters",
            csv.to_str().expect("utf-8 path"),
            "--dcgm-counters-unknown",
            "warn",
        ],
        &[],
    );
    // dcgm-exporter's default file names the vGPU licence, which gpulse does not read: with
    // `warn` it is skipped, and the warning names the file, line and field.
    let log = gpulse.stderr_so_far();
    assert!(
        log.contains("default-counters.csv:40: DCGM_FI_DEV_VGPU_LICENSE_STATUS skipped")
            && log.contains("DCGM_FI_DEV_VGPU_LICENSE_STATUS skipped"),
        "{log}"
    );
    scrape_until(port, |t| {
        t.contains("DCGM_FI_DEV_XID_ERRORS{") && t.contains("} 79")
    });

    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, RULES).expect("write rules");
    let (_prometheus, web) = start_prometheus(&prometheus_bin, dir.path(), port, Some(&rules));
    let prom_log = dir.path().join("prometheus.log");

    // Every series of the default file, with dcgm-exporter's type and labels.
    let labels = [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    ];
    wait_for(web, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", &prom_log);
    let mut checked = 0;
    for (field, kind) in default_rows() {
        if kind == "label" || field == "DCGM_FI_DEV_VGPU_LICENSE_STATUS" {
            continue;
        }
        let result = wait_for(web, &format!("{field}{{UUID=\"{GPU0}\"}}"), &prom_log);
        assert_eq!(result.len(), 1, "{field}: {result:?}");
        let metric = &result[0]["metric"];
        for label in labels {
            assert!(
                metric[label].as_str().is_some_and(|v| !v.is_empty()),
                "{field} lacks {label}: {metric}"
            );
        }
        assert_eq!(metric["gpu"], "0", "{field}");
        assert_eq!(metric["device"], "nvidia0", "{field}");
        assert_eq!(metric["pci_bus_id"], "00000000:18:00.0", "{field}");
        assert_eq!(metric["modelName"], "NVIDIA H100 80GB HBM3", "{field}");
        assert_eq!(metric["DCGM_FI_DRIVER_VERSION"], "550.54.15", "{field}");
        let (status, _, body) = get(web, &format!("/api/v1/metadata?metric={field}"), None);
        assert_eq!(status, 200, "{body}");
        let meta: Value = serde_json::from_str(&body).expect("metadata JSON");
        assert_eq!(
            meta["data"][field.as_str()][0]["type"],
            kind,
            "{field}'s type in Prometheus: {body}"
        );
        checked += 1;
    }
    assert_eq!(
        checked, 24,
        "the default file's series less vGPU licence and the label"
    );

    // Values, in dcgm-exporter's units, as nvml-sim was told.
    let on0 = |name: &str| format!("{name}{{UUID=\"{GPU0}\"}}");
    for (name, want) in [
        ("DCGM_FI_DEV_GPU_TEMP", 91.0),
        ("DCGM_FI_DEV_MEMORY_TEMP", 70.0),
        ("DCGM_FI_DEV_POWER_USAGE", 690.0),
        ("DCGM_FI_DEV_SM_CLOCK", 1755.0),
        ("DCGM_FI_DEV_MEM_CLOCK", 2619.0),
        ("DCGM_FI_DEV_GPU_UTIL", 62.0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 31.0),
        ("DCGM_FI_DEV_ENC_UTIL", 7.0),
        ("DCGM_FI_DEV_DEC_UTIL", 9.0),
        ("DCGM_FI_DEV_FB_USED", 30000.0),
        ("DCGM_FI_DEV_FB_RESERVED", 542.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 12.0),
        ("DCGM_FI_DEV_XID_ERRORS", 79.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 2.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
        // KB/s as NVML gives them, in bytes per second.
        ("DCGM_FI_PROF_PCIE_TX_BYTES", 1000.0 * 1024.0),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", 2000.0 * 1024.0),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.25),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0.4),
    ] {
        let got = value_of(web, &on0(name)).unwrap_or_else(|| panic!("{name}: no value"));
        assert!((got - want).abs() < 1e-6, "{name}: {got}, want {want}");
    }
    let fb = |name: &str| value_of(web, &on0(name)).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(
        fb("DCGM_FI_DEV_FB_USED") + fb("DCGM_FI_DEV_FB_FREE") + fb("DCGM_FI_DEV_FB_RESERVED"),
        81559.0
    );
    // The counters grow at the rates nvml-sim was told (irate: the last two scrapes, as
    // rate() over a range longer than the series is young underestimates): energy at 690 W in
    // mJ/s, NVLink at 2 links × (1 + 2) MiB/s in bytes.
    let energy = wait_for(
        web,
        &format!(
            "irate({}[10s])",
            on0("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        ),
        &prom_log,
    );
    let energy: f64 = energy[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(
        (energy / 690_000.0 - 1.0).abs() < 0.1,
        "energy rate {energy} mJ/s"
    );
    let nvlink = wait_for(
        web,
        &format!("irate({}[10s])", on0("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")),
        &prom_log,
    );
    let nvlink: f64 = nvlink[0]["value"][1].as_str().unwrap().parse().unwrap();
    let want = 2.0 * (1024.0 + 2048.0) * 1024.0;
    assert!(
        (nvlink / want - 1.0).abs() < 0.1,
        "NVLink rate {nvlink} B/s, want {want}"
    );

    // GPU 1 lacks what its driver does not give, and only that.
    let on1 = |name: &str| format!("{name}{{UUID=\"{GPU1}\"}}");
    for name in [
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_MEMORY_TEMP",
    ] {
        let result = query(web, &on1(name)).expect("answering");
        assert!(result.is_empty(), "GPU 1 has {name}: {result:?}");
    }
    assert_eq!(value_of(web, &on1("DCGM_FI_DEV_GPU_TEMP")), Some(35.0));
    assert_eq!(value_of(web, &on1("DCGM_FI_DEV_XID_ERRORS")), Some(0.0));
    assert_eq!(value_of(web, &on1("DCGM_FI_DEV_POWER_USAGE")), Some(90.0));

    // The alerts written on dcgm-exporter's names fire, on GPU 0 only.
    let alerts = [
        "GpuRowRemapFailure",
        "GpuUncorrectableRemappedRows",
        "GpuXid79FellOffTheBus",
        "GpuTooHot",
        "GpuPowerNearLimit",
        "GpuPcieReplays",
    ];
    for alert in alerts {
        let firing = wait_for(
            web,
            &format!("ALERTS{{alertname=\"{alert}\", alertstate=\"firing\"}}"),
            &prom_log,
        );
        let uuids: Vec<&str> = firing
            .iter()
            .filter_map(|r| r["metric"]["UUID"].as_str())
            .collect();
        assert_eq!(uuids, [GPU0], "{alert}: {firing:?}");
    }
    // dcgm-exporter's own labels of the XID series: the code and its message.
    let last = wait_for(web, &on0("DCGM_FI_DEV_XID_ERRORS"), &prom_log);
    assert_eq!(last[0]["metric"]["err_code"], "79", "{last:?}");
    assert_eq!(
        last[0]["metric"]["err_msg"], "GPU has fallen off the bus",
        "{last:?}"
    );
    let none = wait_for(web, &on1("DCGM_FI_DEV_XID_ERRORS"), &prom_log);
    assert_eq!(none[0]["metric"]["err_code"], "0", "{none:?}");
    assert_eq!(none[0]["metric"]["err_msg"], "No Error", "{none:?}");
    // XID 79 with the catalog's reading on gpulse's series: interconnect, restart the node.
    let xid = wait_for(
        web,
        &format!("hw_errors_total{{error_type=\"xid\", nvidia_gpu_xid=\"79\", hw_id=\"{GPU0}\"}}"),
        &prom_log,
    );
    let metric = &xid[0]["metric"];
    assert_eq!(metric["nvidia_gpu_xid_class"], "interconnect", "{metric}");
    assert_eq!(metric["nvidia_gpu_xid_action"], "restart_bm", "{metric}");
    assert_eq!(metric["nvidia_gpu_xid_fatal"], "true", "{metric}");
    let firing = wait_for(
        web,
        "ALERTS{alertname=\"GpuXidNeedsANodeRestart\", alertstate=\"firing\"}",
        &prom_log,
    );
    assert_eq!(firing.len(), 1, "{firing:?}");
    // No application XID was raised, so the class alert stays quiet.
    let app = query(web, "ALERTS{alertname=\"GpuXidApplicationFault\"}").expect("answering");
    assert!(app.is_empty(), "{app:?}");
    drop(gpulse);
}

/// A file with a comment and a subset: only its rows are served, with its types and help, and
/// without its `label` row no driver version label; the OTLP-named series stay.
#[test]
fn a_counters_subset_with_a_comment_serves_only_its_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let csv = dir.path().join("custom.csv");
    std::fs::write(
        &csv,
        "# temperature and remapped rows only\n\
         DCGM_FI_DEV_GPU_TEMP,  gauge, Temperature of the GPU.\n\
         # DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n\
         DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS , counter , Uncorrectable remaps.\n",
    )
    .expect("write the counters file");
    // dcgm-exporter's own variable names the file.
    let (gpulse, port) = start(
        &[],
        &[(
            "DCGM_EXPORTER_COLLECTORS",
            csv.to_str().expect("utf-8").to_string(),
        )],
    );
    let text = scrape_until(port, |t| t.contains("DCGM_FI_DEV_GPU_TEMP{"));
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE DCGM_FI_"))
        .collect();
    assert_eq!(
        families,
        [
            "DEV_GPU_TEMP gauge",
            "DEV_UNCORRECTABLE_REMAPPED_ROWS counter"
        ],
        "{text}"
    );
    assert!(text.contains("# HELP DCGM_FI_DEV_GPU_TEMP Temperature of the GPU.\n"));
    let temps = series(&text, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 2, "{temps:?}");
    assert!(temps
        .iter()
        .all(|(l, _)| !l.contains("DCGM_FI_DRIVER_VERSION")));
    // The counter's sample keeps dcgm-exporter's name: no `_total`.
    let remapped = series(&text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS");
    assert_eq!(remapped.len(), 1, "only GPU 0 gives it: {remapped:?}");
    assert_eq!(remapped[0].1, 1.0);
    assert!(!text.contains("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS_total"));
    assert!(text.contains("hw_temperature_celsius{"), "OTLP names stay");
    drop(gpulse);
}

/// A row naming a field gpulse cannot serve stops the start, naming the file, line and field
/// and what to do.
#[test]
fn a_counters_file_with_an_unknown_field_stops_the_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let csv = dir.path().join("custom.csv");
    std::fs::write(
        &csv,
        "# ok\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n\nDCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU\n",
    )
    .expect("write the counters file");
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    let out = Command::new(gpulse_bin())
        .args([
            "run",
            "--exporter",
            "stdout",
            "--prometheus-addr",
            "127.0.0.1:0",
        ])
        .arg("--dcgm-counters")
        .arg(&csv)
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("GPULSE_KUBELET_SOCKET", "none")
        .stdin(Stdio::null())
        .output()
        .expect("run gpulse");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "gpulse started: {stderr}");
    let want = format!(
        "{}:4: gpulse cannot serve DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        csv.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(stderr.contains("--dcgm-counters-unknown warn"), "{stderr}");
}
