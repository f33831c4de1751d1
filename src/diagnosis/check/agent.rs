//! `gpulse check --agent ADDR`'s line about stuck jobs: what a running `gpulse run` (its health
//! endpoint's `/status`) finds active now. check itself takes one NVML reading and hears no
//! spans, so it cannot see a hang; the agent that has been listening can. The verdict is pure;
//! `commands::check` fetches the findings.

use serde::Deserialize;

use super::{CheckResult, CheckStatus};
use crate::diagnosis::RuleId;

/// A finding as `/status` gives it (the snapshot JSON contract), the fields check reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct AgentFinding {
    pub rule: String,
    pub severity: String,
    pub summary: String,
    #[serde(default)]
    pub advice: String,
}

/// The findings of a `/status` answer.
///
/// # Errors
/// The body is not the snapshot JSON contract (with the reason).
pub(crate) fn findings_of_status(body: &str) -> Result<Vec<AgentFinding>, String> {
    #[derive(Deserialize)]
    struct Status {
        findings: Vec<AgentFinding>,
    }
    serde_json::from_str::<Status>(body)
        .map(|s| s.findings)
        .map_err(|e| format!("its /status is not gpulse's status JSON ({e})"))
}

/// The `Stuck jobs` line: fail for each job the agent finds stuck (`distributed_hang`, or
/// `collective_stall` without the companion), warn for a rank in a long phase the others wait
/// for (`long_phase_wait`) or when the agent could not be read, pass when it finds none.
pub(crate) fn stuck_jobs(agent: &str, findings: Result<Vec<AgentFinding>, String>) -> CheckResult {
    let line = |status, reason| CheckResult {
        name: "Stuck jobs".into(),
        device: None,
        status,
        reason,
    };
    let findings = match findings {
        Ok(findings) => findings,
        Err(e) => {
            return line(
                CheckStatus::Warn,
                format!(
                    "could not ask the gpulse agent at {agent}: {e}; it answers on the address \
                     of `gpulse run --health-addr` (GET /status)"
                ),
            )
        }
    };
    let of = |rule: RuleId| {
        findings
            .iter()
            .filter(move |f| f.rule == rule.as_str())
            .map(|f| f.summary.as_str())
    };
    let stuck: Vec<&str> = of(RuleId::DistributedHang)
        .chain(of(RuleId::CollectiveStall))
        .collect();
    if !stuck.is_empty() {
        return line(
            CheckStatus::Fail,
            format!(
                "HUNG, says the gpulse agent at {agent}: {}; its findings carry the stacks and \
                 the advice",
                stuck.join("; ")
            ),
        );
    }
    let waiting: Vec<&str> = of(RuleId::LongPhaseWait).collect();
    if !waiting.is_empty() {
        return line(
            CheckStatus::Warn,
            format!("the gpulse agent at {agent}: {}", waiting.join("; ")),
        );
    }
    line(
        CheckStatus::Pass,
        format!("the gpulse agent at {agent} finds no job stuck"),
    )
}

/// The `Unseen collectives` line, when the agent finds ranks whose collectives the companion
/// does not see (`collectives_unseen`): a warning with the line that fixes it, since neither the
/// straggler nor the hang can be named for their jobs.
pub(crate) fn unseen_collectives(agent: &str, findings: &[AgentFinding]) -> Option<CheckResult> {
    let unseen: Vec<&AgentFinding> = findings
        .iter()
        .filter(|f| f.rule == RuleId::CollectivesUnseen.as_str())
        .collect();
    let first = unseen.first()?;
    let summaries: Vec<&str> = unseen.iter().map(|f| f.summary.as_str()).collect();
    Some(CheckResult {
        name: "Unseen collectives".into(),
        device: None,
        status: CheckStatus::Warn,
        reason: format!(
            "the gpulse agent at {agent}: {}. {}",
            summaries.join("; "),
            first.advice
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = r#"{"devices": [], "processes": [], "findings": [
        {"rule": "distributed_hang", "severity": "critical", "summary": "job j is stuck on rank 2: it is in phase stuck for 2m", "advice": "..."},
        {"rule": "throttling", "severity": "warning", "summary": "GPU 0 throttles", "advice": "..."}
    ]}"#;

    #[test]
    fn a_hang_the_agent_finds_fails_the_line_and_names_the_rank() {
        let line = stuck_jobs("127.0.0.1:9400", findings_of_status(STATUS));
        assert_eq!(line.status, CheckStatus::Fail);
        assert!(
            line.reason.starts_with(
                "HUNG, says the gpulse agent at 127.0.0.1:9400: job j is stuck on rank 2"
            ),
            "{}",
            line.reason
        );
        assert!(!line.reason.contains("throttles"));
        let findings = findings_of_status(STATUS).unwrap();
        assert_eq!(unseen_collectives("a", &findings), None);
    }

    #[test]
    fn no_hang_passes_a_long_phase_warns_and_an_unreadable_agent_says_why() {
        let none = findings_of_status(r#"{"findings": []}"#);
        assert_eq!(stuck_jobs("a", none).status, CheckStatus::Pass);
        let waiting = Ok(vec![AgentFinding {
            rule: "long_phase_wait".into(),
            severity: "info".into(),
            summary: "job j: rank 0 is in phase checkpoint for 3m".into(),
            advice: String::new(),
        }]);
        assert_eq!(stuck_jobs("a", waiting).status, CheckStatus::Warn);
        let unseen = vec![AgentFinding {
            rule: "collectives_unseen".into(),
            severity: "info".into(),
            summary: "rank 1 of job j (pid 7): its last 25 steps show no collective".into(),
            advice: "Wrap the model once: `model = tel.watch_ddp(...)`".into(),
        }];
        let line = unseen_collectives("a", &unseen).expect("a line");
        assert_eq!(line.status, CheckStatus::Warn);
        assert!(
            line.reason.contains("rank 1 of job j") && line.reason.contains("tel.watch_ddp("),
            "{}",
            line.reason
        );
        let bad = findings_of_status("<html>");
        let line = stuck_jobs("a", bad);
        assert_eq!(line.status, CheckStatus::Warn);
        assert!(
            line.reason.contains("not gpulse's status JSON"),
            "{}",
            line.reason
        );
        assert!(line.reason.contains("--health-addr"), "{}", line.reason);
    }
}
