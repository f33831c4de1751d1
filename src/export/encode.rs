//! Protobuf encoding of the metrics request, in one sizing pass.
//!
//! prost writes each nested message's length prefix by asking the message for its
//! `encoded_len()`, which walks the whole subtree again; an OTLP request nests eight deep
//! (request → resource metrics → scope → metric → gauge → point → attribute → value), so prost
//! sizes every attribute several times. Here every nested message of the hot path is sized
//! once, bottom-up, into a list in visiting order, and the writing pass reads the lengths back
//! in the same order. Measured gain over `encode_to_vec` on 64 GPUs × 1024 processes: 8–20%;
//! the rest of the cost is walking the ~300k heap objects of the prost tree itself.
//!
//! The output is byte for byte what `prost::Message::encode_to_vec` writes (fields in tag order,
//! proto3 defaults omitted); the rare parts (exemplars, histograms, scope, entity refs, attribute
//! values) are delegated to prost itself. Tests hold the two encodings equal.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::encoding::{
    self, encode_key, encode_varint, encoded_len_varint, key_len, message, WireType,
};

/// The protobuf encoding of `request`, identical to `request.encode_to_vec()`, a little faster.
pub fn encode_metrics_request(request: &ExportMetricsServiceRequest) -> Vec<u8> {
    let mut sizes = Sizes(Vec::with_capacity(estimate_nodes(request)));
    let total: usize = request
        .resource_metrics
        .iter()
        .map(|rm| delimited_len(1, sizes.resource_metrics(rm)))
        .sum();
    let mut out = Vec::with_capacity(total);
    let mut w = Writer {
        sizes: &sizes.0,
        next: 0,
        out: &mut out,
    };
    for rm in &request.resource_metrics {
        w.resource_metrics(rm);
    }
    debug_assert_eq!(out.len(), total, "sizing and writing passes disagree");
    out
}

fn estimate_nodes(request: &ExportMetricsServiceRequest) -> usize {
    // A rough count so the size list is allocated once in the common case.
    request.resource_metrics.len() * 64
}

fn delimited_len(tag: u32, body: usize) -> usize {
    key_len(tag) + encoded_len_varint(body as u64) + body
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(tag, s.len())
    }
}

fn varint_field_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

/// First pass: body lengths of the nested messages, in the order the writer visits them.
struct Sizes(Vec<usize>);

impl Sizes {
    /// Reserves the slot of a message about to be sized (pre-order), so the writer finds the
    /// lengths in the order it writes the prefixes.
    fn open(&mut self) -> usize {
        self.0.push(0);
        self.0.len() - 1
    }

    fn close(&mut self, slot: usize, len: usize) -> usize {
        self.0[slot] = len;
        len
    }

    fn resource_metrics(&mut self, rm: &ResourceMetrics) -> usize {
        let slot = self.open();
        let mut len = 0;
        if let Some(resource) = &rm.resource {
            len += delimited_len(1, self.resource(resource));
        }
        for sm in &rm.scope_metrics {
            len += delimited_len(2, self.scope_metrics(sm));
        }
        len += string_len(3, &rm.schema_url);
        self.close(slot, len)
    }

    fn resource(&mut self, r: &Resource) -> usize {
        let slot = self.open();
        let mut len = 0;
        for kv in &r.attributes {
            len += delimited_len(1, self.key_value(kv));
        }
        len += varint_field_len(2, u64::from(r.dropped_attributes_count));
        len += message::encoded_len_repeated(3, &r.entity_refs);
        self.close(slot, len)
    }

    fn scope_metrics(&mut self, sm: &ScopeMetrics) -> usize {
        let slot = self.open();
        let mut len = 0;
        if let Some(scope) = &sm.scope {
            len += message::encoded_len(1, scope);
        }
        for m in &sm.metrics {
            len += delimited_len(2, self.metric(m));
        }
        len += string_len(3, &sm.schema_url);
        self.close(slot, len)
    }

    fn metric(&mut self, m: &Metric) -> usize {
        let slot = self.open();
        let mut len =
            string_len(1, &m.name) + string_len(2, &m.description) + string_len(3, &m.unit);
        len += match &m.data {
            Some(Data::Gauge(g)) => delimited_len(5, self.gauge(g)),
            Some(Data::Sum(s)) => delimited_len(7, self.sum(s)),
            Some(other) => other.encoded_len(),
            None => 0,
        };
        for kv in &m.metadata {
            len += delimited_len(12, self.key_value(kv));
        }
        self.close(slot, len)
    }

    fn gauge(&mut self, g: &Gauge) -> usize {
        let slot = self.open();
        let len = self.points(&g.data_points);
        self.close(slot, len)
    }

    fn sum(&mut self, s: &Sum) -> usize {
        let slot = self.open();
        let mut len = self.points(&s.data_points);
        // int32 enums are varints of the sign-extended value, as prost writes them.
        len += varint_field_len(2, s.aggregation_temporality as i64 as u64);
        len += varint_field_len(3, u64::from(s.is_monotonic));
        self.close(slot, len)
    }

    fn points(&mut self, points: &[NumberDataPoint]) -> usize {
        points.iter().map(|p| delimited_len(1, self.point(p))).sum()
    }

    fn point(&mut self, p: &NumberDataPoint) -> usize {
        let slot = self.open();
        let fixed64 = |tag: u32, v: u64| if v == 0 { 0 } else { key_len(tag) + 8 };
        let mut len = fixed64(2, p.start_time_unix_nano) + fixed64(3, p.time_unix_nano);
        len += match p.value {
            Some(number_data_point::Value::AsDouble(_)) => key_len(4) + 8,
            Some(number_data_point::Value::AsInt(_)) => key_len(6) + 8,
            None => 0,
        };
        len += message::encoded_len_repeated(5, &p.exemplars);
        for kv in &p.attributes {
            len += delimited_len(7, self.key_value(kv));
        }
        len += varint_field_len(8, u64::from(p.flags));
        self.close(slot, len)
    }

    fn key_value(&mut self, kv: &KeyValue) -> usize {
        let slot = self.open();
        let mut len = string_len(1, &kv.key);
        if let Some(value) = &kv.value {
            // Attribute values are scalars here: sizing them is shallow.
            len += message::encoded_len(2, value);
        }
        len += varint_field_len(3, kv.key_strindex as i64 as u64);
        self.close(slot, len)
    }
}

/// Second pass: writes the fields, taking each nested message's length from the first pass.
struct Writer<'a> {
    sizes: &'a [usize],
    next: usize,
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    /// Writes the key and length prefix of the next nested message.
    fn open(&mut self, tag: u32) {
        let len = self.sizes[self.next];
        self.next += 1;
        encode_key(tag, WireType::LengthDelimited, self.out);
        encode_varint(len as u64, self.out);
    }

    fn string(&mut self, tag: u32, s: &String) {
        if !s.is_empty() {
            encoding::string::encode(tag, s, self.out);
        }
    }

    fn varint_field(&mut self, tag: u32, v: u64) {
        if v != 0 {
            encode_key(tag, WireType::Varint, self.out);
            encode_varint(v, self.out);
        }
    }

    fn fixed64(&mut self, tag: u32, v: u64) {
        if v != 0 {
            encoding::fixed64::encode(tag, &v, self.out);
        }
    }

    fn resource_metrics(&mut self, rm: &ResourceMetrics) {
        self.open(1);
        if let Some(resource) = &rm.resource {
            self.resource(resource);
        }
        for sm in &rm.scope_metrics {
            self.scope_metrics(sm);
        }
        self.string(3, &rm.schema_url);
    }

    fn resource(&mut self, r: &Resource) {
        self.open(1);
        for kv in &r.attributes {
            self.key_value(1, kv);
        }
        self.varint_field(2, u64::from(r.dropped_attributes_count));
        message::encode_repeated(3, &r.entity_refs, self.out);
    }

    fn scope_metrics(&mut self, sm: &ScopeMetrics) {
        self.open(2);
        if let Some(scope) = &sm.scope {
            message::encode(1, scope, self.out);
        }
        for m in &sm.metrics {
            self.metric(m);
        }
        self.string(3, &sm.schema_url);
    }

    fn metric(&mut self, m: &Metric) {
        self.open(2);
        self.string(1, &m.name);
        self.string(2, &m.description);
        self.string(3, &m.unit);
        match &m.data {
            Some(Data::Gauge(g)) => {
                self.open(5);
                self.points(&g.data_points);
            }
            Some(Data::Sum(s)) => {
                self.open(7);
                self.points(&s.data_points);
                self.varint_field(2, s.aggregation_temporality as i64 as u64);
                self.varint_field(3, u64::from(s.is_monotonic));
            }
            Some(other) => other.encode(self.out),
            None => {}
        }
        for kv in &m.metadata {
            self.key_value(12, kv);
        }
    }

    fn points(&mut self, points: &[NumberDataPoint]) {
        for p in points {
            self.open(1);
            self.fixed64(2, p.start_time_unix_nano);
            self.fixed64(3, p.time_unix_nano);
            match p.value {
                Some(number_data_point::Value::AsDouble(v)) => {
                    encoding::double::encode(4, &v, self.out)
                }
                Some(number_data_point::Value::AsInt(v)) => {
                    encoding::sfixed64::encode(6, &v, self.out)
                }
                None => {}
            }
            message::encode_repeated(5, &p.exemplars, self.out);
            for kv in &p.attributes {
                self.key_value(7, kv);
            }
            self.varint_field(8, u64::from(p.flags));
        }
    }

    fn key_value(&mut self, tag: u32, kv: &KeyValue) {
        self.open(tag);
        self.string(1, &kv.key);
        if let Some(value) = &kv.value {
            message::encode(2, value, self.out);
        }
        self.varint_field(3, kv.key_strindex as i64 as u64);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope};
    use opentelemetry_proto::tonic::metrics::v1::{
        exemplar, AggregationTemporality, Exemplar, Histogram, HistogramDataPoint,
    };
    use prost::Message;

    use super::*;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        }
    }

    fn point(value: Option<number_data_point::Value>, start: u64) -> NumberDataPoint {
        NumberDataPoint {
            attributes: vec![
                kv("hw.id", any_value::Value::StringValue("GPU-1".into())),
                kv("gpu.index", any_value::Value::IntValue(-3)),
                kv("empty", any_value::Value::StringValue(String::new())),
            ],
            start_time_unix_nano: start,
            time_unix_nano: 1_700_000_000_000_000_000,
            exemplars: Vec::new(),
            flags: 0,
            value,
        }
    }

    /// Edge cases of every field: defaults, empty messages, negative ints, the delegated kinds.
    fn tricky_request() -> ExportMetricsServiceRequest {
        let long = "x".repeat(300); // a length prefix of two bytes
        let gauge = Metric {
            name: "g".into(),
            description: long.clone(),
            unit: String::new(),
            metadata: vec![kv("m", any_value::Value::BoolValue(true))],
            data: Some(Data::Gauge(Gauge {
                data_points: vec![
                    point(Some(number_data_point::Value::AsDouble(0.0)), 0),
                    point(Some(number_data_point::Value::AsDouble(-1.5)), 5),
                    point(None, 5),
                    NumberDataPoint {
                        flags: 1,
                        exemplars: vec![Exemplar {
                            time_unix_nano: 9,
                            value: Some(exemplar::Value::AsInt(4)),
                            ..Default::default()
                        }],
                        ..point(Some(number_data_point::Value::AsInt(i64::MIN)), 1)
                    },
                ],
            })),
        };
        let sum = Metric {
            name: "s".into(),
            data: Some(Data::Sum(Sum {
                data_points: vec![point(Some(number_data_point::Value::AsInt(0)), 7)],
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let histogram = Metric {
            name: "h".into(),
            data: Some(Data::Histogram(Histogram {
                data_points: vec![HistogramDataPoint {
                    count: 2,
                    bucket_counts: vec![1, 1],
                    explicit_bounds: vec![0.5],
                    ..Default::default()
                }],
                aggregation_temporality: 1,
            })),
            ..Default::default()
        };
        let empty_sum = Metric {
            name: "e".into(),
            data: Some(Data::Sum(Sum::default())),
            ..Default::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![
                ResourceMetrics {
                    resource: Some(Resource {
                        attributes: vec![
                            kv("service.name", any_value::Value::StringValue(long)),
                            KeyValue {
                                key: "strindex".into(),
                                value: None,
                                key_strindex: -1,
                            },
                        ],
                        dropped_attributes_count: 3,
                        entity_refs: Vec::new(),
                    }),
                    scope_metrics: vec![
                        ScopeMetrics {
                            scope: Some(InstrumentationScope {
                                name: "gpulse".into(),
                                version: "0.1.0".into(),
                                ..Default::default()
                            }),
                            metrics: vec![gauge, sum, histogram, empty_sum, Metric::default()],
                            schema_url: "https://opentelemetry.io/schemas/1.37.0".into(),
                        },
                        ScopeMetrics::default(),
                    ],
                    schema_url: String::new(),
                },
                ResourceMetrics {
                    resource: Some(Resource::default()),
                    ..Default::default()
                },
                ResourceMetrics::default(),
            ],
        }
    }

    #[test]
    fn matches_prost_byte_for_byte() {
        let cases = [ExportMetricsServiceRequest::default(), tricky_request()];
        for request in cases {
            let ours = encode_metrics_request(&request);
            assert_eq!(ours, request.encode_to_vec());
            let back = ExportMetricsServiceRequest::decode(ours.as_slice()).expect("decodes");
            assert_eq!(back, request);
        }
    }
}
