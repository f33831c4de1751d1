//! The compiled, immutable simulation a scenario turns into: devices with their fixed identity,
//! signals, processes and faults, the event timeline and the clock. Everything a call needs is
//! precomputed here so that a call is arithmetic on elapsed time, never parsing or allocation.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::abi::{self, Ret};
use crate::api::Api;
use crate::hardware::{Hardware, MigInstance};
use crate::signal::Signal;

/// Simulated time: seconds since the first successful init, scaled and offset.
#[derive(Debug)]
pub struct Clock {
    pub scale: f64,
    pub offset: f64,
    pub freeze: Option<f64>,
    origin: OnceLock<(Instant, u64)>,
}

impl Clock {
    pub fn new(scale: f64, offset: f64, freeze: Option<f64>) -> Self {
        Clock {
            scale,
            offset,
            freeze,
            origin: OnceLock::new(),
        }
    }

    /// Starts the clock (idempotent: only the first call counts).
    pub fn start(&self) {
        self.origin.get_or_init(|| {
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            (Instant::now(), wall)
        });
    }

    /// Whether the first successful init has happened.
    pub fn started(&self) -> bool {
        self.origin.get().is_some()
    }

    /// The current simulated time in seconds.
    #[inline]
    pub fn now(&self) -> f64 {
        if let Some(f) = self.freeze {
            return f;
        }
        match self.origin.get() {
            Some((start, _)) => self.offset + start.elapsed().as_secs_f64() * self.scale,
            None => self.offset,
        }
    }

    /// Wall-clock microseconds since the epoch for simulated time `t`, as NVML timestamps are.
    #[inline]
    pub fn wall_us(&self, t: f64) -> u64 {
        let base = self.origin.get().map_or(0, |o| o.1);
        let since = ((t - self.offset) * 1e6).max(0.0) as u64;
        base + since
    }

    /// The real time it takes for simulated time to advance by `dt` seconds.
    pub fn real_duration(&self, dt: f64) -> Duration {
        if self.freeze.is_some() {
            return Duration::MAX;
        }
        Duration::from_secs_f64((dt / self.scale).clamp(0.0, 1e9))
    }
}

/// A half-open interval of simulated time, `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub from: f64,
    pub until: f64,
}

impl Window {
    pub const ALWAYS: Window = Window {
        from: f64::NEG_INFINITY,
        until: f64::INFINITY,
    };

    #[inline]
    pub fn contains(&self, t: f64) -> bool {
        self.from <= t && t < self.until
    }
}

/// What a fault does to a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Return this code instead of the data.
    Fail(Ret),
    /// Sleep this long (real time) first, then answer.
    Delay(Duration),
}

/// One fault bound to the functions (bits of [`Api`]) it hits.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub apis: u128,
    pub window: Window,
    pub action: Action,
}

/// The faults of one device (or of the system calls), with a mask for the fast path.
#[derive(Debug, Clone, Default)]
pub struct FaultSet {
    mask: u128,
    faults: Vec<Fault>,
}

impl FaultSet {
    pub fn push(&mut self, fault: Fault) {
        self.mask |= fault.apis;
        self.faults.push(fault);
    }

    pub fn is_empty(&self) -> bool {
        self.faults.is_empty()
    }

    /// Applies the faults hitting `api` at time `t`: sleeps for delays, fails for errors.
    #[inline]
    pub fn check(&self, api: Api, t: f64) -> Result<(), Ret> {
        if self.mask & api.bit() == 0 {
            return Ok(());
        }
        self.check_slow(api, t)
    }

    #[cold]
    fn check_slow(&self, api: Api, t: f64) -> Result<(), Ret> {
        for f in &self.faults {
            if f.apis & api.bit() != 0 && f.window.contains(t) {
                match f.action {
                    Action::Delay(d) => std::thread::sleep(d),
                    Action::Fail(code) => return Err(code),
                }
            }
        }
        Ok(())
    }
}

/// Process kinds, as bits (a process can be both compute and graphics).
pub const KIND_COMPUTE: u8 = 1;
pub const KIND_GRAPHICS: u8 = 2;
pub const KIND_MPS: u8 = 4;

/// A process using a device.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: u32,
    pub kinds: u8,
    pub name: Option<String>,
    pub memory_used_mib: Signal,
    pub sm_util: Signal,
    pub mem_util: Signal,
    pub enc_util: Signal,
    pub dec_util: Signal,
    pub active: Window,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// Listed only while its PID is a live process (as the driver drops a process whose CUDA
    /// context went with it): the scenario's `while_alive = true`, for real processes.
    pub while_alive: bool,
}

impl Process {
    /// Whether the driver lists it at scenario time `t`.
    pub fn listed_at(&self, t: f64) -> bool {
        self.active.contains(t) && (!self.while_alive || alive(self.pid))
    }

    #[inline]
    pub fn memory_bytes(&self, t: f64) -> u64 {
        mib_to_bytes(self.memory_used_mib.value(t))
    }
}

/// The dynamic fields of a device.
#[derive(Debug, Clone)]
pub struct DeviceSignals {
    pub gpu_util: Signal,
    pub mem_util: Signal,
    pub encoder_util: Signal,
    pub decoder_util: Signal,
    /// `None`: the sum of the active processes' memory.
    pub memory_used_mib: Option<Signal>,
    pub temperature_c: Signal,
    /// HBM temperature (`NVML_FI_DEV_MEMORY_TEMP`); `None`: the board does not report it
    /// (the field answers `NVML_ERROR_NOT_SUPPORTED`, as on GDDR boards).
    pub memory_temperature_c: Option<Signal>,
    pub power_w: Signal,
    /// Graphics, SM, memory, video (the order of `nvmlClockType_t`).
    pub clocks_mhz: [Signal; 4],
    pub fan_percent: Signal,
    pub pcie_tx_kbps: Signal,
    pub pcie_rx_kbps: Signal,
    pub throttle_reasons: Signal,
    pub ecc_corrected: Signal,
    pub ecc_uncorrected: Signal,
    pub pstate: Signal,
}

/// Retired-page and row-remapping counters (fixed for the run).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryHealth {
    pub retired_single_bit: u32,
    pub retired_double_bit: u32,
    pub retired_pending: bool,
    pub remapped_corrected: u32,
    pub remapped_uncorrected: u32,
    pub remap_pending: bool,
    pub remap_failure: bool,
}

/// One simulated GPU.
#[derive(Debug)]
pub struct Device {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub serial: String,
    pub vbios_version: String,
    pub domain: u32,
    pub bus: u32,
    pub pci_device: u32,
    /// `00000000:18:00.0` (what `busId` holds).
    pub bus_id: String,
    /// `0000:18:00.0` (what `busIdLegacy` holds).
    pub bus_id_legacy: String,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub minor: u32,
    pub memory_total: u64,
    pub memory_reserved: u64,
    pub bar1_total: u64,
    pub bar1_used: u64,
    pub power_limit_mw: u32,
    pub default_power_limit_mw: u32,
    pub min_power_limit_mw: u32,
    pub max_power_limit_mw: u32,
    pub energy_start_mj: f64,
    /// Graphics, SM, memory, video.
    pub max_clocks_mhz: [u32; 4],
    pub fans: u32,
    pub ecc: bool,
    pub persistence: bool,
    pub mig: bool,
    pub compute_capability: (i32, i32),
    pub architecture: u32,
    pub brand: u32,
    pub compute_mode: u32,
    pub supported_throttle_reasons: u64,
    pub supported_events: u64,
    pub pcie_gen: (u32, u32),
    pub pcie_width: (u32, u32),
    pub slowdown_temp_c: u32,
    pub shutdown_temp_c: u32,
    pub health: MemoryHealth,
    /// GPM, NVLink, MIG instances, violation timers, PCIe replays.
    pub hw: Hardware,
    pub signals: DeviceSignals,
    pub processes: Box<[Process]>,
    pub lost: Vec<Window>,
    pub faults: FaultSet,
}

impl Device {
    #[inline]
    pub fn is_lost(&self, t: f64) -> bool {
        self.lost.iter().any(|w| w.contains(t))
    }

    /// Used memory in bytes at `t`, never above what is usable (total minus reserved).
    #[inline]
    pub fn memory_used(&self, t: f64) -> u64 {
        let used = match &self.signals.memory_used_mib {
            Some(s) => mib_to_bytes(s.value(t)),
            None => self
                .processes
                .iter()
                .filter(|p| p.listed_at(t))
                .map(|p| p.memory_bytes(t))
                .sum(),
        };
        used.min(self.memory_total.saturating_sub(self.memory_reserved))
    }

    /// Energy in millijoules since "driver load": the start value plus the integral of power.
    #[inline]
    pub fn energy_mj(&self, t: f64) -> u64 {
        let joules = self.signals.power_w.integral(t.max(0.0));
        (self.energy_start_mj + joules * 1000.0).max(0.0) as u64
    }
}

/// An event on the timeline (an XID, an ECC error, ...).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimEvent {
    pub at: f64,
    pub device: u32,
    pub event_type: u64,
    pub data: u64,
}

/// A period when the driver is gone; calls fail and init fails until it ends, and calls keep
/// failing after it until the client initialises again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriverGone {
    pub window: Window,
    pub error: Ret,
}

/// Init failing with a code, for the first `attempts` calls (`u32::MAX`: always).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InitFault {
    pub error: Ret,
    pub attempts: u32,
}

/// A whole loaded scenario.
#[derive(Debug)]
pub struct Sim {
    /// Where the scenario came from (a path, or "built-in default"), for messages.
    pub origin: String,
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_version: i32,
    pub process_sample_period: f64,
    pub clock: Clock,
    pub devices: Box<[Device]>,
    /// Sorted by time.
    pub events: Box<[SimEvent]>,
    pub system_faults: FaultSet,
    pub init_fault: Option<InitFault>,
    pub init_attempts: AtomicU32,
    pub driver_gone: Vec<DriverGone>,
    /// Simulated time of the latest successful init (f64 bits).
    last_init: AtomicU64,
}

impl Sim {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        origin: String,
        driver_version: String,
        nvml_version: String,
        cuda_version: i32,
        process_sample_period: f64,
        clock: Clock,
        devices: Vec<Device>,
        mut events: Vec<SimEvent>,
        system_faults: FaultSet,
        init_fault: Option<InitFault>,
        driver_gone: Vec<DriverGone>,
    ) -> Sim {
        events.sort_by(|a, b| a.at.total_cmp(&b.at));
        Sim {
            origin,
            driver_version,
            nvml_version,
            cuda_version,
            process_sample_period,
            clock,
            devices: devices.into_boxed_slice(),
            events: events.into_boxed_slice(),
            system_faults,
            init_fault,
            init_attempts: AtomicU32::new(0),
            driver_gone,
            last_init: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
        }
    }

    /// Records a successful init at simulated time `t`.
    pub fn mark_init(&self, t: f64) {
        self.last_init.store(t.to_bits(), Ordering::Release);
    }

    fn last_init(&self) -> f64 {
        f64::from_bits(self.last_init.load(Ordering::Acquire))
    }

    /// The error a call gets at `t` because the driver is gone (or was, since the last init).
    #[inline]
    pub fn driver_error(&self, t: f64) -> Option<Ret> {
        if self.driver_gone.is_empty() {
            return None;
        }
        let last = self.last_init();
        self.driver_gone
            .iter()
            .find(|g| t >= g.window.from && (t < g.window.until || last < g.window.until))
            .map(|g| g.error)
    }

    /// Whether init at `t` must fail because the driver is gone.
    pub fn driver_gone_at(&self, t: f64) -> bool {
        self.driver_gone.iter().any(|g| g.window.contains(t))
    }

    /// The device behind a handle, if the handle points at one of ours.
    #[inline]
    pub fn device(&self, handle: abi::nvmlDevice_t) -> Option<&Device> {
        let base = self.devices.as_ptr() as usize;
        let size = std::mem::size_of::<Device>();
        let off = (handle as usize).checked_sub(base)?;
        if off % size != 0 {
            return None;
        }
        self.devices.get(off / size)
    }

    /// The MIG instance behind a handle (and its parent GPU), if the handle is one of ours.
    pub fn mig(&self, handle: abi::nvmlDevice_t) -> Option<(&Device, &MigInstance)> {
        let size = std::mem::size_of::<MigInstance>();
        self.devices.iter().find_map(|d| {
            let base = d.hw.mig.as_ptr() as usize;
            let off = (handle as usize).checked_sub(base)?;
            if off % size != 0 {
                return None;
            }
            d.hw.mig.get(off / size).map(|m| (d, m))
        })
    }

    /// The opaque handle of a MIG instance: its address in this simulation.
    #[inline]
    pub fn mig_handle(&self, mig: &MigInstance) -> abi::nvmlDevice_t {
        mig as *const MigInstance as abi::nvmlDevice_t
    }

    /// The opaque handle of a device: its address in this (never freed) simulation.
    #[inline]
    pub fn handle(&self, device: &Device) -> abi::nvmlDevice_t {
        device as *const Device as abi::nvmlDevice_t
    }
}

#[inline]
pub fn mib_to_bytes(mib: f64) -> u64 {
    (mib.max(0.0) * 1024.0 * 1024.0) as u64
}

/// Whether `pid` is a running process: it has a `/proc` entry and is not a zombie (a process
/// that exited and was not yet reaped holds no GPU context).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold any byte.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}
