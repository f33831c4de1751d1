//! The test that keeps the schema the one place metric names and attribute keys live: it reads
//! every production source file of `src/` outside `schema/` and fails on a string literal equal
//! to a metric name or attribute key the schema declares, naming the file, the line and what to
//! write instead. Test modules (from the first `#[cfg(test)]` of a file, and `tests.rs` files)
//! may spell names out: they check the contract from outside.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::attributes::ATTRIBUTES;
use super::health::HEALTH_METRICS;
use super::metrics::METRICS;

/// Every name the schema declares, with what to write instead of the literal.
fn declared() -> BTreeMap<&'static str, String> {
    let mut names = BTreeMap::new();
    for a in &ATTRIBUTES {
        names.insert(a.key, format!("AttributeId::{:?}.key()", a.id));
    }
    for m in &METRICS {
        names.insert(m.name, format!("MetricId::{:?}", m.id));
    }
    for m in &HEALTH_METRICS {
        names.insert(m.name, "the health metric's row".to_string());
    }
    names
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The string literals of `code` (escapes are not interpreted: names have none), with their
/// 1-based line; comments are skipped.
fn literals(code: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let code_part = line.split("//").next().unwrap_or_default();
        let mut rest = code_part;
        while let Some(start) = rest.find('"') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('"') else { break };
            found.push((n + 1, &after[..end]));
            rest = &after[end + 1..];
        }
    }
    found
}

#[test]
fn no_metric_name_or_attribute_key_is_a_literal_outside_the_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    assert!(
        files.len() > 50,
        "found only {} files under {}",
        files.len(),
        root.display()
    );
    let names = declared();
    let mut offences = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        if relative.starts_with("schema") || relative.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (line, literal) in literals(production) {
            if let Some(instead) = names.get(literal) {
                offences.push(format!(
                    "src/{}:{line}: \"{literal}\" is declared in the schema: use {instead}",
                    relative.display()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "{} metric names or attribute keys written as literals:\n{}",
        offences.len(),
        offences.join("\n")
    );
}

#[test]
fn the_scan_finds_a_literal_and_skips_comments() {
    let code = "let a = \"hw.id\"; // \"gpu.index\"\nlet b = (\"x\", \"y\");";
    assert_eq!(literals(code), vec![(1, "hw.id"), (2, "x"), (2, "y")]);
}
