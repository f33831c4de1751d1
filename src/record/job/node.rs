//! One node's recording as the job report reads it: the OTLP/JSON lines of one file (what
//! `gpulse run --exporter stdout`, `gpulse record` or a Collector's file exporter wrote on that
//! node), read line by line so that one bad line costs that line only. From it: the node's name,
//! every GPU process with its job, rank and ledger (`process.gpu.time` and `process.gpu.energy`
//! by cause), each rank's training steps (the companion's `step` and `data_wait` spans, matched to
//! the rank by the span resource's job id and rank), and the node's single-node [`Recording`]
//! (devices, clocks, throttling, findings), which the existing reader builds from the same lines.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::attribution::Cause;
use crate::record::otlp_json_reader::{self, attributes, nanos, point_value, scoped, ReadError};
use crate::record::recording::Recording;
use crate::schema::attributes::AttributeId as A;
use crate::schema::MetricId;

/// Something wrong with one input that did not stop the report: it is shown in the summary, the
/// JSON and the page, so nobody mistakes a partial job for a whole one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub file: PathBuf,
    /// The line, when the problem is one line's.
    pub line: Option<usize>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{} line {line}: {}", self.file.display(), self.what),
            None => write!(f, "{}: {}", self.file.display(), self.what),
        }
    }
}

/// One training step of a rank, from its `step` span (seconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Step {
    pub start: f64,
    pub end: f64,
    /// `pytorch.distributed.collective.wait` on the span: seconds with a collective in flight.
    pub collective_wait: Option<f64>,
    /// Seconds of the step its `data_wait` child spans covered.
    pub data_wait: f64,
}

/// A GPU process of one node: who it is and what its held time went to.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeProcess {
    pub pid: u32,
    pub device_uuid: String,
    pub device_index: u32,
    pub job_id: Option<String>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub service_name: Option<String>,
    /// Seconds held by (cause, straggler rank), the counters' last totals.
    pub seconds: BTreeMap<(Cause, Option<u32>), f64>,
    /// Joules charged by (cause, straggler rank).
    pub joules: BTreeMap<(Cause, Option<u32>), f64>,
}

/// A finding a node raised, with what the job report compares: the rule, its cause, and the
/// job and rank of the process it is about (attributes of the log record, not values).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeFinding {
    pub rule: String,
    pub cause: Option<String>,
    pub job_id: Option<String>,
    pub rank: Option<u32>,
    pub gpu_index: Option<u32>,
    pub summary: String,
    /// `gpulse.diagnosis.value.*`, by the name after the prefix.
    pub values: BTreeMap<String, String>,
}

/// One node: its processes, its ranks' steps and its single-node recording.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// `host.name` as gpulse's resources carry it, else the file's name.
    pub name: String,
    pub files: Vec<PathBuf>,
    pub processes: Vec<NodeProcess>,
    /// Steps by (job id, rank), in time order.
    pub steps: BTreeMap<(String, u32), Vec<Step>>,
    /// The findings it raised (`started`), once each by rule and subject.
    pub raised: Vec<NodeFinding>,
    /// Devices, findings and the timeline, as `gpulse report` of this file alone shows them.
    pub recording: Option<Recording>,
}

/// What reading one file gave: the node (when the file held anything of gpulse's) and the
/// problems met on the way.
pub(crate) struct Read {
    pub node: Option<Node>,
    pub problems: Vec<Problem>,
}

/// Reads one file. Lines that are not OTLP/JSON (a file cut short by a crash, a stray log
/// line) are each a [`Problem`] and the rest of the file is still read; a file with no OTLP
/// line at all, or none of gpulse's, is one problem and no node.
pub(crate) fn read_file(path: &Path) -> Read {
    let problem = |line: Option<usize>, what: String| Problem {
        file: path.to_path_buf(),
        line,
        what,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => {
            return Read {
                node: None,
                problems: vec![problem(None, format!("cannot be read: {e}"))],
            }
        }
    };
    read(std::io::BufReader::new(file), path)
}

/// Reads OTLP/JSON lines from `input`; `path` names it.
pub(crate) fn read(input: impl BufRead, path: &Path) -> Read {
    let mut problems = Vec::new();
    let mut good = String::new();
    let mut builder = Builder::default();
    let mut lines = 0usize;
    for (n, line) in input.lines().enumerate() {
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                problems.push(Problem {
                    file: path.to_path_buf(),
                    line: Some(n + 1),
                    what: format!("cannot be read ({e}); the lines after it were not read"),
                });
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(&line) {
            Ok(value) => value,
            Err(e) => {
                problems.push(Problem {
                    file: path.to_path_buf(),
                    line: Some(n + 1),
                    what: format!("not OTLP/JSON ({e}); the line was left out"),
                });
                continue;
            }
        };
        let mut known = false;
        for (key, walk) in [
            (
                "resourceMetrics",
                Builder::resource_metrics as fn(&mut Builder, &Value),
            ),
            ("resourceLogs", Builder::resource_logs),
            ("resourceSpans", Builder::resource_spans),
        ] {
            if let Some(list) = value.get(key).and_then(Value::as_array) {
                known = true;
                list.iter().for_each(|r| walk(&mut builder, r));
            }
        }
        if !known {
            problems.push(Problem {
                file: path.to_path_buf(),
                line: Some(n + 1),
                what: "not an OTLP request (no resourceMetrics, resourceLogs or resourceSpans); the line was left out".into(),
            });
            continue;
        }
        lines += 1;
        good.push_str(&line);
        good.push('\n');
    }
    let recording = match otlp_json_reader::read(good.as_bytes(), path) {
        Ok(recording) => Some(recording),
        Err(ReadError::Empty { .. }) => None,
        Err(e) => {
            problems.push(Problem {
                file: path.to_path_buf(),
                line: None,
                what: e.to_string(),
            });
            None
        }
    };
    if lines == 0 || (recording.is_none() && builder.processes.is_empty()) {
        problems.push(Problem {
            file: path.to_path_buf(),
            line: None,
            what: if lines == 0 {
                "holds no OTLP/JSON line: `gpulse report` reads what `gpulse run --exporter stdout`, `gpulse record` or a Collector's file exporter writes".into()
            } else {
                "holds no gpulse GPU metrics (no hw.gpu.* or process.gpu.* points)".into()
            },
        });
        return Read {
            node: None,
            problems,
        };
    }
    let name = builder.host.clone().unwrap_or_else(|| {
        path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        )
    });
    Read {
        node: Some(builder.finish(name, path, recording)),
        problems,
    }
}

#[derive(Default)]
struct Builder {
    host: Option<String>,
    processes: BTreeMap<(u32, String), NodeProcess>,
    /// Step spans by (job, rank): (span id, start, end, wait).
    steps: BTreeMap<(String, u32), Vec<StepSpan>>,
    /// data_wait spans by (job, rank): (parent span id, seconds).
    data_waits: BTreeMap<(String, u32), Vec<(String, f64)>>,
    raised: BTreeMap<(String, String), NodeFinding>,
    /// `process.gpu.time`'s last totals by (pid, device, cause, straggler rank, state): each
    /// state is a counter of its own, summed over the states at the end.
    time_by_state: BTreeMap<TimeKey, f64>,
}

/// A `step` span before its `data_wait` children are matched: (span id, start, end, wait).
type StepSpan = (String, f64, f64, Option<f64>);

type TimeKey = (u32, String, Cause, Option<u32>, Option<String>);

fn text(attrs: &std::collections::HashMap<String, String>, key: &str) -> Option<String> {
    attrs.get(key).cloned().filter(|v| !v.is_empty())
}

fn seconds_of(v: Option<&Value>) -> Option<f64> {
    nanos(v).map(|ns| ns as f64 / 1e9)
}

impl Builder {
    fn resource_metrics(&mut self, rm: &Value) {
        let resource = attributes(rm.get("resource"));
        if self.host.is_none() {
            self.host = text(&resource, A::HostName.key());
        }
        let Some(pid) = resource
            .get(A::ProcessPid.key())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return;
        };
        for metric in scoped(rm, "scopeMetrics", "metrics") {
            let id = metric
                .get("name")
                .and_then(Value::as_str)
                .and_then(MetricId::by_name);
            let Some(id) = id.filter(|id| {
                matches!(
                    id,
                    MetricId::ProcessGpuTime
                        | MetricId::ProcessGpuEnergy
                        | MetricId::ProcessGpuMemoryUsage
                )
            }) else {
                continue;
            };
            let points = metric
                .get("gauge")
                .or_else(|| metric.get("sum"))
                .and_then(|d| d.get("dataPoints"))
                .and_then(Value::as_array);
            for point in points.into_iter().flatten() {
                let attrs = attributes(Some(point));
                let (Some(uuid), Some(value)) = (text(&attrs, A::HwId.key()), point_value(point))
                else {
                    continue;
                };
                let process = self
                    .processes
                    .entry((pid, uuid.clone()))
                    .or_insert_with(|| NodeProcess {
                        pid,
                        device_uuid: uuid,
                        ..NodeProcess::default()
                    });
                process.device_index = attrs
                    .get(A::GpuIndex.key())
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(process.device_index);
                let number = |key: &str| resource.get(key).and_then(|v| v.parse::<u32>().ok());
                process.job_id = process
                    .job_id
                    .take()
                    .or_else(|| text(&resource, A::GpulseJobId.key()))
                    .or_else(|| text(&resource, A::PytorchJobId.key()));
                process.rank = process.rank.or_else(|| number(A::PytorchRank.key()));
                process.world_size = process
                    .world_size
                    .or_else(|| number(A::PytorchWorldSize.key()));
                process.service_name = process
                    .service_name
                    .take()
                    .or_else(|| text(&resource, A::ServiceName.key()));
                let Some(cause) = attrs
                    .get(A::GpulseGpuCause.key())
                    .and_then(|c| Cause::ALL.iter().copied().find(|k| k.as_str() == c))
                else {
                    continue;
                };
                let straggler = attrs
                    .get(A::GpulseStragglerRank.key())
                    .and_then(|r| r.parse::<u32>().ok());
                // Counters since the process was first seen: the largest total is the run's.
                // process.gpu.time has one series per state too; they are summed below.
                let state = attrs.get(A::GpulseGpuTimeState.key()).cloned();
                match id {
                    MetricId::ProcessGpuTime => {
                        let key = (pid, process.device_uuid.clone(), cause, straggler, state);
                        let slot = self.time_by_state.entry(key).or_insert(0.0);
                        *slot = slot.max(value);
                    }
                    MetricId::ProcessGpuEnergy => {
                        let slot = process.joules.entry((cause, straggler)).or_insert(0.0);
                        *slot = slot.max(value);
                    }
                    _ => {}
                }
            }
        }
    }

    fn resource_logs(&mut self, rl: &Value) {
        let resource = attributes(rl.get("resource"));
        if self.host.is_none() {
            self.host = text(&resource, A::HostName.key());
        }
        for record in scoped(rl, "scopeLogs", "logRecords") {
            let attrs = attributes(Some(record));
            let (Some(rule), Some("started")) = (
                text(&attrs, A::DiagnosisRule.key()),
                attrs.get(A::DiagnosisState.key()).map(String::as_str),
            ) else {
                continue;
            };
            // On the record, or on its resource (the process it is about).
            let get = |key: &str| text(&attrs, key).or_else(|| text(&resource, key));
            let subject = get(A::DiagnosisSubject.key()).unwrap_or_default();
            self.raised
                .entry((rule.clone(), subject))
                .or_insert_with(|| NodeFinding {
                    cause: get(A::DiagnosisCause.key()),
                    job_id: get(A::PytorchJobId.key()).or_else(|| get(A::GpulseJobId.key())),
                    rank: get(A::PytorchRank.key()).and_then(|r| r.parse().ok()),
                    gpu_index: get(A::GpuIndex.key()).and_then(|i| i.parse().ok()),
                    summary: record
                        .get("body")
                        .and_then(|b| b.get("stringValue"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    values: attrs
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((
                                k.strip_prefix("gpulse.diagnosis.value.")?.to_string(),
                                v.clone(),
                            ))
                        })
                        .collect(),
                    rule,
                });
        }
    }

    fn resource_spans(&mut self, rs: &Value) {
        let resource = attributes(rs.get("resource"));
        let (Some(job), Some(rank)) = (
            text(&resource, A::PytorchJobId.key()),
            resource
                .get(A::PytorchRank.key())
                .and_then(|r| r.parse::<u32>().ok()),
        ) else {
            return;
        };
        for span in scoped(rs, "scopeSpans", "spans") {
            let (Some(start), Some(end)) = (
                seconds_of(span.get("startTimeUnixNano")),
                seconds_of(span.get("endTimeUnixNano")),
            ) else {
                continue;
            };
            let id = |key: &str| {
                span.get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            match span.get("name").and_then(Value::as_str) {
                Some("step") => {
                    let wait = attributes(Some(span))
                        .get(A::PytorchCollectiveWait.key())
                        .and_then(|w| w.parse::<f64>().ok());
                    self.steps.entry((job.clone(), rank)).or_default().push((
                        id("spanId"),
                        start,
                        end,
                        wait,
                    ));
                }
                Some("data_wait") => self
                    .data_waits
                    .entry((job.clone(), rank))
                    .or_default()
                    .push((id("parentSpanId"), (end - start).max(0.0))),
                _ => {}
            }
        }
    }

    fn finish(mut self, name: String, path: &Path, recording: Option<Recording>) -> Node {
        for ((pid, uuid, cause, straggler, _), seconds) in std::mem::take(&mut self.time_by_state) {
            if let Some(process) = self.processes.get_mut(&(pid, uuid)) {
                *process.seconds.entry((cause, straggler)).or_insert(0.0) += seconds;
            }
        }
        let mut steps = BTreeMap::new();
        for (key, spans) in self.steps {
            let waits = self.data_waits.get(&key);
            let mut list: Vec<Step> = spans
                .into_iter()
                .map(|(id, start, end, collective_wait)| Step {
                    start,
                    end,
                    collective_wait,
                    data_wait: waits
                        .into_iter()
                        .flatten()
                        .filter(|(parent, _)| !id.is_empty() && *parent == id)
                        .map(|(_, s)| s)
                        // fold, not sum: an empty f64 sum is -0.0, printed "-0.000".
                        .fold(0.0, |a, b| a + b),
                })
                .collect();
            list.sort_by(|a, b| a.start.total_cmp(&b.start));
            // A span forwarded twice (a retried export) is one step.
            list.dedup_by(|a, b| a.start == b.start && a.end == b.end);
            steps.insert(key, list);
        }
        Node {
            name,
            files: vec![path.to_path_buf()],
            processes: self.processes.into_values().collect(),
            steps,
            raised: self.raised.into_values().collect(),
            recording,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn kv(key: &str, value: &str) -> Value {
        json!({"key": key, "value": {"stringValue": value}})
    }

    /// One export of a node: GPU 0's utilisation and, for each (pid, job, rank, held seconds),
    /// its `process.gpu.time` as compute.
    pub(crate) fn export_line(
        host: &str,
        t_ns: u64,
        processes: &[(u32, &str, u32, f64)],
    ) -> String {
        let point = |attrs: Vec<Value>, v: f64| json!({"timeUnixNano": t_ns.to_string(), "asDouble": v, "attributes": attrs});
        let mut resources = vec![json!({
            "resource": {"attributes": [kv("host.name", host)]},
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "gauge": {"dataPoints": [
                point(vec![kv("hw.id", "GPU-0"), kv("hw.gpu.task", "general")], 0.5)
            ]}}]}]
        })];
        for &(pid, job, rank, seconds) in processes {
            resources.push(json!({
                "resource": {"attributes": [
                    kv("host.name", host), kv("process.pid", &pid.to_string()),
                    kv("gpulse.job.id", job), kv("pytorch.distributed.rank", &rank.to_string()),
                    kv("pytorch.distributed.world_size", "4"),
                ]},
                "scopeMetrics": [{"metrics": [{"name": "process.gpu.time", "sum": {"dataPoints": [
                    point(vec![kv("hw.id", &format!("GPU-{rank}")), kv("gpulse.gpu.cause", "compute"),
                               kv("gpulse.gpu.time.state", "active")], seconds),
                    point(vec![kv("hw.id", &format!("GPU-{rank}")), kv("gpulse.gpu.cause", "compute"),
                               kv("gpulse.gpu.time.state", "idle")], 1.0),
                ]}}]}]
            }));
        }
        json!({"resourceMetrics": resources}).to_string()
    }

    #[test]
    fn a_truncated_line_is_a_problem_naming_its_line_and_the_rest_is_read() {
        let good = export_line("node-b", 2_000_000_000, &[(7, "j", 3, 9.0)]);
        let cut = &good[..good.len() / 2];
        let later = export_line("node-b", 3_000_000_000, &[(7, "j", 3, 10.0)]);
        let text = format!("{good}\n{cut}\n{later}\n");
        let read = read(text.as_bytes(), Path::new("b.jsonl"));
        assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
        assert_eq!(read.problems[0].line, Some(2));
        assert!(read.problems[0]
            .to_string()
            .starts_with("b.jsonl line 2: not OTLP/JSON"));
        let node = read.node.expect("the good lines make a node");
        assert_eq!(node.name, "node-b");
        let process = &node.processes[0];
        assert_eq!(
            (process.pid, process.rank, process.job_id.as_deref()),
            (7, Some(3), Some("j"))
        );
        // The active and idle states' last totals, summed: 10 + 1.
        assert_eq!(process.seconds.get(&(Cause::Compute, None)), Some(&11.0));
    }

    #[test]
    fn a_file_of_another_format_is_one_problem_and_no_node() {
        let read = read("pid,gpu,util\n1,0,50\n".as_bytes(), Path::new("smi.csv"));
        assert!(read.node.is_none());
        assert!(read.problems.iter().any(
            |p| p.line.is_none() && p.to_string().contains("smi.csv: holds no OTLP/JSON line")
        ));
        assert!(
            read.problems.iter().any(|p| p.line == Some(1)),
            "{:?}",
            read.problems
        );
    }

    #[test]
    fn without_host_name_the_node_is_named_by_its_file() {
        let line = export_line("", 1_000_000_000, &[(7, "j", 0, 1.0)]);
        let read = read(line.as_bytes(), Path::new("/tmp/node-a.jsonl"));
        assert_eq!(read.node.unwrap().name, "node-a");
    }
}
