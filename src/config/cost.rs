//! The prices roll-ups are costed with: `--cost-per-gpu-hour` and `--cost-per-kwh`, their
//! `GPULSE_COST_PER_GPU_HOUR` / `GPULSE_COST_PER_KWH` variables and the file's `[cost]` table,
//! resolved with the one precedence: flags > environment > file. No price, no cost.

use super::error::ConfigError;
use super::layers::{first, Layers};
use crate::cli::CostArgs;
use crate::values::{parse_price, Prices};

pub(crate) fn resolve(args: &CostArgs, layers: &Layers<'_>) -> Result<Prices, ConfigError> {
    let per_gpu_hour = first([
        Layers::flag("--cost-per-gpu-hour", args.cost_per_gpu_hour.as_deref()),
        layers.env(super::env::COST_PER_GPU_HOUR),
        layers.file("cost.per_gpu_hour", |f| &f.cost.per_gpu_hour),
    ])
    .map(|raw| raw.parse(parse_price))
    .transpose()?;
    let per_kwh = first([
        Layers::flag("--cost-per-kwh", args.cost_per_kwh.as_deref()),
        layers.env(super::env::COST_PER_KWH),
        layers.file("cost.per_kwh", |f| &f.cost.per_kwh),
    ])
    .map(|raw| raw.parse(parse_price))
    .transpose()?;
    Ok(Prices {
        per_gpu_hour,
        per_kwh,
    })
}
