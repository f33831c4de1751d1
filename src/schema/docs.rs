//! The generated parts of docs/metrics.md: each metric table rendered from [`METRICS`], written
//! between `<!-- BEGIN GENERATED: <name> -->` and `<!-- END GENERATED: <name> -->` markers so the
//! hand-written prose around them stays. `cargo run --example schema_docs` rewrites them; a test
//! fails when the committed page and the schema disagree.

use super::metrics::{MetricSpec, Section, METRICS};

/// The command that regenerates the tables, for error messages.
pub const REGENERATE: &str = "cargo run --example schema_docs";

/// The metric reference table of one resource section, in Markdown.
pub fn metric_table(section: Section) -> String {
    let mut out = String::from(
        "| name | instrument | unit | attributes | NVML source | notes |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in METRICS.iter().filter(|m| m.section == section) {
        let base = companion_base(spec);
        let attributes = match (spec.attributes, base) {
            ("", Some(base)) if !base.attributes.is_empty() => format!("as `{}`", base.name),
            ("", _) => "—".to_string(),
            (text, _) => cell(text),
        };
        let source = match (spec.source, base) {
            ("", Some(_)) => "same".to_string(),
            ("", None) => "—".to_string(),
            (text, _) => cell(text),
        };
        let notes = match spec.notes {
            "" => String::new(),
            text => format!(" {}", cell(text)),
        };
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {attributes} | {source} |{notes} |\n",
            spec.name,
            spec.instrument.as_str(),
            spec.unit,
        ));
    }
    out
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
pub fn metrics_md_blocks() -> Vec<(&'static str, String)> {
    vec![
        ("device-metrics", metric_table(Section::Device)),
        ("process-metrics", metric_table(Section::Process)),
    ]
}

/// `doc` with the block between the markers named `name` replaced by `content`.
///
/// # Errors
/// A message naming the marker when the page lacks it.
pub fn replace_block(doc: &str, name: &str, content: &str) -> Result<String, String> {
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

/// `doc` with every generated block of docs/metrics.md brought up to date.
///
/// # Errors
/// A message naming a marker the page lacks.
pub fn regenerate_metrics_md(doc: &str) -> Result<String, String> {
    metrics_md_blocks()
        .iter()
        .try_fold(doc.to_string(), |doc, (name, content)| {
            replace_block(&doc, name, content)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed docs/metrics.md tables are what the schema generates.
    #[test]
    fn docs_metrics_md_tables_match_the_schema() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
        let doc = std::fs::read_to_string(path).expect("docs/metrics.md");
        let fresh = regenerate_metrics_md(&doc).unwrap_or_else(|e| panic!("docs/metrics.md: {e}"));
        assert!(
            fresh == doc,
            "docs/metrics.md's generated tables are out of date with src/schema: run `{REGENERATE}` \
             and commit the result"
        );
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
