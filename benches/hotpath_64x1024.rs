//! Hot-path benchmarks on 64 GPUs × 1024 processes (nvml-sim/scenarios/bench-64x1024.toml);
//! see benches/hotpath/mod.rs for what each group measures and BENCHMARKS.md for the figures.

mod hotpath;

fn main() {
    hotpath::run("64x1024", "bench-64x1024.toml");
}
