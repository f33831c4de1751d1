//! The generated name table of docs/prometheus.md: every metric of the schema's
//! [`METRICS`](crate::schema::METRICS) with the Prometheus name this module's translation
//! ([`names::metric_name`]) gives it, between `<!-- BEGIN/END GENERATED: prometheus-names -->`
//! markers. It lives here, not in `schema::docs`, because the translation is the Prometheus
//! exporter's. `cargo run --example schema_docs` rewrites it; a test fails when it drifts.
//! gpulse's own health metrics (`src/export/telemetry`) are not in the schema and keep their
//! hand-written table below it.

use super::names::{metric_name, OtlpKind};
use crate::schema::docs::replace_block;
use crate::schema::{Instrument, METRICS};

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

/// `doc` (docs/prometheus.md) with its generated name table brought up to date.
///
/// # Errors
/// A message naming the marker the page lacks.
pub fn regenerate_prometheus_md(doc: &str) -> Result<String, String> {
    replace_block(doc, "prometheus-names", &names_table())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::docs::REGENERATE;

    /// The committed docs/prometheus.md table is what the schema and the translation give.
    #[test]
    fn docs_prometheus_md_names_match_the_schema() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus.md");
        let doc = std::fs::read_to_string(path).expect("docs/prometheus.md");
        let fresh =
            regenerate_prometheus_md(&doc).unwrap_or_else(|e| panic!("docs/prometheus.md: {e}"));
        assert!(
            fresh == doc,
            "docs/prometheus.md's generated name table is out of date with src/schema: run \
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
}
