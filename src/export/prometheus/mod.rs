//! `/metrics` for Prometheus (`--prometheus-addr`): the windows the OTLP export sends, exposed
//! for scraping, so a Prometheus-only fleet (dcgm-exporter's users) can use gpulse without a
//! Collector.
//!
//! ```text
//! analysed window ──▶ Published::update (once per window: exposition::build, bounded)
//! scrape ──▶ server ──▶ encode (latest exposition, text or OpenMetrics) ──▶ response
//! ```
//!
//! A scrape reads the exposition built from the latest window and formats it: it never calls
//! NVML or reads `/proc`, so scraping often or from several Prometheus servers costs sampling
//! nothing. Names follow Prometheus's own OTLP translation ([`names`]); `--prometheus-names
//! dcgm` adds dcgm-exporter's ([`dcgm`]).

pub mod dcgm;
pub mod docs;
pub mod encode;
pub mod exposition;
pub mod families;
pub mod names;
pub mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::attribution::AttributedWindow;
use crate::config::PrometheusSettings;
use crate::diagnosis::training::TrainingWindow;
use crate::diagnosis::Finding;
use crate::export::metrics::metrics_request_switched;
use crate::export::resource::NodeIdentity;
use crate::schema::MetricSwitches;
pub use encode::{Format, SelfMetrics};
pub use families::Exposition;

/// The latest exposition, shared between the pipeline (which replaces it once per window) and
/// the scrapes (which only read it).
#[derive(Debug)]
pub struct Published {
    settings: PrometheusSettings,
    node: NodeIdentity,
    /// The metrics switched off (`[metrics]`) are gone from `/metrics` as from OTLP.
    switches: MetricSwitches,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    exposition: Arc<Exposition>,
    dropped_total: u64,
    /// Last XID code per device UUID since start (`DCGM_FI_DEV_XID_ERRORS`).
    last_xid: HashMap<String, u64>,
    warned_drop: bool,
}

impl Published {
    pub fn new(settings: PrometheusSettings, node: NodeIdentity) -> Self {
        Self {
            settings,
            node,
            switches: MetricSwitches::default(),
            state: Mutex::new(State::default()),
        }
    }

    /// The same, exposing only the metrics `switches` leave on.
    pub fn with_switches(self, switches: MetricSwitches) -> Self {
        Self { switches, ..self }
    }

    /// Rebuilds the exposition from an analysed window and the findings active after it.
    pub fn update(
        &self,
        attributed: &AttributedWindow,
        training: &TrainingWindow,
        findings: &[Finding],
    ) {
        let mut last_xid = self.lock().last_xid.clone();
        for event in &attributed.window.xid_events {
            last_xid.insert(event.device_uuid.clone(), event.xid);
        }
        // Built outside the lock: a scrape meanwhile gets the previous window, not a wait.
        let request = metrics_request_switched(attributed, training, &self.node, &self.switches);
        let exposition = exposition::build_from(
            &request,
            attributed,
            findings,
            &self.node,
            (self.settings.names, self.settings.max_series),
            &last_xid,
            dcgm::Selection {
                counters: self.settings.dcgm_counters.as_deref(),
                off: self.switches.disabled_set(),
            },
        );
        let mut state = self.lock();
        if exposition.dropped > 0 && !state.warned_drop {
            tracing::warn!(
                "/metrics left out {} series of this window (limit {}); they are counted in \
                 gpulse_prometheus_series_dropped_total. Raise --prometheus-max-series if \
                 Prometheus can take them",
                exposition.dropped,
                self.settings.max_series
            );
            state.warned_drop = true;
        }
        state.dropped_total += exposition.dropped;
        state.last_xid = last_xid;
        state.exposition = Arc::new(exposition);
    }

    /// The latest exposition and the endpoint's own counters.
    pub fn latest(&self) -> (Arc<Exposition>, SelfMetrics) {
        let state = self.lock();
        (
            Arc::clone(&state.exposition),
            SelfMetrics {
                dropped_total: state.dropped_total,
            },
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is replaced whole; a panic elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
