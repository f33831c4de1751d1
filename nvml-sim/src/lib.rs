//! `nvml-sim`: a stand-in for NVIDIA's `libnvidia-ml.so.1`. Built as a cdylib, it exports the
//! NVML C functions that `nvml-wrapper` and NVIDIA's Python binding (`nvidia-ml-py`) call, with
//! the structs of `nvml-wrapper-sys`, so a client cannot tell it from a driver. What it reports
//! comes from a scenario file (TOML, `NVML_SIM_SCENARIO`; a built-in 2-GPU scenario otherwise):
//! devices, signals over time, processes, XID events and faults. See `README.md` for the format.
//!
//! Layout: [`signal`] (values over time), [`scenario`] (the file format and its compilation),
//! [`model`] (the compiled simulation), [`hardware`] (GPM, MIG, NVLink, violation timers),
//! [`runtime`] (process-wide state and the checks every call makes), [`events`] (event-set
//! delivery), [`api`] (the function catalogue faults refer to), [`abi`] (struct layouts and
//! codes) and [`ffi`] (the exported symbols, also callable from Rust through the rlib).

pub mod abi;
pub mod api;
pub mod events;
pub mod ffi;
pub mod hardware;
pub mod model;
pub mod runtime;
pub mod scenario;
pub mod signal;

pub use ffi::device::*;
pub use ffi::events::*;
pub use ffi::field_values::*;
pub use ffi::gpm::*;
pub use ffi::health::*;
pub use ffi::mig::*;
pub use ffi::nvlink::*;
pub use ffi::process::*;
pub use ffi::system::*;
