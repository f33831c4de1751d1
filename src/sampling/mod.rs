//! Sampling: one NVML handle for the life of the process, turned into a `Snapshot` each tick, and
//! the `Window` that aggregates the snapshots of one export interval; and the benchmark floor,
//! which makes the sampler's NVML calls and nothing else.

pub(crate) mod aggregate;
mod calls;
mod device;
pub mod events;
pub mod floor;
pub(crate) mod gpm;
pub(crate) mod health;
pub(crate) mod mig;
pub(crate) mod model;
pub(crate) mod nvlink;
pub(crate) mod nvml;
pub(crate) mod window;

pub use aggregate::WindowAggregator;
pub use model::{
    DeviceInfo, DeviceSample, DeviceStatus, GpmActivity, MigInstanceInfo, MigInstanceSample,
    NvLinkSample, ProcessKind, ProcessMig, ProcessSample, RemappedRows, Snapshot, ViolationTimes,
    XidEvent,
};
pub use nvml::{Sampler, SessionError, DEFAULT_NVML_LIB};
pub use window::{
    DeviceWindow, FieldWindows, Gauge, GpmWindow, MigInstanceWindow, NvLinkWindow, ProcessWindow,
    Window,
};
