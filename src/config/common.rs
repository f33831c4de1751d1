//! Resolving the settings every command resolves the same way, whatever it then builds
//! ([`CommonSettings`]): the NVML library, logging (level filter and format), and the analysis
//! settings: what attribution reads (the procfs root, command lines, `environ`, the kubelet
//! socket), the diagnosis thresholds of the file, gpulse's own pod and the prices. Also the
//! node's resource (`service.name` and the other attributes, from flags, `OTEL_*` and the file),
//! which `run` and `record` resolve for their exporter.

use std::path::PathBuf;

use super::cost;
use super::defaults::{
    DEFAULT_INCLUDE_COMMAND_LINE, DEFAULT_KUBELET_SOCKET, DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL,
    DEFAULT_NVML_LIB, DEFAULT_PROC_ROOT, DEFAULT_READ_ENVIRON, DEFAULT_SERVICE_NAME,
};
use super::downward::DownwardApi;
use super::env;
use super::error::{ConfigError, Origin, Raw};
use super::file::{self, FileConfig};
use super::layers::{first, Layers};
use super::settings::{AnalysisSettings, CommonSettings, LogFormat, LogSettings};
use super::thresholds::Thresholds;
use crate::cli::{CostArgs, GlobalArgs, RunArgs};
use crate::schema::attributes::AttributeId as A;
use crate::values;

impl CommonSettings {
    /// `run` carries the attribution flags (`snapshot`, `check` and `top` pass the defaults) and
    /// `cost` the prices.
    pub(super) fn resolve(
        global: &GlobalArgs,
        run: &RunArgs,
        cost: &CostArgs,
        layers: &Layers<'_>,
    ) -> Result<CommonSettings, ConfigError> {
        let nvml_lib = first([
            global.nvml_lib.as_ref().map(|p| Raw {
                text: p.display().to_string(),
                origin: Origin::Flag("--nvml-lib"),
            }),
            layers.env(env::NVML_LIB),
            layers.file("nvml_lib", |f| &f.nvml_lib),
        ])
        .map_or_else(
            || PathBuf::from(DEFAULT_NVML_LIB),
            |raw| PathBuf::from(raw.text),
        );

        let level = first([
            Layers::flag("--log-level", global.log_level.as_deref()),
            layers.env(env::LOG),
            layers.env(env::RUST_LOG),
            layers.file("log.level", |f| &f.log.level),
        ]);
        let filter = match level {
            Some(raw) => {
                raw.parse(parse_log_filter)?;
                raw.text.trim().to_string()
            }
            None => DEFAULT_LOG_LEVEL.to_string(),
        };
        let format = match first([
            Layers::flag("--log-format", global.log_format.as_deref()),
            layers.env(env::LOG_FORMAT),
            layers.file("log.format", |f| &f.log.format),
        ]) {
            None => DEFAULT_LOG_FORMAT,
            Some(raw) => match raw.text.trim() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                _ => return Err(raw.invalid("expected text or json")),
            },
        };

        let proc_root = match first([
            run.proc_root.as_ref().map(|p| Raw {
                text: p.display().to_string(),
                origin: Origin::Flag("--proc-root"),
            }),
            layers.env(env::PROC_ROOT),
            layers.env(env::HOST_PROC),
            layers.file("proc_root", |f| &f.proc_root),
        ]) {
            Some(raw) => {
                let path = PathBuf::from(raw.text.trim());
                if !path.is_dir() {
                    return Err(ConfigError::NotFound {
                        setting: raw.setting(),
                        what: "directory (mount the host's /proc there, read-only)",
                    });
                }
                path
            }
            None => PathBuf::from(DEFAULT_PROC_ROOT),
        };

        let include_command_line = bool_setting(
            Layers::switch("--include-command-line", run.include_command_line, true),
            layers,
            env::INCLUDE_COMMAND_LINE,
            "include_command_line",
            |f| &f.include_command_line,
            DEFAULT_INCLUDE_COMMAND_LINE,
        )?;
        let read_environ = bool_setting(
            Layers::switch("--no-read-environ", run.no_read_environ, false),
            layers,
            env::READ_ENVIRON,
            "read_environ",
            |f| &f.read_environ,
            DEFAULT_READ_ENVIRON,
        )?;

        let kubelet_socket = match first([
            Layers::flag("--kubelet-socket", run.kubelet_socket.as_deref()),
            layers.env(env::KUBELET_SOCKET),
            layers.file("kubelet_socket", |f| &f.kubelet_socket),
        ]) {
            Some(raw) if raw.text.trim().eq_ignore_ascii_case("none") => None,
            Some(raw) if raw.text.trim().is_empty() => {
                return Err(raw.invalid("empty path; expected a socket path or none"))
            }
            Some(raw) => Some(PathBuf::from(raw.text.trim())),
            None => Some(PathBuf::from(DEFAULT_KUBELET_SOCKET)),
        };

        let diagnosis = match layers.file {
            Some(file) => {
                let thresholds = file.config.diagnosis.clone();
                thresholds
                    .validate()
                    .map_err(|source| ConfigError::Diagnosis {
                        path: file.path.clone(),
                        source,
                    })?;
                thresholds
            }
            None => Thresholds::default(),
        };

        Ok(CommonSettings {
            config_file: layers.file.map(|f| f.path.clone()),
            nvml_lib,
            log: LogSettings { filter, format },
            analysis: AnalysisSettings {
                proc_root,
                include_command_line,
                read_environ,
                kubelet_socket,
                diagnosis,
                downward: DownwardApi::from_env(layers.env),
                prices: cost::resolve(cost, layers)?,
            },
            metrics: super::metrics::resolve(layers)?,
        })
    }
}

pub(super) fn bool_setting(
    flag: Option<Raw>,
    layers: &Layers<'_>,
    var: &str,
    key: &str,
    field: fn(&FileConfig) -> &file::Value,
    default: bool,
) -> Result<bool, ConfigError> {
    match first([flag, layers.env(var), layers.file(key, field)]) {
        Some(raw) => raw.parse(values::parse_bool),
        None => Ok(default),
    }
}

/// `service.name` and the other node-resource attributes.
pub(super) fn resource(
    run: &RunArgs,
    layers: &Layers<'_>,
    warnings: &mut Vec<String>,
) -> Result<(String, Vec<(String, String)>), ConfigError> {
    let mut attributes: std::collections::BTreeMap<String, String> = layers
        .file
        .map(|f| f.config.resource_attributes.clone())
        .unwrap_or_default();
    let mut from_env_service_name = None;
    if let Some(raw) = layers.env(env::OTEL_RESOURCE_ATTRIBUTES) {
        match values::parse_resource_attributes(&raw.text) {
            Ok(list) => {
                for (key, value) in list {
                    if key == A::ServiceName.key() {
                        from_env_service_name = Some(value);
                    } else {
                        attributes.insert(key, value);
                    }
                }
            }
            // The specification: discard the whole value and report the error, do not fail.
            Err(error) => warnings.push(format!(
                "{error}. Expected key=value pairs separated by commas, values percent-encoded"
            )),
        }
    }
    let file_service_name = attributes.remove(A::ServiceName.key());
    let service_name = first([
        Layers::flag("--service-name", run.service_name.as_deref()),
        layers.env(env::SERVICE_NAME),
        layers.env(env::OTEL_SERVICE_NAME),
        from_env_service_name.map(|text| Raw {
            text,
            origin: Origin::Env(env::OTEL_RESOURCE_ATTRIBUTES.into()),
        }),
        layers.file("service_name", |f| &f.service_name),
        file_service_name.zip(layers.file).map(|(text, file)| Raw {
            text,
            origin: file.table_origin("resource_attributes.\"service.name\""),
        }),
    ]);
    let service_name = match service_name {
        Some(raw) if raw.text.trim().is_empty() => {
            return Err(raw.invalid("empty service name; expected e.g. gpulse"))
        }
        Some(raw) => raw.text.trim().to_string(),
        None => DEFAULT_SERVICE_NAME.to_string(),
    };
    Ok((service_name, attributes.into_iter().collect()))
}

fn parse_log_filter(text: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(text.trim())
        .map(|_| ())
        .map_err(|e| {
            format!(
                "not a log filter ({e}); expected a level (error, warn, info, debug, trace) or \
                 RUST_LOG directives such as info,gpulse=debug"
            )
        })
}
