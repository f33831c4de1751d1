//! What common XID numbers mean and what to do about them, condensed from NVIDIA's Xid catalog
//! (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and the GPU memory error
//! management guide (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt). An XID not in the table is
//! reported with its number and a pointer to the catalog.

use super::findings::Severity;

/// One XID's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XidInfo {
    pub xid: u64,
    /// Short meaning, as the catalog names it.
    pub meaning: &'static str,
    pub severity: Severity,
    /// What to do, for the finding's advice.
    pub action: &'static str,
}

const RESTART_APP: &str =
    "usually the application (illegal access, bad kernel): restart it and check \
its logs and CUDA error; recurring on one GPU only points at the hardware.";
const DRAIN_RESET: &str =
    "drain the GPU's jobs, reset the GPU (nvidia-smi -r) or reboot; if it recurs, \
contact support / RMA.";

const TABLE: &[XidInfo] = &[
    XidInfo { xid: 8, meaning: "GPU stopped processing (idle timeout)", severity: Severity::Error, action: RESTART_APP },
    XidInfo { xid: 13, meaning: "graphics engine exception", severity: Severity::Error, action: RESTART_APP },
    XidInfo { xid: 31, meaning: "GPU memory page fault (MMU fault)", severity: Severity::Error, action: RESTART_APP },
    XidInfo { xid: 43, meaning: "GPU stopped processing: channel reset after an application fault", severity: Severity::Error, action: RESTART_APP },
    XidInfo { xid: 45, meaning: "preemptive cleanup: channel torn down after a killed process or an earlier error", severity: Severity::Info, action: "benign on its own (a process was killed); look at the XID logged just before it." },
    XidInfo { xid: 48, meaning: "double-bit (uncorrectable) ECC error", severity: Severity::Critical, action: DRAIN_RESET },
    XidInfo { xid: 61, meaning: "internal micro-controller breakpoint/warning", severity: Severity::Error, action: DRAIN_RESET },
    XidInfo { xid: 62, meaning: "internal micro-controller halt", severity: Severity::Critical, action: DRAIN_RESET },
    XidInfo { xid: 63, meaning: "ECC page retirement or row remapping recorded", severity: Severity::Warning, action: "the GPU recorded a memory repair: reset the GPU when it is drained to apply it; trend the count." },
    XidInfo { xid: 64, meaning: "ECC page retirement or row remapping failed", severity: Severity::Critical, action: DRAIN_RESET },
    XidInfo { xid: 74, meaning: "NVLink error", severity: Severity::Critical, action: "drain the node's multi-GPU jobs, check `nvidia-smi nvlink -s -e`, reset the GPUs; RMA on recurrence." },
    XidInfo { xid: 79, meaning: "GPU has fallen off the bus", severity: Severity::Critical, action: "the GPU is unreachable on PCIe: drain the node and reboot; check power, riser and PCIe errors (dmesg); RMA on recurrence." },
    XidInfo { xid: 92, meaning: "high single-bit ECC error rate", severity: Severity::Warning, action: "correctable errors above threshold predict failure: plan a reset and watch the rate." },
    XidInfo { xid: 94, meaning: "contained uncorrectable ECC error", severity: Severity::Error, action: "only the affected application was stopped: restart it; reset the GPU when drained so row remapping takes effect." },
    XidInfo { xid: 95, meaning: "uncontained uncorrectable ECC error", severity: Severity::Critical, action: "all applications on the GPU are affected: drain it and reset the GPU; RMA on recurrence." },
    XidInfo { xid: 119, meaning: "GSP RPC timeout", severity: Severity::Critical, action: "the GPU System Processor firmware stopped answering: drain and reset the GPU; update the driver if it recurs." },
    XidInfo { xid: 120, meaning: "GSP error", severity: Severity::Critical, action: "the GPU System Processor firmware failed: drain and reset the GPU; update the driver if it recurs." },
];

/// The meaning of an XID, when it is one of the common ones.
pub(crate) fn lookup(xid: u64) -> Option<&'static XidInfo> {
    TABLE.iter().find(|i| i.xid == xid)
}

/// Severity of an XID not in the table: the catalog has many hardware-class codes, so an
/// unknown one is treated as an error, not waved through.
pub(crate) const UNKNOWN_SEVERITY: Severity = Severity::Error;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        assert!(TABLE.windows(2).all(|w| w[0].xid < w[1].xid));
    }

    #[test]
    fn common_xids_are_known() {
        assert_eq!(lookup(79).map(|i| i.severity), Some(Severity::Critical));
        assert!(lookup(48).is_some_and(|i| i.meaning.contains("ECC")));
        assert!(lookup(45).is_some_and(|i| i.severity == Severity::Info));
        assert!(lookup(9999).is_none());
    }
}
