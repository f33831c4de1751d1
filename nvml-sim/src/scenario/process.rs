//! Compiling `[[device.process]]` tables: where the PIDs come from (a literal range, one PID
//! from `pid_env`, a list from `pids_env`), the process kind, its activity window, and its
//! per-process signals salted by device and PID.

use super::schema::{ProcessKind, RawProcess};
use super::Env;
use crate::abi;
use crate::model::{Process, Window, KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS};
use crate::signal::Signal;

pub(super) fn expand_process(
    raw: &RawProcess,
    pid_shift: u32,
    salt: u64,
    env: &dyn Env,
    out: &mut Vec<Process>,
) -> Result<(), String> {
    let sources = [
        raw.pid.is_some(),
        raw.pid_env.is_some(),
        raw.pids_env.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if sources != 1 {
        return Err(
            "a [[device.process]] needs exactly one of `pid = 1234`, `pid_env = \"VAR\"` (one PID \
             read from $VAR) or `pids_env = \"VAR\"` (comma-separated PIDs)"
                .into(),
        );
    }
    let count = raw.count.unwrap_or(1);
    if count == 0 {
        return Err("process `count` must be at least 1".into());
    }
    if raw.count.is_some() && raw.pid.is_none() {
        return Err(
            "process `count` only works with a literal `pid` (the first of the range)".into(),
        );
    }
    let pids: Vec<u32> = if let Some(first) = raw.pid {
        let start = first
            .checked_add(pid_shift)
            .filter(|s| s.checked_add(count - 1).is_some())
            .ok_or_else(|| format!("pid range from {first} (+{pid_shift}) overflows u32"))?;
        (start..start + count).collect()
    } else if let Some(var) = &raw.pid_env {
        let v = env.var(var).ok_or_else(|| {
            format!(
                "pid_env = {var:?}: the environment variable {var} is not set; export it with \
                 the PID of the process to show on this GPU"
            )
        })?;
        vec![parse_pid(var, &v)?]
    } else if let Some(var) = &raw.pids_env {
        let v = env.var(var).ok_or_else(|| {
            format!(
                "pids_env = {var:?}: the environment variable {var} is not set; export it as a \
                 comma-separated list of PIDs"
            )
        })?;
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| parse_pid(var, s))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let kinds = match raw.kind.unwrap_or(ProcessKind::Compute) {
        ProcessKind::Compute => KIND_COMPUTE,
        ProcessKind::Graphics => KIND_GRAPHICS,
        ProcessKind::ComputeGraphics => KIND_COMPUTE | KIND_GRAPHICS,
        ProcessKind::Mps => KIND_MPS,
    };
    let from = raw.active_from_s.unwrap_or(f64::NEG_INFINITY);
    let until = raw.active_until_s.unwrap_or(f64::INFINITY);
    if from >= until {
        return Err(format!(
            "active_from_s ({from}) must be before active_until_s ({until})"
        ));
    }
    for pid in pids {
        let salt = salt.wrapping_mul(1_000_003) ^ pid as u64;
        let s = |v: &Option<Signal>, default: f64, f: u64| {
            v.clone()
                .unwrap_or(Signal::constant(default))
                .salted(salt << 4 | f)
        };
        out.push(Process {
            pid,
            kinds,
            name: raw.name.clone(),
            memory_used_mib: s(&raw.memory_used_mib, 0.0, 1),
            sm_util: s(&raw.sm_util, 0.0, 2),
            mem_util: s(&raw.mem_util, 0.0, 3),
            enc_util: s(&raw.enc_util, 0.0, 4),
            dec_util: s(&raw.dec_util, 0.0, 5),
            active: Window { from, until },
            gpu_instance_id: raw.gpu_instance_id.unwrap_or(abi::NO_INSTANCE),
            compute_instance_id: raw.compute_instance_id.unwrap_or(abi::NO_INSTANCE),
            while_alive: raw.while_alive,
        });
    }
    Ok(())
}

fn parse_pid(var: &str, v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("${var} = {v:?} is not a PID (a positive integer)"))
}
