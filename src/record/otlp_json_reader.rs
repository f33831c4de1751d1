//! Rebuilds a [`Recording`] from OTLP/JSON lines: what `gpulse run --exporter stdout` writes and
//! what an OpenTelemetry Collector's file exporter writes (one `Export*ServiceRequest` per line:
//! metrics, logs and traces may be mixed). Device figures come from gpulse's metric names, the
//! findings from its `gpulse.diagnosis.*` log records, and the training steps from the
//! companion's `epoch`, `step` and `data_wait` spans.
//!
//! The reader walks `serde_json::Value`s instead of deserialising `opentelemetry-proto`'s types:
//! those expect the full proto3 JSON mapping, while gpulse's own lines and the Collector's leave
//! defaults out and write 64-bit integers as strings or numbers; this accepts both. A line that
//! is not OTLP is an error naming its number, never skipped silently.
//!
//! One point per export window: the timeline has the export interval's resolution, the means
//! are window means and the peaks come from the `.max` companions.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

use super::recording::{
    DevicePoint, DeviceTrack, FindingMark, MemoryPoint, ProcessTrack, Recording, SpanKind,
    SpanMark, IDLE_BELOW,
};
use crate::attribution::environ::{EnvRank, JobIdSource};
use crate::attribution::sent_identity::{JOB_ID, LOCAL_RANK, RANK, UNKNOWN_SERVICE, WORLD_SIZE};
use crate::attribution::{AttributionMethod, IdentitySource, Workload};
use crate::schema::attributes::AttributeId as A;
use crate::schema::throttle_reasons;
use crate::schema::MetricId;

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("cannot read the recording {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: not OTLP/JSON ({reason}). `gpulse report` reads the lines `gpulse run --exporter stdout` or a Collector's file exporter writes")]
    NotOtlp {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path} holds no gpulse GPU metrics (no hw.gpu.* or process.gpu.* points). Record with `gpulse run --exporter stdout > run.jsonl`, or a Collector file exporter behind gpulse")]
    Empty { path: PathBuf },
}

/// Reads `path` (`-`: standard input).
///
/// # Errors
/// See [`ReadError`].
pub(crate) fn read_path(path: &Path) -> Result<Recording, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.as_os_str() == "-" {
        read(std::io::stdin().lock(), path)
    } else {
        let file = std::fs::File::open(path).map_err(io)?;
        read(std::io::BufReader::new(file), path)
    }
}

/// Reads OTLP/JSON lines from `input`; `path` names it in errors.
///
/// # Errors
/// See [`ReadError`].
pub(crate) fn read(input: impl BufRead, path: &Path) -> Result<Recording, ReadError> {
    let mut builder = Builder::default();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let not_otlp = |reason: String| ReadError::NotOtlp {
            path: path.to_path_buf(),
            line: n + 1,
            reason,
        };
        let value: Value = serde_json::from_str(&line).map_err(|e| not_otlp(e.to_string()))?;
        if let Some(list) = value.get("resourceMetrics").and_then(Value::as_array) {
            list.iter().for_each(|rm| builder.resource_metrics(rm));
        } else if let Some(list) = value.get("resourceLogs").and_then(Value::as_array) {
            list.iter().for_each(|rl| builder.resource_logs(rl));
        } else if let Some(list) = value.get("resourceSpans").and_then(Value::as_array) {
            list.iter().for_each(|rs| builder.resource_spans(rs));
        } else {
            return Err(not_otlp(
                "no resourceMetrics, resourceLogs or resourceSpans".into(),
            ));
        }
    }
    builder.finish().ok_or_else(|| ReadError::Empty {
        path: path.to_path_buf(),
    })
}

/// An attribute's value as text (strings, integers, doubles, booleans).
fn attr_text(value: &Value) -> Option<String> {
    let v = value.get("value")?;
    if let Some(s) = v.get("stringValue").and_then(Value::as_str) {
        return Some(s.to_string());
    }
    if let Some(i) = v.get("intValue") {
        return i
            .as_str()
            .map(str::to_string)
            .or_else(|| i.as_i64().map(|i| i.to_string()));
    }
    if let Some(d) = v.get("doubleValue").and_then(Value::as_f64) {
        return Some(d.to_string());
    }
    v.get("boolValue")
        .and_then(Value::as_bool)
        .map(|b| b.to_string())
}

pub(crate) fn attributes(holder: Option<&Value>) -> HashMap<String, String> {
    holder
        .and_then(|h| h.get("attributes"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|kv| Some((kv.get("key")?.as_str()?.to_string(), attr_text(kv)?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The items of every scope of a resource entry: `scoped(rm, "scopeMetrics", "metrics")`,
/// `("scopeLogs", "logRecords")`, `("scopeSpans", "spans")`.
pub(crate) fn scoped<'a>(
    resource_entry: &'a Value,
    scopes: &'a str,
    items: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    resource_entry
        .get(scopes)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(move |s| s.get(items).and_then(Value::as_array).into_iter().flatten())
}

/// A 64-bit integer written as a string (proto3 JSON) or a number.
pub(crate) fn number(v: Option<&Value>) -> Option<f64> {
    let v = v?;
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}

pub(crate) fn nanos(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

pub(crate) fn point_value(point: &Value) -> Option<f64> {
    number(point.get("asDouble")).or_else(|| number(point.get("asInt")))
}

/// A GPU process's identity read back from the resource `export::resource::process_resource`
/// wrote: gpulse's own keys into their fields, the rest (the process's own
/// `OTEL_RESOURCE_ATTRIBUTES`) kept as they are, and a `service.name` gpulse made up
/// (`unknown_service:…`) left out, as the workload had none.
fn workload_of(resource: &HashMap<String, String>, pid: u32) -> Workload {
    let get = |key: &str| resource.get(key).cloned();
    let gpulse_keys = |key: &str| {
        key == A::ServiceName.key()
            || key == A::HostName.key()
            || [RANK, LOCAL_RANK, WORLD_SIZE, JOB_ID].contains(&key)
            || ["process.", "container.", "k8s.", "gpulse."]
                .iter()
                .any(|prefix| key.starts_with(prefix))
    };
    let mut resource_attributes: Vec<(String, String)> = resource
        .iter()
        .filter(|(key, _)| !gpulse_keys(key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    resource_attributes.sort();
    Workload {
        pid,
        vpid: resource
            .get(A::ProcessVpid.key())
            .and_then(|v| v.parse().ok()),
        creation_time: resource
            .get(A::ProcessCreationTime.key())
            .and_then(|t| humantime::parse_rfc3339(t).ok()),
        executable_name: get(A::ProcessExecutableName.key()),
        owner: get(A::ProcessOwner.key()),
        command_line: get(A::ProcessCommandLine.key()),
        container_id: get(A::ContainerId.key()),
        // `container.runtime` in recordings made before gpulse followed the conventions' rename.
        container_runtime: get(A::ContainerRuntime.key()).or_else(|| get("container.runtime")),
        pod_uid: get(A::K8sPodUid.key()),
        pod_name: get(A::K8sPodName.key()),
        namespace_name: get(A::K8sNamespaceName.key()),
        container_name: get(A::K8sContainerName.key()),
        service_name: get(A::ServiceName.key()).filter(|name| !name.starts_with(UNKNOWN_SERVICE)),
        identity_source: resource
            .get(A::GpulseIdentitySource.key())
            .and_then(|name| IdentitySource::from_name(name))
            .unwrap_or_default(),
        resource_attributes,
        job_id: get(A::GpulseJobId.key()),
        job_id_source: resource.get(A::GpulseJobIdSource.key()).and_then(|name| {
            [
                JobIdSource::Companion,
                JobIdSource::ResourceAttributes,
                JobIdSource::TorchElastic,
                JobIdSource::Slurm,
                JobIdSource::Master,
            ]
            .into_iter()
            .find(|source| source.as_str() == name)
        }),
        rank: rank_of(resource),
        attributed_by: match resource
            .get(A::GpulseAttributionMethod.key())
            .map(String::as_str)
        {
            Some("host_pid") => AttributionMethod::HostPid,
            Some("device_file") => AttributionMethod::DeviceFile,
            _ => AttributionMethod::Unresolved,
        },
    }
}

/// The rank `process_resource` wrote (`pytorch.distributed.rank` and `.world_size`, with
/// `.local_rank` when known).
fn rank_of(resource: &HashMap<String, String>) -> Option<EnvRank> {
    let number = |key: &str| resource.get(key)?.parse::<u32>().ok();
    Some(EnvRank {
        rank: number(RANK)?,
        world_size: number(WORLD_SIZE)?,
        local_rank: number(LOCAL_RANK),
    })
}

#[derive(Default)]
struct DeviceAcc {
    index: u32,
    name: Option<String>,
    pci_bus_id: Option<String>,
    memory_total: Option<f64>,
    /// Window end (ns) → the point of that window.
    points: BTreeMap<u64, DevicePoint>,
    utilization_peak: Option<f64>,
    power_peak: Option<f64>,
    sm_peak: Option<f64>,
    energy: Option<f64>,
}

#[derive(Default)]
struct ProcessAcc {
    name: Option<String>,
    workload: Option<Workload>,
    device_index: u32,
    points: BTreeMap<u64, f64>,
}

#[derive(Default)]
struct Builder {
    devices: BTreeMap<String, DeviceAcc>,
    processes: BTreeMap<(u32, String), ProcessAcc>,
    findings: Vec<(u64, FindingMarkAt)>,
    spans: Vec<(SpanKind, String, u64, u64)>,
    earliest: Option<u64>,
    latest: Option<u64>,
}

/// A finding log record before the recording's start is known.
struct FindingMarkAt {
    cleared: bool,
    key: String,
    since: Option<u64>,
    mark: FindingMark,
}

fn max_opt(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.max(b)))
}

impl Builder {
    fn see(&mut self, t: u64) {
        self.earliest = Some(self.earliest.map_or(t, |e| e.min(t)));
        self.latest = Some(self.latest.map_or(t, |l| l.max(t)));
    }

    fn resource_metrics(&mut self, rm: &Value) {
        let resource = attributes(rm.get("resource"));
        let pid: Option<u32> = resource
            .get(A::ProcessPid.key())
            .and_then(|p| p.parse().ok());
        let exe = resource.get(A::ProcessExecutableName.key()).cloned();
        for metric in scoped(rm, "scopeMetrics", "metrics") {
            let Some(name) = metric.get("name").and_then(Value::as_str) else {
                continue;
            };
            let data = metric.get("gauge").or_else(|| metric.get("sum"));
            let points = data
                .and_then(|d| d.get("dataPoints"))
                .and_then(Value::as_array);
            for point in points.into_iter().flatten() {
                let (Some(t), Some(value)) = (nanos(point.get("timeUnixNano")), point_value(point))
                else {
                    continue;
                };
                let attrs = attributes(Some(point));
                let Some(uuid) = attrs.get(A::HwId.key()).cloned() else {
                    continue;
                };
                let index: u32 = attrs
                    .get(A::GpuIndex.key())
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(0);
                match pid {
                    Some(pid) => {
                        self.process_point(pid, &exe, uuid.clone(), index, name, t, value);
                        if let Some(p) = self.processes.get_mut(&(pid, uuid)) {
                            p.workload
                                .get_or_insert_with(|| workload_of(&resource, pid));
                        }
                    }
                    None => self.device_point(uuid, index, &attrs, name, t, value),
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn process_point(
        &mut self,
        pid: u32,
        exe: &Option<String>,
        uuid: String,
        index: u32,
        name: &str,
        t: u64,
        value: f64,
    ) {
        if MetricId::by_name(name) != Some(MetricId::ProcessGpuMemoryUsage) {
            return;
        }
        self.see(t);
        let p = self.processes.entry((pid, uuid)).or_default();
        p.device_index = index;
        p.name = p.name.take().or_else(|| exe.clone());
        p.points.insert(t, value);
    }

    fn device_point(
        &mut self,
        uuid: String,
        index: u32,
        attrs: &HashMap<String, String>,
        name: &str,
        t: u64,
        value: f64,
    ) {
        let d = self.devices.entry(uuid).or_default();
        d.index = index;
        if d.name.is_none() {
            d.name = attrs.get(A::HwModel.key()).cloned();
        }
        if d.pci_bus_id.is_none() {
            d.pci_bus_id = attrs.get(A::GpuPciAddress.key()).cloned();
        }
        let is = |key: &str, want: &str| attrs.get(key).is_some_and(|v| v == want);
        let mut known = true;
        {
            let p = d.points.entry(t).or_insert_with(|| DevicePoint {
                n: 1,
                ..DevicePoint::default()
            });
            match MetricId::by_name(name) {
                Some(MetricId::GpuUtilization) if is(A::HwGpuTask.key(), "general") => {
                    p.utilization = Some(value as f32)
                }
                Some(MetricId::SmActivity) => p.sm_activity = Some(value as f32),
                Some(MetricId::PipeActivity) if is(A::NvidiaPipe.key(), "tensor") => {
                    p.tensor_activity = Some(value as f32)
                }
                Some(MetricId::DramActivity) => p.dram_activity = Some(value as f32),
                Some(MetricId::GpuMemoryUsage) => p.memory_used = Some(value),
                Some(MetricId::Power) => p.power_watts = Some(value as f32),
                Some(MetricId::Clock) if is(A::NvidiaClockType.key(), "sm") => {
                    p.sm_clock_mhz = Some(value as f32)
                }
                Some(MetricId::Clock) if is(A::NvidiaClockType.key(), "memory") => {
                    p.memory_clock_mhz = Some(value as f32)
                }
                // The window's share of samples the reason was active in; "throttled" at half.
                Some(MetricId::Throttle) => {
                    let bit = attrs.get(A::NvidiaThrottleReason.key()).and_then(|r| {
                        throttle_reasons()
                            .iter()
                            .find(|(_, name)| name == r)
                            .map(|(bit, _)| *bit)
                    });
                    let bits = p.throttle.get_or_insert(0);
                    if let (Some(bit), true) = (bit, value >= 0.5) {
                        *bits |= bit;
                    }
                }
                _ => known = false,
            }
        }
        match MetricId::by_name(name) {
            Some(MetricId::GpuUtilizationMax) if is(A::HwGpuTask.key(), "general") => {
                d.utilization_peak = max_opt(d.utilization_peak, value)
            }
            Some(MetricId::PowerMax) => d.power_peak = max_opt(d.power_peak, value),
            Some(MetricId::SmActivityMax) => d.sm_peak = max_opt(d.sm_peak, value),
            Some(MetricId::GpuMemoryLimit) => d.memory_total = Some(value),
            // Energy since gpulse first saw the GPU: the largest total is the run's.
            Some(MetricId::Energy) => d.energy = max_opt(d.energy, value),
            _ if known => {}
            _ => return,
        }
        self.see(t);
    }

    fn resource_logs(&mut self, rl: &Value) {
        for record in scoped(rl, "scopeLogs", "logRecords") {
            let attrs = attributes(Some(record));
            let Some(rule) = attrs.get(A::DiagnosisRule.key()).cloned() else {
                continue;
            };
            let Some(t) = nanos(record.get("timeUnixNano")) else {
                continue;
            };
            let summary = record
                .get("body")
                .and_then(|b| b.get("stringValue"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let subject = attrs
                .get(A::DiagnosisSubject.key())
                .cloned()
                .unwrap_or_default();
            let since = attrs
                .get(A::DiagnosisSince.key())
                .and_then(|s| humantime::parse_rfc3339(s).ok())
                .and_then(|s| s.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as u64);
            let values = attrs
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        k.strip_prefix("gpulse.diagnosis.value.")?.to_string(),
                        v.clone(),
                    ))
                })
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect();
            self.findings.push((
                t,
                FindingMarkAt {
                    cleared: attrs
                        .get(A::DiagnosisState.key())
                        .is_some_and(|s| s == "cleared"),
                    key: format!("{rule}|{subject}"),
                    since,
                    mark: FindingMark {
                        device_index: attrs.get(A::GpuIndex.key()).and_then(|i| i.parse().ok()),
                        severity: attrs
                            .get(A::DiagnosisSeverity.key())
                            .cloned()
                            .unwrap_or_else(|| "warning".into()),
                        rule,
                        subject,
                        summary: summary.to_string(),
                        advice: attrs
                            .get(A::DiagnosisAdvice.key())
                            .cloned()
                            .unwrap_or_default(),
                        evidence: attrs
                            .get(A::DiagnosisEvidence.key())
                            .map(|e| e.split(',').map(|s| s.trim().to_string()).collect())
                            .unwrap_or_default(),
                        values,
                        start_seconds: 0.0,
                        end_seconds: None,
                    },
                },
            ));
        }
    }

    fn resource_spans(&mut self, rs: &Value) {
        for span in scoped(rs, "scopeSpans", "spans") {
            let name = span.get("name").and_then(Value::as_str).unwrap_or_default();
            let kind = match name {
                "epoch" => SpanKind::Epoch,
                "step" => SpanKind::Step,
                "data_wait" => SpanKind::DataWait,
                _ => continue,
            };
            let (Some(start), Some(end)) = (
                nanos(span.get("startTimeUnixNano")),
                nanos(span.get("endTimeUnixNano")),
            ) else {
                continue;
            };
            self.spans.push((kind, name.to_string(), start, end));
        }
    }

    fn finish(mut self) -> Option<Recording> {
        if self.devices.is_empty() && self.processes.is_empty() {
            return None;
        }
        let earliest = self.earliest?;
        let latest = self.latest?;
        // A window's point is stamped at its end: the run began one window before the first.
        let first_window = self
            .devices
            .values()
            .find_map(|d| {
                let mut keys = d.points.keys();
                let (a, b) = (keys.next()?, keys.next()?);
                Some(b - a)
            })
            .unwrap_or(0);
        let start_ns = earliest.saturating_sub(first_window);
        let at = |ns: u64| UNIX_EPOCH + Duration::from_nanos(ns);
        let secs = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e9;
        let mut recording = Recording::empty(Vec::new(), at(start_ns));
        recording.ended = at(latest);
        recording.command = vec!["(recorded by gpulse run)".into()];

        // Which devices had a process at each window, for the held/idle time.
        let mut held: BTreeMap<(String, u64), ()> = BTreeMap::new();
        for ((pid, uuid), p) in &self.processes {
            let mut track = ProcessTrack {
                pid: *pid,
                device_index: p.device_index,
                device_uuid: uuid.clone(),
                name: p.name.clone(),
                in_command: true,
                workload: p.workload.clone(),
                ..ProcessTrack::default()
            };
            for (&t, &bytes) in &p.points {
                held.insert((uuid.clone(), t), ());
                track.series.push(MemoryPoint {
                    t: secs(t),
                    bytes: Some(bytes),
                });
                track.memory_peak_bytes = max_opt(track.memory_peak_bytes, bytes);
            }
            track.first_seen = p.points.keys().next().map_or(0.0, |&t| secs(t));
            track.last_seen = p.points.keys().last().map_or(0.0, |&t| secs(t));
            recording.processes.push(track);
        }
        for (uuid, d) in std::mem::take(&mut self.devices) {
            let mut track = DeviceTrack {
                index: d.index,
                name: d.name.clone().unwrap_or_else(|| format!("GPU {}", d.index)),
                pci_bus_id: d.pci_bus_id.clone(),
                uuid: uuid.clone(),
                memory_total_bytes: d.memory_total,
                ..DeviceTrack::default()
            };
            let mut previous = start_ns;
            for (&t, point) in &d.points {
                let dt = t.saturating_sub(previous) as f64 / 1e9;
                previous = t;
                let mut p = point.clone();
                p.t = secs(t) - dt;
                p.dt = dt;
                if held.contains_key(&(uuid.clone(), t)) {
                    p.held_seconds = dt;
                    let busy = p.utilization.or(p.sm_activity).map(f64::from);
                    if busy.is_some_and(|b| b < IDLE_BELOW) {
                        p.idle_seconds = dt;
                    }
                }
                let totals = &mut track.totals;
                totals.utilization.add(p.utilization.map(f64::from), dt);
                totals.sm_activity.add(p.sm_activity.map(f64::from), dt);
                totals
                    .tensor_activity
                    .add(p.tensor_activity.map(f64::from), dt);
                totals.power_watts.add(p.power_watts.map(f64::from), dt);
                if let Some(m) = p.memory_used {
                    totals.memory_used_peak = max_opt(totals.memory_used_peak, m);
                }
                if let Some(w) = p.power_watts {
                    *totals.power_integral_joules.get_or_insert(0.0) += f64::from(w) * dt;
                }
                totals.held_seconds += p.held_seconds;
                totals.idle_seconds += p.idle_seconds;
                totals.throttle_seen |= p.throttle.unwrap_or(0);
                track.series.push(p);
            }
            // The window maxima are the true peaks; the means' peak is only a lower bound.
            let totals = &mut track.totals;
            for (acc, peak) in [
                (&mut totals.utilization, d.utilization_peak),
                (&mut totals.power_watts, d.power_peak),
                (&mut totals.sm_activity, d.sm_peak),
            ] {
                if let Some(peak) = peak {
                    acc.add_peak(peak);
                }
            }
            totals.energy_counter_joules = d.energy;
            recording.samples = recording.samples.max(d.points.len() as u64);
            recording.devices.push(track);
        }
        recording.devices.sort_by_key(|d| d.index);

        self.findings.sort_by_key(|(t, _)| *t);
        let mut open: HashMap<String, usize> = HashMap::new();
        for (t, f) in self.findings {
            if f.cleared {
                if let Some(i) = open.remove(&f.key) {
                    recording.findings[i].end_seconds = Some(secs(t));
                }
            } else if let std::collections::hash_map::Entry::Vacant(slot) = open.entry(f.key) {
                let mut mark = f.mark;
                mark.start_seconds = secs(f.since.unwrap_or(t));
                recording.findings.push(mark);
                slot.insert(recording.findings.len() - 1);
            }
        }
        recording.spans = self
            .spans
            .into_iter()
            .map(|(kind, name, start, end)| SpanMark {
                kind,
                name,
                start_seconds: secs(start),
                end_seconds: secs(end),
            })
            .collect();
        Some(recording)
    }
}
