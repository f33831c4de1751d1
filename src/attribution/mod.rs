//! Attribution: from the host PIDs NVML reports to `Workload`s — container, pod, namespaced PID,
//! executable, owner, the process's own service name and its job — read from a procfs root and the
//! kubelet pod-resources API, and from what the process says about itself through gpulse's
//! receiver (`sent_identity`), which outranks its environment.
//!
//! `WindowAttributor` turns a whole window into the stage's one output, an `AttributedWindow`;
//! `Attributor` resolves single processes (fallbacks, pod names) through the per-PID cache of
//! `process_identity`, as `settings` says; the other modules are the pure
//! parsers it is built from (`cgroup`, `procfs`, `environ`), the kubelet client
//! (`podresources`), the device-file fallback (`devicefile`), CPU/memory usage (`usage`) and
//! the cgroup CPU limit (`cpu_quota`). `accounting` charges GPU time and energy to processes and
//! rolls them up by job, pod and container, by the charging rule of `energy_share` (shared with
//! span enrichment); `ledger` splits that time and energy by cause (compute, the waits, host, unused)
//! from the step phases the diagnosis stage hands it, both keeping their totals per process and
//! device in a `by_process` store; `rollup_table` is how those roll-ups read in a table.

pub mod accounting;
pub mod attributed;
pub mod attributor;
mod by_process;
pub mod cgroup;
pub mod cpu_quota;
pub mod devicefile;
pub mod energy_share;
pub mod environ;
pub mod ledger;
pub mod parents;
pub mod podresources;
mod process_identity;
pub mod procfiles;
pub mod procfs;
pub mod rollup_table;
pub mod sent_identity;
pub mod settings;
pub mod usage;
pub mod windows;
pub mod workload;

pub use accounting::{Accounts, DeviceAccount, GpuAccountant, Prices, ProcessAccount, Rollup};
pub use attributed::{AttributedProcess, AttributedWindow};
pub use attributor::{Attributor, GpuProcessMig, GpuProcessRef};
pub use cgroup::{parse_cgroup, CgroupIdentity, ContainerRuntime};
pub use environ::{EnvRank, JobId, JobIdSource};
pub use ledger::{Cause, CauseBook, Ledger, StepPhases};
pub use parents::ParentWatch;
pub use podresources::{
    Allocation, PodContainerDevices, PodDirectory, PodResourcesClient, PodResourcesError,
    DEFAULT_KUBELET_SOCKET, DRA_GPU_DRIVER,
};
pub use sent_identity::{DistributedIdentity, SentIdentity};
pub use settings::{AttributionSettings, DEFAULT_PROC_ROOT, HOST_PROC_ENV};
pub use usage::UsageTracker;
pub use windows::{OwnPod, WindowAttributor};
pub use workload::{AttributionMethod, IdentitySource, ProcessUsage, Workload};
