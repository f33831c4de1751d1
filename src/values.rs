//! Value types and syntaxes shared by flags, environment, file and the stages that read a
//! process's own environment: durations (`100ms`, `1m30s`), byte sizes (`64MiB`, `1GiB`, plain
//! bytes), booleans (`true`/`false`, `1`/`0`, ...), the W3C-baggage-like `key=value,key=value`
//! lists of `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`, and [`SecretString`]
//! for header values. A leaf: it imports nothing of gpulse, so `cli`, `config` and
//! `attribution` all stand above it.
//!
//! Each parser returns a short reason on failure, written so that it reads well after
//! "`<setting>`: " and says what a valid value looks like. The caller adds the setting's name; the
//! list parser never echoes a value, since header values hold tokens.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use thiserror::Error;

/// Parses a duration written with units: `100ms`, `1s`, `2m`, `1h`, `1m30s`, `1.5s`.
///
/// A bare number is refused rather than guessed at (seconds? milliseconds?): the OTel variables
/// that are plain milliseconds are read with [`parse_millis`] instead.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(
            "empty duration; expected a number with a unit, e.g. 500ms, 1s, 2m, 1m30s".into(),
        );
    }
    if trimmed.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "missing unit; write e.g. {trimmed}ms or {trimmed}s (units: ms, s, m, h)"
        ));
    }
    humantime::parse_duration(trimmed).map_err(|e| {
        format!("not a duration ({e}); expected a number with a unit, e.g. 500ms, 1s, 2m, 1m30s")
    })
}

/// Parses a whole number of milliseconds, the unit of the OTel `*_TIMEOUT` and
/// `OTEL_METRIC_EXPORT_INTERVAL` variables.
pub fn parse_millis(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| "expected a whole number of milliseconds, e.g. 10000".to_string())
}

/// Writes a duration the way [`parse_duration`] reads it back (`1m 30s`, `100ms`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

const SIZE_UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tib", 1 << 40),
];

/// Parses a byte size: plain bytes (`1048576`), or a whole number with a unit: `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 1024; `K`/`M`/`G`/`T` mean the same), `kB`, `MB`, `GB`, `TB` (powers
/// of 1000), `B`. Units are case-insensitive; a space before the unit is allowed.
pub fn parse_size(text: &str) -> Result<u64, String> {
    const EXPECTED: &str =
        "expected bytes or a whole number with a unit, e.g. 1048576, 64MiB, 1GiB";
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(format!("not a size; {EXPECTED}"));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("number too large; {EXPECTED}"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier = if unit.is_empty() {
        1
    } else {
        SIZE_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, m)| *m)
            .ok_or_else(|| format!("unknown unit {unit:?}; {EXPECTED}"))?
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size does not fit in 64 bits; {EXPECTED}"))
}

/// Writes a size with the largest binary unit that divides it exactly (`64MiB`, `1536KiB`,
/// `1000`), so that [`parse_size`] reads back the same number.
pub fn format_size(bytes: u64) -> String {
    const UNITS: &[(&str, u64)] = &[
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    if bytes != 0 {
        for (name, m) in UNITS {
            if bytes % m == 0 {
                return format!("{}{name}", bytes / m);
            }
        }
    }
    bytes.to_string()
}

/// Parses a boolean the way people write them in environment variables.
pub(crate) fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false (also 1/0, yes/no, on/off)".into()),
    }
}

/// Why one entry of a `key=value,...` list was refused. Carries the 1-based position of the entry
/// and, when it could be read, the key, but never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntryError {
    /// 1-based position of the bad entry in the comma-separated list.
    pub position: usize,
    /// The entry's key when one could be read (never the value).
    pub key: Option<String>,
    pub reason: &'static str,
}

impl std::fmt::Display for ListEntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(key) => write!(f, "entry {} (key {key:?}): {}", self.position, self.reason),
            None => write!(f, "entry {}: {}", self.position, self.reason),
        }
    }
}

/// Parses the W3C-baggage-like `k1=v1,k2=v2` list the OTel specification uses for
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`.
///
/// Keys are trimmed; values are trimmed and percent-decoded (`%20` → space, `%2C` → comma).
/// Empty entries (`a=1,,b=2`, a trailing comma) are skipped. Baggage properties after `;` are not
/// part of these variables' syntax and are kept in the value as written. The caller decides on
/// key case (headers lower-case theirs).
pub fn parse_key_value_list(text: &str) -> Result<Vec<(String, String)>, ListEntryError> {
    let mut out = Vec::new();
    for (index, entry) in text.split(',').enumerate() {
        let position = index + 1;
        if entry.trim().is_empty() {
            continue;
        }
        let Some((raw_key, raw_value)) = entry.split_once('=') else {
            return Err(ListEntryError {
                position,
                key: None,
                reason: "missing '='; expected key=value",
            });
        };
        let key = raw_key.trim();
        if key.is_empty() {
            return Err(ListEntryError {
                position,
                key: None,
                reason: "empty key; expected key=value",
            });
        }
        if !key.chars().all(is_token_char) {
            // The key may be the secret if someone wrote `Bearer abc=...`; do not echo it.
            return Err(ListEntryError {
                position,
                key: None,
                reason: "key has characters not allowed in a header name or attribute key \
                         (spaces, quotes, separators); expected key=value",
            });
        }
        let value = percent_decode_str(raw_value.trim())
            .decode_utf8()
            .map_err(|_| ListEntryError {
                position,
                key: Some(key.to_string()),
                reason: "value is not valid UTF-8 after percent-decoding",
            })?;
        out.push((key.to_string(), value.into_owned()));
    }
    Ok(out)
}

/// RFC 9110 `tchar`: what an HTTP header name may hold. Attribute keys such as `service.name` or
/// `k8s.pod.uid` fit too.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// Parses `OTEL_RESOURCE_ATTRIBUTES` as the OpenTelemetry specification defines it, for gpulse's
/// own resource and for the processes' (read from their environ): comma-separated `key=value`,
/// keys and values trimmed and percent-decoded. Unlike header lists, any malformed member (no
/// `=`, empty key, bad `%` escape, not UTF-8) makes the whole value invalid: the caller discards
/// it and reports the error, as the specification says.
/// Why an `OTEL_RESOURCE_ATTRIBUTES` value was discarded. Messages never include the value and
/// count entries from 1; `index` counts from 0.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub(crate) enum ResourceAttributesError {
    /// A list member had no `=`.
    #[error("OTEL_RESOURCE_ATTRIBUTES entry {} has no '=' (expected key=value); the whole value is ignored as the OpenTelemetry specification says", .index + 1)]
    MissingEquals { index: usize },
    /// A list member had an empty key.
    #[error("OTEL_RESOURCE_ATTRIBUTES entry {} has an empty key; the whole value is ignored as the OpenTelemetry specification says", .index + 1)]
    EmptyKey { index: usize },
    /// A `%` not followed by two hex digits.
    #[error("OTEL_RESOURCE_ATTRIBUTES entry {} has a '%' not followed by two hex digits; encode a literal '%' as %25", .index + 1)]
    BadEscape { index: usize },
    /// The percent-decoded bytes are not UTF-8.
    #[error("OTEL_RESOURCE_ATTRIBUTES entry {} does not decode to UTF-8", .index + 1)]
    NotUtf8 { index: usize },
}

pub(crate) fn parse_resource_attributes(
    value: &str,
) -> Result<Vec<(String, String)>, ResourceAttributesError> {
    let mut pairs = Vec::new();
    for (index, member) in value.split(',').enumerate() {
        if member.trim().is_empty() {
            continue;
        }
        let (key, value) = member
            .split_once('=')
            .ok_or(ResourceAttributesError::MissingEquals { index })?;
        let key = decode(key.trim(), index)?;
        if key.is_empty() {
            return Err(ResourceAttributesError::EmptyKey { index });
        }
        pairs.push((key, decode(value.trim(), index)?));
    }
    Ok(pairs)
}

fn decode(text: &str, index: usize) -> Result<String, ResourceAttributesError> {
    // percent_decode_str passes a malformed `%` through unchanged; the specification treats it
    // as a decoding failure, so check first.
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices('%') {
        let hex = bytes.get(i + 1..i + 3);
        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err(ResourceAttributesError::BadEscape { index });
        }
    }
    percent_decode_str(text)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| ResourceAttributesError::NotUtf8 { index })
}

/// A header value that must never be logged (API keys, bearer tokens).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for putting on the wire. Never log what this returns.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Prices the roll-ups' cost is figured with (`--cost-per-gpu-hour`, `--cost-per-kwh`), in the
/// user's currency; either, both or neither.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    pub per_gpu_hour: Option<f64>,
    pub per_kwh: Option<f64>,
}

/// Parses a price: a finite, non-negative number without a currency sign.
pub(crate) fn parse_price(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    match trimmed.parse::<f64>() {
        Ok(price) if price.is_finite() && price >= 0.0 => Ok(price),
        Ok(_) => Err("expected a price of 0 or more, e.g. 2.50".into()),
        Err(_) => {
            Err("expected a number in your currency without its sign or unit, e.g. 2.50".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_non_negative_plain_numbers() {
        assert_eq!(parse_price(" 2.5 "), Ok(2.5));
        assert_eq!(parse_price("0"), Ok(0.0));
        for bad in ["$2", "-1", "NaN", "inf", "", "2 EUR"] {
            let reason = parse_price(bad).expect_err(bad);
            assert!(reason.contains("e.g. 2.50"), "{bad}: {reason}");
        }
    }

    #[test]
    fn durations_in_the_documented_forms() {
        let cases = [
            ("100ms", Duration::from_millis(100)),
            ("1s", Duration::from_secs(1)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1m30s", Duration::from_secs(90)),
            ("1m 30s", Duration::from_secs(90)),
            (" 50ms ", Duration::from_millis(50)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn duration_errors_say_what_is_valid() {
        let err = parse_duration("10").unwrap_err();
        assert!(err.contains("10ms"), "{err}");
        let err = parse_duration("ten seconds").unwrap_err();
        assert!(err.contains("e.g. 500ms"), "{err}");
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes_binary_decimal_and_plain() {
        let cases = [
            ("0", 0),
            ("1048576", 1 << 20),
            ("64MiB", 64 << 20),
            ("64mib", 64 << 20),
            ("1GiB", 1 << 30),
            ("1 GiB", 1 << 30),
            ("512KiB", 512 << 10),
            ("10MB", 10_000_000),
            ("2kB", 2_000),
            ("7B", 7),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        assert!(parse_size("64 potatoes")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("20000000TiB").unwrap_err().contains("64 bits"));
    }

    #[test]
    fn format_size_round_trips() {
        for bytes in [0, 1, 1000, 1024, 1536, 64 << 20, 3 << 30, u64::MAX] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
        assert_eq!(format_size(64 << 20), "64MiB");
    }

    #[test]
    fn millis() {
        assert_eq!(parse_millis("10000"), Ok(Duration::from_secs(10)));
        assert!(parse_millis("10s").is_err());
        assert!(parse_millis("-5").is_err());
    }

    #[test]
    fn key_value_list_decodes_and_trims() {
        let got = parse_key_value_list(" api-key = abc%20def , x=1%2C2,,").unwrap();
        assert_eq!(
            got,
            vec![
                ("api-key".to_string(), "abc def".to_string()),
                ("x".to_string(), "1,2".to_string())
            ]
        );
        // `=` inside a value is legal (base64 padding in tokens).
        let got = parse_key_value_list("authorization=Basic YWxhZGRpbjpvcGVu==").unwrap();
        assert_eq!(got[0].1, "Basic YWxhZGRpbjpvcGVu==");
    }

    #[test]
    fn key_value_list_errors_name_position_not_value() {
        let err = parse_key_value_list("a=1,secrettoken").unwrap_err();
        assert_eq!(err.position, 2);
        assert!(!err.to_string().contains("secrettoken"));
        let err = parse_key_value_list("=v").unwrap_err();
        assert_eq!(err.position, 1);
        let err = parse_key_value_list("Bearer abc=def").unwrap_err();
        assert!(!err.to_string().contains("abc"), "{err}");
        let err = parse_key_value_list("k=%FF").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("k"));
    }

    #[test]
    fn booleans() {
        for t in ["true", "TRUE", "1", "yes", "on"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["false", "0", "no", "Off"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        assert!(parse_bool("maybe").is_err());
    }
}
