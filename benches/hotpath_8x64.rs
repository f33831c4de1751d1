//! Hot-path benchmarks on 8 GPUs × 64 processes (nvml-sim/scenarios/bench-8x64.toml); see
//! benches/hotpath/mod.rs for what each group measures and BENCHMARKS.md for the figures.

mod hotpath;

fn main() {
    hotpath::run("8x64", "bench-8x64.toml");
}
