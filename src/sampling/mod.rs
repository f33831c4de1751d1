//! Sampling: one NVML handle for the life of the process, turned into a `Snapshot` each tick, and
//! the `Window` that aggregates the snapshots of one export interval; and the benchmark floor,
//! which makes the sampler's NVML calls and nothing else.

pub mod aggregate;
mod calls;
mod device;
pub mod events;
pub mod floor;
pub mod gpm;
pub mod health;
pub mod mig;
pub mod model;
pub mod nvlink;
pub mod nvml;
pub mod window;

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
