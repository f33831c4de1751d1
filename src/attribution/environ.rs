//! The process's own OpenTelemetry identity and job, from `/proc/<pid>/environ`:
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `TORCHELASTIC_RUN_ID` and `SLURM_JOB_ID`, and
//! nothing else.
//!
//! An environment holds secrets (tokens, passwords), so the scanner looks at each NUL-separated
//! entry only long enough to compare its key, copies out the four values it wants and keeps,
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
//!
//! The job a process belongs to is, in order: `pytorch.distributed.job.id` in its
//! `OTEL_RESOURCE_ATTRIBUTES` (the key the PyTorch companion puts on its resource), else
//! `TORCHELASTIC_RUN_ID` (torchrun's rendezvous id, equal on every rank of one run, on every
//! node), else `SLURM_JOB_ID`. torchrun's placeholder run id `none` (its `--rdzv-id` default,
//! the same for every unrelated job on a node) names no job and is passed over. The
//! companion's own evidence, when it reaches gpulse, outranks all of these
//! ([`super::Workload::adopt_companion_job_id`]).

use serde::Serialize;

use crate::values::{parse_resource_attributes, ResourceAttributesError};

pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
pub const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// The resource attribute the PyTorch companion names its job with.
pub const COMPANION_JOB_ID_ATTRIBUTE: &str = "pytorch.distributed.job.id";
/// torchrun's default `--rdzv-id`: not a job's name.
const TORCHELASTIC_PLACEHOLDER_RUN_ID: &str = "none";

/// The four variables, raw, as the process was started with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelEnvironment {
    pub service_name: Option<String>,
    pub resource_attributes: Option<String>,
    pub torchelastic_run_id: Option<String>,
    pub slurm_job_id: Option<String>,
}

impl OtelEnvironment {
    fn slot(&mut self, key: &str) -> &mut Option<String> {
        match key {
            OTEL_SERVICE_NAME => &mut self.service_name,
            OTEL_RESOURCE_ATTRIBUTES => &mut self.resource_attributes,
            TORCHELASTIC_RUN_ID => &mut self.torchelastic_run_id,
            _ => &mut self.slurm_job_id,
        }
    }

    fn complete(&self) -> bool {
        self.service_name.is_some()
            && self.resource_attributes.is_some()
            && self.torchelastic_run_id.is_some()
            && self.slurm_job_id.is_some()
    }
}

const WANTED: [&str; 4] = [
    OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES,
    TORCHELASTIC_RUN_ID,
    SLURM_JOB_ID,
];

/// Picks the four variables out of the bytes of an `environ` file. When a key appears twice
/// the first one wins, as glibc's `getenv` (and so the SDK in the process) would see it.
pub fn scan_environ(environ: &[u8]) -> OtelEnvironment {
    let mut found = OtelEnvironment::default();
    for entry in environ.split(|b| *b == 0) {
        let Some((key, value)) = WANTED
            .iter()
            .find_map(|key| value_of(entry, key).map(|value| (*key, value)))
        else {
            continue;
        };
        let slot = found.slot(key);
        if slot.is_none() {
            // Not UTF-8: the SDK in the process could not have used it either.
            *slot = std::str::from_utf8(value).ok().map(str::to_string);
        }
        if found.complete() {
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

/// Where a process's job id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobIdSource {
    /// The PyTorch companion's `pytorch.distributed.job.id`, from its telemetry.
    Companion,
    /// `pytorch.distributed.job.id` in the process's `OTEL_RESOURCE_ATTRIBUTES`.
    ResourceAttributes,
    /// `TORCHELASTIC_RUN_ID` in the process's environment.
    TorchElastic,
    /// `SLURM_JOB_ID` in the process's environment.
    Slurm,
}

impl JobIdSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Companion => "companion",
            Self::ResourceAttributes => "resource_attributes",
            Self::TorchElastic => "torchelastic",
            Self::Slurm => "slurm",
        }
    }
}

/// A job id and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobId {
    pub id: String,
    pub source: JobIdSource,
}

/// What the process says about itself, resolved: `service.name`, its other attributes and its
/// job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelIdentity {
    /// `OTEL_SERVICE_NAME` when set and not empty, else `service.name` from the attributes.
    pub service_name: Option<String>,
    /// The parsed attributes, in order (including any `service.name`); empty when absent or
    /// discarded.
    pub resource_attributes: Vec<(String, String)>,
    /// Set when `OTEL_RESOURCE_ATTRIBUTES` was present but discarded.
    pub attributes_error: Option<ResourceAttributesError>,
    /// The job the process belongs to (see the module's documentation for the order).
    pub job: Option<JobId>,
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
    let job = job_of(env, &resource_attributes);
    OtelIdentity {
        service_name,
        resource_attributes,
        attributes_error,
        job,
    }
}

/// The job id, in the module's order; blank values and torchrun's placeholder name no job.
fn job_of(env: &OtelEnvironment, resource_attributes: &[(String, String)]) -> Option<JobId> {
    let named = |value: &str| {
        let value = value.trim();
        (!value.is_empty()).then(|| value.to_string())
    };
    let from_attributes = resource_attributes
        .iter()
        .find(|(key, _)| key == COMPANION_JOB_ID_ATTRIBUTE)
        .and_then(|(_, value)| named(value))
        .map(|id| (id, JobIdSource::ResourceAttributes));
    let from_torchelastic = || {
        env.torchelastic_run_id
            .as_deref()
            .and_then(named)
            .filter(|id| id != TORCHELASTIC_PLACEHOLDER_RUN_ID)
            .map(|id| (id, JobIdSource::TorchElastic))
    };
    let from_slurm = || {
        env.slurm_job_id
            .as_deref()
            .and_then(named)
            .map(|id| (id, JobIdSource::Slurm))
    };
    from_attributes
        .or_else(from_torchelastic)
        .or_else(from_slurm)
        .map(|(id, source)| JobId { id, source })
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
                ..OtelEnvironment::default()
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
            ..OtelEnvironment::default()
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
    fn scan_finds_the_job_variables_and_keeps_the_first() {
        let environ = b"SLURM_JOB_ID=4242\0SLURM_JOB_IDX=no\0SLURM_JOB_NAME=secret-name\0\
            TORCHELASTIC_RUN_ID=run-7\0TORCHELASTIC_RUN_ID=run-8\0SLURM_JOB_ID=4343\0";
        let env = scan_environ(environ);
        assert_eq!(env.slurm_job_id.as_deref(), Some("4242"));
        assert_eq!(env.torchelastic_run_id.as_deref(), Some("run-7"));
        assert_eq!(env.service_name, None);
        assert!(!format!("{env:?}").contains("secret-name"));
    }

    #[test]
    fn job_id_order_of_sources() {
        let env = |attrs: Option<&str>, torchelastic: Option<&str>, slurm: Option<&str>| {
            resolve_identity(&OtelEnvironment {
                resource_attributes: attrs.map(str::to_string),
                torchelastic_run_id: torchelastic.map(str::to_string),
                slurm_job_id: slurm.map(str::to_string),
                ..OtelEnvironment::default()
            })
            .job
            .map(|job| (job.id, job.source))
        };
        let job = |id: &str, source| Some((id.to_string(), source));
        use JobIdSource::*;
        assert_eq!(
            env(Some("pytorch.distributed.job.id=j1"), Some("r1"), Some("9")),
            job("j1", ResourceAttributes)
        );
        assert_eq!(
            env(Some("team=ml"), Some("r1"), Some("9")),
            job("r1", TorchElastic)
        );
        assert_eq!(env(None, None, Some(" 9 ")), job("9", Slurm));
        // torchrun's placeholder and blank values name no job: the next source answers.
        assert_eq!(env(None, Some("none"), Some("9")), job("9", Slurm));
        assert_eq!(
            env(Some("pytorch.distributed.job.id="), Some(" "), None),
            None
        );
        assert_eq!(env(None, Some("none"), None), None);
        // A discarded attribute list gives no job id either.
        assert_eq!(
            env(
                Some("pytorch.distributed.job.id=j1,broken"),
                None,
                Some("9")
            ),
            job("9", Slurm)
        );
        assert_eq!(env(None, None, None), None);
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
