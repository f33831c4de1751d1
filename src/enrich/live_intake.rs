//! The PyTorch companion's live-state records, taken from the logs requests the receivers accept:
//! each `pytorch.training.live` record of a resource whose process is known becomes that
//! process's newest [`LiveReport`] in the framework history (what `distributed_hang` reads).
//! The requests themselves are forwarded unchanged.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;

use super::framework_intake::{seconds, string, time_of};
use super::span_attributes::ResourcePids;
use crate::diagnosis::framework::FrameworkHistory;
use crate::diagnosis::live::{
    InFlight, LiveReport, COLLECTIVE_ELAPSED, COLLECTIVE_OP, COLLECTIVE_SEQ, LIVE_EVENT, PHASE,
    PHASE_ELAPSED, STACKTRACE, STEP,
};

/// The longest stack text kept per process (the companion cuts at 16 KiB; a sender that does
/// not cannot make gpulse hold more).
const MAX_STACK_BYTES: usize = 32 * 1024;

fn is_live(record: &LogRecord) -> bool {
    record.event_name == LIVE_EVENT
        || matches!(
            record.body.as_ref().and_then(|b| b.value.as_ref()),
            Some(Value::StringValue(body)) if body == LIVE_EVENT
        )
}

/// Whether a logs request carries any live-state record (so resolving its resources is worth
/// it).
pub(crate) fn has_live_records(request: &ExportLogsServiceRequest) -> bool {
    request
        .resource_logs
        .iter()
        .flat_map(|rl| &rl.scope_logs)
        .flat_map(|sl| &sl.log_records)
        .any(is_live)
}

/// Records the live states of every resource whose process is known. Returns the records kept.
pub(crate) fn record_live(
    history: &mut FrameworkHistory,
    request: &ExportLogsServiceRequest,
    pids: &ResourcePids,
) -> usize {
    let mut recorded = 0;
    for (rl, pid) in request.resource_logs.iter().zip(pids) {
        let Some((pid, _)) = *pid else { continue };
        for record in rl.scope_logs.iter().flat_map(|sl| &sl.log_records) {
            if !is_live(record) {
                continue;
            }
            history.record_live(pid, report(record));
            recorded += 1;
        }
    }
    recorded
}

/// One record as a report; what it lacks (or gives in the wrong type) is left out.
fn report(record: &LogRecord) -> LiveReport {
    let nanos = if record.time_unix_nano != 0 {
        record.time_unix_nano
    } else {
        record.observed_time_unix_nano
    };
    let at = time_of(nanos);
    let find = |key: &str| record.attributes.iter().find(|kv| kv.key == key);
    let before = |elapsed: Option<Duration>| elapsed.and_then(|e| at.checked_sub(e));
    let collective = find(COLLECTIVE_OP).and_then(string).map(|op| InFlight {
        op,
        seq: find(COLLECTIVE_SEQ).and_then(count).unwrap_or(0),
        since: before(find(COLLECTIVE_ELAPSED).and_then(seconds)).unwrap_or(at),
    });
    LiveReport {
        at,
        step: find(STEP).and_then(count),
        phase: find(PHASE).and_then(string),
        phase_since: before(find(PHASE_ELAPSED).and_then(seconds)),
        collective,
        stack: find(STACKTRACE).and_then(string).map(|mut stack| {
            if stack.len() > MAX_STACK_BYTES {
                let mut cut = MAX_STACK_BYTES;
                while !stack.is_char_boundary(cut) {
                    cut -= 1;
                }
                stack.truncate(cut);
            }
            stack
        }),
    }
}

fn count(kv: &KeyValue) -> Option<u64> {
    match kv.value.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::framework::FrameworkLimits;
    use crate::enrich::framework_intake::tests::kv;
    use crate::enrich::span_attributes::MatchedBy;
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
    use std::time::UNIX_EPOCH;

    fn live(at_s: u64, step: i64, phase: &str, seq: Option<i64>, stack: Option<&str>) -> LogRecord {
        let mut attributes = vec![
            kv(STEP, Value::IntValue(step)),
            kv(PHASE, Value::StringValue(phase.into())),
            // The phase began at 970 s, the collective at 980 s.
            kv(PHASE_ELAPSED, Value::DoubleValue(at_s as f64 - 970.0)),
        ];
        if let Some(seq) = seq {
            attributes.push(kv(COLLECTIVE_OP, Value::StringValue("all_reduce".into())));
            attributes.push(kv(COLLECTIVE_SEQ, Value::IntValue(seq)));
            attributes.push(kv(
                COLLECTIVE_ELAPSED,
                Value::DoubleValue(at_s as f64 - 980.0),
            ));
        }
        if let Some(stack) = stack {
            attributes.push(kv(STACKTRACE, Value::StringValue(stack.into())));
        }
        LogRecord {
            time_unix_nano: at_s * 1_000_000_000,
            event_name: LIVE_EVENT.into(),
            attributes,
            ..Default::default()
        }
    }

    fn request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: records,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_live_record_becomes_the_processes_state_and_its_stack_stays_with_the_state() {
        let mut history = FrameworkHistory::new(FrameworkLimits::default());
        let pids: ResourcePids = vec![Some((42, MatchedBy::Resource))];
        let first = request(vec![live(
            1000,
            30,
            "backward",
            Some(7),
            Some("Thread 1 ..."),
        )]);
        assert!(has_live_records(&first));
        assert_eq!(record_live(&mut history, &first, &pids), 1);
        // The next report of the same state carries no stack: the first one's stays.
        record_live(
            &mut history,
            &request(vec![live(1002, 30, "backward", Some(7), None)]),
            &pids,
        );
        let evidence = history.evidence(
            &[42],
            UNIX_EPOCH + Duration::from_secs(1003),
            Duration::from_secs(60),
        );
        let report = evidence.processes[&42].live.clone().expect("a live report");
        assert_eq!(report.step, Some(30));
        assert_eq!(report.phase.as_deref(), Some("backward"));
        assert_eq!(
            report.phase_since,
            Some(UNIX_EPOCH + Duration::from_secs(970))
        );
        let collective = report.collective.expect("in flight");
        assert_eq!((collective.op.as_str(), collective.seq), ("all_reduce", 7));
        assert_eq!(collective.since, UNIX_EPOCH + Duration::from_secs(980));
        assert_eq!(report.stack.as_deref(), Some("Thread 1 ..."));
        // A new state drops the old stack; an older record (a retry) changes nothing.
        record_live(
            &mut history,
            &request(vec![live(1010, 31, "forward", None, None)]),
            &pids,
        );
        record_live(
            &mut history,
            &request(vec![live(1005, 30, "backward", Some(7), None)]),
            &pids,
        );
        let evidence = history.evidence(
            &[42],
            UNIX_EPOCH + Duration::from_secs(1011),
            Duration::from_secs(60),
        );
        let report = evidence.processes[&42].live.clone().expect("a live report");
        assert_eq!((report.step, report.stack), (Some(31), None));
    }

    #[test]
    fn other_log_records_and_unknown_processes_are_not_live_states() {
        let mut history = FrameworkHistory::new(FrameworkLimits::default());
        let mut other = live(1000, 1, "step", None, None);
        other.event_name = "something.else".into();
        let plain = request(vec![other]);
        assert!(!has_live_records(&plain));
        assert_eq!(
            record_live(&mut history, &plain, &vec![Some((42, MatchedBy::Resource))]),
            0
        );
        let unknown = request(vec![live(1000, 1, "step", None, None)]);
        assert_eq!(record_live(&mut history, &unknown, &vec![None]), 0);
        assert!(history.is_empty());
    }
}
