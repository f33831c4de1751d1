//! The OTLP logs request: diagnosis findings (built elsewhere as `LogRecord`s) placed under the
//! same resources as the metrics, so a finding about a process sits next to that process's GPU
//! metrics and traces.
//!
//! Resources come from `export::resource`, shared with the metrics request: the node resource
//! first, then one per workload, in the order given. A resource with no record is left out.
//! [`findings_request`] places one window's finding events: a finding about a process of the
//! attributed window (or one of its job's processes that left) under that process's resource,
//! every other finding under the node's; the
//! evidence records of a started finding under the resources of the processes they come from.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::json::otlp_json_line;
use super::resource::{gpulse_scope, node_resource, process_resource, NodeIdentity};
use std::collections::BTreeMap;

use crate::attribution::{AttributedWindow, Workload};
use crate::diagnosis::log_records::{evidence_records, to_log_record};
use crate::diagnosis::FindingEvent;

fn resource_logs(resource: Resource, log_records: Vec<LogRecord>) -> ResourceLogs {
    ResourceLogs {
        resource: Some(resource),
        scope_logs: vec![ScopeLogs {
            scope: Some(gpulse_scope()),
            log_records,
            schema_url: String::new(),
        }],
        schema_url: String::new(),
    }
}

/// Builds one logs request: `node_records` under the node resource, each workload's records
/// under that workload's resource (as `metrics_request` names it). Records of the same workload
/// given twice stay in two `ResourceLogs` with equal resources, which OTLP allows.
pub fn logs_request(
    node: &NodeIdentity,
    node_records: Vec<LogRecord>,
    per_process: Vec<(&Workload, Vec<LogRecord>)>,
) -> ExportLogsServiceRequest {
    let mut resource_logs_list = Vec::with_capacity(1 + per_process.len());
    if !node_records.is_empty() {
        resource_logs_list.push(resource_logs(node_resource(node), node_records));
    }
    for (workload, records) in per_process {
        if !records.is_empty() {
            resource_logs_list.push(resource_logs(process_resource(workload, node), records));
        }
    }
    ExportLogsServiceRequest {
        resource_logs: resource_logs_list,
    }
}

/// The logs request of one window's finding events (see the module documentation). Processes
/// come in ascending host PID order.
pub fn findings_request(
    node: &NodeIdentity,
    events: &[FindingEvent],
    attributed: &AttributedWindow,
) -> ExportLogsServiceRequest {
    let mut node_records = Vec::new();
    let mut by_pid: BTreeMap<u32, (&Workload, Vec<LogRecord>)> = BTreeMap::new();
    // A process that left (a hung job's rank that exited) keeps the resource it had.
    let workload = |pid: u32| {
        attributed
            .process(pid)
            .map(|p| p.workload)
            .or_else(|| attributed.departed.get(&pid))
    };
    let mut place = |pid: Option<u32>, record: LogRecord| match pid
        .and_then(|pid| Some((pid, workload(pid)?)))
    {
        Some((pid, workload)) => by_pid
            .entry(pid)
            .or_insert_with(|| (workload, Vec::new()))
            .1
            .push(record),
        None => node_records.push(record),
    };
    for event in events {
        place(event.finding.subject.pid(), to_log_record(event));
        for (pid, record) in evidence_records(event) {
            place(Some(pid), record);
        }
    }
    logs_request(node, node_records, by_pid.into_values().collect())
}

/// The number of log records in a request.
pub fn log_record_count(request: &ExportLogsServiceRequest) -> usize {
    request
        .resource_logs
        .iter()
        .flat_map(|rl| &rl.scope_logs)
        .map(|sl| sl.log_records.len())
        .sum()
}

/// The request as one line of OTLP/JSON (the file-exporter format), without the newline.
/// Same encoding rules as `json::to_otlp_json_line`; trace and span ids are hex.
pub fn logs_to_otlp_json_line(request: &ExportLogsServiceRequest) -> String {
    otlp_json_line(request)
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
    use opentelemetry_proto::tonic::logs::v1::SeverityNumber;

    use super::*;
    use crate::export::resource::kv_str;

    fn node() -> NodeIdentity {
        NodeIdentity {
            host_name: "node-a".into(),
            service_name: "gpulse".into(),
            service_instance_id: "i-1".into(),
            service_version: "0.1.0".into(),
            extra_attributes: Vec::new(),
        }
    }

    fn record(body: &str) -> LogRecord {
        LogRecord {
            time_unix_nano: 1_700_000_000_000_000_000,
            observed_time_unix_nano: 1_700_000_000_000_000_001,
            severity_number: SeverityNumber::Warn as i32,
            severity_text: "WARN".into(),
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(body.into())),
            }),
            attributes: vec![kv_str("gpulse.finding.rule", "throttling")],
            event_name: "gpulse.finding.started".into(),
            ..Default::default()
        }
    }

    fn resource_attr<'a>(rl: &'a ResourceLogs, key: &str) -> Option<&'a any_value::Value> {
        rl.resource
            .as_ref()?
            .attributes
            .iter()
            .find(|kv| kv.key == key)?
            .value
            .as_ref()?
            .value
            .as_ref()
    }

    #[test]
    fn records_land_under_the_node_and_their_workloads() {
        let mut trainer = Workload::unresolved(42);
        trainer.service_name = Some("trainer".into());
        trainer.container_id = Some("c0ffee".into());
        let idle = Workload::unresolved(43);
        let req = logs_request(
            &node(),
            vec![record("gpu0 throttled")],
            vec![
                (&trainer, vec![record("input bound"), record("leak")]),
                (&idle, vec![]),
            ],
        );
        assert_eq!(
            req.resource_logs.len(),
            2,
            "a workload without records is left out"
        );
        assert_eq!(log_record_count(&req), 3);
        let node_rl = &req.resource_logs[0];
        assert_eq!(
            resource_attr(node_rl, "service.name"),
            Some(&any_value::Value::StringValue("gpulse".into()))
        );
        let proc_rl = &req.resource_logs[1];
        assert_eq!(
            resource_attr(proc_rl, "service.name"),
            Some(&any_value::Value::StringValue("trainer".into()))
        );
        assert_eq!(
            resource_attr(proc_rl, "container.id"),
            Some(&any_value::Value::StringValue("c0ffee".into()))
        );
        assert_eq!(proc_rl.scope_logs[0].log_records.len(), 2);
        assert_eq!(
            proc_rl.scope_logs[0]
                .scope
                .as_ref()
                .map(|s| s.name.as_str()),
            Some("gpulse")
        );
    }

    #[test]
    fn no_records_means_an_empty_request() {
        let req = logs_request(&node(), Vec::new(), Vec::new());
        assert!(req.resource_logs.is_empty());
    }

    #[test]
    fn json_line_round_trips_and_omits_empty_ids() {
        let mut with_trace = record("x");
        with_trace.trace_id = vec![0xab; 16];
        with_trace.span_id = vec![0xcd; 8];
        let req = logs_request(&node(), vec![record("plain"), with_trace], Vec::new());
        let line = logs_to_otlp_json_line(&req);
        assert!(
            line.contains(r#""traceId":"abababababababababababababababab""#),
            "{line}"
        );
        assert!(line.contains(r#""spanId":"cdcdcdcdcdcdcdcd""#));
        assert_eq!(
            line.matches("traceId").count(),
            1,
            "an empty id is left out: {line}"
        );
        assert!(line.contains(r#""timeUnixNano":"1700000000000000000""#));
        assert!(line.contains(r#""severityNumber":13"#));
        let back: ExportLogsServiceRequest = serde_json::from_str(&line).expect("parses back");
        assert_eq!(back, req);
    }

    #[test]
    fn findings_go_under_their_attributed_process_or_the_node() {
        use crate::diagnosis::findings::{DeviceRef, Finding, RuleId, Severity, Subject};
        use crate::diagnosis::rules::testkit::{process, window, GIB};
        use crate::diagnosis::FindingState;

        let mut attributed =
            AttributedWindow::unattributed(window(60, vec![], vec![process(42, 0, GIB, None)]));
        attributed
            .workloads
            .get_mut(&42)
            .expect("listed")
            .service_name = Some("trainer".into());
        let about = |subject: Subject| FindingEvent {
            state: FindingState::Started,
            finding: Finding {
                rule: RuleId::Throttling,
                related: Vec::new(),
                severity: Severity::Warning,
                subject,
                summary: "s".into(),
                advice: String::new(),
                values: vec![],
                since: std::time::UNIX_EPOCH,
                evidence: vec![],
            },
            at: std::time::UNIX_EPOCH,
        };
        let workload = |pid| Subject::Workload {
            pid,
            vpid: None,
            device: None,
            container_id: None,
            pod_uid: None,
            service_name: format!("process {pid}"),
        };
        let device = Subject::Device(DeviceRef {
            uuid: "GPU-0".into(),
            index: 0,
            mig: None,
        });
        let events = [
            about(workload(42)),
            about(device),
            about(workload(7)),
            about(workload(42)),
        ];
        let req = findings_request(&node(), &events, &attributed);
        assert_eq!(
            req.resource_logs.len(),
            2,
            "node + the one attributed process"
        );
        let node_rl = &req.resource_logs[0];
        assert_eq!(
            node_rl.scope_logs[0].log_records.len(),
            2,
            "the device finding and the one about a PID the window does not list"
        );
        let trainer = &req.resource_logs[1];
        assert_eq!(
            resource_attr(trainer, "service.name"),
            Some(&any_value::Value::StringValue("trainer".into()))
        );
        assert_eq!(trainer.scope_logs[0].log_records.len(), 2);
    }
}
