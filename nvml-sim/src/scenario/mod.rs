//! Scenario files: loading one (from `NVML_SIM_SCENARIO` or the built-in default), the errors a
//! bad one gives (pointing at a line and column and showing it), and [`compile`], which turns the
//! TOML (documented for humans in `nvml-sim/README.md`) into a [`Sim`]: the `[driver]` and
//! `[clock]` tables and the events here, the schema as written in `schema`, devices and their
//! derived identities in `device`, processes and their PIDs in `process`, hardware sections
//! (GPM, MIG, NVLink, violation timers) in `hardware`, faults and their function masks in
//! `fault`.

use std::ops::Range;

use crate::abi::{self, Ret};
use crate::model::{Clock, FaultSet, Sim, SimEvent};

mod device;
mod fault;
mod hardware;
mod process;
mod schema;

pub use device::parse_bus_id;
use schema::{CudaVersion, RawClock, RawScenario};

/// The environment variable naming the scenario file.
pub const ENV_SCENARIO: &str = "NVML_SIM_SCENARIO";
/// Multiplies the speed of simulated time (float, default 1).
pub const ENV_TIME_SCALE: &str = "NVML_SIM_TIME_SCALE";
/// Simulated seconds already elapsed at the first init (float, default 0).
pub const ENV_START_OFFSET: &str = "NVML_SIM_START_OFFSET";

/// The built-in scenario (the same text as `scenarios/default.toml`).
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.toml");

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file named by `NVML_SIM_SCENARIO` could not be read.
    #[error(
        "nvml-sim: cannot read scenario file {path} (named by {ENV_SCENARIO}): {source}; \
         fix the path, or unset {ENV_SCENARIO} to use the built-in 2-GPU scenario"
    )]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or not a valid scenario.
    #[error("nvml-sim: scenario {origin}{}: {message}{}", fmt_location(.line, .column), fmt_snippet(.snippet))]
    Invalid {
        origin: String,
        /// 1-based; 0 when the error has no position.
        line: usize,
        column: usize,
        message: String,
        snippet: String,
    },
    /// An `NVML_SIM_*` environment variable has a value that cannot be used.
    #[error("nvml-sim: environment variable {var}={value:?} is invalid: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
}

fn fmt_location(line: &usize, column: &usize) -> String {
    if *line == 0 {
        String::new()
    } else {
        format!(" line {line}, column {column}")
    }
}

fn fmt_snippet(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("\n    | {s}")
    }
}

impl ScenarioError {
    fn at(origin: &str, text: &str, span: Option<Range<usize>>, message: String) -> Self {
        let (line, column, snippet) = match span {
            Some(r) => {
                let start = r.start.min(text.len());
                let before = &text[..start];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = text[line_start..start].chars().count() + 1;
                let line_text = text[line_start..].lines().next().unwrap_or("").trim_end();
                (line, column, line_text.to_string())
            }
            None => (0, 0, String::new()),
        };
        ScenarioError::Invalid {
            origin: origin.to_string(),
            line,
            column,
            message,
            snippet,
        }
    }
}

/// The environment the scenario is compiled against (injectable so tests need not touch the
/// process environment).
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// Loads the scenario named by `NVML_SIM_SCENARIO` (or the built-in one) from the process
/// environment.
pub fn load_from_env() -> Result<Sim, ScenarioError> {
    match std::env::var(ENV_SCENARIO) {
        Ok(path) if !path.is_empty() => {
            let text = std::fs::read_to_string(&path).map_err(|source| ScenarioError::Read {
                path: path.clone(),
                source,
            })?;
            compile(&path, &text, &ProcessEnv)
        }
        _ => compile("built-in default", DEFAULT_SCENARIO, &ProcessEnv),
    }
}

/// Parses and compiles a scenario. `origin` names it in error messages.
pub fn compile(origin: &str, text: &str, env: &dyn Env) -> Result<Sim, ScenarioError> {
    let raw: RawScenario = toml::from_str(text)
        .map_err(|e| ScenarioError::at(origin, text, e.span(), e.message().to_string()))?;
    let err = |span: Range<usize>, msg: String| ScenarioError::at(origin, text, Some(span), msg);

    let clock = compile_clock(&raw.clock, env)?;
    let driver = &raw.driver;
    let cuda_version = match &driver.cuda_version {
        None => 12080,
        Some(v) => parse_cuda_version(v.get_ref()).map_err(|m| err(v.span(), m))?,
    };
    let process_sample_period = driver.process_sample_period_ms.unwrap_or(100.0) / 1000.0;
    if process_sample_period <= 0.0 || !process_sample_period.is_finite() {
        return Err(ScenarioError::at(
            origin,
            text,
            None,
            "[driver] process_sample_period_ms must be a positive number of milliseconds".into(),
        ));
    }

    let mut devices = Vec::new();
    for d in &raw.devices {
        device::expand_device(d.get_ref(), &mut devices, env).map_err(|m| err(d.span(), m))?;
    }
    device::check_unique(&devices).map_err(|m| ScenarioError::at(origin, text, None, m))?;
    let n = devices.len() as u32;

    let mut events = Vec::new();
    for e in &raw.events {
        let ev = e.get_ref();
        if ev.device >= n {
            return Err(err(e.span(), no_such_device(ev.device, n)));
        }
        if !ev.at_s.is_finite() {
            return Err(err(
                e.span(),
                "event `at_s` must be a finite number of seconds".into(),
            ));
        }
        events.push(SimEvent {
            at: ev.at_s,
            device: ev.device,
            event_type: ev.kind.bits(),
            data: ev.data,
        });
    }

    let mut system_faults = FaultSet::default();
    let mut init_fault = None;
    let mut driver_gone = Vec::new();
    for f in &raw.faults {
        fault::compile_fault(
            f.get_ref(),
            &mut devices,
            &mut system_faults,
            &mut init_fault,
            &mut driver_gone,
        )
        .map_err(|m| err(f.span(), m))?;
    }

    Ok(Sim::new(
        origin.to_string(),
        driver
            .version
            .clone()
            .unwrap_or_else(|| "570.124.06".into()),
        driver
            .nvml_version
            .clone()
            .unwrap_or_else(|| "12.570.124.06".into()),
        cuda_version,
        process_sample_period,
        clock,
        devices,
        events,
        system_faults,
        init_fault,
        driver_gone,
    ))
}

fn compile_clock(raw: &RawClock, env: &dyn Env) -> Result<Clock, ScenarioError> {
    let from_env = |var: &'static str| -> Result<Option<f64>, ScenarioError> {
        match env.var(var) {
            None => Ok(None),
            Some(v) if v.trim().is_empty() => Ok(None),
            Some(v) => match v.trim().parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(ScenarioError::Env {
                    var,
                    value: v,
                    reason: "expected a number".into(),
                }),
            },
        }
    };
    let scale = from_env(ENV_TIME_SCALE)?.or(raw.time_scale).unwrap_or(1.0);
    if scale <= 0.0 || !scale.is_finite() {
        return Err(ScenarioError::Env {
            var: ENV_TIME_SCALE,
            value: scale.to_string(),
            reason: "the time scale must be > 0 (1 = real time, 60 = a minute per second)".into(),
        });
    }
    let offset = from_env(ENV_START_OFFSET)?
        .or(raw.start_offset_s)
        .unwrap_or(0.0);
    Ok(Clock::new(scale, offset, raw.freeze_at_s))
}

fn parse_cuda_version(v: &CudaVersion) -> Result<i32, String> {
    match v {
        CudaVersion::Number(n) if (1000..=99_999).contains(n) => Ok(*n as i32),
        CudaVersion::Number(n) => Err(format!(
            "cuda_version {n} is not a CUDA version number; write \"12.8\" or 12080"
        )),
        CudaVersion::Text(s) => {
            let mut parts = s.trim().split('.');
            let major = parts.next().and_then(|p| p.parse::<i32>().ok());
            let minor = parts.next().map_or(Some(0), |p| p.parse::<i32>().ok());
            match (major, minor, parts.next()) {
                (Some(ma), Some(mi), None) if (1..100).contains(&ma) && (0..100).contains(&mi) => {
                    Ok(ma * 1000 + mi * 10)
                }
                _ => Err(format!(
                    "cuda_version {s:?} is not MAJOR.MINOR; write \"12.8\" or 12080"
                )),
            }
        }
    }
}

fn no_such_device(i: u32, n: u32) -> String {
    format!(
        "there is no device {i}: the scenario defines {n} device(s), indices 0..{}",
        n.saturating_sub(1)
    )
}

/// The code an init failure of the scenario itself returns.
pub const LOAD_FAILURE: Ret = abi::UNKNOWN;

#[cfg(test)]
mod tests;
