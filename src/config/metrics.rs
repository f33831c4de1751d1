//! The metric switches (`[metrics]` in the file, `GPULSE_METRICS_*` in the environment), read
//! and resolved into a [`MetricSwitches`]: one switch per metric of the schema, as the
//! OpenTelemetry Collector's receivers have (`metrics: <name>: enabled: false`), and one for
//! every `.max`/`.min` companion at once.
//!
//! ```toml
//! [metrics]
//! companions = false                 # no .max/.min series at all
//! [metrics."nvidia.gpu.sm.occupancy"]
//! enabled = false
//! ```
//!
//! The file's table is read by [`super::file::MetricsFile`]. Precedence as everywhere: the environment beats the file, per metric. A name gpulse does not
//! export stops the start with the nearest known names; so does a name both switched on and off
//! by the environment.

use std::collections::BTreeSet;

use super::env;
use super::error::ConfigError;
use super::layers::{first, Layers};
use crate::schema::{nearest_metric_names, MetricId, MetricSwitches};
use crate::values;

/// How many known names an unknown one is answered with.
const NEAREST: usize = 3;

/// The switches from the file and the environment (`run`'s flags have none: like the
/// Collector's, these are settings of a deployment, not of one invocation).
pub(super) fn resolve(layers: &Layers<'_>) -> Result<MetricSwitches, ConfigError> {
    let mut switches = MetricSwitches::default();
    if let Some(raw) = first([
        layers.env(env::METRICS_COMPANIONS),
        layers.file("metrics.companions", |f| &f.metrics.companions),
    ]) {
        switches.set_companions(raw.parse(values::parse_bool)?);
    }
    if let Some(file) = layers.file {
        for (name, table) in &file.config.metrics.metrics {
            let key = format!("metrics.\"{name}\"");
            let id = known(name, || {
                format!("[{key}] ({})", file.location(table.span()))
            })?;
            if let Some(raw) = file.raw(&format!("{key}.enabled"), &table.get_ref().enabled) {
                switches.set(id, raw.parse(values::parse_bool)?);
            }
        }
    }
    let enabled = env_names(layers, env::METRICS_ENABLED)?;
    let disabled = env_names(layers, env::METRICS_DISABLED)?;
    if let Some(both) = enabled.intersection(&disabled).next() {
        return Err(ConfigError::Invalid {
            setting: format!("{}={}", env::METRICS_ENABLED, env::METRICS_DISABLED),
            reason: format!(
                "{} is both switched on and off; name it in one of them",
                both.spec().name
            ),
        });
    }
    for id in enabled {
        switches.set(id, true);
    }
    for id in disabled {
        switches.set(id, false);
    }
    Ok(switches)
}

/// The metrics a comma-separated variable names.
fn env_names(layers: &Layers<'_>, var: &str) -> Result<BTreeSet<MetricId>, ConfigError> {
    let Some(raw) = layers.env(var) else {
        return Ok(BTreeSet::new());
    };
    raw.text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| known(name, || raw.setting()))
        .collect()
}

/// The metric called `name`, or an error naming it, the `setting` it was written in and the
/// nearest known names.
fn known(name: &str, setting: impl FnOnce() -> String) -> Result<MetricId, ConfigError> {
    MetricId::by_name(name).ok_or_else(|| ConfigError::Invalid {
        setting: setting(),
        reason: format!(
            "gpulse exports no metric named {name:?}; the nearest are {} (docs/metrics.md lists \
             them all)",
            nearest_metric_names(name, NEAREST).join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::file::LoadedFile;

    fn switches(file: &str, vars: &[(&str, &str)]) -> Result<MetricSwitches, ConfigError> {
        let file = LoadedFile::parse(Path::new("/etc/gpulse.toml"), file.to_string())?;
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |name: &str| vars.get(name).cloned();
        resolve(&Layers {
            env: &env,
            file: Some(&file),
        })
    }

    #[test]
    fn no_switch_keeps_every_metric() {
        assert_eq!(switches("", &[]).unwrap(), MetricSwitches::default());
    }

    #[test]
    fn a_file_table_switches_one_metric_off() {
        let s = switches(
            "[metrics.\"nvidia.gpu.sm.occupancy\"]\nenabled = false\n",
            &[],
        )
        .unwrap();
        let off: Vec<_> = s.disabled_metrics().collect();
        assert_eq!(
            off,
            [
                MetricId::SmOccupancy,
                MetricId::SmOccupancyMax,
                MetricId::SmOccupancyMin
            ]
        );
    }

    #[test]
    fn companions_switch_from_file_and_environment() {
        let s = switches("[metrics]\ncompanions = false\n", &[]).unwrap();
        assert!(!s.enabled(MetricId::PowerMax));
        assert!(s.enabled(MetricId::Power));
        // The environment beats the file.
        let s = switches(
            "[metrics]\ncompanions = false\n",
            &[("GPULSE_METRICS_COMPANIONS", "true")],
        )
        .unwrap();
        assert!(s.enabled(MetricId::PowerMax));
        let err = switches("[metrics]\ncompanions = \"maybe\"\n", &[]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("metrics.companions = \"maybe\" (/etc/gpulse.toml:2:14)"),
            "{err}"
        );
    }

    #[test]
    fn the_environment_beats_the_file_per_metric() {
        let file =
            "[metrics.\"hw.power\"]\nenabled = false\n[metrics.\"hw.energy\"]\nenabled = false\n";
        let s = switches(
            file,
            &[
                ("GPULSE_METRICS_ENABLED", "hw.power"),
                (
                    "GPULSE_METRICS_DISABLED",
                    " nvidia.gpu.clock , nvidia.gpu.fan.speed",
                ),
            ],
        )
        .unwrap();
        assert!(s.enabled(MetricId::Power));
        assert!(!s.enabled(MetricId::Energy));
        assert!(!s.enabled(MetricId::Clock));
        assert!(!s.enabled(MetricId::FanSpeed));
    }

    #[test]
    fn an_unknown_name_in_the_file_names_its_place_and_the_nearest_names() {
        let err = switches(
            "\n[metrics.\"nvidia.gpu.sm.ocupancy\"]\nenabled = false\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("[metrics.\"nvidia.gpu.sm.ocupancy\"] (/etc/gpulse.toml:2:"),
            "{err}"
        );
        assert!(
            err.contains("no metric named \"nvidia.gpu.sm.ocupancy\"; the nearest are nvidia.gpu.sm.occupancy, "),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_name_in_the_environment_is_refused() {
        let err =
            switches("", &[("GPULSE_METRICS_DISABLED", "hw.power,hw.temprature")]).unwrap_err();
        let ConfigError::Invalid { setting, reason } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            setting,
            "GPULSE_METRICS_DISABLED=\"hw.power,hw.temprature\""
        );
        assert!(
            reason.contains("\"hw.temprature\"; the nearest are hw.temperature, "),
            "{reason}"
        );
    }

    #[test]
    fn a_name_switched_both_ways_is_refused() {
        let err = switches(
            "",
            &[
                ("GPULSE_METRICS_ENABLED", "hw.power"),
                ("GPULSE_METRICS_DISABLED", "hw.power"),
            ],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("hw.power is both switched on and off"),
            "{err}"
        );
    }

    #[test]
    fn the_lean_example_resolves_and_switches_off_what_it_says() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpulse-lean.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let s = switches(&text, &[]).unwrap();
        assert!(!s.companions());
        let tables = text.matches("enabled = false").count();
        let off = s
            .disabled_metrics()
            .filter(|id| id.companion_of().is_none());
        assert_eq!(off.count(), tables, "each table switches one metric off");
        assert!(s.enabled(MetricId::Power) && s.enabled(MetricId::SmActivity));
    }

    #[test]
    fn a_bare_value_or_an_unknown_key_is_a_file_error() {
        let err = switches("[metrics]\n\"hw.power\" = false\n", &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("[metrics.\"hw.power\"] enabled = false"),
            "{err}"
        );
        let err = switches("[metrics.\"hw.power\"]\nenable = false\n", &[]).unwrap_err();
        assert!(err.to_string().contains("enable"), "{err}");
    }
}
