//! Which metrics are exported: one switch per row of [`METRICS`], as the
//! OpenTelemetry Collector's receivers have one per metric (mdatagen's `metrics: <name>:
//! enabled`), and one for every `.max`/`.min` companion at once. Configuration turns the file's
//! `[metrics]` table and the `GPULSE_METRICS_*` variables into a [`MetricSwitches`]; the metrics
//! builder (and so OTLP and `/metrics`) leaves out what it switches off, and sampling leaves an
//! NVML read out when every metric it feeds is off and nothing else needs it.
//!
//! A companion follows its metric: switching `hw.gpu.utilization` off takes
//! `hw.gpu.utilization.max` and `.min` with it.

use super::metrics::{MetricId, METRICS, METRIC_COUNT};

/// The metrics that are off until a user switches them on. None: every metric gpulse has
/// exported before switches existed stays on, so an upgrade changes no dashboard; a metric
/// added later that few need (and that costs a request's bytes) can start here.
pub const OFF_BY_DEFAULT: &[MetricId] = &[];

const _: () = assert!(
    METRIC_COUNT <= 128,
    "MetricSwitches keeps one bit per metric in a u128"
);

/// Which metrics a window's requests carry. `Default` is every metric on except
/// [`OFF_BY_DEFAULT`], companions included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSwitches {
    /// Bit `id as usize` set: the metric is switched off.
    off: u128,
    /// The `.max`/`.min` companions, all at once.
    companions: bool,
}

impl Default for MetricSwitches {
    fn default() -> Self {
        let mut switches = Self {
            off: 0,
            companions: true,
        };
        for id in OFF_BY_DEFAULT {
            switches.set(*id, false);
        }
        switches
    }
}

impl MetricSwitches {
    /// Switches one metric on or off.
    pub fn set(&mut self, id: MetricId, enabled: bool) {
        let bit = 1u128 << id as usize;
        if enabled {
            self.off &= !bit;
        } else {
            self.off |= bit;
        }
    }

    /// Switches every `.max`/`.min` companion on or off (each one's own switch still counts).
    pub fn set_companions(&mut self, enabled: bool) {
        self.companions = enabled;
    }

    /// Whether the companions are on as a group.
    pub fn companions(&self) -> bool {
        self.companions
    }

    /// Whether `id` is exported: its own switch is on and, for a companion, the companions'
    /// switch and its metric's are too.
    pub fn enabled(&self, id: MetricId) -> bool {
        if self.off & (1u128 << id as usize) != 0 {
            return false;
        }
        match id.companion_of() {
            Some(base) => self.companions && self.enabled(base),
            None => true,
        }
    }

    /// The metrics left out, as one set: what the request builder checks each point against
    /// (one bit test, not a name lookup, on the export's hot path).
    pub fn disabled_set(&self) -> MetricSet {
        MetricSet(
            self.disabled_metrics()
                .fold(0u128, |bits, id| bits | 1u128 << id as usize),
        )
    }

    /// The metrics exported, in request order.
    pub fn enabled_metrics(&self) -> impl Iterator<Item = MetricId> + '_ {
        METRICS.iter().map(|m| m.id).filter(|id| self.enabled(*id))
    }

    /// The metrics left out, in request order.
    pub fn disabled_metrics(&self) -> impl Iterator<Item = MetricId> + '_ {
        METRICS.iter().map(|m| m.id).filter(|id| !self.enabled(*id))
    }
}

/// A set of metrics, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricSet(u128);

impl MetricSet {
    pub fn contains(self, id: MetricId) -> bool {
        self.0 & (1u128 << id as usize) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl MetricId {
    /// Whether a user who sets no switch gets this metric.
    pub fn enabled_by_default(self) -> bool {
        MetricSwitches::default().enabled(self)
    }

    /// The metric a `.max`/`.min` companion carries the extremes of; `None` for the others.
    pub fn companion_of(self) -> Option<MetricId> {
        let name = self.spec().name;
        let base = name
            .strip_suffix(".max")
            .or_else(|| name.strip_suffix(".min"))?;
        MetricId::by_name(base)
    }
}

/// The known metric names closest to `unknown` (Jaro-Winkler similarity, best first, at most
/// `count`), for the error that names a misspelt metric.
pub fn nearest_metric_names(unknown: &str, count: usize) -> Vec<&'static str> {
    let mut scored: Vec<(f64, &'static str)> = METRICS
        .iter()
        .map(|m| (strsim::jaro_winkler(unknown, m.name), m.name))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(count)
        .map(|(_, name)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_on_by_default_and_companions_follow_their_metric() {
        let mut switches = MetricSwitches::default();
        assert_eq!(switches.disabled_metrics().count(), OFF_BY_DEFAULT.len());
        switches.set(MetricId::GpuUtilization, false);
        let off: Vec<_> = switches.disabled_metrics().collect();
        assert_eq!(
            off,
            [
                MetricId::GpuUtilization,
                MetricId::GpuUtilizationMax,
                MetricId::GpuUtilizationMin
            ]
        );
        let set = switches.disabled_set();
        assert!(set.contains(MetricId::GpuUtilizationMin) && !set.contains(MetricId::Power));
        switches.set(MetricId::GpuUtilization, true);
        switches.set_companions(false);
        assert!(switches.enabled(MetricId::GpuUtilization));
        assert!(!switches.enabled(MetricId::GpuUtilizationMax));
        assert!(!switches.enabled(MetricId::TemperatureMax));
        assert!(switches.enabled(MetricId::Temperature));
    }

    #[test]
    fn companions_are_exactly_the_max_and_min_rows() {
        for spec in &METRICS {
            let companion = spec.name.ends_with(".max") || spec.name.ends_with(".min");
            assert_eq!(spec.id.companion_of().is_some(), companion, "{}", spec.name);
        }
    }

    #[test]
    fn nearest_names_put_the_misspelt_metric_first() {
        let near = nearest_metric_names("hw.gpu.utilisation", 3);
        assert_eq!(near[0], "hw.gpu.utilization", "{near:?}");
        assert_eq!(near.len(), 3);
    }
}
