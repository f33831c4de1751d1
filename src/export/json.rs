//! The OTLP/JSON writer (the OTLP file-exporter format) for every signal: an opentelemetry-proto
//! request as one line of JSON, fields at their proto3 default left out. The stdout transport
//! writes these lines; [`to_otlp_json_line`] is the metrics form tests read.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use serde::Serialize;

/// opentelemetry-proto's serde derive already follows the OTLP/JSON rules (lowerCamelCase
/// names, 64-bit integers as decimal strings, enums as integers, trace and span ids as hex);
/// it also writes every field at its default value, which OTLP/JSON allows but the collector
/// does not, so those are pruned (see [`otlp_json_line`]).
pub fn to_otlp_json_line(request: &ExportMetricsServiceRequest) -> String {
    otlp_json_line(request)
}

/// Members of protobuf `oneof`s: a default value there is still a chosen value (`asDouble: 0`,
/// `stringValue: ""`), so it must not be pruned.
const ONEOF_KEYS: [&str; 13] = [
    "asDouble",
    "asInt",
    "stringValue",
    "boolValue",
    "intValue",
    "doubleValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
    "gauge",
    "sum",
    "histogram",
    "summary",
];

/// Serialises an opentelemetry-proto message as one OTLP/JSON line, leaving out fields at
/// their proto3 default (`""`, `0`, `false`, `[]`) except oneof members.
pub fn otlp_json_line<T: Serialize>(message: &T) -> String {
    // Cannot fail: the messages have string keys only and plain derived Serialize impls.
    let mut value = serde_json::to_value(message)
        .expect("opentelemetry-proto messages always serialise to JSON");
    prune_defaults(&mut value);
    value.to_string()
}

fn prune_defaults(value: &mut serde_json::Value) {
    use serde_json::Value as J;
    match value {
        J::Object(map) => {
            map.retain(|key, v| {
                prune_defaults(v);
                let is_default = match v {
                    J::Null => true,
                    J::Bool(b) => !*b,
                    J::Number(n) => n.as_f64() == Some(0.0),
                    J::String(s) => s.is_empty(),
                    J::Array(a) => a.is_empty(),
                    J::Object(_) => false,
                };
                !is_default || ONEOF_KEYS.contains(&key.as_str())
            });
        }
        J::Array(items) => items.iter_mut().for_each(prune_defaults),
        _ => {}
    }
}
