//! The `/status` document the PyTorch companion's tests replay
//! (`examples/pytorch/tests/fixtures/gpulse_status.json`) is a recording of this build's
//! `gpulse snapshot --format json`: recorded again here (with the fixture's own script, against
//! nvml-sim), it must have the same keys at every level, or the companion is tested against a
//! document gpulse no longer writes. Values (a timestamp, PIDs, live counters) may differ.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::sampling::{gpulse_bin, sim_lib};

const FIXTURE: &str = "examples/pytorch/tests/fixtures/gpulse_status.json";
const RECORD: &str = "examples/pytorch/tests/fixtures/record_gpulse_status.sh";

/// Every key path of a JSON document; a list's items share their list's path.
fn key_paths(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let here = format!("{path}.{key}");
                out.insert(here.clone());
                key_paths(item, &here, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

fn keys_of(text: &str, what: &str) -> BTreeSet<String> {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what} is not JSON: {e}"));
    let mut keys = BTreeSet::new();
    key_paths(&value, "", &mut keys);
    keys
}

#[test]
fn status_fixture_has_the_keys_gpulse_writes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().expect("temp dir");
    let fresh = dir.path().join("gpulse_status.json");
    let output = Command::new("bash")
        .arg(RECORD)
        .arg(&fresh)
        .current_dir(root)
        .env("RECORD_GPULSE", gpulse_bin())
        .env("RECORD_NVML_LIB", sim_lib())
        .output()
        .expect("run the fixture's record script");
    assert!(
        output.status.success(),
        "{RECORD} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let committed = std::fs::read_to_string(format!("{root}/{FIXTURE}")).expect(FIXTURE);
    let recorded = std::fs::read_to_string(&fresh).expect("the recording");
    let committed = keys_of(&committed, FIXTURE);
    let recorded = keys_of(&recorded, "the recording");
    assert!(recorded.len() > 50, "a short recording: {recorded:?}");
    let missing: Vec<_> = recorded.difference(&committed).collect();
    let gone: Vec<_> = committed.difference(&recorded).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "{FIXTURE} is not what gpulse writes now (keys gpulse writes that it lacks: {missing:?}; \
         keys it has that gpulse no longer writes: {gone:?}): run scripts/regenerate and commit it"
    );
}

#[test]
fn key_paths_reach_into_objects_and_lists() {
    let keys = keys_of(r#"{"a": {"b": 1}, "l": [{"c": null}, {"d": []}]}"#, "test");
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(keys, [".a", ".a.b", ".l", ".l[].c", ".l[].d"]);
}
