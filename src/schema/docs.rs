//! The generated parts of docs/metrics.md (each metric table rendered from [`METRICS`]) and
//! docs/semconv.md (who defines each name, from the registry), written
//! between `<!-- BEGIN GENERATED: <name> -->` and `<!-- END GENERATED: <name> -->` markers so the
//! hand-written prose around them stays; and docs/schema.json, every device and GPM field with
//! its NVML source, unit, metric and dcgm-exporter name, for tools outside the Rust code (the
//! device check reads it). `cargo run --example schema_docs` rewrites them; a test fails when a
//! committed file and the schema disagree.

use serde_json::{json, Value};

use super::attributes::{AttributeType, Requirement, Uses};
use super::device::{FieldMetric, DEVICE_FIELDS};
use super::gpm::{GPM_FIELDS, MIG_PROCESS_GPM};
use super::metrics::{MetricSpec, Section, METRICS};
use super::signals::{metric_attributes, PROCESS_DEVICE};
use super::source::{Scale, Source, SourceKind};

/// The command that regenerates the tables, for error messages.
pub(crate) const REGENERATE: &str = "cargo run --example schema_docs";

/// The metric reference table of one resource section, in Markdown.
pub(crate) fn metric_table(section: Section) -> String {
    let mut out = String::from(
        "| name | instrument | unit | attributes | NVML source | notes | default |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in METRICS.iter().filter(|m| m.section == section) {
        let base = companion_base(spec);
        let attributes = attribute_cell(spec, base);
        let mut sources = field_sources(spec);
        if !spec.source.is_empty() {
            sources.push(cell(spec.source));
        }
        let mig = mig_process_sources(spec);
        let source = match (sources.is_empty(), mig.is_empty(), base) {
            (true, true, Some(_)) => "same".to_string(),
            (true, true, None) => "—".to_string(),
            (false, true, _) => sources.join(", "),
            (true, false, _) => mig.join("; "),
            (false, false, _) => format!("{}; {}", sources.join(", "), mig.join("; ")),
        };
        let notes = match spec.notes {
            "" => String::new(),
            text => format!(" {}", cell(text)),
        };
        // Whether a user who sets no `[metrics]` switch gets it (`OFF_BY_DEFAULT`).
        let default = if spec.id.enabled_by_default() {
            "on"
        } else {
            "off"
        };
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {attributes} | {source} |{notes} | {default} |\n",
            spec.name,
            spec.instrument.as_str(),
            spec.unit,
        ));
    }
    out
}

/// The NVML calls of the device fields `spec` carries, as the reference writes them, from each
/// field's typed [`Source`], and the GPM metrics of the GPM fields it carries, by their `nvml.h`
/// names ([`GPM_METRIC_NAMES`](super::GPM_METRIC_NAMES)): the docs name exactly what sampling
/// reads and the benchmark floor and device check repeat, so they cannot drift apart. Empty for
/// a metric no field feeds (families, /proc, spans), whose `source` text says it all.
pub(crate) fn field_sources(spec: &MetricSpec) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for field in DEVICE_FIELDS.iter().filter(|f| f.metric.id == spec.id) {
        let text = source_text(field.source, spec.unit);
        if !out.contains(&text) {
            out.push(text);
        }
    }
    let gpm: Vec<String> = GPM_FIELDS
        .iter()
        .filter(|f| f.metric.id == spec.id)
        .map(|f| format!("`{}`", f.c_name()))
        .collect();
    if !gpm.is_empty() {
        out.push(format!(
            "`nvmlGpmMetricsGet`: {} (% → ratio)",
            gpm.join(", ")
        ));
    }
    out
}

/// The GPM metrics of the MIG instance a process metric takes for a process alone on it
/// ([`MIG_PROCESS_GPM`]), by their `nvml.h` names, written after the metric's own source: "on
/// MIG, `hw.gpu.task` = `general` is its instance's GPM `NVML_GPM_METRIC_GRAPHICS_UTIL` (…)".
pub(crate) fn mig_process_sources(spec: &MetricSpec) -> Vec<String> {
    MIG_PROCESS_GPM
        .iter()
        .filter(|(_, metric)| metric.id == spec.id)
        .map(|(field, metric)| {
            let gpm = format!(
                "GPM `{}` (`nvmlGpmMigSampleGet`, % → ratio)",
                GPM_FIELDS[*field as usize].c_name()
            );
            match metric.attribute {
                Some((key, value)) => {
                    format!("on MIG, `{key}` = `{value}` is its instance's {gpm}")
                }
                None => format!("its MIG instance's {gpm}"),
            }
        })
        .collect()
}

/// `nvmlDeviceGetMemoryInfo_v2().used`, `nvmlDeviceGetClockInfo(NVML_CLOCK_SM)`,
/// `nvmlDeviceGetPowerUsage` (mW → W).
fn source_text(source: Source, unit: &str) -> String {
    let call = match source.member {
        "" => format!("`{}`", source.kind),
        member => format!(
            "`{}({}).{member}`",
            source.kind.c_name(),
            source.kind.arguments().join(", ")
        ),
    };
    match source.scale {
        Scale::One => call,
        Scale::PercentToRatio => format!("{call} (% → ratio)"),
        Scale::Milli => format!("{call} (m{unit} → {unit})"),
        Scale::Kibi => format!("{call} (KiB → bytes)"),
    }
}

/// The attribute column of `spec`: the device it is about (a process's GPU metrics carry the
/// `hw.id` and `gpu.index` of their device; a device metric's identity is the section above the
/// tables), then each attribute of [`metric_attributes`] with the values it takes, its type
/// where it is a number and when it is there. A `.max`/`.min` companion is "as" its metric.
fn attribute_cell(spec: &MetricSpec, base: Option<&MetricSpec>) -> String {
    let identity = match spec.section {
        Section::Process if spec.name.starts_with("process.gpu.") => &PROCESS_DEVICE[..],
        _ => &[],
    };
    let identity = identity
        .iter()
        .filter(|u| !matches!(u.requirement, Requirement::Conditionally(_)))
        .map(|u| format!("`{}`", u.attribute.key()));
    let uses = metric_attributes(spec.id);
    let own = uses.iter().enumerate().map(|(i, uses_i)| {
        let mut text = format!("`{}`", uses_i.attribute.key());
        let values = uses_i.given_values();
        if !values.is_empty() {
            let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
            text.push_str(&format!(" = {}", values.join(" | ")));
        }
        if uses_i.attribute.spec().ty == AttributeType::Int {
            text.push_str(" (int)");
        }
        // A condition shared by a run of attributes is said once, after the last of them.
        let condition = |u: Option<&Uses>| match u.map(|u| u.requirement) {
            Some(Requirement::Conditionally(condition)) => Some(condition),
            _ => None,
        };
        if let Some(c) = condition(Some(uses_i)) {
            if condition(uses.get(i + 1)) != Some(c) {
                text.push_str(&format!(" {c}"));
            }
        }
        text
    });
    let parts: Vec<String> = identity.chain(own).collect();
    match (parts.is_empty(), base) {
        (_, Some(base)) if attribute_cell(base, None) != "—" => format!("as `{}`", base.name),
        (true, _) => "—".to_string(),
        // Conditions may hold commas: then the attributes are set apart by semicolons.
        (false, _) if parts.iter().any(|p| p.contains(", ")) => cell(&parts.join("; ")),
        (false, _) => cell(&parts.join(", ")),
    }
}

/// The metric a `.max`/`.min` companion accompanies.
fn companion_base(spec: &MetricSpec) -> Option<&'static MetricSpec> {
    let base = spec
        .name
        .strip_suffix(".max")
        .or_else(|| spec.name.strip_suffix(".min"))?;
    METRICS.iter().find(|m| m.name == base)
}

/// Text for a table cell: a `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The generated blocks of docs/metrics.md: (marker name, content).
pub(crate) fn metrics_md_blocks() -> Vec<(&'static str, String)> {
    vec![
        ("device-metrics", metric_table(Section::Device)),
        ("process-metrics", metric_table(Section::Process)),
    ]
}

/// The generated block of docs/semconv.md, which owns the registry's "who defines each name":
/// (marker name, content).
pub(crate) fn semconv_md_blocks() -> Vec<(&'static str, String)> {
    vec![("registry-names", super::registry::names_md())]
}

/// `doc` with the block between the markers named `name` replaced by `content`.
///
/// # Errors
/// A message naming the marker when the page lacks it.
pub(crate) fn replace_block(doc: &str, name: &str, content: &str) -> Result<String, String> {
    let begin = format!("<!-- BEGIN GENERATED: {name} -->\n");
    let end = format!("<!-- END GENERATED: {name} -->");
    let start = doc
        .find(&begin)
        .ok_or_else(|| format!("the page has no `{}` marker", begin.trim_end()))?
        + begin.len();
    let stop = doc[start..]
        .find(&end)
        .ok_or_else(|| format!("the page has no `{end}` marker after its begin marker"))?
        + start;
    Ok(format!("{}{content}{}", &doc[..start], &doc[stop..]))
}

/// `doc` with every block of `blocks` brought up to date.
fn regenerate_blocks(doc: &str, blocks: &[(&str, String)]) -> Result<String, String> {
    blocks
        .iter()
        .try_fold(doc.to_string(), |doc, (name, content)| {
            replace_block(&doc, name, content)
        })
}

/// `doc` with every generated block of docs/metrics.md brought up to date.
///
/// # Errors
/// A message naming a marker the page lacks.
pub fn regenerate_metrics_md(doc: &str) -> Result<String, String> {
    regenerate_blocks(doc, &metrics_md_blocks())
}

/// `doc` with the generated block of docs/semconv.md brought up to date.
///
/// # Errors
/// A message naming a marker the page lacks.
pub fn regenerate_semconv_md(doc: &str) -> Result<String, String> {
    regenerate_blocks(doc, &semconv_md_blocks())
}

/// Where docs/schema.json is, from the repository root (for the drift test).
#[cfg(test)]
const SCHEMA_JSON: &str = "docs/schema.json";

/// A field's metric, as docs/schema.json writes it.
fn metric_json(metric: &FieldMetric) -> Value {
    let spec = metric.id.spec();
    json!({
        "name": spec.name,
        "instrument": spec.instrument.as_str(),
        "unit": spec.unit,
        "attribute": metric.attribute.map(|(key, value)| json!({ key: value })),
        "max": metric.max.map(|m| m.spec().name),
        "min": metric.min.map(|m| m.spec().name),
    })
}

/// docs/schema.json: every device field (key, NVML source, unit, window kind, metric, dcgm
/// name) and every GPM field, in table order.
pub(crate) fn schema_json() -> String {
    let device_fields: Vec<Value> = DEVICE_FIELDS
        .iter()
        .map(|spec| {
            let source = spec.source;
            json!({
                "key": spec.key,
                "source": {
                    "kind": match source.kind {
                        SourceKind::Call(_) => "call",
                        SourceKind::FieldId(_) => "field_id",
                    },
                    "call": match source.kind {
                        SourceKind::Call(call) => Some(format!("{call:?}")),
                        SourceKind::FieldId(_) => None,
                    },
                    "field_id": match source.kind {
                        SourceKind::FieldId(id) => Some(json!({ "name": id.c_name(), "id": id.id() })),
                        SourceKind::Call(_) => None,
                    },
                    "function": source.kind.c_name(),
                    "arguments": source.kind.arguments(),
                    "member": (!source.member.is_empty()).then_some(source.member),
                    "scale": source.scale.as_str(),
                    "factor": source.scale.factor(),
                },
                "unit": spec.unit(),
                "whole": spec.whole,
                "window": spec.window.as_str(),
                "metric": metric_json(&spec.metric),
                "dcgm": spec.dcgm.map(|d| json!({ "name": d.name, "scale": d.scale.as_str(), "type": d.kind.as_str() })),
            })
        })
        .collect();
    let gpm_fields: Vec<Value> = GPM_FIELDS
        .iter()
        .map(|spec| {
            json!({
                "key": spec.key,
                "source": {
                    "gpm_metric": format!("{:?}", spec.nvml),
                    "gpm_metric_id": spec.nvml.as_c(),
                    "gpm_metric_name": spec.c_name(),
                    "scale": "percent_to_ratio",
                    "factor": 0.01,
                },
                "unit": spec.metric.id.spec().unit,
                "metric": metric_json(&spec.metric),
                "dcgm": spec.dcgm.map(|d| json!({ "name": d.name, "scale": d.scale.as_str(), "type": d.kind.as_str() })),
            })
        })
        .collect();
    let doc = json!({
        "about": format!(
            "gpulse's device fields, generated from src/schema by `{REGENERATE}`; do not edit"
        ),
        "device_fields": device_fields,
        "gpm_fields": gpm_fields,
    });
    let mut text = serde_json::to_string_pretty(&doc).expect("the schema is plain JSON");
    text.push('\n');
    text
}

/// docs/schema.json as the schema gives it, whatever the committed file holds (the file is
/// generated whole).
///
/// # Errors
/// Never; the signature is the one every generated file's shares.
pub fn regenerate_schema_json(_committed: &str) -> Result<String, String> {
    Ok(schema_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed docs/schema.json is what the schema generates.
    #[test]
    fn docs_schema_json_matches_the_schema() {
        let path = format!("{}/{SCHEMA_JSON}", env!("CARGO_MANIFEST_DIR"));
        let committed = std::fs::read_to_string(&path).expect("docs/schema.json");
        assert!(
            committed == schema_json(),
            "docs/schema.json is out of date with src/schema: run `{REGENERATE}` and commit \
             the result"
        );
    }

    #[test]
    fn schema_json_lists_every_field_with_its_source() {
        let doc: Value = serde_json::from_str(&schema_json()).expect("valid JSON");
        let fields = doc["device_fields"].as_array().expect("device_fields");
        assert_eq!(fields.len(), DEVICE_FIELDS.len());
        let used = fields
            .iter()
            .find(|f| f["key"] == "bar1_used_bytes")
            .expect("BAR1 used");
        assert_eq!(used["source"]["function"], "nvmlDeviceGetBAR1MemoryInfo");
        assert_eq!(used["source"]["member"], "bar1Used");
        assert_eq!(used["unit"], "By");
        assert_eq!(used["metric"]["name"], "nvidia.gpu.bar1.memory.usage");
        assert_eq!(used["dcgm"]["name"], "DCGM_FI_DEV_BAR1_USED");
        let sm = fields
            .iter()
            .find(|f| f["key"] == "sm_clock_mhz")
            .expect("SM clock");
        assert_eq!(sm["source"]["arguments"], json!(["NVML_CLOCK_SM"]));
        assert_eq!(
            sm["metric"]["attribute"],
            json!({"nvidia.gpu.clock.type": "sm"})
        );
        assert_eq!(sm["source"]["kind"], "call");
        let memory_temp = fields
            .iter()
            .find(|f| f["key"] == "memory_temperature_celsius")
            .expect("memory temperature");
        assert_eq!(memory_temp["source"]["kind"], "field_id");
        assert_eq!(
            memory_temp["source"]["field_id"],
            json!({"name": "NVML_FI_DEV_MEMORY_TEMP", "id": 82})
        );
        assert_eq!(
            memory_temp["source"]["function"],
            "nvmlDeviceGetFieldValues"
        );
        assert_eq!(memory_temp["source"]["call"], Value::Null);
        assert_eq!(memory_temp["dcgm"]["name"], "DCGM_FI_DEV_MEMORY_TEMP");
        assert_eq!(
            doc["gpm_fields"].as_array().map(Vec::len),
            Some(GPM_FIELDS.len())
        );
    }

    /// The committed docs/metrics.md and docs/semconv.md tables are what the schema generates.
    #[test]
    fn docs_generated_tables_match_the_schema() {
        type Regenerate = fn(&str) -> Result<String, String>;
        let pages: [(&str, Regenerate); 2] = [
            ("docs/metrics.md", regenerate_metrics_md),
            ("docs/semconv.md", regenerate_semconv_md),
        ];
        for (page, regenerate) in pages {
            let path = format!("{}/{page}", env!("CARGO_MANIFEST_DIR"));
            let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
            let fresh = regenerate(&doc).unwrap_or_else(|e| panic!("{page}: {e}"));
            assert!(
                fresh == doc,
                "{page}'s generated tables are out of date with src/schema: run `{REGENERATE}` \
                 and commit the result"
            );
        }
    }

    #[test]
    fn a_block_is_replaced_between_its_markers_only() {
        let doc = "intro\n<!-- BEGIN GENERATED: t -->\nold\n<!-- END GENERATED: t -->\nafter\n";
        assert_eq!(
            replace_block(doc, "t", "new\n").unwrap(),
            "intro\n<!-- BEGIN GENERATED: t -->\nnew\n<!-- END GENERATED: t -->\nafter\n"
        );
        let err = replace_block(doc, "missing", "x").unwrap_err();
        assert!(err.contains("BEGIN GENERATED: missing"), "{err}");
    }

    /// A device field's metric names its call from the field's typed source: every call of a
    /// shared metric, with its arguments, and the scale to the metric's unit.
    #[test]
    fn field_metrics_name_their_calls_from_the_schema() {
        let table = metric_table(Section::Device);
        let row = |name: &str| {
            table
                .lines()
                .find(|line| line.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("no row for {name}"))
                .to_string()
        };
        let clock = row("nvidia.gpu.clock");
        for argument in ["NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_CLOCK_GRAPHICS"] {
            assert!(
                clock.contains(&format!("`nvmlDeviceGetClockInfo({argument})`")),
                "{clock}"
            );
        }
        assert!(
            row("hw.gpu.memory.usage").contains("`nvmlDeviceGetMemoryInfo_v2().used`"),
            "{table}"
        );
        assert!(row("hw.power").contains("`nvmlDeviceGetPowerUsage` (mW → W)"));
        assert!(row("nvidia.gpu.memory.temperature")
            .contains("`nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)`"));
        assert!(row("hw.energy").contains("`nvmlDeviceGetTotalEnergyConsumption` (mJ → J)"));
        // A metric fed by fields and by families: the fields' calls, then the rest as written.
        let errors = row("hw.errors");
        assert!(
            errors.contains("`nvmlDeviceGetPcieReplayCounter`"),
            "{errors}"
        );
        assert!(errors.contains("XID events"), "{errors}");
        // A GPM field's metric names its nvml.h GPM metric, from the schema's table.
        assert!(
            row("nvidia.gpu.sm.occupancy")
                .contains("`nvmlGpmMetricsGet`: `NVML_GPM_METRIC_SM_OCCUPANCY` (% → ratio)"),
            "{table}"
        );
        let pipe = row("nvidia.gpu.pipe.activity");
        for name in [
            "ANY_TENSOR_UTIL",
            "HMMA_TENSOR_UTIL",
            "FP64_UTIL",
            "INTEGER_UTIL",
        ] {
            assert!(
                pipe.contains(&format!("`NVML_GPM_METRIC_{name}`")),
                "{pipe}"
            );
        }
        // A metric no field feeds keeps its text.
        assert!(row("nvidia.gpu.nvlink.state").contains("`nvmlDeviceGetNvLinkState`"));
    }

    #[test]
    fn companions_point_at_their_metric_and_pipes_are_escaped() {
        let table = metric_table(Section::Device);
        assert!(table.contains(
            "| `hw.gpu.utilization.max` | gauge | `1` | as `hw.gpu.utilization` | same |"
        ));
        assert!(table.contains("`general` \\| `encoder`"));
        assert!(!metric_table(Section::Process).contains("`hw.gpu.utilization`"));
    }
}
