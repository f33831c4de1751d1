//! Process-wide state: the loaded simulation (read with one atomic load per call), the init
//! reference count, the count of calls per function (for tests that compare what two clients
//! ask, `nvmlSimGetCallCount`), and the checks every call makes before it reads data
//! (initialised, driver present, handle valid, device not lost, faults).
//!
//! The simulation is loaded at the first init and never freed, so device handles (addresses of
//! its devices) stay valid for the life of the process, as the driver's do.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::abi::{self, nvmlDevice_t, Ret};
use crate::api::Api;
use crate::hardware::MigInstance;
use crate::model::{Device, Sim};
use crate::scenario;

static SIM: AtomicPtr<Sim> = AtomicPtr::new(std::ptr::null_mut());
static REFCOUNT: AtomicU32 = AtomicU32::new(0);
static LOAD_LOCK: Mutex<()> = Mutex::new(());
/// Set once a scenario failed to load: init keeps failing without re-reading or re-printing.
static LOAD_FAILED: OnceLock<String> = OnceLock::new();
static PRINTED: AtomicBool = AtomicBool::new(false);
/// Calls per function (by [`Api`] discriminant) since the library was loaded, counted as each
/// call enters [`session`], answered or not. One uncontended relaxed add per call.
static CALLS: [AtomicU64; 128] = [const { AtomicU64::new(0) }; 128];

/// How many times `api` was called since this library was loaded.
pub fn call_count(api: Api) -> u64 {
    CALLS[api as usize].load(Ordering::Relaxed)
}

/// The loaded simulation, if any.
#[inline]
pub fn sim() -> Option<&'static Sim> {
    let p = SIM.load(Ordering::Acquire);
    // SAFETY: SIM only ever holds null or a pointer from Box::leak, never freed.
    unsafe { p.as_ref() }
}

fn install(sim: Sim) -> &'static Sim {
    let leaked: &'static mut Sim = Box::leak(Box::new(sim));
    SIM.store(leaked, Ordering::Release);
    leaked
}

/// Loads the scenario on first use. A bad scenario prints one message to stderr (the host
/// process keeps running) and every init then fails with `NVML_ERROR_UNKNOWN`.
fn load() -> Result<&'static Sim, Ret> {
    if let Some(s) = sim() {
        return Ok(s);
    }
    let _guard = LOAD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = sim() {
        return Ok(s);
    }
    if LOAD_FAILED.get().is_some() {
        return Err(scenario::LOAD_FAILURE);
    }
    match scenario::load_from_env() {
        Ok(s) => Ok(install(s)),
        Err(e) => {
            let msg = e.to_string();
            if !PRINTED.swap(true, Ordering::AcqRel) {
                eprintln!("{msg}");
            }
            let _ = LOAD_FAILED.set(msg);
            Err(scenario::LOAD_FAILURE)
        }
    }
}

/// `nvmlInit*`: load, apply init faults, count the reference.
pub fn init() -> Ret {
    let sim = match load() {
        Ok(s) => s,
        Err(e) => return e,
    };
    if let Some(f) = sim.init_fault {
        let attempt = sim.init_attempts.fetch_add(1, Ordering::AcqRel);
        if attempt < f.attempts {
            return f.error;
        }
    }
    if sim.clock.started() && sim.driver_gone_at(sim.clock.now()) {
        return abi::DRIVER_NOT_LOADED;
    }
    sim.clock.start();
    sim.mark_init(sim.clock.now());
    REFCOUNT.fetch_add(1, Ordering::AcqRel);
    abi::SUCCESS
}

/// `nvmlShutdown`: drop one reference.
pub fn shutdown() -> Ret {
    let mut cur = REFCOUNT.load(Ordering::Acquire);
    loop {
        if cur == 0 {
            return abi::UNINITIALIZED;
        }
        match REFCOUNT.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return abi::SUCCESS,
            Err(now) => cur = now,
        }
    }
}

/// The checks of a call that takes no device: initialised, driver present, system faults.
/// Returns the simulation and the current simulated time.
#[inline]
pub fn session(api: Api) -> Result<(&'static Sim, f64), Ret> {
    CALLS[api as usize].fetch_add(1, Ordering::Relaxed);
    if REFCOUNT.load(Ordering::Acquire) == 0 {
        return Err(abi::UNINITIALIZED);
    }
    let sim = sim().ok_or(abi::UNINITIALIZED)?;
    let t = sim.clock.now();
    if let Some(e) = sim.driver_error(t) {
        return Err(e);
    }
    sim.system_faults.check(api, t)?;
    Ok((sim, t))
}

/// The checks of a device call: as [`session`], then the handle must be ours, the device not
/// lost, and the device's faults for `api` are applied. A MIG device handle gets
/// `NVML_ERROR_NOT_SUPPORTED`: only the calls that take [`target`] answer for MIG devices, as
/// only a subset of NVML answers for them on a real driver.
#[inline]
pub fn device(api: Api, handle: nvmlDevice_t) -> Result<(&'static Sim, &'static Device, f64), Ret> {
    let (sim, t) = session(api)?;
    let dev = match sim.device(handle) {
        Some(d) => d,
        None if sim.mig(handle).is_some() => return Err(abi::NOT_SUPPORTED),
        None => return Err(abi::INVALID_ARGUMENT),
    };
    checked(sim, dev, api, t)?;
    Ok((sim, dev, t))
}

/// What a handle names: a GPU, or a MIG device on its parent GPU.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    Gpu(&'static Device),
    Mig(&'static Device, &'static MigInstance),
}

impl Target {
    /// The physical GPU (the parent of a MIG device).
    pub fn gpu(self) -> &'static Device {
        match self {
            Target::Gpu(d) | Target::Mig(d, _) => d,
        }
    }
}

/// As [`device`], for the calls that also answer for MIG device handles. A MIG device is lost
/// with its parent and gets its parent's faults.
#[inline]
pub fn target(api: Api, handle: nvmlDevice_t) -> Result<(&'static Sim, Target, f64), Ret> {
    let (sim, t) = session(api)?;
    let target = match sim.device(handle) {
        Some(d) => Target::Gpu(d),
        None => {
            let (d, m) = sim.mig(handle).ok_or(abi::INVALID_ARGUMENT)?;
            Target::Mig(d, m)
        }
    };
    checked(sim, target.gpu(), api, t)?;
    Ok((sim, target, t))
}

/// Lost and fault checks for a device found some other way (by index, UUID, ...).
#[inline]
pub fn checked(_sim: &Sim, dev: &Device, api: Api, t: f64) -> Result<(), Ret> {
    if dev.is_lost(t) {
        return Err(abi::GPU_IS_LOST);
    }
    dev.faults.check(api, t)
}

/// Test support: replaces the loaded simulation and resets the init count, so unit tests in
/// one process can each run their own scenario. Callers serialise through [`test_lock`].
#[doc(hidden)]
pub fn replace_for_tests(sim: Sim) {
    install(sim);
    REFCOUNT.store(0, Ordering::Release);
}

/// A lock for tests that install scenarios (the state they replace is process-wide).
#[doc(hidden)]
pub fn test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
