//! Scenario files: the TOML schema (documented for humans in `nvml-sim/README.md`), its
//! validation with errors that point at a line and column, and the compilation of a scenario
//! into a [`Sim`] (templates expanded, identities derived, PIDs read from the environment,
//! faults resolved to function masks, events sorted).

use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::abi::{self, Ret};
use crate::api::Api;
use crate::model::{
    Action, Clock, Device, DeviceSignals, DriverGone, Fault, FaultSet, InitFault, MemoryHealth,
    Process, Sim, SimEvent, Window, KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS,
};
use crate::signal::{splitmix64, Signal};

mod hardware;

/// The environment variable naming the scenario file.
pub const ENV_SCENARIO: &str = "NVML_SIM_SCENARIO";
/// Multiplies the speed of simulated time (float, default 1).
pub const ENV_TIME_SCALE: &str = "NVML_SIM_TIME_SCALE";
/// Simulated seconds already elapsed at the first init (float, default 0).
pub const ENV_START_OFFSET: &str = "NVML_SIM_START_OFFSET";

/// The built-in scenario (the same text as `scenarios/default.toml`).
pub const DEFAULT_SCENARIO: &str = include_str!("../scenarios/default.toml");

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

// ---------------------------------------------------------------------------------------------
// The schema, as written.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    driver: RawDriver,
    #[serde(default)]
    clock: RawClock,
    #[serde(default, rename = "device")]
    devices: Vec<Spanned<RawDevice>>,
    #[serde(default, rename = "event")]
    events: Vec<Spanned<RawEvent>>,
    #[serde(default, rename = "fault")]
    faults: Vec<Spanned<RawFault>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDriver {
    version: Option<String>,
    nvml_version: Option<String>,
    cuda_version: Option<Spanned<CudaVersion>>,
    process_sample_period_ms: Option<f64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CudaVersion {
    Number(i64),
    Text(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClock {
    time_scale: Option<f64>,
    start_offset_s: Option<f64>,
    freeze_at_s: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    count: Option<u32>,
    name: Option<String>,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    serial: Option<String>,
    minor: Option<u32>,
    vbios_version: Option<String>,
    pci_device_id: Option<u32>,
    pci_subsystem_id: Option<u32>,
    memory_total_mib: Option<f64>,
    memory_reserved_mib: Option<f64>,
    bar1_total_mib: Option<f64>,
    bar1_used_mib: Option<f64>,
    power_limit_w: Option<f64>,
    default_power_limit_w: Option<f64>,
    min_power_limit_w: Option<f64>,
    max_power_limit_w: Option<f64>,
    energy_start_j: Option<f64>,
    max_clocks_mhz: Option<RawClocks>,
    fans: Option<u32>,
    ecc: Option<bool>,
    persistence: Option<bool>,
    mig: Option<bool>,
    compute_capability: Option<Spanned<String>>,
    architecture: Option<Architecture>,
    brand: Option<Brand>,
    compute_mode: Option<ComputeMode>,
    supported_throttle_reasons: Option<u64>,
    supported_events: Option<Vec<EventKind>>,
    pcie_generation: Option<u32>,
    pcie_max_generation: Option<u32>,
    pcie_width: Option<u32>,
    pcie_max_width: Option<u32>,
    slowdown_temp_c: Option<u32>,
    shutdown_temp_c: Option<u32>,
    retired_pages: Option<RawRetired>,
    remapped_rows: Option<RawRemapped>,
    gpm: Option<hardware::RawGpm>,
    nvlink: Option<hardware::RawNvLink>,
    violation: Option<hardware::RawViolation>,
    #[serde(default, rename = "mig_instance")]
    mig_instances: Vec<hardware::RawMig>,
    #[serde(default)]
    signals: RawDeviceSignals,
    #[serde(default, rename = "process")]
    processes: Vec<Spanned<RawProcess>>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawClocks {
    graphics: Option<u32>,
    sm: Option<u32>,
    mem: Option<u32>,
    video: Option<u32>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawRetired {
    #[serde(default)]
    single_bit: u32,
    #[serde(default)]
    double_bit: u32,
    #[serde(default)]
    pending: bool,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawRemapped {
    #[serde(default)]
    corrected: u32,
    #[serde(default)]
    uncorrected: u32,
    #[serde(default)]
    pending: bool,
    #[serde(default)]
    failure: bool,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawDeviceSignals {
    gpu_util: Option<Signal>,
    mem_util: Option<Signal>,
    encoder_util: Option<Signal>,
    decoder_util: Option<Signal>,
    memory_used_mib: Option<Signal>,
    temperature_c: Option<Signal>,
    power_w: Option<Spanned<Signal>>,
    clock_graphics_mhz: Option<Signal>,
    clock_sm_mhz: Option<Signal>,
    clock_mem_mhz: Option<Signal>,
    clock_video_mhz: Option<Signal>,
    fan_percent: Option<Signal>,
    pcie_tx_kbps: Option<Signal>,
    pcie_rx_kbps: Option<Signal>,
    throttle_reasons: Option<Signal>,
    ecc_corrected: Option<Signal>,
    ecc_uncorrected: Option<Signal>,
    pstate: Option<Signal>,
    pcie_replays: Option<Signal>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum Brand {
    Unknown,
    Quadro,
    Tesla,
    Nvs,
    Grid,
    Geforce,
    Titan,
    NvidiaRtx,
    Nvidia,
    GeforceRtx,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum ComputeMode {
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum EventKind {
    Xid,
    SingleBitEcc,
    DoubleBitEcc,
    Pstate,
    Clock,
    PowerSource,
}

impl EventKind {
    fn bits(self) -> u64 {
        (match self {
            EventKind::Xid => abi::nvmlEventTypeXidCriticalError,
            EventKind::SingleBitEcc => abi::nvmlEventTypeSingleBitEccError,
            EventKind::DoubleBitEcc => abi::nvmlEventTypeDoubleBitEccError,
            EventKind::Pstate => abi::nvmlEventTypePState,
            EventKind::Clock => abi::nvmlEventTypeClock,
            EventKind::PowerSource => abi::nvmlEventTypePowerSourceChange,
        }) as u64
    }
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum ProcessKind {
    Compute,
    Graphics,
    #[serde(rename = "compute+graphics")]
    ComputeGraphics,
    Mps,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    pid: Option<u32>,
    pid_env: Option<String>,
    pids_env: Option<String>,
    count: Option<u32>,
    name: Option<String>,
    kind: Option<ProcessKind>,
    memory_used_mib: Option<Signal>,
    sm_util: Option<Signal>,
    mem_util: Option<Signal>,
    enc_util: Option<Signal>,
    dec_util: Option<Signal>,
    active_from_s: Option<f64>,
    active_until_s: Option<f64>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    at_s: f64,
    device: u32,
    #[serde(rename = "type", default = "default_event_kind")]
    kind: EventKind,
    #[serde(alias = "xid", default)]
    data: u64,
}

fn default_event_kind() -> EventKind {
    EventKind::Xid
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum FaultKind {
    Error,
    GpuLost,
    Slow,
    InitError,
    DriverGone,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    kind: FaultKind,
    device: Option<u32>,
    devices: Option<Vec<u32>>,
    field: Option<String>,
    function: Option<String>,
    error: Option<String>,
    from_s: Option<f64>,
    until_s: Option<f64>,
    delay_ms: Option<f64>,
    attempts: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// Compilation.

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
        expand_device(d.get_ref(), &mut devices, env).map_err(|m| err(d.span(), m))?;
    }
    check_unique(&devices).map_err(|m| ScenarioError::at(origin, text, None, m))?;
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
        compile_fault(
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

fn derived_uuid(i: u32) -> String {
    let a = splitmix64(0x6e76_6d6c_5f73_696d ^ i as u64);
    let b = splitmix64(a);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        (a as u16 & 0x0fff) | 0x4000,
        ((b >> 48) as u16 & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Parses `DDDDDDDD:BB:DD.F` or `DDDD:BB:DD.F` (or `BB:DD.F`), case-insensitive.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let mut parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.len() {
        3 => (parts.remove(0), parts.remove(0), parts.remove(0)),
        2 => ("0", parts.remove(0), parts.remove(0)),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.').unwrap_or((devfn, "0"));
    let hex = |p: &str, max: u32| u32::from_str_radix(p, 16).ok().filter(|v| *v <= max);
    Some((
        hex(domain, u32::MAX)?,
        hex(bus, 0xff)?,
        hex(dev, 0x1f)?,
        hex(func, 7)?,
    ))
}

fn expand_device(raw: &RawDevice, out: &mut Vec<Device>, env: &dyn Env) -> Result<(), String> {
    let count = raw.count.unwrap_or(1);
    if count == 0 {
        return Err("`count` must be at least 1".into());
    }
    if count > 1 {
        for (key, set) in [
            ("uuid", raw.uuid.is_some()),
            ("pci_bus_id", raw.pci_bus_id.is_some()),
            ("serial", raw.serial.is_some()),
            ("minor", raw.minor.is_some()),
        ] {
            if set {
                return Err(format!(
                    "`{key}` cannot be set on a device template with count = {count}: each copy \
                     derives its own from its index; drop `{key}` or use separate [[device]] tables"
                ));
            }
        }
    }
    let explicit_bus = match &raw.pci_bus_id {
        Some(s) => Some(parse_bus_id(s).ok_or_else(|| {
            format!("pci_bus_id {s:?} is not a PCI address like \"00000000:18:00.0\"")
        })?),
        None => None,
    };
    let cc = match &raw.compute_capability {
        None => (9, 0),
        Some(s) => s
            .get_ref()
            .split_once('.')
            .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
            .ok_or_else(|| {
                format!(
                    "compute_capability {:?} is not MAJOR.MINOR like \"9.0\"",
                    s.get_ref()
                )
            })?,
    };
    let positive = |key: &str, v: Option<f64>, default: f64| -> Result<f64, String> {
        let v = v.unwrap_or(default);
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("`{key}` must be a non-negative number, got {v}"))
        }
    };
    let total_mib = positive("memory_total_mib", raw.memory_total_mib, 81559.0)?;
    let bar1_total_mib = positive("bar1_total_mib", raw.bar1_total_mib, 131072.0)?;
    // A driver maps a small share of BAR1 for itself even on an idle GPU.
    let bar1_used_mib = raw.bar1_used_mib.unwrap_or(bar1_total_mib / 64.0);
    if !(0.0..=bar1_total_mib).contains(&bar1_used_mib) {
        return Err(format!(
            "bar1_used_mib ({bar1_used_mib}) must be between 0 and bar1_total_mib ({bar1_total_mib})"
        ));
    }
    let reserved_mib = positive("memory_reserved_mib", raw.memory_reserved_mib, 542.0)?;
    if reserved_mib > total_mib {
        return Err(format!(
            "memory_reserved_mib ({reserved_mib}) is larger than memory_total_mib ({total_mib})"
        ));
    }
    let limit_w = positive("power_limit_w", raw.power_limit_w, 700.0)?;
    let default_limit_w = positive("default_power_limit_w", raw.default_power_limit_w, limit_w)?;
    let min_limit_w = positive(
        "min_power_limit_w",
        raw.min_power_limit_w,
        limit_w.min(200.0),
    )?;
    let max_limit_w = positive("max_power_limit_w", raw.max_power_limit_w, limit_w)?;
    let energy_start_j = positive("energy_start_j", raw.energy_start_j, 0.0)?;
    let clocks = raw.max_clocks_mhz.unwrap_or_default();
    let max_clocks = [
        clocks.graphics.unwrap_or(1980),
        clocks.sm.unwrap_or(1980),
        clocks.mem.unwrap_or(2619),
        clocks.video.unwrap_or(1965),
    ];
    let sig = &raw.signals;
    if let Some(p) = &sig.power_w {
        if p.get_ref().shape_min() < 0.0 {
            return Err(
                "signals.power_w can go below 0 W; energy integrates power, so its shape must \
                 stay >= 0 (lower the amplitude or raise the mean)"
                    .into(),
            );
        }
    }
    let supported_events = match &raw.supported_events {
        Some(kinds) => kinds.iter().fold(0, |m, k| m | k.bits()),
        None => [
            EventKind::Xid,
            EventKind::SingleBitEcc,
            EventKind::DoubleBitEcc,
            EventKind::Pstate,
            EventKind::Clock,
        ]
        .iter()
        .fold(0, |m, k| m | k.bits()),
    };
    // PIDs of a template's copies must not collide: each copy shifts its literal PIDs by the
    // number of literal PIDs the template declares.
    let literal_pids_per_copy: u32 = raw
        .processes
        .iter()
        .filter(|p| p.get_ref().pid.is_some())
        .map(|p| p.get_ref().count.unwrap_or(1))
        .sum();

    for copy in 0..count {
        let index = out.len() as u32;
        let salt = index as u64;
        let (domain, bus, pci_device, _func) =
            explicit_bus.unwrap_or((index / 80, 0x10 + (index % 80) * 3, 0, 0));
        let s = |v: &Option<Signal>, default: f64, field: u64| -> Signal {
            v.clone()
                .unwrap_or(Signal::constant(default))
                .salted(salt << 8 | field)
        };
        let clock_sig = |v: &Option<Signal>, i: usize| -> Signal {
            v.clone()
                .unwrap_or(Signal::constant(max_clocks[i] as f64))
                .salted(salt << 8 | (20 + i as u64))
        };
        let signals = DeviceSignals {
            gpu_util: s(&sig.gpu_util, 0.0, 1),
            mem_util: s(&sig.mem_util, 0.0, 2),
            encoder_util: s(&sig.encoder_util, 0.0, 3),
            decoder_util: s(&sig.decoder_util, 0.0, 4),
            memory_used_mib: sig
                .memory_used_mib
                .as_ref()
                .map(|m| m.salted(salt << 8 | 5)),
            temperature_c: s(&sig.temperature_c, 35.0, 6),
            power_w: sig
                .power_w
                .as_ref()
                .map(|p| p.get_ref().clone())
                .unwrap_or(Signal::constant(70.0))
                .salted(salt << 8 | 7),
            clocks_mhz: [
                clock_sig(&sig.clock_graphics_mhz, 0),
                clock_sig(&sig.clock_sm_mhz, 1),
                clock_sig(&sig.clock_mem_mhz, 2),
                clock_sig(&sig.clock_video_mhz, 3),
            ],
            fan_percent: s(&sig.fan_percent, 30.0, 8),
            pcie_tx_kbps: s(&sig.pcie_tx_kbps, 0.0, 9),
            pcie_rx_kbps: s(&sig.pcie_rx_kbps, 0.0, 10),
            throttle_reasons: s(&sig.throttle_reasons, 0.0, 11),
            ecc_corrected: s(&sig.ecc_corrected, 0.0, 12),
            ecc_uncorrected: s(&sig.ecc_uncorrected, 0.0, 13),
            pstate: s(&sig.pstate, 0.0, 14),
        };
        let mut processes = Vec::new();
        for p in &raw.processes {
            expand_process(
                p.get_ref(),
                copy * literal_pids_per_copy,
                salt,
                env,
                &mut processes,
            )?;
        }
        let health = {
            let r = raw.retired_pages.unwrap_or_default();
            let m = raw.remapped_rows.unwrap_or_default();
            MemoryHealth {
                retired_single_bit: r.single_bit,
                retired_double_bit: r.double_bit,
                retired_pending: r.pending,
                remapped_corrected: m.corrected,
                remapped_uncorrected: m.uncorrected,
                remap_pending: m.pending,
                remap_failure: m.failure,
            }
        };
        let name = raw
            .name
            .clone()
            .unwrap_or_else(|| "NVIDIA H100 80GB HBM3".into());
        let arch = raw.architecture.unwrap_or(Architecture::Hopper);
        let hw = hardware::compile(
            &hardware::RawHardware {
                gpm: raw.gpm.as_ref(),
                nvlink: raw.nvlink.as_ref(),
                violation: raw.violation.as_ref(),
                mig: &raw.mig_instances,
                pcie_replays: sig.pcie_replays.as_ref(),
            },
            index,
            count,
            &name,
            raw.mig.unwrap_or(false),
            matches!(arch, Architecture::Hopper | Architecture::Blackwell),
            matches!(
                arch,
                Architecture::Ampere | Architecture::Hopper | Architecture::Blackwell
            ),
            &processes,
        )?;
        let mut faults = FaultSet::default();
        if !hw.mig.is_empty() {
            // A GPU with MIG devices has no device-wide or per-process utilisation.
            faults.push(Fault {
                apis: Api::nvmlDeviceGetUtilizationRates.bit()
                    | Api::nvmlDeviceGetProcessUtilization.bit(),
                window: Window::ALWAYS,
                action: Action::Fail(abi::NOT_SUPPORTED),
            });
        }
        out.push(Device {
            index,
            name,
            uuid: raw.uuid.clone().unwrap_or_else(|| derived_uuid(index)),
            serial: raw
                .serial
                .clone()
                .unwrap_or_else(|| format!("{}", 1_650_000_000_000u64 + index as u64)),
            vbios_version: raw
                .vbios_version
                .clone()
                .unwrap_or_else(|| "96.00.99.00.01".into()),
            domain,
            bus,
            pci_device,
            bus_id: format!("{domain:08X}:{bus:02X}:{pci_device:02X}.0"),
            bus_id_legacy: format!("{:04X}:{bus:02X}:{pci_device:02X}.0", domain & 0xffff),
            pci_device_id: raw.pci_device_id.unwrap_or(0x2330_10DE),
            pci_subsystem_id: raw.pci_subsystem_id.unwrap_or(0x16C1_10DE),
            minor: raw.minor.unwrap_or(index),
            memory_total: crate::model::mib_to_bytes(total_mib),
            memory_reserved: crate::model::mib_to_bytes(reserved_mib),
            bar1_total: crate::model::mib_to_bytes(bar1_total_mib),
            bar1_used: crate::model::mib_to_bytes(bar1_used_mib),
            power_limit_mw: (limit_w * 1000.0) as u32,
            default_power_limit_mw: (default_limit_w * 1000.0) as u32,
            min_power_limit_mw: (min_limit_w * 1000.0) as u32,
            max_power_limit_mw: (max_limit_w * 1000.0) as u32,
            energy_start_mj: energy_start_j * 1000.0,
            max_clocks_mhz: max_clocks,
            fans: raw.fans.unwrap_or(0),
            ecc: raw.ecc.unwrap_or(true),
            persistence: raw.persistence.unwrap_or(true),
            mig: raw.mig.unwrap_or(false),
            compute_capability: cc,
            architecture: arch_code(raw.architecture.unwrap_or(Architecture::Hopper)),
            brand: brand_code(raw.brand.unwrap_or(Brand::Nvidia)),
            compute_mode: match raw.compute_mode.unwrap_or(ComputeMode::Default) {
                ComputeMode::Default => abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
                ComputeMode::ExclusiveThread => {
                    abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD
                }
                ComputeMode::Prohibited => abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
                ComputeMode::ExclusiveProcess => {
                    abi::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
                }
            },
            supported_throttle_reasons: raw.supported_throttle_reasons.unwrap_or(0x1FF),
            supported_events,
            pcie_gen: (
                raw.pcie_generation.unwrap_or(5),
                raw.pcie_max_generation.unwrap_or(5),
            ),
            pcie_width: (
                raw.pcie_width.unwrap_or(16),
                raw.pcie_max_width.unwrap_or(16),
            ),
            slowdown_temp_c: raw.slowdown_temp_c.unwrap_or(87),
            shutdown_temp_c: raw.shutdown_temp_c.unwrap_or(92),
            health,
            hw,
            signals,
            processes: processes.into_boxed_slice(),
            lost: Vec::new(),
            faults,
        });
    }
    Ok(())
}

fn arch_code(a: Architecture) -> u32 {
    match a {
        Architecture::Kepler => abi::NVML_DEVICE_ARCH_KEPLER,
        Architecture::Maxwell => abi::NVML_DEVICE_ARCH_MAXWELL,
        Architecture::Pascal => abi::NVML_DEVICE_ARCH_PASCAL,
        Architecture::Volta => abi::NVML_DEVICE_ARCH_VOLTA,
        Architecture::Turing => abi::NVML_DEVICE_ARCH_TURING,
        Architecture::Ampere => abi::NVML_DEVICE_ARCH_AMPERE,
        Architecture::Ada => abi::NVML_DEVICE_ARCH_ADA,
        Architecture::Hopper => abi::NVML_DEVICE_ARCH_HOPPER,
        Architecture::Blackwell => abi::NVML_DEVICE_ARCH_BLACKWELL,
    }
}

fn brand_code(b: Brand) -> u32 {
    match b {
        Brand::Unknown => abi::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        Brand::Quadro => abi::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        Brand::Tesla => abi::nvmlBrandType_enum_NVML_BRAND_TESLA,
        Brand::Nvs => abi::nvmlBrandType_enum_NVML_BRAND_NVS,
        Brand::Grid => abi::nvmlBrandType_enum_NVML_BRAND_GRID,
        Brand::Geforce => abi::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        Brand::Titan => abi::nvmlBrandType_enum_NVML_BRAND_TITAN,
        Brand::NvidiaRtx => abi::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        Brand::Nvidia => abi::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        Brand::GeforceRtx => abi::nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX,
    }
}

fn expand_process(
    raw: &RawProcess,
    pid_shift: u32,
    salt: u64,
    env: &dyn Env,
    out: &mut Vec<Process>,
) -> Result<(), String> {
    let sources = [
        raw.pid.is_some(),
        raw.pid_env.is_some(),
        raw.pids_env.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if sources != 1 {
        return Err(
            "a [[device.process]] needs exactly one of `pid = 1234`, `pid_env = \"VAR\"` (one PID \
             read from $VAR) or `pids_env = \"VAR\"` (comma-separated PIDs)"
                .into(),
        );
    }
    let count = raw.count.unwrap_or(1);
    if count == 0 {
        return Err("process `count` must be at least 1".into());
    }
    if raw.count.is_some() && raw.pid.is_none() {
        return Err(
            "process `count` only works with a literal `pid` (the first of the range)".into(),
        );
    }
    let pids: Vec<u32> = if let Some(first) = raw.pid {
        let start = first
            .checked_add(pid_shift)
            .filter(|s| s.checked_add(count - 1).is_some())
            .ok_or_else(|| format!("pid range from {first} (+{pid_shift}) overflows u32"))?;
        (start..start + count).collect()
    } else if let Some(var) = &raw.pid_env {
        let v = env.var(var).ok_or_else(|| {
            format!(
                "pid_env = {var:?}: the environment variable {var} is not set; export it with \
                 the PID of the process to show on this GPU"
            )
        })?;
        vec![parse_pid(var, &v)?]
    } else if let Some(var) = &raw.pids_env {
        let v = env.var(var).ok_or_else(|| {
            format!(
                "pids_env = {var:?}: the environment variable {var} is not set; export it as a \
                 comma-separated list of PIDs"
            )
        })?;
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| parse_pid(var, s))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let kinds = match raw.kind.unwrap_or(ProcessKind::Compute) {
        ProcessKind::Compute => KIND_COMPUTE,
        ProcessKind::Graphics => KIND_GRAPHICS,
        ProcessKind::ComputeGraphics => KIND_COMPUTE | KIND_GRAPHICS,
        ProcessKind::Mps => KIND_MPS,
    };
    let from = raw.active_from_s.unwrap_or(f64::NEG_INFINITY);
    let until = raw.active_until_s.unwrap_or(f64::INFINITY);
    if from >= until {
        return Err(format!(
            "active_from_s ({from}) must be before active_until_s ({until})"
        ));
    }
    for pid in pids {
        let salt = salt.wrapping_mul(1_000_003) ^ pid as u64;
        let s = |v: &Option<Signal>, default: f64, f: u64| {
            v.clone()
                .unwrap_or(Signal::constant(default))
                .salted(salt << 4 | f)
        };
        out.push(Process {
            pid,
            kinds,
            name: raw.name.clone(),
            memory_used_mib: s(&raw.memory_used_mib, 0.0, 1),
            sm_util: s(&raw.sm_util, 0.0, 2),
            mem_util: s(&raw.mem_util, 0.0, 3),
            enc_util: s(&raw.enc_util, 0.0, 4),
            dec_util: s(&raw.dec_util, 0.0, 5),
            active: Window { from, until },
            gpu_instance_id: raw.gpu_instance_id.unwrap_or(abi::NO_INSTANCE),
            compute_instance_id: raw.compute_instance_id.unwrap_or(abi::NO_INSTANCE),
        });
    }
    Ok(())
}

fn parse_pid(var: &str, v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("${var} = {v:?} is not a PID (a positive integer)"))
}

fn check_unique(devices: &[Device]) -> Result<(), String> {
    for (i, a) in devices.iter().enumerate() {
        for b in &devices[..i] {
            for (what, x, y) in [
                ("uuid", &a.uuid, &b.uuid),
                ("pci_bus_id", &a.bus_id, &b.bus_id),
                ("serial", &a.serial, &b.serial),
            ] {
                if x == y {
                    return Err(format!(
                        "devices {} and {} have the same {what} {x:?}; each GPU needs its own",
                        b.index, a.index
                    ));
                }
            }
            if a.minor == b.minor {
                return Err(format!(
                    "devices {} and {} have the same minor number {}; each GPU needs its own",
                    b.index, a.index, a.minor
                ));
            }
        }
    }
    Ok(())
}

fn compile_fault(
    raw: &RawFault,
    devices: &mut [Device],
    system: &mut FaultSet,
    init_fault: &mut Option<InitFault>,
    driver_gone: &mut Vec<DriverGone>,
) -> Result<(), String> {
    let n = devices.len() as u32;
    let window = Window {
        from: raw.from_s.unwrap_or(f64::NEG_INFINITY),
        until: raw.until_s.unwrap_or(f64::INFINITY),
    };
    if window.from >= window.until {
        return Err(format!(
            "from_s ({}) must be before until_s ({})",
            window.from, window.until
        ));
    }
    let targets: Vec<u32> = match (raw.device, &raw.devices) {
        (Some(_), Some(_)) => return Err("use `device = N` or `devices = [..]`, not both".into()),
        (Some(d), None) => vec![d],
        (None, Some(ds)) => ds.clone(),
        (None, None) => (0..n).collect(),
    };
    if let Some(bad) = targets.iter().find(|d| **d >= n) {
        return Err(no_such_device(*bad, n));
    }
    let error = match &raw.error {
        Some(name) => Some(abi::return_code_by_name(name).ok_or_else(|| {
            let names: Vec<&str> = abi::RETURN_CODES
                .iter()
                .filter(|(c, _, _)| *c != abi::SUCCESS)
                .map(|(_, n, _)| *n)
                .collect();
            format!("unknown error {name:?}; use one of: {}", names.join(", "))
        })?),
        None => None,
    };
    let only = |allowed: &[&str]| -> Result<(), String> {
        let given = [
            ("device", raw.device.is_some()),
            ("devices", raw.devices.is_some()),
            ("field", raw.field.is_some()),
            ("function", raw.function.is_some()),
            ("error", raw.error.is_some()),
            ("from_s", raw.from_s.is_some()),
            ("until_s", raw.until_s.is_some()),
            ("delay_ms", raw.delay_ms.is_some()),
            ("attempts", raw.attempts.is_some()),
        ];
        match given.iter().find(|(k, set)| *set && !allowed.contains(k)) {
            Some((k, _)) => Err(format!(
                "`{k}` does not apply to a fault of kind {:?}; it takes: {}",
                raw.kind,
                allowed.join(", ")
            )),
            None => Ok(()),
        }
    };
    match raw.kind {
        FaultKind::Error | FaultKind::Slow => {
            let slow = raw.kind == FaultKind::Slow;
            if slow {
                only(&[
                    "device", "devices", "field", "function", "from_s", "until_s", "delay_ms",
                ])?;
            } else {
                only(&[
                    "device", "devices", "field", "function", "error", "from_s", "until_s",
                ])?;
            }
            let apis = match (&raw.field, &raw.function) {
                (Some(_), Some(_)) => return Err("use `field` or `function`, not both".into()),
                (None, None) => {
                    return Err(format!(
                        "a fault of kind {:?} needs `field = \"...\"` (one of: {}) or \
                         `function = \"nvmlDevice...\"`",
                        raw.kind,
                        Api::field_names().join(", ")
                    ))
                }
                (Some(f), None) => Api::mask_for_field(f).ok_or_else(|| {
                    format!(
                        "unknown field {f:?}; use one of: {}",
                        Api::field_names().join(", ")
                    )
                })?,
                (None, Some(f)) => Api::mask_for_function(f).ok_or_else(|| {
                    format!(
                        "nvml-sim does not export a function named {f:?}; check the spelling \
                         (e.g. \"nvmlDeviceGetFanSpeed_v2\") or use `field`"
                    )
                })?,
            };
            let action = if slow {
                let ms = raw
                    .delay_ms
                    .ok_or("a fault of kind \"slow\" needs `delay_ms`")?;
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(format!("delay_ms must be >= 0, got {ms}"));
                }
                Action::Delay(Duration::from_secs_f64(ms / 1000.0))
            } else {
                Action::Fail(error.unwrap_or(abi::NOT_SUPPORTED))
            };
            let device_apis: u128 = Api::ALL
                .iter()
                .filter(|a| a.is_device_call())
                .fold(0, |m, a| m | a.bit());
            let picked_devices = raw.device.is_some() || raw.devices.is_some();
            if picked_devices && apis & device_apis == 0 {
                return Err(
                    "this field/function is not a device call (it takes no device handle); \
                     drop `device`/`devices`"
                        .into(),
                );
            }
            if apis & device_apis != 0 {
                for d in &targets {
                    devices[*d as usize].faults.push(Fault {
                        apis: apis & device_apis,
                        window,
                        action,
                    });
                }
            }
            // A field spanning both kinds (`events`) with devices picked hits only those
            // devices' calls; without a pick it also hits the system calls.
            if apis & !device_apis != 0 && !picked_devices {
                system.push(Fault {
                    apis: apis & !device_apis,
                    window,
                    action,
                });
            }
        }
        FaultKind::GpuLost => {
            only(&["device", "devices", "from_s", "until_s"])?;
            if raw.device.is_none() && raw.devices.is_none() {
                return Err(
                    "a gpu_lost fault needs `device = N` (or `devices = [..]`): losing every GPU \
                     is a `driver_gone` fault"
                        .into(),
                );
            }
            if raw.from_s.is_none() {
                return Err(
                    "a gpu_lost fault needs `from_s` (when the GPU falls off the bus)".into(),
                );
            }
            for d in &targets {
                devices[*d as usize].lost.push(window);
            }
        }
        FaultKind::InitError => {
            only(&["error", "attempts"])?;
            let error = error.ok_or(
                "an init_error fault needs `error` (e.g. \"driver_not_loaded\", \"no_permission\")",
            )?;
            if init_fault.is_some() {
                return Err("only one init_error fault is allowed".into());
            }
            *init_fault = Some(InitFault {
                error,
                attempts: raw.attempts.unwrap_or(u32::MAX),
            });
        }
        FaultKind::DriverGone => {
            only(&["error", "from_s", "until_s"])?;
            if raw.from_s.is_none() {
                return Err("a driver_gone fault needs `from_s`".into());
            }
            driver_gone.push(DriverGone {
                window,
                error: error.unwrap_or(abi::nvmlReturn_enum_NVML_ERROR_UNKNOWN),
            });
        }
    }
    Ok(())
}

/// The code an init failure of the scenario itself returns.
pub const LOAD_FAILURE: Ret = abi::UNKNOWN;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct MapEnv(HashMap<&'static str, &'static str>);
    impl Env for MapEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|s| s.to_string())
        }
    }
    fn env(pairs: &[(&'static str, &'static str)]) -> MapEnv {
        MapEnv(pairs.iter().copied().collect())
    }

    fn compile_err(text: &str) -> (usize, usize, String) {
        match compile("test.toml", text, &env(&[])) {
            Err(ScenarioError::Invalid {
                line,
                column,
                message,
                ..
            }) => (line, column, message),
            Err(e) => panic!("unexpected error kind: {e}"),
            Ok(_) => panic!("scenario unexpectedly valid:\n{text}"),
        }
    }

    #[test]
    fn bar1_used_defaults_to_a_64th_and_cannot_exceed_the_aperture() {
        let sim = compile("t", "[[device]]\nbar1_total_mib = 256\n", &env(&[])).unwrap();
        assert_eq!(sim.devices[0].bar1_used, 4 << 20);
        let (_, _, msg) = compile_err("[[device]]\nbar1_total_mib = 256\nbar1_used_mib = 300\n");
        assert!(
            msg.contains("bar1_used_mib (300)") && msg.contains("bar1_total_mib (256)"),
            "{msg}"
        );
    }

    #[test]
    fn builtin_default_compiles_to_two_gpus_with_processes() {
        let sim = compile("built-in default", DEFAULT_SCENARIO, &env(&[])).unwrap();
        assert_eq!(sim.devices.len(), 2);
        assert!(sim.devices.iter().all(|d| !d.processes.is_empty()));
        assert_ne!(sim.devices[0].uuid, sim.devices[1].uuid);
    }

    #[test]
    fn shipped_scenarios_all_compile_with_expected_sizes() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
        let e = env(&[]);
        for (file, gpus, procs) in [
            ("default.toml", 2, None),
            ("training-node-8gpu.toml", 8, Some(8)),
            ("faulty-node.toml", 4, None),
            ("bench-8x64.toml", 8, Some(64)),
            ("bench-64x1024.toml", 64, Some(1024)),
        ] {
            let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            let sim = compile(file, &text, &e).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(sim.devices.len(), gpus, "{file}");
            if let Some(p) = procs {
                let total: usize = sim.devices.iter().map(|d| d.processes.len()).sum();
                assert_eq!(total, p, "{file}");
                let mut pids: Vec<u32> = sim
                    .devices
                    .iter()
                    .flat_map(|d| d.processes.iter().map(|p| p.pid))
                    .collect();
                pids.sort_unstable();
                pids.dedup();
                assert_eq!(pids.len(), p, "{file}: PIDs must be unique");
            }
        }
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/default.toml")).unwrap(),
            DEFAULT_SCENARIO
        );
    }

    #[test]
    fn hardware_scenarios_compile_with_their_gpm_mig_and_nvlink() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
        let e = env(&[("GPULSE_TRAINER_PID", "4242")]);
        let load = |file: &str| {
            let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            compile(file, &text, &e).unwrap_or_else(|e| panic!("{e}"))
        };
        let idle = load("gpm-tensor-idle.toml");
        let busy = load("gpm-tensor-busy.toml");
        for (sim, tensor) in [(&idle, 0.0), (&busy, 0.4)] {
            let g = &sim.devices[0].hw;
            assert!(g.gpm_supported);
            assert_eq!(g.gpm.sm_activity.value(1.0), 0.8);
            assert_eq!(g.gpm.tensor_activity.value(1.0), tensor);
            assert_eq!(sim.devices[0].processes[0].pid, 4242);
        }
        let old = load("gpm-unsupported.toml");
        assert!(old.devices.iter().all(|d| !d.hw.gpm_supported));
        let denied = load("gpm-permission-denied.toml");
        assert!(!denied.devices[0].faults.is_empty());
        let mig = load("mig-2-instances.toml");
        assert_eq!(mig.devices[0].hw.mig.len(), 2);
        assert_eq!(mig.devices[1].hw.mig.len(), 0);
        let nv = load("nvlink-4-links.toml");
        let links: Vec<u32> = nv
            .devices
            .iter()
            .map(|d| d.hw.nvlink.as_ref().unwrap().active())
            .collect();
        assert_eq!(links, [4, 3]);
        let remap = load("remapped-rows-pending.toml");
        assert!(remap.devices[0].health.remap_pending);
        assert_eq!(remap.devices[0].hw.pcie_replays.value(0.0), 12.0);
    }

    #[test]
    fn hardware_keys_are_checked_with_a_reason() {
        for (text, needle) in [
            (
                "[[device]]\n[[device.mig_instance]]\nprofile = \"1g.10gb\"\ngpu_instance_id = 1\nmemory_total_mib = 9856\n",
                "needs `mig = true`",
            ),
            (
                "[[device]]\nmig = true\n[[device.mig_instance]]\nprofile = \"1g.10gb\"\ngpu_instance_id = 1\nmemory_total_mib = 9856\n[[device.process]]\npid = 5\ngpu_instance_id = 2\n",
                "no [[device.mig_instance]] of this GPU has that id",
            ),
            ("[[device]]\n[device.nvlink]\nlinks = 19\n", "out of range"),
            ("[[device]]\n[device.nvlink]\nlinks = 4\ndown = [4]\n", "links 0 to 3"),
            ("[[device]]\n[device.gpm]\nsm_activty = 0.5\n", "unknown field `sm_activty`"),
            (
                "[[device]]\n[device.violation]\npower = { mean = 0, amplitude = 0.1, period = 10 }\n",
                "below 0",
            ),
        ] {
            let (line, _, msg) = compile_err(text);
            assert!(msg.contains(needle), "{msg:?} should say {needle:?}");
            assert!(line > 0, "{msg}: the error points at a line");
        }
    }

    #[test]
    fn templates_derive_distinct_identities_and_pid_ranges() {
        let sim = compile(
            "t",
            r#"
            [[device]]
            count = 3
            [[device.process]]
            pid = 1000
            count = 4
            [[device.process]]
            pid = 5000
            "#,
            &env(&[]),
        )
        .unwrap();
        let d = &sim.devices;
        assert_eq!(d.len(), 3);
        assert_eq!(d[2].minor, 2);
        assert_eq!(d[1].bus_id, "00000000:13:00.0");
        assert_eq!(d[1].bus_id_legacy, "0000:13:00.0");
        let pids: Vec<Vec<u32>> = d
            .iter()
            .map(|d| d.processes.iter().map(|p| p.pid).collect())
            .collect();
        assert_eq!(pids[0], vec![1000, 1001, 1002, 1003, 5000]);
        assert_eq!(pids[1], vec![1005, 1006, 1007, 1008, 5005]);
        assert!(d[0].uuid.starts_with("GPU-") && d[0].uuid.len() == 40);
    }

    #[test]
    fn pids_come_from_the_environment() {
        let e = env(&[("ONE", "4242"), ("MANY", "10, 11,12")]);
        let sim = compile(
            "t",
            r#"
            [[device]]
            [[device.process]]
            pid_env = "ONE"
            [[device.process]]
            pids_env = "MANY"
            kind = "graphics"
            "#,
            &e,
        )
        .unwrap();
        let pids: Vec<u32> = sim.devices[0].processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![4242, 10, 11, 12]);
        assert_eq!(sim.devices[0].processes[1].kinds, KIND_GRAPHICS);
    }

    #[test]
    fn errors_point_at_line_and_column_and_say_what_is_wrong() {
        let (line, col, msg) = compile_err("[[device]]\nname = \"x\"\nfans = \"two\"\n");
        assert_eq!((line, col), (3, 8), "{msg}");
        assert!(msg.contains("invalid type"), "{msg}");

        let (line, _, msg) =
            compile_err("[[device]]\n[device.signals]\ngpu_util = { from = 1, to = 5 }\n");
        assert_eq!(line, 3, "{msg}");
        assert!(
            msg.contains("needs all of `from`, `to` and `over`"),
            "{msg}"
        );

        let (line, _, msg) = compile_err("[[device]]\nnmae = \"x\"\n");
        assert_eq!(line, 2);
        assert!(msg.contains("unknown field `nmae`"), "{msg}");

        let (line, _, msg) = compile_err(
            "[[device]]\n\n[[fault]]\nkind = \"error\"\ndevice = 3\nfield = \"fan_speed\"\n",
        );
        assert_eq!(line, 3, "{msg}");
        assert!(msg.contains("there is no device 3"), "{msg}");

        let (_, _, msg) = compile_err("[[device]]\n[[fault]]\nkind = \"error\"\nfield = \"fan\"\n");
        assert!(
            msg.contains("unknown field \"fan\"") && msg.contains("fan_speed"),
            "{msg}"
        );

        let (_, _, msg) = compile_err("[[device]]\n[[fault]]\nkind = \"melt\"\n");
        assert!(msg.contains("unknown variant `melt`"), "{msg}");

        let (_, _, msg) = compile_err("[[device]]\ncount = 2\nuuid = \"GPU-1\"\n");
        assert!(
            msg.contains("`uuid` cannot be set on a device template"),
            "{msg}"
        );

        let (_, _, msg) = compile_err("[[device]]\n[[device.process]]\npid_env = \"NOPE\"\n");
        assert!(msg.contains("NOPE is not set"), "{msg}");

        let (_, _, msg) = compile_err(
            "[[device]]\n[device.signals]\npower_w = { mean = 10, amplitude = 50, period = 5 }\n",
        );
        assert!(msg.contains("below 0 W"), "{msg}");

        let (_, _, msg) = compile_err("[[device]]\n[[device]]\nminor = 0\n");
        assert!(msg.contains("same minor number"), "{msg}");
    }

    #[test]
    fn error_display_names_file_line_column_and_shows_the_line() {
        let e = compile("/tmp/s.toml", "[driver]\nversion = 5\n", &env(&[])).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("nvml-sim: scenario /tmp/s.toml line 2, column 11:"),
            "{s}"
        );
        assert!(s.contains("| version = 5"), "{s}");
    }

    #[test]
    fn faults_resolve_to_devices_and_system_calls() {
        let sim = compile(
            "t",
            r#"
            [[device]]
            count = 2
            [[fault]]
            kind = "error"
            device = 1
            field = "fan_speed"
            error = "no_permission"
            [[fault]]
            kind = "gpu_lost"
            device = 0
            from_s = 10
            until_s = 20
            [[fault]]
            kind = "slow"
            function = "nvmlSystemGetDriverVersion"
            delay_ms = 1
            [[fault]]
            kind = "init_error"
            error = "driver_not_loaded"
            attempts = 2
            [[fault]]
            kind = "driver_gone"
            from_s = 100
            until_s = 150
            "#,
            &env(&[]),
        )
        .unwrap();
        assert!(sim.devices[0].faults.is_empty());
        assert_eq!(
            sim.devices[1]
                .faults
                .check(Api::nvmlDeviceGetFanSpeed_v2, 0.0),
            Err(4)
        );
        assert!(sim.devices[0].is_lost(15.0) && !sim.devices[0].is_lost(20.0));
        assert!(!sim.system_faults.is_empty());
        assert_eq!(
            sim.init_fault,
            Some(InitFault {
                error: abi::DRIVER_NOT_LOADED,
                attempts: 2
            })
        );
        assert!(sim.driver_gone_at(120.0) && !sim.driver_gone_at(150.0));
    }

    #[test]
    fn mixed_fields_with_a_device_pick_only_that_devices_calls() {
        let sim = compile(
            "t",
            "[[device]]\ncount = 2\n[[fault]]\nkind = \"error\"\ndevice = 1\nfield = \"events\"\n",
            &env(&[]),
        )
        .unwrap();
        assert!(sim.system_faults.is_empty());
        assert!(sim.devices[0].faults.is_empty());
        assert_eq!(
            sim.devices[1]
                .faults
                .check(Api::nvmlDeviceRegisterEvents, 0.0),
            Err(abi::NOT_SUPPORTED)
        );
        let (_, _, msg) = compile_err(
            "[[device]]\n[[fault]]\nkind = \"error\"\ndevice = 0\nfield = \"driver_version\"\n",
        );
        assert!(msg.contains("not a device call"), "{msg}");
    }

    #[test]
    fn slow_faults_sleep_only_inside_their_window() {
        let sim = compile(
            "t",
            "[[device]]\n[[fault]]\nkind = \"slow\"\nfield = \"power_usage\"\ndelay_ms = 30\nfrom_s = 10\nuntil_s = 20\n",
            &env(&[]),
        )
        .unwrap();
        let f = &sim.devices[0].faults;
        let t0 = std::time::Instant::now();
        assert_eq!(f.check(Api::nvmlDeviceGetPowerUsage, 5.0), Ok(()));
        assert!(
            t0.elapsed().as_millis() < 25,
            "outside the window: no delay"
        );
        let t0 = std::time::Instant::now();
        assert_eq!(f.check(Api::nvmlDeviceGetPowerUsage, 15.0), Ok(()));
        assert!(t0.elapsed().as_millis() >= 30, "inside the window: delayed");
        let t0 = std::time::Instant::now();
        assert_eq!(f.check(Api::nvmlDeviceGetTemperature, 15.0), Ok(()));
        assert!(t0.elapsed().as_millis() < 25, "other calls are not delayed");
    }

    #[test]
    fn environment_overrides_scenario_clock_and_rejects_garbage() {
        let text = "[clock]\ntime_scale = 2.0\nstart_offset_s = 5\n";
        let sim = compile("t", text, &env(&[])).unwrap();
        assert_eq!((sim.clock.scale, sim.clock.offset), (2.0, 5.0));
        let sim = compile(
            "t",
            text,
            &env(&[(ENV_TIME_SCALE, "60"), (ENV_START_OFFSET, "100")]),
        )
        .unwrap();
        assert_eq!((sim.clock.scale, sim.clock.offset), (60.0, 100.0));
        let e = compile("t", text, &env(&[(ENV_TIME_SCALE, "fast")])).unwrap_err();
        assert!(e.to_string().contains("NVML_SIM_TIME_SCALE"), "{e}");
        let e = compile("t", text, &env(&[(ENV_TIME_SCALE, "0")])).unwrap_err();
        assert!(e.to_string().contains("must be > 0"), "{e}");
    }

    #[test]
    fn cuda_versions_parse_from_text_or_number() {
        assert_eq!(
            parse_cuda_version(&CudaVersion::Text("12.8".into())),
            Ok(12080)
        );
        assert_eq!(
            parse_cuda_version(&CudaVersion::Text("13".into())),
            Ok(13000)
        );
        assert_eq!(parse_cuda_version(&CudaVersion::Number(12040)), Ok(12040));
        assert!(parse_cuda_version(&CudaVersion::Text("twelve".into())).is_err());
        assert!(parse_cuda_version(&CudaVersion::Number(12)).is_err());
    }

    #[test]
    fn bus_ids_parse_in_every_spelling() {
        assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18, 0, 0)));
        assert_eq!(parse_bus_id("0000:9a:00.0"), Some((0, 0x9a, 0, 0)));
        assert_eq!(parse_bus_id("1B:00.0"), Some((0, 0x1b, 0, 0)));
        assert_eq!(parse_bus_id("zz:00.0"), None);
        assert_eq!(parse_bus_id("0:0:0:0"), None);
    }
}
