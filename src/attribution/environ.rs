//! The process's own OpenTelemetry identity, from `/proc/<pid>/environ`: `OTEL_SERVICE_NAME`
//! and `OTEL_RESOURCE_ATTRIBUTES`, and nothing else.
//!
//! An environment holds secrets (tokens, passwords), so the scanner looks at each NUL-separated
//! entry only long enough to compare its key, copies out the two values it wants and keeps,
//! returns and logs nothing else. The file shows the environment the process was started with
//! (`execve`), not later `setenv` calls, which is what an SDK reads at start-up too.
//!
//! `OTEL_RESOURCE_ATTRIBUTES` is parsed as the specification says
//! (configuration/sdk-environment-variables.md, resource/sdk.md): a comma-separated list of
//! `key=value`, W3C-Baggage-like, `,` and `=` inside keys and values percent-encoded, other
//! characters optionally so. "In case of any error, e.g. failure during the decoding process,
//! the entire environment variable value SHOULD be discarded": an entry without `=`, an empty
//! key, a bad `%` escape or a value that is not UTF-8 once decoded discards the whole list.
//! Empty list members (`a=1,,b=2`, a trailing comma) are tolerated, as the SDKs do, and
//! whitespace around keys and values is trimmed (Baggage's optional whitespace).

use crate::config::values::{parse_resource_attributes, ResourceAttributesError};

pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The two variables, raw, as the process was started with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelEnvironment {
    pub service_name: Option<String>,
    pub resource_attributes: Option<String>,
}

/// Picks `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` out of the bytes of an `environ`
/// file. When a key appears twice the first one wins, as glibc's `getenv` (and so the SDK in
/// the process) would see it.
pub fn scan_environ(environ: &[u8]) -> OtelEnvironment {
    let mut found = OtelEnvironment::default();
    for entry in environ.split(|b| *b == 0) {
        let slot = if let Some(value) = value_of(entry, OTEL_SERVICE_NAME) {
            (&mut found.service_name, value)
        } else if let Some(value) = value_of(entry, OTEL_RESOURCE_ATTRIBUTES) {
            (&mut found.resource_attributes, value)
        } else {
            continue;
        };
        if slot.0.is_none() {
            // Not UTF-8: the SDK in the process could not have used it either.
            *slot.0 = std::str::from_utf8(slot.1).ok().map(str::to_string);
        }
        if found.service_name.is_some() && found.resource_attributes.is_some() {
            break;
        }
    }
    found
}

/// The value of `entry` when it is `key=value`.
fn value_of<'a>(entry: &'a [u8], key: &str) -> Option<&'a [u8]> {
    entry
        .strip_prefix(key.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"="))
}

/// What the process says about itself, resolved: `service.name` and its other attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelIdentity {
    /// `OTEL_SERVICE_NAME` when set and not empty, else `service.name` from the attributes.
    pub service_name: Option<String>,
    /// The parsed attributes, in order (including any `service.name`); empty when absent or
    /// discarded.
    pub resource_attributes: Vec<(String, String)>,
    /// Set when `OTEL_RESOURCE_ATTRIBUTES` was present but discarded.
    pub attributes_error: Option<ResourceAttributesError>,
}

/// Applies the specification's precedence: `OTEL_SERVICE_NAME` over `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`.
pub fn resolve_identity(env: &OtelEnvironment) -> OtelIdentity {
    let (resource_attributes, attributes_error) = match env.resource_attributes.as_deref() {
        None => (Vec::new(), None),
        Some(raw) => match parse_resource_attributes(raw) {
            Ok(pairs) => (pairs, None),
            Err(error) => (Vec::new(), Some(error)),
        },
    };
    let service_name = env
        .service_name
        .as_deref()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .or_else(|| {
            resource_attributes
                .iter()
                .find(|(key, value)| key == "service.name" && !value.is_empty())
                .map(|(_, value)| value.clone())
        });
    OtelIdentity {
        service_name,
        resource_attributes,
        attributes_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_keeps_only_the_two_keys() {
        let environ = b"PATH=/usr/bin\0AWS_SECRET_ACCESS_KEY=hunter2\0OTEL_SERVICE_NAME=trainer\0\
            OTEL_SERVICE_NAME_X=no\0XOTEL_SERVICE_NAME=no\0\
            OTEL_RESOURCE_ATTRIBUTES=team=ml,env=prod\0OTEL_SERVICE_NAME=second\0";
        let env = scan_environ(environ);
        assert_eq!(
            env,
            OtelEnvironment {
                service_name: Some("trainer".into()),
                resource_attributes: Some("team=ml,env=prod".into()),
            }
        );
        assert!(!format!("{env:?}").contains("hunter2"));
    }

    #[test]
    fn scan_empty_and_odd_environs() {
        assert_eq!(scan_environ(b""), OtelEnvironment::default());
        assert_eq!(
            scan_environ(b"\0\0=\0OTEL_SERVICE_NAME"),
            OtelEnvironment::default()
        );
        // Not UTF-8: unusable.
        assert_eq!(
            scan_environ(b"OTEL_SERVICE_NAME=\xff\xfe\0").service_name,
            None
        );
        // Empty value is a value (resolve_identity decides it means "unset").
        assert_eq!(
            scan_environ(b"OTEL_SERVICE_NAME=\0")
                .service_name
                .as_deref(),
            Some("")
        );
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    type Parsed = Result<Vec<(String, String)>, ResourceAttributesError>;

    #[test]
    fn resource_attributes_parse() {
        use ResourceAttributesError::*;
        let cases: Vec<(&str, Parsed)> = vec![
            ("", Ok(vec![])),
            ("a=1", Ok(pairs(&[("a", "1")]))),
            (
                "service.name=trainer,deployment.environment.name=prod",
                Ok(pairs(&[
                    ("service.name", "trainer"),
                    ("deployment.environment.name", "prod"),
                ])),
            ),
            (" a = 1 , b=2 ,", Ok(pairs(&[("a", "1"), ("b", "2")]))),
            ("a=1,,b=2", Ok(pairs(&[("a", "1"), ("b", "2")]))),
            ("a=", Ok(pairs(&[("a", "")]))),
            ("a=x%2Cy%3Dz", Ok(pairs(&[("a", "x,y=z")]))),
            ("k%3D=v", Ok(pairs(&[("k=", "v")]))),
            ("a=caf%C3%A9", Ok(pairs(&[("a", "café")]))),
            ("a=1=2", Ok(pairs(&[("a", "1=2")]))),
            ("a=1,b", Err(MissingEquals { index: 1 })),
            ("=1", Err(EmptyKey { index: 0 })),
            ("a=1, =2", Err(EmptyKey { index: 1 })),
            ("a=50%", Err(BadEscape { index: 0 })),
            ("a=1,b=%zz", Err(BadEscape { index: 1 })),
            ("a=%4", Err(BadEscape { index: 0 })),
            ("a=%FF", Err(NotUtf8 { index: 0 })),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_resource_attributes(input), expected, "{input:?}");
        }
    }

    #[test]
    fn service_name_precedence() {
        let env = |name: Option<&str>, attrs: Option<&str>| OtelEnvironment {
            service_name: name.map(str::to_string),
            resource_attributes: attrs.map(str::to_string),
        };
        let id = resolve_identity(&env(Some("a"), Some("service.name=b,x=1")));
        assert_eq!(id.service_name.as_deref(), Some("a"));
        assert_eq!(
            id.resource_attributes,
            pairs(&[("service.name", "b"), ("x", "1")])
        );

        let id = resolve_identity(&env(None, Some("service.name=b")));
        assert_eq!(id.service_name.as_deref(), Some("b"));

        let id = resolve_identity(&env(Some("  "), Some("service.name=b")));
        assert_eq!(id.service_name.as_deref(), Some("b"));

        let id = resolve_identity(&env(None, Some("service.name=b,broken")));
        assert_eq!(id.service_name, None);
        assert!(id.resource_attributes.is_empty());
        assert_eq!(
            id.attributes_error,
            Some(ResourceAttributesError::MissingEquals { index: 1 })
        );

        assert_eq!(resolve_identity(&env(None, None)), OtelIdentity::default());
    }

    #[test]
    fn error_messages_do_not_echo_the_value() {
        let err = parse_resource_attributes("token=abc%zzsecret").expect_err("bad escape");
        assert!(!err.to_string().contains("secret"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(value in "\\PC*", bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = parse_resource_attributes(&value);
            let _ = scan_environ(&bytes);
        }
    }

    /// Percent-encodes everything but ASCII letters and digits, as a careful writer would.
    fn encode_all(text: &str) -> String {
        text.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    proptest::proptest! {
        /// The two OTEL values are found wherever they are among any other entries, and no
        /// other entry's value ever comes out.
        #[test]
        fn scan_environ_finds_the_two_keys_and_nothing_else(
            others in proptest::collection::vec(("[A-Z_]{1,20}", "[^\u{0}]{0,30}"), 0..20),
            service in "[^\u{0}]{0,30}",
            attributes in "[^\u{0}]{0,60}",
            at in proptest::num::usize::ANY,
        ) {
            let mut entries: Vec<String> = others
                .iter()
                .filter(|(k, _)| k != OTEL_SERVICE_NAME && k != OTEL_RESOURCE_ATTRIBUTES)
                .map(|(k, v)| format!("{k}=SECRET{v}"))
                .collect();
            let n = entries.len() + 1;
            entries.insert(at % n, format!("{OTEL_SERVICE_NAME}={service}"));
            entries.insert((at / 3) % (n + 1), format!("{OTEL_RESOURCE_ATTRIBUTES}={attributes}"));
            let mut environ = entries.join("\0").into_bytes();
            environ.push(0);
            let found = scan_environ(&environ);
            proptest::prop_assert_eq!(found.service_name.as_deref(), Some(service.as_str()));
            proptest::prop_assert_eq!(found.resource_attributes.as_deref(), Some(attributes.as_str()));
        }

        /// Any keys and values, percent-encoded, decode back to themselves, in order.
        #[test]
        fn resource_attributes_round_trip(
            pairs in proptest::collection::vec(("\\PC{1,12}", "\\PC{0,20}"), 0..8),
        ) {
            let text = pairs
                .iter()
                .map(|(k, v)| format!("{}={}", encode_all(k), encode_all(v)))
                .collect::<Vec<_>>()
                .join(",");
            let parsed = parse_resource_attributes(&text).expect("an encoded list parses");
            proptest::prop_assert_eq!(parsed, pairs);
        }
    }
}
