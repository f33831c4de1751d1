//! Rewrites the generated tables of docs/metrics.md from the schema (`src/schema`), leaving the
//! prose around them as it is. Run from the repository root: `cargo run --example schema_docs`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
    let doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("schema_docs: cannot read {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let fresh = match gpulse::schema::docs::regenerate_metrics_md(&doc) {
        Ok(fresh) => fresh,
        Err(e) => {
            eprintln!("schema_docs: {path}: {e}; put the markers around the table to generate");
            return ExitCode::FAILURE;
        }
    };
    if fresh == doc {
        println!("{path} is up to date");
    } else if let Err(e) = std::fs::write(path, fresh) {
        eprintln!("schema_docs: cannot write {path}: {e}");
        return ExitCode::FAILURE;
    } else {
        println!("rewrote the generated tables of {path}");
    }
    ExitCode::SUCCESS
}
