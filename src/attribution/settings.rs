//! `AttributionSettings`: what attribution reads (the procfs root, whether command lines and
//! `environ` are read, the kubelet socket) and where procfs is by default. A value type, shared
//! by the `Attributor` and the per-process reads it makes.

use std::path::PathBuf;

use super::podresources::DEFAULT_KUBELET_SOCKET;

/// The environment variable that, like `--proc-root`, points gpulse at the host's procfs
/// (e.g. `/host/proc`). Resolving flag over variable over default is the caller's job.
pub const HOST_PROC_ENV: &str = "HOST_PROC";
/// Where procfs is when nothing says otherwise.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

/// What attribution reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributionSettings {
    /// The procfs root: `/proc`, or the host's mounted elsewhere (`--proc-root`, `HOST_PROC`).
    pub proc_root: PathBuf,
    /// Export `process.command_line`. Off by default: command lines carry secrets.
    pub include_command_line: bool,
    /// Read `OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES` from `/proc/<pid>/environ`.
    pub read_environ: bool,
    /// The kubelet pod-resources socket; `None` disables pod names.
    pub kubelet_socket: Option<PathBuf>,
}

impl Default for AttributionSettings {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from(DEFAULT_PROC_ROOT),
            include_command_line: false,
            read_environ: true,
            kubelet_socket: Some(PathBuf::from(DEFAULT_KUBELET_SOCKET)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let settings = AttributionSettings::default();
        assert_eq!(settings.proc_root, PathBuf::from("/proc"));
        assert!(
            !settings.include_command_line,
            "command lines carry secrets"
        );
        assert!(settings.read_environ);
        assert_eq!(
            settings.kubelet_socket.as_deref(),
            Some(Path::new(DEFAULT_KUBELET_SOCKET))
        );
    }
}
