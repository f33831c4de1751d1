//! The NVML session: opening `libnvidia-ml.so.1` once, and reading every device into a
//! `Snapshot` each tick through the [`DeviceReader`] (`sampling::device`), which caches what
//! never changes about each device and remembers what a device does not give.
//!
//! NVML failures are told apart at three levels, as the rest of gpulse depends on it:
//! - a **field** the device does not give (`NotSupported`, `NoPermission`, or a function the
//!   library does not export) is omitted, remembered so it is not asked again, and said once in
//!   the log. A call's answer is counted once in gpulse.nvml.errors; a field read by field id is
//!   not, whether `nvmlDeviceGetFieldValues` says so for the whole call or in one value's own
//!   return code (there, as for NVLink on a PCIe board, absence is the driver's ordinary answer);
//! - a **device** that is lost (`GpuLost`) is reported with `DeviceStatus::Lost` while the others
//!   go on, and is picked up again when it answers;
//! - the **session** (library missing, driver not loaded, NVML uninitialised) fails `open` or
//!   `sample` with a `SessionError` whose message says what to do.
//!
//! Only what NVML returns is reported: nothing here assumes the simulator.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::device::DeviceReader;
use super::model::Snapshot;

/// The library name gpulse loads by default. nvml-wrapper's own default, `libnvidia-ml.so`, only
/// exists where the driver's development package is installed; the `.so.1` is what the driver
/// (and the NVIDIA container runtime) always provides.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// NVML could not be used at all. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error(
        "could not load the NVML library {path:?} ({detail}). Install the NVIDIA driver \
         (it provides libnvidia-ml.so.1), run the container with the NVIDIA container runtime \
         (NVIDIA_DRIVER_CAPABILITIES=utility), or point --nvml-lib / GPULSE_NVML_LIB at the \
         library; for a machine without a GPU, use the simulator: \
         --nvml-lib target/debug/libnvidia_ml.so"
    )]
    LibraryNotFound { path: PathBuf, detail: String },
    #[error(
        "NVML was loaded from {path:?} but reports that the NVIDIA kernel driver is not loaded. \
         Check `nvidia-smi` on the host and that the driver module is loaded (`lsmod | grep nvidia`)"
    )]
    DriverNotLoaded { path: PathBuf },
    #[error(
        "NVML from {path:?} refused access (no permission). Run gpulse with access to the \
         /dev/nvidia* device files (the NVIDIA container runtime provides them)"
    )]
    NoPermission { path: PathBuf },
    #[error("NVML from {path:?} failed to {action}: {source}")]
    Nvml {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: NvmlError,
    },
}

impl SessionError {
    fn classify(path: &Path, action: &'static str, error: NvmlError) -> Self {
        let path = path.to_path_buf();
        match error {
            NvmlError::LibloadingError(e) => Self::LibraryNotFound {
                path,
                detail: e.to_string(),
            },
            NvmlError::LibraryNotFound => Self::LibraryNotFound {
                path,
                detail: "library not found".into(),
            },
            NvmlError::DriverNotLoaded => Self::DriverNotLoaded { path },
            NvmlError::NoPermission => Self::NoPermission { path },
            source => Self::Nvml {
                path,
                action,
                source,
            },
        }
    }

    /// Whether re-opening NVML later may succeed, which is what `--wait-for-gpu` waits for: a
    /// driver not loaded yet, or not installed yet (its library, looked up by name through the
    /// loader's search path, is missing). A library given as a path (`--nvml-lib
    /// /opt/x/libnvidia-ml.so.1`) that cannot be loaded is a configuration mistake that waiting
    /// does not fix.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::LibraryNotFound { path, .. } => !names_a_file(path),
            Self::DriverNotLoaded { .. } | Self::NoPermission { .. } | Self::Nvml { .. } => true,
        }
    }

    /// A short, stable name for counting these errors in gpulse's own metrics.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::LibraryNotFound { .. } => "library_not_found",
            Self::DriverNotLoaded { .. } => "driver_not_loaded",
            Self::NoPermission { .. } => "no_permission",
            Self::Nvml { .. } => "session",
        }
    }
}

/// Whether `lib` names a file (it has a directory part, as `dlopen` reads it) rather than a
/// library name the loader searches for.
fn names_a_file(lib: &Path) -> bool {
    lib.as_os_str().as_encoded_bytes().contains(&b'/')
}

/// The open NVML session: the library, its versions, and the reader that keeps what it has
/// learnt about each device.
pub struct Sampler {
    nvml: Arc<Nvml>,
    lib_path: PathBuf,
    driver_version: Option<String>,
    cuda_driver_version: Option<String>,
    nvml_version: Option<String>,
    devices: DeviceReader,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("lib_path", &self.lib_path)
            .field("devices", &self.devices.device_infos().count())
            .finish()
    }
}

impl Sampler {
    /// Loads NVML from `lib_path` and initialises it.
    ///
    /// # Errors
    /// A `SessionError` saying why NVML cannot be used and what to do about it.
    pub fn open(lib_path: &Path) -> Result<Self, SessionError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(lib_path))
            .init()
            .map_err(|e| SessionError::classify(lib_path, "initialise", e))?;
        let driver_version = nvml.sys_driver_version().ok();
        let nvml_version = nvml.sys_nvml_version().ok();
        let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        });
        let nvml = Arc::new(nvml);
        Ok(Self {
            devices: DeviceReader::new(Arc::clone(&nvml)),
            nvml,
            lib_path: lib_path.to_path_buf(),
            driver_version,
            cuda_driver_version,
            nvml_version,
        })
    }

    /// Stops reading `fields` and the GPM metrics of `gpm` from NVML (`run` passes those whose
    /// metric is switched off and that nothing else needs); they stay unknown in every snapshot.
    pub fn leave_out_fields(
        &mut self,
        fields: &[crate::schema::DeviceField],
        gpm: &[crate::schema::GpmField],
    ) {
        self.devices.leave_out(fields, gpm);
    }

    /// The NVML handle, shared with the XID event thread and `gpulse check`.
    pub fn nvml(&self) -> &Arc<Nvml> {
        &self.nvml
    }

    /// NVML errors by kind since the session opened.
    pub fn error_counts(&self) -> &BTreeMap<&'static str, u64> {
        self.devices.error_counts()
    }

    /// Takes a first GPM sample on every device that gives GPM, for a caller that samples only
    /// once (`gpulse snapshot`): after waiting [`MIN_PAIR_INTERVAL`](super::gpm::MIN_PAIR_INTERVAL),
    /// `sample` then reports GPM activity. Returns whether any device took one; errors are
    /// left for `sample` to report.
    pub(crate) fn prime_gpm(&mut self) -> bool {
        let count = self.nvml.device_count().unwrap_or(0);
        let mut any = false;
        for index in 0..count {
            if let Ok(device) = self.nvml.device_by_index(index) {
                any |= self.devices.prime_gpm(index, &device);
            }
        }
        any
    }

    /// Reads every device and its processes once.
    ///
    /// # Errors
    /// `SessionError` when NVML as a whole stopped answering (the driver was unloaded, say):
    /// the caller re-opens the session with backoff. A single device failing is not an error:
    /// it is reported as lost in the snapshot.
    pub fn sample(&mut self) -> Result<Snapshot, SessionError> {
        let at = SystemTime::now();
        let count = match self.nvml.device_count() {
            Ok(count) => count,
            Err(e) => {
                self.devices.count_error("session");
                return Err(SessionError::classify(&self.lib_path, "count devices", e));
            }
        };
        let mut devices = Vec::with_capacity(count as usize);
        let mut processes = Vec::new();
        for index in 0..count {
            let sample = match self.nvml.device_by_index(index) {
                Ok(device) => self.devices.sample(index, &device, &mut processes),
                Err(e) => self.devices.no_handle(index, &e),
            };
            devices.push(sample);
        }
        Ok(Snapshot {
            at,
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            nvml_version: self.nvml_version.clone(),
            devices,
            processes,
            events: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_driver_is_worth_waiting_for() {
        let not_found = |path: &str| SessionError::LibraryNotFound {
            path: path.into(),
            detail: "cannot open shared object file".into(),
        };
        // A path names one file: waiting does not make a wrong one right.
        assert!(!not_found("/nonexistent/libnvidia-ml.so.1").is_transient());
        assert!(!not_found("target/debug/libnvidia_ml.so").is_transient());
        // The default name, searched by the loader: the driver may be installed later.
        assert!(not_found(DEFAULT_NVML_LIB).is_transient());
        let path = PathBuf::from("/usr/lib/libnvidia-ml.so.1");
        assert!(SessionError::DriverNotLoaded { path: path.clone() }.is_transient());
        assert!(SessionError::NoPermission { path }.is_transient());
    }
}
