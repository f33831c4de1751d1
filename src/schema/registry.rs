//! gpulse's OpenTelemetry Weaver registry, generated from the schema: the attributes gpulse
//! defines ([`ATTRIBUTES`] of [`Owner::Gpulse`]), its metrics ([`METRICS`] and
//! [`HEALTH_METRICS`] whose names the semantic conventions do not define), the findings' event,
//! and the entities of its resources, with the conventions' own metrics, entities and attributes
//! imported or referenced from the registry it depends on (never copied).
//!
//! `cargo run --example schema_docs` writes [`files`] under `registry/`; a test fails while the
//! committed files and the schema disagree, and `tests/weaver.rs` checks the registry with
//! Weaver and live-checks `gpulse run` against it. What the schema holds as prose (notes) stays
//! prose; which attributes each metric carries, how required each is and which values it takes
//! is [`metric_attributes`] below, an exhaustive match the compiler keeps complete, from which
//! docs/metrics.md's attribute column is rendered too.

use std::fmt::Write as _;

use super::attributes::{
    AttributeId as A, AttributeSpec, AttributeType, Owner, Requirement, Uses, ATTRIBUTES,
};
use super::health::{HealthMetricSpec, HEALTH_METRICS};
use super::metrics::{Instrument, MetricSpec, Section, METRICS};
pub use super::signals::{
    metric_attributes, DEVICE_IDENTITY, EVIDENCE_ATTRIBUTES, FINDING_ATTRIBUTES, FINDING_PLACE,
    GPU_PROCESS_ENTITY, NODE_ENTITY, PROCESS_DEVICE,
};

/// Where the committed registry says the semantic conventions come from: the `model/` folder of
/// open-telemetry/semantic-conventions at the commit gpulse is checked against. Weaver fetches
/// it; an offline run (the tests) writes the same registry with a local folder instead.
pub const SEMCONV_ARCHIVE: &str = "https://github.com/open-telemetry/semantic-conventions/archive/384d66161cb18704c729645fa8136a148df9571c.zip[model]";
/// The schema URL of that registry (its `manifest.yaml`).
pub const SEMCONV_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.45.0-unreleased";
/// gpulse's registry's own schema URL. gpulse publishes no schema yet: the reserved `.invalid`
/// domain says so rather than claiming an address.
pub const GPULSE_SCHEMA_URL: &str =
    concat!("https://gpulse.invalid/schemas/", env!("CARGO_PKG_VERSION"));
/// The folder of the committed registry, from the repository root.
pub const REGISTRY_DIR: &str = "registry";

/// Whether the semantic conventions define `name` as a metric: such a metric is imported from
/// them, never redefined. The list is the conventions' names gpulse uses (a test holds it to the
/// `opentelemetry-semantic-conventions` constants the metric table names them by).
pub fn is_semconv_metric(name: &str) -> bool {
    SEMCONV_METRICS.contains(&name)
}

/// The semantic conventions' metrics gpulse emits.
pub const SEMCONV_METRICS: [&str; 11] = [
    "hw.gpu.utilization",
    "hw.gpu.memory.utilization",
    "hw.gpu.memory.usage",
    "hw.gpu.memory.limit",
    "hw.temperature",
    "hw.power",
    "hw.energy",
    "hw.gpu.io",
    "hw.errors",
    "hw.status",
    "process.memory.usage",
];

/// The stability the pinned semantic conventions give a metric of [`SEMCONV_METRICS`]: the
/// hardware metrics are in development, the process ones release candidates.
pub fn semconv_metric_stability(name: &str) -> &'static str {
    if name.starts_with("process.") {
        "release_candidate"
    } else {
        "development"
    }
}

/// docs/metrics.md's table of who defines each metric and attribute, and how stable it is.
pub fn names_md() -> String {
    let conventions = "[semantic conventions](https://opentelemetry.io/docs/specs/semconv/)";
    let mut out = String::from("| metric | defined by | stability |\n| --- | --- | --- |\n");
    let names = METRICS
        .iter()
        .map(|m| m.name)
        .chain(HEALTH_METRICS.iter().map(|m| m.name));
    for name in names {
        let (by, stability) = if is_semconv_metric(name) {
            (conventions, semconv_metric_stability(name))
        } else {
            ("gpulse", "development")
        };
        let _ = writeln!(out, "| `{name}` | {by} | {stability} |");
    }
    out.push_str("\n| attribute | type | defined by | stability |\n| --- | --- | --- | --- |\n");
    for a in &ATTRIBUTES {
        let _ = match a.owner {
            Owner::SemConv => {
                writeln!(out, "| `{}` | as there | {conventions} | as there |", a.key)
            }
            Owner::Gpulse => {
                let ty = match a.ty {
                    AttributeType::Enum => a
                        .members
                        .iter()
                        .map(|m| format!("`{}`", m.value))
                        .collect::<Vec<_>>()
                        .join(", "),
                    ty => format!("`{}`", ty.as_registry_str()),
                };
                writeln!(
                    out,
                    "| `{}` | {} | gpulse | development |",
                    a.key,
                    ty.replace('|', "\\|")
                )
            }
        };
    }
    out
}

/// The conventions' entities whose attributes gpulse's resources carry (imported, so the
/// registry knows their attributes; gpulse's resources are made of them).
pub const SEMCONV_ENTITIES: [&str; 14] = [
    "service",
    "service.instance",
    "service.namespace",
    "host",
    "telemetry.sdk",
    "deployment",
    "process",
    "process.executable",
    "container",
    "container.runtime",
    "k8s.pod",
    "k8s.namespace",
    "k8s.container",
    "k8s.node",
];

/// The event name of the findings' log records.
pub const FINDING_EVENT: &str = "gpulse.diagnosis.finding";
/// The event name of the records that carry a finding's evidence from other processes.
pub const EVIDENCE_EVENT: &str = "gpulse.diagnosis.evidence";

/// The registry's files: (path under [`REGISTRY_DIR`], content). `semconv` is where the
/// semantic conventions' `model/` folder is: [`SEMCONV_ARCHIVE`] for the committed registry, a
/// local folder offline.
pub fn files(semconv: &str) -> Vec<(&'static str, String)> {
    vec![
        ("manifest.yaml", manifest(semconv)),
        ("attributes.yaml", attributes_yaml()),
        ("metrics.yaml", metrics_yaml()),
        ("entities.yaml", entities_yaml()),
        ("events.yaml", events_yaml()),
    ]
}

const HEADER: &str = "# Generated from gpulse's schema (src/schema) by `cargo run --example schema_docs`: do not edit.\n";

fn manifest(semconv: &str) -> String {
    format!(
        "{HEADER}name: gpulse\n\
         description: gpulse's telemetry (NVIDIA GPU and GPU-process metrics, findings), extending the OpenTelemetry semantic conventions.\n\
         schema_url: {GPULSE_SCHEMA_URL}\n\
         stability: development\n\
         dependencies:\n  \
         - name: otel\n    \
         schema_url: {SEMCONV_SCHEMA_URL}\n    \
         registry_path: {}\n",
        quote(semconv)
    )
}

/// A YAML double-quoted scalar.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The group an attribute of gpulse's is defined in, by its namespace.
fn attribute_group(spec: &AttributeSpec) -> (&'static str, &'static str) {
    let key = spec.key;
    if key.starts_with("nvidia.") {
        ("registry.nvidia.gpu", "NVIDIA GPU attributes: clocks, throttling, the row remapper, GPM pipes, NVLink, XID, MIG.")
    } else if key.starts_with("pytorch.") {
        ("registry.pytorch", "Training attributes, as the PyTorch companion (examples/pytorch) sends them and gpulse reads them: the torch.distributed job and rank, collective waits, the DataLoader.")
    } else if key.starts_with("gpulse.diagnosis.") {
        (
            "registry.gpulse.diagnosis",
            "gpulse's findings: which rule found what, about what, and what to do.",
        )
    } else if key.starts_with("gpulse.gpu.")
        // The accounting's own attributes on process.gpu.time and .energy, not a span's.
        && !matches!(spec.key, "gpulse.gpu.time.state" | "gpulse.gpu.cause")
    {
        (
            "registry.gpulse.span",
            "The GPU usage gpulse's receiver adds to an application's spans (docs/enrich.md).",
        )
    } else if key.starts_with("gpulse.") {
        (
            "registry.gpulse",
            "gpulse's accounting of GPU time and energy, and how it attributed a GPU process.",
        )
    } else {
        ("registry.gpu", "GPU identity the hardware conventions do not name yet (proposed, see docs/semconv.md).")
    }
}

fn attributes_yaml() -> String {
    let mut groups: Vec<(&str, &str, Vec<&AttributeSpec>)> = Vec::new();
    for spec in ATTRIBUTES.iter().filter(|a| a.owner == Owner::Gpulse) {
        let (id, brief) = attribute_group(spec);
        match groups.iter_mut().find(|(g, _, _)| *g == id) {
            Some((_, _, members)) => members.push(spec),
            None => groups.push((id, brief, vec![spec])),
        }
    }
    let mut out = format!("{HEADER}groups:\n");
    for (id, brief, specs) in groups {
        let _ = write!(
            out,
            "  - id: {id}\n    type: attribute_group\n    brief: {}\n    attributes:\n",
            quote(brief)
        );
        for a in specs {
            let _ = writeln!(out, "      - id: {}", a.key);
            if a.ty == AttributeType::Enum {
                out.push_str("        type:\n          members:\n");
                for m in a.members {
                    let _ = write!(
                        out,
                        "            - id: {}\n              value: {}\n              brief: {}\n              stability: development\n",
                        m.value.replace('.', "_"),
                        quote(m.value),
                        quote(m.brief)
                    );
                }
            } else {
                let _ = writeln!(out, "        type: {}", a.ty.as_registry_str());
            }
            let _ = writeln!(out, "        stability: development");
            let _ = writeln!(out, "        brief: {}", quote(a.brief));
            if !a.examples.is_empty() {
                let _ = writeln!(out, "        examples: [{}]", a.examples.join(", "));
            }
        }
    }
    out
}

fn uses_yaml(out: &mut String, indent: &str, uses: &[Uses]) {
    for u in uses {
        let _ = writeln!(out, "{indent}- ref: {}", u.attribute.key());
        match u.requirement {
            Requirement::Required => {
                let _ = writeln!(out, "{indent}  requirement_level: required");
            }
            Requirement::Recommended => {
                let _ = writeln!(out, "{indent}  requirement_level: recommended");
            }
            Requirement::OptIn => {
                let _ = writeln!(out, "{indent}  requirement_level: opt_in");
            }
            Requirement::Conditionally(condition) => {
                let _ = writeln!(
                    out,
                    "{indent}  requirement_level:\n{indent}    conditionally_required: {}",
                    quote(condition)
                );
            }
        }
    }
}

/// One metric the registry defines: a row of [`METRICS`] or of [`HEALTH_METRICS`].
struct Defined<'a> {
    name: &'a str,
    instrument: Instrument,
    unit: &'a str,
    brief: &'a str,
    note: &'a str,
    identity: &'a [Uses],
    attributes: &'a [Uses],
    entity: Option<&'a str>,
}

fn metric_yaml(out: &mut String, m: &Defined) {
    let _ = write!(
        out,
        "  - id: metric.{prefix}{name}\n    type: metric\n    metric_name: {name}\n    instrument: {}\n    unit: {}\n    stability: development\n    brief: {}\n",
        m.instrument.as_str(),
        quote(m.unit),
        quote(m.brief),
        name = m.name,
        prefix = if is_semconv_metric(m.name) { "gpulse." } else { "" },
    );
    if !m.note.is_empty() {
        let _ = writeln!(out, "    note: {}", quote(m.note));
    }
    if !(m.identity.is_empty() && m.attributes.is_empty()) {
        out.push_str("    attributes:\n");
        uses_yaml(out, "      ", m.identity);
        uses_yaml(out, "      ", m.attributes);
    }
    if let Some(entity) = m.entity {
        let _ = writeln!(out, "    entity_associations:\n      - {entity}");
    }
}

/// The conventions' metrics gpulse's registry restates instead of importing: Weaver 0.25.1
/// drops a dependency's metric that has refinements (these two have one per hardware type)
/// from the resolved registry, so an import finds nothing and live-check reports every point as
/// an unknown metric. Each is restated as the conventions define it, with gpulse's attributes;
/// when a Weaver release carries them, the restatement clashes with the import and
/// `weaver registry check` fails, which is the signal to move them back to [`SEMCONV_METRICS`]
/// imports only.
pub const RESTATED_SEMCONV_METRICS: [&str; 2] = ["hw.errors", "hw.status"];

fn metrics_yaml() -> String {
    let mut out = format!("{HEADER}imports:\n  metrics:\n");
    for name in SEMCONV_METRICS
        .iter()
        .filter(|name| !RESTATED_SEMCONV_METRICS.contains(name))
    {
        let _ = writeln!(out, "    - {name}");
    }
    out.push_str("groups:\n");
    for spec in METRICS.iter().filter(|m| !is_semconv_metric(m.name)) {
        metric_yaml(&mut out, &defined(spec));
    }
    for spec in METRICS
        .iter()
        .filter(|m| RESTATED_SEMCONV_METRICS.contains(&m.name))
    {
        let restated = Defined {
            note: "The semantic conventions' metric, restated: Weaver 0.25.1 does not carry a dependency's metric that has refinements into the registry that imports it.",
            ..defined(spec)
        };
        metric_yaml(&mut out, &restated);
    }
    for spec in &HEALTH_METRICS {
        metric_yaml(&mut out, &health(spec));
    }
    out
}

fn defined(spec: &MetricSpec) -> Defined<'_> {
    // Device points carry their device's identity, process points the device they are about;
    // a process's CPU, memory and training figures are about the process alone.
    let (identity, entity): (&[Uses], _) = match spec.section {
        Section::Device => (&DEVICE_IDENTITY, None),
        Section::Process if spec.name.starts_with("process.gpu.") => {
            (&PROCESS_DEVICE, Some(GPU_PROCESS_ENTITY_NAME))
        }
        Section::Process => (&[], Some(GPU_PROCESS_ENTITY_NAME)),
    };
    Defined {
        name: spec.name,
        instrument: spec.instrument,
        unit: spec.unit,
        brief: spec.description,
        note: spec.notes,
        identity,
        attributes: metric_attributes(spec.id),
        entity,
    }
}

fn health(spec: &HealthMetricSpec) -> Defined<'_> {
    Defined {
        name: spec.name,
        instrument: spec.instrument,
        unit: spec.unit,
        brief: spec.description,
        note: "gpulse's own health, on the node resource.",
        identity: &[],
        attributes: spec.attributes,
        entity: Some(NODE_ENTITY_NAME),
    }
}

/// gpulse's entity on the process resources.
pub const GPU_PROCESS_ENTITY_NAME: &str = "gpulse.gpu_process";
/// gpulse's entity on the node resource.
pub const NODE_ENTITY_NAME: &str = "gpulse.node";

/// An entity gpulse defines: name, brief, note, its attributes, those that identify it.
struct Entity(
    &'static str,
    &'static str,
    &'static str,
    &'static [Uses],
    &'static [A],
);

fn entities_yaml() -> String {
    let mut out = format!("{HEADER}imports:\n  entities:\n");
    for name in SEMCONV_ENTITIES {
        let _ = writeln!(out, "    - {name}");
    }
    out.push_str("groups:\n");
    let entities: [Entity; 2] = [
        Entity(
            NODE_ENTITY_NAME,
            "The gpulse agent watching one node's GPUs: the resource of the device metrics, of the findings about devices, and of gpulse's own health.",
            "Its `service.name` is `gpulse` unless configured; `OTEL_RESOURCE_ATTRIBUTES` adds attributes (`k8s.node.name`, `cloud.*`) without replacing these.",
            &NODE_ENTITY,
            &[A::ServiceInstanceId],
        ),
        Entity(
            GPU_PROCESS_ENTITY_NAME,
            "A process holding a GPU, as gpulse attributed it: one resource per process, beside the conventions' `process`, `container`, `k8s.*` and `service` entities.",
            "`process.pid` is the host PID NVML reports and `process.vpid` the PID in the process's own namespace: `container.id` + `process.vpid` here equals `container.id` + `process.pid` in the application's own telemetry. `process.creation.time` is known when the process's /proc entry is readable.",
            &GPU_PROCESS_ENTITY,
            &[A::ProcessPid, A::ProcessCreationTime],
        ),
    ];
    for Entity(name, brief, note, uses, identifying) in entities {
        let _ = write!(
            out,
            "  - id: entity.{name}\n    type: entity\n    name: {name}\n    stability: development\n    brief: {}\n    note: {}\n    attributes:\n",
            quote(brief),
            quote(note)
        );
        for u in uses {
            uses_yaml(&mut out, "      ", std::slice::from_ref(u));
            let role = if identifying.contains(&u.attribute) {
                "identifying"
            } else {
                "descriptive"
            };
            let _ = writeln!(out, "        role: {role}");
        }
    }
    out
}

fn events_yaml() -> String {
    let mut out = format!(
        "{HEADER}groups:\n  - id: event.{FINDING_EVENT}\n    type: event\n    name: {FINDING_EVENT}\n    stability: development\n    brief: {}\n    note: {}\n    attributes:\n",
        quote("A finding started, escalated or cleared: one log record, on the resource of the process it concerns or on the node resource for a device or a job."),
        quote("The body is the finding's summary (`Cleared: …` once it clears); the severity number follows `gpulse.diagnosis.severity`. docs/rules.md lists the rules, their values and advice.")
    );
    uses_yaml(&mut out, "      ", &FINDING_ATTRIBUTES);
    uses_yaml(&mut out, "      ", &FINDING_PLACE);
    let _ = write!(
        out,
        "  - id: event.{EVIDENCE_EVENT}\n    type: event\n    name: {EVIDENCE_EVENT}\n    stability: development\n    brief: {}\n    note: {}\n    attributes:\n",
        quote("Evidence a finding gathered from another process than its subject, sent once when the finding starts, on that process's resource: the stacks of the ranks that wait in a hung job."),
        quote("The body is the process's stack (every thread, as the PyTorch companion sent it); `gpulse.diagnosis.subject` names the finding it belongs to.")
    );
    uses_yaml(&mut out, "      ", &EVIDENCE_ATTRIBUTES);
    out
}

#[cfg(test)]
mod tests {
    use super::super::docs::REGENERATE;
    use super::*;

    /// The committed registry is what the schema generates.
    #[test]
    fn committed_registry_matches_the_schema() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(REGISTRY_DIR);
        for (name, generated) in files(SEMCONV_ARCHIVE) {
            let path = dir.join(name);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}; run `{REGENERATE}`", path.display()));
            assert!(
                committed == generated,
                "{} is out of date with src/schema: run `{REGENERATE}` and commit the result",
                path.display()
            );
        }
    }

    /// Each metric is either the conventions' (imported, or restated for Weaver's sake) or
    /// gpulse's, and the conventions' names gpulse lists are ones it emits.
    #[test]
    fn conventions_metrics_are_emitted_and_not_redefined() {
        for name in SEMCONV_METRICS {
            assert!(
                METRICS.iter().any(|m| m.name == name),
                "{name} is not in METRICS"
            );
        }
        for name in RESTATED_SEMCONV_METRICS {
            assert!(is_semconv_metric(name), "{name} is restated but not listed");
        }
        let metrics = metrics_yaml();
        for name in SEMCONV_METRICS {
            let defined = format!("    metric_name: {name}\n");
            assert_eq!(
                metrics.contains(&defined),
                RESTATED_SEMCONV_METRICS.contains(&name),
                "{name}"
            );
        }
        for spec in METRICS.iter().filter(|m| !is_semconv_metric(m.name)) {
            assert!(
                metrics.contains(&format!("    metric_name: {}\n", spec.name)),
                "{}",
                spec.name
            );
        }
    }

    #[test]
    fn manifest_names_the_conventions_where_asked() {
        let manifest = manifest("/somewhere/semconv/model");
        assert!(manifest.contains("registry_path: \"/somewhere/semconv/model\"\n"));
        assert!(manifest.contains(&format!("schema_url: {SEMCONV_SCHEMA_URL}\n")));
        assert_eq!(quote("a \"b\" \\ c"), "\"a \\\"b\\\" \\\\ c\"");
    }
}
