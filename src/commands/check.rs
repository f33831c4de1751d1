//! `gpulse check`: the checklist a careful engineer runs before training (GPU visible, driver and
//! CUDA versions, persistence and ECC mode, throttling, MIG, memory holders, free memory), each
//! pass/warn/fail with a one-line reason. Exit status: 0 all pass, 1 warnings, 2 failures.

use crate::cli::OutputFormat;
use crate::config::InspectConfig;
use crate::diagnosis::check::{
    collect_health_facts, evaluate, exit_code, render_json, render_table,
};
use crate::sampling::Sampler;

/// Runs the checks; returns the rendered report and the exit status.
///
/// NVML failing to open is not an error here: it is the first check, failed, with the reason.
pub fn check(config: &InspectConfig) -> (String, u8) {
    let sampler = Sampler::open(&config.nvml_lib);
    let facts = match &sampler {
        Ok(s) => collect_health_facts(Ok(s.nvml().as_ref())),
        Err(e) => collect_health_facts(Err(e.to_string())),
    };
    let results = evaluate(&facts);
    let code = u8::try_from(exit_code(&results)).unwrap_or(2);
    let text = match config.format {
        OutputFormat::Json => render_json(&results) + "\n",
        OutputFormat::Table => render_table(&results),
    };
    (text, code)
}
