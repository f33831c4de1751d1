//! Sampling: one NVML handle for the life of the process, turned into a `Snapshot` each tick, and
//! the `Window` that aggregates the snapshots of one export interval.

pub mod model;
pub mod window;

pub use model::{
    DeviceInfo, DeviceSample, DeviceStatus, ProcessKind, ProcessSample, Snapshot, XidEvent,
};
pub use window::{DeviceWindow, Gauge, ProcessWindow, Window};
