//! Findings as OTLP log records: one record when a finding starts, escalates or clears.
//! The export stage (`export::logs`) puts each record under the right resource — the
//! workload's for a workload subject (`Subject::pid`), the node's otherwise.
//!
//! ## Record shape
//! - `event_name`: `gpulse.diagnosis.finding` (one event name; the rule is an attribute, so a
//!   backend query for "all diagnosis events" is one filter).
//! - `time_unix_nano` / `observed_time_unix_nano`: the end of the window that decided the event.
//! - severity: started and escalated records carry the finding's severity (info → INFO, warning → WARN,
//!   error → ERROR, critical → FATAL); cleared records are INFO, since clearing is good news;
//!   the finding's own severity stays in `gpulse.diagnosis.severity`.
//! - body: the summary line (prefixed `Cleared: ` for cleared records).
//! - attributes: `gpulse.diagnosis.rule`, `.state` (started|escalated|cleared), `.severity`,
//!   `.subject` (the tracker key), `.since` (RFC 3339), `.advice` (not when cleared),
//!   `.evidence` (the layers the rule read, e.g. `nvml,procfs,spans`), one
//!   `gpulse.diagnosis.value.<name>` per value, and about the subject: `hw.id` + `gpu.index`
//!   for one device, `process.pid` (+ `process.vpid`, `container.id`, `k8s.pod.uid`) for a
//!   workload, `gpulse.diagnosis.job` + `gpulse.diagnosis.pids` + `hw.ids` for a job. A
//!   workload's finding evaluated on its MIG instance has, as its metric points, `hw.id` = the
//!   `MIG-…` UUID, `hw.parent` = the GPU, the instance ids and `nvidia.gpu.mig.profile`.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, SeverityNumber};

use crate::sampling::model::unix_nanos;

use super::findings::{Severity, Subject, Value};
use super::framework::{JOB_ID, RANK};
use super::tracker::{FindingEvent, FindingState};
use crate::schema::attributes::AttributeId as A;

/// `event_name` of every diagnosis record.
pub const EVENT_NAME: &str = crate::schema::registry::FINDING_EVENT;
/// Prefix of the attributes that carry a finding's values.
pub(crate) const VALUE_PREFIX: &str = "gpulse.diagnosis.value.";

/// The OTLP severity of a finding's severity.
pub(crate) fn severity_number(severity: Severity) -> SeverityNumber {
    match severity {
        Severity::Info => SeverityNumber::Info,
        Severity::Warning => SeverityNumber::Warn,
        Severity::Error => SeverityNumber::Error,
        Severity::Critical => SeverityNumber::Fatal,
    }
}

/// The short severity text the specification's examples use (`INFO`, `WARN`, ...).
pub(crate) fn severity_text(number: SeverityNumber) -> &'static str {
    match number {
        SeverityNumber::Warn => "WARN",
        SeverityNumber::Error => "ERROR",
        SeverityNumber::Fatal => "FATAL",
        _ => "INFO",
    }
}

/// One log record for a started or cleared finding. See the module documentation for the shape.
pub fn to_log_record(event: &FindingEvent) -> LogRecord {
    let f = &event.finding;
    let time = unix_nanos::to_nanos(event.at);
    let (number, body) = match event.state {
        FindingState::Started | FindingState::Escalated => {
            (severity_number(f.severity), f.summary.clone())
        }
        FindingState::Cleared => (SeverityNumber::Info, format!("Cleared: {}", f.summary)),
    };
    let mut attributes = vec![
        kv_str(A::DiagnosisRule.key(), f.rule.as_str()),
        kv_str(A::DiagnosisState.key(), event.state.as_str()),
        kv_str(A::DiagnosisSeverity.key(), f.severity.as_str()),
        kv_str(A::DiagnosisSubject.key(), &f.subject.key()),
        kv_str(
            A::DiagnosisSince.key(),
            &humantime::format_rfc3339_seconds(f.since).to_string(),
        ),
    ];
    if event.state != FindingState::Cleared {
        attributes.push(kv_str(A::DiagnosisAdvice.key(), &f.advice));
    }
    if !f.evidence.is_empty() {
        attributes.push(kv_str(
            A::DiagnosisEvidence.key(),
            &super::framework::Layer::join(&f.evidence),
        ));
    }
    subject_attributes(&f.subject, &mut attributes);
    for (name, value) in &f.values {
        let v = match value {
            Value::Int(i) => any_value::Value::IntValue(*i),
            Value::Float(x) => any_value::Value::DoubleValue(*x),
            Value::Text(s) => any_value::Value::StringValue(s.clone()),
        };
        // A few values have a name of their own: the cause a rule told apart, and the rank and
        // job a distributed finding is about, named as the job's own telemetry names them.
        let key = match name.as_str() {
            "cause" => A::DiagnosisCause.key().to_string(),
            "stack" => A::CodeStacktrace.key().to_string(),
            "rank" => RANK.to_string(),
            "job_id" if !attributes.iter().any(|a| a.key == JOB_ID) => JOB_ID.to_string(),
            "job_id" => continue,
            _ => format!("{VALUE_PREFIX}{name}"),
        };
        attributes.push(kv(&key, v));
    }
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: time,
        severity_number: number as i32,
        severity_text: severity_text(number).to_string(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(body)),
        }),
        attributes,
        event_name: EVENT_NAME.to_string(),
        ..Default::default()
    }
}

/// The attributes that say who a finding is about: the device (`hw.id`, `gpu.index`), the
/// workload's process and, as its metric points have them, its device or MIG instance, or the
/// job's key, processes and devices.
fn subject_attributes(subject: &Subject, attributes: &mut Vec<KeyValue>) {
    match subject {
        Subject::Device(d) => {
            attributes.push(kv_str(A::HwId.key(), &d.uuid));
            attributes.push(kv_int(A::GpuIndex.key(), i64::from(d.index)));
        }
        Subject::Workload {
            pid,
            vpid,
            device,
            container_id,
            pod_uid,
            ..
        } => {
            attributes.push(kv_int(A::ProcessPid.key(), i64::from(*pid)));
            if let Some(v) = vpid {
                attributes.push(kv_int(A::ProcessVpid.key(), i64::from(*v)));
            }
            if let Some(d) = device {
                match &d.mig {
                    // As the process's metric points: the instance is the device, the GPU its
                    // parent.
                    Some(m) => {
                        attributes.push(kv_str(A::HwId.key(), &m.uuid));
                        attributes.push(kv_str(A::HwParent.key(), &d.uuid));
                        attributes.push(kv_int(
                            A::NvidiaMigGpuInstanceId.key(),
                            i64::from(m.gpu_instance_id),
                        ));
                        attributes.push(kv_int(
                            A::NvidiaMigComputeInstanceId.key(),
                            i64::from(m.compute_instance_id),
                        ));
                        attributes.push(kv_str(A::NvidiaMigProfile.key(), &m.profile));
                    }
                    None => attributes.push(kv_str(A::HwId.key(), &d.uuid)),
                }
                attributes.push(kv_int(A::GpuIndex.key(), i64::from(d.index)));
            }
            if let Some(c) = container_id {
                attributes.push(kv_str(A::ContainerId.key(), c));
            }
            if let Some(p) = pod_uid {
                attributes.push(kv_str(A::K8sPodUid.key(), p));
            }
        }
        Subject::Job { key, pids, devices } => {
            attributes.push(kv_str(A::DiagnosisJob.key(), &key.to_string()));
            attributes.push(kv(
                A::DiagnosisPids.key(),
                array(
                    pids.iter()
                        .map(|p| any_value::Value::IntValue(i64::from(*p))),
                ),
            ));
            attributes.push(kv(
                A::HwIds.key(),
                array(
                    devices
                        .iter()
                        .map(|d| any_value::Value::StringValue(d.uuid.clone())),
                ),
            ));
            match key {
                super::findings::JobKey::PodUid(uid) => {
                    attributes.push(kv_str(A::K8sPodUid.key(), uid));
                }
                super::findings::JobKey::ContainerId(id) => {
                    attributes.push(kv_str(A::ContainerId.key(), id));
                }
                super::findings::JobKey::Pid(pid) => {
                    attributes.push(kv_int(A::ProcessPid.key(), i64::from(*pid)));
                }
                super::findings::JobKey::Distributed(id) => {
                    attributes.push(kv_str(JOB_ID, id));
                }
            }
        }
    }
}

/// The evidence records of a finding that started: one per process it gathered evidence from
/// (`Finding::related`), with that process's host PID, to be placed under its resource. None
/// for an escalated or cleared finding: the evidence went with its start.
pub fn evidence_records(event: &FindingEvent) -> Vec<(u32, LogRecord)> {
    if event.state != FindingState::Started {
        return Vec::new();
    }
    let f = &event.finding;
    let time = unix_nanos::to_nanos(event.at);
    let job = f.values.iter().find_map(|(name, value)| match value {
        Value::Text(job) if name == "job_id" => Some(job.as_str()),
        _ => None,
    });
    f.related
        .iter()
        .map(|related| {
            let mut attributes = vec![
                kv_str(A::DiagnosisRule.key(), f.rule.as_str()),
                kv_str(A::DiagnosisSubject.key(), &f.subject.key()),
                kv_str(A::CodeStacktrace.key(), &related.stack),
            ];
            if let Some(rank) = related.rank {
                attributes.push(kv_int(RANK, i64::from(rank)));
            }
            if let Some(job) = job {
                attributes.push(kv_str(JOB_ID, job));
            }
            let record = LogRecord {
                time_unix_nano: time,
                observed_time_unix_nano: time,
                severity_number: SeverityNumber::Info as i32,
                severity_text: severity_text(SeverityNumber::Info).to_string(),
                body: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(related.stack.clone())),
                }),
                attributes,
                event_name: crate::schema::registry::EVIDENCE_EVENT.to_string(),
                ..Default::default()
            };
            (related.pid, record)
        })
        .collect()
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn kv_str(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.to_string()))
}

fn kv_int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

fn array(values: impl Iterator<Item = any_value::Value>) -> any_value::Value {
    any_value::Value::ArrayValue(ArrayValue {
        values: values.map(|v| AnyValue { value: Some(v) }).collect(),
    })
}

#[cfg(test)]
mod tests {
    /// A finding's figures are keys under the registry's template attribute.
    #[test]
    fn values_are_named_under_the_registrys_template() {
        assert_eq!(VALUE_PREFIX, format!("{}.", A::DiagnosisValue.key()));
    }

    use super::*;
    use crate::diagnosis::findings::{Finding, JobKey, RuleId};
    use crate::diagnosis::framework::Layer;
    use std::time::{Duration, UNIX_EPOCH};

    fn attribute<'a>(record: &'a LogRecord, key: &str) -> Option<&'a any_value::Value> {
        record
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    fn started(subject: Subject, values: Vec<(String, Value)>) -> LogRecord {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        to_log_record(&FindingEvent {
            state: FindingState::Started,
            finding: Finding {
                rule: RuleId::RankStraggler,
                related: Vec::new(),
                severity: Severity::Warning,
                subject,
                summary: "s".into(),
                advice: "a".into(),
                values,
                since: at,
                evidence: vec![Layer::Spans],
            },
            at,
        })
    }

    #[test]
    fn a_finding_on_a_mig_instance_names_it_as_the_process_points_do() {
        let mut device = crate::diagnosis::findings::DeviceRef::gpu("GPU-0", 0);
        device.mig = Some(crate::diagnosis::findings::MigRef {
            uuid: "MIG-1".into(),
            gpu_instance_id: 1,
            compute_instance_id: 0,
            profile: "3g.40gb".into(),
        });
        let record = started(
            Subject::Workload {
                pid: 7,
                vpid: None,
                device: Some(device),
                container_id: None,
                pod_uid: None,
                service_name: "train".into(),
            },
            vec![],
        );
        let string = |v: &str| Some(any_value::Value::StringValue(v.into()));
        assert_eq!(attribute(&record, "hw.id").cloned(), string("MIG-1"));
        assert_eq!(attribute(&record, "hw.parent").cloned(), string("GPU-0"));
        assert_eq!(
            attribute(&record, "nvidia.gpu.mig.profile").cloned(),
            string("3g.40gb")
        );
        assert_eq!(
            attribute(&record, "nvidia.gpu.mig.gpu_instance_id"),
            Some(&any_value::Value::IntValue(1))
        );
        assert_eq!(
            attribute(&record, "gpu.index"),
            Some(&any_value::Value::IntValue(0))
        );
    }

    #[test]
    fn cause_rank_and_job_get_names_of_their_own() {
        let record = started(
            Subject::Workload {
                pid: 7,
                vpid: None,
                device: None,
                container_id: None,
                pod_uid: None,
                service_name: "train".into(),
            },
            vec![
                ("cause".into(), Value::from("data_wait")),
                ("rank".into(), Value::from(2u32)),
                ("job_id".into(), Value::from("run-1")),
                ("excess_seconds".into(), Value::from(0.2)),
            ],
        );
        assert_eq!(
            attribute(&record, "gpulse.diagnosis.cause"),
            Some(&any_value::Value::StringValue("data_wait".into()))
        );
        assert_eq!(
            attribute(&record, RANK),
            Some(&any_value::Value::IntValue(2))
        );
        assert_eq!(
            attribute(&record, JOB_ID),
            Some(&any_value::Value::StringValue("run-1".into()))
        );
        assert_eq!(
            attribute(&record, "gpulse.diagnosis.value.excess_seconds"),
            Some(&any_value::Value::DoubleValue(0.2))
        );
        assert!(attribute(&record, "gpulse.diagnosis.value.cause").is_none());

        // A job finding names its job once, from the subject.
        let record = started(
            Subject::Job {
                key: JobKey::Distributed("run-1".into()),
                pids: vec![1, 2],
                devices: vec![],
            },
            vec![("job_id".into(), Value::from("run-1"))],
        );
        assert_eq!(
            record
                .attributes
                .iter()
                .filter(|kv| kv.key == JOB_ID)
                .count(),
            1
        );
        assert_eq!(
            attribute(&record, "gpulse.diagnosis.job"),
            Some(&any_value::Value::StringValue("job run-1".into()))
        );
    }
}
