//! `gpulse check`: the checklist a careful engineer runs before training (GPU visible, driver and
//! CUDA versions, persistence and ECC mode, throttling, MIG, memory holders, free memory), each
//! pass/warn/fail with a one-line reason. Exit status: 0 all pass, 1 warnings, 2 failures.
//! The GPU processes' environments name the distributed jobs on the node: one line lists them and
//! says that check does not compare their ranks (`diagnosis::check::ranks`). With `--agent ADDR`
//! it also asks a running `gpulse run` (its `--health-addr`) whether it finds a job stuck
//! (`diagnosis::check::agent`).

use crate::attribution::{AttributionSettings, Attributor};
use crate::cli::OutputFormat;
use crate::config::InspectConfig;
use crate::diagnosis::check::agent::{
    findings_of_status, stuck_jobs, unseen_collectives, AgentFinding,
};
use crate::diagnosis::check::ranks::{distributed_training, RankProcess};
use crate::diagnosis::check::{
    collect_health_facts, evaluate, exit_code, render_json, render_table, HealthFacts,
};
use crate::sampling::Sampler;

/// Runs the checks; returns the rendered report and the exit status.
///
/// NVML failing to open is not an error here: it is the first check, failed, with the reason.
pub fn check(config: &InspectConfig, agent: Option<&str>) -> (String, u8) {
    let sampler = Sampler::open(&config.common.nvml_lib);
    let facts = match &sampler {
        Ok(s) => collect_health_facts(Ok(s.nvml().as_ref())),
        Err(e) => collect_health_facts(Err(e.to_string())),
    };
    let mut results = evaluate(&facts);
    results.extend(distributed_training(&rank_processes(config, &facts)));
    if let Some(agent) = agent {
        let findings = agent_findings(agent);
        if let Ok(findings) = &findings {
            results.extend(unseen_collectives(agent, findings));
        }
        results.push(stuck_jobs(agent, findings));
    }
    let code = u8::try_from(exit_code(&results)).unwrap_or(2);
    let text = match config.format {
        OutputFormat::Json => render_json(&results) + "\n",
        OutputFormat::Table => render_table(&results),
    };
    (text, code)
}

/// The GPU processes that belong to a distributed job, by their environment (when gpulse may
/// read it: another user's process, gpulse not root, has none and is not listed).
fn rank_processes(config: &InspectConfig, facts: &HealthFacts) -> Vec<RankProcess> {
    let gpu_processes: Vec<(u32, String)> = facts
        .devices
        .iter()
        .filter_map(|d| Some((d.uuid.clone().unwrap_or_default(), d.processes.known()?)))
        .flat_map(|(uuid, processes)| processes.iter().map(move |p| (p.pid, uuid.clone())))
        .collect();
    if gpu_processes.is_empty() {
        return Vec::new();
    }
    let mut attributor = Attributor::new(AttributionSettings {
        proc_root: config.common.analysis.proc_root.clone(),
        include_command_line: false,
        read_environ: config.common.analysis.read_environ,
        kubelet_socket: None,
    });
    let mut found: Vec<RankProcess> = attributor
        .resolve(&gpu_processes)
        .into_values()
        .filter_map(|w| {
            Some(RankProcess {
                job_id: w.job_id?,
                pid: w.pid,
                rank: w.rank.map(|r| r.rank),
            })
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// How long check waits for the agent's answer.
const AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The active findings of the gpulse agent at `agent` (`HOST:PORT`, or a URL), from its
/// `/status`.
fn agent_findings(agent: &str) -> Result<Vec<AgentFinding>, String> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let base = if agent.contains("://") {
        agent.trim_end_matches('/').to_string()
    } else {
        format!("http://{agent}")
    };
    let uri: http::Uri = format!("{base}/status").parse().map_err(|e| {
        format!("{agent:?} is not an address (HOST:PORT, e.g. 127.0.0.1:9400): {e}")
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start the HTTP client: {e}"))?;
    runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
        let response = tokio::time::timeout(AGENT_TIMEOUT, client.get(uri.clone()))
            .await
            .map_err(|_| format!("no answer from {uri} within {AGENT_TIMEOUT:?}"))?
            .map_err(|e| format!("GET {uri}: {e}"))?;
        let status = response.status();
        let body = tokio::time::timeout(AGENT_TIMEOUT, response.into_body().collect())
            .await
            .map_err(|_| format!("{uri} did not finish its answer within {AGENT_TIMEOUT:?}"))?
            .map_err(|e| format!("reading {uri}: {e}"))?
            .to_bytes();
        let body = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(format!("GET {uri} answered {status}: {}", body.trim()));
        }
        findings_of_status(&body)
    })
}
