//! The NVML field checklist, made a test: every NVML call ([`NvmlCall`]) and field id
//! ([`NvmlFieldId`]) the device fields read has copies outside the schema that no build step
//! derives, because each is written by hand on purpose (a simulator, an independent library, a
//! check with NVIDIA's own binding, a recording). This test reads each copy by path and names,
//! for each call or field id, every copy that lacks it and the file to edit:
//!
//! - nvml-sim must export the call's C function, or serve the field id, in `nvml-sim/src/ffi/`;
//! - nvml-sim's README must say which scenario key answers it;
//! - the independent C NVML (`tests/fixtures/other-nvml/other_nvml.c`) must define the function
//!   or answer the id, or list it as not exported; `tests/other_nvml.rs` must check each of its
//!   fields (the library's value, or its absence);
//! - the pynvml ABI test (`tests/python/test_nvml_abi.py`) must read it through nvidia-ml-py;
//! - the recorded `/status` document of the PyTorch companion's tests must hold each field.
//!
//! CONTRIBUTING.md ("Adding an NVML field") walks through the same list.

use std::path::Path;

use super::device::DEVICE_FIELDS;
use super::source::{NvmlCall, NvmlFieldId, SourceKind};

const SIM_FFI: &str = "nvml-sim/src/ffi";
const SIM_README: &str = "nvml-sim/README.md";
const OTHER_NVML: &str = "tests/fixtures/other-nvml/other_nvml.c";
const OTHER_NVML_TEST: &str = "tests/other_nvml.rs";
const PYNVML_TEST: &str = "tests/python/test_nvml_abi.py";
const STATUS_FIXTURE: &str = "examples/pytorch/tests/fixtures/gpulse_status.json";
/// The paragraph of `other_nvml.c`'s header comment listing what it deliberately lacks.
const NOT_EXPORTED: &str = "Not exported";

/// The calls pynvml reaches through a versioned argument of the unversioned function, not a
/// function of the C name: the spelling the ABI test must contain instead.
const PYNVML_VERSIONED: &[(&str, &str)] =
    &[("nvmlDeviceGetMemoryInfo_v2", "version=nvmlMemory_v2")];

/// The hand-written copies, as text.
struct Copies {
    /// The code (comments and tests left out) of every file under [`SIM_FFI`].
    sim_ffi: String,
    sim_readme: String,
    other_nvml: String,
    other_nvml_test: String,
    /// The ABI test without its comment lines.
    pynvml_test: String,
    status_fixture: String,
}

impl Copies {
    fn read() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |relative: &str| {
            std::fs::read_to_string(root.join(relative)).unwrap_or_else(|e| {
                panic!(
                    "{relative}: {e}: the NVML field checklist reads it (src/schema/checklist.rs)"
                )
            })
        };
        let mut ffi_files: Vec<_> = std::fs::read_dir(root.join(SIM_FFI))
            .unwrap_or_else(|e| panic!("{SIM_FFI}: {e}"))
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "rs"))
            .filter(|path| !path.to_string_lossy().ends_with("tests.rs"))
            .collect();
        ffi_files.sort();
        assert!(ffi_files.len() > 3, "found only {ffi_files:?} in {SIM_FFI}");
        let sim_ffi = ffi_files
            .iter()
            .map(|path| rust_code(&std::fs::read_to_string(path).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n");
        let pynvml_test = read(PYNVML_TEST)
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        Self {
            sim_ffi,
            sim_readme: read(SIM_README),
            other_nvml: read(OTHER_NVML),
            other_nvml_test: read(OTHER_NVML_TEST),
            pynvml_test,
            status_fixture: read(STATUS_FIXTURE),
        }
    }
}

/// A Rust file's production code: up to its first `#[cfg(test)]`, without `//` comments.
fn rust_code(text: &str) -> String {
    let production = text.split("#[cfg(test)]").next().unwrap_or_default();
    production
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `name` occurs in `text` as a whole identifier (not inside a longer one, so
/// `nvmlDeviceGetMemoryInfo` is not found in `nvmlDeviceGetMemoryInfo_v2`).
fn has_identifier(text: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The paragraph of `other_nvml.c`'s header comment that lists what it does not export.
fn not_exported(other_nvml: &str) -> &str {
    let Some(start) = other_nvml.find(NOT_EXPORTED) else {
        return "";
    };
    let rest = &other_nvml[start..];
    &rest[..rest.find("\n *\n").unwrap_or(rest.len())]
}

/// The JSON keys of the device fields read from `kind`.
fn keys_of(kind: SourceKind) -> Vec<&'static str> {
    DEVICE_FIELDS
        .iter()
        .filter(|spec| spec.source.kind == kind)
        .map(|spec| spec.key)
        .collect()
}

/// Every call and field id of the schema.
fn sources() -> Vec<SourceKind> {
    let calls = NvmlCall::ALL.iter().map(|c| SourceKind::Call(*c));
    let ids = NvmlFieldId::ALL.iter().map(|id| SourceKind::FieldId(*id));
    calls.chain(ids).collect()
}

/// What each copy lacks for `kind`, one line per copy, naming the file to edit.
fn gaps_of(kind: SourceKind, copies: &Copies) -> Vec<String> {
    let keys = keys_of(kind);
    let mut gaps = Vec::new();
    let mut lacks = |file: &str, what: String| gaps.push(format!("{kind}: {file}: {what}"));
    if keys.is_empty() {
        lacks(
            "src/schema/device.rs",
            "no device field reads it: remove it from the schema or add its row".into(),
        );
    }
    let quoted = |key: &str| format!("\"{key}\"");
    match kind {
        SourceKind::Call(call) => {
            let name = call.c_name();
            if !has_identifier(&copies.sim_ffi, name) {
                lacks(SIM_FFI, format!("nvml-sim does not export `{name}`: export it (nvml_fn!) and list it in nvml-sim/src/api.rs"));
            }
            let defined = copies.other_nvml.contains(&format!("nvmlReturn_t {name}("));
            if !defined && !has_identifier(not_exported(&copies.other_nvml), name) {
                lacks(OTHER_NVML, format!("neither defines `{name}` nor lists it in its header's \"{NOT_EXPORTED}\" paragraph"));
            }
            let spelling = PYNVML_VERSIONED
                .iter()
                .find(|(c_name, _)| *c_name == name)
                .map_or(name, |(_, spelling)| *spelling);
            let arguments = call.arguments().iter().filter(|a| a.starts_with("NVML_"));
            let unread: Vec<&str> = std::iter::once(spelling)
                .chain(arguments.copied())
                .filter(|word| {
                    !has_identifier(&copies.pynvml_test, word.trim_start_matches("version="))
                })
                .collect();
            if !unread.is_empty() {
                lacks(PYNVML_TEST, format!("does not read it through nvidia-ml-py (no {unread:?}): add a case that reads it from a scenario and checks the value"));
            }
        }
        SourceKind::FieldId(id) => {
            let name = id.c_name();
            if !has_identifier(&copies.sim_ffi, name) {
                lacks(SIM_FFI, format!("nvml-sim does not serve `{name}` in nvmlDeviceGetFieldValues: add it to the field ids it answers"));
            }
            let number = id.id();
            let answered = [format!("id == {number})"), format!("case {number}:")]
                .iter()
                .any(|code| copies.other_nvml.contains(code.as_str()));
            if !answered && !has_identifier(not_exported(&copies.other_nvml), name) {
                lacks(OTHER_NVML, format!("field_value neither answers {number} (`{name}`) nor does its header's \"{NOT_EXPORTED}\" paragraph list it"));
            }
            if !has_identifier(&copies.pynvml_test, name) {
                lacks(PYNVML_TEST, format!("does not read `{name}` through nvidia-ml-py's nvmlDeviceGetFieldValues: add it to a field-values case"));
            }
        }
    }
    let readme_name = match kind {
        SourceKind::Call(call) => call.display(),
        SourceKind::FieldId(id) => id.c_name().to_string(),
    };
    if !copies.sim_readme.contains(&format!("`{readme_name}`")) {
        lacks(SIM_README, format!("does not say which scenario key answers `{readme_name}`: add its row to \"The NVML calls behind gpulse's device fields\""));
    }
    for key in &keys {
        if !copies.other_nvml_test.contains(&quoted(key)) {
            lacks(OTHER_NVML_TEST, format!("does not check `{key}`: assert the independent library's value, or its absence where other_nvml.c does not export the call"));
        }
        if !copies.status_fixture.contains(&format!("{}:", quoted(key))) {
            lacks(STATUS_FIXTURE, format!("has no `{key}`: re-record it with scripts/regenerate (examples/pytorch/tests/fixtures/record_gpulse_status.sh)"));
        }
    }
    gaps
}

fn gaps(copies: &Copies) -> Vec<String> {
    sources()
        .into_iter()
        .flat_map(|kind| gaps_of(kind, copies))
        .collect()
}

#[test]
fn every_nvml_call_and_field_id_is_in_every_hand_written_copy() {
    let gaps = gaps(&Copies::read());
    assert!(
        gaps.is_empty(),
        "{} copies lack an NVML call or field id of the schema (CONTRIBUTING.md, \"Adding an NVML field\"):\n{}",
        gaps.len(),
        gaps.join("\n")
    );
}

/// The check fails on a real omission: each copy with one call's or field id's entries taken
/// out is named, with the call or field id.
#[test]
fn a_copy_without_an_entry_is_named() {
    let power = SourceKind::Call(NvmlCall::PowerUsage);
    let memory_temp = SourceKind::FieldId(NvmlFieldId::MemoryTemp);
    type Field = fn(&mut Copies) -> &mut String;
    let cases: [(&str, SourceKind, Field, &str); 12] = [
        (
            SIM_FFI,
            power,
            |c| &mut c.sim_ffi,
            "nvmlDeviceGetPowerUsage",
        ),
        (
            SIM_README,
            power,
            |c| &mut c.sim_readme,
            "`nvmlDeviceGetPowerUsage`",
        ),
        (
            OTHER_NVML,
            power,
            |c| &mut c.other_nvml,
            "nvmlDeviceGetPowerUsage",
        ),
        (
            OTHER_NVML_TEST,
            power,
            |c| &mut c.other_nvml_test,
            "\"power_watts\"",
        ),
        (
            PYNVML_TEST,
            power,
            |c| &mut c.pynvml_test,
            "nvmlDeviceGetPowerUsage",
        ),
        (
            STATUS_FIXTURE,
            power,
            |c| &mut c.status_fixture,
            "\"power_watts\"",
        ),
        (
            SIM_FFI,
            memory_temp,
            |c| &mut c.sim_ffi,
            "NVML_FI_DEV_MEMORY_TEMP",
        ),
        (
            SIM_README,
            memory_temp,
            |c| &mut c.sim_readme,
            "`NVML_FI_DEV_MEMORY_TEMP`",
        ),
        (OTHER_NVML, memory_temp, |c| &mut c.other_nvml, "id == 82"),
        (
            OTHER_NVML_TEST,
            memory_temp,
            |c| &mut c.other_nvml_test,
            "\"memory_temperature_celsius\"",
        ),
        (
            PYNVML_TEST,
            memory_temp,
            |c| &mut c.pynvml_test,
            "NVML_FI_DEV_MEMORY_TEMP",
        ),
        (
            STATUS_FIXTURE,
            memory_temp,
            |c| &mut c.status_fixture,
            "\"memory_temperature_celsius\"",
        ),
    ];
    for (file, kind, field, entry) in cases {
        let mut copies = Copies::read();
        let text = field(&mut copies);
        assert!(text.contains(entry), "{file} has no {entry} to take out");
        *text = text.replace(entry, "REMOVED");
        let gaps = gaps(&copies);
        let named = format!("{kind}: {file}: ");
        assert!(
            !gaps.is_empty() && gaps.iter().all(|g| g.starts_with(&named)),
            "{kind} taken out of {file} should be named there alone, got {gaps:#?}"
        );
    }
}

#[test]
fn identifiers_match_whole() {
    assert!(has_identifier("f(nvmlX_v2)", "nvmlX_v2"));
    assert!(!has_identifier("f(nvmlX_v2)", "nvmlX"));
    assert!(!has_identifier("nvmlXY", "nvmlX"));
    assert_eq!(rust_code("a // b\nc\n#[cfg(test)]\nd"), "a \nc");
}
