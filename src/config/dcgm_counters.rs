//! A dcgm-exporter counters CSV (`--dcgm-counters FILE`, dcgm-exporter's own
//! `DCGM_EXPORTER_COLLECTORS`, the file key `prometheus.dcgm_counters`), read as dcgm-exporter
//! reads it, into the `DCGM_FI_*` series `/metrics` serves: an operator's
//! `/etc/dcgm-exporter/custom.csv` works unchanged.
//!
//! dcgm-exporter reads the file with Go's `encoding/csv` (comment character `#`, every record
//! with as many fields as the first), trims spaces around each field, and wants 3 columns: the
//! DCGM field, the Prometheus type (`gauge`, `counter`, `histogram`, `summary`, `label`) and the
//! help text. Its rows select the series; their type and help are the ones written. The `csv`
//! crate with `#` comments, no headers and fixed record lengths reads the same (a line starting
//! with `#` is a comment, a blank line is skipped), so a file dcgm-exporter takes is taken here.
//!
//! A row gpulse cannot serve (a field it has no value for, a type it cannot give the field, a
//! `label` other than the driver version) stops the start with the file, line and field, and
//! what to do; with `--dcgm-counters-unknown warn` it is a warning and the row is skipped.

use std::path::{Path, PathBuf};

use crate::schema::{dcgm_series, DcgmSeries, DcgmType, DRIVER_VERSION_LABEL};

/// What a row naming a field gpulse cannot serve does (`--dcgm-counters-unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownCounters {
    /// Refuse to start, naming the file, line and field.
    #[default]
    Error,
    /// Skip the row with a warning.
    Warn,
}

impl UnknownCounters {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "error" => Ok(UnknownCounters::Error),
            "warn" => Ok(UnknownCounters::Warn),
            _ => Err("expected error (refuse to start) or warn (skip the row)".into()),
        }
    }
}

/// One selected series: gpulse's series for the row's field, with the type and help the row
/// gives (dcgm-exporter writes what its file says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmCounter {
    pub series: &'static DcgmSeries,
    pub kind: DcgmType,
    pub help: String,
}

/// The series a counters file selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmCounters {
    /// The file, for messages.
    pub path: PathBuf,
    /// In the file's order, each field once (a repeated row: the first wins, as a warning).
    pub counters: Vec<DcgmCounter>,
    /// The file's `DCGM_FI_DRIVER_VERSION, label, …` row: the driver version label on every
    /// series.
    pub driver_version_label: bool,
}

impl DcgmCounters {
    /// The row selecting the series `name`, if any.
    pub fn get(&self, name: &str) -> Option<&DcgmCounter> {
        self.counters.iter().find(|c| c.series.name == name)
    }
}

/// Why a counters file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CountersError {
    /// The file could not be read.
    #[error(
        "cannot read the dcgm-exporter counters file {path} (given by {given_by}): {source}; \
         mount it or fix the path"
    )]
    Read {
        path: PathBuf,
        given_by: String,
        #[source]
        source: std::io::Error,
    },
    /// Not a CSV dcgm-exporter would take.
    #[error("{path}:{line}: {message}")]
    Malformed {
        path: PathBuf,
        line: u64,
        message: String,
    },
    /// A row naming a field or type gpulse cannot serve.
    #[error(
        "{path}:{line}: gpulse cannot serve {field}: {why}. Remove the row, or pass \
         --dcgm-counters-unknown warn to skip such rows with a warning"
    )]
    Unservable {
        path: PathBuf,
        line: u64,
        field: String,
        why: String,
    },
}

/// The Prometheus types dcgm-exporter's parser accepts.
const TYPES: [&str; 5] = ["gauge", "counter", "histogram", "summary", "label"];

/// Reads and checks the counters file at `path`; `given_by` names the setting for messages.
/// Rows skipped under [`UnknownCounters::Warn`] are described in `warnings`.
///
/// # Errors
/// The file cannot be read, is malformed, or (under [`UnknownCounters::Error`]) names a field
/// gpulse cannot serve.
pub fn load(
    path: &Path,
    given_by: &str,
    unknown: UnknownCounters,
    warnings: &mut Vec<String>,
) -> Result<DcgmCounters, CountersError> {
    let text = std::fs::read(path).map_err(|source| CountersError::Read {
        path: path.to_path_buf(),
        given_by: given_by.to_string(),
        source,
    })?;
    parse(&text, path, unknown, warnings)
}

/// [`load`] of text already read.
///
/// # Errors
/// As [`load`], less reading.
pub fn parse(
    text: &[u8],
    path: &Path,
    unknown: UnknownCounters,
    warnings: &mut Vec<String>,
) -> Result<DcgmCounters, CountersError> {
    let malformed = |line: u64, message: String| CountersError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .comment(Some(b'#'))
        .flexible(false)
        .trim(csv::Trim::None)
        .from_reader(text);
    let mut counters = DcgmCounters {
        path: path.to_path_buf(),
        counters: Vec::new(),
        driver_version_label: false,
    };
    for record in reader.byte_records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| line_of(text, p));
            let message = match e.kind() {
                csv::ErrorKind::UnequalLengths {
                    expected_len, len, ..
                } => format!(
                    "{len} fields where the first row has {expected_len}; every row is \
                     `DCGM field, Prometheus type, help` (a help text with a comma needs quotes)"
                ),
                _ => format!("not CSV dcgm-exporter can read: {e}"),
            };
            malformed(line, message)
        })?;
        let line = record.position().map_or(0, |p| line_of(text, p));
        let fields: Vec<String> = record
            .iter()
            .map(|f| String::from_utf8_lossy(f).trim_matches(' ').to_string())
            .collect();
        if fields.len() == 1 && fields[0].is_empty() {
            continue;
        }
        let [field, kind, help] = fields.as_slice() else {
            return Err(malformed(
                line,
                format!(
                    "{} fields; expected 3: DCGM field, Prometheus type, help (e.g. \
                     `DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).`)",
                    fields.len()
                ),
            ));
        };
        if !TYPES.contains(&kind.as_str()) {
            return Err(malformed(
                line,
                format!(
                    "{field}: Prometheus type {kind:?} is not one of {}",
                    TYPES.join(", ")
                ),
            ));
        }
        match select(field, kind) {
            Ok(Selected::DriverVersionLabel) => counters.driver_version_label = true,
            Ok(Selected::Series(series, kind)) => {
                if counters.get(series.name).is_some() {
                    warnings.push(format!(
                        "{}:{line}: {field} is listed again; the first row is used",
                        path.display()
                    ));
                    continue;
                }
                counters.counters.push(DcgmCounter {
                    series,
                    kind,
                    help: help.clone(),
                });
            }
            Err(why) => {
                let error = CountersError::Unservable {
                    path: path.to_path_buf(),
                    line,
                    field: field.clone(),
                    why,
                };
                match unknown {
                    UnknownCounters::Error => return Err(error),
                    UnknownCounters::Warn => warnings.push(format!(
                        "{}:{line}: {field} skipped: gpulse cannot serve it \
                         (--dcgm-counters-unknown warn)",
                        path.display()
                    )),
                }
            }
        }
    }
    Ok(counters)
}

/// The 1-based line a record starts on. The `csv` crate's position is where it began reading
/// the record, before the comment and blank lines it skipped (and its line number leaves
/// comments out), so the line is counted here past those.
fn line_of(text: &[u8], position: &csv::Position) -> u64 {
    let mut start = usize::try_from(position.byte()).map_or(text.len(), |b| b.min(text.len()));
    while start < text.len() {
        let rest = &text[start..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        let line = &rest[..end];
        let skipped =
            line.first() == Some(&b'#') || line.iter().all(|b| matches!(b, b'\r' | b'\n'));
        if !skipped {
            break;
        }
        start += end;
    }
    1 + text[..start].iter().filter(|&&b| b == b'\n').count() as u64
}

enum Selected {
    Series(&'static DcgmSeries, DcgmType),
    DriverVersionLabel,
}

/// What a row with a known type selects, or why gpulse cannot serve it.
fn select(field: &str, kind: &str) -> Result<Selected, String> {
    if field == DRIVER_VERSION_LABEL {
        return match kind {
            "label" => Ok(Selected::DriverVersionLabel),
            _ => Err("gpulse gives the driver version only as a `label`".into()),
        };
    }
    let Some(series) = dcgm_series().find(|s| s.name == field) else {
        return Err(if kind == "label" {
            "gpulse gives no label of that field (only DCGM_FI_DRIVER_VERSION)".into()
        } else if field.starts_with("DCGM_FI_") || field.starts_with("DCGM_EXP_") {
            "it has no value of that field; docs/prometheus.md lists the DCGM_FI_* series it \
             serves"
                .into()
        } else {
            "not a DCGM field name (they start with DCGM_FI_)".into()
        });
    };
    match kind {
        "gauge" => Ok(Selected::Series(series, DcgmType::Gauge)),
        "counter" => Ok(Selected::Series(series, DcgmType::Counter)),
        other => Err(format!(
            "gpulse serves it as a gauge or a counter, not a {other} (dcgm-exporter's own \
             files type it {})",
            series.kind.as_str()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(
        text: &str,
        unknown: UnknownCounters,
    ) -> (Result<DcgmCounters, String>, Vec<String>) {
        let mut warnings = Vec::new();
        let parsed = parse(
            text.as_bytes(),
            Path::new("/etc/dcgm-exporter/custom.csv"),
            unknown,
            &mut warnings,
        )
        .map_err(|e| e.to_string());
        (parsed, warnings)
    }

    fn names(counters: &DcgmCounters) -> Vec<&str> {
        counters.counters.iter().map(|c| c.series.name).collect()
    }

    /// Comments, blank lines and spaces around commas, as dcgm-exporter's own files have them
    /// (`DCGM_FI_DEV_DEC_UTIL ,     gauge` included); the rows' types and help are kept.
    #[test]
    fn a_subset_with_comments_and_spacing_selects_its_rows() {
        let text = "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n\
                    DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).\n\
                    # DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n\
                    DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\n\
                    \n\
                    DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.\n\
                    DCGM_FI_DRIVER_VERSION,        label, Driver Version\n";
        let (parsed, warnings) = parse_str(text, UnknownCounters::Error);
        let counters = parsed.expect("parses");
        assert_eq!(
            names(&counters),
            [
                "DCGM_FI_DEV_GPU_TEMP",
                "DCGM_FI_DEV_DEC_UTIL",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
            ]
        );
        assert!(counters.driver_version_label);
        let replay = counters.get("DCGM_FI_DEV_PCIE_REPLAY_COUNTER").unwrap();
        assert_eq!(replay.kind, DcgmType::Counter);
        assert_eq!(replay.help, "Total number of PCIe retries.");
        assert_eq!(counters.get("DCGM_FI_DEV_SM_CLOCK"), None);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// The row's type is what is served, as dcgm-exporter writes its file's type.
    #[test]
    fn the_rows_type_wins() {
        let (parsed, _) = parse_str(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, gauge, energy\n",
            UnknownCounters::Error,
        );
        let counters = parsed.unwrap();
        assert_eq!(counters.counters[0].kind, DcgmType::Gauge);
        assert_eq!(counters.counters[0].series.kind, DcgmType::Counter);
        assert!(!counters.driver_version_label);
    }

    #[test]
    fn an_unknown_field_names_the_file_line_and_field_and_what_to_do() {
        let text = "# comment\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n\nDCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n";
        let (parsed, _) = parse_str(text, UnknownCounters::Error);
        let err = parsed.unwrap_err();
        assert!(
            err.starts_with("/etc/dcgm-exporter/custom.csv:4: gpulse cannot serve DCGM_FI_DEV_VGPU_LICENSE_STATUS:"),
            "{err}"
        );
        assert!(err.contains("--dcgm-counters-unknown warn"), "{err}");
        assert!(err.contains("Remove the row"), "{err}");
    }

    #[test]
    fn with_warn_an_unknown_field_is_skipped_with_a_warning() {
        let text = "DCGM_EXP_XID_ERRORS_COUNT, counter, x\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_SERIAL, label, s\n";
        let (parsed, warnings) = parse_str(text, UnknownCounters::Warn);
        assert_eq!(names(&parsed.unwrap()), ["DCGM_FI_DEV_GPU_TEMP"]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains(":1: DCGM_EXP_XID_ERRORS_COUNT skipped"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains(":3: DCGM_FI_DEV_SERIAL skipped"),
            "{warnings:?}"
        );
    }

    #[test]
    fn malformed_rows_are_refused_with_their_line() {
        for (text, line, says) in [
            (
                "DCGM_FI_DEV_GPU_TEMP, gauge\n",
                ":1:",
                "2 fields; expected 3",
            ),
            (
                "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_SM_CLOCK, gauge\n",
                ":2:",
                "2 fields where the first row has 3",
            ),
            (
                "DCGM_FI_DEV_GPU_TEMP, gaug, t\n",
                ":1:",
                "\"gaug\" is not one of gauge",
            ),
        ] {
            let (parsed, _) = parse_str(text, UnknownCounters::Warn);
            let err = parsed.unwrap_err();
            assert!(err.contains(line) && err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_type_gpulse_cannot_give_is_unservable() {
        let (parsed, _) = parse_str(
            "DCGM_FI_DEV_GPU_TEMP, histogram, t\n",
            UnknownCounters::Error,
        );
        let err = parsed.unwrap_err();
        assert!(err.contains("not a histogram"), "{err}");
        let (parsed, _) = parse_str("DCGM_FI_DRIVER_VERSION, gauge, v\n", UnknownCounters::Error);
        assert!(parsed.unwrap_err().contains("only as a `label`"));
    }

    #[test]
    fn a_repeated_row_keeps_the_first() {
        let text = "DCGM_FI_DEV_GPU_TEMP, gauge, first\nDCGM_FI_DEV_GPU_TEMP, counter, second\n";
        let (parsed, warnings) = parse_str(text, UnknownCounters::Error);
        let counters = parsed.unwrap();
        assert_eq!(counters.counters.len(), 1);
        assert_eq!(counters.counters[0].help, "first");
        assert!(warnings[0].contains(":2: DCGM_FI_DEV_GPU_TEMP is listed again"));
    }

    #[test]
    fn unknown_counters_parse() {
        assert_eq!(UnknownCounters::parse(" warn"), Ok(UnknownCounters::Warn));
        assert_eq!(UnknownCounters::parse("error"), Ok(UnknownCounters::Error));
        assert!(UnknownCounters::parse("ignore")
            .unwrap_err()
            .contains("warn"));
    }
}
