//! Attribution: from the host PIDs NVML reports to `Workload`s — container, pod, namespaced PID,
//! executable, owner and the process's own service name — read from a procfs root and the
//! kubelet pod-resources API.

pub mod workload;

pub use workload::{AttributionMethod, ProcessUsage, Workload};
