//! What `gpulse run` and `gpulse top` both do with a closed window: attribute its processes,
//! run the diagnosis rules over the result, and publish the outcome to observers. One
//! implementation, so the live view, `/metrics` and `/status` show exactly what is exported.
//!
//! Observers (`/status`, `/metrics`, the live view) never call NVML or `/proc` themselves: they
//! read the latest [`View`] from a `tokio::sync::watch` channel, which always holds the newest
//! value and never makes the pipeline wait on a slow reader.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::attribution::{
    AttributedWindow, AttributionSettings, Attributor, ParentWatch, Workload,
};
use crate::config::{Config, InspectConfig};
use crate::diagnosis::{Diagnoser, Finding, FindingEvent, Thresholds};
use crate::sampling::Window;

/// The state of a running pipeline as of its last closed window.
#[derive(Debug, Clone)]
pub struct View {
    pub attributed: Arc<AttributedWindow>,
    /// Findings active after this window, as the tracker holds them.
    pub findings: Vec<Finding>,
    /// When the window was analysed.
    pub at: SystemTime,
}

/// Where observers subscribe: `None` until the first window has been analysed.
pub type ViewReceiver = watch::Receiver<Option<Arc<View>>>;

/// Attribution and diagnosis, with the state they keep between windows.
pub struct Analyzer {
    attributor: Attributor,
    diagnoser: Diagnoser,
    parents: ParentWatch,
    own_pod: Option<OwnPod>,
    view: watch::Sender<Option<Arc<View>>>,
}

/// One analysed window.
pub struct Analysis {
    pub attributed: Arc<AttributedWindow>,
    /// Findings that started or cleared with this window.
    pub events: Vec<FindingEvent>,
}

impl Analyzer {
    pub fn new(config: &Config) -> Self {
        Self::with_settings(
            AttributionSettings {
                proc_root: config.proc_root.clone(),
                include_command_line: config.include_command_line,
                read_environ: config.read_environ,
                kubelet_socket: config.kubelet_socket.clone(),
            },
            config.diagnosis.clone(),
        )
    }

    /// The analyzer of `gpulse top`, which resolves only the attribution and diagnosis settings
    /// (an [`InspectConfig`]): a broken exporter setting must not stop the live view.
    pub fn for_inspect(config: &InspectConfig) -> Self {
        Self::with_settings(
            AttributionSettings {
                proc_root: config.proc_root.clone(),
                include_command_line: config.include_command_line,
                read_environ: config.read_environ,
                kubelet_socket: config.kubelet_socket.clone(),
            },
            config.diagnosis.clone(),
        )
    }

    fn with_settings(attribution: AttributionSettings, diagnosis: Thresholds) -> Self {
        Self {
            parents: ParentWatch::new(&attribution.proc_root),
            attributor: Attributor::new(attribution),
            diagnoser: Diagnoser::new(diagnosis),
            own_pod: OwnPod::from_env(),
            view: watch::Sender::new(None),
        }
    }

    /// Attributes `window`, runs the rules over it and publishes the result to observers.
    pub fn analyze(&mut self, window: Window) -> Analysis {
        let mut workloads = self.attributor.resolve_window(&window);
        if let Some(own) = &self.own_pod {
            for workload in workloads.values_mut() {
                own.apply(workload);
            }
        }
        let visible = crate::attribution::attributed::visible_pids(&workloads);
        let usage = self.attributor.usage(&visible);
        let parent_alive = self.parents.parent_alive(&visible);
        let attributed = Arc::new(AttributedWindow {
            window,
            workloads,
            usage,
            parent_alive,
        });
        let events = self.diagnoser.observe(
            &attributed.window,
            &attributed.workloads,
            &attributed.usage,
            &attributed.parent_alive,
        );
        self.view.send_replace(Some(Arc::new(View {
            attributed: Arc::clone(&attributed),
            findings: self.diagnoser.tracker().active().cloned().collect(),
            at: SystemTime::now(),
        })));
        Analysis { attributed, events }
    }

    /// A receiver of every future [`View`] (and the current one, if any).
    pub fn subscribe(&self) -> ViewReceiver {
        self.view.subscribe()
    }

    pub fn diagnoser(&self) -> &Diagnoser {
        &self.diagnoser
    }
}

/// The pod gpulse itself runs in, from the Downward API (`K8S_POD_UID`, `K8S_POD_NAME`,
/// `K8S_POD_NAMESPACE`): in a sidecar, processes whose cgroup names this pod UID are this pod's.
#[derive(Debug, Clone)]
struct OwnPod {
    uid: String,
    name: Option<String>,
    namespace: Option<String>,
}

impl OwnPod {
    fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(Self {
            uid: var("K8S_POD_UID")?,
            name: var("K8S_POD_NAME"),
            namespace: var("K8S_POD_NAMESPACE"),
        })
    }

    fn apply(&self, workload: &mut Workload) {
        if workload.pod_uid.as_deref() == Some(self.uid.as_str()) {
            if workload.pod_name.is_none() {
                workload.pod_name.clone_from(&self.name);
            }
            if workload.namespace_name.is_none() {
                workload.namespace_name.clone_from(&self.namespace);
            }
        }
    }
}
