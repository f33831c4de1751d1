//! What can be wrong with gpulse's configuration, and where each value came from ([`Origin`]),
//! so that every message names the flag, variable or file key (with file, line and column) that
//! must change, says what is wrong and what a valid value looks like.

use std::path::PathBuf;

use crate::values::ListEntryError;

/// A configuration problem. Every variant's message names the setting to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file named by `--config` / `GPULSE_CONFIG` could not be read.
    #[error(
        "cannot read config file {path} (given by {given_by}): {source}; fix the path or unset it"
    )]
    ReadFile {
        path: PathBuf,
        /// `--config` or `GPULSE_CONFIG`.
        given_by: String,
        #[source]
        source: std::io::Error,
    },

    /// The config file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("{path}:{line}:{column}: {message}")]
    File {
        path: PathBuf,
        /// 1-based; 0 when the parser gave no position.
        line: usize,
        /// 1-based, in characters.
        column: usize,
        message: String,
    },

    /// A value that does not parse or is out of range. `setting` reads like
    /// `--sample-interval 10ms` or `OTEL_EXPORTER_OTLP_PROTOCOL="grpcc"` or
    /// `sample_interval = "10ms" (/etc/gpulse.toml:3:19)`.
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },

    /// A file a setting points at (a TLS certificate or key, the proc root) is not there.
    #[error("{setting}: {what} not found; mount it or fix the path")]
    NotFound {
        setting: String,
        /// "file" or "directory".
        what: &'static str,
    },

    /// A dcgm-exporter counters file (`--dcgm-counters`) that cannot be used.
    #[error(transparent)]
    DcgmCounters(#[from] super::dcgm_counters::CountersError),

    /// A `[diagnosis]` value that makes a rule meaningless.
    #[error("{path}: {source}")]
    Diagnosis {
        path: PathBuf,
        #[source]
        source: super::thresholds::ThresholdsError,
    },

    /// A malformed entry in a `key=value,...` list. Names the variable and the entry's position
    /// (and key when readable), never the value: header values carry tokens.
    #[error(
        "{setting}: {entry}; expected comma-separated key=value pairs with percent-encoded values, \
         e.g. api-key=abc123,x-tenant=team%20a"
    )]
    List {
        /// The variable, flag or file key, without its value.
        setting: String,
        entry: ListEntryError,
    },
}

/// Where a value came from, in precedence order (flags > environment > file > defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag, e.g. `--sample-interval`.
    Flag(&'static str),
    /// An environment variable.
    Env(String),
    /// A config-file key, e.g. `otlp.metrics.endpoint`, with `path:line:column`.
    File { key: String, location: String },
    /// gpulse's built-in default for the named setting.
    Default(&'static str),
}

impl Origin {
    pub(crate) fn is_env(&self) -> bool {
        matches!(self, Origin::Env(_))
    }

    /// Names the setting without its value, for errors about secrets.
    pub fn name(&self) -> String {
        match self {
            Origin::Flag(flag) => flag.to_string(),
            Origin::Env(var) => var.clone(),
            Origin::File { key, location } => format!("{key} ({location})"),
            Origin::Default(what) => format!("default {what}"),
        }
    }

    /// Names the setting together with the value it was given.
    pub(crate) fn with_value(&self, text: &str) -> String {
        match self {
            Origin::Flag(flag) => format!("{flag} {text}"),
            Origin::Env(var) => format!("{var}={text:?}"),
            Origin::File { key, location } => format!("{key} = {text:?} ({location})"),
            Origin::Default(what) => format!("default {what} {text}"),
        }
    }
}

/// One setting's winning value, as text, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub text: String,
    pub origin: Origin,
}

impl Raw {
    /// The setting and its value, for messages: `--sample-interval 10ms`.
    pub fn setting(&self) -> String {
        self.origin.with_value(&self.text)
    }

    /// An [`ConfigError::Invalid`] about this value.
    pub fn invalid(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            setting: self.setting(),
            reason: reason.into(),
        }
    }

    /// Parses the text, turning the parser's reason into an error naming this setting.
    pub fn parse<T>(
        &self,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        parse(&self.text).map_err(|reason| self.invalid(reason))
    }
}
