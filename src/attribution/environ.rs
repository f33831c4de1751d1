//! The process's own OpenTelemetry identity and its place in a distributed job, from
//! `/proc/<pid>/environ`: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the launcher's job
//! variables (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, `MASTER_ADDR`, `MASTER_PORT`) and rank
//! variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `SLURM_PROCID`, `SLURM_LOCALID`,
//! `SLURM_NTASKS`), and nothing else.
//!
//! An environment holds secrets (tokens, passwords), so the scanner looks at each NUL-separated
//! entry only long enough to compare its key, copies out the values it wants and keeps,
//! returns and logs nothing else. The file shows the environment the process was started with
//! (`execve`), not later `setenv` calls, which is what an SDK reads at start-up too. The file is
//! read with gpulse's own permissions: another user's process (gpulse not root, no
//! `CAP_SYS_PTRACE`) gives permission denied, and that process then has no service name, job or
//! rank from its environment (its own spans, when a receiver hears them, still give job and rank).
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
//! `OTEL_RESOURCE_ATTRIBUTES` (the key the PyTorch companion puts on its resource), else the id
//! the companion derives from the same variables (examples/pytorch, `distributed.job_id`), so
//! that a rank gpulse knows only from its environment and one it hears from are in one job:
//! `TORCHELASTIC_RUN_ID` (torchrun's rendezvous id, equal on every rank of one run, on every
//! node; its placeholder `none`, the `--rdzv-id` default shared by every unrelated job on a node,
//! names no job), else `slurm-<SLURM_JOB_ID>`, else `<MASTER_ADDR>:<MASTER_PORT>` for a process
//! that has a rank. The companion's own evidence, when it reaches gpulse, outranks all of these
//! ([`super::Workload::adopt_companion_job_id`]).
//!
//! The rank, as the companion reads it before `init_process_group`: `RANK` (else
//! `SLURM_PROCID`) and `WORLD_SIZE` (else `SLURM_NTASKS`), both integers, else no rank;
//! `LOCAL_RANK` (else `SLURM_LOCALID`) when set. `pytorch.distributed.rank`/`.world_size`/
//! `.local_rank` in `OTEL_RESOURCE_ATTRIBUTES` outrank the variables.

use serde::Serialize;

use super::sent_identity::{JOB_ID, LOCAL_RANK, RANK, WORLD_SIZE};
use crate::schema::attributes::AttributeId as A;
use crate::values::{parse_resource_attributes, ResourceAttributesError};

pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
pub const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// torchrun's default `--rdzv-id`: not a job's name.
const TORCHELASTIC_PLACEHOLDER_RUN_ID: &str = "none";

/// The variables, raw, as the process was started with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelEnvironment {
    pub service_name: Option<String>,
    pub resource_attributes: Option<String>,
    pub torchelastic_run_id: Option<String>,
    pub slurm_job_id: Option<String>,
    pub master_addr: Option<String>,
    pub master_port: Option<String>,
    pub rank: Option<String>,
    pub local_rank: Option<String>,
    pub world_size: Option<String>,
    pub slurm_procid: Option<String>,
    pub slurm_localid: Option<String>,
    pub slurm_ntasks: Option<String>,
}

/// The keys scanned for, in the order of [`OtelEnvironment::slot`].
const WANTED: [&str; 12] = [
    OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES,
    TORCHELASTIC_RUN_ID,
    SLURM_JOB_ID,
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
];

impl OtelEnvironment {
    /// The field of `WANTED[index]`.
    fn slot(&mut self, index: usize) -> &mut Option<String> {
        match index {
            0 => &mut self.service_name,
            1 => &mut self.resource_attributes,
            2 => &mut self.torchelastic_run_id,
            3 => &mut self.slurm_job_id,
            4 => &mut self.master_addr,
            5 => &mut self.master_port,
            6 => &mut self.rank,
            7 => &mut self.local_rank,
            8 => &mut self.world_size,
            9 => &mut self.slurm_procid,
            10 => &mut self.slurm_localid,
            _ => &mut self.slurm_ntasks,
        }
    }
}

/// Picks the wanted variables out of the bytes of an `environ` file. When a key appears twice
/// the first one wins, as glibc's `getenv` (and so the SDK in the process) would see it.
pub(crate) fn scan_environ(environ: &[u8]) -> OtelEnvironment {
    let mut found = OtelEnvironment::default();
    let mut missing = WANTED.len();
    for entry in environ.split(|b| *b == 0) {
        let Some((index, value)) = WANTED
            .iter()
            .enumerate()
            .find_map(|(index, key)| value_of(entry, key).map(|value| (index, value)))
        else {
            continue;
        };
        let slot = found.slot(index);
        if slot.is_none() {
            // Not UTF-8: the SDK in the process could not have used it either.
            *slot = std::str::from_utf8(value).ok().map(str::to_string);
            missing -= usize::from(slot.is_some());
        }
        if missing == 0 {
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
    /// `SLURM_JOB_ID` in the process's environment (as `slurm-<id>`).
    Slurm,
    /// `MASTER_ADDR:MASTER_PORT` of a process with a rank.
    Master,
}

impl JobIdSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Companion => "companion",
            Self::ResourceAttributes => "resource_attributes",
            Self::TorchElastic => "torchelastic",
            Self::Slurm => "slurm",
            Self::Master => "master",
        }
    }
}

/// A job id and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobId {
    pub id: String,
    pub source: JobIdSource,
}

/// A process's place in its distributed job, as its launcher's variables (or its
/// `OTEL_RESOURCE_ATTRIBUTES`) give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EnvRank {
    /// `pytorch.distributed.rank`: `RANK`, else `SLURM_PROCID`.
    pub rank: u32,
    /// `pytorch.distributed.world_size`: `WORLD_SIZE`, else `SLURM_NTASKS`.
    pub world_size: u32,
    /// `pytorch.distributed.local_rank`: `LOCAL_RANK`, else `SLURM_LOCALID`.
    pub local_rank: Option<u32>,
}

/// What the process says about itself, resolved: `service.name`, its other attributes, its
/// job and its rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OtelIdentity {
    /// `OTEL_SERVICE_NAME` when set and not empty, else `service.name` from the attributes.
    pub service_name: Option<String>,
    /// The parsed attributes, in order (including any `service.name`); empty when absent or
    /// discarded.
    pub resource_attributes: Vec<(String, String)>,
    /// Set when `OTEL_RESOURCE_ATTRIBUTES` was present but discarded.
    pub attributes_error: Option<ResourceAttributesError>,
    /// The job the process belongs to (see the module's documentation for the order).
    pub job: Option<JobId>,
    /// Its rank in that job, when its environment gives one.
    pub rank: Option<EnvRank>,
}

/// Applies the specification's precedence: `OTEL_SERVICE_NAME` over `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`.
pub(crate) fn resolve_identity(env: &OtelEnvironment) -> OtelIdentity {
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
                .find(|(key, value)| key == A::ServiceName.key() && !value.is_empty())
                .map(|(_, value)| value.clone())
        });
    let rank = rank_of(env, &resource_attributes);
    let job = job_of(env, &resource_attributes, rank.is_some());
    OtelIdentity {
        service_name,
        resource_attributes,
        attributes_error,
        job,
        rank,
    }
}

/// The trimmed value when it is not blank.
fn named(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// The value of the attribute `key`, when set and not blank.
fn attribute(resource_attributes: &[(String, String)], key: &str) -> Option<String> {
    resource_attributes
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, value)| named(value))
}

/// The job id, in the module's order; blank values and torchrun's placeholder name no job.
/// `has_rank`: only a rank's `MASTER_ADDR:MASTER_PORT` names a job (the companion's rule).
fn job_of(
    env: &OtelEnvironment,
    resource_attributes: &[(String, String)],
    has_rank: bool,
) -> Option<JobId> {
    let var = |value: &Option<String>| value.as_deref().and_then(named);
    let from_attributes =
        attribute(resource_attributes, JOB_ID).map(|id| (id, JobIdSource::ResourceAttributes));
    let from_torchelastic = || {
        var(&env.torchelastic_run_id)
            .filter(|id| !id.eq_ignore_ascii_case(TORCHELASTIC_PLACEHOLDER_RUN_ID))
            .map(|id| (id, JobIdSource::TorchElastic))
    };
    let from_slurm =
        || var(&env.slurm_job_id).map(|id| (format!("slurm-{id}"), JobIdSource::Slurm));
    let from_master = || match (var(&env.master_addr), var(&env.master_port)) {
        (Some(addr), Some(port)) if has_rank => {
            Some((format!("{addr}:{port}"), JobIdSource::Master))
        }
        _ => None,
    };
    from_attributes
        .or_else(from_torchelastic)
        .or_else(from_slurm)
        .or_else(from_master)
        .map(|(id, source)| JobId { id, source })
}

/// The rank, in the module's order: the first of the names that is set and an integer, as the
/// companion's `_int` reads them.
fn rank_of(env: &OtelEnvironment, resource_attributes: &[(String, String)]) -> Option<EnvRank> {
    let number = |attr: &str, vars: [&Option<String>; 2]| {
        attribute(resource_attributes, attr)
            .and_then(|value| value.parse::<u32>().ok())
            .or_else(|| {
                vars.into_iter()
                    .find_map(|value| value.as_deref()?.trim().parse::<u32>().ok())
            })
    };
    Some(EnvRank {
        rank: number(RANK, [&env.rank, &env.slurm_procid])?,
        world_size: number(WORLD_SIZE, [&env.world_size, &env.slurm_ntasks])?,
        local_rank: number(LOCAL_RANK, [&env.local_rank, &env.slurm_localid]),
    })
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
        assert_eq!(env(None, None, Some(" 9 ")), job("slurm-9", Slurm));
        // torchrun's placeholder (in any case) and blank values name no job: the next source
        // answers.
        assert_eq!(env(None, Some("none"), Some("9")), job("slurm-9", Slurm));
        assert_eq!(env(None, Some("None"), Some("9")), job("slurm-9", Slurm));
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
            job("slurm-9", Slurm)
        );
        assert_eq!(env(None, None, None), None);
    }

    fn identity_of(vars: &[(&str, &str)]) -> OtelIdentity {
        let mut environ = Vec::new();
        for (key, value) in vars {
            environ.extend_from_slice(format!("{key}={value}\0").as_bytes());
        }
        resolve_identity(&scan_environ(&environ))
    }

    /// The job ids of the companion's own tests (examples/pytorch/tests/test_distributed.py,
    /// `distributed.job_id`), so a rank known from its environment and one heard from are in
    /// the same job.
    #[test]
    fn the_job_id_equals_the_companions() {
        let master = [("MASTER_ADDR", "10.0.0.7"), ("MASTER_PORT", "29500")];
        let rank = [("RANK", "3"), ("WORLD_SIZE", "8")];
        let job = |extra: &[(&str, &str)]| {
            let vars: Vec<_> = master.iter().chain(&rank).chain(extra).copied().collect();
            identity_of(&vars).job.map(|job| job.id)
        };
        assert_eq!(job(&[]).as_deref(), Some("10.0.0.7:29500"));
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "run-42")]).as_deref(),
            Some("run-42")
        );
        assert_eq!(
            job(&[("TORCHELASTIC_RUN_ID", "none")]).as_deref(),
            Some("10.0.0.7:29500")
        );
        assert_eq!(
            job(&[("SLURM_JOB_ID", "9917")]).as_deref(),
            Some("slurm-9917")
        );
        // The master address alone (no rank) names no job, as in the companion.
        assert_eq!(identity_of(&master).job, None);
        assert_eq!(
            identity_of(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1"), ("RANK", "0")]).job,
            None
        );
    }

    #[test]
    fn the_rank_comes_from_the_launchers_variables() {
        let rank = |vars: &[(&str, &str)]| identity_of(vars).rank;
        let torchrun = [("RANK", "5"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "16")];
        assert_eq!(
            rank(&torchrun),
            Some(EnvRank {
                rank: 5,
                world_size: 16,
                local_rank: Some(1)
            })
        );
        let slurm = [
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS", "16"),
        ];
        assert_eq!(rank(&slurm), rank(&torchrun));
        // RANK outranks SLURM_PROCID; one that is not an integer passes to the next.
        assert_eq!(
            rank(&[("SLURM_PROCID", "9"), ("RANK", "2"), ("WORLD_SIZE", "4")]).map(|r| r.rank),
            Some(2)
        );
        assert_eq!(
            rank(&[("RANK", "x"), ("SLURM_PROCID", " 9 "), ("WORLD_SIZE", "16")]).map(|r| r.rank),
            Some(9)
        );
        // A rank without a world size (or the reverse) is no rank, as in the companion.
        assert_eq!(rank(&[("RANK", "0"), ("LOCAL_RANK", "0")]), None);
        assert_eq!(rank(&[("WORLD_SIZE", "4")]), None);
        // The process's own attributes outrank the variables.
        assert_eq!(
            rank(&[
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "pytorch.distributed.rank=7,pytorch.distributed.world_size=8"
                ),
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
            ]),
            Some(EnvRank {
                rank: 7,
                world_size: 8,
                local_rank: None
            })
        );
        assert_eq!(rank(&[]), None);
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
