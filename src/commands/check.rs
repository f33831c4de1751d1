//! `gpulse check`: the checklist a careful engineer runs before training (GPU visible, driver and
//! CUDA versions, persistence and ECC mode, throttling, MIG, memory holders, free memory), each
//! pass/warn/fail with a one-line reason. Exit status: 0 all pass, 1 warnings, 2 failures.
//! The GPU processes' environments name the distributed jobs on the node: one line lists them and
//! says that check does not compare their ranks (`diagnosis::check::ranks`).

use crate::attribution::{AttributionSettings, Attributor};
use crate::cli::OutputFormat;
use crate::config::InspectConfig;
use crate::diagnosis::check::ranks::{distributed_training, RankProcess};
use crate::diagnosis::check::{
    collect_health_facts, evaluate, exit_code, render_json, render_table, HealthFacts,
};
use crate::sampling::Sampler;

/// Runs the checks; returns the rendered report and the exit status.
///
/// NVML failing to open is not an error here: it is the first check, failed, with the reason.
pub fn check(config: &InspectConfig) -> (String, u8) {
    let sampler = Sampler::open(&config.common.nvml_lib);
    let facts = match &sampler {
        Ok(s) => collect_health_facts(Ok(s.nvml().as_ref())),
        Err(e) => collect_health_facts(Err(e.to_string())),
    };
    let mut results = evaluate(&facts);
    results.extend(distributed_training(&rank_processes(config, &facts)));
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
