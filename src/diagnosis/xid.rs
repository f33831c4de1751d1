//! What an XID means and what to do about it, from NVIDIA's Xid catalog as gpulse's generated
//! table (`xid_catalog`, see docs/xid.md): the finding's severity and advice follow the
//! catalog's immediate action, and its class says who is at fault. An XID the table lacks is
//! reported with its number and a pointer to the catalog.

use super::findings::Severity;
use super::xid_catalog::{self, XidClass, XidRow};

/// One XID's meaning, for the `hardware_errors` finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XidInfo {
    pub row: &'static XidRow,
    pub severity: Severity,
    /// What to do, for the finding's advice.
    pub action: &'static str,
}

/// The meaning of an XID, when the catalog has it.
pub(crate) fn lookup(xid: u64) -> Option<XidInfo> {
    let row = xid_catalog::lookup(xid)?;
    let (severity, action) = judge(row);
    Some(XidInfo {
        row,
        severity,
        action,
    })
}

/// Severity of an XID not in the table: the catalog has many hardware-class codes, so an
/// unknown one is treated as an error, not waved through.
pub(crate) const UNKNOWN_SEVERITY: Severity = Severity::Error;

/// The finding's severity and advice from the catalog's immediate action: losing the GPU or the
/// node is critical, losing the application an error, what the catalog says to watch or report
/// a warning, what it says to ignore information (a memory event to ignore still a warning: it
/// is what row-remapping and retirement trends are made of).
fn judge(row: &XidRow) -> (Severity, &'static str) {
    match row.immediate_action {
        "restart_bm" => (
            Severity::Critical,
            "catalog action RESTART_BM: drain the node and restart it (cold boot: the GPU is gone \
             from the bus); check power, riser and PCIe errors in dmesg; contact support / RMA on \
             recurrence.",
        ),
        "reset_gpu" => (
            Severity::Critical,
            "catalog action RESET_GPU: drain the GPU's jobs and reset it (nvidia-smi -r, or \
             reboot); contact support if it recurs.",
        ),
        "workflow_xid_48" => (
            Severity::Critical,
            "uncorrectable ECC error (catalog workflow for XID 48): drain the GPU and reset it so \
             the row is remapped; XID 63/64 beside it says whether the repair took; RMA when \
             remapping fails.",
        ),
        "restart_vm" => (
            Severity::Critical,
            "catalog action RESTART_VM: restart the virtual machine the GPU is passed to.",
        ),
        "update_swfw" => (
            Severity::Error,
            "catalog action UPDATE_SWFW: update the driver and GPU firmware, then restart the job.",
        ),
        "restart_app" if row.class == XidClass::Application => (
            Severity::Error,
            "catalog action RESTART_APP: usually the application (illegal access, bad kernel): \
             restart it and check its logs and CUDA error; recurring on one GPU only points at \
             the hardware.",
        ),
        "restart_app" => (
            Severity::Error,
            "catalog action RESTART_APP: restart the application; the GPU stays usable. If it \
             recurs, contact support with an nvidia-bug-report.",
        ),
        "workflow_nvlink_err" | "workflow_nvlink5_err" => (
            Severity::Error,
            "NVLink error (catalog NVLink workflow): whether the GPU needs a reset depends on the \
             error's registers in the kernel log; check `nvidia-smi nvlink -s -e`, drain and reset \
             the GPUs if the errors repeat on a link.",
        ),
        "check_uvm" => (
            Severity::Error,
            "catalog action CHECK_UVM: if the job uses unified memory, drain and reset the GPU; \
             otherwise no action.",
        ),
        "check_mechanicals" => (
            Severity::Warning,
            "catalog action CHECK_MECHANICALS: check the GPU's power cables and seating.",
        ),
        "contact_support" => (
            Severity::Warning,
            "catalog action CONTACT_SUPPORT: report it to NVIDIA with an nvidia-bug-report.",
        ),
        "xid_154" => (
            Severity::Warning,
            "the driver changed the GPU's recovery action (XID 154): the action it names in the \
             kernel log (none, drain P2P, reset, reboot) overrides the XIDs beside it.",
        ),
        "workflow_xid_45" => (
            Severity::Info,
            "benign on its own (a process was killed); look at the XID logged just before it.",
        ),
        "ignore" if row.class == XidClass::Memory => (
            Severity::Warning,
            "catalog action IGNORE: the GPU recorded a memory event; nothing to do now, but trend \
             the count and reset the GPU when drained if a remap is pending.",
        ),
        "ignore" => (
            Severity::Info,
            "catalog action IGNORE: nothing to do on its own; look at the XIDs beside it.",
        ),
        _ => (
            UNKNOWN_SEVERITY,
            "the catalog gives no action for this XID: look it up in NVIDIA's Xid catalog and \
             contact support if it recurs.",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(xid: u64) -> XidInfo {
        lookup(xid).unwrap_or_else(|| panic!("XID {xid} is in the catalog"))
    }

    #[test]
    fn table_is_sorted_and_unique() {
        let table = xid_catalog::TABLE;
        assert!(table.windows(2).all(|w| w[0].xid < w[1].xid));
        assert!(xid_catalog::SOURCE_URL.starts_with("https://docs.nvidia.com/deploy/xid-errors/"));
        assert!(!xid_catalog::CATALOG_VERSION.is_empty());
    }

    /// The known XIDs, each with the catalog's immediate action and gpulse's class, fatality and
    /// severity.
    #[test]
    fn known_xids_as_the_catalog_has_them() {
        use XidClass::*;
        let expect: &[(u64, &str, XidClass, bool, Severity)] = &[
            (13, "restart_app", Application, true, Severity::Error),
            (31, "restart_app", Application, true, Severity::Error),
            (43, "ignore", Application, false, Severity::Info),
            (45, "workflow_xid_45", Informational, false, Severity::Info),
            (48, "workflow_xid_48", Memory, true, Severity::Critical),
            (63, "ignore", Memory, false, Severity::Warning),
            (64, "reset_gpu", Memory, true, Severity::Critical),
            (
                74,
                "workflow_nvlink_err",
                Interconnect,
                false,
                Severity::Error,
            ),
            (79, "restart_bm", Interconnect, true, Severity::Critical),
            (92, "ignore", Memory, false, Severity::Warning),
            (94, "restart_app", Memory, true, Severity::Error),
            (95, "reset_gpu", Memory, true, Severity::Critical),
            (119, "reset_gpu", Driver, true, Severity::Critical),
            (154, "xid_154", Informational, false, Severity::Warning),
        ];
        for &(xid, action, class, fatal, severity) in expect {
            let i = info(xid);
            assert_eq!(
                (i.row.immediate_action, i.row.class, i.row.fatal, i.severity),
                (action, class, fatal, severity),
                "XID {xid}"
            );
        }
        assert_eq!(
            info(79).row.mnemonic,
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
        );
        assert!(info(79).action.contains("RESTART_BM"));
        assert_eq!(info(94).row.investigatory_action, "IGNORE (sympathetic)");
        assert!(info(48).row.meaning.contains("ECC"));
    }

    #[test]
    fn ranges_give_one_row_per_code_and_unused_codes_none() {
        for xid in 99..=105 {
            assert_eq!(
                info(xid).row.mnemonic,
                "ROBUST_CHANNEL_NVJPG1_ERROR..NVJPG7_ERROR"
            );
        }
        // Catalog codes marked Unused, and codes past the catalog.
        for xid in [1, 9, 47, 61, 91, 111, 138, 173, 9999] {
            assert!(lookup(xid).is_none(), "XID {xid}");
        }
        // No action given: the unknown severity, and the pointer to the catalog.
        assert_eq!(info(171).severity, UNKNOWN_SEVERITY);
        assert_eq!(info(171).row.immediate_action, "none");
    }
}
