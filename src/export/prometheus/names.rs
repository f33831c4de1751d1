//! OTLP metric and attribute names as Prometheus's own OTLP translation spells them
//! (`github.com/prometheus/otlptranslator`, strategy `UnderscoreEscapingWithSuffixes`, the
//! default of Prometheus 3's OTLP receiver and of the Collector's prometheus exporter), so a
//! query written against gpulse's OTLP data in Prometheus works unchanged against `/metrics`.
//!
//! The rules, from `metric_namer.go`/`unit_namer.go`/`label_namer.go`:
//! - the name is split on every character outside `[a-zA-Z0-9:]` (so `.` and runs of `_` become
//!   one `_`);
//! - the unit's main part is mapped (`By`→`bytes`, `Cel`→`celsius`, `W`→`watts`, `J`→`joules`,
//!   `s`→`seconds`, `1`→nothing; an unknown unit such as `MHz` is kept as written), a unit in
//!   braces (`{request}`) adds nothing, `/s` adds `per_second`; a suffix already among the name's
//!   tokens is not added again;
//! - a monotonic counter ends in `_total`; a gauge of unit `1` ends in `_ratio` (not an
//!   up-down counter, which Prometheus also calls a gauge but the translator does not);
//! - a label is the attribute key with every character outside `[a-zA-Z0-9_]` replaced by `_`
//!   and runs of `_` collapsed; one starting with a digit gets `key_` in front.

/// How Prometheus types an OTLP metric, as far as naming cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpKind {
    Gauge,
    /// Sum, monotonic.
    Counter,
    /// Sum, not monotonic: a Prometheus gauge without the `_ratio` rule.
    UpDownCounter,
}

/// A translated metric name, split the way `prometheus-client` wants it: it appends `_<unit>`
/// and, for counters, `_total` itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromName {
    /// The name without the unit suffix and without `_total`.
    pub base: String,
    /// The unit suffix the translator added (or found already at the end), if any.
    pub unit: Option<String>,
    pub counter: bool,
}

impl PromName {
    /// The full name as it appears in a sample line of the Prometheus text format.
    pub fn full(&self) -> String {
        let mut name = self.base.clone();
        if let Some(unit) = &self.unit {
            name.push('_');
            name.push_str(unit);
        }
        if self.counter {
            name.push_str("_total");
        }
        name
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ':'
}

fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !is_name_char(c))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

fn main_unit(unit: &str) -> &str {
    match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "1" => "",
        "%" => "percent",
        other => other,
    }
}

fn per_unit(unit: &str) -> &str {
    match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        other => other,
    }
}

/// The unit tokens (main, then `per_…`) an OTLP unit adds to a name.
fn unit_tokens(unit: &str) -> (Vec<String>, Vec<String>) {
    let mut parts = unit.splitn(2, '/');
    let main = parts.next().unwrap_or("").trim();
    let per = parts.next().unwrap_or("").trim();
    let main_tokens = if main.is_empty() || main.contains(['{', '}']) {
        Vec::new()
    } else {
        tokens(main_unit(main))
    };
    let per_tokens = if per.is_empty() || per.contains(['{', '}']) {
        Vec::new()
    } else {
        let mut t = vec!["per".to_string()];
        t.extend(tokens(per_unit(per)));
        t
    };
    (main_tokens, per_tokens)
}

/// The Prometheus name of an OTLP metric. `None` when nothing of the name is left (a name of
/// punctuation only), which Prometheus refuses too.
pub fn metric_name(name: &str, unit: &str, kind: OtlpKind) -> Option<PromName> {
    let mut name_tokens = tokens(name);
    if name_tokens.is_empty() {
        return None;
    }
    let (main, per) = unit_tokens(unit);
    let main = main.join("_");
    let per = per.join("_");
    let mut suffix: Vec<String> = Vec::new();
    // As addUnitTokens: a suffix already among the name's tokens is not added again.
    let has = |tokens: &[String], s: &str| !s.is_empty() && tokens.iter().any(|t| t == s);
    if !main.is_empty() && !has(&name_tokens, &main) {
        suffix.push(main);
    }
    if per.len() > "per_".len() && !has(&name_tokens, &per) {
        suffix.push(per);
    }
    let counter = kind == OtlpKind::Counter;
    if counter {
        name_tokens.retain(|t| t != "total");
    }
    let ratio = unit == "1" && kind == OtlpKind::Gauge;
    if ratio {
        name_tokens.retain(|t| t != "ratio");
        suffix.push("ratio".into());
    }
    if name_tokens.is_empty() {
        return None;
    }
    let mut base = name_tokens.join("_");
    if base.starts_with(|c: char| c.is_ascii_digit()) {
        base.insert(0, '_');
    }
    // The suffixes the translator appends (a unit, a unit and a per unit, or `ratio`) are the
    // unit prometheus-client appends. A unit already at the end of the name is the unit too
    // (OpenMetrics wants the name to end in it), without being repeated.
    let (base, unit) = if suffix.is_empty() {
        split_known_unit(base, unit_tokens(unit).0.join("_"))
    } else {
        (base, Some(suffix.join("_")))
    };
    Some(PromName {
        base,
        unit,
        counter,
    })
}

fn split_known_unit(base: String, unit: String) -> (String, Option<String>) {
    if unit.is_empty() {
        return (base, None);
    }
    match base.strip_suffix(&format!("_{unit}")) {
        Some(stripped) if !stripped.is_empty() => (stripped.to_string(), Some(unit)),
        _ => (base, None),
    }
}

/// The Prometheus label name of an OTLP attribute key. `None` for an empty key or one of
/// underscores only, which Prometheus refuses.
pub fn label_name(key: &str) -> Option<String> {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    if out.chars().all(|c| c == '_') {
        return None;
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use OtlpKind::{Counter, Gauge, UpDownCounter};

    #[test]
    fn names_match_prometheus_otlp_translation() {
        // (OTLP name, unit, kind, what Prometheus 3's OTLP receiver stores)
        #[rustfmt::skip]
        let table = [
            ("hw.gpu.utilization", "1", Gauge, "hw_gpu_utilization_ratio"),
            ("hw.gpu.memory.usage", "By", UpDownCounter, "hw_gpu_memory_usage_bytes"),
            ("hw.temperature", "Cel", Gauge, "hw_temperature_celsius"),
            ("hw.power", "W", Gauge, "hw_power_watts"),
            ("hw.energy", "J", Counter, "hw_energy_joules_total"),
            ("nvidia.gpu.clock", "MHz", Gauge, "nvidia_gpu_clock_MHz"),
            ("hw.gpu.io", "By", Counter, "hw_gpu_io_bytes_total"),
            ("hw.errors", "{error}", Counter, "hw_errors_total"),
            ("hw.status", "1", UpDownCounter, "hw_status"),
            ("gpulse.diagnosis.active", "{finding}", UpDownCounter, "gpulse_diagnosis_active"),
            ("gpulse.export.queue.bytes", "By", UpDownCounter, "gpulse_export_queue_bytes"),
            ("gpulse.export.duration", "s", Gauge, "gpulse_export_duration_seconds"),
            ("process.cpu.utilization", "1", Gauge, "process_cpu_utilization_ratio"),
            ("nvidia.gpu.performance_state", "1", Gauge, "nvidia_gpu_performance_state_ratio"),
            ("requests.total", "1", Counter, "requests_total"),
            ("net.io", "By/s", Gauge, "net_io_bytes_per_second"),
            ("a..b__c", "", Gauge, "a_b_c"),
            ("2xx.count", "", Counter, "_2xx_count_total"),
        ];
        for (name, unit, kind, expected) in table {
            let got = metric_name(name, unit, kind).expect(name);
            assert_eq!(got.full(), expected, "{name} [{unit}] {kind:?}");
        }
    }

    #[test]
    fn the_unit_is_split_off_for_openmetrics() {
        let n = metric_name("hw.energy", "J", Counter).unwrap();
        assert_eq!(
            (n.base.as_str(), n.unit.as_deref(), n.counter),
            ("hw_energy", Some("joules"), true)
        );
        let n = metric_name("gpulse.export.queue.bytes", "By", UpDownCounter).unwrap();
        assert_eq!(
            (n.base.as_str(), n.unit.as_deref()),
            ("gpulse_export_queue", Some("bytes"))
        );
        let n = metric_name("net.io", "By/s", Gauge).unwrap();
        assert_eq!(
            (n.base.as_str(), n.unit.as_deref()),
            ("net_io", Some("bytes_per_second"))
        );
        let n = metric_name("hw.errors", "{error}", Counter).unwrap();
        assert_eq!((n.base.as_str(), n.unit), ("hw_errors", None));
    }

    #[test]
    fn punctuation_only_names_are_refused() {
        assert_eq!(metric_name("...", "1", Gauge), None);
        assert_eq!(label_name(""), None);
        assert_eq!(label_name(".."), None);
    }

    #[test]
    fn labels_match_prometheus_otlp_translation() {
        for (key, expected) in [
            ("container.id", "container_id"),
            ("k8s.pod.name", "k8s_pod_name"),
            ("service.name", "service_name"),
            ("hw.id", "hw_id"),
            ("gpu.index", "gpu_index"),
            ("a..b", "a_b"),
            ("2fa", "key_2fa"),
            ("UUID", "UUID"),
        ] {
            assert_eq!(label_name(key).as_deref(), Some(expected), "{key}");
        }
    }
}
