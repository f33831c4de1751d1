//! The attribute table: every attribute key gpulse puts on a data point, a resource, a log record
//! or an enriched span, under a typed [`AttributeId`], with where its definition lives. A key the
//! OpenTelemetry semantic conventions define ([`Owner::SemConv`]) is only named here: its type,
//! brief and stability are the conventions', and gpulse's Weaver registry refers to it. A key
//! gpulse defines itself ([`Owner::Gpulse`]) carries its whole definition (type, brief, examples,
//! enumerated members), from which the registry's attribute groups are generated
//! ([`super::registry`]). Declared like [`METRICS`](super::METRICS): enum and rows in one macro.
//!
//! The builders take keys from here ([`AttributeId::key`]), so a key is written once; the
//! enumerated values other tables hold (clock types, GPM pipes, throttle reasons) are checked
//! against the members declared here by this module's tests.

/// Who defines an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The OpenTelemetry semantic conventions: gpulse's registry refers to it (`ref:`).
    SemConv,
    /// gpulse: its registry defines it (`id:`), at stability `development`.
    Gpulse,
}

/// An attribute's value type, as Weaver's registry spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributeType {
    String,
    Int,
    Double,
    Boolean,
    Strings,
    Ints,
    /// An enumeration of string values (the members of its row).
    Enum,
    /// A family of keys under the attribute's name as a prefix, each of any type
    /// (`gpulse.diagnosis.value.<name>`).
    TemplateAny,
}

impl AttributeType {
    /// The type as the registry writes it (an enumeration is written as its members).
    pub fn as_registry_str(self) -> &'static str {
        match self {
            AttributeType::String | AttributeType::Enum => "string",
            AttributeType::Int => "int",
            AttributeType::Double => "double",
            AttributeType::Boolean => "boolean",
            AttributeType::Strings => "string[]",
            AttributeType::Ints => "int[]",
            AttributeType::TemplateAny => "template[any]",
        }
    }
}

/// One value of an enumerated attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub value: &'static str,
    pub brief: &'static str,
}

const fn member(value: &'static str, brief: &'static str) -> Member {
    Member { value, brief }
}

/// One row of the attribute table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttributeSpec {
    pub id: AttributeId,
    pub key: &'static str,
    pub owner: Owner,
    /// For [`Owner::Gpulse`]: its definition. Empty for the conventions' attributes.
    pub ty: AttributeType,
    pub brief: &'static str,
    /// Example values, written as the registry's YAML list items (`0`, `"GPU-…"`).
    pub examples: &'static [&'static str],
    /// The members of an [`AttributeType::Enum`]; empty otherwise.
    pub members: &'static [Member],
}

impl AttributeId {
    /// This attribute's row of [`ATTRIBUTES`].
    pub const fn spec(self) -> &'static AttributeSpec {
        &ATTRIBUTES[self as usize]
    }

    /// The attribute's key, as exported.
    pub const fn key(self) -> &'static str {
        self.spec().key
    }
}

/// How required an attribute is on a metric, an event or an entity, as the registry writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    Required,
    Recommended,
    /// Required when the condition holds.
    Conditionally(&'static str),
    OptIn,
}

/// One attribute a signal carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uses {
    pub attribute: AttributeId,
    pub requirement: Requirement,
    /// The values the signal gives an enumerated attribute, where that is not every member of
    /// its row (some of them, or values of the conventions' attributes, whose members gpulse
    /// does not restate); docs/metrics.md lists them. Empty: every member, or no enumeration.
    pub values: &'static [&'static str],
}

impl Uses {
    /// The same use, giving only `values`.
    pub(crate) const fn values(self, values: &'static [&'static str]) -> Self {
        Self { values, ..self }
    }

    /// The values the signal gives the attribute: [`Uses::values`], or every member of its row.
    pub fn given_values(&self) -> Vec<&'static str> {
        match self.values {
            [] => self
                .attribute
                .spec()
                .members
                .iter()
                .map(|m| m.value)
                .collect(),
            values => values.to_vec(),
        }
    }
}

pub(crate) const fn req(attribute: AttributeId) -> Uses {
    Uses {
        attribute,
        requirement: Requirement::Required,
        values: &[],
    }
}

pub(crate) const fn rec(attribute: AttributeId) -> Uses {
    Uses {
        attribute,
        requirement: Requirement::Recommended,
        values: &[],
    }
}

pub(crate) const fn when(attribute: AttributeId, condition: &'static str) -> Uses {
    Uses {
        attribute,
        requirement: Requirement::Conditionally(condition),
        values: &[],
    }
}

/// One row of [`ATTRIBUTES`]: `semconv` alone, or gpulse's `Type, "brief", [examples], members`.
macro_rules! attribute_row {
    ($id:ident, $key:literal, semconv) => {
        AttributeSpec {
            id: AttributeId::$id,
            key: $key,
            owner: Owner::SemConv,
            ty: AttributeType::String,
            brief: "",
            examples: &[],
            members: &[],
        }
    };
    ($id:ident, $key:literal, $ty:ident, $brief:literal, [$($example:literal),*], $members:expr) => {
        AttributeSpec {
            id: AttributeId::$id,
            key: $key,
            owner: Owner::Gpulse,
            ty: AttributeType::$ty,
            brief: $brief,
            examples: &[$($example),*],
            members: $members,
        }
    };
}

/// Declares [`AttributeId`] and [`ATTRIBUTES`] from one list, so they cannot disagree.
macro_rules! attribute_table {
    ($( $id:ident: $key:literal, $kind:tt $(, $brief:literal, [$($example:literal),*], $members:expr)? ; )*) => {
        /// Index of an attribute in [`ATTRIBUTES`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum AttributeId {
            $( $id, )*
        }

        /// Number of [`AttributeId`]s.
        pub const ATTRIBUTE_COUNT: usize = [$( AttributeId::$id ),*].len();

        /// Every attribute key gpulse exports.
        pub static ATTRIBUTES: [AttributeSpec; ATTRIBUTE_COUNT] = [$(
            attribute_row!($id, $key, $kind $(, $brief, [$($example),*], $members)?),
        )*];
    };
}

attribute_table! {
    // Device identity, on every device point (the conventions' hardware attributes).
    HwId: "hw.id", semconv;
    HwName: "hw.name", semconv;
    HwType: "hw.type", semconv;
    HwVendor: "hw.vendor", semconv;
    HwModel: "hw.model", semconv;
    HwDriverVersion: "hw.driver_version", semconv;
    HwSerialNumber: "hw.serial_number", semconv;
    HwParent: "hw.parent", semconv;
    HwGpuTask: "hw.gpu.task", semconv;
    HwState: "hw.state", semconv;
    ErrorType: "error.type", semconv;
    NetworkIoDirection: "network.io.direction", semconv;
    CpuMode: "cpu.mode", semconv;
    GpuIndex: "gpu.index", Int,
        "The GPU's index as NVML numbers it (`nvidia-smi`'s `GPU` column, `CUDA_VISIBLE_DEVICES` with the default PCI order).",
        ["0", "7"], &[];
    GpuPciAddress: "gpu.pci_address", String,
        "The GPU's PCI address, domain:bus:device.function, as NVML gives it.",
        ["\"00000000:18:00.0\""], &[];
    HwIds: "hw.ids", Strings,
        "`hw.id` of every GPU a job-level finding concerns.",
        ["[\"GPU-0a0a0a0a-1111-2222-3333-444444444444\"]"], &[];
    // NVIDIA-only attributes.
    NvidiaClockType: "nvidia.gpu.clock.type", Enum,
        "The clock domain of an `nvidia.gpu.clock` point.",
        [], &[
            member("sm", "The streaming multiprocessors' clock."),
            member("memory", "The device memory clock."),
            member("graphics", "The graphics engine clock."),
        ];
    NvidiaThrottleReason: "nvidia.gpu.throttle.reason", Enum,
        "Why the clocks were held down: an NVML clock event reason (`nvidia.gpu.throttle`) or a performance policy (`nvidia.gpu.throttle.time`).",
        [], &[
            member("gpu_idle", "Nothing runs on the GPU (nvmlClocksThrottleReasonGpuIdle)."),
            member("applications_clocks_setting", "Application clocks are set lower (nvmlClocksThrottleReasonApplicationsClocksSetting)."),
            member("sw_power_cap", "The software power cap (nvmlClocksThrottleReasonSwPowerCap)."),
            member("hw_slowdown", "Hardware slowdown: temperature, power brake or supply (nvmlClocksThrottleReasonHwSlowdown)."),
            member("sync_boost", "Held to the clocks of a sync-boost group (reason, and performance policy)."),
            member("sw_thermal_slowdown", "Software thermal slowdown (nvmlClocksThrottleReasonSwThermalSlowdown)."),
            member("hw_thermal_slowdown", "Hardware thermal slowdown (nvmlClocksThrottleReasonHwThermalSlowdown)."),
            member("hw_power_brake_slowdown", "An external power brake (nvmlClocksThrottleReasonHwPowerBrakeSlowdown)."),
            member("display_clock_setting", "Held to the display clock (nvmlClocksThrottleReasonDisplayClockSetting)."),
            member("other", "A reason bit this build of gpulse does not know."),
            member("power", "Performance policy: power (NVML_PERF_POLICY_POWER)."),
            member("thermal", "Performance policy: thermal (NVML_PERF_POLICY_THERMAL)."),
            member("board_limit", "Performance policy: board limit (NVML_PERF_POLICY_BOARD_LIMIT)."),
            member("low_utilization", "Performance policy: low utilisation (NVML_PERF_POLICY_LOW_UTILIZATION)."),
            member("reliability", "Performance policy: board reliability (NVML_PERF_POLICY_RELIABILITY)."),
            member("total_app_clocks", "Performance policy: any application clocks (NVML_PERF_POLICY_TOTAL_APP_CLOCKS)."),
            member("total_base_clocks", "Performance policy: any base clocks (NVML_PERF_POLICY_TOTAL_BASE_CLOCKS)."),
        ];
    NvidiaRemapType: "nvidia.gpu.memory.remap.type", Enum,
        "The kind of memory error that made the row remapper replace a row.",
        [], &[
            member("correctable", "Rows remapped after correctable errors."),
            member("uncorrectable", "Rows remapped after uncorrectable errors."),
        ];
    NvidiaPipe: "nvidia.gpu.pipe", Enum,
        "The SM pipe a GPM activity ratio is about.",
        [], &[
            member("tensor", "Any tensor pipe (NVML_GPM_METRIC_ANY_TENSOR_UTIL)."),
            member("tensor.hmma", "The half-precision tensor pipe (NVML_GPM_METRIC_HMMA_TENSOR_UTIL)."),
            member("tensor.imma", "The integer tensor pipe (NVML_GPM_METRIC_IMMA_TENSOR_UTIL)."),
            member("tensor.dfma", "The double-precision tensor pipe (NVML_GPM_METRIC_DFMA_TENSOR_UTIL)."),
            member("fp16", "The FP16 pipe (NVML_GPM_METRIC_FP16_UTIL)."),
            member("fp32", "The FP32 pipe (NVML_GPM_METRIC_FP32_UTIL)."),
            member("fp64", "The FP64 pipe (NVML_GPM_METRIC_FP64_UTIL)."),
            member("integer", "The integer pipe (NVML_GPM_METRIC_INTEGER_UTIL)."),
        ];
    NvidiaNvLinkLink: "nvidia.gpu.nvlink.link", Int,
        "The NVLink link number, as NVML numbers the device's links.",
        ["0", "17"], &[];
    NvidiaXid: "nvidia.gpu.xid", Int,
        "The XID code of a driver-reported GPU error event.",
        ["79", "94"], &[];
    NvidiaXidClass: "nvidia.gpu.xid.class", Enum,
        "Who or what an XID points at, gpulse's reading of NVIDIA's Xid catalog (docs/xid.md).",
        [], &[
            member("application", "The application's own fault (illegal access, bad kernel): restart it."),
            member("driver", "The driver or GPU firmware (GSP, micro-controllers)."),
            member("memory", "GPU memory: ECC errors, row remapping, page retirement."),
            member("interconnect", "PCIe or NVLink: the GPU fell off the bus, a link failed."),
            member("hardware", "Another GPU engine or board fault (copy engines, power, thermal)."),
            member("informational", "A notice that needs no action on its own (preemptive cleanup, recovery-action changes)."),
        ];
    NvidiaXidAction: "nvidia.gpu.xid.action", String,
        "The Xid catalog's immediate action for the XID, lower case (`restart_app`, `reset_gpu`, `restart_bm`, `ignore`, a `workflow_*`); `none` where the catalog gives none.",
        ["reset_gpu", "restart_app"], &[];
    NvidiaXidFatal: "nvidia.gpu.xid.fatal", Boolean,
        "Whether the catalog's immediate action stops the application or the GPU whatever the event's details.",
        ["true"], &[];
    NvidiaMigGpuInstanceId: "nvidia.gpu.mig.gpu_instance_id", Int,
        "The MIG GPU instance id on its GPU.",
        ["1"], &[];
    NvidiaMigComputeInstanceId: "nvidia.gpu.mig.compute_instance_id", Int,
        "The MIG compute instance id within its GPU instance.",
        ["0"], &[];
    NvidiaMigProfile: "nvidia.gpu.mig.profile", String,
        "The MIG instance's profile name.",
        ["\"1g.10gb\""], &[];
    // gpulse's accounting and process attributes.
    GpulseEnergyAttribution: "gpulse.energy.attribution", Enum,
        "Whether a GPU's energy was charged to its processes.",
        [], &[
            member("attributed", "Charged to the GPU's processes (`process.gpu.energy`)."),
            member("unattributed", "Charged to no process: idle power, busy time of no known process, MIG instances shared by several processes."),
        ];
    GpulseGpuTimeState: "gpulse.gpu.time.state", Enum,
        "Whether the process kept the GPU busy while it held it.",
        [], &[
            member("active", "Windows whose activity reached 5 %."),
            member("idle", "Windows whose activity stayed below 5 %."),
            member("unknown", "Windows whose activity is not knowable (several processes on one MIG instance, no per-process figures)."),
        ];
    GpulseGpuCause: "gpulse.gpu.cause", Enum,
        "What the held GPU time (and its energy) went to: the ledger's cause, see shared-gpus.md.",
        [], &[
            member("compute", "The GPU busy with the process's work, outside the loop's measured waits."),
            member("input_wait", "Inside training steps, the loop blocked on its DataLoader."),
            member("collective_wait", "Inside training steps, a collective in flight while no rank is named the cause."),
            member("straggler_wait", "Inside training steps, a collective in flight while rank_straggler names the rank the job waits for (`gpulse.straggler.rank`)."),
            member("host", "Inside training steps, the GPU not busy while the host prepares, launches or synchronises."),
            member("unused", "Held outside any training step, or without step spans while the GPU was not busy with it (not the `idle` time state: a window below 5 % activity)."),
            member("unknown", "Held while the activity was not knowable and no measured wait explains it."),
        ];
    GpulseStragglerRank: "gpulse.straggler.rank", Int,
        "The rank of the job that rank_straggler named as the one this process waited for.",
        ["5"], &[];
    GpulseAttributionMethod: "gpulse.attribution.method", Enum,
        "How gpulse tied the GPU process to its container and pod.",
        [], &[
            member("host_pid", "The host PID NVML reports, read in the host's /proc."),
            member("device_file", "The one local process holding the GPU's /dev/nvidia<minor> open (a sidecar without the host's PIDs)."),
            member("unresolved", "Neither: only the PID NVML reports is known."),
        ];
    GpulseIdentitySource: "gpulse.identity.source", Enum,
        "Where the process's `service.name` (and its job and rank) came from.",
        [], &[
            member("telemetry", "The resource of the telemetry the process sent through gpulse's receiver."),
            member("environment", "The process's environment (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `RANK`…)."),
            member("default", "Neither: `service.name` is the specification's `unknown_service:<executable>`."),
        ];
    GpulseJobId: "gpulse.job.id", String,
        "The id of the job the process belongs to, as its launcher or its telemetry names it.",
        ["\"run-7\"", "\"slurm-4242\""], &[];
    GpulseJobIdSource: "gpulse.job.id.source", Enum,
        "Where `gpulse.job.id` came from.",
        [], &[
            member("companion", "The PyTorch companion's `pytorch.distributed.job.id`, from its telemetry."),
            member("resource_attributes", "`pytorch.distributed.job.id` in the process's `OTEL_RESOURCE_ATTRIBUTES`."),
            member("torchelastic", "`TORCHELASTIC_RUN_ID` in the process's environment."),
            member("slurm", "`SLURM_JOB_ID` in the process's environment (as `slurm-<id>`)."),
            member("master", "`MASTER_ADDR:MASTER_PORT` of a process with a rank."),
        ];
    // Training attributes (the PyTorch companion's resource, carried on gpulse's process points).
    PytorchRank: "pytorch.distributed.rank", Int,
        "The process's rank in its torch.distributed job.",
        ["0", "3"], &[];
    PytorchJobId: "pytorch.distributed.job.id", String,
        "The id of the torch.distributed job (shared by all its ranks).",
        ["\"run-7\""], &[];
    PytorchLocalRank: "pytorch.distributed.local_rank", Int,
        "The process's rank among the job's processes on its node.",
        ["0", "7"], &[];
    PytorchWorldSize: "pytorch.distributed.world_size", Int,
        "The number of ranks in the job.",
        ["8", "64"], &[];
    PytorchBackend: "pytorch.distributed.backend", String,
        "The torch.distributed backend.",
        ["\"nccl\"", "\"gloo\""], &[];
    PytorchCollectiveWait: "pytorch.distributed.collective.wait", Double,
        "Seconds of a step span during which the rank had a collective in flight.",
        ["0.12"], &[];
    PytorchDataloaderWorkers: "pytorch.dataloader.num_workers", Int,
        "The DataLoader's worker processes (its `num_workers`).",
        ["0", "8"], &[];
    PytorchDataloaderPinMemory: "pytorch.dataloader.pin_memory", Boolean,
        "Whether the DataLoader pins host memory (its `pin_memory`).",
        ["true"], &[];
    // Findings (the log records of `gpulse.diagnosis.finding`, and the active-findings gauge).
    DiagnosisRule: "gpulse.diagnosis.rule", String,
        "The rule that found it (docs/rules.md lists them).",
        ["\"idle_holder\"", "\"throttling\""], &[];
    DiagnosisState: "gpulse.diagnosis.state", Enum,
        "What happened to the finding.",
        [], &[
            member("started", "The condition began to hold."),
            member("escalated", "It still holds, at a higher severity."),
            member("cleared", "It stopped holding."),
        ];
    DiagnosisSeverity: "gpulse.diagnosis.severity", Enum,
        "How bad it is.",
        [], &[
            member("info", "Worth knowing."),
            member("warning", "Costs time or money; act when convenient."),
            member("error", "Breaks or slows work; act now."),
            member("critical", "The GPU or the job is failing."),
        ];
    DiagnosisSubject: "gpulse.diagnosis.subject", String,
        "What the finding is about: `device:<hw.id>`, `workload:<pid>@<hw.id>` or `job:<id>`.",
        ["\"device:GPU-0a0a0a0a-1111-2222-3333-444444444444\""], &[];
    DiagnosisSince: "gpulse.diagnosis.since", String,
        "When the condition began (RFC 3339).",
        ["\"2026-08-20T10:00:00Z\""], &[];
    DiagnosisAdvice: "gpulse.diagnosis.advice", String,
        "What to do about it.",
        ["\"Check cooling (fan speed, chassis airflow, inlet temperature).\""], &[];
    DiagnosisEvidence: "gpulse.diagnosis.evidence", String,
        "The layers the evidence came from, comma-separated: `nvml`, `procfs`, `metrics`, `spans`, `logs` (the last three: what the application sent through gpulse's receiver).",
        ["\"nvml,procfs\""], &[];
    DiagnosisCause: "gpulse.diagnosis.cause", String,
        "The cause, where the rule tells causes apart.",
        ["\"data_loader\""], &[];
    DiagnosisJob: "gpulse.diagnosis.job", String,
        "The job a job-level finding compares the processes of.",
        ["\"pod:3f1c9a57-0d2e-4b8a-9c61-5a7e2d4b0c11\""], &[];
    DiagnosisPids: "gpulse.diagnosis.pids", Ints,
        "The host PIDs of the job's processes the finding compared.",
        ["[4102, 4103]"], &[];
    DiagnosisValue: "gpulse.diagnosis.value", TemplateAny,
        "A figure the rule used, by name (`gpulse.diagnosis.value.idle_seconds`).",
        ["4.0"], &[];
    // The node and process resources.
    ServiceName: "service.name", semconv;
    ServiceInstanceId: "service.instance.id", semconv;
    ServiceVersion: "service.version", semconv;
    ServiceNamespace: "service.namespace", semconv;
    DeploymentEnvironmentName: "deployment.environment.name", semconv;
    HostName: "host.name", semconv;
    TelemetrySdkName: "telemetry.sdk.name", semconv;
    TelemetrySdkLanguage: "telemetry.sdk.language", semconv;
    TelemetrySdkVersion: "telemetry.sdk.version", semconv;
    ProcessPid: "process.pid", semconv;
    ProcessVpid: "process.vpid", semconv;
    ProcessCreationTime: "process.creation.time", semconv;
    ProcessExecutableName: "process.executable.name", semconv;
    ProcessOwner: "process.owner", semconv;
    ProcessCommandLine: "process.command_line", semconv;
    CodeStacktrace: "code.stacktrace", semconv;
    ContainerId: "container.id", semconv;
    ContainerRuntime: "container.runtime.name", semconv;
    K8sPodUid: "k8s.pod.uid", semconv;
    K8sPodName: "k8s.pod.name", semconv;
    K8sNamespaceName: "k8s.namespace.name", semconv;
    K8sContainerName: "k8s.container.name", semconv;
    K8sNodeName: "k8s.node.name", semconv;
    // The spans gpulse's receiver enriches (docs/enrich.md).
    SpanGpuIds: "gpulse.gpu.ids", Strings,
        "`hw.id` of the GPUs the span's process used during the span.",
        ["[\"GPU-0a0a0a0a-1111-2222-3333-444444444444\"]"], &[];
    SpanGpuUtilizationMean: "gpulse.gpu.utilization.mean", Double,
        "Mean device utilisation (ratio) of those GPUs over the span.",
        ["0.82"], &[];
    SpanGpuUtilizationMax: "gpulse.gpu.utilization.max", Double,
        "Highest sampled device utilisation (ratio) of those GPUs over the span.",
        ["0.97"], &[];
    SpanProcessUtilizationMean: "gpulse.gpu.process.utilization.mean", Double,
        "Mean SM share (ratio) of the span's process over the span.",
        ["0.64"], &[];
    SpanProcessUtilizationMax: "gpulse.gpu.process.utilization.max", Double,
        "Highest sampled SM share (ratio) of the span's process over the span.",
        ["0.9"], &[];
    SpanMemoryPeak: "gpulse.gpu.memory.peak", Int,
        "Largest GPU memory (bytes) the span's process held over the span, all its GPUs.",
        ["4294967296"], &[];
    SpanPowerMean: "gpulse.gpu.power.mean", Double,
        "Mean power (W) attributable to the span's process over the span.",
        ["312.5"], &[];
    SpanEnergy: "gpulse.gpu.energy", Double,
        "Energy (J) attributable to the span's process over the span.",
        ["1250.0"], &[];
    SpanSamples: "gpulse.gpu.samples", Int,
        "NVML samples the span's figures come from.",
        ["12"], &[];
    SpanMatch: "gpulse.gpu.match", Enum,
        "How gpulse found the span's process.",
        [], &[
            member("resource", "From the span's resource (`process.pid`, `container.id` + `process.vpid`)."),
            member("connection", "From the OTLP connection's peer process."),
        ];
}

/// The attributes of `owner`, in table order.
pub fn attributes_of(owner: Owner) -> impl Iterator<Item = &'static AttributeSpec> {
    ATTRIBUTES.iter().filter(move |a| a.owner == owner)
}

#[cfg(test)]
mod tests {
    use super::super::{throttle_reasons, DEVICE_FIELDS, GPM_FIELDS};
    use super::*;

    #[test]
    fn ids_match_positions_and_keys_are_unique() {
        for (i, spec) in ATTRIBUTES.iter().enumerate() {
            assert_eq!(spec.id as usize, i, "{} is out of place", spec.key);
        }
        let mut keys: Vec<&str> = ATTRIBUTES.iter().map(|a| a.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), ATTRIBUTES.len());
    }

    /// gpulse's own attributes are whole definitions: a brief, members exactly for an
    /// enumeration, examples for the rest (the registry's policies ask for them).
    #[test]
    fn gpulse_attributes_are_defined() {
        for a in attributes_of(Owner::Gpulse) {
            assert!(a.brief.ends_with('.'), "{}: brief", a.key);
            assert_eq!(
                a.ty == AttributeType::Enum,
                !a.members.is_empty(),
                "{}: members exactly for an enumeration",
                a.key
            );
            assert!(
                a.ty == AttributeType::Enum || !a.examples.is_empty(),
                "{}: examples",
                a.key
            );
        }
    }

    fn members(id: AttributeId) -> Vec<&'static str> {
        id.spec().members.iter().map(|m| m.value).collect()
    }

    /// Every value the field tables export for an enumerated attribute is one of its members,
    /// so the registry cannot miss one the builders send.
    #[test]
    fn field_tables_use_declared_members() {
        let fields = DEVICE_FIELDS
            .iter()
            .map(|f| f.metric)
            .chain(GPM_FIELDS.iter().map(|f| f.metric));
        for metric in fields {
            let Some((key, value)) = metric.attribute else {
                continue;
            };
            let spec = ATTRIBUTES
                .iter()
                .find(|a| a.key == key)
                .unwrap_or_else(|| panic!("{key} is not in ATTRIBUTES"));
            if spec.owner == Owner::Gpulse {
                assert!(
                    members(spec.id).contains(&value),
                    "{key} = {value} is not a member"
                );
            }
        }
        for (_, reason) in throttle_reasons() {
            assert!(members(AttributeId::NvidiaThrottleReason).contains(reason));
        }
    }
}
