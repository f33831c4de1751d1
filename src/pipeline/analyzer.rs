//! What `gpulse run` and `gpulse top` both do with a closed window: attribute its processes,
//! run the diagnosis rules over the result, and publish the outcome as a [`View`]. One
//! implementation, so the live view, `/metrics` and `/status` show exactly what is exported.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use super::view::{View, ViewReceiver};
use crate::attribution::cpu_quota::CpuQuotas;
use crate::attribution::{AttributedWindow, AttributionSettings, OwnPod, WindowAttributor};
use crate::attribution::{CauseBook, Prices};
use crate::config::downward::DownwardApi;
use crate::config::AnalysisSettings;
use crate::diagnosis::framework::{FrameworkEvidence, FrameworkHandle, FrameworkLimits};
use crate::diagnosis::ledger_phases::{step_phases, with_saving};
use crate::diagnosis::training::TrainingWindow;
use crate::diagnosis::{Diagnoser, Finding, FindingEvent, Thresholds};
use crate::sampling::Window;

/// Attribution and diagnosis, with the state they keep between windows.
pub struct Analyzer {
    attribution: WindowAttributor,
    diagnoser: Diagnoser,
    view: watch::Sender<Option<Arc<View>>>,
    /// What the training framework sent through the receiver (written by the intake).
    framework: FrameworkHandle,
    cpu_quotas: CpuQuotas,
    /// The held time and energy by cause, kept from window to window.
    ledger: CauseBook,
    /// What the savings in a finding's advice are costed with.
    prices: Prices,
}

/// One analysed window.
pub struct Analysis {
    pub attributed: Arc<AttributedWindow>,
    /// Findings that started or cleared with this window.
    pub events: Vec<FindingEvent>,
    /// The processes' training figures the rules saw, which the window's metrics carry.
    pub training: Arc<TrainingWindow>,
}

impl Analyzer {
    /// The analyzer of every command: `run` and `record` (from their `Config`), `top` and
    /// `snapshot --window` (from their `InspectConfig`) share the same analysis settings.
    pub fn new(settings: &AnalysisSettings) -> Self {
        Self::with_settings(
            AttributionSettings {
                proc_root: settings.proc_root.clone(),
                include_command_line: settings.include_command_line,
                read_environ: settings.read_environ,
                kubelet_socket: settings.kubelet_socket.clone(),
            },
            settings.diagnosis.clone(),
            &settings.downward,
            settings.prices,
        )
    }

    fn with_settings(
        attribution: AttributionSettings,
        diagnosis: Thresholds,
        downward: &DownwardApi,
        prices: Prices,
    ) -> Self {
        Self {
            cpu_quotas: CpuQuotas::new(&attribution.proc_root, CGROUP_ROOT),
            attribution: WindowAttributor::new(attribution, own_pod(downward)).with_prices(prices),
            diagnoser: Diagnoser::new(diagnosis),
            view: watch::Sender::new(None),
            framework: FrameworkHandle::new(FrameworkLimits::default()),
            ledger: CauseBook::new(prices),
            prices,
        }
    }

    /// The framework history the OTLP receiver fills (`enrich::Intake::with_framework`).
    pub fn framework(&self) -> FrameworkHandle {
        self.framework.clone()
    }

    /// Attributes `window`, runs the rules over it and publishes the result to observers.
    pub(crate) fn analyze(&mut self, window: Window) -> Analysis {
        // What each process said about itself (service, rank, job) is adopted before the
        // accounts roll processes up by job.
        let sent_identities = self.framework.lock().sent_identities();
        let mut attributed = self
            .attribution
            .attribute_with_sent_identities(window, &sent_identities);
        let framework = self.framework_evidence(&attributed);
        let events = self
            .diagnoser
            .observe_with_framework(&attributed, &framework);
        // The ledger needs the rules' verdict (the straggler they name) on this very window.
        let phases = step_phases(
            &framework,
            self.diagnoser.tracker().active(),
            attributed.window.start,
        );
        attributed.ledger =
            self.ledger
                .charge(&attributed.accounts, &phases, &attributed.workloads);
        let attributed = Arc::new(attributed);
        // The advice of a wait's finding says what fixing it would have saved, by the ledger.
        let saving = |finding: Finding| {
            with_saving(
                finding,
                &attributed.accounts,
                &attributed.ledger,
                &self.prices,
            )
        };
        let events: Vec<FindingEvent> = events
            .into_iter()
            .map(|event| FindingEvent {
                finding: saving(event.finding),
                ..event
            })
            .collect();
        let training = Arc::new(TrainingWindow::from_evidence(&framework));
        self.view.send_replace(Some(Arc::new(View {
            attributed: Arc::clone(&attributed),
            findings: self
                .diagnoser
                .tracker()
                .active()
                .cloned()
                .map(saving)
                .collect(),
            training: Arc::clone(&training),
            at: SystemTime::now(),
        })));
        Analysis {
            attributed,
            events,
            training,
        }
    }

    /// Attributes `window` without diagnosing or publishing it, so that the next window has CPU
    /// figures for its processes (`gpulse snapshot --window`'s first sample).
    pub(crate) fn prime(&mut self, window: Window) {
        self.attribution.attribute(window);
    }

    /// A receiver of every future [`View`] (and the current one, if any).
    pub fn subscribe(&self) -> ViewReceiver {
        self.view.subscribe()
    }

    pub fn diagnoser(&self) -> &Diagnoser {
        &self.diagnoser
    }

    /// The framework evidence of the window's processes; forgets the processes NVML no longer
    /// lists. The CPU quota is read only for processes that sent step spans (`input_bound`'s
    /// advice names it).
    fn framework_evidence(&mut self, attributed: &AttributedWindow) -> FrameworkEvidence {
        let mut pids: Vec<u32> = attributed.workloads.keys().copied().collect();
        pids.sort_unstable();
        let now = SystemTime::now();
        let lookback = self.diagnoser.thresholds().input_bound.step_lookback;
        let mut evidence = {
            let mut history = self.framework.lock();
            history.retain(&pids, now);
            if history.is_empty() {
                return FrameworkEvidence::default();
            }
            history.evidence(&pids, now, lookback)
        };
        self.cpu_quotas.retain(&pids);
        for (pid, process) in &mut evidence.processes {
            if process.steps.is_some() {
                process.cpu_quota_cores = self.cpu_quotas.cores(*pid);
            }
        }
        evidence
    }
}

/// Where the cgroup file system is mounted, for the CPU quota of a process's cgroup.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The pod gpulse runs in, when the Downward API gave its UID.
fn own_pod(downward: &DownwardApi) -> Option<OwnPod> {
    Some(OwnPod {
        uid: downward.pod_uid.clone()?,
        name: downward.pod_name.clone(),
        namespace: downward.pod_namespace.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the process's telemetry says of itself (its service, rank and the companion's
    /// `pytorch.distributed.job.id`) is its identity, over what its environment says, and the
    /// job's roll-up is under it. The process is this test's own, so attribution reads a real
    /// `/proc` entry.
    #[test]
    fn what_the_process_sends_is_adopted_before_the_roll_up() {
        use std::time::{Duration, UNIX_EPOCH};

        use crate::attribution::accounting::GroupKind;
        use crate::attribution::JobIdSource;
        use crate::attribution::{DistributedIdentity, IdentitySource, SentIdentity};
        use crate::sampling::{DeviceInfo, DeviceWindow, ProcessKind, ProcessWindow};

        let pid = std::process::id();
        let mut analyzer = Analyzer::with_settings(
            AttributionSettings {
                kubelet_socket: None,
                ..AttributionSettings::default()
            },
            Thresholds::default(),
            &DownwardApi::default(),
            Prices::default(),
        );
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
        let info = Arc::new(DeviceInfo {
            index: 0,
            uuid: "GPU-job".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: "00000000:01:00.0".into(),
            serial: None,
            minor_number: Some(0),
            memory_total_bytes: None,
            max_sm_clock_mhz: None,
            max_memory_clock_mhz: None,
            compute_capability: None,
            fan_count: None,
        });
        let window = |end: u64| Window {
            start: at(end - 10),
            end: at(end),
            sample_count: 1,
            driver_version: None,
            cuda_driver_version: None,
            devices: vec![DeviceWindow::empty(Arc::clone(&info), at(0))],
            processes: vec![ProcessWindow {
                pid,
                device_index: 0,
                device_uuid: "GPU-job".into(),
                kind: ProcessKind::Compute,
                first_seen: at(0),
                samples: 1,
                gpu_memory_bytes: None,
                sm_utilization: None,
                memory_utilization: None,
                encoder_utilization: None,
                decoder_utilization: None,
            }],
            xid_events: Vec::new(),
        };

        // Before the companion speaks, the process has no job from it.
        let before = analyzer.analyze(window(10)).attributed;
        assert_ne!(
            before.workloads[&pid].job_id_source,
            Some(JobIdSource::Companion)
        );
        analyzer.framework().lock().record_sent_identity(
            pid,
            SentIdentity::from_resource(
                Some("ddp-bar"),
                [("service.namespace", "ml")],
                Some(DistributedIdentity {
                    rank: 3,
                    world_size: Some(4),
                    job_id: Some("run-42".into()),
                    ..DistributedIdentity::default()
                }),
            ),
            SystemTime::now(),
        );
        let after = analyzer.analyze(window(20)).attributed;
        let workload = &after.workloads[&pid];
        assert_eq!(workload.job_id.as_deref(), Some("run-42"));
        assert_eq!(workload.job_id_source, Some(JobIdSource::Companion));
        assert_eq!(workload.service_name.as_deref(), Some("ddp-bar"));
        assert_eq!(workload.identity_source, IdentitySource::Telemetry);
        assert_eq!(workload.rank.map(|r| (r.rank, r.world_size)), Some((3, 4)));
        assert!(workload
            .resource_attributes
            .contains(&("service.namespace".into(), "ml".into())));
        let job = after
            .accounts
            .rollups
            .iter()
            .find(|r| r.kind == GroupKind::Job)
            .expect("a job roll-up");
        assert_eq!(job.id, "run-42");
        assert_eq!(job.processes, 1);
    }

    #[test]
    fn own_pod_comes_from_the_downward_config() {
        assert!(own_pod(&DownwardApi::default()).is_none());
        let own = own_pod(&DownwardApi {
            pod_uid: Some("uid-a".into()),
            pod_name: Some("trainer-0".into()),
            pod_namespace: Some("ml".into()),
            node_name: None,
        })
        .expect("a pod UID makes an own pod");
        assert_eq!(own.uid, "uid-a");
        assert_eq!(own.name.as_deref(), Some("trainer-0"));
        assert_eq!(own.namespace.as_deref(), Some("ml"));
    }
}
