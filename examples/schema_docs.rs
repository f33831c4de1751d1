//! Rewrites the generated tables of docs/metrics.md, docs/semconv.md and docs/prometheus.md from
//! the schema
//! (`src/schema`), leaving the prose around them as it is, and docs/schema.json and gpulse's
//! Weaver registry (`registry/`) whole. Run from the repository root:
//! `cargo run --example schema_docs`.

use std::process::ExitCode;

type Regenerate = fn(&str) -> Result<String, String>;

fn main() -> ExitCode {
    let pages: [(&str, Regenerate); 4] = [
        (
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"),
            gpulse::schema::docs::regenerate_metrics_md,
        ),
        (
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/semconv.md"),
            gpulse::schema::docs::regenerate_semconv_md,
        ),
        (
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus.md"),
            gpulse::export::prometheus::docs::regenerate_prometheus_md,
        ),
        (
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/schema.json"),
            gpulse::schema::docs::regenerate_schema_json,
        ),
    ];
    let mut status = ExitCode::SUCCESS;
    for (path, regenerate) in pages {
        if let Err(e) = rewrite(path, regenerate) {
            eprintln!("schema_docs: {e}");
            status = ExitCode::FAILURE;
        }
    }
    if let Err(e) = write_registry() {
        eprintln!("schema_docs: {e}");
        status = ExitCode::FAILURE;
    }
    status
}

/// Writes gpulse's Weaver registry, depending on the semantic conventions' published model.
fn write_registry() -> Result<(), String> {
    use gpulse::schema::registry::{files, REGISTRY_DIR, SEMCONV_ARCHIVE};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(REGISTRY_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, content) in files(SEMCONV_ARCHIVE) {
        let path = dir.join(name);
        let path = path.to_str().ok_or("the registry's path is not UTF-8")?;
        rewrite(path, |_| Ok(content.clone()))?;
    }
    Ok(())
}

fn rewrite(path: &str, regenerate: impl Fn(&str) -> Result<String, String>) -> Result<(), String> {
    // A whole generated file (docs/schema.json) may not exist yet.
    let doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {path}: {e}")),
    };
    let fresh = regenerate(&doc)
        .map_err(|e| format!("{path}: {e}; put the markers around the table to generate"))?;
    if fresh == doc {
        println!("{path} is up to date");
    } else {
        std::fs::write(path, fresh).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("rewrote the generated parts of {path}");
    }
    Ok(())
}
