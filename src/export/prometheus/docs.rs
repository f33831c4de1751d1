//! The generated tables of docs/prometheus.md: every metric of the schema's
//! [`METRICS`] with the Prometheus name this module's translation
//! ([`names::metric_name`](super::names::metric_name)) gives it (`prometheus-names`), and every dcgm-exporter series
//! `--prometheus-names dcgm` serves, from the schema's dcgm names (`dcgm-names`), each between
//! `<!-- BEGIN/END GENERATED: ... -->` markers. They live here, not in `schema::docs`, because
//! the translation and the series are the Prometheus exporter's. `cargo run --example
//! schema_docs` rewrites them; a test fails when they drift. gpulse's own health metrics
//! (`src/export/telemetry`) are not in the schema and keep their hand-written table below.

use super::dcgm::{DEVICE_LABELS, MIG_LABELS, POD_LABELS, XID_LABELS};
use super::names::{metric_name, OtlpKind};
use crate::schema::docs::replace_block;
use crate::schema::{
    DcgmFamily, DcgmReading, DcgmSeries, FieldMetric, Instrument, DCGM_FAMILY_SERIES,
    DEVICE_FIELDS, GPM_FIELDS, METRICS,
};

/// The name table, in Markdown: OTLP name, unit, instrument, Prometheus name.
pub fn names_table() -> String {
    let mut out = String::from(
        "| OTLP name | unit | instrument | Prometheus name |\n| --- | --- | --- | --- |\n",
    );
    for spec in METRICS {
        let kind = match spec.instrument {
            Instrument::Gauge => OtlpKind::Gauge,
            Instrument::Counter => OtlpKind::Counter,
            Instrument::UpDownCounter => OtlpKind::UpDownCounter,
        };
        let prom = metric_name(spec.name, spec.unit, kind)
            .unwrap_or_else(|| panic!("{} has no Prometheus name", spec.name));
        out.push_str(&format!(
            "| `{}` | `{}` | {} | `{}` |\n",
            spec.name,
            spec.unit,
            spec.instrument.as_str(),
            prom.full()
        ));
    }
    out
}

/// The unit a dcgm-exporter series is in, for a field whose metric is in `unit`.
fn dcgm_unit(series: &DcgmSeries, unit: &str) -> String {
    series.scale.unit(unit)
}

/// The dcgm-exporter label table, in Markdown: every label of the `DCGM_FI_*` series, in the
/// order they are written, on which series, and its value (from `dcgm`'s label sets).
pub fn dcgm_labels_table() -> String {
    let mut out = String::from("| label | on | value |\n| --- | --- | --- |\n");
    let sets: [(&[(&str, &str)], &str); 4] = [
        (&DEVICE_LABELS, "every series"),
        (&MIG_LABELS, "a MIG instance's series, after `modelName`"),
        (
            &XID_LABELS,
            "`DCGM_FI_DEV_XID_ERRORS`, after the GPU's labels",
        ),
        (
            &POD_LABELS,
            "every series, when exactly one pod uses the GPU or instance",
        ),
    ];
    for (labels, on) in sets {
        for (name, value) in labels {
            out.push_str(&format!("| `{name}` | {on} | {value} |\n"));
        }
    }
    out
}

/// A field's metric with the attribute that tells it apart, in Markdown.
fn metric_cell(metric: &FieldMetric) -> String {
    let name = metric.id.spec().name;
    match metric.attribute {
        Some((key, value)) => format!("`{name}{{{key}={value}}}`"),
        None => format!("`{name}`"),
    }
}

/// How a series' value compares with dcgm-exporter's, from what gpulse reads of the window.
fn difference(reading: DcgmReading) -> &'static str {
    match reading {
        DcgmReading::Last => "same: NVML's reading, as DCGM's latest value",
        DcgmReading::Mean => {
            "mean over the export window, where DCGM averages over its own sampling period"
        }
        DcgmReading::Total => {
            "counts from when gpulse first saw the GPU (DCGM: since the driver loaded); \
             `rate()` and `increase()` agree"
        }
    }
}

/// How a family series compares with dcgm-exporter's.
fn family_difference(family: DcgmFamily) -> &'static str {
    match family {
        DcgmFamily::XidErrors => {
            "the last XID since gpulse started (DCGM remembers since the driver loaded)"
        }
        DcgmFamily::UncorrectableRemappedRows
        | DcgmFamily::CorrectableRemappedRows
        | DcgmFamily::RowRemapFailure => difference(DcgmReading::Last),
        DcgmFamily::NvLinkBandwidthTotal => {
            "bytes of data (payload) the driver counted since it loaded, both directions; \
             DCGM's unit for this field has changed between releases, so compare with \
             `rate()`"
        }
        DcgmFamily::NvLinkTxBytes | DcgmFamily::NvLinkRxBytes => {
            "data payload only (DCGM counts headers too), mean over the export window"
        }
    }
}

/// The dcgm-exporter table, in Markdown: every series `--prometheus-names dcgm` serves, its
/// type and unit, the gpulse value (and what of the window) it comes from, and how it compares
/// with dcgm-exporter's.
pub fn dcgm_table() -> String {
    let mut out = String::from(
        "| dcgm-exporter | type | unit | gpulse source (same window) | vs dcgm-exporter | description |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    let mut row = |series: &DcgmSeries, unit: String, source: String, differs: &str| {
        out.push_str(&format!(
            "| `{}` | {} | {unit} | {source} | {differs} | {} |\n",
            series.name,
            series.kind.as_str(),
            series.help.replace('|', "\\|")
        ));
    };
    for spec in &DEVICE_FIELDS {
        let Some(series) = &spec.dcgm else { continue };
        let reading = spec.dcgm_reading();
        let source = format!("{}, {}", metric_cell(&spec.metric), reading.as_str());
        row(
            series,
            dcgm_unit(series, spec.unit()),
            source,
            difference(reading),
        );
    }
    for (family, series) in &DCGM_FAMILY_SERIES {
        row(
            series,
            family.unit().into(),
            family.source().into(),
            family_difference(*family),
        );
    }
    for spec in &GPM_FIELDS {
        let Some(series) = &spec.dcgm else { continue };
        let source = format!(
            "{}, mean; GPM (Hopper and newer), absent without it",
            metric_cell(&spec.metric)
        );
        row(
            series,
            dcgm_unit(series, spec.metric.id.spec().unit),
            source,
            difference(DcgmReading::Mean),
        );
    }
    out
}

/// `doc` (docs/prometheus.md) with its generated tables brought up to date.
///
/// # Errors
/// A message naming the marker the page lacks.
pub fn regenerate_prometheus_md(doc: &str) -> Result<String, String> {
    let doc = replace_block(doc, "prometheus-names", &names_table())?;
    let doc = replace_block(&doc, "dcgm-names", &dcgm_table())?;
    replace_block(&doc, "dcgm-labels", &dcgm_labels_table())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::docs::REGENERATE;

    /// The committed docs/prometheus.md tables are what the schema and the translation give.
    #[test]
    fn docs_prometheus_md_tables_match_the_schema() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus.md");
        let doc = std::fs::read_to_string(path).expect("docs/prometheus.md");
        let fresh =
            regenerate_prometheus_md(&doc).unwrap_or_else(|e| panic!("docs/prometheus.md: {e}"));
        assert!(
            fresh == doc,
            "docs/prometheus.md's generated tables are out of date with src/schema: run \
             `{REGENERATE}` and commit the result"
        );
    }

    #[test]
    fn rows_carry_the_translated_name() {
        let table = names_table();
        assert!(table.contains("| `hw.power` | `W` | gauge | `hw_power_watts` |"));
        assert!(
            table.contains("| `hw.gpu.utilization` | `1` | gauge | `hw_gpu_utilization_ratio` |")
        );
        assert_eq!(table.lines().count(), METRICS.len() + 2);
    }

    /// Every label of the dcgm label sets has its row, in the order the series carry them.
    #[test]
    fn the_dcgm_label_table_lists_every_label_in_order() {
        let table = dcgm_labels_table();
        let names: Vec<&str> = table
            .lines()
            .skip(2)
            .filter_map(|line| line.split('`').nth(1))
            .collect();
        assert_eq!(
            names,
            [
                "gpu",
                "UUID",
                "pci_bus_id",
                "device",
                "modelName",
                "Hostname",
                "DCGM_FI_DRIVER_VERSION",
                "GPU_I_PROFILE",
                "GPU_I_ID",
                "err_code",
                "err_msg",
                "pod",
                "namespace",
                "container"
            ]
        );
    }

    /// Every dcgm name of the schema has its row, in the unit dcgm-exporter uses.
    #[test]
    fn the_dcgm_table_lists_every_series_of_the_schema() {
        let table = dcgm_table();
        let named = DEVICE_FIELDS.iter().filter(|s| s.dcgm.is_some()).count()
            + GPM_FIELDS.iter().filter(|s| s.dcgm.is_some()).count();
        assert_eq!(
            table.lines().count(),
            2 + named + DCGM_FAMILY_SERIES.len(),
            "{table}"
        );
        assert!(table.contains(
            "| `DCGM_FI_DEV_BAR1_USED` | gauge | MiB | `nvidia.gpu.bar1.memory.usage`, last sample |"
        ));
        assert!(table.contains(
            "| `DCGM_FI_DEV_GPU_UTIL` | gauge | % | `hw.gpu.utilization{hw.gpu.task=general}`, last sample |"
        ));
        assert!(table.contains("| `DCGM_FI_DEV_GPU_TEMP` | gauge | °C |"));
        assert!(table.contains(
            "| `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` | counter | mJ | `hw.energy`, total since gpulse first saw the GPU |"
        ));
        assert!(table.contains(
            "| `DCGM_FI_DEV_PCIE_REPLAY_COUNTER` | counter | errors | `hw.errors{error.type=pcie_replay}`, last sample |"
        ));
        assert!(table.contains(
            "| `DCGM_FI_PROF_PCIE_TX_BYTES` | gauge | B/s | `hw.gpu.io{network.io.direction=transmit}`, mean over the window |"
        ));
        assert!(table.contains("| `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS` | counter | rows |"));
        assert!(table.contains(
            "| `DCGM_FI_PROF_SM_ACTIVE` | gauge | 0–1 | `nvidia.gpu.sm.activity`, mean;"
        ));
        assert!(table.contains("| `DCGM_FI_DEV_PCIE_LINK_WIDTH` | gauge | lane |"));
    }
}
